"""The asyncio BlobServer: sockets in, :mod:`blobsvc.wire._protocol` frames, :mod:`blobsvc.storage` calls.

One task per connection runs the loop *read a frame, act, answer*. What keeps a bad client
from hurting others:

* at most ``max_connections`` connections. A newcomer at the limit first makes room by
  closing the connection that has waited longest for its client (idle between requests, or
  still sending its preamble or a request header); only when every slot holds a request
  under way is it answered BUSY and closed;
* ``idle_timeout`` between requests and ``io_timeout`` for any stall inside one, so a silent
  or stalled peer cannot pin a connection; a whole request header (and the preamble, with
  the TLS handshake) must arrive within ``io_timeout`` (the header deadline), and a body
  must move at least ``_netio.MIN_BODY_RATE`` bytes per second on average, so a client trickling
  a byte at a time cannot pin one either;
* a PUT longer than ``max_blob_size`` is refused before a byte of its body is read;
* a rejected or broken upload removes its staging file (``StagedUpload`` is a context
  manager), and storage takes its per-key locks only to link and unlink, never while bytes
  stream.

Between requests a plain connection's task is parked: a reader callback answers GETs of hot
small blobs and small PUTs that arrived whole on its own, and wakes the task for anything
else (:mod:`blobsvc.server._fastpath`).

GET bodies go from the page cache to the socket with ``os.sendfile``. Blocking disk work
that can take long (writing large chunks, fsync, deleting a job) runs in worker threads so
the event loop keeps serving other connections.

Shutdown follows uvicorn's order: close the listener, let connections that are between
requests go at once, give busy ones ``shutdown_timeout`` to finish the request in hand,
then cancel the rest, which removes their staging files on the way out.

The part ``blobsvc/server/``: this module (listeners, connections, requests) and its helpers:
``_fastpath`` (small requests answered from the reader callback), ``_jobgate`` (writes and
deletions of a job take turns), ``_logs`` (text or JSON logs), ``hosts`` (the agents'
registry), ``metrics`` (Prometheus), ``_retention`` (content TTL and the store's byte limit),
``checkpoints`` (each pipeline's checkpoints).
May import :mod:`blobsvc.ha`, :mod:`blobsvc.http`, :mod:`blobsvc.ui` (the operator's page),
:mod:`blobsvc.storage`, :mod:`blobsvc.wire`, config and exceptions; never the client side.
Its helpers never import this module: what they use of the server or a connection they name
as a Protocol of their own (``FastPathConnection``, ``MetricsServer``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import shutil
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from .._exceptions import (
    AuthFailed,
    AuthRequired,
    BadOffset,
    Busy,
    InternalError,
    NotFound,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    TooLarge,
    TransportError,
    WriteTimeout,
)
from ..config import Settings, package_version
from ..ha import HighAvailability, high_availability
from ..http import HttpConnection, HttpFace, bad_request_bytes
from ..http._observe import ABORTED, RequestObserver, op_name
from ..http._slots import Connection, Slots
from ..storage import BlobStorage, OpenBlob, RecoveryReport, StagedUpload
from ..storage._commit import GroupCommitter
from ..ui import OperatorPage
from ..wire._netio import SocketStream, bind_listener, body_deadline, header_deadline
from ..wire._protocol import (
    NEED_DATA,
    AuthOk,
    AuthRequest,
    CheckpointsOk,
    CheckpointsRequest,
    ContentKey,
    Data,
    DeleteOk,
    DeleteRequest,
    ErrorFrame,
    GetOk,
    GetRequest,
    HeartbeatOk,
    HeartbeatRequest,
    HostsOk,
    HostsRequest,
    JobBlob,
    LinkOk,
    LinkRequest,
    ListOk,
    ListRequest,
    PutOk,
    PutRequest,
    PutTrailer,
    ServerConnection,
    ServerEvent,
    ServerHello,
    Signal,
    StatOk,
    StatRequest,
    StatusOk,
    StatusRequest,
    WholeJob,
)
from ..wire._threads import wait_out
from ..wire._tls import TlsStream, server_context_for
from ._fastpath import FastPath
from ._jobgate import JobGates
from ._logs import log_request
from ._retention import Retention
from .checkpoint_stats import MAX_HISTORY
from .checkpoints import Checkpoints
from .hosts import HostRegistry, HostReport, heartbeat_reply

if TYPE_CHECKING:
    from .metrics import ServerMetrics

__all__ = ["BlobServer"]

log = logging.getLogger("blobsvc.server")

RECV_SIZE = 1 << 20
# Smaller bodies are written on the event loop: a thread hop would cost more than the write.
INLINE_WRITE_LIMIT = 256 << 10
# A PUT body starts the disk on its bytes each time this many more have been written, so that
# the fsync of publication waits for the last few MiB only, not for a whole blob that the page
# cache would otherwise hold back until then (64-256 MiB uploads spent half their time there).
WRITEBACK_STEP = 4 << 20
# Uploads up to this size have their disk blocks reserved on the event loop (0.15 ms for
# 64 MiB on ext4); a larger reservation goes to a worker thread.
RESERVE_ON_LOOP_LIMIT = 64 << 20
# Smaller GET bodies go out with their header in one send; sendfile pays off above this.
INLINE_READ_LIMIT = 64 << 10


class BlobServer:
    """A blob server over one data directory.

    ``async with BlobServer(settings) as server:`` recovers storage, binds, and serves until
    the block ends; ``server.address`` is the bound ``(host, port)``.
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        storage: BlobStorage | None = None,
        ha: HighAvailability | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self.storage = storage or BlobStorage(self.settings.data_dir, verify_on_start=self.settings.verify_on_start)
        self.ha = ha or high_availability(self.settings)
        """The recovery mode: asked before serving, storing, acknowledging, and for missing blobs."""
        self.retention = Retention.from_settings(self.storage, self.ha, self.settings)
        """Deletes unreferenced content past ``content_ttl`` or ``max_store_bytes`` (when set)."""
        self._sweeping: asyncio.Task[None] | None = None
        self._secret = self.settings.secret()
        self._tls = server_context_for(self.settings)
        self.committer = GroupCommitter(self.storage)
        self.gates = JobGates()
        """In zookeeper mode, writes into a job and deletions in it take turns."""
        self._listener: socket.socket | None = None
        self._http_listener: socket.socket | None = None
        self._accepting: list[asyncio.Task[None]] = []  # one accept loop per listener
        self.slots = Slots(self.settings.max_connections)
        """The connections served, binary and HTTP, under ``max_connections``."""
        self.http = HttpFace(self.open_blob, self._secret)
        """The HTTP face's routes (on when ``http_port`` is set); see :mod:`blobsvc.http`."""
        self.hosts = HostRegistry(self.settings.agent_lost_after)
        """The executor hosts whose agents send heartbeats (see :mod:`blobsvc.server.hosts`)."""
        self.recovery: RecoveryReport | None = None
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests served, by kind (``"GET"``, ``"PUT"``, …): for operators and tests."""
        self.observers: list[RequestObserver] = []
        """Called after each request (metrics, request logs); none costs nothing."""
        self.checkpoints = Checkpoints(self, min(self.settings.checkpoint_history, MAX_HISTORY))
        """Every pipeline's checkpoints: the CHECKPOINTS request (:mod:`blobsvc.server.checkpoints`)."""
        self.status_sources: list[Callable[[], Mapping[str, Any]]] = [
            self.ha.status,
            self.retention.status,
            self.checkpoints.status,
        ]
        """Each adds its fields to :meth:`status` (HA: mode, role, leader). Called from the
        event loop and from the metrics thread, so they only read."""
        self.page = OperatorPage(self, tls=self._tls is not None)
        """The operator's page, ``/ui/`` on the HTTP face (:mod:`blobsvc.ui`)."""
        self.page.add_route(self.http)
        self._started = time.time()
        self._started_clock = time.monotonic()
        self.metrics: ServerMetrics | None = None
        """The Prometheus metrics when ``metrics_port`` is set, served on that port
        (``metrics.address``) and on the HTTP face's ``/metrics``."""

    @property
    def address(self) -> tuple[str, int]:
        assert self._listener is not None, "the server is not started"
        host, port, *_ = self._listener.getsockname()
        return host, port

    @property
    def http_address(self) -> tuple[str, int] | None:
        """The HTTP face's bound ``(host, port)``, None when ``http_port`` is not set."""
        if self._http_listener is None:
            return None
        host, port, *_ = self._http_listener.getsockname()
        return host, port

    async def start(self) -> None:
        if self.settings.metrics_port == "http" and self.settings.http_port is None:
            raise ValueError("metrics_port 'http' serves /metrics on the HTTP face: set http_port too")
        if self.settings.metrics_port is not None and self.metrics is None:
            from .metrics import ServerMetrics  # prometheus-client is an optional extra: checked first

            self.metrics = ServerMetrics(self)
            self.metrics.add_route(self.http)
        if logging.getLogger("blobsvc.requests").isEnabledFor(logging.DEBUG) and log_request not in self.observers:
            self.observers.append(log_request)
        self._started, self._started_clock = time.time(), time.monotonic()
        self.recovery = await asyncio.to_thread(self.storage.recover)
        self._listener = bind_listener(self.settings.host, self.settings.ports)
        if self.settings.metrics_port not in (None, "http"):
            assert self.metrics is not None
            try:
                self.metrics.serve(self.settings.host, int(self.settings.metrics_port))
            except BaseException:
                self._listener.close()
                raise
        try:
            await self.ha.start(self.address, self.storage)
            self.checkpoints.start()
        except BaseException:
            self._listener.close()
            raise
        self._accepting.append(asyncio.create_task(self.slots.accept(self._listener, self._binary_connection)))
        if self.retention.enabled:
            self._sweeping = asyncio.create_task(self.retention.run())
        if self.settings.http_ports is not None:
            self._http_listener = bind_listener(self.settings.host, self.settings.http_ports)
            self._accepting.append(asyncio.create_task(self.slots.accept(self._http_listener, self._http_connection)))

    def _binary_connection(self, sock: socket.socket) -> _Connection:
        return _Connection(self, self._stream_for(sock))

    def _http_connection(self, sock: socket.socket) -> HttpConnection:
        return HttpConnection(self, self._stream_for(sock))

    async def open_blob(self, target: ContentKey | JobBlob) -> OpenBlob:
        """A blob from local disk or, when this server lacks it, lazily from the HA store;
        NOT_LEADER on a standby."""
        self.ha.check()
        try:
            return self.storage.open_blob(target)
        except NotFound:
            if not await self.ha.recover(target):
                raise
        return self.storage.open_blob(target)

    async def stat_blob(self, target: ContentKey | JobBlob) -> tuple[int, bytes]:
        """A blob's size and key from local disk or, when this server lacks it, from the HA
        store's record and object size alone: a cache that STATs before it reads from the
        store (and verifies) costs this server no byte of the blob."""
        self.ha.check()
        try:
            return self.storage.stat(target)
        except NotFound:
            stored = (await self.ha.stat_stored([target]))[0]
            if stored is None:
                raise
            return stored

    async def delete_blob(self, target: ContentKey | JobBlob | WholeJob) -> None:
        """Delete both copies, the HA one first: a lazy recovery must not revive it."""
        async with self.deleting_in(target):
            await self.ha.delete(target)
            await asyncio.to_thread(self.storage.delete, target)

    def writing_into(self, target: JobBlob | None) -> contextlib.AbstractAsyncContextManager[None]:
        """What a PUT or LINK holds from its HA copy to its local one (:mod:`blobsvc.server._jobgate`)."""
        if isinstance(target, JobBlob) and self.ha.copies_uploads:
            return self.gates.writing(target.job)
        return contextlib.nullcontext()

    def deleting_in(self, target: ContentKey | JobBlob | WholeJob) -> contextlib.AbstractAsyncContextManager[None]:
        """What a DELETE holds while it removes both copies (:mod:`blobsvc.server._jobgate`)."""
        if isinstance(target, JobBlob | WholeJob) and self.ha.copies_uploads:
            return self.gates.deleting(target.job)
        return contextlib.nullcontext()

    async def serve_forever(self) -> None:
        assert self._accepting, "start() first"
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._accepting)

    async def __aenter__(self) -> BlobServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def shutdown(self, timeout: float | None = None) -> None:
        """Stop accepting, let busy connections finish their request within ``timeout``
        (``shutdown_timeout`` by default), cancel what is left."""
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        self.slots.closing = True
        if self._sweeping is not None:  # before stepping down: no deletion outlives leadership
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        await self.checkpoints.stop()  # before stepping down too: no discard outlives leadership
        # Step down first: clients move on to the next leader while we finish.
        await self.ha.stop()
        for accepting in self._accepting:
            accepting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await accepting
        for listener in (self._listener, self._http_listener):
            if listener is not None:
                listener.close()
        await self.slots.drain(timeout)
        if self.metrics is not None:
            await asyncio.to_thread(self.metrics.close)
        await asyncio.to_thread(self.storage.close)  # waits for a checkpoint under way

    def abort_requests(self) -> None:
        """Cancel every connection now, busy or not (a second Ctrl-C during shutdown)."""
        self.slots.abort()

    def _stream_for(self, sock: socket.socket) -> SocketStream:
        """An accepted socket as a stream: TLS when the server has a certificate (its
        handshake runs within the first read's timeout, on the connection's own task)."""
        if self._tls is None:
            return SocketStream(sock)
        return TlsStream(sock, self._tls, server_side=True)

    def status(self) -> dict[str, Any]:
        """The server's state for operators: the STATUS request's answer and the metrics'
        source. Cheap (a statvfs, a listing of incoming/), safe from any thread."""
        blobs, size = self.storage.usage()
        disk = shutil.disk_usage(self.storage.layout.root)
        connections = list(self.slots.connections.values())
        requests = dict(self.requests)
        report = self.recovery or RecoveryReport()
        status: dict[str, Any] = {
            "version": package_version(),
            "address": _bound_to(self._listener),
            "http_address": _bound_to(self._http_listener),
            "metrics_address": self._metrics_address(),
            "started": self._started,
            "uptime_seconds": round(time.monotonic() - self._started_clock, 3),
            "role": "standalone",
            "blobs": blobs,
            "bytes": size,
            "disk_free_bytes": disk.free,
            "disk_total_bytes": disk.total,
            "connections": len(connections),
            "max_connections": self.settings.max_connections,
            "uploads_in_flight": sum(isinstance(getattr(c, "request", None), PutRequest) for c in connections),
            "staging_files": len(os.listdir(self.storage.layout.incoming)),
            "requests": requests,
            "requests_total": sum(requests.values()),
            "busy_refusals": self.slots.refused,
            "journal_checkpoints": self.storage.checkpoints(),
            "replayed_at_start": report.replayed,
            "removed_at_start": {
                "staging": report.removed_staging,
                "corrupt": len(report.removed_corrupt),
                "orphaned": report.removed_orphans,
                "stray": len(report.removed_stray),
            },
            "heartbeats": self.hosts.heartbeats,
            "hosts_unlisted": self.hosts.unlisted,
            **{f"hosts_{state}": count for state, count in self.hosts.states().items()},
        }
        for source in self.status_sources:
            status.update(source())
        return status

    async def heartbeat(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """A HEARTBEAT's answer: the agent's report recorded (BAD_REQUEST when malformed), when
        to send the next one, and which of its jobs are gone: no blob under them here, nor in
        the HA store (a new leader may not have fetched a live job's blobs yet)."""
        report = HostReport.parse(document)
        self.hosts.record(report)
        gone = []
        if report.jobs:
            # A stat per job: cheap, but the disk's business, so not on the event loop.
            absent = await asyncio.to_thread(
                lambda: [job for job in report.jobs if not self.storage.has_job(bytes.fromhex(job))]
            )
            gone = [job for job in absent if not await self.ha.holds_job(bytes.fromhex(job))]
        return heartbeat_reply(self.settings.agent_heartbeat_interval, self.settings.agent_lost_after, gone)

    def _metrics_address(self) -> str | None:
        """Where ``/metrics`` is scraped: the metrics port, or the HTTP face when there is none."""
        if self.metrics is None:
            return None
        if self.metrics.address is not None:
            return "{}:{}".format(*self.metrics.address)
        return _bound_to(self._http_listener)


def _bound_to(listener: socket.socket | None) -> str | None:
    """``host:port`` of a listener; None when there is none, or it is closed (shutting down)."""
    try:
        host, port, *_ = listener.getsockname() if listener is not None else (None, None)
    except OSError:
        return None
    return None if host is None else f"{host}:{port}"


_T = TypeVar("_T")


def _write_and_start_writeback(upload: StagedUpload, data: bytes | bytearray | memoryview) -> None:
    upload.write(data)
    upload.write_out()  # starts the disk on every byte written so far not on its way there yet


async def _finish(work: Awaitable[_T]) -> _T:
    """The result of a worker thread's work on an upload, waited for even when cancelled."""
    future = asyncio.ensure_future(work)
    await wait_out(future)
    return future.result()


_HTTP_AT_BINARY = bad_request_bytes(
    "this is blobsvc's binary protocol port: HTTP (curl, pip, Spark's fetcher) goes to the server's --http-port"
)


class _Connection(Connection):
    """One client connection's read-act-answer loop."""

    def __init__(self, server: BlobServer, stream: SocketStream) -> None:
        super().__init__(server.slots, stream)
        self.server = server
        self.settings = server.settings
        self.storage = server.storage
        self.parser = ServerConnection()
        self.request: ServerEvent | None = None
        self.moved = 0  # body bytes the request in hand has moved, for its observers
        self.authenticated = False
        # When the preamble or request header being received must be complete by.
        self._header_deadline: float | None = self.waiting_since + self.settings.io_timeout

    async def _fail(self, exc: Exception) -> None:
        if isinstance(exc, RemoteProtocolError) and self.parser.http_request:  # curl: an HTTP answer it can show
            log.info("%s: an HTTP request at the binary port", self.stream.peer)
            self._stop_counting()
            with contextlib.suppress(TransportError):
                await self.stream.send_all(_HTTP_AT_BINARY, self.settings.io_timeout)
                await self.stream.linger_close()
            return
        if isinstance(exc, RemoteProtocolError):
            log.info("%s: bad request: %s", self.stream.peer, exc)
        elif not isinstance(exc, ServerError):
            log.exception("%s: internal error", self.stream.peer, exc_info=exc)
            exc = InternalError("internal server error")
        await self._refuse(exc.code, str(exc))

    async def _refuse(self, code: int, message: str) -> None:
        """Send a closing error frame, then close gracefully."""
        self._stop_counting()
        with contextlib.suppress(TransportError):
            await self._send(ErrorFrame(code, message))
            await self.stream.linger_close()

    async def _serve(self) -> None:
        await self._next_event(self.settings.io_timeout)  # the preamble
        if not self.slots.admit(self):
            raise Busy(f"the server is at its limit of {self.settings.max_connections} connections")
        nonce = secrets.token_bytes(32) if self.server._secret is not None else None
        await self._send(ServerHello(nonce=nonce))
        self.authenticated = nonce is None
        observers = self.server.observers
        # TLS connections are read by their task: the callback does not decrypt.
        fast_path = FastPath(self) if type(self.stream) is SocketStream else None
        while not self.slots.closing:
            event = await self._next_request(fast_path)
            if isinstance(event, Signal):  # CLOSED: the client hung up between requests
                return
            self.busy, self.request, self.moved = True, event, 0
            began, outcome = time.perf_counter() if observers else 0.0, ABORTED
            try:
                if fast_path is not None and fast_path.unsent is not None:
                    outcome = await self._send_unsent(fast_path)
                else:
                    if not self.authenticated:
                        self._authenticate(event, nonce)
                    await self._dispatch(event)
                    outcome = 0
            except ServerError as exc:
                outcome = exc.code
                if not exc.keeps_connection:
                    raise
                await self._send(ErrorFrame(exc.code, str(exc)))
            except RemoteProtocolError as exc:
                outcome = exc.code
                raise
            except Exception as exc:
                if not isinstance(exc, TransportError):  # a transport error is no answer: ABORTED
                    outcome = InternalError.code  # what run() answers
                raise
            finally:
                if observers:
                    seconds = time.perf_counter() - began
                    for observe in observers:
                        observe(event, outcome, self.moved, seconds, self.stream)
            self.request = None
            self._request_done()

    def _authenticate(self, event: ServerEvent, nonce: bytes | None) -> None:
        if not isinstance(event, AuthRequest):
            raise AuthRequired("this server requires AUTH first")
        assert self.server._secret is not None and nonce is not None
        expected = hmac.new(self.server._secret, nonce, hashlib.sha256).digest()
        if not hmac.compare_digest(expected, event.mac):
            raise AuthFailed("wrong shared secret")
        self.authenticated = True

    async def _dispatch(self, event: ServerEvent) -> None:
        self.server.requests[op_name(event)] += 1
        if not isinstance(event, AuthRequest | StatusRequest):  # a standby still tells its status
            self.server.ha.check()
        match event:
            case PutRequest():
                await self._put(event)
            case GetRequest():
                await self._get(event)
            case StatRequest(target):
                await self._send(StatOk(*await self.server.stat_blob(target)))
            case DeleteRequest(target):
                await self.server.delete_blob(target)
                await self._send(DeleteOk())
            case LinkRequest(target, key):
                await self._link(target, key)
            case ListRequest(job):
                await self.server.ha.recover_job(job)
                entries = await asyncio.to_thread(self.storage.list_job, job)
                await self._send(ListOk(tuple(entries)))
            case AuthRequest():  # already authenticated, or no secret configured
                await self._send(AuthOk())
            case StatusRequest():
                await self._send(StatusOk(self.server.status()))
            case HeartbeatRequest(report):
                await self._send(HeartbeatOk(await self.server.heartbeat(report)))
            case HostsRequest():
                # The server's clock comes along: "seen N s ago" needs no agreement with the client's.
                await self._send(HostsOk({"hosts": self.server.hosts.listing(), "now": round(time.time(), 3)}))
            case CheckpointsRequest(request):
                await self._send(CheckpointsOk(await self.server.checkpoints.handle(request)))
            case _:
                raise RemoteProtocolError(f"unexpected {type(event).__name__}")

    async def _link(self, target: JobBlob, key: bytes) -> None:
        """LINK: the name on local disk (storage's locks make it atomic), then in the HA store
        from the local object (never from the name, which a concurrent PUT may have replaced),
        then the acknowledgement, as for a PUT. Content only the HA store holds (a task's
        state file it wrote there, a blob stored under another leader) is named in the store
        alone, no byte copied here, and an older local blob of the name dropped."""
        async with self.server.writing_into(target):
            try:
                size = await asyncio.to_thread(self.storage.link, key, target)
            except NotFound:
                adopted = await self.server.ha.adopt(key, target)
                if adopted is None:
                    raise
                size = adopted
                with contextlib.suppress(NotFound):
                    await asyncio.to_thread(self.storage.delete, target)
            else:
                await self.server.ha.link(self.storage.layout.object(key), key, target)
        await self.server.ha.acknowledge()
        await self._send(LinkOk(size, key))

    async def _put(self, request: PutRequest) -> None:
        limit = self.settings.max_blob_size
        if request.length > limit:
            raise TooLarge(f"{request.length} bytes is over this server's limit of {limit}")
        with await self._stage(request.length) as upload:
            # A small body often came whole with its header: nothing to wait for, no timer.
            deadline = (
                contextlib.nullcontext()
                if self.parser.body_buffered
                else body_deadline(request.length, self.settings.io_timeout, ReadTimeout)
            )
            try:
                async with deadline:
                    digest = await self._receive_body(upload)
            finally:
                self.moved = upload.size
            async with self.server.writing_into(request.target):
                if self.server.ha.copies_uploads:
                    await _finish(self.server.ha.store(upload, request.target, digest))
                # Publication fsyncs, which can take milliseconds even for a tiny file: never on
                # the loop, and shared with the PUTs publishing at the same time.
                key = await _finish(self.server.committer.publish(upload, request.target, digest))
        await self.server.ha.acknowledge()
        await self._send(PutOk(key))

    async def _stage(self, length: int) -> StagedUpload:
        """The staging of an upload of ``length`` bytes. Reserving a large one's disk blocks
        takes a worker thread: milliseconds for gigabytes (15 ms for 8 GiB), which every other
        connection of the loop would wait out."""
        if length <= RESERVE_ON_LOOP_LIMIT:
            return self.storage.stage(length)
        staging = asyncio.get_running_loop().run_in_executor(None, self.storage.stage, length)
        try:
            await wait_out(staging)
        except asyncio.CancelledError:
            if staging.exception() is None:
                staging.result().discard()  # nobody else knows of its file
            raise
        return staging.result()

    async def _receive_body(self, upload: StagedUpload) -> bytes:
        """Write the PUT body to ``upload`` as it arrives; returns the trailer's digest.

        Large chunks are written by a worker thread while the next one is received, so the
        network, the hash and the disk overlap instead of taking turns.
        """
        writing: asyncio.Future[None] | None = None
        loop = asyncio.get_running_loop()
        unstarted = 0  # bytes written since the disk was last started on them
        try:
            while True:
                event = await self._next_event(self.settings.io_timeout)
                if writing is not None:
                    await wait_out(writing)
                    written, writing = writing, None
                    written.result()  # a full disk surfaces here
                if isinstance(event, PutTrailer):
                    return event.digest
                assert isinstance(event, Data)
                unstarted += len(event.data)
                if unstarted >= WRITEBACK_STEP:  # sync_file_range may wait for the disk: not on the loop
                    unstarted = 0
                    writing = loop.run_in_executor(None, _write_and_start_writeback, upload, event.data)
                elif len(event.data) < INLINE_WRITE_LIMIT:
                    upload.write(event.data)
                else:
                    writing = loop.run_in_executor(None, upload.write, event.data)
        finally:
            if writing is not None:
                # Never leave a thread writing to a staging file that is about to be removed;
                # the error that brought us here matters more than this write's own.
                await wait_out(writing)
                if not writing.cancelled():
                    writing.exception()

    async def _get(self, request: GetRequest) -> None:
        self.server.ha.check()  # a standby answers NOT_LEADER, also for what it holds in memory
        hot = self.storage.hot
        cached = hot.get(request.target)
        if cached is not None:
            if request.offset > cached.size:
                raise BadOffset(f"offset {request.offset} is past the end of a {cached.size}-byte blob")
            count = cached.size - request.offset
            async with body_deadline(count, self.settings.io_timeout, WriteTimeout):
                await self.stream.send_all(cached.reply(request.offset), self.settings.io_timeout)
            self.moved = count
            return
        generation = hot.generation
        with await self.server.open_blob(request.target) as blob:
            if request.offset > blob.size:
                raise BadOffset(f"offset {request.offset} is past the end of a {blob.size}-byte blob")
            header = self.parser.send(GetOk(blob.size, blob.digest))
            count = blob.size - request.offset
            async with body_deadline(count, self.settings.io_timeout, WriteTimeout):
                if count <= INLINE_READ_LIMIT:
                    body = os.pread(blob.fd, count, request.offset)
                    if request.offset == 0 and len(body) == blob.size:
                        self.storage.remember_hot(request.target, generation, blob, body)
                    await self.stream.send_all(header + body, self.settings.io_timeout)
                else:
                    await self.stream.send_all(header, self.settings.io_timeout)
                    await self.stream.sendfile(blob.fd, request.offset, count, self.settings.io_timeout)
            self.moved = count

    async def _next_request(self, fast_path: FastPath | None) -> ServerEvent | Signal:
        """The next request (or CLOSED) for this task, small requests answered by
        ``fast_path`` meanwhile; ``idle_timeout`` bounds the wait for it."""
        if fast_path is not None:
            event = await fast_path.next_event()
            if event is not NEED_DATA:
                return event
        return await self._next_event(self.settings.idle_timeout)

    async def _send_unsent(self, fast_path: FastPath) -> int:
        """Finish a reply of the reader callback the socket did not take whole, under its body
        deadline; the outcome it answers."""
        assert fast_path.unsent is not None
        rest, count, fast_path.unsent = fast_path.unsent, fast_path.unsent_count, None
        async with body_deadline(count, self.settings.io_timeout, WriteTimeout):
            await self.stream.send_all(rest, self.settings.io_timeout)
        self.moved = count
        return fast_path.unsent_outcome

    async def _next_event(self, timeout: float) -> ServerEvent | Signal:
        """The next frame, reading as needed; ``timeout`` bounds each wait for bytes, and a
        preamble or request header must be whole within ``io_timeout`` of its first byte."""
        while True:
            event = self.parser.next_event()
            if event is not NEED_DATA:
                self._header_deadline = None
                return event
            if not self.parser.between_requests:
                # Part of a frame came with earlier bytes (the preamble, a pipelined request):
                # the client is mid-request, not idle.
                timeout = self.settings.io_timeout
                if self._header_deadline is None and not self.parser.body_remaining:
                    self._header_deadline = self._loop.time() + timeout
            want = self.parser.body_remaining or RECV_SIZE
            async with header_deadline(self._header_deadline, self.settings.io_timeout):
                data = await self.stream.recv(min(want, RECV_SIZE), timeout)
            self.parser.receive_data(data)
            timeout = self.settings.io_timeout  # a frame has begun: no more idling

    async def _send(self, frame: Any) -> None:
        await self.stream.send_all(self.parser.send(frame), self.settings.io_timeout)
