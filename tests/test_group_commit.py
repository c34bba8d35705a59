"""Group commit: concurrent PUTs share one flush and lose none of their durability.

The order of the disk calls is what durability rests on, and a real disk does not show it
(nor can it be made to fail an fsync on demand): these tests wrap ``os.fsync``,
``os.fdatasync`` (the journal's), ``os.rename``, ``os.link`` and ``os.replace`` to record each
call, and the error tests make a wrapped fsync or fdatasync fail. Everything else is real:
files, directories, server, client, sockets.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import AsyncBlobClient, BlobError, BlobServer, DigestMismatch, InternalError, NotFound
from blobsvc.storage import BlobStorage, Publication
from blobsvc.storage._commit import GroupCommitter
from blobsvc.wire._protocol import ContentKey, JobBlob

from .conftest import ServerProcess

JOB = bytes(range(16))


class DiskCalls:
    """Records ``(call, path)`` for every fsync, fdatasync, rename, link and replace, from any
    thread; ``fail_fsync`` makes fsyncs and fdatasyncs of paths it matches raise EIO."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        self.fail_fsync: Callable[[str], bool] = lambda path: False
        self._lock = threading.Lock()
        rename, link, replace = os.rename, os.link, os.replace

        def record(call: str, path: Any) -> None:
            with self._lock:
                self.calls.append((call, str(path)))

        def recording(sync: Callable[[int], None]) -> Callable[[int], None]:
            def recording_sync(fd: int) -> None:
                path = os.readlink(f"/proc/self/fd/{fd}")
                if self.fail_fsync(path):
                    raise OSError(errno.EIO, f"injected {sync.__name__} failure", path)
                sync(fd)
                record(sync.__name__, path)

            return recording_sync

        def recording_rename(src: Any, dst: Any, **kwargs: Any) -> None:
            rename(src, dst, **kwargs)
            record("rename", dst)

        def recording_link(src: Any, dst: Any, **kwargs: Any) -> None:
            link(src, dst, **kwargs)
            directory = kwargs.get("dst_dir_fd")
            record("link", dst if directory is None else os.path.join(os.readlink(f"/proc/self/fd/{directory}"), dst))

        def recording_replace(src: Any, dst: Any, **kwargs: Any) -> None:
            replace(src, dst, **kwargs)
            record("replace", dst)

        monkeypatch.setattr(os, "fsync", recording(os.fsync))
        monkeypatch.setattr(os, "fdatasync", recording(os.fdatasync))
        monkeypatch.setattr(os, "rename", recording_rename)
        monkeypatch.setattr(os, "link", recording_link)
        monkeypatch.setattr(os, "replace", recording_replace)

    def mark(self, what: str) -> None:
        with self._lock:
            self.calls.append(("mark", what))

    def index(self, call: str, path: str | Path) -> int:
        return self.calls.index((call, str(path)))

    def last(self, call: str, path: str | Path) -> int:
        return len(self.calls) - 1 - self.calls[::-1].index((call, str(path)))

    def journal_appends(self) -> list[int]:
        """Where the journal's appends were made durable, as indices of :attr:`calls`."""
        return [i for i, (call, path) in enumerate(self.calls) if call == "fdatasync" and "/journal/" in path]


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[DiskCalls]:
    yield DiskCalls(monkeypatch)


def staged(
    storage: BlobStorage,
    data: bytes,
    target: JobBlob | None = None,
    digest: bytes | None = None,
    *,
    in_memory: bool = False,
    whole: bool = False,
) -> Publication:
    """A publication of ``data``; ``in_memory`` as the server stages a small PUT (its
    announced length), ``whole`` as its reader callback stages one that came whole, else
    streamed to its staging file as a large one is."""
    if whole:
        upload = storage.stage_body(bytearray(data))
    else:
        upload = storage.stage(len(data) if in_memory else None)
        upload.write(data)
    return Publication(upload, target, blake3.blake3(data).digest() if digest is None else digest)


