"""The journal of small publications, and the promises of :mod:`blobsvc.storage._journal`, one by one.

Real files throughout. A power cut cannot be made here: the tests that stand for one say
so, and make its effect by hand (an object's bytes or a name that never reached the disk)
before the next start.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import zlib
from pathlib import Path

import blake3
import pytest

from blobsvc import NotFound
from blobsvc.storage import BlobStorage, Publication, _journal
from blobsvc.storage._journal import Journal, Record
from blobsvc.wire._protocol import ContentKey, JobBlob, WholeJob

from .conftest import put_streamed, read_blob

JOB = bytes(range(16))


def record(data: bytes, name: str | None = None) -> Record:
    return Record(blake3.blake3(data).digest(), None if name is None else JobBlob(JOB, name), data)


def started(directory: Path, segment_bytes: int = 1 << 20) -> Journal:
    journal = Journal(directory, segment_bytes=segment_bytes)
    journal.replay()
    journal.restart()
    return journal


def reopened(directory: Path) -> list[Record]:
    """What a start after a crash replays: the journal written to is still open, as a crash
    leaves it (closing it would checkpoint)."""
    journal = Journal(directory)
    try:
        return journal.replay()
    finally:
        journal.close()


# --- the journal alone --------------------------------------------------------------------


def test_records_come_back_whole_and_in_the_order_written(tmp_path: Path) -> None:
    journal = started(tmp_path)
    batches = [[record(os.urandom(100)), record(b"named", "a/b")], [record(b"")], [record(os.urandom(5000), "c")]]
    for batch in batches:
        journal.release(journal.append(batch))
    assert reopened(tmp_path) == [item for batch in batches for item in batch]
    journal.close()


@pytest.mark.parametrize("damage", ["cut short", "body changed", "header changed"])
def test_replay_stops_at_a_torn_append(tmp_path: Path, damage: str) -> None:
    """Rule 5: a crash in mid-append leaves a record that was never acknowledged."""
    journal = started(tmp_path)
    first, torn = record(b"acknowledged"), record(os.urandom(1000), "torn")
    journal.release(journal.append([first]))
    journal.release(journal.append([torn]))
    start = 4096 + len(first.encode(0))  # the torn record's, after the header block
    end = start + len(torn.encode(0))
    with open(tmp_path / "0", "r+b") as file:
        if damage == "cut short":
            file.truncate(end - 10)
        else:
            offset = end - 20 if damage == "body changed" else start + 20
            file.seek(offset)
            byte = file.read(1)
            file.seek(offset)
            file.write(bytes([byte[0] ^ 1]))
    assert reopened(tmp_path) == [first]
    journal.close()


def test_a_cleared_segment_replays_nothing_of_its_last_round(tmp_path: Path) -> None:
    """Rule 3: segments take turns; a checkpointed one is reused, its old records ignored."""
    journal = started(tmp_path, segment_bytes=16 << 10)
    written = [record(os.urandom(3000)) for _ in range(20)]  # about 4 records a segment
    for item in written:
        journal.release(journal.append([item]))
    assert journal.checkpoints >= 3
    replayed = reopened(tmp_path)
    assert replayed and replayed == written[-len(replayed) :]
    assert len(replayed) <= 8  # no more than two segments' worth
    journal.close()


def test_a_batch_larger_than_a_segment_is_refused_and_nothing_of_it_counts(tmp_path: Path) -> None:
    journal = started(tmp_path, segment_bytes=16 << 10)
    with pytest.raises(ValueError, match="do not fit in one journal segment"):
        journal.append([record(os.urandom(5000)) for _ in range(4)])
    assert reopened(tmp_path) == []
    journal.close()


def test_settle_returns_once_no_record_of_the_mark_is_left(tmp_path: Path) -> None:
    journal = started(tmp_path)
    content, named = record(b"content"), record(b"named", "n")
    journal.release(journal.append([content, named]))
    assert journal.holds(content.key) and journal.holds(JOB) and journal.holds((JOB, "n"))
    assert not journal.holds((JOB, "other"))
    journal.settle((JOB, "n"))
    assert not any(journal.holds(mark) for mark in (content.key, JOB, (JOB, "n")))
    assert journal.checkpoints == 1
    assert reopened(tmp_path) == []
    journal.close()


def test_a_segment_is_cleared_only_after_its_file_system_is_synced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rule 3. ``syncfs`` runs through ctypes, which no wrapper of ``os.*`` sees, and a
    power cut cannot be made here: the test wraps the journal's own call and records it
    next to each segment's reset (the write of its header)."""
    calls: list[str] = []
    sync, write = _journal._sync_file_system, os.pwrite

    def recording_sync(fd: int) -> None:
        sync(fd)
        calls.append("syncfs")

    def recording_pwrite(fd: int, data: bytes, offset: int) -> int:
        if offset == 0 and data.startswith(b"BSJ1"):
            calls.append("reset")
        return write(fd, data, offset)

    journal = started(tmp_path)
    monkeypatch.setattr(_journal, "_sync_file_system", recording_sync)
    monkeypatch.setattr(os, "pwrite", recording_pwrite)
    for _ in range(3):
        written = record(os.urandom(3000))
        journal.release(journal.append([written]))
        journal.settle(written.key)  # a checkpoint of the segment holding it
    assert journal.checkpoints == 3
    journal.close()
    resets = [i for i, call in enumerate(calls) if call == "reset"]
    assert len(resets) >= 3
    for count, index in enumerate(resets, start=1):
        assert calls[:index].count("syncfs") >= count, f"reset {count} came before its syncfs: {calls}"


