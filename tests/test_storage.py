"""BlobStorage on real directories: one test per promise of its module docstring."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import blake3
import pytest

from blobsvc import DigestMismatch, NotFound
from blobsvc.files._layout import decode_name, encode_name
from blobsvc.storage import BlobStorage
from blobsvc.wire._protocol import ContentKey, JobBlob, WholeJob

from .conftest import put_streamed as put
from .conftest import read_blob as read

JOB = bytes(range(16))
OTHER_JOB = bytes(range(1, 17))


def files(directory: Path) -> list[Path]:
    """The files under ``directory`` but the journal's segments, which are always there."""
    return [p for p in directory.rglob("*") if p.is_file() and p.parent.name != "journal"]


# 1. Nothing partial is ever visible.


def test_a_blob_is_invisible_until_published(storage: BlobStorage) -> None:
    data = b"partial" * 1000
    key = blake3.blake3(data).digest()
    with storage.stage() as upload:
        upload.write(data[:100])
        with pytest.raises(NotFound):
            storage.open_blob(ContentKey(key))
        upload.write(data[100:])
        storage.publish(upload, None, key)
    assert read(storage, ContentKey(key)) == data


def test_a_wrong_digest_stores_nothing(storage: BlobStorage) -> None:
    with storage.stage() as upload, pytest.raises(DigestMismatch):
        upload.write(b"abc")
        storage.publish(upload, JobBlob(JOB, "x"), bytes(32))
    assert storage.list_job(JOB) == []
    assert files(storage.layout.root) == []


# 2. One copy per distinct content.


def test_identical_content_is_stored_once_under_every_kind_of_name(storage: BlobStorage) -> None:
    data = os.urandom(10_000)
    key = put(storage, data)
    assert put(storage, data) == key
    assert put(storage, data, JobBlob(JOB, "a")) == key
    assert put(storage, data, JobBlob(OTHER_JOB, "b")) == key
    assert [p.name for p in files(storage.layout.objects)] == [key.hex()]
    inodes = {p.stat().st_ino for p in files(storage.layout.root)}
    assert len(inodes) == 1