def test_a_batch_makes_bytes_durable_before_names_and_names_before_answering(
    storage: BlobStorage, disk: DiskCalls
) -> None:
    """Blobs 0 and 1 are held in memory (journaled), 2 and 3 streamed to staging files."""
    blobs = [os.urandom(100) for _ in range(4)]
    batch = [
        staged(storage, data, JobBlob(JOB, f"b{i}") if i % 2 else None, in_memory=i < 2) for i, data in enumerate(blobs)
    ]
    staging = [str(item.upload.path) for item in batch]
    results = storage.publish_batch(batch)
    disk.mark("answered")
    layout = storage.layout
    keys = [blake3.blake3(data).digest() for data in blobs]
    assert results == keys
    names = [layout.content(k) if i % 2 == 0 else layout.job_blob(JOB, f"b{i}") for i, k in enumerate(keys)]
    answered = disk.index("mark", "answered")
    first_name_change = min(disk.index("link", layout.object(k)) for k in keys)
    # Every blob's bytes before any name: the journaled ones by one append, the others by
    # their files' fsyncs.
    assert len(disk.journal_appends()) == 1
    assert disk.journal_appends()[0] < first_name_change
    for path in staging[2:]:
        assert disk.index("fsync", path) < first_name_change
    for path in staging[:2]:
        assert ("fsync", path) not in disk.calls  # its record is its durability
    assert disk.index("link", names[0]) < answered and disk.index("replace", names[1]) < answered
    # The streamed ones' names are flushed, one flush per directory for the whole batch.
    for directory in (layout.objects, layout.cache, names[3].parent):
        flush = disk.last("fsync", directory)
        assert flush < answered
        assert disk.index("link", layout.object(keys[2])) < flush and disk.index("link", names[2]) < flush
        assert disk.index("link", layout.object(keys[3])) < flush and disk.index("replace", names[3]) < flush
    for directory in (layout.objects, layout.cache):
        assert sum(call == ("fsync", str(directory)) for call in disk.calls) == 1


def test_a_batch_of_small_uploads_flushes_no_file_and_no_directory(storage: BlobStorage, disk: DiskCalls) -> None:
    storage.publish_batch([staged(storage, b"the job's first", JobBlob(JOB, "first"), whole=True)])
    disk.calls.clear()  # making the job's directory is flushed once per job
    batch = [staged(storage, os.urandom(100), JobBlob(JOB, f"b{i}") if i % 2 else None, whole=True) for i in range(8)]
    assert storage.publish_batch(batch) == [item.digest for item in batch]
    assert [call for call, _ in disk.calls if call in {"fsync", "fdatasync"}] == ["fdatasync"]


def test_a_failed_journal_append_fails_the_batch_before_any_name_appears(storage: BlobStorage, disk: DiskCalls) -> None:
    disk.fail_fsync = lambda path: "/journal/" in path
    batch = [staged(storage, os.urandom(64), JobBlob(JOB, "x") if i else None, in_memory=True) for i in range(3)]
    results = storage.publish_batch(batch)
    assert all(isinstance(result, OSError) and result.errno == errno.EIO for result in results)
    assert not any(call in {"rename", "link", "replace"} for call, _ in disk.calls)
    assert os.listdir(storage.layout.incoming) == []
    disk.fail_fsync = lambda path: False
    # Nothing of the failed append is replayed: the next start finds none of it.
    storage.close()
    report = storage.recover()
    assert report.replayed == 0 and storage.list_job(JOB) == []


def test_a_blob_found_stored_is_answered_only_after_its_directories_are_flushed(
    storage: BlobStorage, disk: DiskCalls
) -> None:
    """Another batch may have linked the same content without having flushed it yet."""
    data = b"stored twice"
    key = storage.publish_batch([staged(storage, data)])[0]
    disk.calls.clear()
    assert storage.publish_batch([staged(storage, data)]) == [key]
    flushed = {path for call, path in disk.calls if call == "fsync"}
    assert {str(storage.layout.objects), str(storage.layout.cache)} <= flushed


@pytest.mark.parametrize("failing", ["cache", "objects"])
def test_a_failed_directory_flush_fails_the_publications_named_there_and_no_other(
    storage: BlobStorage, disk: DiskCalls, failing: str
) -> None:
    """Three content blobs and a job's blob in one batch: a failed flush of ``cache/`` fails
    the three, one of ``objects/`` (where every blob's bytes are named) all four."""
    disk.fail_fsync = lambda path: path == str(storage.layout.root / failing)
    results = storage.publish_batch(
        [staged(storage, os.urandom(64), JobBlob(JOB, "n") if i == 3 else None) for i in range(4)]
    )
    failed = [isinstance(result, OSError) and result.errno == errno.EIO for result in results]
    assert failed == [True, True, True, failing == "objects"]
    assert os.listdir(storage.layout.incoming) == []