def write_segment(path: Path, generation: int, records: list[Record]) -> None:
    """A segment file as the journal leaves it: its header block, then its records."""
    head = _journal._SEGMENT_MAGIC + generation.to_bytes(8, "little")
    head += zlib.crc32(head).to_bytes(4, "little")
    path.write_bytes(head.ljust(_journal._HEADER_BYTES, b"\0") + b"".join(r.encode(generation) for r in records))


def test_replay_takes_both_segments_in_generation_order_not_file_order(tmp_path: Path) -> None:
    """Rules 2 and 5 across a swap: a crash can leave records in both segments, the older
    generation in the second file. Built by hand, since which file a crash leaves newer
    depends on how many swaps came before."""
    older, newer = record(b"first version", "model"), record(b"second version", "model")
    content = record(b"content in the older segment")
    data = tmp_path / "data"
    (data / "journal").mkdir(parents=True)
    write_segment(data / "journal" / "1", 7, [content, older])
    write_segment(data / "journal" / "0", 8, [newer])
    storage = BlobStorage(data)
    assert storage.recover().replayed == 3
    assert read_blob(storage, JobBlob(JOB, "model")) == b"second version"
    assert read_blob(storage, ContentKey(content.key)) == content.body
    storage.close()


# --- the storage's promises, kept through the journal ---------------------------------------


def publish_small(storage: BlobStorage, data: bytes, target: JobBlob | None = None) -> bytes:
    """Publish ``data`` as a small PUT is: held in memory, so journaled."""
    (key,) = storage.publish_batch([small(storage, data, target)])
    assert isinstance(key, bytes)
    return key


def small(storage: BlobStorage, data: bytes, target: JobBlob | None = None) -> Publication:
    return Publication(storage.stage_body(bytearray(data)), target, blake3.blake3(data).digest())


def restarted(storage: BlobStorage) -> BlobStorage:
    """The next start on the same directory, after a crash: the journal was never closed."""
    fresh = BlobStorage(storage.layout.root)
    fresh.recover()
    return fresh


def test_replay_restores_small_blobs_whose_bytes_and_names_never_reached_the_disk(storage: BlobStorage) -> None:
    """Rule 2. Stands for a power cut: nothing here can drop the page cache, so the test
    takes away by hand what a cut could have lost, as the journal has no checkpoint yet."""
    blobs = {f"blob-{i}": os.urandom(2000 + i) for i in range(6)}
    named = {name: i % 2 == 1 for i, name in enumerate(blobs)}
    keys = {
        name: publish_small(storage, data, JobBlob(JOB, name) if named[name] else None) for name, data in blobs.items()
    }
    targets = {name: JobBlob(JOB, name) if named[name] else ContentKey(keys[name]) for name in blobs}
    layout = storage.layout
    os.truncate(layout.object(keys["blob-0"]), 0)  # its bytes never written back
    layout.content(keys["blob-2"]).unlink()  # its name never reached the disk
    layout.job_blob(JOB, "blob-1").unlink()
    with open(layout.object(keys["blob-3"]), "r+b") as file:  # half written back
        file.write(bytes(1000))
    layout.object(keys["blob-5"]).unlink()  # neither its object's name ...
    layout.job_blob(JOB, "blob-5").unlink()  # ... nor its own

    fresh = restarted(storage)
    report = fresh.recover()  # a second start: the first cleared the journal
    assert report.replayed == 0
    for name, data in blobs.items():
        assert read_blob(fresh, targets[name]) == data
    fresh.close()


def test_a_start_reports_what_it_replayed_and_repaired(storage: BlobStorage) -> None:
    keys = [publish_small(storage, os.urandom(100)) for _ in range(3)]
    storage.layout.content(keys[0]).unlink()  # stands for a name a power cut lost
    fresh = BlobStorage(storage.layout.root)
    report = fresh.recover()
    assert (report.replayed, report.repaired) == (3, 1)
    fresh.close()


