"""The operator page's JSON: what the server knows, read-only, each list in bounded pages.

``GET /ui/api/<what>``; every answer is a JSON object. Lists are paged with ``offset`` (from
0) and ``limit`` (1 to :data:`MAX_PAGE`, :data:`DEFAULT_PAGE` when not given) and say their
``total``; a bad value is a 400 naming it. docs/operating.md ("The operator's page") lists them:

* ``overview``: version, role, the leader (in zookeeper mode) and a link to its page, the
  HA store and its health, uptime, blobs and bytes, disk, connections, requests by kind
  (the page turns two readings into rates), refusals, hosts by state, checkpoint counts;
* ``hosts``: the agents, lost first, then stopped, then live (each group by address);
* ``jobs``: the jobs stored, by id, with their blobs and bytes; ``jobs/<job hex>``: one
  job's names, by name;
* ``pipelines``: the pipelines' names; ``pipelines/<name>``: its checkpoint history, newest
  first (``limit`` only), from the server's checkpoint statistics.

What reads the disk (status, jobs) runs in a worker thread, as a scrape of ``/metrics`` does.
What grows with the cluster (the server's status, the hosts in their order) is read at most
once every :data:`SNAPSHOT_SECONDS` and shared by every request in
that time, however many pages are open: an answer is at most that old, and 10,000 hosts cost
one sort a second, not one per request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from ..http import HttpError
from ..wire._checkpoints import check_pipeline
from ..wire._ids import job_bytes

if TYPE_CHECKING:
    from ..storage import BlobStorage

__all__ = ["DEFAULT_PAGE", "MAX_PAGE", "SNAPSHOT_SECONDS", "PageServer", "PageData"]

MAX_PAGE = 100  # rows a list answers at most: a screenful or two, a few tens of KiB of JSON
DEFAULT_PAGE = 50
SNAPSHOT_SECONDS = 1.0  # the page refreshes every 5 s: a second-old reading is fresh enough
_T = TypeVar("_T")
# Hosts the page shows first: the ones needing a look.
_STATE_ORDER = ("lost", "stopped", "live")
# What of STATUS the overview shows (the rest is addresses and counters it does not draw).
_OVERVIEW = (
    "version", "role", "mode", "leader", "cluster_id", "ha_store", "ha_blobs", "ha_store_error",
    "http_address", "started", "uptime_seconds", "blobs", "bytes", "disk_free_bytes", "disk_total_bytes",
    "connections", "max_connections", "uploads_in_flight", "requests", "requests_total", "busy_refusals",
    "hosts_live", "hosts_lost", "hosts_stopped", "checkpoints_completed", "checkpoints_aborted",
    "checkpoints_subsumed", "checkpoints_damaged", "checkpoints_last_completed",
)  # fmt: skip
_HOST_FIELDS = ("agent", "host", "version", "state", "cache_bytes", "cache_max_bytes", "jobs", "last_seen")


class HostSource(Protocol):
    def listing(self) -> list[dict[str, Any]]: ...


class HistorySource(Protocol):
    """The server's checkpoint statistics (:mod:`blobsvc.server.checkpoint_stats`)."""

    def pipelines(self) -> list[str]: ...

    async def history(self, pipeline: str, limit: int = ...) -> list[dict[str, Any]]: ...


class PageServer(Protocol):
    """What the page reads of the server (the BlobServer is one)."""

    @property
    def hosts(self) -> HostSource: ...

    @property
    def checkpoints(self) -> HistorySource: ...

    @property
    def storage(self) -> BlobStorage: ...

    def status(self) -> dict[str, Any]: ...


class _Snapshot(Generic[_T]):
    """What ``read`` returns, read in a worker thread at most once every ``seconds`` (one
    reading at a time: requests arriving during it wait for it)."""

    def __init__(self, read: Callable[[], _T], seconds: float = SNAPSHOT_SECONDS) -> None:
        self._read = read
        self._seconds = seconds
        self._lock = asyncio.Lock()
        self._value: _T | None = None
        self._at = -float("inf")

    async def get(self) -> _T:
        async with self._lock:
            if self._value is None or time.monotonic() - self._at >= self._seconds:
                self._value = await asyncio.to_thread(self._read)
                self._at = time.monotonic()
            return self._value


def _page(query: Mapping[str, str]) -> tuple[int, int]:
    """``offset`` and ``limit`` of a list request; 400 when either is not a whole number in range."""
    offset = _number(query, "offset", 0, 0, 1 << 31)
    limit = _number(query, "limit", DEFAULT_PAGE, 1, MAX_PAGE)
    return offset, limit


