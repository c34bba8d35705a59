"""Shared fixtures: real servers on 127.0.0.1 over real temporary directories.

* ``server``: a BlobServer on the test's own event loop (for async tests).
* ``server_thread``: a BlobServer on a loop in a background thread (for blocking clients
  and child processes).
* ``spawn_server``: ``blobsvc serve`` as a child process, for crashes and signals; every
  child is killed by PID at teardown.
* ``storage``: a recovered BlobStorage alone, closed at teardown; with :func:`put_streamed`
  and :func:`read_blob`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import blake3
import pytest

# Shared with the benchmarks; the tests import them from here too.
from benchmarks.harness.processes import ChildProcess as ChildProcess
from benchmarks.harness.processes import ServerThread as ServerThread
from benchmarks.harness.processes import address_text as address_text
from blobsvc import AsyncBlobClient, BlobServer, Settings
from blobsvc.storage import BlobStorage
from blobsvc.wire._protocol import ContentKey, JobBlob


@pytest.fixture
def storage(tmp_path: Path) -> Iterator[BlobStorage]:
    store = BlobStorage(tmp_path / "data")
    store.recover()
    yield store
    store.close()


def put_streamed(storage: BlobStorage, data: bytes, target: JobBlob | None = None) -> bytes:
    """Publish ``data`` as a large PUT is: streamed to its staging file, then fsynced."""
    with storage.stage() as upload:
        upload.write(data)
        return storage.publish(upload, target, blake3.blake3(data).digest())


def read_blob(storage: BlobStorage, target: ContentKey | JobBlob) -> bytes:
    with storage.open_blob(target) as blob:
        return os.pread(blob.fd, blob.size, 0)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        host="127.0.0.1",
        port="0",
        data_dir=tmp_path / "data",
        idle_timeout=5.0,
        io_timeout=2.0,
        shutdown_timeout=2.0,
        max_blob_size=64 << 20,
    )


@pytest.fixture
async def server(settings: Settings) -> AsyncIterator[BlobServer]:
    async with BlobServer(settings) as running:
        yield running


@pytest.fixture
async def client(server: BlobServer) -> AsyncIterator[AsyncBlobClient]:
    async with AsyncBlobClient(server.address, timeout=5.0, retries=2, backoff=0.01) as connected:
        yield connected


def with_secret(settings: Settings, directory: Path, secret: bytes = b"s3cr3t") -> Settings:
    """``settings`` with a secret file (written under ``directory``) that the server requires."""
    secret_file = directory / "secret"
    secret_file.write_bytes(secret + b"\n")
    return replace(settings, secret_file=secret_file)


def staging_files(data_dir: Path) -> list[str]:
    """The names in a server's incoming/ directory."""
    return sorted(os.listdir(data_dir / "incoming"))


async def assert_no_staging(data_dir: Path) -> None:
    """incoming/ is empty, or becomes so within moments: cleanup runs as a connection ends."""
    for _ in range(300):
        if not staging_files(data_dir):
            return
        await asyncio.sleep(0.01)
    assert staging_files(data_dir) == [], "staging files left behind"


@pytest.fixture
def server_thread(settings: Settings) -> Iterator[ServerThread]:
    running = ServerThread(settings).start()
    yield running
    running.stop()


@dataclass
class ServerProcess(ChildProcess):
    port: int
    data_dir: Path

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


@pytest.fixture
def spawn_server(settings: Settings) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def spawn(*extra: str, **overrides: Any) -> ServerProcess:
        chosen = replace(settings, **overrides)
        args = [
            sys.executable, "-m", "blobsvc", "serve",
            "--host", "127.0.0.1", "--port", chosen.port, "--data-dir", str(chosen.data_dir),
            "--max-blob-size", str(chosen.max_blob_size),
            "--idle-timeout", str(chosen.idle_timeout), "--io-timeout", str(chosen.io_timeout),
            *extra,
        ]  # fmt: skip
        process = subprocess.Popen(
            args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("listening on "):
            process.kill()
            raise RuntimeError(f"server did not start: {line!r} {process.stderr.read() if process.stderr else ''}")
        spawned = ServerProcess(process, int(line.rsplit(":", 1)[1]), chosen.data_dir)
        started.append(spawned)
        return spawned

    yield spawn
    for spawned in started:
        spawned.kill()


class CuttingProxy:
    """A TCP relay on 127.0.0.1 in front of the server that cuts the first ``cuts``
    connections after ``after`` bytes from the server (running ``on_cut`` before the client
    sees the cut), and records what clients send."""

    def __init__(
        self,
        upstream: tuple[str, int],
        *,
        cuts: int,
        after: int,
        on_cut: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.upstream, self.cuts, self.after, self.on_cut = upstream, cuts, after, on_cut
        self.connections = 0
        self.sent_by_clients: list[bytes] = []

    async def __aenter__(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        limit = self.after if self.connections <= self.cuts else None
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        record = bytearray()
        self.sent_by_clients.append(b"")
        index = len(self.sent_by_clients) - 1

        async def upstream() -> None:
            while data := await reader.read(1 << 16):
                record.extend(data)
                self.sent_by_clients[index] = bytes(record)
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            passed = 0
            while data := await up_reader.read(1 << 16):
                if limit is not None and passed + len(data) >= limit:
                    writer.write(data[: limit - passed])
                    await writer.drain()
                    if self.on_cut is not None:
                        await self.on_cut()
                    return
                passed += len(data)
                writer.write(data)
                await writer.drain()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        writer.close()
        up_writer.close()
