"""Durability and atomicity, pinned so that removing any of the steps fails a test.

Power loss cannot be shown by a real part in a test: what survives it depends on the order
in which bytes and names reach the disk. So the storage tests here record the calls that
matter (``os.pwrite``, ``os.fsync``, ``os.rename``/``os.replace``/``os.link``, ``os.unlink``)
with the file each one touched, and check their order: a staging file is fsynced before it
is linked into ``objects/``, and each directory that gained a name is
fsynced after, before ``publish`` returns. Everything else uses real parts: a real server, a real cut connection,
bytes that really rot on the server's disk.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from blobsvc import AsyncBlobClient, BlobClient, BlobServer, BlobStorage, DigestMismatch, Settings
from blobsvc.cache import BlobCache, TooLargeForCache
from blobsvc.server import RESERVE_ON_LOOP_LIMIT
from blobsvc.storage import StagedUpload
from blobsvc.wire._protocol import JobBlob

from .conftest import CuttingProxy, ServerThread
from .test_client import flip_byte
from .test_server_faults import STEP, MiB, digest, put_header, raw_connection

JOB = bytes.fromhex("d0000000000000000000000000000001")


@dataclass(frozen=True)
class Call:
    name: str
    paths: tuple[str, ...]


class CallLog:
    """The file-system calls storage makes, in order, each with the path(s) it touched."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.calls: list[Call] = []

    def where(self, target: int | str | os.PathLike[str], dir_fd: int | None) -> str:
        if isinstance(target, int):
            path = os.readlink(f"/proc/self/fd/{target}")
        elif dir_fd is not None:
            path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), target)
        else:
            path = os.fspath(target)
        return os.path.relpath(path, self.root)

    def wrap(self, name: str, real: Callable[..., Any], path_args: int) -> Callable[..., Any]:
        def recorded(*args: Any, **kwargs: Any) -> Any:
            dir_fds = (kwargs.get("src_dir_fd", kwargs.get("dir_fd")), kwargs.get("dst_dir_fd"))[:path_args]
            paths = tuple(self.where(a, fd) for a, fd in zip(args[:path_args], dir_fds, strict=True))
            self.calls.append(Call(name, paths))
            return real(*args, **kwargs)

        return recorded

    def index(self, name: str, match: Callable[[tuple[str, ...]], bool]) -> int:
        found = [i for i, call in enumerate(self.calls) if call.name == name and match(call.paths)]
        assert found, f"no {name} call matching; calls were {self.calls}"
        return found[0]


@pytest.fixture
def calls(storage: BlobStorage, monkeypatch: pytest.MonkeyPatch) -> Iterator[CallLog]:
    log = CallLog(storage.layout.root)
    for name, path_args in (("pwrite", 1), ("fsync", 1), ("rename", 2), ("replace", 2), ("link", 2), ("unlink", 1)):
        monkeypatch.setattr(os, name, log.wrap(name, getattr(os, name), path_args))
    yield log


def publish(storage: BlobStorage, data: bytes, target: JobBlob | None = None) -> bytes:
    with storage.stage() as upload:
        upload.write(data)
        return storage.publish(upload, target, upload.digest())


def test_a_content_blob_is_fsynced_before_its_first_link_and_its_directories_after(
    storage: BlobStorage, calls: CallLog
) -> None:
    key = publish(storage, b"durable bytes").hex()

    def staged(paths: tuple[str, ...]) -> bool:
        return paths[0].startswith("incoming/")

    written = calls.index("pwrite", staged)
    synced = calls.index("fsync", staged)
    stored = calls.index("link", lambda paths: staged(paths) and paths[1] == f"objects/{key}")
    objects_synced = calls.index("fsync", lambda paths: paths == ("objects",))
    linked = calls.index("link", lambda paths: paths == (f"objects/{key}", f"cache/{key}"))
    cache_synced = calls.index("fsync", lambda paths: paths == ("cache",))
    assert written < synced < stored < objects_synced, calls.calls
    assert stored < linked < cache_synced, calls.calls


