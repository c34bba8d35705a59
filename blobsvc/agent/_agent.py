"""The agent process: a listener, HTTP connections, the host cache behind them, and shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections import Counter
from typing import Any

from .._exceptions import BlobError, NotFound
from ..cache import BlobCache
from ..cache._archives import archive_kind
from ..client import AsyncBlobClient
from ..config import Settings, package_version, parse_port_range
from ..http import (
    PYTHON_ROUTE,
    HttpConnection,
    HttpError,
    HttpFace,
    HttpRequest,
    HttpResponse,
    parse_python_path,
    python_path,
    text_response,
)
from ..http._observe import RequestObserver
from ..http._slots import Slots
from ..storage import OpenBlob
from ..wire._netio import SocketStream, bind_listener
from ..wire._protocol import ContentKey, JobBlob
from ..wire._tls import client_context_for
from ._heartbeat import Heartbeats
from ._python import launcher_problem, launcher_response
from ._source import CacheSource

__all__ = ["Agent"]

log = logging.getLogger("blobsvc.agent")


class Agent:
    """``blobsvc agent``: the host's BlobCache for ``settings.server`` behind a read-only HTTP
    face on ``agent_host:agent_port``.

    ``async with Agent(settings) as agent:`` opens the cache (its start-up check runs in a
    worker thread), binds, sends its first heartbeat, and serves until the block ends;
    ``agent.address`` is the bound ``(host, port)``. Connections share the server's rules:
    ``max_connections``, ``idle_timeout``, ``io_timeout``, the header deadline, the minimum
    body rate.

    It fails closed: when the server requires a secret that the agent lacks (or refuses the
    agent's), :meth:`start` raises :class:`~blobsvc.AuthRequired` (:class:`~blobsvc.AuthFailed`)
    before the agent accepts a connection, and a later heartbeat so refused stops it:
    :meth:`serve_forever` raises the same. A server that cannot be reached says nothing of its
    rule, so the agent serves its cache meanwhile (docs/agent.md).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.slots = Slots(settings.max_connections)
        self.requests: Counter[str] = Counter()
        self.observers: list[RequestObserver] = [self._count_served]
        self.bytes_served = 0
        self.source: CacheSource | None = None
        self.http = HttpFace(self._open_blob, settings.secret())
        self.http.routes["metrics"] = self._metrics
        self.http.routes[PYTHON_ROUTE] = self._python
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._client: AsyncBlobClient | None = None  # heartbeats' (the cache has a blocking one)
        self.heartbeats: Heartbeats | None = None
        self._beating: asyncio.Task[None] | None = None

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "the agent is not started"
        host, port, *_ = self._listener.getsockname()
        return host, port

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    async def start(self) -> None:
        settings = self.settings
        cache = await asyncio.to_thread(
            BlobCache,
            settings.server,
            settings.cache_dir,
            max_bytes=settings.cache_max_bytes,
            cleanup_interval=settings.cleanup_interval,
            retries=settings.retries,
            timeout=settings.timeout,
            connect_timeout=settings.connect_timeout,
            secret=settings.secret(),
            tls=client_context_for(settings),
            store_reads=settings.store_reads,
        )
        self.source = CacheSource(cache, settings.server)
        try:
            self._listener = bind_listener(settings.agent_host, parse_port_range(settings.agent_port))
            self._client = AsyncBlobClient.from_settings(settings)
            self.heartbeats = Heartbeats(self._client, self.source, self.address[1], self.counts)
            # The server's AUTH_REQUIRED refuses the start here. One that cannot be reached says
            # nothing of its rule: the agent serves its cache rather than wait out the retries.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(settings.connect_timeout):
                    await self.heartbeats.beat()
        except BaseException:
            await self.shutdown(0)
            raise
        self._accepting = asyncio.create_task(self.slots.accept(self._listener, self._connection))
        self._beating = asyncio.create_task(self.heartbeats.run())

    def _connection(self, sock: socket.socket) -> HttpConnection:
        return HttpConnection(self, SocketStream(sock))

    async def _open_blob(self, target: ContentKey | JobBlob) -> OpenBlob:
        assert self.source is not None, "the agent is not started"
        if isinstance(target, JobBlob) and self.source.is_gone(job := target.job.hex()):
            # The server said the job is gone: its files wait out the cleanup interval here,
            # but its URLs answer as the server does (NOT_FOUND: a 404), unless the job id
            # was used again since.
            assert self._client is not None
            try:
                await self._client.stat(job=target.job, name=target.name)
            except NotFound:
                raise
            except BlobError as exc:
                raise HttpError(502, f"cannot ask the blobsvc server {self.settings.server}: {exc}") from None
            self.source.back(job)
        return await self.source.open_blob(target)

    async def _python(self, request: HttpRequest) -> HttpResponse:
        """``/python/<key>/<archive>/<launcher>``: the launcher of an environment unpacked here."""
        assert self.source is not None, "the agent is not started"
        try:
            key, archive, launcher = parse_python_path(request.path)
            archive_kind(archive)  # how to unpack it, by its name's suffix
        except ValueError as exc:
            return text_response(400, f"not a launcher URL: {exc}")
        refused = self.http.authorise(python_path(key, archive, launcher), request.query)
        if refused is not None:
            return refused
        tree = await self.source.environment(key, archive)
        problem = launcher_problem(tree)
        if problem is not None:  # a tree of no use to anyone: not kept
            log.warning("refused the environment %s (%s): %s", key.hex(), archive, problem[1])
            await asyncio.to_thread(self.source.discard_environment, key)
        return launcher_response(tree)

    async def serve_forever(self) -> None:
        """Serve until :meth:`shutdown`, or until a heartbeat finds the server requires a secret
        the agent lacks: raises that refusal (the caller shuts the agent down)."""
        assert self._accepting is not None and self._beating is not None, "start() first"
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait((self._accepting, self._beating), return_when=asyncio.FIRST_COMPLETED)
        if self._beating.done() and not self._beating.cancelled():
            # Nothing more is served unsigned, while the caller shuts down.
            self._accepting.cancel()
            self.slots.closing = True
            self.slots.abort()
            self._beating.result()

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting, tell the server the agent stops (its last heartbeat), let transfers
        under way finish within ``timeout`` (``shutdown_timeout`` by default), cancel the
        rest, then release the jobs held and close the cache."""
        self.slots.closing = True
        tasks = [task for task in (self._beating, self._accepting) if task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a refusal is serve_forever's to raise
        if self.heartbeats is not None:
            await self.heartbeats.farewell()
        if self._client is not None:
            await self._client.aclose()
        if self._listener is not None:
            self._listener.close()
        await self.slots.drain(self.settings.shutdown_timeout if timeout is None else timeout)
        if self.source is not None:
            await asyncio.to_thread(self.source.close)

    async def __aenter__(self) -> Agent:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # --- what it tells -----------------------------------------------------------------------

    def _count_served(self, request: Any, outcome: int, sent: int, seconds: float, stream: SocketStream) -> None:
        self.bytes_served += sent

    def counts(self) -> dict[str, int]:
        """This agent's own counts (the host's other cache users apart): hits, misses,
        downloads, bytes fetched from the server and from the HA store, store copies refused,
        bytes served, fetches in flight, Python environments unpacked."""
        assert self.source is not None, "the agent is not started"
        own = self.source.cache.store.counters.own()
        return {
            "hits": own["hits"],
            "misses": own["misses"],
            "downloads": own["downloads"],
            "bytes_fetched": own["bytes_fetched"],
            "bytes_from_store": own["bytes_from_store"],
            "store_refused": own["store_refused"],
            "bytes_served": self.bytes_served,
            "downloads_in_flight": self.source.in_flight,
            "unpacks": self.source.unpacks,
        }

    async def _metrics(self, request: HttpRequest) -> HttpResponse:
        if request.path.rstrip("/") != "/metrics":
            return text_response(404, "the metrics are at /metrics")
        assert self.source is not None
        stats = await asyncio.to_thread(self.source.cache.stats)  # walks the cache directory
        body = render_metrics(self.counts(), stats.bytes, stats.max_bytes or 0, len(self.source.jobs))
        return HttpResponse(200, [("Content-Type", METRICS_CONTENT_TYPE)], body.encode())


METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_METRICS = (  # name, counts() field or None, type, help
    ("blobsvc_agent_hits_total", "hits", "counter", "Blobs served from the host cache without a download."),
    ("blobsvc_agent_misses_total", "misses", "counter", "Blobs the host cache lacked when asked for."),
    ("blobsvc_agent_bytes_fetched_total", "bytes_fetched", "counter", "Bytes downloaded from the server."),
    ("blobsvc_agent_bytes_from_store_total", "bytes_from_store", "counter", "Bytes read from the HA store."),
    (
        "blobsvc_agent_store_refused_total",
        "store_refused",
        "counter",
        "Copies read from the HA store that did not verify, refused.",
    ),
    ("blobsvc_agent_bytes_served_total", "bytes_served", "counter", "Body bytes sent to HTTP clients."),
    ("blobsvc_agent_downloads_in_flight", "downloads_in_flight", "gauge", "Blobs being fetched right now."),
    ("blobsvc_agent_unpacks_total", "unpacks", "counter", "Python environments unpacked for /python launchers."),
    ("blobsvc_agent_cache_bytes", "cache_bytes", "gauge", "Bytes of the blobs in the host cache."),
    ("blobsvc_agent_cache_max_bytes", "cache_max_bytes", "gauge", "The host cache's limit in bytes."),
    ("blobsvc_agent_jobs", "jobs", "gauge", "Jobs whose files the agent holds a reference on."),
)


def render_metrics(counts: dict[str, int], cache_bytes: int, cache_max_bytes: int, jobs: int) -> str:
    """The Prometheus text format, written here: a dozen numbers do not need prometheus-client
    on every executor host."""
    values = {**counts, "cache_bytes": cache_bytes, "cache_max_bytes": cache_max_bytes, "jobs": jobs}
    lines = []
    for name, field, kind, help_text in _METRICS:
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name} {values[field]}"]
    lines.append(f'blobsvc_agent_info{{version="{package_version()}"}} 1')
    return "\n".join(lines) + "\n"
