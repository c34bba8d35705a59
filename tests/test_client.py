"""Client and server together over real sockets on 127.0.0.1.

The round-trip tests run twice, through AsyncBlobClient and through the blocking BlobClient,
so the two faces cannot drift apart.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import multiprocessing
import os
import random
import select
import signal
import socket
import threading
import tracemalloc
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import (
    AsyncBlobClient,
    BlobClient,
    BlobServer,
    ConnectError,
    ConnectionClosed,
    DigestMismatch,
    NotFound,
    ReadTimeout,
    TooLarge,
    new_job_id,
)
from blobsvc.client import BODY_BUFFER, BODY_BUFFERS

from .conftest import CuttingProxy, ServerProcess, ServerThread, address_text

SIZES = [0, 1, (64 << 10) - 1, 64 << 10, (64 << 10) + 1, 10 << 20]


class BlockingClientOnThreads:
    """Awaitable calls into a blocking BlobClient, run on worker threads, so that one async
    suite drives both client faces while the server runs on the test's event loop."""

    def __init__(self, client: BlobClient) -> None:
        self._client = client

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        method = getattr(self._client, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            return await asyncio.to_thread(method, *args, **kwargs)

        return call


@pytest.fixture(params=["async", "blocking"])
async def blobs(request: pytest.FixtureRequest, server: BlobServer) -> AsyncIterator[Any]:
    if request.param == "async":
        async with AsyncBlobClient(server.address, timeout=10) as client:
            yield client
    else:
        blocking = BlobClient(address_text(server.address), timeout=10)
        yield BlockingClientOnThreads(blocking)
        await asyncio.to_thread(blocking.close)


def objects_in(server: BlobServer) -> list[str]:
    return sorted(p.name for p in server.storage.layout.objects.iterdir())


@pytest.mark.parametrize("size", SIZES)
async def test_content_blob_round_trips(blobs: Any, size: int) -> None:
    data = random.randbytes(size)
    key = await blobs.put(data)
    assert key == blake3.blake3(data).hexdigest()
    assert await blobs.get(key) == data
    assert (await blobs.stat(key)).size == size


@pytest.mark.parametrize("size", SIZES)
async def test_job_blob_round_trips(blobs: Any, size: int) -> None:
    job, data = new_job_id(), random.randbytes(size)
    key = await blobs.put(data, job=job, name="lib/model.bin")
    assert await blobs.get(job=job, name="lib/model.bin") == data
    info = await blobs.stat(job=job, name="lib/model.bin")
    assert (info.key, info.size) == (key, size)


async def test_same_content_is_stored_once(blobs: Any, server: BlobServer) -> None:
    job = new_job_id()
    keys = {await blobs.put(b"jar bytes"), await blobs.put(b"jar bytes")}
    keys.add(await blobs.put(b"jar bytes", job=job, name="a.jar"))
    assert len(keys) == 1
    assert objects_in(server) == sorted(keys)


async def test_put_by_name_replaces_the_earlier_blob(blobs: Any) -> None:
    job = new_job_id()
    await blobs.put(b"version 1", job=job, name="app.whl")
    await blobs.put(b"version 2", job=job, name="app.whl")
    assert await blobs.get(job=job, name="app.whl") == b"version 2"
    assert [info.name for info in await blobs.list(job)] == ["app.whl"]


async def test_delete_is_idempotent(blobs: Any) -> None:
    key = await blobs.put(b"temporary")
    await blobs.delete(key)
    await blobs.delete(key)
    with pytest.raises(NotFound):
        await blobs.get(key)
    await blobs.delete(job=new_job_id(), name="never existed")


async def test_deleting_a_job_removes_its_blobs_only(blobs: Any) -> None:
    doomed, kept = new_job_id(), new_job_id()
    for name in ("a", "b/c", ".."):
        await blobs.put(name.encode(), job=doomed, name=name)
    await blobs.put(b"a", job=kept, name="a")
    content_key = await blobs.put(b"a")
    await blobs.delete_job(doomed)
    assert await blobs.list(doomed) == []
    assert await blobs.get(job=kept, name="a") == b"a"
    assert await blobs.get(content_key) == b"a"


async def test_list_reports_name_size_and_key(blobs: Any) -> None:
    job = new_job_id()
    expected = {}
    for name, data in [("x", b"1"), ("y/z", b"22"), ("é" * 100, b"333")]:
        expected[name] = (await blobs.put(data, job=job, name=name), len(data))
    listed = {info.name: (info.key, info.size) for info in await blobs.list(job)}
    assert listed == expected
    assert await blobs.list(new_job_id()) == []


async def test_get_file_lands_complete_or_not_at_all(blobs: Any, tmp_path: Path) -> None:
    data = random.randbytes(3 << 20)
    key = await blobs.put(data)
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    info = await blobs.get_file(downloads / "out.bin", key)
    assert (downloads / "out.bin").read_bytes() == data and info.size == len(data)
    with pytest.raises(NotFound):
        await blobs.get_file(downloads / "missing.bin", "0" * 64)
    assert sorted(p.name for p in downloads.iterdir()) == ["out.bin"]


async def test_put_accepts_paths_and_streams(blobs: Any, tmp_path: Path) -> None:
    data = random.randbytes(2 << 20)
    path = tmp_path / "artifact.zip"
    path.write_bytes(data)
    key = blake3.blake3(data).hexdigest()
    assert await blobs.put(path) == key
    assert await blobs.put(str(path)) == key
    assert await blobs.put(io.BytesIO(data)) == key


async def test_oversize_put_is_refused_before_the_body(client: AsyncBlobClient, server: BlobServer) -> None:
    limit = server.settings.max_blob_size
    with pytest.raises(TooLarge, match="limit"):
        await client.put(bytes(limit + 1))
    assert await client.put(b"still serving") == blake3.blake3(b"still serving").hexdigest()


async def test_32_concurrent_clients_put_and_get_mixed_sizes(server: BlobServer) -> None:
    async def worker(index: int) -> None:
        rng = random.Random(index)
        async with AsyncBlobClient(server.address, timeout=30) as client:
            job = new_job_id()
            for round_ in range(4):
                data = rng.randbytes(rng.choice([0, 10, 4096, 100_000, 1 << 20]))
                if round_ % 2:
                    key = await client.put(data, job=job, name=f"f{round_}")
                    got = await client.get(job=job, name=f"f{round_}")
                else:
                    key = await client.put(data)
                    got = await client.get(key)
                assert key == blake3.blake3(data).hexdigest()
                assert got == data

    await asyncio.gather(*(worker(i) for i in range(32)))
    assert list(server.storage.layout.incoming.iterdir()) == []


async def test_connections_are_reused(server: BlobServer) -> None:
    async with AsyncBlobClient(server.address) as client:
        for _ in range(20):
            await client.put(b"again")
        assert len(client._idle) == 1


# --- failures the client must survive or report ----------------------------------------


async def test_a_broken_get_resumes_from_the_bytes_received(server: BlobServer) -> None:
    data = random.randbytes(4 << 20)
    async with AsyncBlobClient(server.address) as client:
        key = await client.put(data)
    proxy = CuttingProxy(server.address, cuts=1, after=1 << 20)
    async with proxy as address, AsyncBlobClient(address, retries=2, backoff=0.01) as client:
        assert await client.get(key) == data
    assert proxy.connections == 2
    resumed = proxy.sent_by_clients[1]
    offset = int.from_bytes(resumed[-8:], "little")
    assert 0 < offset <= 1 << 20


async def test_more_failures_than_retries_is_a_clear_error_naming_the_server(server: BlobServer) -> None:
    async with AsyncBlobClient(server.address) as client:
        key = await client.put(random.randbytes(1 << 20))
    proxy = CuttingProxy(server.address, cuts=10, after=1000)
    async with proxy as address, AsyncBlobClient(address, retries=2, backoff=0.01) as client:
        with pytest.raises(ConnectionClosed, match=r"3 attempt") as caught:
            await client.get(key)
    assert address_text(address) in str(caught.value)
    assert proxy.connections == 3


async def test_a_silent_server_times_out() -> None:
    async def say_nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()

    silent = await asyncio.start_server(say_nothing, "127.0.0.1", 0)
    async with silent:
        address = silent.sockets[0].getsockname()[:2]
        async with AsyncBlobClient(address, timeout=0.3, retries=0) as client:
            with pytest.raises(ReadTimeout):
                await client.stat("0" * 64)


async def test_nobody_listening_is_a_connect_error_after_retries() -> None:
    with socket_bound_but_not_listening() as port:
        async with AsyncBlobClient(("127.0.0.1", port), retries=1, backoff=0.01) as client:
            with pytest.raises(ConnectError, match=f"127.0.0.1:{port}"):
                await client.get("0" * 64)


@contextlib.contextmanager
def socket_bound_but_not_listening() -> Iterator[int]:
    """A port on 127.0.0.1 that is certainly refused, and stays ours while in use."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


async def test_a_closed_client_refuses_to_work(server: BlobServer) -> None:
    client = AsyncBlobClient(server.address)
    await client.aclose()
    with pytest.raises(RuntimeError, match="closed"):
        await client.get("0" * 64)
    blocking = BlobClient(address_text(server.address))
    blocking.close()
    with pytest.raises(RuntimeError, match="closed"):
        blocking.get("0" * 64)


def test_blocking_client_works_under_a_running_event_loop(server_thread: ServerThread) -> None:
    async def inside_a_loop() -> bytearray:
        with BlobClient(server_thread.address) as client:
            return client.get(client.put(b"from a notebook"))

    assert asyncio.run(inside_a_loop()) == b"from a notebook"


def _child_uses_inherited_client(client: BlobClient, queue: Any) -> None:
    queue.put(client.get(client.put(b"from the child")))


def test_blocking_client_survives_fork(server_thread: ServerThread) -> None:
    with BlobClient(server_thread.address) as client:
        client.put(b"parent first")  # starts the parent's loop thread, which a fork does not copy
        context = multiprocessing.get_context("fork")
        queue = context.Queue()
        child = context.Process(target=_child_uses_inherited_client, args=(client, queue))
        child.start()
        assert queue.get(timeout=30) == b"from the child"
        child.join(30)
        assert child.exitcode == 0
        assert client.get(client.put(b"parent after")) == b"parent after"


def test_job_ids_accept_hex_and_uuid_forms(server_thread: ServerThread) -> None:
    job = uuid.uuid4()
    with BlobClient(server_thread.address) as client:
        client.put(b"x", job=job, name="n")
        assert client.get(job=job.hex, name="n") == b"x"
        assert client.get(job=str(job), name="n") == b"x"
        with pytest.raises(ValueError, match="job id"):
            client.get(job="not-a-job", name="n")
        with pytest.raises(ValueError, match="key"):
            client.get("abc")
        with pytest.raises(ValueError, match="job and name"):
            client.get(job=job)


async def test_bytes_that_rot_on_the_server_are_rejected_by_the_client(
    client: AsyncBlobClient, server: BlobServer, tmp_path: Path
) -> None:
    data = random.randbytes(200_000)
    key = await client.put(data)
    flip_byte(server.storage.layout.object(bytes.fromhex(key)), 100_000)
    with pytest.raises(DigestMismatch, match="announced"):
        await client.get(key)
    with pytest.raises(DigestMismatch):
        await client.get_file(tmp_path / "rotten", key)
    assert not (tmp_path / "rotten").exists()


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as stored:
        stored.seek(offset)
        original = stored.read(1)
        stored.seek(offset)
        stored.write(bytes([original[0] ^ 0xFF]))


@pytest.mark.parametrize("size", [3 << 20, 40 << 20])
async def test_get_into_memory_is_one_buffer_of_the_blob_size(client: AsyncBlobClient, size: int) -> None:
    data = random.randbytes(size)
    key = await client.put(data)
    got = await client.get(key)
    assert isinstance(got, bytearray) and len(got) == size and got == data


async def test_a_file_download_holds_a_few_buffers_whatever_the_blob_size(
    client: AsyncBlobClient, tmp_path: Path
) -> None:
    """The worker hashes and writes each buffer while the next is received; the download's
    own allocations stay at a few buffers, far below the 64 MiB blob."""
    source = tmp_path / "big.bin"
    with source.open("wb") as out:
        for _ in range(64):
            out.write(random.randbytes(1 << 20))
    key = await client.put(source)
    tracemalloc.start()
    try:
        info = await client.get_file(tmp_path / "copy.bin", key)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert info.size == 64 << 20
    assert peak <= (BODY_BUFFERS + 1) * BODY_BUFFER
    assert blake3.blake3((tmp_path / "copy.bin").read_bytes()).hexdigest() == key


def test_a_forked_child_never_sends_on_its_parents_pooled_connection(
    spawn_server: Callable[..., ServerProcess],
) -> None:
    """A client forked with a connection in its pool (os.fork, multiprocessing's "fork"): the
    child connects afresh rather than interleave its requests with the parent's on the
    inherited socket, and the parent's pooled connection goes on answering in order."""
    server = spawn_server()
    loop = asyncio.new_event_loop()
    client = AsyncBlobClient(server.address, timeout=10, retries=0)
    try:
        key = loop.run_until_complete(client.put(b"parent"))
        (pooled,) = client._idle
        inherited = pooled.stream.sock.getsockname()
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report through the pipe, leave without pytest's teardown
            code = 1
            try:
                info = asyncio.new_event_loop().run_until_complete(client.stat(key))
                os.write(write_end, repr((info.size, client._idle[0].stream.sock.getsockname())).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_end)
        try:
            answered, _, _ = select.select([read_end], [], [], 30)
            report = os.read(read_end, 1000).decode() if answered else "nothing (it hung)"
        finally:
            os.close(read_end)
            if not answered:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, report
        size, used = ast.literal_eval(report)
        assert size == len(b"parent") and used != inherited
        assert loop.run_until_complete(client.get(key)) == b"parent"
        assert client._idle == [pooled]  # still the parent's own connection, in step
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()


class _HeldSource(io.RawIOBase):
    """An upload that stops after its first read until :attr:`go` is set: its request is in
    flight on its connection meanwhile."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.reading = threading.Event()
        self.go = threading.Event()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self.reading.set()
        assert self.go.wait(30)
        size = min(len(buffer), len(self.data))
        buffer[:size], self.data = self.data[:size], self.data[size:]
        return size


def _open_local_addresses() -> set[tuple[str, int]]:
    """The local address of every TCP socket this process has open."""
    found = set()
    for entry in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{entry}").startswith("socket:"):
                with socket.socket(fileno=os.dup(int(entry))) as sock:
                    if sock.type == socket.SOCK_STREAM and sock.family == socket.AF_INET:
                        found.add(sock.getsockname())
    return found


def test_a_forked_child_closes_the_connection_a_blocking_clients_thread_has_in_flight(
    server_thread: ServerThread,
) -> None:
    """A Spark worker forked while another thread's request is on the wire: the child closes
    its copy of that connection too (not only the idle ones), so that the connection ends
    when the parent is done with it, not when the child exits."""
    with BlobClient(server_thread.address, timeout=10, retries=0) as client:
        client.put(b"pooled")
        in_flight = client._client._idle[0].stream.sock.getsockname()  # type: ignore[union-attr]
        source = _HeldSource(b"in flight" * 1000)
        uploader = threading.Thread(target=client.put, args=(source,))
        uploader.start()
        try:
            assert source.reading.wait(10)
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: report through the pipe, leave without pytest's teardown
                code = 1
                try:
                    os.write(write_end, repr(in_flight in _open_local_addresses()).encode())
                    code = 0
                finally:
                    os._exit(code)
            os.close(write_end)
            answered, _, _ = select.select([read_end], [], [], 30)
            report = os.read(read_end, 100).decode() if answered else "nothing (it hung)"
            os.close(read_end)
            if not answered:
                os.kill(pid, signal.SIGKILL)
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0, report
            assert report == "False", "the child kept the parent's connection open"
        finally:
            source.go.set()
            uploader.join(30)
        assert in_flight in _open_local_addresses()  # the parent's, still in use