def test_a_job_name_is_replaced_in_one_rename_never_unlinked_first(storage: BlobStorage, calls: CallLog) -> None:
    """A reader must always find the old blob or the new one under the name: the new link is
    made under a temporary name and renamed over the old, and the job directory is fsynced."""
    target = JobBlob(JOB, "lib/app.jar")
    publish(storage, b"version 1", target)
    path = os.path.relpath(storage.layout.job_blob(JOB, target.name), storage.layout.root)
    calls.calls.clear()
    publish(storage, b"version 2", target)
    assert not [c for c in calls.calls if c.name in ("unlink", "rename") and path in c.paths], calls.calls
    replaced = calls.index("replace", lambda paths: paths[1] == path)
    synced = calls.index("fsync", lambda paths: paths == (os.path.dirname(path),))
    assert replaced < synced
    with storage.open_blob(target) as blob:
        assert os.pread(blob.fd, 100, 0) == b"version 2"


async def test_only_a_large_put_reserves_its_blocks_off_the_event_loop(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reserving gigabytes takes milliseconds, which every connection of the loop would wait
    out: above RESERVE_ON_LOOP_LIMIT the staging file is made on a worker thread. The
    threads are read by wrapping the real ``BlobStorage.stage`` (a spy: it still runs)."""
    on_loop: list[bool] = []
    real_stage = BlobStorage.stage

    def recording_stage(storage: BlobStorage, size: int | None = None) -> StagedUpload:
        on_loop.append(threading.current_thread() is threading.main_thread())
        return real_stage(storage, size)

    monkeypatch.setattr(BlobStorage, "stage", recording_stage)
    async with (
        BlobServer(replace(settings, max_blob_size=2 * RESERVE_ON_LOOP_LIMIT)) as server,
        AsyncBlobClient(server.address, timeout=STEP, retries=0) as client,
    ):
        await client.put(os.urandom(MiB))
        await client.put(bytes(RESERVE_ON_LOOP_LIMIT + 1))
    assert on_loop == [True, False]


async def test_a_large_put_starts_the_disk_on_its_bytes_before_its_body_ends(
    server: BlobServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The staging file's writeback starts while the body arrives, so the fsync of
    publication waits for the last pieces only. Whether the kernel started writing cannot be
    seen from here without timing the disk, so the test records the calls that ask it to (a
    spy: each still runs) and the bytes staged at each; the fsync before the answer is
    pinned by the tests above."""
    started_at: list[int] = []
    started = threading.Event()
    real_write_out = StagedUpload.write_out

    def write_out(upload: StagedUpload) -> None:  # on a worker thread
        started_at.append(upload.size)
        started.set()
        real_write_out(upload)

    monkeypatch.setattr(StagedUpload, "write_out", write_out)
    body = os.urandom(16 << 20)
    half = len(body) // 2
    async with raw_connection(server) as raw:
        await raw.send(put_header(len(body)) + body[:half])
        assert await asyncio.to_thread(started.wait, STEP), "no writeback was started mid-body"
        assert 0 < started_at[0] <= half
        await raw.send(body[half:] + digest(body))
        assert await raw.put_ok() == digest(body)


async def test_get_file_never_shows_a_partial_destination(server: BlobServer, tmp_path: Path) -> None:
    """The connection is cut mid-body; at that moment the destination must not exist (the
    bytes so far live under a temporary name), and after the resumed download it is whole."""
    data = os.urandom(3 << 20)
    (tmp_path / "out").mkdir()
    dest = tmp_path / "out" / "app.jar"
    seen_at_cut: list[bool] = []

    async def look() -> None:
        seen_at_cut.append(dest.exists())

    async with AsyncBlobClient(server.address) as uploader:
        key = await uploader.put(data)
    async with (
        CuttingProxy(server.address, cuts=1, after=1 << 20, on_cut=look) as address,
        AsyncBlobClient(address, retries=2, backoff=0.01) as client,
    ):
        await client.get_file(dest, key)
    assert seen_at_cut == [False]
    assert dest.read_bytes() == data
    assert os.listdir(dest.parent) == ["app.jar"], "a temporary file was left"


@pytest.mark.parametrize("fsync", [False, True])
async def test_get_file_waits_for_the_disk_only_when_asked(
    server: BlobServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fsync: bool
) -> None:
    """By default a download is left to the page cache (as curl leaves it); with ``fsync``
    the file is fsynced before its rename and its directory after, so a power loss leaves
    either no file or the whole one."""
    async with AsyncBlobClient(server.address) as client:
        key = await client.put(os.urandom(3 << 20))
        out = tmp_path / "out"
        out.mkdir()
        log = CallLog(out)
        for name, path_args in (("fsync", 1), ("replace", 2)):
            monkeypatch.setattr(os, name, log.wrap(name, getattr(os, name), path_args))
        await client.get_file(out / "app.jar", key, fsync=fsync)
    mine = [call for call in log.calls if not call.paths[0].startswith("..")]  # not the server's
    if not fsync:
        assert [call.name for call in mine] == ["replace"], mine
        return
    synced = log.index("fsync", lambda paths: paths[0].startswith(".app.jar."))
    renamed = log.index("replace", lambda paths: paths[1] == "app.jar")
    directory = log.index("fsync", lambda paths: paths == (".",))
    assert synced < renamed < directory, mine


async def test_a_failed_get_file_leaves_neither_destination_nor_temporary(server: BlobServer, tmp_path: Path) -> None:
    async with AsyncBlobClient(server.address, retries=1, backoff=0.01) as client:
        key = await client.put(os.urandom(300_000))
        flip_byte(server.storage.layout.object(bytes.fromhex(key)), 200_000)
        (tmp_path / "out").mkdir()
        with pytest.raises(DigestMismatch):
            await client.get_file(tmp_path / "out" / "app.jar", key)
    assert os.listdir(tmp_path / "out") == []


def test_a_cache_rejects_bytes_that_rot_on_the_server_and_records_nothing(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    """The server serves rotten bytes under the right digest: the cache must fail and hand
    out no file (a partial download may stay, to resume), then fetch the blob once it is
    good again."""
    data = os.urandom(400_000)
    with BlobClient(server_thread.address) as client:
        key = client.put(data)
    stored = server_thread.server.storage.layout.object(bytes.fromhex(key))
    flip_byte(stored, 123_456)
    cache = BlobCache(server_thread.address, tmp_path / "cache", retries=1, backoff=0.01, timeout=5.0)
    try:
        with pytest.raises(DigestMismatch):
            cache.path(key)
        assert not cache.store.content(key).exists()
        assert cache.store.lookup(key) is None
        flip_byte(stored, 123_456)  # healed
        assert cache.path(key).read_bytes() == data
    finally:
        cache.close()


def test_a_cache_takes_a_blob_exactly_its_limit_and_refuses_one_byte_more(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    limit = 256 << 10
    with BlobClient(server_thread.address) as client:
        exact = client.put(os.urandom(limit))
        over = client.put(os.urandom(limit + 1))
    cache = BlobCache(server_thread.address, tmp_path / "cache", max_bytes=limit, retries=0, timeout=5.0)
    try:
        assert cache.path(exact).stat().st_size == limit
        with pytest.raises(TooLargeForCache):
            cache.path(over)
        assert cache.check() == []
    finally:
        cache.close()


def test_a_link_answers_only_once_its_name_and_objects_are_fsynced(storage: BlobStorage, calls: CallLog) -> None:
    """LINK: the new name is renamed into place, then its directory (and objects/, which a PUT
    of the key in flight may not have flushed) is fsynced, before ``link`` returns: before the
    server acknowledges the request."""
    key = publish(storage, b"linked bytes")
    target = JobBlob(JOB, "state/linked")
    calls.calls.clear()
    assert storage.link(key, target) == len(b"linked bytes")
    path = os.path.relpath(storage.layout.job_blob(JOB, target.name), storage.layout.root)
    named = calls.index("replace", lambda paths: paths[1] == path)
    assert named < calls.index("fsync", lambda paths: paths == (os.path.dirname(path),)), calls.calls
    assert named < calls.index("fsync", lambda paths: paths == ("objects",)), calls.calls
