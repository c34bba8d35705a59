"""Measuring blobsvc against baselines taken in the same run: the parts that
``blobsvc bench`` and the scripts in ``benchmarks/`` share.

* :class:`ServerProcess`: ``blobsvc serve`` as a child process on 127.0.0.1, stopped by PID.
* Baselines: :func:`baseline_transfer` (a child process ``os.sendfile``-s a file into a
  loopback socket; this one receives it into memory, or writes and fsyncs it) and
  :func:`baseline_publish` (the system calls of publishing small blobs one by one, from
  threads, without network or protocol).
* :class:`RawClient`, :func:`server_put`, :func:`server_get`: a lean blocking client that
  moves bodies exactly as the baselines do, so that a ratio to a baseline is the server's cost.
* :func:`small_puts`, :func:`small_gets`: small requests over N connections from one uvloop
  process of raw asyncio protocols (pre-encoded requests, replies read into preallocated
  buffers), with per-request latencies.
* :class:`Throughput`, :class:`SmallResult`: results that print as JSON objects.

Everything talks to 127.0.0.1 unless told otherwise, and every loop is bounded in count and
in time.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import json
import os
import platform
import selectors
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, cast

import blake3

from ..cache import BlobCache
from ..config import Settings
from ..wire._protocol import (
    AuthOk,
    AuthRequest,
    ClientConnection,
    ClientEvent,
    ContentKey,
    DeleteOk,
    DeleteRequest,
    ErrorFrame,
    GetOk,
    GetRequest,
    Hello,
    PutOk,
    PutRequest,
    PutTrailer,
    ServerHello,
    Signal,
    encode_request,
)
from ..wire._tls import client_context_for

MB = 1_000_000
MiB = 1 << 20
KiB = 1 << 10

IO_TIMEOUT = 60.0  # any one blocking socket call, and any one small request
START_TIMEOUT = 60.0  # for the server to print "listening on"
STOP_TIMEOUT = 15.0  # for the server to exit after SIGTERM before it gets SIGKILL
CHUNK = MiB  # the baselines' receive and copy buffer; the server's RECV_SIZE
CONNECTIONS = 8  # small requests in flight, one on each connection, unless told otherwise
GET_KEYS = 1024  # distinct small blobs the GET measurements cycle through

# A server whose INLINE_READ_LIMIT is overridden: bodies up to the limit are read and sent
# with their header, larger ones go out with sendfile. -1 means "always sendfile".
VARIANT_SERVER = (
    "import sys, blobsvc.server as s; s.INLINE_READ_LIMIT = int(sys.argv.pop(1)); "
    "from blobsvc.cli import main; main(prog_name='blobsvc')"
)
ALWAYS_SENDFILE = -1
ALWAYS_COPY = 1 << 50


class BenchError(RuntimeError):
    pass


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def size_label(size: int) -> str:
    if size % MiB == 0:
        return f"{size // MiB}MiB"
    return f"{size // KiB}KiB" if size % KiB == 0 else f"{size}B"


# --- the machine and the data directory ----------------------------------------------------


def filesystem_of(path: Path) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding ``path``."""
    best = ("/", "?")
    real = str(path.resolve())
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            before, _, after = line.partition(" - ")
            mount_point = before.split()[4].replace("\\040", " ")
            inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
            if inside and len(mount_point) >= len(best[0]):
                best = (mount_point, after.split()[0])
    return best


def choose_tmp_parent(requested: str | None, fallback: Path | None = None) -> Path:
    """Where the data directory goes: ``requested``, else $TMPDIR or /tmp unless that is a
    tmpfs (whose fsync costs nothing and would flatter every PUT), else ``fallback``
    (``blobsvc-bench`` in the current directory by default)."""
    fallback = fallback or Path.cwd() / "blobsvc-bench"
    if requested:
        return Path(requested)
    default = Path(tempfile.gettempdir())
    if filesystem_of(default)[1] not in {"tmpfs", "ramfs"}:
        return default
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def source_trees(parser: argparse.ArgumentParser, trees: Sequence[str]) -> list[str]:
    """The source trees an A/B benchmark compares, as absolute paths; a usage error for one
    that holds no ``blobsvc/`` package."""
    found = [str(Path(tree).resolve()) for tree in trees]
    for tree in found:
        if not Path(tree, "blobsvc", "__init__.py").is_file():
            parser.error(f"{tree} holds no blobsvc/ package")
    return found


