"""The server's registry of executor hosts: what each host's agent last reported, and when.

Agents (``blobsvc agent``, one per executor host) send a HEARTBEAT every
``agent_heartbeat_interval`` seconds, as Flink's TaskManagers report to its InstanceManager.
The rules, all kept here:

* **Identity.** A host is known by its agent's address (``agent``, the host:port of the agent's
  HTTP face). A restarted agent at the same address takes over its entry.
* **Seen.** Each heartbeat replaces the entry's report whole and stamps it with the wall clock
  (shown as ``last_seen``) and the monotonic clock (what decides, so that a step of the wall
  clock makes no host lost or live).
* **Lost.** A host not heard from for ``lost_after`` seconds (``agent_lost_after``) is lost.
  That is a report to operators, not a lease: nothing is taken from a lost host, and its next
  heartbeat makes it live again.
* **Stopped.** An agent that shuts down cleanly says so in a last heartbeat (``stopping``):
  its host is listed as stopped, not lost, until its next heartbeat makes it live again.
* **Forgotten.** A host not heard from for :func:`forget_after` seconds (a day, or 100 times
  ``lost_after`` when that is longer) is dropped: the listing keeps a day of departed hosts
  for an operator to look at, not every host that ever ran.
* **Bounded.** An entry keeps what HOSTS lists of a host's last report: its texts, its
  counters and the *number* of jobs it holds, never the job ids, which the heartbeat's answer
  is worked out from while it is answered. So an entry is a few KiB at most whatever its
  heartbeat lists (:data:`MAX_BYTES_PER_HOST`, docs/security.md has the worst case).
  At most ``max_hosts`` entries (:data:`MAX_HOSTS`). A newcomer at the bound
  takes the place of the host heard from longest ago if that one is lost; when every entry is
  live, the newcomer's heartbeat is still answered (it learns its gone jobs like any other)
  but it is not listed, and a warning is logged. So made-up agent addresses cannot grow the
  server's memory, nor push a live host out of the listing.
* **Memory only.** A restarted server, or a new leader in zookeeper mode (standbys answer
  heartbeats NOT_LEADER, and agents follow the leader as clients do), knows no host until each
  sends its next heartbeat, within one interval.
* **Threads.** The event loop records; STATUS and the metrics thread read. One lock, held for
  dictionary work only.

What a heartbeat says is checked by :meth:`HostReport.parse`: ``agent`` is required, the
fields below are optional and must have their types, unknown fields are ignored (a newer
agent may send more), and a malformed one is BAD_REQUEST naming it.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .._exceptions import BadRequest, InvalidArgument
from ..config import parse_address
from ..wire._ids import shown
from ..wire._protocol import MAX_HEARTBEAT_BYTES

__all__ = [
    "FORGET_AFTER",
    "MAX_BYTES_PER_HOST",
    "MAX_HOSTS",
    "STATES",
    "HostRecord",
    "HostRegistry",
    "HostReport",
    "forget_after",
    "heartbeat_reply",
]

log = logging.getLogger("blobsvc.server.hosts")

# What a host is, in STATUS (hosts_<state>), HOSTS and the metrics.
STATES = ("live", "lost", "stopped")
# Far more executor hosts than one Spark cluster has. A listed host is at most ~900 bytes of
# STATUS (its texts bounded below, its counters u64s), so all of them fit in one STATUS
# document (MAX_STATUS_BYTES) with room to spare; tests/test_hosts.py checks it.
MAX_HOSTS = 10_000
# How long a departed host stays listed, at least: a day, to look back on.
FORGET_AFTER = 24 * 3600.0
# Counters an agent reports: whole numbers, at least 0.
COUNTERS = (
    "cache_bytes",
    "cache_max_bytes",
    "hits",
    "misses",
    "bytes_fetched",
    "bytes_served",
    "downloads_in_flight",
)
# Texts an agent reports: printable ASCII (host names and versions are), so that JSON never
# escapes them, and a bounded length: a host name has at most 253 characters.
TEXTS = {"host": 255, "version": 64}
MAX_AGENT_CHARS = 255 + 1 + 5  # host:port
_TEXT = re.compile(r"[\x20-\x7e]*")
# What an entry may cost at most, with the longest texts and largest counters: its objects
# take 1,700 bytes in CPython 3.11 (tracemalloc), and a server process's resident memory grew
# by 3,800 to 4,900 bytes an entry (the allocator's pools are shared with the objects of the
# heartbeats passing through). tests/test_request_bounds.py measures it in a server process;
# the bound leaves room for the allocator, and MAX_HOSTS entries stay under 160 MiB.
MAX_BYTES_PER_HOST = 16 << 10
# A full registry warns of the first unlisted heartbeat, then of one in this many.
UNLISTED_WARNING_EVERY = 10_000
_JOB_ID = re.compile(r"[0-9a-fA-F]{32}")


def forget_after(lost_after: float) -> float:
    """Seconds after which a host not heard from is dropped from the registry."""
    return max(FORGET_AFTER, 100 * lost_after)


@dataclass(frozen=True, slots=True)
class HostReport:
    """One heartbeat's document, checked. ``jobs`` are the job ids as the agent wrote them
    (32 hex digits, either case), each once, in its order."""

    agent: str
    jobs: tuple[str, ...]
    fields: Mapping[str, int | str | None]
    """``host``, ``version`` and the counters; None for one not reported."""
    stopping: bool = False
    """The agent's last heartbeat: it is shutting down."""

    @classmethod
    def parse(cls, document: Mapping[str, Any]) -> HostReport:
        """The report in a heartbeat; BAD_REQUEST naming the first field that is wrong."""
        agent = document.get("agent")
        if agent is None:
            raise BadRequest("a heartbeat needs 'agent', the host:port of the agent's HTTP face")
        if not _is_address(agent):
            raise BadRequest(f"heartbeat field 'agent' must be host:port, not {shown(agent)}")
        fields: dict[str, int | str | None] = {}
        for name, longest in TEXTS.items():
            text = document.get(name)
            if text is not None and not (isinstance(text, str) and _printable(text, longest)):
                raise BadRequest(f"heartbeat field {name!r} must be printable ASCII of at most {longest} characters")
            fields[name] = text
        for name in COUNTERS:
            count = document.get(name)
            if count is not None and (type(count) is not int or not 0 <= count < 1 << 64):
                raise BadRequest(
                    f"heartbeat field {name!r} must be a whole number from 0 to 2**64-1, not {shown(count)}"
                )
            fields[name] = count
        jobs = document.get("jobs", [])
        if not isinstance(jobs, list):
            raise BadRequest("heartbeat field 'jobs' must be a list of job ids")
        for job in jobs:
            if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
                raise BadRequest(f"heartbeat field 'jobs' holds {shown(job)}, which is not a job id (32 hex digits)")
        stopping = document.get("stopping", False)
        if type(stopping) is not bool:
            raise BadRequest(f"heartbeat field 'stopping' must be true or false, not {shown(stopping)}")
        return cls(agent, tuple(dict.fromkeys(jobs)), fields, stopping)


