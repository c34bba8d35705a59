"""A snapshot reads only what changed: the stamp memory beside the state, against a real server.

Each test takes a stamp the memory must not trust (a rewrite keeping size and mtime, an inode
reused, a file changed just now or while it is read) and checks that the checkpoint holds
the new bytes, restored byte for byte.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from blobsvc._exceptions import InvalidArgument
from blobsvc.checkpoints import CheckpointStore, TaskHandle, _snapshot
from blobsvc.checkpoints._stamps import MEMORY_SUFFIX
from blobsvc.files import _stamps
from blobsvc.spark._checkpoints import TaskCheckpoints
from blobsvc.spark._local import CacheOptions
from blobsvc.wire._ids import hash_file
from tests.conftest import ServerThread


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stamps, "RACY_SECONDS", 0.2)


@pytest.fixture
def store(server_thread: ServerThread) -> Iterator[CheckpointStore]:
    with CheckpointStore(server_thread.address, "pipe", retain=3, timeout=30) as opened:
        yield opened


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files snapshots hash, in order."""
    read: list[str] = []

    def counted(path: Path) -> bytes:
        read.append(path.name)
        return hash_file(path)

    monkeypatch.setattr(_snapshot, "hash_file", counted)
    return read


def aged_tree(root: Path, files: dict[str, bytes]) -> Path:
    """``root`` holding ``files``, each last changed long enough ago for its stamp to count."""
    root.mkdir()
    for name, data in files.items():
        (root / name).write_bytes(data)
    time.sleep(_stamps.RACY_SECONDS + 0.1)  # ctime, which no utime moves back, ages too
    return root


def checkpoint(store: CheckpointStore, state: Path, tmp_path: Path, **options: object) -> TaskHandle:
    """Checkpoint ``state`` as task 0, and check that it restores byte for byte."""
    with store.begin(["0"]) as pending:
        handle = store.snapshot("0", state, **options)  # type: ignore[arg-type]
        pending.acknowledge("0", handle)
    restored = store.restore(pending.id, handle, tmp_path / f"restored-{pending.id}")
    if state.is_dir():
        assert {p.name: p.read_bytes() for p in restored.iterdir()} == {p.name: p.read_bytes() for p in state.iterdir()}
    else:
        assert restored.read_bytes() == state.read_bytes()
    return handle


def test_a_checkpoint_reads_and_sends_only_the_files_that_changed(
    store: CheckpointStore, tmp_path: Path, reads: list[str]
) -> None:
    state = aged_tree(tmp_path / "state", {f"f{i}": os.urandom(10_000) for i in range(8)})
    first = checkpoint(store, state, tmp_path)
    assert sorted(reads) == [f"f{i}" for i in range(8)] and first.bytes_sent == 80_000
    reads.clear()
    (state / "f3").write_bytes(os.urandom(20_000))
    second = checkpoint(store, state, tmp_path)
    assert reads == ["f3"], "unchanged files are not read"
    assert second.bytes_sent == 20_000
    assert store.client.status()["checkpoints_state_bytes_sent"] == 100_000


def test_the_memory_is_kept_beside_the_state_never_in_it(store: CheckpointStore, tmp_path: Path) -> None:
    state = aged_tree(tmp_path / "state", {"a": b"a", "b": b"b"})
    handle = checkpoint(store, state, tmp_path)
    assert sorted(p.name for p in state.iterdir()) == ["a", "b"]
    assert [entry.path for entry in handle.files] == ["a", "b"]
    assert (tmp_path / f".state{MEMORY_SUFFIX}").is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(f".state{MEMORY_SUFFIX}.")], "no temp file left"


def test_a_file_changed_just_before_its_snapshot_is_read_again(
    store: CheckpointStore, tmp_path: Path, reads: list[str]
) -> None:
    state = aged_tree(tmp_path / "state", {"old": b"old"})
    (state / "new").write_bytes(b"new")  # within the racy window: a same-tick rewrite would keep its stamp
    checkpoint(store, state, tmp_path)
    reads.clear()
    checkpoint(store, state, tmp_path)
    assert reads == ["new"]


def test_a_rewrite_that_keeps_size_and_mtime_is_read_again(
    store: CheckpointStore, tmp_path: Path, reads: list[str]
) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"before"})
    checkpoint(store, state, tmp_path)
    st = os.stat(state / "f")
    (state / "f").write_bytes(b"after!")  # same size
    os.utime(state / "f", ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back
    handle = checkpoint(store, state, tmp_path)
    assert handle.files[0].key == blake3.blake3(b"after!").hexdigest()


def test_a_new_file_on_a_reused_inode_is_read_again(store: CheckpointStore, tmp_path: Path) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"before"})
    checkpoint(store, state, tmp_path)
    st = os.stat(state / "f")
    for _ in range(20):  # the file system hands the freed inode out again, mostly at once
        (state / "f").unlink()
        (state / "f").write_bytes(b"after!")
        if os.stat(state / "f").st_ino == st.st_ino:
            break
    os.utime(state / "f", ns=(st.st_atime_ns, st.st_mtime_ns))
    handle = checkpoint(store, state, tmp_path)
    assert handle.files[0].key == blake3.blake3(b"after!").hexdigest()