def test_a_failed_file_flush_fails_the_batch_before_any_name_appears(storage: BlobStorage, disk: DiskCalls) -> None:
    disk.fail_fsync = lambda path: "/incoming/" in path
    batch = [staged(storage, os.urandom(64), in_memory=i > 0) for i in range(3)]
    results = storage.publish_batch(batch)
    assert all(isinstance(result, OSError) for result in results)
    assert not any(call in {"rename", "link", "replace"} for call, _ in disk.calls)
    for item in batch:
        with pytest.raises(NotFound):
            storage.open_blob(ContentKey(item.digest))
    assert os.listdir(storage.layout.incoming) == []


@pytest.mark.parametrize("whole", [False, True], ids=["streamed", "whole"])
def test_an_upload_held_in_memory_creates_its_staging_file_only_in_its_flush(
    storage: BlobStorage, disk: DiskCalls, whole: bool
) -> None:
    abandoned = staged(storage, b"never published", in_memory=True, whole=whole)
    refused = staged(storage, b"refused", digest=bytes(32), in_memory=True, whole=whole)
    item = staged(storage, b"held in memory", in_memory=True, whole=whole)
    assert os.listdir(storage.layout.incoming) == []  # nothing on disk while it is received
    abandoned.upload.discard()
    results = storage.publish_batch([item, refused])
    assert results[0] == item.digest and isinstance(results[1], DigestMismatch)
    assert disk.journal_appends()[0] < disk.index("link", storage.layout.object(item.digest))
    assert os.listdir(storage.layout.incoming) == []
    with storage.open_blob(ContentKey(item.digest)) as blob:
        assert os.pread(blob.fd, blob.size, 0) == b"held in memory"


def test_a_wrong_digest_refuses_that_upload_alone(storage: BlobStorage) -> None:
    good, bad = staged(storage, b"good"), staged(storage, b"bad", digest=bytes(32))
    results = storage.publish_batch([good, bad])
    assert results[0] == good.digest
    assert isinstance(results[1], DigestMismatch)
    assert os.listdir(storage.layout.incoming) == []


async def test_concurrent_puts_share_journal_appends_and_each_is_answered_after_its_own(
    server: BlobServer, disk: DiskCalls
) -> None:
    blobs = [os.urandom(4096) for _ in range(32)]
    clients = [AsyncBlobClient(server.address, timeout=10) for _ in blobs]

    async def put(client: AsyncBlobClient, data: bytes) -> str:
        key = await client.put(data)
        disk.mark(key)
        return key

    try:
        keys = await asyncio.gather(*(put(client, data) for client, data in zip(clients, blobs, strict=True)))
    finally:
        for client in clients:
            await client.aclose()
    assert keys == [blake3.blake3(data).hexdigest() for data in blobs]
    assert server.committer.batches < len(blobs)  # they shared flushes
    layout = server.storage.layout
    for key in keys:
        answered = disk.index("mark", key)
        linked = disk.index("link", layout.content(bytes.fromhex(key)))
        # A small PUT is durable by its batch's journal append, before its names are made.
        assert any(append < linked < answered for append in disk.journal_appends())
    assert len(disk.journal_appends()) == server.committer.batches


async def test_publications_of_one_loop_iteration_share_a_flush(storage: BlobStorage) -> None:
    """What the reader callbacks of several connections made readable together rely on."""
    committer = GroupCommitter(storage)
    items = [staged(storage, os.urandom(64), whole=True) for _ in range(3)]
    keys = await asyncio.gather(*(committer.publish(item.upload, None, item.digest) for item in items))
    assert keys == [item.digest for item in items]
    assert committer.batches == 1