def machine() -> dict[str, Any]:
    model = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = 0
    with contextlib.suppress(OSError), open("/proc/meminfo") as meminfo:
        memory = int(meminfo.readline().split()[1]) * KiB
    try:
        uvloop_version: str | None = metadata.version("uvloop")
    except metadata.PackageNotFoundError:
        uvloop_version = None
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "memory_GiB": round(memory / (1 << 30), 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uvloop": uvloop_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


# --- the server under test ------------------------------------------------------------------


class Server(Protocol):
    """What a measurement needs of the server it loads. ``access`` holds the client settings
    that let a client in (``secret_file``, ``tls_ca``, ``tls_client_cert``, ``tls_client_key``);
    they are paths, so that child processes can be handed them."""

    host: str
    port: int
    access: Settings

    def cpu_seconds(self) -> float | None:
        """The server's CPU time so far, or None when it cannot be seen (another host)."""


@dataclass
class RemoteServer:
    """A server this process did not start: its CPU time is not known."""

    host: str
    port: int
    access: Settings = field(default_factory=Settings)

    def cpu_seconds(self) -> float | None:
        return None


class ServerProcess:
    """``blobsvc serve`` as a child process on 127.0.0.1, stopped by PID."""

    host = "127.0.0.1"
    access = Settings()  # plain TCP, no secret

    def __init__(
        self, data_dir: Path, log_path: Path, inline_read_limit: int | None = None, extra_args: Sequence[str] = ()
    ) -> None:
        serve = [
            "serve", "--host", "127.0.0.1", "--port", "0", "--data-dir", str(data_dir),
            "--log-level", "warning", "--no-verify-on-start", *extra_args,
        ]  # fmt: skip
        if inline_read_limit is None:
            self.command = [sys.executable, "-m", "blobsvc", *serve]
        else:
            self.command = [sys.executable, "-c", VARIANT_SERVER, str(inline_read_limit), *serve]
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in stop()
        # A fresh default server: settings the caller exported for its own servers
        # (BLOBSVC_SECRET_FILE, BLOBSVC_TLS_CERT, ...) would give it a secret or TLS that
        # ``access`` above does not know of.
        env = {name: value for name, value in os.environ.items() if not name.startswith("BLOBSVC_")}
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=self._log, env=env)
        self.pid = self.process.pid
        try:
            self.port = self._wait_listening()
        except BaseException:
            self.stop()
            raise

    def _wait_listening(self) -> int:
        assert self.process.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT
        with selectors.DefaultSelector() as selector:
            selector.register(self.process.stdout, selectors.EVENT_READ)
            for _ in range(100):
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    break
                line = self.process.stdout.readline().decode(errors="replace").strip()
                if not line:
                    break  # the server exited
                if line.startswith("listening on "):
                    return int(line.rsplit(":", 1)[1])
        raise BenchError(f"the server did not start; see {self.log_path}:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-2000:]
        return ""

    def cpu_seconds(self) -> float:
        """CPU time of the server process so far: :func:`process_cpu_seconds`."""
        return process_cpu_seconds(self.pid)

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise BenchError(f"the server exited with {self.process.returncode}:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(STOP_TIMEOUT)
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._log.close()


def process_cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` so far, summed over its live threads (the scheduler's
    nanoseconds: /proc/PID/stat counts in ticks, too coarse for a 0.1 s GET)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/schedstat") as schedstat:
            total += int(schedstat.read().split()[0])
    return total / 1e9


@contextlib.contextmanager
def running_server(
    data_dir: Path, log_path: Path, inline_read_limit: int | None = None, extra_args: Sequence[str] = ()
) -> Iterator[ServerProcess]:
    server = ServerProcess(data_dir, log_path, inline_read_limit, extra_args)
    try:
        yield server
        server.check_alive()
    finally:
        server.stop()


# --- blocking sockets: the baselines and the lean large-transfer client ---------------------


Timing = tuple[float, float, float | None]
"""Wall-clock seconds of a timed step, the CPU seconds this process spent in it, and those
the peer process spent when it reports them (None: the peer is the server, measured apart)."""


class Stopwatch:
    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def stop(self, peer_cpu: float | None = None) -> Timing:
        return time.perf_counter() - self.wall, time.process_time() - self.cpu, peer_cpu


def _bound(sock: socket.socket) -> None:
    """Blocking mode with kernel timeouts, so that no call can hang and none pays for select."""
    sock.settimeout(None)
    timeval = struct.pack("ll", int(IO_TIMEOUT), 0)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
    _bound(sock)
    return sock


def recv_into_all(sock: socket.socket, view: memoryview) -> None:
    got, total = 0, len(view)
    while got < total:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise BenchError(f"the peer closed after {got} of {total} bytes")
        got += n


def sendfile_all(sock: socket.socket, fd: int, count: int) -> None:
    out, offset = sock.fileno(), 0
    while offset < count:
        sent = os.sendfile(out, fd, offset, count - offset)
        if sent == 0:
            raise BenchError("the source file is shorter than expected")
        offset += sent


def copy_send_all(sock: socket.socket, fd: int, count: int) -> None:
    """What a copy path does: ``pread`` a chunk into a buffer, ``sendall`` it, repeat."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    offset = 0
    while offset < count:
        n = os.preadv(fd, [view[: min(CHUNK, count - offset)]], offset)
        if n == 0:
            raise BenchError("the source file is shorter than expected")
        sock.sendall(view[:n])
        offset += n


def receive_write_fsync(sock: socket.socket, path: Path, count: int, *, fsync: bool = True) -> None:
    """Receive ``count`` bytes into a new file at ``path``, then fsync it (unless not ``fsync``:
    what a download that leaves its bytes to the page cache costs)."""
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        got = 0
        while got < count:
            n = sock.recv_into(view, min(CHUNK, count - got))
            if n == 0:
                raise BenchError(f"the peer closed after {got} of {count} bytes")
            rest = view[:n]
            while rest:
                rest = rest[os.write(fd, rest) :]
            got += n
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


# The sender of a baseline runs in its own process, as the server does: two threads of one
# process moving the same bytes measured 10-30% slower than two processes on this machine.
BASELINE_SENDER = "from blobsvc.bench._measure import baseline_sender; baseline_sender()"
SENDERS: dict[str, Callable[[socket.socket, int, int], None]] = {
    "sendfile": sendfile_all,
    "read_send": copy_send_all,
}


def baseline_sender() -> None:
    """The child side of :func:`baseline_transfer`: argv is port, file, size, how to send."""
    port, path, size, how = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    fd = os.open(path, os.O_RDONLY)
    with connect(port) as sock:
        if sys.stdin.readline().strip() != "go":
            raise SystemExit("the receiver never said go")
        cpu = time.process_time()
        SENDERS[how](sock, fd, size)
        print(time.process_time() - cpu, flush=True)  # the CPU seconds the sending took
    os.close(fd)


def baseline_transfer(how: str, source: Path, size: int, receive: Callable[[socket.socket], None]) -> Timing:
    """Seconds for a child process to send ``size`` bytes of ``source`` (``how``: sendfile
    or read_send) over loopback to ``receive`` in this process."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(IO_TIMEOUT)
        command = [sys.executable, "-c", BASELINE_SENDER, str(listener.getsockname()[1]), str(source), str(size), how]
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            sock, _ = listener.accept()
            with sock:
                _bound(sock)
                assert child.stdin is not None
                watch = Stopwatch()
                child.stdin.write(b"go\n")
                child.stdin.flush()
                receive(sock)
                seconds, cpu, _ = watch.stop()
            out, _ = child.communicate(timeout=IO_TIMEOUT)
            if child.returncode != 0:
                raise BenchError(f"the baseline sender exited with {child.returncode}")
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(IO_TIMEOUT)
    return seconds, cpu, float(out)


class RawClient:
    """One blocking connection to the server. Frames are encoded and parsed by
    :class:`blobsvc.wire._protocol.ClientConnection`; large bodies bypass it and move exactly as
    the baselines move them."""

    def __init__(self, port: int) -> None:
        self.sock = connect(port)
        self.protocol = ClientConnection()
        self.sock.sendall(self.protocol.send(Hello()))
        hello = self.reply(header=6)
        if not isinstance(hello, ServerHello) or hello.nonce is not None:
            raise BenchError(f"unexpected preamble {hello!r}")

    def reply(self, header: int = 0) -> ClientEvent:
        """The next reply. With ``header``, reads no more than that many bytes unless the reply
        is longer (an error), so that the body after a GET header stays in the socket."""
        got = 0
        for _ in range(1 << 16):
            event = self.protocol.next_event()
            if isinstance(event, ErrorFrame):
                raise BenchError(f"the server answered error {event.code}: {event.message}")
            if not isinstance(event, Signal):
                return event
            data = self.sock.recv(header - got if header > got else 1 << 16)
            if not data:
                raise BenchError("the server closed the connection")
            got += len(data)
            self.protocol.receive_data(data)
        raise BenchError("the reply never ended")

    def delete(self, key: bytes) -> None:
        self.sock.sendall(self.protocol.send(DeleteRequest(ContentKey(key))))
        if not isinstance(self.reply(), DeleteOk):
            raise BenchError("DELETE was not answered DeleteOk")

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def server_put(port: int, fd: int, size: int, digest: bytes) -> Timing:
    """Seconds for one PUT of the file ``fd``, from its header to the server's answer (which
    comes after the server's fsyncs)."""
    with RawClient(port) as client:
        watch = Stopwatch()
        client.sock.sendall(client.protocol.send(PutRequest(size)))
        sendfile_all(client.sock, fd, size)
        client.sock.sendall(encode_request(PutTrailer(digest)))
        reply = client.reply()
        timing = watch.stop()
    if not isinstance(reply, PutOk) or reply.key != digest:
        raise BenchError(f"unexpected PUT answer {reply!r}")
    return timing


def server_get(port: int, key: bytes, view: memoryview) -> Timing:
    """Seconds for one GET of ``key`` into ``view``, from the request to the last byte."""
    with RawClient(port) as client:
        watch = Stopwatch()
        client.sock.sendall(client.protocol.send(GetRequest(ContentKey(key))))
        header = client.reply(header=41)
        if not isinstance(header, GetOk) or header.digest != key or header.size != len(view):
            raise BenchError(f"unexpected GET answer {header!r}")
        recv_into_all(client.sock, view)
        return watch.stop()


# --- measurements -----------------------------------------------------------------------------


@dataclass
class Throughput:
    """One large-transfer measurement over its runs. CPU is in cores (CPU seconds per second)
    for the sending and the receiving process: this one sends PUTs and receives the rest."""

    name: str
    size: int
    local_sends: bool = False
    seconds: list[float] = field(default_factory=list)
    local_cpu: list[float] = field(default_factory=list)
    peer_cpu: list[float] = field(default_factory=list)

    @property
    def best(self) -> float:
        return self.size / min(self.seconds) / MB

    def record(self, **extra: Any) -> dict[str, Any]:
        rates = [round(self.size / s / MB, 1) for s in self.seconds]
        record: dict[str, Any] = {
            "bench": self.name,
            "bytes": self.size,
            "MB_s": round(self.best, 1),
            "median_MB_s": statistics.median(rates),
            "runs_MB_s": rates,
            "seconds": round(min(self.seconds), 4),
        }
        best = self.seconds.index(min(self.seconds))  # the CPU figures of the best run
        local, peer = round(self.local_cpu[best], 2), round(self.peer_cpu[best], 2)
        record["sender_cpu"], record["receiver_cpu"] = (local, peer) if self.local_sends else (peer, local)
        record.update(extra)
        return record


def measure(result: Throughput, run: Callable[[], Timing], server: ServerProcess | None = None) -> None:
    """Run one timed transfer; record its seconds and the CPU (in cores) each side used."""
    os.sync()  # start with no dirty pages from the previous step
    server_cpu = server.cpu_seconds() if server else 0.0
    seconds, cpu, peer_cpu = run()
    if peer_cpu is None:  # the server is idle outside the timed part of run()
        peer_cpu = server.cpu_seconds() - server_cpu if server else 0.0
    result.seconds.append(seconds)
    result.local_cpu.append(cpu / seconds)
    result.peer_cpu.append(peer_cpu / seconds)


def ratio_record(result: Throughput, baseline: Throughput, target: float, **extra: Any) -> dict[str, Any]:
    """``ratio`` (best over best) decides the target; ``median_ratio`` shows how steady it is."""
    ratio = result.best / baseline.best
    median_ratio = statistics.median(baseline.seconds) / statistics.median(result.seconds)  # the same size
    return result.record(
        baseline=baseline.name,
        ratio=round(ratio, 3),
        median_ratio=round(median_ratio, 3),
        target_ratio=target,
        target_met=ratio >= target,
        **extra,
    )


# --- small operations: a lean asyncio load generator -----------------------------------------


_ERROR_HEADER = struct.Struct("<BHI")


class LoadConnection(asyncio.BufferedProtocol):
    """A raw connection that sends one pre-encoded request at a time and waits for a reply of
    known length, which the event loop reads straight into a preallocated buffer (no copies,
    no allocation per read); an error frame fails the measurement."""

    def __init__(self, loop: asyncio.AbstractEventLoop, capacity: int) -> None:
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray(capacity + 64 * KiB)  # room to notice a reply that is too long
        self.view = memoryview(self.buffer)
        self.filled = 0
        self.need = 0
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.view[self.filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self.filled += nbytes
        waiter = self.waiter
        if waiter is None or waiter.done():
            return
        buffer, filled = self.buffer, self.filled
        if buffer[0] == 1 and self.need != 6:  # an error frame (the preamble starts with "B")
            if filled >= _ERROR_HEADER.size:
                _, code, length = _ERROR_HEADER.unpack_from(buffer)
                if filled >= _ERROR_HEADER.size + length:
                    message = bytes(buffer[_ERROR_HEADER.size : _ERROR_HEADER.size + length])
                    waiter.set_exception(BenchError(f"server error {code}: {message.decode(errors='replace')}"))
        elif filled >= self.need:
            waiter.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(BenchError(f"the server closed the connection: {exc}"))

    async def handshake(self, peer: str, secret: bytes | None) -> None:
        """The preamble, then AUTH when the server asks for it, parsed by ClientConnection."""
        assert self.transport is not None
        protocol = ClientConnection(peer)
        self.transport.write(protocol.send(Hello()))
        hello = await self._next_event(protocol)
        if not isinstance(hello, ServerHello):
            raise BenchError(f"{peer} refused the connection: {hello!r}")
        if hello.nonce is None:
            return
        if secret is None:
            raise BenchError(f"server {peer} requires a shared secret: give --secret-file")
        self.transport.write(protocol.send(AuthRequest.answering(secret, hello.nonce)))
        if not isinstance(await self._next_event(protocol), AuthOk):
            raise BenchError(f"server {peer} refused AUTH")

    async def _next_event(self, protocol: ClientConnection) -> ClientEvent:
        while True:
            if self.filled:  # (b"" would mean the end of the stream)
                protocol.receive_data(bytes(self.view[: self.filled]))
                self.filled = 0
            event = protocol.next_event()
            if not isinstance(event, Signal):
                return event
            self.need, self.waiter = 1, self.loop.create_future()
            await self.waiter  # an error frame arrives as BenchError, whole

    async def exchange(self, request: bytes, reply_size: int) -> memoryview:
        """Send ``request``; the reply, valid until the next exchange."""
        assert self.transport is not None
        if self.filled:
            raise BenchError(f"{self.filled} bytes arrived that nobody asked for")
        self.need = reply_size
        self.waiter = self.loop.create_future()
        self.transport.write(request)
        await self.waiter
        if self.filled != reply_size:
            raise BenchError(f"expected a {reply_size}-byte reply, got {self.filled} bytes")
        self.filled = 0
        return self.view[:reply_size]


# An operation: given its number, the request's bytes, the reply's size and a check on it.
Check = Callable[[memoryview], bool]
Operation = Callable[[int], tuple[bytes, int, Check]]


@dataclass
class SmallResult:
    size: int
    ops: int
    seconds: float
    latencies_ns: list[int]
    client_cpu: float
    server_cpu: float | None
    connections: int = CONNECTIONS

    def record(self, name: str, **extra: Any) -> dict[str, Any]:
        latencies = sorted(self.latencies_ns)

        def percentile(p: float) -> float:
            return round(latencies[min(len(latencies) - 1, int(p * len(latencies)))] / 1e6, 3)

        return {
            "bench": name,
            "size": self.size,
            "connections": self.connections,
            "ops": self.ops,
            "seconds": round(self.seconds, 3),
            "ops_s": round(self.ops / self.seconds, 1),
            "MB_s": round(self.ops * self.size / self.seconds / MB, 1),
            "p50_ms": percentile(0.50),
            "p99_ms": percentile(0.99),
            "client_cpu": round(self.client_cpu, 2),
            **({} if self.server_cpu is None else {"server_cpu": round(self.server_cpu, 2)}),
            **extra,
        }


async def _small_load(
    server: Server,
    size: int,
    operation: Operation,
    max_ops: int,
    max_seconds: float,
    warmup_ops: int,
    connections_wanted: int,
) -> SmallResult:
    loop = asyncio.get_running_loop()
    connections: list[LoadConnection] = []
    tls, secret = client_context_for(server.access), server.access.secret()
    try:
        async with asyncio.timeout(IO_TIMEOUT):
            for _ in range(connections_wanted):
                _, conn = await loop.create_connection(
                    lambda: LoadConnection(loop, size + 64),
                    server.host,
                    server.port,
                    ssl=tls,
                    server_hostname=server.host if tls else None,
                )
                connections.append(conn)
                await conn.handshake(f"{server.host}:{server.port}", secret)
        issued = 0
        latencies: list[int] = []

        async def worker(conn: LoadConnection, limit: int, deadline: float, timed: bool) -> None:
            nonlocal issued
            while issued < limit and time.perf_counter() < deadline:
                request, reply_size, check = operation(issued)
                issued += 1
                start = time.perf_counter_ns()
                reply = await conn.exchange(request, reply_size)
                if timed:
                    latencies.append(time.perf_counter_ns() - start)
                if not check(reply):
                    raise BenchError(f"wrong reply {bytes(reply[:48])!r}")

        async def phase(limit: int, seconds: float, timed: bool) -> None:
            deadline = time.perf_counter() + seconds
            async with asyncio.timeout(seconds + IO_TIMEOUT):
                await asyncio.gather(*(worker(conn, limit, deadline, timed) for conn in connections))

        await phase(warmup_ops, max(1.0, max_seconds / 10), timed=False)
        first = issued
        cpu, server_cpu, start = time.process_time(), server.cpu_seconds(), time.perf_counter()
        await phase(first + max_ops, max_seconds, timed=True)
        seconds = time.perf_counter() - start
        server_cpu_after = server.cpu_seconds()
        return SmallResult(
            size=size,
            ops=issued - first,
            seconds=seconds,
            latencies_ns=latencies,
            client_cpu=(time.process_time() - cpu) / seconds,
            server_cpu=None
            if server_cpu is None or server_cpu_after is None
            else (server_cpu_after - server_cpu) / seconds,
            connections=connections_wanted,
        )
    finally:
        for conn in connections:
            if conn.transport is not None:
                conn.transport.close()


def run_async(coroutine: Any) -> Any:
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coroutine)


def small_puts(
    server: Server,
    size: int,
    max_ops: int,
    max_seconds: float,
    warmup: int,
    connections: int = CONNECTIONS,
    *,
    keep_keys: bool = False,
) -> tuple[SmallResult, list[bytes]]:
    """Unique blobs (so each PUT stores a new object); returns the first ``GET_KEYS`` keys
    for the GETs, or every key with ``keep_keys``."""
    base = bytearray(os.urandom(size))
    header = encode_request(PutRequest(size))
    keys: list[bytes] = []

    def operation(number: int) -> tuple[bytes, int, Check]:
        struct.pack_into("<Q", base, 0, number)
        body = bytes(base)
        digest = blake3.blake3(body).digest()
        if keep_keys or len(keys) < GET_KEYS:
            keys.append(digest)
        return header + body + encode_request(PutTrailer(digest)), 33, lambda reply: reply[1:] == digest

    result = run_async(_small_load(server, size, operation, max_ops, max_seconds, warmup, connections))
    assert isinstance(result, SmallResult)
    return result, keys


def small_gets(
    server: Server,
    keys: list[bytes],
    size: int,
    max_ops: int,
    max_seconds: float,
    warmup: int,
    connections: int = CONNECTIONS,
) -> SmallResult:
    """GETs cycling through ``keys`` (blobs of ``size`` bytes); each reply's header is checked."""
    requests = [encode_request(GetRequest(ContentKey(key))) for key in keys]
    reply_size = 1 + 8 + 32 + size
    header = b"\x00" + struct.pack("<Q", size)
    expected = [header + key for key in keys]  # a GetOk: status, size, digest

    def check(reply: memoryview, i: int) -> bool:
        return reply[:41] == expected[i]

    checks: list[Check] = [functools.partial(check, i=i) for i in range(len(keys))]

    def operation(number: int) -> tuple[bytes, int, Check]:
        i = number % len(requests)
        return requests[i], reply_size, checks[i]

    result = run_async(_small_load(server, size, operation, max_ops, max_seconds, warmup, connections))
    assert isinstance(result, SmallResult)
    return result


def baseline_publish(
    parent: Path, size: int, max_ops: int, max_seconds: float, connections: int = CONNECTIONS
) -> SmallResult:
    """What the disk allows PUTs of new small blobs published one by one, ``connections`` at
    a time like the load: the syscalls that publication makes (write a staging file and fsync
    it, rename it into a directory and fsync that, hard-link it into another and fsync that)
    from that many threads, without the network, the protocol or hashing."""
    dirs = [parent / name for name in ("incoming", "objects", "cache")]
    for directory in dirs:
        directory.mkdir(parents=True)
    dir_fds = [os.open(directory, os.O_RDONLY | os.O_DIRECTORY) for directory in dirs[1:]]
    base = os.urandom(size)
    latencies: list[int] = []
    numbers = iter(range(max_ops))
    lock = threading.Lock()

    def publish_until(deadline: float) -> None:
        body = bytearray(base)
        while time.perf_counter() < deadline:
            with lock:
                number = next(numbers, None)
            if number is None:
                return
            began = time.perf_counter_ns()
            struct.pack_into("<Q", body, 0, number)
            staged, stored, linked = (directory / f"{number:016x}" for directory in dirs)
            fd = os.open(staged, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(staged, stored)
            os.fsync(dir_fds[0])
            os.link(stored, linked)
            os.fsync(dir_fds[1])
            latencies.append(time.perf_counter_ns() - began)

    cpu, start = time.process_time(), time.perf_counter()
    try:
        with concurrent.futures.ThreadPoolExecutor(connections, thread_name_prefix="publish") as pool:
            for future in [pool.submit(publish_until, start + max_seconds) for _ in range(connections)]:
                future.result(max_seconds + IO_TIMEOUT)
    finally:
        for fd in dir_fds:
            os.close(fd)
    seconds = time.perf_counter() - start
    return SmallResult(
        size, len(latencies), seconds, latencies, (time.process_time() - cpu) / seconds, None, connections
    )


def make_source(path: Path, size: int) -> bytes:
    """A file of random bytes, fsynced and left in the page cache; returns its BLAKE3 key."""
    hasher = blake3.blake3()
    with open(path, "wb") as out:
        left = size
        while left:
            chunk = os.urandom(min(CHUNK, left))
            hasher.update(chunk)
            out.write(chunk)
            left -= len(chunk)
        out.flush()
        os.fsync(out.fileno())
    digest = hasher.digest()
    assert isinstance(digest, bytes)
    return digest


# --- fan-out through a host cache ----------------------------------------------------------


def _fetch_through_cache(address: str, access: Settings, cache_dir: Path, key: str, barrier: Any, results: Any) -> None:
    tls = client_context_for(access)
    with BlobCache(address, cache_dir, max_bytes=1 << 40, timeout=120, secret=access.secret(), tls=tls) as cache:
        barrier.wait(120)
        started = time.monotonic()
        path = cache.path(key)
        results.put((started, time.monotonic(), str(path)))


def fan_out_seconds(
    context: Any, address: str, key: str, processes: int, cache_dir: Path, access: Settings | None = None
) -> float:
    """Seconds for ``processes`` children of ``context`` (a multiprocessing context) to get
    blob ``key`` through one BlobCache in ``cache_dir``: from a barrier (every child has
    opened its cache) to the last child holding its verified path. ``access``: see
    :class:`Server`."""
    barrier, results = context.Barrier(processes), context.Queue()
    args = (address, access or Settings(), cache_dir, key, barrier, results)
    children = [context.Process(target=_fetch_through_cache, args=args, daemon=True) for _ in range(processes)]
    for child in children:
        child.start()
    try:
        answers: list[tuple[float, float, str]] = [results.get(timeout=300) for _ in children]
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
    if len({path for _, _, path in answers}) != 1:
        raise RuntimeError(f"the processes got different paths: {answers}")
    return max(end for _, end, _ in answers) - min(start for start, _, _ in answers)