def test_a_file_changed_while_it_is_read_is_refused_and_not_remembered(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"before"})

    # A write landing during the read cannot be timed on a real file system: the hash makes it.
    def hash_then_write(path: Path) -> bytes:
        key = hash_file(path)
        path.write_bytes(b"during")
        return key

    monkeypatch.setattr(_snapshot, "hash_file", hash_then_write)
    with pytest.raises(InvalidArgument, match="changed while it was snapshotted"):
        store.snapshot("0", state)
    monkeypatch.undo()
    assert not (tmp_path / f".state{MEMORY_SUFFIX}").exists()
    handle = checkpoint(store, state, tmp_path)
    assert handle.files[0].key == blake3.blake3(b"during").hexdigest()


def test_immutable_files_are_trusted_while_device_inode_and_size_hold(
    store: CheckpointStore, tmp_path: Path, reads: list[str]
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "000001.sst").write_bytes(b"table")  # just written: remembered all the same
    (state / "MANIFEST").write_bytes(b"manifest")
    checkpoint(store, state, tmp_path, immutable=["*.sst"])
    reads.clear()
    os.utime(state / "000001.sst")  # a touch, as a hard link into a RocksDB checkpoint makes
    checkpoint(store, state, tmp_path, immutable=["*.sst"])
    assert reads == ["MANIFEST"]
    reads.clear()
    (state / "000001.sst").write_bytes(b"other table")
    checkpoint(store, state, tmp_path, immutable=["*.sst"])
    assert sorted(reads) == ["000001.sst", "MANIFEST"]


def test_a_single_file_state_is_remembered_too(store: CheckpointStore, tmp_path: Path, reads: list[str]) -> None:
    state = aged_tree(tmp_path / "state", {"model.bin": b"weights"}) / "model.bin"
    checkpoint(store, state, tmp_path)
    checkpoint(store, state, tmp_path)
    assert reads == ["model.bin"]


@pytest.mark.parametrize("damage", [b"{not json", b'{"format": 1, "files": {"f": [[1, 2], "00"]}}', b"[]"])
def test_a_damaged_memory_costs_a_read_and_nothing_else(
    store: CheckpointStore, tmp_path: Path, reads: list[str], damage: bytes
) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"data"})
    (tmp_path / f".state{MEMORY_SUFFIX}").write_bytes(damage)
    checkpoint(store, state, tmp_path)
    assert reads == ["f"]
    assert set(json.loads((tmp_path / f".state{MEMORY_SUFFIX}").read_text())["files"]) == {"f"}


def test_without_stamps_every_file_is_read_and_nothing_is_written_beside_the_state(
    store: CheckpointStore, tmp_path: Path, reads: list[str]
) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"data"})
    checkpoint(store, state, tmp_path, stamps=False)
    checkpoint(store, state, tmp_path, stamps=False)
    assert reads == ["f", "f"]
    assert not (tmp_path / f".state{MEMORY_SUFFIX}").exists()


def test_a_spark_task_snapshots_through_the_same_memory(
    server_thread: ServerThread, tmp_path: Path, reads: list[str]
) -> None:
    """What a task gets from ``SparkCheckpoints.tasks()``, used as a task uses it (no Spark
    needed to call it): immutable files are passed on."""
    state = tmp_path / "state"
    state.mkdir()
    (state / "000001.sst").write_bytes(b"table")  # just written: trusted as immutable all the same
    tasks = TaskCheckpoints(CacheOptions(server_thread.address), "pipe", None)
    first = tasks.snapshot(0, state, immutable=["*.sst"])
    second = tasks.snapshot(0, state, immutable=["*.sst"])
    assert reads == ["000001.sst"] and first.same_state(second)


def test_the_memory_of_a_state_named_with_dots_is_still_beside_it(
    store: CheckpointStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = aged_tree(tmp_path / "state", {"f": b"data"})
    (state / "inner").mkdir()
    monkeypatch.chdir(state / "inner")
    handle = store.snapshot("0", "..")
    assert [entry.path for entry in handle.files] == ["f"]
    assert sorted(p.name for p in state.iterdir()) == ["f", "inner"]
    assert (tmp_path / f".state{MEMORY_SUFFIX}").is_file()