async def test_a_flush_that_raises_fails_its_whole_batch_and_the_next_one_still_runs(
    storage: BlobStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Disk errors come back as results (above); this mock stands for a bug inside
    ``publish_batch`` itself, which a real disk cannot provoke."""
    committer = GroupCommitter(storage)
    publish_batch = storage.publish_batch

    def broken_once(batch: list[Publication]) -> list[bytes | Exception]:
        monkeypatch.setattr(storage, "publish_batch", publish_batch)
        raise ValueError("a bug")

    monkeypatch.setattr(storage, "publish_batch", broken_once)
    first = staged(storage, b"in the broken flush", whole=True)
    failed = committer.publish(first.upload, None, first.digest)
    await asyncio.sleep(0)  # its flush begins, alone, at the loop's next iteration
    queued = [staged(storage, os.urandom(64), in_memory=True) for _ in range(2)]
    published = [committer.publish(item.upload, None, item.digest) for item in queued]  # the next batch
    with pytest.raises(ValueError, match="a bug"):
        await failed
    assert await asyncio.gather(*published) == [item.digest for item in queued]
    assert committer.batches == 2
    first.upload.discard()


async def test_a_publication_after_the_executor_shut_down_fails_at_once(storage: BlobStorage) -> None:
    """Never a future nobody resolves: at the loop's end the executor refuses new work."""
    await asyncio.get_running_loop().shutdown_default_executor()
    item = staged(storage, b"too late", whole=True)
    with pytest.raises(RuntimeError, match="shutdown"):
        await asyncio.wait_for(GroupCommitter(storage).publish(item.upload, None, item.digest), 5)
    item.upload.discard()


def test_a_link_is_flushed_before_it_returns(storage: BlobStorage, disk: DiskCalls) -> None:
    """LINK publishes a name without a PUT, so it flushes that name itself."""
    (key,) = storage.publish_batch([staged(storage, b"linked")])
    assert isinstance(key, bytes)
    disk.calls.clear()
    storage.link(key, JobBlob(JOB, "alias"))
    disk.mark("returned")
    name = storage.layout.job_blob(JOB, "alias")
    returned = disk.index("mark", "returned")
    assert disk.index("replace", name) < disk.last("fsync", name.parent) < returned
    assert disk.last("fsync", storage.layout.objects) < returned


RACE_SECONDS = 30.0


@pytest.mark.slow
async def test_puts_racing_deletions_of_their_job_all_land_and_none_is_an_internal_error(
    spawn_server: Callable[..., ServerProcess],
) -> None:
    """docs/protocol.md, "A PUT racing a job deletion": six connections PUT into one job
    (small blobs journaled, large ones flushed) while two delete the whole job and two GET
    and LIST it, for half a minute; content PUTs and another job's PUTs share their batches.
    Every PUT is acknowledged, as if each deletion came before or after it; nothing is
    answered INTERNAL or logs a traceback; the server's directory ends consistent."""
    server = spawn_server()
    assert server.process.stderr is not None
    log: list[str] = []  # read as it comes, so that a full pipe never stalls the server
    reader = threading.Thread(target=lambda: log.extend(server.process.stderr or ()), daemon=True)
    reader.start()
    other = bytes(range(16, 32))
    outcomes: dict[str, list[BaseException]] = {"job": [], "others": [], "reads": []}
    counts = {"job": 0, "others": 0, "deletions": 0}
    deadline = time.monotonic() + RACE_SECONDS

    async def put(kind: str, job: bytes | None, prefix: str) -> None:
        async with AsyncBlobClient(server.address, timeout=30, retries=0) as client:
            for n in itertools.count():
                if time.monotonic() > deadline:
                    return
                data = os.urandom(1000 if n % 2 else 100_000)  # journaled, then flushed
                try:
                    await client.put(data, job=job, name=None if job is None else f"{prefix}-{n % 3}")
                    counts[kind] += 1
                except BlobError as exc:
                    outcomes[kind].append(exc)

    async def delete_job() -> None:
        async with AsyncBlobClient(server.address, timeout=30, retries=0) as client:
            while time.monotonic() < deadline:
                await client.delete_job(JOB)
                counts["deletions"] += 1

    async def read_job(worker: int) -> None:
        async with AsyncBlobClient(server.address, timeout=30, retries=0) as client:
            while time.monotonic() < deadline:
                try:
                    await client.list(JOB)
                    await client.get(job=JOB, name=f"w{worker}-0")
                except NotFound:
                    pass
                except BlobError as exc:
                    outcomes["reads"].append(exc)

    await asyncio.gather(
        *(put("job", JOB, f"w{worker}") for worker in range(6)),
        put("others", None, ""),
        put("others", other, "n"),
        delete_job(),
        delete_job(),
        read_job(0),
        read_job(1),
    )
    async with AsyncBlobClient(server.address, timeout=30, retries=0) as client:
        await client.put(b"after the race", job=JOB, name="last")
        assert await client.get(job=JOB, name="last") == b"after the race"
    assert server.terminate() == 0
    reader.join(10)
    internal = sum(isinstance(exc, InternalError) for errors in outcomes.values() for exc in errors)
    print(f"{counts}, {internal} INTERNAL")
    assert outcomes == {"job": [], "others": [], "reads": []}, f"{internal} INTERNAL of {counts}"
    assert not [line for line in log if "Traceback" in line or "internal error" in line], "".join(log[-40:])
    assert counts["job"] > 100 and counts["deletions"] > 100
    storage = BlobStorage(server.data_dir)
    report = storage.recover()
    storage.close()
    assert (report.removed_orphans, report.removed_stray, report.removed_corrupt) == (0, [], [])