def heartbeat_reply(interval: float, lost_after: float, gone_jobs: list[str]) -> dict[str, Any]:
    """A heartbeat's answer. It is bounded as the heartbeat is (MAX_HEARTBEAT_BYTES), and its
    fixed fields can take a few bytes more than a heartbeat's shortest ones, so it names as
    many gone jobs as fit (some 1,800) and leaves the rest to the next answers, which the
    agent, still listing them, gets one interval later."""
    reply: dict[str, Any] = {"interval": interval, "lost_after": lost_after, "gone_jobs": []}
    room = MAX_HEARTBEAT_BYTES - len(json.dumps(reply, separators=(",", ":")))
    # Each job id is 32 hex digits in quotes, after a comma but the first: 35 bytes at most.
    reply["gone_jobs"] = gone_jobs[: max(0, room) // 35]
    return reply


def _is_address(value: Any) -> bool:
    """``host:port`` in printable ASCII, without spaces, the port given."""
    if not isinstance(value, str) or " " in value or ":" not in value or not _printable(value, MAX_AGENT_CHARS):
        return False
    try:
        parse_address(value)
    except InvalidArgument:
        return False
    return True


def _printable(text: str, longest: int) -> bool:
    return len(text) <= longest and _TEXT.fullmatch(text) is not None


@dataclass(frozen=True, slots=True)
class HostRecord:
    """A host as the registry holds it: what HOSTS lists of its last report (not its job ids:
    their number) and when it came."""

    agent: str
    fields: Mapping[str, int | str | None]
    jobs: int
    """How many jobs the report named."""
    seen: float
    """``time.time()`` of the last heartbeat."""
    seen_clock: float
    """The monotonic clock's reading at the last heartbeat."""
    stopping: bool
    """The last heartbeat said the agent stops."""


class HostRegistry:
    """The hosts whose agents report to this server (see the module's rules).

    ``clock`` and ``wall_clock`` are ``time.monotonic`` and ``time.time`` unless a test
    gives its own."""

    def __init__(
        self,
        lost_after: float,
        *,
        max_hosts: int = MAX_HOSTS,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.lost_after = lost_after
        self.forget_after = forget_after(lost_after)
        self.max_hosts = max_hosts
        self._clock = clock
        self._wall_clock = wall_clock
        # By agent, least recently heard from first: the first entry is the one to forget,
        # or to give up for a newcomer.
        self._hosts: OrderedDict[str, HostRecord] = OrderedDict()
        self._lock = threading.Lock()
        self.heartbeats = 0
        """Heartbeats answered since the server started (unlisted ones too)."""
        self.unlisted = 0
        """Heartbeats of newcomers answered but not listed: the registry was full of live hosts."""

    def record(self, report: HostReport) -> None:
        """Note a heartbeat: the host is live as of now."""
        now = self._clock()
        entry = HostRecord(report.agent, report.fields, len(report.jobs), self._wall_clock(), now, report.stopping)
        with self._lock:
            self.heartbeats += 1
            self._forget(now)
            hosts = self._hosts
            if report.agent not in hosts and len(hosts) >= self.max_hosts:
                oldest = next(iter(hosts.values()))
                if now - oldest.seen_clock <= self.lost_after:  # the oldest is live: all are
                    self.unlisted += 1
                    if self.unlisted % UNLISTED_WARNING_EVERY == 1:
                        log.warning(
                            "%d agents are live, as many as the server lists: %s is answered but not listed "
                            "(%d such heartbeats so far)",
                            self.max_hosts,
                            report.agent,
                            self.unlisted,
                        )
                    return
                del hosts[oldest.agent]
            hosts[report.agent] = entry
            hosts.move_to_end(report.agent)

    def states(self) -> dict[str, int]:
        """How many hosts are live, lost and stopped, for STATUS and the metrics."""
        now = self._clock()
        with self._lock:
            self._forget(now)
            states = [self._state(record, now) for record in self._hosts.values()]
        return {state: states.count(state) for state in STATES}

    def _state(self, record: HostRecord, now: float) -> str:
        if record.stopping:
            return "stopped"
        return "live" if now - record.seen_clock <= self.lost_after else "lost"

    def listing(self) -> list[dict[str, Any]]:
        """Every host for HOSTS: live ones first, each group by agent address."""
        now = self._clock()
        with self._lock:
            self._forget(now)
            records = list(self._hosts.values())
        listed = []
        for record in records:
            state = self._state(record, now)
            listed.append(
                {
                    "agent": record.agent,
                    **record.fields,
                    "jobs": record.jobs,
                    "last_seen": round(record.seen, 3),
                    "state": state,
                }
            )
        listed.sort(key=lambda host: (host["state"] != "live", host["agent"]))
        return listed

    def _forget(self, now: float) -> None:
        """Drop the hosts not heard from for ``forget_after`` seconds (with the lock held)."""
        hosts = self._hosts
        while hosts:
            oldest = next(iter(hosts.values()))
            if now - oldest.seen_clock <= self.forget_after:
                return
            del hosts[oldest.agent]