def test_racing_uploads_of_the_same_bytes_leave_one_copy(storage: BlobStorage) -> None:
    data = os.urandom(200_000)
    barrier = threading.Barrier(8)

    def upload(index: int) -> None:
        barrier.wait()
        put(storage, data, JobBlob(JOB, f"copy-{index}") if index % 2 else None)

    threads = [threading.Thread(target=upload, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(files(storage.layout.objects)) == 1
    assert len(storage.list_job(JOB)) == 4


# 3. No staging file outlives its upload.


def test_abandoned_and_duplicate_uploads_remove_their_staging_files(storage: BlobStorage) -> None:
    with storage.stage() as upload:
        upload.write(b"never finished")
    put(storage, b"dup")
    put(storage, b"dup")
    assert list(storage.layout.incoming.iterdir()) == []


# 4. Names are independent.


def test_replacing_a_job_name_is_atomic_and_frees_the_old_bytes(storage: BlobStorage) -> None:
    put(storage, b"v1", JobBlob(JOB, "jar"))
    put(storage, b"v2", JobBlob(JOB, "jar"))
    assert read(storage, JobBlob(JOB, "jar")) == b"v2"
    assert [p.name for p in files(storage.layout.objects)] == [blake3.blake3(b"v2").hexdigest()]


def test_deleting_content_keeps_a_job_blob_with_the_same_bytes(storage: BlobStorage) -> None:
    key = put(storage, b"shared")
    put(storage, b"shared", JobBlob(JOB, "s"))
    storage.delete(ContentKey(key))
    with pytest.raises(NotFound):
        storage.open_blob(ContentKey(key))
    assert read(storage, JobBlob(JOB, "s")) == b"shared"
    storage.delete(JobBlob(JOB, "s"))
    assert files(storage.layout.root) == []


def test_deleting_a_job_removes_only_that_job(storage: BlobStorage) -> None:
    put(storage, b"a", JobBlob(JOB, "a"))
    put(storage, b"b", JobBlob(JOB, "deep/" + "x" * 250))
    put(storage, b"c", JobBlob(OTHER_JOB, "a"))
    storage.delete(WholeJob(JOB))
    assert storage.list_job(JOB) == []
    assert not storage.layout.job_dir(JOB).exists()
    assert read(storage, JobBlob(OTHER_JOB, "a")) == b"c"
    assert len(files(storage.layout.objects)) == 1


def test_delete_of_what_does_not_exist_succeeds(storage: BlobStorage) -> None:
    storage.delete(ContentKey(bytes(32)))
    storage.delete(JobBlob(JOB, "nothing"))
    storage.delete(WholeJob(JOB))


@pytest.mark.parametrize("name", ["..", ".", "a/b", "/x", "../../etc/passwd", "é" * 127, "n" * 255, "~", "a~"])
def test_every_valid_name_stays_inside_its_job_directory(storage: BlobStorage, name: str) -> None:
    put(storage, name.encode(), JobBlob(JOB, name))
    job_dir = storage.layout.job_dir(JOB)
    (stored,) = files(job_dir)
    assert stored.resolve().is_relative_to(job_dir.resolve())
    assert decode_name(stored.relative_to(job_dir)) == name
    assert [e.name for e in storage.list_job(JOB)] == [name]


def test_a_long_name_and_its_prefix_do_not_collide(storage: BlobStorage) -> None:
    short = "p" * 150  # encodes to exactly one 200-character component
    assert len(encode_name(short).parts) == 1
    put(storage, b"short", JobBlob(JOB, short))
    put(storage, b"long", JobBlob(JOB, short + "q"))
    assert read(storage, JobBlob(JOB, short)) == b"short"
    assert read(storage, JobBlob(JOB, short + "q")) == b"long"


# 5. Start-up repairs.


def test_recovery_clears_staging_and_keeps_good_blobs(storage: BlobStorage) -> None:
    key = put(storage, b"good")
    put(storage, b"job", JobBlob(JOB, "j"))
    (storage.layout.incoming / "upload-crashed").write_bytes(b"half")
    fresh = BlobStorage(storage.layout.root)
    report = fresh.recover()
    assert report.removed_staging == 1
    assert (report.content_blobs, report.job_blobs, report.objects) == (1, 1, 2)
    assert read(fresh, ContentKey(key)) == b"good"
    assert read(fresh, JobBlob(JOB, "j")) == b"job"


def test_recovery_removes_corrupt_blobs_and_every_name_sharing_them(storage: BlobStorage) -> None:
    key = put(storage, b"will rot")
    put(storage, b"will rot", JobBlob(JOB, "rot"))
    healthy = put(storage, b"healthy")
    with open(storage.layout.object(key), "r+b") as f:
        f.write(b"W")
    fresh = BlobStorage(storage.layout.root)
    report = fresh.recover()
    assert len(report.removed_corrupt) == 3
    with pytest.raises(NotFound):
        fresh.open_blob(ContentKey(key))
    assert fresh.list_job(JOB) == []
    assert read(fresh, ContentKey(healthy)) == b"healthy"


def test_recovery_adopts_a_good_name_whose_object_is_missing(storage: BlobStorage) -> None:
    key = put(storage, b"orphaned name", JobBlob(JOB, "n"))
    storage.layout.object(key).unlink()
    fresh = BlobStorage(storage.layout.root)
    fresh.recover()
    assert read(fresh, JobBlob(JOB, "n")) == b"orphaned name"
    assert fresh.layout.object(key).exists()


def test_recovery_removes_strays_and_orphaned_objects(storage: BlobStorage) -> None:
    key = put(storage, b"x")
    storage.layout.content(key).unlink()  # the object is now referenced by nothing
    (storage.layout.objects / "not-a-key").write_bytes(b"?")
    (storage.layout.cache / ("0" * 64)).write_bytes(b"does not hash to zeros")
    storage.layout.job_dir(JOB).mkdir()
    (storage.layout.job_dir(JOB) / "!!not base64").write_bytes(b"?")
    (storage.layout.job_dir(JOB) / ".link-0123").write_bytes(b"?")
    report = BlobStorage(storage.layout.root).recover()
    assert report.removed_orphans == 1
    assert files(storage.layout.root) == []
    assert len(report.removed_stray) == 3 and len(report.removed_corrupt) == 1


def test_recovery_removes_an_object_whose_only_names_were_removed_as_strays_or_corrupt(
    storage: BlobStorage,
) -> None:
    """Such an object had links when its directory was read; it is an orphan only after."""
    first, second = put(storage, b"first"), put(storage, b"second")
    content = storage.layout.content(first)
    os.rename(content, storage.layout.cache / ".link-crashed")  # a publication's temp name
    os.rename(storage.layout.content(second), storage.layout.cache / ("f" * 64))  # a name of another key
    report = BlobStorage(storage.layout.root).recover()
    assert report.removed_orphans == 2
    assert report.objects == 0 and report.bytes == 0
    assert files(storage.layout.root) == []


def test_recovery_reports_the_objects_it_keeps_and_their_bytes(storage: BlobStorage) -> None:
    put(storage, b"a" * 10)
    put(storage, b"b" * 20, JobBlob(JOB, "b"))
    report = BlobStorage(storage.layout.root).recover()
    assert (report.objects, report.bytes, report.content_blobs, report.job_blobs) == (2, 30, 1, 1)


def test_recovery_without_verification_counts_no_bytes_and_still_finds_orphans(storage: BlobStorage) -> None:
    """Counting bytes would stat every object; a start without rehashing skips it."""
    kept, orphan = put(storage, b"kept"), put(storage, b"orphan")
    storage.layout.content(orphan).unlink()
    report = BlobStorage(storage.layout.root, verify_on_start=False).recover()
    assert report.bytes is None
    assert (report.objects, report.content_blobs, report.removed_orphans) == (1, 1, 1)
    assert storage.layout.object(kept).exists() and not storage.layout.object(orphan).exists()


def test_a_start_without_verification_counts_bytes_while_serving(storage: BlobStorage) -> None:
    kept, dropped = put(storage, b"k" * 10), put(storage, b"d" * 20)
    fresh = BlobStorage(storage.layout.root, verify_on_start=False)
    assert fresh.recover().bytes is None
    fresh.delete(ContentKey(dropped))  # perhaps before its size was counted: never below zero
    for _ in range(500):
        if fresh.usage() == (1, 10):
            break
        time.sleep(0.01)
    assert fresh.usage() == (1, 10)
    assert read(fresh, ContentKey(kept)) == b"k" * 10
