"""BlobCache downloads over a network that fails: retries, the error after the last one,
resumption from the bytes received, and no partial file ever in sight.

The faults are real: a small asyncio TCP proxy on 127.0.0.1, in front of the real server,
that drops connections, cuts one mid-transfer or slows it down.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from blobsvc import BlobClient, ConnectionClosed
from blobsvc.cache import BlobCache

from .conftest import ServerThread
from .test_cache import MiB, gets, hex_digest

CHUNK = 64 << 10
PREAMBLE, STAT_OK, GET_OK = 6, 41, 41  # reply sizes, from docs/protocol.md


class FaultyProxy:
    """Forwards 127.0.0.1 connections to ``upstream``, breaking them on purpose.

    ``drop_first`` connections are closed as soon as they are accepted; ``cut_after`` bytes
    into the server's replies on one connection, that connection is closed; while
    ``throttle`` is set, each chunk to the client waits that many seconds. ``to_server`` keeps
    what each connection sent the server, so a test can read the offsets of its GETs.
    """

    def __init__(
        self, upstream: tuple[str, int], *, drop_first: int = 0, cut_after: int | None = None, throttle: float = 0.0
    ) -> None:
        self.upstream = upstream
        self.drop_first = drop_first
        self.cut_after = cut_after
        self.throttle = throttle
        self.connections = 0
        self.to_server: list[bytearray] = []
        self.to_client: list[int] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def stop(self) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.connections <= self.drop_first:
            writer.close()
            return
        index = len(self.to_server)
        self.to_server.append(bytearray())
        self.to_client.append(0)
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        tasks = [
            asyncio.create_task(self._to_server(reader, up_writer, index)),
            asyncio.create_task(self._to_client(up_reader, writer, index)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    async def _to_server(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while data := await reader.read(CHUNK):
            self.to_server[index] += data
            writer.write(data)
            await writer.drain()

    async def _to_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        while data := await reader.read(CHUNK):
            if self.cut_after is not None and self.to_client[index] + len(data) >= self.cut_after:
                data = data[: self.cut_after - self.to_client[index]]
                self.cut_after = None  # one cut, then the proxy behaves
                writer.write(data)
                self.to_client[index] += len(data)
                await writer.drain()
                return
            writer.write(data)
            self.to_client[index] += len(data)
            await writer.drain()
            if self.throttle:
                await asyncio.sleep(self.throttle)

    def get_offsets(self, key: str) -> list[int]:
        """The offset of every GET of content ``key``, in order of connection."""
        marker = b"\x01\x00" + bytes.fromhex(key)
        offsets = []
        for sent in self.to_server:
            at = sent.find(marker)
            while at >= 0:
                offsets.append(int.from_bytes(sent[at + len(marker) : at + len(marker) + 8], "little"))
                at = sent.find(marker, at + 1)
        return offsets


@contextlib.contextmanager
def running(proxy: FaultyProxy, server: ServerThread) -> Iterator[FaultyProxy]:
    """Run the proxy on the server thread's event loop."""
    asyncio.run_coroutine_threadsafe(proxy.start(), server.loop).result(10)
    try:
        yield proxy
    finally:
        asyncio.run_coroutine_threadsafe(proxy.stop(), server.loop).result(10)


@pytest.fixture
def put(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=10) as client:
        yield client


def cache_through(proxy: FaultyProxy, directory: Path, *, retries: int) -> BlobCache:
    # Without store reads: the faults and offsets here are the server's transfer, counted from
    # the first connection's STAT (a store read's STATUS would come first; tests/test_store_reads.py).
    return BlobCache(proxy.address, directory, retries=retries, backoff=0.01, timeout=5.0, store_reads=False)


def test_a_server_that_drops_the_first_two_connections_still_serves_the_blob(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    data = os.urandom(4 * MiB)
    key = put.put(data)
    with (
        running(FaultyProxy(server_thread.server.address, drop_first=2), server_thread) as proxy,
        cache_through(proxy, tmp_path / "cache", retries=2) as cache,
    ):
        assert cache.path(key).read_bytes() == data
    assert proxy.connections == 3
    assert gets(server_thread) == 1


def test_more_dropped_connections_than_retries_end_in_an_error_naming_the_server(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    key = put.put(os.urandom(MiB))
    with (
        running(FaultyProxy(server_thread.server.address, drop_first=10), server_thread) as proxy,
        cache_through(proxy, tmp_path / "cache", retries=2) as cache,
    ):
        with pytest.raises(ConnectionClosed, match=rf"server {proxy.address}, 3 attempts"):
            cache.path(key)
        assert proxy.connections == 3
        assert cache.check() == []
    assert gets(server_thread) == 0


def test_a_transfer_cut_midway_resumes_from_the_received_offset(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    data = os.urandom(8 * MiB)
    key = put.put(data)
    cut = 3 * MiB
    with (
        running(FaultyProxy(server_thread.server.address, cut_after=cut), server_thread) as proxy,
        cache_through(proxy, tmp_path / "cache", retries=2) as cache,
    ):
        assert hex_digest(cache.path(key)) == key
    # The first connection carried the preamble, the STAT and the start of the GET.
    assert proxy.get_offsets(key) == [0, cut - PREAMBLE - STAT_OK - GET_OK]
    assert gets(server_thread) == 2
    assert sum(proxy.to_client) < len(data) + 2 * MiB  # nothing was sent twice


def test_no_partial_file_is_ever_visible_where_blobs_are_served(
    server_thread: ServerThread, put: BlobClient, tmp_path: Path
) -> None:
    data = os.urandom(4 * MiB)
    key = put.put(data)
    seen: list[tuple[str, int]] = []
    partials_seen = 0
    done = threading.Event()
    with (
        running(FaultyProxy(server_thread.server.address, throttle=0.01), server_thread) as proxy,
        cache_through(proxy, tmp_path / "cache", retries=2) as cache,
    ):

        def watch() -> None:
            nonlocal partials_seen
            deadline = time.monotonic() + 30
            while not done.is_set() and time.monotonic() < deadline:
                partials_seen += any((cache.root / "partial").iterdir())
                for directory in (cache.root / "content", cache.root / "jobs"):
                    for found in directory.rglob("*"):
                        with contextlib.suppress(FileNotFoundError):
                            if found.is_file():
                                seen.append((found.name, found.stat().st_size))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            path = cache.path(key)
        finally:
            done.set()
            watcher.join(30)
        assert hex_digest(path) == key
    assert partials_seen, "the watcher never saw the download in progress"
    assert set(seen) <= {(key, len(data))}
