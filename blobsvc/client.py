"""Clients of a blob server: :class:`AsyncBlobClient` and its blocking face :class:`BlobClient`.

The async client does all the work: a pool of reusable connections, a timeout on every
network step, retries with exponential back-off and jitter for failures that a retry can
cure, a BLAKE3 check of every byte read, and resumption of a broken GET from the bytes
already received. :class:`BlobClient` runs the same coroutines on a private event-loop
thread, so it works in plain scripts, in Spark tasks and under a running loop (Jupyter).

Keys are 64-character hex strings; job ids are 32-character hex strings (or UUIDs).

May import :mod:`blobsvc.ha.discovery` (``zk://`` servers), storage's file-writing helpers,
:mod:`blobsvc.wire`, config and exceptions; never the server.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import enum
import functools
import io
import os
import random
import ssl
import tempfile
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Concatenate, ParamSpec, TypeVar

import blake3

from ._exceptions import (
    AuthRequired,
    BadOffset,
    Busy,
    ClientClosed,
    ConnectError,
    ConnectionClosed,
    ConnectTimeout,
    DigestMismatch,
    InvalidArgument,
    LocalProtocolError,
    NotFound,
    NotLeader,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    TLSError,
    TransportError,
    error_for_code,
)
from .config import DEFAULT_PORT, Settings, parse_address
from .files._filewrite import preallocate, pwrite_all
from .files._pages import address_of, fresh_bytearray, prefault
from .files._writeback import fsync_dir, start_writeback
from .ha.discovery import LeaderResolver, is_zk_url
from .wire._connect import connect
from .wire._ids import JobLike, KeyLike, hash_file, job_bytes, key_bytes
from .wire._netio import SocketStream
from .wire._protocol import (
    CLOSED,
    NEED_DATA,
    AuthOk,
    AuthRequest,
    CheckpointsOk,
    CheckpointsRequest,
    ClientConnection,
    ClientEvent,
    ContentKey,
    Data,
    DeleteRequest,
    EndOfBody,
    ErrorFrame,
    GetOk,
    GetRequest,
    HeartbeatOk,
    HeartbeatRequest,
    Hello,
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
    Request,
    ServerHello,
    Signal,
    StatOk,
    StatRequest,
    StatusOk,
    StatusRequest,
    WholeJob,
)
from .wire._threads import wait_out
from .wire._tls import client_context_for

__all__ = ["AsyncBlobClient", "BlobClient", "BlobInfo", "Progress", "Source"]

CHUNK = 1 << 20
# A file download receives into this many buffers of this size in turn, while the workers
# hash and write the ones before: its memory stays this small whatever the blob's size. A
# buffer is read three times (received into, hashed, written out) within a few milliseconds;
# at 1 MiB it is still in the CPU's cache for the second and third: 256 MiB to a file took
# 108-130 ms of client CPU with 1 MiB buffers against 153-168 with 8 MiB ones, 1.2-1.4 x as
# fast (issue 27, benchmarks/RESULTS.md).
BODY_BUFFER = 1 << 20
BODY_BUFFERS = 8
# A download into memory hands the hasher this much at a time.
HASH_STEP = 8 << 20
# A download into memory this large gets its pages made ready this far ahead of the socket.
PREFAULT_LIMIT = 4 << 20
PREFAULT_AHEAD = 32 << 20
# An upload of bytes at hand goes out in pieces of this size: between two, the client looks
# for an early refusal and reports progress.
SEND_PIECE = 8 << 20
# Smaller pieces are hashed (and written) on the event loop: a thread hop would cost more.
INLINE_HASH_LIMIT = 256 << 10
MAX_IDLE_CONNECTIONS = 8
MAX_BACKOFF = 5.0
DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds; a zk:// client waits this long for a leader too

Progress = Callable[[int], None]
"""Called with the number of bytes moved since the last call."""
Source = bytes | bytearray | memoryview | str | os.PathLike[str] | IO[bytes]
"""What ``put`` uploads: bytes, a file path, or a binary stream."""

_T = TypeVar("_T")
_P = ParamSpec("_P")


@dataclass(frozen=True, slots=True)
class BlobInfo:
    """A stored blob: its key (hex BLAKE3 digest), size, and name when job-scoped."""

    key: str
    size: int
    name: str | None = None


class _State(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


def _target(key: KeyLike | None, job: JobLike | None, name: str | None) -> ContentKey | JobBlob:
    if key is not None and job is None and name is None:
        return ContentKey(key_bytes(key))
    if key is None and job is not None and name is not None:
        return JobBlob(job_bytes(job), name)
    raise InvalidArgument("name a blob by its key, or by job and name")


def _parse_address(server: str | tuple[str, int]) -> tuple[str, int]:
    return server if isinstance(server, tuple) else parse_address(server)


class _Channel:
    """One connection: a socket stream and the protocol state machine that reads it."""

    def __init__(self, stream: SocketStream, peer: str) -> None:
        self.stream = stream
        self.protocol = ClientConnection(peer)

    async def send(self, frame: Hello | Request | Data | PutTrailer, timeout: float | None) -> None:
        await self.stream.send_all(self.protocol.send(frame), timeout)

    async def next_event(self, timeout: float | None) -> ClientEvent:
        while True:
            event = self.protocol.next_event()
            if event is CLOSED:
                raise ConnectionClosed("the server closed the connection")
            if not isinstance(event, Signal):
                return event
            self.protocol.receive_data(await self.stream.recv(CHUNK, timeout))

    async def reply(self, timeout: float | None) -> ClientEvent:
        """The next reply; an error frame is raised as its exception."""
        event = await self.next_event(timeout)
        if isinstance(event, ErrorFrame):
            raise error_for_code(event.code, event.message)
        return event

    @property
    def reusable(self) -> bool:
        return not self.protocol.closed and not self.protocol.pending

    def close(self) -> None:
        self.stream.close()


class _Worker:
    """Runs jobs one at a time, in order, on a thread of its own, so that hashing (or
    writing) one chunk of a download overlaps with receiving the next. The thread starts
    with the first job: small downloads never pay for it."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._jobs: collections.deque[asyncio.Future[object]] = collections.deque()

    def submit(self, job: Callable[..., object], *args: Any) -> None:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=self._name)
        self._jobs.append(asyncio.wrap_future(self._pool.submit(job, *args)))

    @property
    def queued(self) -> int:
        return len(self._jobs)

    async def wait_oldest(self) -> None:
        """Wait for the oldest job; its error (a full disk) is raised here."""
        await self._jobs.popleft()

    async def wait_all(self) -> None:
        while self._jobs:
            await self.wait_oldest()

    async def aclose(self) -> None:
        """Wait out every job, through cancellations too (the caller closes the file the jobs
        write to next), then end the thread; errors were or will be reported elsewhere."""
        try:
            while self._jobs:
                job = self._jobs.popleft()
                await wait_out(job)
                if not job.cancelled():
                    job.exception()  # reported by whoever waited for it, or moot
        finally:
            if self._pool is not None:
                self._pool.shutdown(wait=False)
                self._pool = None


