"""The FileSystemBlobStore's promises, on a local directory, on fsspec ``file://`` and on
fsspec's in-memory filesystem: content-addressed, durable names, collection with the last
name, and digest-verified reads that never serve a damaged copy."""

from __future__ import annotations

import contextlib
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import BlobStorage, DigestMismatch, NotLeader
from blobsvc.ha import FileSystemBlobStore, open_blob_store
from blobsvc.ha.store import _name_hash
from blobsvc.wire._protocol import ContentKey, JobBlob, WholeJob


@pytest.fixture(params=["directory", "file-url", "memory-url"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FileSystemBlobStore]:
    if request.param == "directory":
        yield open_blob_store(tmp_path / "ha")
    elif request.param == "file-url":
        yield open_blob_store(f"file://{tmp_path}/ha")
    else:
        root = f"memory://blobsvc-test-{secrets.token_hex(4)}"
        yield open_blob_store(root)
        files = open_blob_store(root).files
        with contextlib.suppress(FileNotFoundError):
            files.fs.rm(files.root, recursive=True)  # type: ignore[attr-defined]


def _source(tmp_path: Path, data: bytes) -> tuple[Path, bytes]:
    path = tmp_path / f"src-{secrets.token_hex(4)}"
    path.write_bytes(data)
    return path, blake3.blake3(data).digest()


def _fetch(store: FileSystemBlobStore, target: ContentKey | JobBlob) -> tuple[bytes | None, bytes]:
    chunks: list[bytes] = []
    key = store.fetch(target, chunks.append)
    return key, b"".join(chunks)


JOB = bytes(range(16))


def test_a_content_blob_reads_back_verified(store: FileSystemBlobStore, tmp_path: Path) -> None:
    path, key = _source(tmp_path, b"hello" * 1000)
    store.put(path, key, None)
    assert _fetch(store, ContentKey(key)) == (key, b"hello" * 1000)
    assert store.count() == 1


def test_a_missing_blob_is_none_not_an_error(store: FileSystemBlobStore) -> None:
    assert store.fetch(ContentKey(bytes(32)), lambda _: None) is None
    assert store.fetch(JobBlob(JOB, "absent"), lambda _: None) is None


def test_names_share_one_copy_of_identical_content(store: FileSystemBlobStore, tmp_path: Path) -> None:
    path, key = _source(tmp_path, b"shared bytes")
    store.put(path, key, None)
    store.put(path, key, JobBlob(JOB, "a.jar"))
    store.put(path, key, JobBlob(bytes(16), "b.jar"))
    assert store.count() == 1
    assert _fetch(store, JobBlob(JOB, "a.jar")) == (key, b"shared bytes")
    assert sorted(store.names(JOB)) == ["a.jar"]


def test_replacing_a_name_collects_the_old_bytes(store: FileSystemBlobStore, tmp_path: Path) -> None:
    old, old_key = _source(tmp_path, b"version 1")
    new, new_key = _source(tmp_path, b"version 2")
    store.put(old, old_key, JobBlob(JOB, "model"))
    store.put(new, new_key, JobBlob(JOB, "model"))
    assert _fetch(store, JobBlob(JOB, "model")) == (new_key, b"version 2")
    assert store.count() == 1


def test_bytes_go_with_their_last_name_only(store: FileSystemBlobStore, tmp_path: Path) -> None:
    path, key = _source(tmp_path, b"twice named")
    store.put(path, key, None)
    store.put(path, key, JobBlob(JOB, "x"))
    store.delete(ContentKey(key))
    assert store.fetch(ContentKey(key), lambda _: None) is None
    assert _fetch(store, JobBlob(JOB, "x")) == (key, b"twice named")
    store.delete(JobBlob(JOB, "x"))
    assert store.count() == 0


def test_deleting_a_job_deletes_all_its_names(store: FileSystemBlobStore, tmp_path: Path) -> None:
    for name in ("a", "b/c", "..", "é" * 100):
        path, key = _source(tmp_path, name.encode() * 3)
        store.put(path, key, JobBlob(JOB, name))
    assert len(store.names(JOB)) == 4
    store.delete(WholeJob(JOB))
    assert store.names(JOB) == []
    assert store.count() == 0
    store.delete(WholeJob(JOB))  # what is gone is already deleted


def test_a_damaged_copy_is_detected_never_served_and_rewritten_by_the_next_put(
    store: FileSystemBlobStore, tmp_path: Path
) -> None:
    data = secrets.token_bytes(100_000)
    path, key = _source(tmp_path, data)
    store.put(path, key, JobBlob(JOB, "weights"))
    object_path = f"objects/{key.hex()[:2]}/{key.hex()}/data"
    damaged = bytearray(data)
    damaged[50_000] ^= 0xFF
    store.files.write_bytes(object_path, bytes(damaged))
    with pytest.raises(DigestMismatch, match="damaged"):
        _fetch(store, JobBlob(JOB, "weights"))
    assert store.files.listdir("corrupt"), "the damaged copy is kept aside for an operator"
    store.put(path, key, JobBlob(JOB, "weights"))
    assert _fetch(store, JobBlob(JOB, "weights")) == (key, data)


def test_a_partial_copy_is_rewritten_by_the_next_put(store: FileSystemBlobStore, tmp_path: Path) -> None:
    data = secrets.token_bytes(10_000)
    path, key = _source(tmp_path, data)
    store.files.write_bytes(f"objects/{key.hex()[:2]}/{key.hex()}/data", data[:5000])  # a write that died
    store.put(path, key, None)
    assert _fetch(store, ContentKey(key)) == (key, data)


def records(store: FileSystemBlobStore, name: str) -> list[str]:
    """The paths of a name's records in the store, oldest first."""
    (name_dir,) = [entry for entry in store.files.listdir(f"names/{JOB.hex()}") if entry == _name_hash(name)]
    return [
        f"names/{JOB.hex()}/{name_dir}/{entry}"
        for entry in sorted(store.files.listdir(f"names/{JOB.hex()}/{name_dir}"))
    ]


def test_a_damaged_name_record_is_refused(store: FileSystemBlobStore, tmp_path: Path) -> None:
    path, key = _source(tmp_path, b"x")
    store.put(path, key, JobBlob(JOB, "n"))
    (record,) = records(store, "n")
    store.files.write_bytes(record, b"not a key")
    with pytest.raises(DigestMismatch, match="record"):
        _fetch(store, JobBlob(JOB, "n"))


def test_a_name_record_of_the_earlier_layout_is_read_until_the_next_write_replaces_it(
    store: FileSystemBlobStore, tmp_path: Path
) -> None:
    """A store written before records were never overwritten: ``jobs/<job>/<h>`` holds the
    name's one record (here of epoch 5), read as the oldest record of its epoch."""
    first, first_key = _source(tmp_path, b"written by an earlier blobsvc")
    k, h = first_key.hex(), _name_hash("n")
    store.files.write_file(f"objects/{k[:2]}/{k}/data", first, marker=f"{JOB.hex()}-{h}")
    store.files.write_bytes(f"jobs/{JOB.hex()}/{h}", f"{k}\n5\nn".encode())
    assert store.names(JOB) == ["n"]
    assert _fetch(store, JobBlob(JOB, "n")) == (first_key, b"written by an earlier blobsvc")
    second, second_key = _source(tmp_path, b"written now")
    with pytest.raises(NotLeader, match="newer leader"):
        store.put(second, second_key, JobBlob(JOB, "n"), epoch=4)
    store.put(second, second_key, JobBlob(JOB, "n"), epoch=5)
    assert _fetch(store, JobBlob(JOB, "n")) == (second_key, b"written now")
    assert store.files.size(f"jobs/{JOB.hex()}/{h}") is None and store.count() == 1
    # As a crash leaves it between a write's new record and its removal of the earlier one:
    store.files.write_bytes(f"jobs/{JOB.hex()}/{h}", f"{k}\n5\nn".encode())
    store.delete(WholeJob(JOB))
    assert store.names(JOB) == [] and store.files.size(f"jobs/{JOB.hex()}/{h}") is None


def test_a_damaged_newest_record_is_a_write_that_never_finished(store: FileSystemBlobStore, tmp_path: Path) -> None:
    """On a store without atomic writes a crash can leave a record cut short; it was never
    acknowledged, and older ones are removed only once a newer one is whole."""
    path, key = _source(tmp_path, b"acknowledged")
    store.put(path, key, JobBlob(JOB, "n"), epoch=3)
    (record,) = records(store, "n")
    store.files.write_bytes(record.replace("-0000000000000000", "-0000000000000001"), key.hex()[:20].encode())
    assert _fetch(store, JobBlob(JOB, "n")) == (key, b"acknowledged")
    assert store.names(JOB) == ["n"]


def test_a_name_keeps_its_record_until_a_newer_one_is_durable(
    store: FileSystemBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write of a record that fails (a fault hook: a real store cannot be made to fail
    one write on demand) leaves the name as it was; one that succeeds leaves it alone."""
    first, first_key = _source(tmp_path, b"first")
    second, second_key = _source(tmp_path, b"second")
    store.put(first, first_key, JobBlob(JOB, "n"), epoch=1)

    def failing(path: str, data: bytes) -> None:
        raise OSError(f"injected failure writing {path}")

    with monkeypatch.context() as patch:
        patch.setattr(store.files, "create_bytes", failing)
        with pytest.raises(OSError, match="injected"):
            store.put(second, second_key, JobBlob(JOB, "n"), epoch=1)
    assert _fetch(store, JobBlob(JOB, "n")) == (first_key, b"first")
    store.put(second, second_key, JobBlob(JOB, "n"), epoch=2)
    assert len(records(store, "n")) == 1
    assert _fetch(store, JobBlob(JOB, "n")) == (second_key, b"second")
    assert store.count() == 1  # the first bytes went with their last record


def test_a_local_directory_store_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = open_blob_store(tmp_path / "ha")
    path, key = _source(tmp_path, b"durable")
    store.put(path, key, JobBlob(JOB, "n"))
    leftovers = [p for p in (tmp_path / "ha").rglob(".tmp-*")]
    assert leftovers == []


def test_a_crashed_name_record_write_leaves_no_debris_past_the_next_write(tmp_path: Path) -> None:
    """A server killed while writing a job's name record leaves its temporary file behind
    (written here as that crash leaves it); the next record written for the name removes it."""
    store = open_blob_store(tmp_path / "ha")
    path, key = _source(tmp_path, b"named")
    store.put(path, key, JobBlob(JOB, "first"))
    debris = tmp_path / "ha" / "names" / JOB.hex() / _name_hash("first") / ".tmp-0123456789abcdef"
    debris.write_bytes(f"{key.hex()}\n0\nnever acknowledged".encode())
    assert sorted(store.names(JOB)) == ["first"]
    other, other_key = _source(tmp_path, b"named again")
    store.put(other, other_key, JobBlob(JOB, "first"))  # the same key again would write no record
    assert not debris.exists()
    assert sorted(store.names(JOB)) == ["first"]


def test_a_name_written_again_with_its_key_writes_nothing_new(
    store: FileSystemBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkpoint LINKs every unchanged state file again: the leader's own record stands."""
    path, key = _source(tmp_path, b"state")
    store.put(path, key, JobBlob(JOB, "state"), epoch=3)
    written: list[str] = []

    def recorded(found: Any) -> Any:
        def write(path: str, *args: Any, **options: Any) -> Any:
            written.append(path)
            return found(path, *args, **options)

        return write

    for method in ("write_file", "write_bytes", "create_bytes", "remove"):
        monkeypatch.setattr(store.files, method, recorded(getattr(store.files, method)))
    store.put(path, key, JobBlob(JOB, "state"), epoch=3)
    assert written == []
    store.put(path, key, JobBlob(JOB, "state"), epoch=4)  # a new leader writes its own record
    assert [p.rsplit("/", 1)[-1] for p in written if p.startswith("names/")][:1] == [f"{4:016x}-{0:016x}"]
    assert len(records(store, "state")) == 1 and _fetch(store, JobBlob(JOB, "state")) == (key, b"state")
    written.clear()
    store.put(path, key, JobBlob(JOB, "keeps the first key's object"), epoch=4)
    (tmp_path / "other").write_bytes(b"other")
    other_key = blake3.blake3(b"other").digest()
    store.put(tmp_path / "other", other_key, JobBlob(JOB, "state"), epoch=4)
    # The first key's ref, as a crash after the new record and before its removal leaves it.
    store.files.write_bytes(f"objects/{key.hex()[:2]}/{key.hex()}/{JOB.hex()}-{_name_hash('state')}", b"")
    store.put(path, key, JobBlob(JOB, "state"), epoch=4)  # back to the first key: a record again
    assert _fetch(store, JobBlob(JOB, "state")) == (key, b"state")


def test_a_name_whose_object_went_is_written_again_in_full(store: FileSystemBlobStore, tmp_path: Path) -> None:
    path, key = _source(tmp_path, b"state")
    store.put(path, key, JobBlob(JOB, "state"), epoch=3)
    store.files.remove(f"objects/{key.hex()[:2]}/{key.hex()}/data")  # as a damaged copy is moved aside
    store.put(path, key, JobBlob(JOB, "state"), epoch=3)
    assert _fetch(store, JobBlob(JOB, "state")) == (key, b"state")


def test_fetching_into_local_storage_publishes_a_verified_blob(tmp_path: Path) -> None:
    """What a new leader's lazy recovery does: the HA copy goes through staging and publish."""
    store = open_blob_store(tmp_path / "ha")
    path, key = _source(tmp_path, b"recover me")
    store.put(path, key, JobBlob(JOB, "n"))
    storage = BlobStorage(tmp_path / "data")
    storage.recover()
    with storage.stage() as upload:
        fetched = store.fetch(JobBlob(JOB, "n"), upload.write)
        assert fetched == key
        storage.publish(upload, JobBlob(JOB, "n"), fetched)
    assert storage.stat(JobBlob(JOB, "n")) == (10, key)


def test_a_name_written_by_a_newer_leader_is_not_overwritten_by_an_older_one(
    store: FileSystemBlobStore, tmp_path: Path
) -> None:
    new, new_key = _source(tmp_path, b"from the new leader")
    old, old_key = _source(tmp_path, b"from a deposed leader")
    store.put(new, new_key, JobBlob(JOB, "model"), epoch=5)
    with pytest.raises(NotLeader, match="newer leader"):
        store.put(old, old_key, JobBlob(JOB, "model"), epoch=4)
    assert _fetch(store, JobBlob(JOB, "model")) == (new_key, b"from the new leader")


class PausedRecordWrites:
    """A leader's files whose first write of a name record waits until :attr:`resume` is
    set: a fault hook, since no real store can hold a leader between two of its steps."""

    def __init__(self, files: Any) -> None:
        self.files = files
        self.paused = threading.Event()
        self.resume = threading.Event()

    def __getattr__(self, attribute: str) -> Any:
        found = getattr(self.files, attribute)
        if attribute not in ("write_bytes", "create_bytes"):
            return found

        def write(path: str, data: bytes) -> None:
            if data and not self.paused.is_set():  # a name record (refs are empty)
                self.paused.set()
                assert self.resume.wait(10)
            found(path, data)

        return write


def write_past_a_paused_leader(store: FileSystemBlobStore, tmp_path: Path) -> tuple[bytes, bytes]:
    """The old leader (epoch 1) checks the name's newest record and is paused before it
    writes its own; meanwhile the new leader (epoch 2) writes the name. Returns the keys the
    old and the new leader wrote."""
    deposed = open_blob_store(store.location)
    hook = PausedRecordWrites(deposed.files)
    deposed.files = hook
    old, old_key = _source(tmp_path, b"from the deposed leader")
    new, new_key = _source(tmp_path, b"from the new leader")
    outcome: list[BaseException | None] = []

    def write_late() -> None:
        try:
            deposed.put(old, old_key, JobBlob(JOB, "model"), epoch=1)
            outcome.append(None)
        except NotLeader as exc:
            outcome.append(exc)

    writer = threading.Thread(target=write_late)
    writer.start()
    assert hook.paused.wait(10)
    store.put(new, new_key, JobBlob(JOB, "model"), epoch=2)
    hook.resume.set()
    writer.join(10)
    assert len(outcome) == 1  # written below the newer record, or refused: either way not read
    return old_key, new_key


def test_a_deposed_leader_paused_between_its_check_and_its_write_never_takes_a_name_back_in_time(
    store: FileSystemBlobStore, tmp_path: Path
) -> None:
    """Whatever the paused leader's write does, a server recovering from the store reads the
    new leader's bytes, and the new leader's next write of the name collects the old one's."""
    _, new_key = write_past_a_paused_leader(store, tmp_path)
    recovering = open_blob_store(store.location)
    assert _fetch(recovering, JobBlob(JOB, "model")) == (new_key, b"from the new leader")
    assert recovering.names(JOB) == ["model"]
    newest, newest_key = _source(tmp_path, b"the new leader's next version")
    store.put(newest, newest_key, JobBlob(JOB, "model"), epoch=2)
    assert len(records(store, "model")) == 1 and store.count() == 1


def test_a_deletion_cut_short_never_leaves_an_older_record_newest(
    store: FileSystemBlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deletion removes a name's records oldest first: cut short after its first removal
    (a fault hook stands for the crash), the name still reads as the newest record says."""
    _, new_key = write_past_a_paused_leader(store, tmp_path)
    assert len(records(store, "model")) == 2
    remove = store.files.remove

    def remove_once(path: str) -> None:
        monkeypatch.setattr(store.files, "remove", failing_remove)
        remove(path)

    def failing_remove(path: str) -> None:
        raise OSError(f"injected crash before removing {path}")

    monkeypatch.setattr(store.files, "remove", remove_once)
    with pytest.raises(OSError, match="injected"):
        store.delete(JobBlob(JOB, "model"))
    assert _fetch(store, JobBlob(JOB, "model")) == (new_key, b"from the new leader")


_CRASHING_WRITER = """
import resource, signal, sys
from pathlib import Path
from blobsvc.ha import open_blob_store

store = open_blob_store(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)  # Python ignores it; by default it kills, mid-write
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[4]), resource.RLIM_INFINITY))
store.put(Path(sys.argv[2]), bytes.fromhex(sys.argv[3]), None)
"""


@pytest.mark.parametrize("location", ["directory", "file-url"])
def test_a_writer_killed_mid_copy_leaves_no_partial_object_and_the_next_put_cleans_up(
    location: str, tmp_path: Path
) -> None:
    """A real crash: the kernel kills the writing process (SIGXFSZ) once its copy of the
    object reaches 1 MiB of 4. No partial object is left under its final name (a file://
    URL used to be written in place), and the next PUT of the bytes leaves no debris."""
    data = bytes(range(256)) * (16 << 10)  # 4 MiB
    path, key = _source(tmp_path, data)
    url = str(tmp_path / "ha") if location == "directory" else f"file://{tmp_path}/ha"
    crashed = subprocess.run(
        [sys.executable, "-c", _CRASHING_WRITER, url, str(path), key.hex(), str(1 << 20)], timeout=60, check=False
    )
    assert crashed.returncode == -signal.SIGXFSZ
    key_dir = tmp_path / "ha" / "objects" / key.hex()[:2] / key.hex()
    assert not (key_dir / "data").exists()
    assert [p.stat().st_size for p in key_dir.iterdir()] == [1 << 20]  # only the crashed copy's temp file
    store = open_blob_store(url)
    assert store.fetch(ContentKey(key), lambda _: None) is None
    store.put(path, key, None)
    assert _fetch(store, ContentKey(key)) == (key, data)
    assert sorted(p.name for p in key_dir.iterdir()) == ["content", "data"]