def _number(query: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    text = query.get(name)
    if text is None:
        return default
    if not (text.isascii() and text.isdigit() and len(text) <= 10) or not low <= int(text) <= high:
        raise HttpError(400, f"{name} is a whole number from {low} to {high}, not {text[:20]!r}")
    return int(text)


def _paged(rows: list[Any], offset: int, limit: int, key: str) -> dict[str, Any]:
    return {"total": len(rows), "offset": offset, "limit": limit, key: rows[offset : offset + limit]}


class PageData:
    """The JSON answers of one server's page."""

    def __init__(self, server: PageServer) -> None:
        self.server = server
        self._status_reading = _Snapshot(server.status)
        self._host_list = _Snapshot(self._sorted_hosts)
        self.endpoints: dict[str, Callable[[str, Mapping[str, str]], Awaitable[dict[str, Any]]]] = {
            "overview": self._overview,
            "hosts": self._hosts,
            "jobs": self._jobs,
            "pipelines": self._pipelines,
        }

    async def answer(self, path: str, query: Mapping[str, str]) -> bytes:
        """The JSON body for ``/ui/api/<path>``; :class:`HttpError` 404 or 400 when there is none."""
        what, _, rest = path.partition("/")
        endpoint = self.endpoints.get(what)
        if endpoint is None:
            raise HttpError(404, f"no such page data: {what!r}; there are {', '.join(self.endpoints)}")
        document = await endpoint(rest, query)
        return json.dumps(document, separators=(",", ":")).encode()

    async def _overview(self, rest: str, query: Mapping[str, str]) -> dict[str, Any]:
        _no_more(rest, "overview")
        status = await self._status_reading.get()
        overview = {name: status.get(name) for name in _OVERVIEW}
        overview["leader_http"] = _leader_http(status)
        return overview

    async def _hosts(self, rest: str, query: Mapping[str, str]) -> dict[str, Any]:
        _no_more(rest, "hosts")
        offset, limit = _page(query)
        answer = _paged(await self._host_list.get(), offset, limit, "hosts")
        answer["hosts"] = [{name: host.get(name) for name in _HOST_FIELDS} for host in answer["hosts"]]
        return answer

    def _sorted_hosts(self) -> list[dict[str, Any]]:
        groups: dict[str, list[dict[str, Any]]] = {state: [] for state in _STATE_ORDER}
        for host in self.server.hosts.listing():  # each state by address
            groups[host["state"]].append(host)
        return [host for state in _STATE_ORDER for host in groups[state]]

    async def _jobs(self, rest: str, query: Mapping[str, str]) -> dict[str, Any]:
        offset, limit = _page(query)
        if rest:
            try:
                job = job_bytes(rest)
            except ValueError:
                raise HttpError(400, f"not a job id (32 hex digits): {rest[:40]!r}") from None
            entries = await asyncio.to_thread(self.server.storage.list_job, job)
            entries.sort(key=lambda entry: entry.name)
            answer = _paged(entries, offset, limit, "names")
            answer["job"] = job.hex()
            answer["names"] = [{"name": e.name, "size": e.size, "digest": e.digest.hex()} for e in answer["names"]]
            return answer
        return await asyncio.to_thread(self._job_page, offset, limit)

    def _job_page(self, offset: int, limit: int) -> dict[str, Any]:
        storage = self.server.storage
        answer = _paged(sorted(storage.layout.job_dirs()), offset, limit, "jobs")
        rows = []
        for job in answer["jobs"]:
            entries = storage.list_job(job)
            rows.append({"job": job.hex(), "blobs": len(entries), "bytes": sum(e.size for e in entries)})
        answer["jobs"] = rows
        return answer

    async def _pipelines(self, rest: str, query: Mapping[str, str]) -> dict[str, Any]:
        checkpoints = self.server.checkpoints
        pipelines = checkpoints.pipelines()  # sorted, in memory: read on the loop, where it changes
        if not rest:
            offset, limit = _page(query)
            return _paged(pipelines, offset, limit, "pipelines")
        try:
            check_pipeline(rest)
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        if rest not in pipelines:
            raise HttpError(404, f"no pipeline named {rest[:140]!r} has checkpoints here")
        limit = _number(query, "limit", MAX_PAGE, 1, MAX_PAGE)
        return {"pipeline": rest, "history": await checkpoints.history(rest, limit)}


def _no_more(rest: str, what: str) -> None:
    if rest:
        raise HttpError(404, f"{what} has no parts: /ui/api/{what}")


def _leader_http(status: Mapping[str, Any]) -> str | None:
    """Where the leader's page is, seen from a standby: the leader's host at this server's HTTP
    port (the servers of one cluster serve HTTP on the same port, as deploy/ configures them);
    the page adds its own scheme."""
    leader, own = status.get("leader"), status.get("http_address")
    if status.get("role") != "standby" or not leader or not own:
        return None
    return f"{leader.rpartition(':')[0]}:{own.rpartition(':')[2]}"