class _Sink:
    """Where a GET's body goes: the socket is read straight into the sink's buffers
    (:meth:`room`, then :meth:`filled`), and a worker thread hashes what has arrived while
    the loop receives more, beside a second one that writes it out (or readies memory for
    what is to come). ``size`` is what it holds, so that a retry resumes from there."""

    inline_limit = INLINE_HASH_LIMIT

    def __init__(self, hasher: Any = None, size: int = 0) -> None:
        self.size = size
        self._hasher = blake3.blake3() if hasher is None else hasher
        self._hashing = _Worker("blobsvc-hash")
        self._moving = _Worker("blobsvc-write")

    def begin(self, total: int) -> None:
        """The announced size of the whole blob; ``size`` bytes of it are held already."""

    async def room(self, most: int) -> memoryview:
        """Where the next bytes go: at most ``most`` (> 0) of them."""
        raise NotImplementedError

    async def filled(self, count: int) -> None:
        """``count`` bytes landed at the start of the last :meth:`room`."""
        raise NotImplementedError

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        """Take bytes that were read with a frame header rather than into :meth:`room`."""
        view = memoryview(data).cast("B")
        while view:
            room = await self.room(len(view))
            count = len(room)
            room[:] = view[:count]
            await self.filled(count)
            view = view[count:]

    async def digest(self) -> bytes:
        """The BLAKE3 of every byte held, once all of them are hashed (and written)."""
        await self._wait_all()
        digest = self._hasher.digest()
        assert isinstance(digest, bytes)
        return digest

    async def reset(self) -> None:
        await self._wait_all()
        self._hasher = blake3.blake3()
        self.size = 0

    async def aclose(self) -> None:
        try:
            await self._hashing.aclose()
        finally:
            await self._moving.aclose()

    async def _wait_all(self) -> None:
        await self._hashing.wait_all()
        await self._moving.wait_all()

    def _take(self, view: memoryview, step: Callable[[memoryview], None] | None = None) -> bool:
        """Feed ``view`` to the hasher and to ``step`` (a write), each on its own worker for
        large pieces, so that hashing, writing and receiving the next piece all overlap
        (BLAKE3 and ``pwrite`` release the GIL); inline for small ones, which a thread hop
        would cost more than it saves. Whether they went to the workers."""
        if len(view) < self.inline_limit and not self._hashing.queued and not self._moving.queued:
            self._hasher.update(view)
            if step is not None:
                step(view)
            return False
        self._hashing.submit(self._hasher.update, view)
        if step is not None:
            self._moving.submit(step, view)
        return True


class _MemorySink(_Sink):
    """Receives into one ``bytearray`` of the announced size: no copy, no reallocation. A
    large one is allocated without zeroing its pages, and the second worker touches them
    (``PREFAULT_AHEAD`` bytes ahead of the socket) while the loop receives: see ``_pages``."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self._hashed = 0
        self._address = 0  # of a large blob's bytes, whose pages are made ready ahead
        self._ready = 0  # bytes up to here have their pages made ready, or asked to be

    def begin(self, total: int) -> None:
        if len(self.data) != total:
            assert self.size == 0, "a blob of another size is started over with reset()"
            if total < PREFAULT_LIMIT:
                self.data = bytearray(total)
            else:
                self.data = fresh_bytearray(total)  # every byte is received into before it is seen
                self._address, self._ready = address_of(self.data), 0
        self._ready_ahead()

    async def room(self, most: int) -> memoryview:
        return memoryview(self.data)[self.size : self.size + most]

    async def filled(self, count: int) -> None:
        self.size += count
        if self.size - self._hashed >= HASH_STEP or self.size == len(self.data):
            self._take(memoryview(self.data)[self._hashed : self.size])
            self._hashed = self.size
            self._ready_ahead()

    def _ready_ahead(self) -> None:
        if not self._address:
            return
        ahead = min(len(self.data), self.size + PREFAULT_AHEAD)
        while self._ready < ahead:
            step = min(HASH_STEP, ahead - self._ready)
            self._moving.submit(prefault, self._address + self._ready, step)
            self._ready += step

    async def reset(self) -> None:
        await super().reset()
        self._hashed = 0


class _FileSink(_Sink):
    """Receives into a few buffers of ``BODY_BUFFER`` bytes that the worker hashes and
    writes (``os.pwrite``) in turn, so a download holds at most ``BODY_BUFFERS`` of them in
    memory, whatever the blob's size. The file gets the disk blocks of the whole blob before
    its first byte, and each buffer is written in pieces the page cache takes cheaply (see
    :mod:`blobsvc.files._filewrite`). With ``fsync`` the disk starts on each written buffer at once
    (the caller fsyncs at the end). ``fd`` stays the caller's to close."""

    def __init__(self, fd: int, size: int = 0, hasher: Any = None, *, fsync: bool = False) -> None:
        super().__init__(hasher, size)
        self.fd = fd
        self.fsync = fsync
        self._offset = size  # where the buffer being filled goes in the file
        self._free: list[bytearray] = []
        self._busy: collections.deque[bytearray] = collections.deque()
        self._buffer: bytearray | None = None
        self._fill = 0
        self._total = 0

    def begin(self, total: int) -> None:
        self._total = total
        if self.fd >= 0:  # a full disk is told before the body is read, not after
            preallocate(self.fd, self.size, total - self.size)

    async def room(self, most: int) -> memoryview:
        if self._buffer is None:
            if not self._free and len(self._busy) + 1 >= BODY_BUFFERS:
                await self._hashing.wait_oldest()
                await self._moving.wait_oldest()
                self._free.append(self._busy.popleft())
            # A small blob gets a buffer of its size, not a whole BODY_BUFFER.
            self._buffer = self._free.pop() if self._free else bytearray(min(BODY_BUFFER, self._total - self.size))
        return memoryview(self._buffer)[self._fill : self._fill + most]

    async def filled(self, count: int) -> None:
        self._fill += count
        self.size += count
        assert self._buffer is not None
        if self._fill == len(self._buffer):
            self._hand_over()

    def _hand_over(self) -> None:
        buffer, count, offset = self._buffer, self._fill, self._offset
        if buffer is None or not count:
            return
        self._buffer, self._fill, self._offset = None, 0, offset + count
        queued = self._take(memoryview(buffer)[:count], functools.partial(self._write, offset=offset))
        (self._busy if queued else self._free).append(buffer)

    def _write(self, view: memoryview, *, offset: int) -> None:
        pwrite_all(self.fd, view, offset)
        if self.fsync:
            start_writeback(self.fd, offset, len(view))

    async def digest(self) -> bytes:
        self._hand_over()
        return await super().digest()

    async def reset(self) -> None:
        await self._wait_all()
        self._free.extend(self._busy)
        self._busy.clear()
        self._buffer, self._fill, self._offset = None, 0, 0
        os.ftruncate(self.fd, 0)
        await super().reset()