@pytest.mark.parametrize(
    ("deleted", "gone"),
    [
        (ContentKey(blake3.blake3(b"deleted").digest()), ContentKey(blake3.blake3(b"deleted").digest())),
        (JobBlob(JOB, "n"), JobBlob(JOB, "n")),
        (WholeJob(JOB), JobBlob(JOB, "n")),
    ],
    ids=["content", "job name", "whole job"],
)
def test_a_small_blob_deleted_after_it_was_journaled_does_not_come_back(
    storage: BlobStorage, deleted: ContentKey | JobBlob | WholeJob, gone: ContentKey | JobBlob
) -> None:
    """Rule 4: without the checkpoint the deletion waits for, replay would bring it back."""
    publish_small(storage, b"deleted")
    publish_small(storage, b"deleted", JobBlob(JOB, "n"))
    storage.delete(deleted)
    fresh = restarted(storage)
    with pytest.raises(NotFound):
        fresh.open_blob(gone)
    fresh.close()


def test_a_name_replaced_by_a_large_upload_keeps_the_large_one_after_a_crash(storage: BlobStorage) -> None:
    publish_small(storage, b"small, first", JobBlob(JOB, "model"))
    put_streamed(storage, b"large, second" * 1000, JobBlob(JOB, "model"))
    fresh = restarted(storage)
    assert read_blob(fresh, JobBlob(JOB, "model")) == b"large, second" * 1000
    fresh.close()


def test_a_name_replaced_by_a_link_keeps_the_link_after_a_crash(storage: BlobStorage) -> None:
    publish_small(storage, b"small, first", JobBlob(JOB, "model"))
    key = put_streamed(storage, b"linked, second" * 1000)
    storage.link(key, JobBlob(JOB, "model"))
    fresh = restarted(storage)
    assert read_blob(fresh, JobBlob(JOB, "model")) == b"linked, second" * 1000
    fresh.close()


def test_small_blobs_survive_many_checkpoints_and_a_crash(tmp_path: Path) -> None:
    storage = BlobStorage(tmp_path / "data", journal_segment_bytes=32 << 10)
    storage.recover()
    blobs = [os.urandom(1500) for _ in range(100)]
    for start in range(0, len(blobs), 5):
        batch = [small(storage, data) for data in blobs[start : start + 5]]
        assert storage.publish_batch(batch) == [item.digest for item in batch]
    assert storage.journal.checkpoints >= 5
    fresh = restarted(storage)
    for data in blobs:
        assert read_blob(fresh, ContentKey(blake3.blake3(data).digest())) == data
    fresh.close()
    storage.close()


def test_a_clean_stop_checkpoints_so_the_next_start_replays_nothing(storage: BlobStorage) -> None:
    key = publish_small(storage, b"kept")
    storage.close()
    fresh = BlobStorage(storage.layout.root)
    assert fresh.recover().replayed == 0
    assert read_blob(fresh, ContentKey(key)) == b"kept"
    fresh.close()


def test_replay_after_a_crash_changes_nothing_concurrent_work_left_visible(tmp_path: Path) -> None:
    """Rules 2 and 4 under races: threads publish small and large blobs, link and delete the
    same few names at once, across many checkpoints. A crash that loses no page cache (the
    storage is abandoned, not closed) must leave every name as it was: replay may repair,
    never undo."""
    storage = BlobStorage(tmp_path / "data", journal_segment_bytes=64 << 10)
    storage.recover()
    names = [f"n{i}" for i in range(4)]
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            operate(random.Random(seed))
        except BaseException as exc:
            errors.append(exc)

    def operate(chance: random.Random) -> None:
        for _ in range(150):
            name, data = chance.choice(names), chance.choice([b"a", b"b", b"c"]) * chance.choice([10, 3000])
            target = JobBlob(JOB, name)
            action = chance.randrange(6)
            if action == 0:
                publish_small(storage, data, target)
            elif action == 1:
                put_streamed(storage, data, target)
            elif action == 2:
                storage.delete(target)
            elif action == 3:
                publish_small(storage, data)
            elif action == 4:
                storage.delete(ContentKey(blake3.blake3(data).digest()))
            else:
                with contextlib.suppress(NotFound):
                    storage.link(blake3.blake3(data).digest(), target)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert storage.journal.checkpoints > 0

    def visible(store: BlobStorage) -> tuple[dict[str, bytes], set[str]]:
        named = {entry.name: read_blob(store, JobBlob(JOB, entry.name)) for entry in store.list_job(JOB)}
        return named, set(os.listdir(store.layout.cache))

    before = visible(storage)
    fresh = restarted(storage)
    assert visible(fresh) == before
    fresh.close()
    storage.close()
