"""The thin I/O layer under both server and client: one non-blocking TCP socket.

Every call takes its own timeout and raises blobsvc's transport errors, never a bare
``OSError``, so callers see one vocabulary (httpcore's ``map_exceptions`` idea). The server
sends GET bodies with :meth:`SocketStream.sendfile`, which hands file pages to the kernel
(``os.sendfile``) and waits for writability itself, so it works on uvloop, whose loop has
no ``sendfile`` of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TypeVar

from .._exceptions import ConnectionClosed, ReadTimeout, Timeout, WriteTimeout

_T = TypeVar("_T")

__all__ = [
    "MIN_BODY_RATE",
    "SocketStream",
    "bind_listener",
    "body_deadline",
    "connection_closed",
    "header_deadline",
]

# How long a closing side keeps draining what the peer still sends, so that the peer reads
# our error frame instead of a reset (see "Closing after an error" in docs/protocol.md).
LINGER_SECONDS = 1.0
# A body of N bytes gets io_timeout + N / MIN_BODY_RATE seconds (Apache's mod_reqtimeout
# has the same shape, with MinRate=500). 4 KiB/s is a 32 kbit/s line: any client of a
# cluster's blob server moves bytes thousands of times faster, and a trickler holding a slot
# for an 8 GiB body would need weeks of steady sending to do it.
MIN_BODY_RATE = 4 << 10


@contextlib.asynccontextmanager
async def header_deadline(when: float | None, io_timeout: float) -> AsyncIterator[None]:
    """Bound the reads of a request header (or preamble) by ``when`` (loop time; None: no
    bound), so that a peer sending a byte just before each wait runs out cannot hold on."""
    try:
        async with asyncio.timeout_at(when):
            yield
    except TimeoutError:
        raise ReadTimeout(f"a request header took longer than {io_timeout:g}s") from None


@contextlib.asynccontextmanager
async def body_deadline(size: int, io_timeout: float, error: type[Timeout]) -> AsyncIterator[None]:
    """Bound the transfer of a ``size``-byte body to ``io_timeout + size / MIN_BODY_RATE``
    seconds; ``error`` (ReadTimeout or WriteTimeout) says which way it went."""
    try:
        async with asyncio.timeout(io_timeout + size / MIN_BODY_RATE):
            yield
    except TimeoutError:
        raise error(f"a {size}-byte body moved slower than {MIN_BODY_RATE} bytes/s") from None


@contextlib.contextmanager
def _map_errors(timeout_error: type[Exception]) -> Iterator[None]:
    try:
        yield
    except TimeoutError:
        raise timeout_error("timed out") from None
    except OSError as exc:
        raise connection_closed(exc) from None


def connection_closed(exc: OSError) -> ConnectionClosed:
    """What a failed socket call (other than a timeout) means to blobsvc."""
    if isinstance(exc, ConnectionError | BrokenPipeError):
        return ConnectionClosed(f"connection lost: {exc.strerror or exc}")
    return ConnectionClosed(f"connection failed: {exc.strerror or exc}")


class SocketStream:
    """A connected, non-blocking socket driven by the running event loop."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._loop = asyncio.get_running_loop()

    @property
    def peer(self) -> str:
        try:
            host, port, *_ = self.sock.getpeername()
        except OSError:
            return "?"
        return f"{host}:{port}"

    async def handshake(self, timeout: float | None) -> None:
        """Set up what the stream needs before data moves: nothing for plain TCP."""

    def is_alive(self) -> bool:
        """Whether an idle connection is still open: nothing to read and no EOF pending."""
        try:
            self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            return True
        except OSError:
            return False
        return False  # EOF, or bytes nobody asked for: either way not reusable

    async def recv(self, max_bytes: int, timeout: float | None) -> bytes:
        """Up to ``max_bytes``; ``b""`` when the peer has closed."""
        return await self._receive(functools.partial(self.sock.recv, max_bytes), timeout)

    async def recv_into(self, view: memoryview, timeout: float | None) -> int:
        """Receive into ``view``; the count, 0 when the peer has closed."""
        return await self._receive(functools.partial(self.sock.recv_into, view), timeout)

    async def _receive(self, receive: Callable[[], _T], timeout: float | None) -> _T:
        """``receive()`` once the socket has bytes. Like every call here, it tries the socket
        before it waits: a busy peer's bytes are often there already, and then the call costs
        one system call, not a reader registration and a timer."""
        with _map_errors(ReadTimeout):
            while True:
                try:
                    return receive()
                except BlockingIOError:
                    await self._readable(timeout)

    async def send_all(self, data: bytes | bytearray | memoryview, timeout: float | None) -> None:
        """Send everything; ``timeout`` bounds each wait for the peer to take more, so a
        large send to a slow but live peer is not cut off."""
        view = memoryview(data).cast("B")
        with _map_errors(WriteTimeout):
            while view:
                try:
                    view = view[self.sock.send(view) :]
                except BlockingIOError:
                    await self._writable(timeout)

    async def sendfile(self, fd: int, offset: int, count: int, timeout: float) -> None:
        """Send ``count`` bytes of file ``fd`` from ``offset`` without copying them through
        Python; ``timeout`` bounds each wait for the peer to take more."""
        out = self.sock.fileno()
        with _map_errors(WriteTimeout):
            while count > 0:
                try:
                    sent = os.sendfile(out, fd, offset, min(count, 1 << 30))
                except BlockingIOError:
                    await self._writable(timeout)
                    continue
                if sent == 0:
                    raise ConnectionClosed("the file ended before the announced size")
                offset += sent
                count -= sent

    async def _readable(self, timeout: float | None) -> None:
        await self._ready(self._loop.add_reader, self._loop.remove_reader, timeout)

    async def _writable(self, timeout: float | None) -> None:
        await self._ready(self._loop.add_writer, self._loop.remove_writer, timeout)

    async def _ready(
        self, watch: Callable[..., object], unwatch: Callable[[int], object], timeout: float | None
    ) -> None:
        """Wait until the socket is ready, or raise TimeoutError after ``timeout``. A timer
        on the loop rather than ``asyncio.timeout()``, which costs several ``getpid()``
        calls on Python 3.11 (``get_running_loop``) on every small request."""
        ready = self._loop.create_future()
        fd = self.sock.fileno()
        watch(fd, _resolve, ready)
        timer = None if timeout is None else self._loop.call_later(timeout, _expire, ready)
        try:
            await ready
        finally:
            unwatch(fd)
            if timer is not None:
                timer.cancel()

    async def linger_close(self) -> None:
        """Close after an error: stop sending, drain what the peer still sends for a moment
        so that it reads our last frame rather than a reset, then close."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)
        with contextlib.suppress(OSError, TimeoutError):
            async with asyncio.timeout(LINGER_SECONDS):
                while await self._loop.sock_recv(self.sock, 1 << 16):
                    pass
        self.close()

    def close(self) -> None:
        self.sock.close()


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _expire(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_exception(TimeoutError())


def bind_listener(host: str, ports: range) -> socket.socket:
    """A non-blocking listening socket on the first free port of ``ports``."""
    last_error: OSError | None = None
    for port in ports:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, type_, proto, _, address = infos[0]
        sock = socket.socket(family, type_, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            last_error = exc
            continue
        sock.setblocking(False)
        return sock
    if len(ports) == 1 and last_error is not None:
        if last_error.errno == errno.EADDRINUSE:
            raise OSError(f"port {ports.start} on {host} is in use")
        raise OSError(f"cannot listen on {host}:{ports.start}: {last_error.strerror or last_error}")
    raise OSError(f"no free port in {ports.start}-{ports.stop - 1} on {host}: {last_error}")