class _StreamSink(_FileSink):
    """Writes to a binary stream that cannot be rewound (stdout, a pipe), always from the
    worker thread, so that a slow reader of a pipe stalls this download, not the event loop.
    A resumed read continues the stream; a download that would have to start over fails."""

    inline_limit = 0

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(-1)
        self.stream = stream

    def _write(self, view: memoryview, *, offset: int) -> None:
        self.stream.write(view)

    async def reset(self) -> None:
        await self._wait_all()
        raise DigestMismatch(
            f"the {self.size} bytes written so far are not of the blob now stored (it changed or arrived "
            "damaged), and a stream cannot start over: discard them"
        )


class AsyncBlobClient:
    """An asyncio client of one blob server, or of a cluster's leader.

    ``server`` is ``"host:port"``, a ``(host, port)`` pair, or ``"zk://HOST:PORT[,…]/CLUSTER_ID"``:
    then the leader is looked up in ZooKeeper, and looked up again after NOT_LEADER or a
    failed connection (waiting up to ``connect_timeout`` for a new leader to be elected),
    within the same retry budget. ``timeout`` bounds every wait
    for the server (a read that stalls, a reply that does not come); ``retries`` is how many
    more attempts a request gets after a connection failure, a timeout or BUSY, waiting
    ``backoff * 2**n`` seconds (with jitter) between them. Server answers such as NOT_FOUND
    are never retried. ``tls`` (see :func:`blobsvc.client_tls_context`) makes every
    connection TLS, checking the server's certificate against the host name in ``server``.
    Use as ``async with AsyncBlobClient(...) as client:``. Fork-safe: a forked child drops
    the pooled connections it inherited and connects afresh.

    ``one_shot`` is for a command that asks once and exits (the ``blobsvc`` CLI): a refused
    connection and a name that does not resolve (``ConnectError.nobody_there``) end the
    request at once, since nobody serves there. A long-lived client (the default: a cache,
    an agent, a driver) retries them, as a server restarting or failing over refuses
    connections for a moment; with a ``zk://`` server a refused connection always looks the
    leader up again.
    """

    def __init__(
        self,
        server: str | tuple[str, int] = f"127.0.0.1:{DEFAULT_PORT}",
        *,
        secret: bytes | None = None,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.1,
        tls: ssl.SSLContext | None = None,
        one_shot: bool = False,
    ) -> None:
        self._resolver = LeaderResolver(server) if is_zk_url(server) else None
        self._located = self._resolver is None
        self._avoid: str | None = None  # a server that failed: wait for the leader node to name another
        self.host, self.port = _parse_address(server) if self._resolver is None else ("", 0)
        self.tls = tls
        self.secret = secret
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.one_shot = one_shot
        self._idle: list[_Channel] = []
        self._open: weakref.WeakSet[_Channel] = weakref.WeakSet()  # idle or in use: what a fork closes
        self._state = _State.OPEN
        _pools.add(self)

    @classmethod
    def from_settings(cls, settings: Settings, *, one_shot: bool = False) -> AsyncBlobClient:
        """A client of ``settings.server`` with its secret, TLS files, timeouts and retries."""
        return cls(settings.server, one_shot=one_shot, **_options_from(settings))

    @property
    def server(self) -> str:
        if self._resolver is not None:
            return f"{self._resolver.url} (leader {self.host}:{self.port})" if self.host else self._resolver.url
        return f"{self.host}:{self.port}"

    async def __aenter__(self) -> AsyncBlobClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._state = _State.CLOSED
        self._close_idle()

    # --- public operations -------------------------------------------------------------------

    async def put(
        self,
        source: Source,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        key: KeyLike | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> str:
        """Upload ``source`` (bytes, a file path, or a binary stream) and return its key.

        Without ``job`` the blob is content-addressed; with ``job`` and ``name`` it is stored
        under that name, replacing an earlier blob of the name atomically. A ``key`` known
        already (bytes or a file the caller hashed) is sent as the digest rather than hash
        them again; bytes that do not hash to it raise :class:`DigestMismatch` and store nothing.
        """
        if (job is None) != (name is None):
            raise InvalidArgument("a job-scoped blob needs both job and name")
        target = JobBlob(job_bytes(job), name) if job is not None and name is not None else None
        digest = key_bytes(key) if key is not None else None
        return await self._upload(source, target, timeout, progress, digest=digest)

    async def _upload(
        self,
        source: Source,
        target: JobBlob | None,
        timeout: float | None,
        progress: Progress | None,
        digest: bytes | None = None,
    ) -> str:
        """PUT ``source``; a ``digest`` known already is sent as the trailer instead of
        hashing the bytes again (the server still hashes them, and refuses a mismatch)."""
        opener = _SourceOpener(source, digest)
        timeout = self.timeout if timeout is None else timeout

        async def attempt(channel: _Channel) -> str:
            async with opener() as (length, body):
                return await self._put_on(channel, PutRequest(length, target), body, timeout, progress)

        try:
            return await self._with_retries(attempt, timeout)
        finally:
            opener.close()

    async def get(
        self,
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> bytearray:
        """The bytes of a blob, verified against its digest. They come as the ``bytearray``
        they were received into, so that a large blob is not copied once more at the end;
        ``bytes(data)`` makes an immutable (hashable) copy."""
        sink = _MemorySink()
        try:
            await self._fetch(_target(key, job, name), sink, timeout, progress)
        finally:
            await sink.aclose()
        return sink.data

    async def get_file(
        self,
        dest: str | os.PathLike[str],
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
        fsync: bool = False,
    ) -> BlobInfo:
        """Download a blob to ``dest``. The file appears only once complete and verified: it
        is written beside ``dest`` under a temporary name and renamed into place.

        Like curl, wget and pip, this leaves the bytes to the kernel's page cache rather than
        wait for the disk: no partial file is ever visible, and a crash of this process loses
        nothing, but after a power loss or a kernel crash the file may be damaged or empty.
        ``fsync=True`` makes the file durable before it is renamed into place, and its name
        after (the directory is fsynced too); that costs the disk's write rate.
        (:class:`~blobsvc.cache.BlobCache` rehashes what it downloaded in an earlier boot of
        the host instead.)"""
        dest = Path(dest)
        fd, temp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        try:
            info = await self._fetch_to_fd(fd, 0, None, _target(key, job, name), timeout, progress, fsync)
            os.close(fd)
            fd = -1
            os.replace(temp, dest)
            if fsync:
                await asyncio.to_thread(fsync_dir, dest.parent)  # the name, as durable as the bytes
        except BaseException as exc:
            if fd >= 0:
                os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            if isinstance(exc, OSError) and exc.filename is None:  # a full disk: say where
                raise OSError(exc.errno, exc.strerror, os.fspath(dest)) from exc
            raise
        return info

    async def get_into(
        self,
        stream: IO[bytes],
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> BlobInfo:
        """Write a blob to a binary ``stream`` (stdout, a pipe) as it arrives, holding no
        more than a chunk in memory.

        The bytes are checked as they pass and the whole against the blob's digest at the
        end: a :class:`DigestMismatch` (or any error) means that what was written must be
        discarded. A broken read resumes where the stream stopped.
        """
        sink = _StreamSink(stream)
        try:
            return await self._fetch(_target(key, job, name), sink, timeout, progress)
        finally:
            await sink.aclose()  # no thread may still write to the stream when this returns

    async def resume_file(
        self,
        partial: str | os.PathLike[str],
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
        fsync: bool = False,
    ) -> BlobInfo:
        """Download a blob into ``partial`` after the bytes it already holds, and verify the
        whole file against the blob's digest; with ``fsync``, flush it to disk too (see
        :meth:`get_file`).

        A failed download keeps what it received, so a later call (in this process or
        another: blobsvc's cache after a downloader died) resumes from there rather than
        from zero. The caller keeps two downloads off one file and renames it once this
        returns. When the held bytes are not the start of this blob, the download ends in
        :class:`DigestMismatch` (and the file is emptied), or in :class:`BadOffset` when
        they outnumber the blob's bytes.
        """
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            held = os.fstat(fd).st_size
            prefix = blake3.blake3()
            if held:
                await asyncio.to_thread(prefix.update_mmap, partial)
            return await self._fetch_to_fd(fd, held, prefix, _target(key, job, name), timeout, progress, fsync)
        finally:
            os.close(fd)

    async def _fetch_to_fd(
        self,
        fd: int,
        held: int,
        prefix: Any,
        target: ContentKey | JobBlob,
        timeout: float | None,
        progress: Progress | None,
        fsync: bool,
    ) -> BlobInfo:
        """GET into the file ``fd`` after its ``held`` bytes (hashed into ``prefix``); with
        ``fsync``, flushed to disk."""
        sink = _FileSink(fd, held, prefix, fsync=fsync)
        try:
            info = await self._fetch(target, sink, timeout, progress)
        finally:
            await sink.aclose()  # no thread may still write when the caller closes the file
        if fsync:
            await asyncio.to_thread(os.fsync, fd)
        return info

    async def stat(
        self,
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
    ) -> BlobInfo:
        """Size and key of a blob; raises :class:`NotFound` when there is none."""
        reply = await self._simple(StatRequest(_target(key, job, name)), timeout)
        assert isinstance(reply, StatOk)
        return BlobInfo(reply.digest.hex(), reply.size, name)

    async def delete(
        self,
        key: KeyLike | None = None,
        *,
        job: JobLike | None = None,
        name: str | None = None,
        timeout: float | None = None,
    ) -> None:
        """Delete one blob; deleting what does not exist succeeds."""
        await self._simple(DeleteRequest(_target(key, job, name)), timeout)

    async def delete_job(self, job: JobLike, *, timeout: float | None = None) -> None:
        """Delete every blob of ``job``."""
        await self._simple(DeleteRequest(WholeJob(job_bytes(job))), timeout)

    async def link(self, key: KeyLike, *, job: JobLike, name: str, timeout: float | None = None) -> BlobInfo:
        """Name content the server already holds as ``name`` of ``job``, sending none of its
        bytes; raises :class:`NotFound` when the server does not hold ``key``."""
        reply = await self._simple(LinkRequest(JobBlob(job_bytes(job), name), key_bytes(key)), timeout)
        assert isinstance(reply, LinkOk)
        return BlobInfo(reply.digest.hex(), reply.size, name)

    async def put_file(
        self,
        path: str | os.PathLike[str],
        *,
        job: JobLike,
        name: str,
        key: KeyLike | None = None,
        timeout: float | None = None,
        progress: Progress | None = None,
    ) -> tuple[BlobInfo, bool]:
        """Store the file at ``path`` as ``name`` of ``job``, uploading its bytes only when the
        server lacks them: the file is hashed here and LINKed; on NOT_FOUND its bytes are PUT
        as a content-addressed blob, which outlives the job (the next run of a pipeline links
        it again), and LINKed. The upload sends the key as its digest rather than hash the
        file once more; the server hashes what it receives. A ``key`` known already (from a
        digest remembered by the caller) saves the hashing here; an upload whose bytes do not
        hash to it raises :class:`DigestMismatch` and stores nothing. Returns the blob and
        whether its bytes were sent."""
        key = key_bytes(key) if key is not None else await asyncio.to_thread(hash_file, Path(path))
        try:
            return await self.link(key, job=job, name=name, timeout=timeout), False
        except NotFound:
            pass
        try:
            await self._upload(Path(path), None, timeout, progress, digest=key)
        except DigestMismatch as exc:
            raise DigestMismatch(f"{path} does not hash to {key.hex()} (changed while it was published?)") from exc
        return await self.link(key, job=job, name=name, timeout=timeout), True

    async def list(self, job: JobLike, *, timeout: float | None = None) -> list[BlobInfo]:
        """Every blob of ``job``, in no particular order."""
        reply = await self._simple(ListRequest(job_bytes(job)), timeout)
        assert isinstance(reply, ListOk)
        return [BlobInfo(e.digest.hex(), e.size, e.name) for e in reply.entries]

    async def status(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The server's status: version, uptime, role, blobs and bytes stored, free disk,
        connections, requests served (docs/operating.md, "blobsvc status", lists the fields)."""
        reply = await self._simple(StatusRequest(), timeout)
        assert isinstance(reply, StatusOk)
        return reply.status

    async def hosts(self, *, timeout: float | None = None) -> dict[str, Any]:
        """The executor hosts whose agents report to the server: ``{"hosts": [...], "now": …}``
        (docs/protocol.md, "HOSTS", lists the fields); ``now`` is the server's clock, which
        each host's ``last_seen`` is on. Retried and sent to the leader as :meth:`status` is."""
        reply = await self._simple(HostsRequest(), timeout)
        assert isinstance(reply, HostsOk)
        return reply.hosts

    async def heartbeat(self, report: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """Report an executor host's agent to the server (docs/protocol.md, "HEARTBEAT", lists
        the fields; ``agent`` is required) and return its answer: ``interval`` (seconds it
        wants between heartbeats), ``lost_after`` and ``gone_jobs`` (those of the report's
        ``jobs`` that no longer exist). Retried, and with a ``zk://`` URL sent to the leader,
        as :meth:`status` is; a malformed report raises :class:`BadRequest`."""
        reply = await self._simple(HeartbeatRequest(dict(report)), timeout)
        assert isinstance(reply, HeartbeatOk)
        return reply.reply

    async def checkpoints(self, request: Mapping[str, Any], *, timeout: float | None = None) -> dict[str, Any]:
        """A CHECKPOINTS request (docs/protocol.md lists the actions): what
        :mod:`blobsvc.checkpoints` sends. Retried, and sent to the leader, as :meth:`status` is."""
        reply = await self._simple(CheckpointsRequest(dict(request)), timeout)
        assert isinstance(reply, CheckpointsOk)
        return reply.reply

    # --- machinery ---------------------------------------------------------------------------

    async def _simple(self, request: Request, timeout: float | None) -> ClientEvent:
        timeout = self.timeout if timeout is None else timeout

        async def attempt(channel: _Channel) -> ClientEvent:
            await channel.send(request, timeout)
            return await channel.reply(timeout)

        return await self._with_retries(attempt, timeout)

    async def _with_retries(self, attempt: Callable[[_Channel], Awaitable[_T]], timeout: float) -> _T:
        """Run ``attempt`` on a pooled connection, again after failures a retry can cure;
        ``timeout`` bounds each wait of the connection's set-up too."""
        if self._state is _State.CLOSED:
            raise ClientClosed("this client is closed")
        tries = 1 + self.retries
        for number in range(tries):
            try:
                await self._locate()
                channel = await self._acquire(timeout)
                try:
                    result = await attempt(channel)
                finally:
                    self._release(channel)
                return result
            except (TransportError, Busy, NotLeader) as exc:
                if isinstance(exc, NotLeader) and self._resolver is None:
                    raise
                if number + 1 == tries or isinstance(exc, TLSError) or self._answered(exc):
                    where = "" if self.server in str(exc) else f"server {self.server}, "
                    attempts = f"{number + 1} attempt{'s' if number else ''}"
                    final = type(exc)(f"{exc} ({where}{attempts})")
                    final.__dict__.update(exc.__dict__)  # what it says besides its message (nobody_there)
                    raise final from exc
                self._lose_leader(exc)
            delay = min(MAX_BACKOFF, self.backoff * 2**number) * random.uniform(0.5, 1.5)
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    def _answered(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the answer of a one-shot request: nobody serves at the address, or
        (``zk://``) no leader was found within ``connect_timeout``, which was the wait already."""
        if not self.one_shot or not isinstance(exc, ConnectError):
            return False
        return exc.no_leader if self._resolver is not None else exc.nobody_there

    async def _locate(self) -> None:
        """With a ``zk://`` URL, find the leader if the last one failed (or at first use)."""
        if self._located or self._resolver is None:
            return
        try:
            self.host, self.port = await asyncio.to_thread(self._resolver.leader, self._avoid, self.connect_timeout)
        except ConnectError as exc:
            exc.no_leader = True
            raise
        self._located, self._avoid = True, None

    def _lose_leader(self, exc: BaseException) -> None:
        if self._resolver is None or isinstance(exc, Busy):
            return
        if isinstance(exc, ConnectError | ConnectTimeout):
            # Nobody listens there: a dead leader whose node lingers until its session
            # expires. (A NOT_LEADER is only read again: a suspended leader may come back.)
            self._avoid = f"{self.host}:{self.port}"
        self._located = False
        self._close_idle()

    async def _acquire(self, timeout: float) -> _Channel:
        while self._idle:
            channel = self._idle.pop()
            if channel.stream.is_alive():
                return channel
            channel.close()  # the server closed it while it sat idle (its idle timeout)
        stream = await connect(self.host, self.port, min(self.connect_timeout, timeout), self.tls)
        channel = _Channel(stream, f"{self.host}:{self.port}")
        self._open.add(channel)
        try:
            await channel.send(Hello(), timeout)
            hello = await channel.reply(timeout)
            assert isinstance(hello, ServerHello)
            if hello.nonce is not None:
                if self.secret is None:
                    raise AuthRequired(f"server {self.server} requires a shared secret")
                await channel.send(AuthRequest.answering(self.secret, hello.nonce), timeout)
                ok = await channel.reply(timeout)
                assert isinstance(ok, AuthOk)
        except BaseException:
            channel.close()
            raise
        return channel

    def _close_idle(self) -> None:
        while self._idle:
            self._idle.pop().close()

    def _close_inherited(self) -> None:
        """In a forked child: close this process's copy of every connection, idle or in use
        by a request of the parent's (another thread's, on a loop the child does not run)."""
        self._idle.clear()
        for channel in list(self._open):
            channel.close()

    def _release(self, channel: _Channel) -> None:
        if channel.reusable and self._state is _State.OPEN and len(self._idle) < MAX_IDLE_CONNECTIONS:
            self._idle.append(channel)
        else:
            channel.close()

    async def _put_on(
        self,
        channel: _Channel,
        request: PutRequest,
        body: _Body,
        timeout: float | None,
        progress: Progress | None,
    ) -> str:
        """Send one PUT while listening for an early answer: a server that refuses the
        upload (TOO_LARGE, a full disk) says so before the body ends, and its error is
        worth more than the broken pipe that follows."""
        timeout = self.timeout if timeout is None else timeout
        await channel.send(request, timeout)
        early = asyncio.ensure_future(channel.reply(None))
        try:
            sent = 0
            async with contextlib.aclosing(body.send(channel, timeout, early.done)) as pieces:
                async for count in pieces:
                    sent += count
                    if progress:
                        progress(count)
                    if early.done():
                        break
            # Before the check: the digest may take a worker thread, and the server may answer
            # (and close) meanwhile.
            digest = await body.digest() if sent == request.length else b""
            if early.done():
                await early  # raises the server's error
                raise RemoteProtocolError("the server answered a PUT before its body ended")
            if sent != request.length:
                raise LocalProtocolError(f"the source gave {sent} bytes, not the {request.length} announced")
            await channel.send(PutTrailer(digest), timeout)
            try:
                reply = await asyncio.wait_for(asyncio.shield(early), timeout)
            except TimeoutError:
                raise ReadTimeout(f"no reply to a PUT within {timeout:g}s") from None
        except TransportError as broken:
            try:
                await asyncio.wait_for(asyncio.shield(early), 1.0)
            except ServerError as refused:
                raise refused from broken  # the server said why before it closed
            except Exception:
                pass
            raise
        finally:
            if not early.done():
                early.cancel()
                channel.protocol.closed = True  # a reply is half-read: never reuse this connection
        assert isinstance(reply, PutOk)
        return reply.key.hex()

    async def _fetch(
        self,
        target: ContentKey | JobBlob,
        sink: _Sink,
        timeout: float | None,
        progress: Progress | None,
    ) -> BlobInfo:
        """GET into ``sink``, resuming from ``sink.size`` after a broken read, and verify."""
        timeout = self.timeout if timeout is None else timeout
        expected: bytes | None = None

        async def attempt(channel: _Channel) -> BlobInfo:
            nonlocal expected
            await channel.send(GetRequest(target, sink.size), timeout)
            try:
                header = await channel.reply(timeout)
            except BadOffset:
                if expected is None:
                    raise  # bytes held from before this call (resume_file) that the blob lacks
                # The name now holds a blob shorter than what we have: start over.
                await sink.reset()
                expected = None
                raise ConnectionClosed("the blob changed during the download; starting over") from None
            assert isinstance(header, GetOk)
            if expected is not None and header.digest != expected:
                # The name now holds another blob: what we have is of the old one.
                channel.protocol.closed = True
                await sink.reset()
                expected = header.digest
                raise ConnectionClosed("the blob changed during the download; starting over")
            expected = header.digest
            sink.begin(header.size)
            await _receive_body(channel, sink, timeout, progress)
            actual = await sink.digest()
            if actual != header.digest:
                await sink.reset()
                expected = None
                raise DigestMismatch(
                    f"received bytes hash to {actual.hex()}, the server announced {header.digest.hex()}"
                )
            return BlobInfo(actual.hex(), header.size, target.name if isinstance(target, JobBlob) else None)

        return await self._with_retries(attempt, timeout)


async def _receive_body(channel: _Channel, sink: _Sink, timeout: float, progress: Progress | None) -> None:
    """Move a GET body into ``sink``. Bytes the parser holds (those that came with the
    header) are taken as ``Data`` events; the rest is read from the socket straight into the
    sink's buffers and accounted to the parser, which keeps deciding where the body ends."""
    protocol = channel.protocol
    while True:
        event = protocol.next_event()
        if isinstance(event, EndOfBody):
            return
        if isinstance(event, Data):
            count = len(event.data)
            await sink.write(event.data)
        else:
            assert event is NEED_DATA, event
            room = await sink.room(protocol.body_unread)
            count = await channel.stream.recv_into(room, timeout)
            if not count:
                protocol.receive_data(b"")  # the next event raises ConnectionClosed
                continue
            protocol.body_received(count)
            await sink.filled(count)
        if progress:
            progress(count)


class _Body:
    """A PUT body of one attempt: :meth:`send` sends it piece by piece, yielding each
    piece's size, and stops before a piece once ``stop()`` (the server answered early);
    :meth:`digest` is its BLAKE3 once every byte has been sent."""

    async def send(self, channel: _Channel, timeout: float, stop: Callable[[], bool]) -> AsyncGenerator[int, None]:
        raise NotImplementedError
        yield 0

    async def digest(self) -> bytes:
        raise NotImplementedError


class _StreamBody(_Body):
    """A stream read chunk by chunk, each hashed as it goes out."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self._chunks = chunks
        self._hasher = blake3.blake3()

    async def send(self, channel: _Channel, timeout: float, stop: Callable[[], bool]) -> AsyncGenerator[int, None]:
        async for chunk in self._chunks:
            if stop():
                return
            self._hasher.update(chunk)
            await channel.send(Data(chunk), timeout)
            yield len(chunk)

    async def digest(self) -> bytes:
        digest = self._hasher.digest()
        assert isinstance(digest, bytes)
        return digest


class _WholeBody(_Body):
    """Bytes all at hand, in memory or in a file (``fd``, sent with ``os.sendfile``: no
    copy through Python). A worker thread hashes them while they are sent, so the digest
    the trailer needs is ready about when the last byte has gone; a ``digest`` known
    already (``put_file`` hashed the file to look for it on the server) is sent as it is."""

    def __init__(
        self, length: int, *, view: memoryview | None = None, fd: int = -1, digest: bytes | None = None
    ) -> None:
        self.length, self._view, self._fd, self._digest = length, view, fd, digest
        self._hashing: asyncio.Future[bytes] | None = None

    def _hash(self) -> bytes:
        hasher = blake3.blake3()
        if self._view is not None:
            hasher.update(self._view)
        else:
            # pread rather than mmap: a file cut short meanwhile is an error, not a SIGBUS.
            buffer = bytearray(min(self.length, HASH_STEP))
            offset = 0
            while offset < self.length:
                view = memoryview(buffer)[: min(len(buffer), self.length - offset)]
                count = os.preadv(self._fd, [view], offset)
                if not count:
                    raise LocalProtocolError(f"the file ended {self.length - offset} bytes short of its size")
                hasher.update(view[:count])
                offset += count
        digest = hasher.digest()
        assert isinstance(digest, bytes)
        return digest

    async def send(self, channel: _Channel, timeout: float, stop: Callable[[], bool]) -> AsyncGenerator[int, None]:
        if self.length >= INLINE_HASH_LIMIT and self._digest is None:
            self._hashing = asyncio.ensure_future(asyncio.to_thread(self._hash))
        for offset in range(0, self.length, SEND_PIECE):
            if stop():
                return
            count = min(SEND_PIECE, self.length - offset)
            if self._view is not None:
                await channel.send(Data(self._view[offset : offset + count]), timeout)
            else:
                channel.protocol.body_sent(count)
                await channel.stream.sendfile(self._fd, offset, count, timeout)
            yield count

    async def digest(self) -> bytes:
        if self._digest is not None:
            return self._digest
        if self._hashing is None:
            return self._hash()
        return await self._hashing

    async def aclose(self) -> None:
        """Wait until the hashing thread is done with the source, before it is closed."""
        if self._hashing is not None:
            await wait_out(self._hashing)
            if not self._hashing.cancelled():
                self._hashing.exception()  # a short file: the upload failed already


class _SourceOpener:
    """Opens an upload source afresh for each attempt, as ``(length, body)``; ``digest``
    is the BLAKE3 of a path or bytes when the caller knows it."""

    def __init__(self, source: Source, digest: bytes | None = None) -> None:
        self.source = source
        self.digest = digest
        self.stream: IO[bytes] | None = None
        if not isinstance(source, bytes | bytearray | memoryview | str | os.PathLike):
            self.stream = source
        # A stream that cannot seek (a pipe) is spooled to a temporary file at the first
        # attempt: the PUT header needs the length first, and retries can then start over.
        self._unseekable = self.stream is not None and not _seekable(self.stream)
        self._start = self.stream.tell() if self.stream is not None and not self._unseekable else 0
        self._spool: IO[bytes] | None = None

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()

    @contextlib.asynccontextmanager
    async def __call__(self) -> AsyncIterator[tuple[int, _Body]]:
        if self._unseekable:
            assert self.stream is not None
            self.stream = self._spool = await _spool(self.stream)
            self._unseekable = False
        source, stream = self.source, self.stream
        if stream is not None:
            length = stream.seek(0, io.SEEK_END) - self._start
            stream.seek(self._start)
            yield length, _StreamBody(_read_chunks(lambda n: asyncio.to_thread(stream.read, n), length))
        elif isinstance(source, str | os.PathLike):
            fd = os.open(source, os.O_RDONLY)
            try:
                body = _WholeBody(os.fstat(fd).st_size, fd=fd, digest=self.digest)
                try:
                    yield body.length, body
                finally:
                    await body.aclose()
            finally:
                os.close(fd)
        else:
            assert isinstance(source, bytes | bytearray | memoryview)
            view = memoryview(source).cast("B")
            yield len(view), _WholeBody(len(view), view=view, digest=self.digest)


async def _spool(stream: IO[bytes]) -> IO[bytes]:
    """A copy of what ``stream`` still holds, in an anonymous temporary file (in $TMPDIR)
    that vanishes when it is closed or the process ends.

    The copy is an ordinary async loop, each read and write off the event loop, so that a
    cancelled upload (Ctrl-C on ``blobsvc put -`` fed by a pipe that never ends) stops after
    the chunk in hand, without closing a file under a thread that is still writing to it."""
    import aiofiles.threadpool  # here: only an upload from a pipe needs it

    spool = tempfile.TemporaryFile()  # noqa: SIM115 (the caller closes it)
    writer = aiofiles.threadpool.wrap(spool)
    try:
        while chunk := await asyncio.to_thread(stream.read, CHUNK):
            await writer.write(chunk)
        await writer.flush()
    except BaseException:
        spool.close()
        raise
    return spool


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, ValueError):
        return False


async def _read_chunks(read: Callable[[int], Awaitable[bytes]], length: int) -> AsyncIterator[bytes]:
    left = length
    while left > 0:
        chunk = await read(min(CHUNK, left))
        if not chunk:
            raise LocalProtocolError(f"the source ended {left} bytes short of its size")
        left -= len(chunk)
        yield chunk


# Every client's pool, for the fork handler (weakly: a client's lifetime is its owner's).
_pools: weakref.WeakSet[AsyncBlobClient] = weakref.WeakSet()


def _drop_pools_after_fork() -> None:
    """In a forked child, every connection a client had open is the parent's too: a request
    on a pooled one would interleave with the parent's, and one the parent was using would
    stay open (the server waiting on it) until the child exits. Closing the child's
    descriptors leaves the parent's connections as they were (no shutdown, no TLS
    close_notify); the child connects afresh."""
    for client in list(_pools):
        client._close_inherited()


os.register_at_fork(after_in_child=_drop_pools_after_fork)


def _blocking(
    method: Callable[Concatenate[AsyncBlobClient, _P], Coroutine[Any, Any, _T]],
) -> Callable[Concatenate[BlobClient, _P], _T]:
    """The blocking twin of an :class:`AsyncBlobClient` method: the same parameters (for
    type checkers too) and the same docs, run on the client's loop thread."""

    def call(self: BlobClient, /, *args: _P.args, **kwargs: _P.kwargs) -> _T:
        return self._run(lambda client: method(client, *args, **kwargs))

    functools.update_wrapper(call, method)
    return call


async def _shut_down(client: AsyncBlobClient) -> None:
    """Cancel the calls other threads still have in flight, so that they return (with
    CancelledError) instead of waiting on a loop that is about to stop, then close."""
    others = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    for task in others:
        task.cancel()
    await asyncio.gather(*others, return_exceptions=True)
    await client.aclose()


def _options_from(settings: Settings) -> dict[str, Any]:
    """A client's options from the settings: secret, TLS files, timeouts and retries."""
    return {
        "secret": settings.secret(),
        "connect_timeout": settings.connect_timeout,
        "timeout": settings.timeout,
        "retries": settings.retries,
        "tls": client_context_for(settings),
    }


class BlobClient:
    """The blocking face of :class:`AsyncBlobClient`: the same methods, without ``await``.

    The coroutines run on an event loop in a private daemon thread, so this works whether
    or not the calling thread runs a loop of its own, and from many threads at once. After
    a fork the child starts a fresh loop thread (Spark forks its Python workers).
    """

    def __init__(self, server: str | tuple[str, int] = f"127.0.0.1:{DEFAULT_PORT}", **options: Any) -> None:
        self._server = server
        self._options = options
        self._lock = threading.Lock()
        self._pid = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        self._client: AsyncBlobClient | None = None
        self._thread: threading.Thread | None = None
        self._state = _State.OPEN

    def _run(self, make: Callable[[AsyncBlobClient], Coroutine[Any, Any, _T]]) -> _T:
        if self._state is _State.CLOSED:
            raise ClientClosed("this client is closed")
        with self._lock:
            if self._pid != os.getpid():
                self._start_loop()
            loop, client = self._loop, self._client
        assert loop is not None and client is not None
        future: concurrent.futures.Future[_T] = asyncio.run_coroutine_threadsafe(make(client), loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()
            raise

    def _start_loop(self) -> None:
        loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=loop.run_forever, name="blobsvc-client", daemon=True)
        self._thread.start()
        self._loop, self._pid = loop, os.getpid()
        self._client = AsyncBlobClient(self._server, **self._options)

    @classmethod
    def from_settings(cls, settings: Settings, *, one_shot: bool = False) -> BlobClient:
        """A client of ``settings.server`` with its secret, TLS files, timeouts and retries."""
        return cls(settings.server, one_shot=one_shot, **_options_from(settings))

    @property
    def server(self) -> str:
        return AsyncBlobClient(self._server).server

    @property
    def connect_timeout(self) -> float:
        """Seconds a connection may take: to the server, and to the store a snapshot writes to."""
        timeout: float = self._options.get("connect_timeout", DEFAULT_CONNECT_TIMEOUT)
        return timeout

    put = _blocking(AsyncBlobClient.put)
    get = _blocking(AsyncBlobClient.get)
    get_file = _blocking(AsyncBlobClient.get_file)
    get_into = _blocking(AsyncBlobClient.get_into)
    resume_file = _blocking(AsyncBlobClient.resume_file)
    stat = _blocking(AsyncBlobClient.stat)
    delete = _blocking(AsyncBlobClient.delete)
    delete_job = _blocking(AsyncBlobClient.delete_job)
    list = _blocking(AsyncBlobClient.list)
    status = _blocking(AsyncBlobClient.status)
    heartbeat = _blocking(AsyncBlobClient.heartbeat)
    hosts = _blocking(AsyncBlobClient.hosts)
    link = _blocking(AsyncBlobClient.link)
    put_file = _blocking(AsyncBlobClient.put_file)
    checkpoints = _blocking(AsyncBlobClient.checkpoints)

    def close(self) -> None:
        if self._state is _State.CLOSED:
            return
        if self._client is not None and self._pid == os.getpid():
            assert self._loop is not None and self._thread is not None
            asyncio.run_coroutine_threadsafe(_shut_down(self._client), self._loop).result()
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()  # its selector and wake-up sockets are descriptors too
        self._state = _State.CLOSED

    def __enter__(self) -> BlobClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
