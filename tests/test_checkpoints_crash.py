"""SIGKILL of a real ``blobsvc serve`` process while checkpoints complete and subsume.

A driver thread takes checkpoint after checkpoint, each of many small state files (so that
checking the state, adding the record, subsuming the oldest and discarding their files take a
while), and the server is killed with SIGKILL after a different delay each round: before,
during and after completions and subsumptions. No fault-injection hook: the points are the
real ones the kill lands on. After each restart, on the same data directory:

* every checkpoint listed restores byte for byte (a checkpoint is completed and whole, or absent);
* the last completion acknowledged before the kill is listed, and so is the one before it unless
  the checkpoint in flight completed too (then it may have been subsumed): the older ones are
  intact;
* nothing listed was never completed, and ids go on increasing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest

from blobsvc import BlobClient
from blobsvc._exceptions import BlobError
from blobsvc.checkpoints import CheckpointStore
from blobsvc.wire._checkpoints import pipeline_job, state_name

from .conftest import ServerProcess

FILES = 60
DELAYS = (0.05, 0.15, 0.3, 0.45, 0.6, 0.8)


def _state(checkpoint: int) -> dict[str, bytes]:
    """Task state of the checkpoint taken ``checkpoint``-th: half the files change each time."""
    return {f"f{i:03d}": b"%d-%d" % (i, checkpoint if i % 2 else checkpoint // 4) for i in range(FILES)}


def _write(root: Path, files: dict[str, bytes]) -> Path:
    root.mkdir(parents=True)
    for name, data in files.items():
        (root / name).write_bytes(data)
    return root


def test_sigkill_during_completion_and_subsumption_leaves_each_checkpoint_whole_or_absent(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    server = spawn_server()
    states: dict[int, dict[str, bytes]] = {}  # checkpoint id → the state it was given
    acknowledged: list[int] = []  # completions the server answered OK, in order
    taken = 0
    for round_, delay in enumerate(DELAYS):
        stop = threading.Event()
        client = BlobClient(server.address, timeout=5.0, retries=0)
        store = CheckpointStore(client, "crash", retain=2)

        def drive(store: CheckpointStore = store, stop: threading.Event = stop) -> None:
            nonlocal taken
            while not stop.is_set():
                taken += 1
                files = _state(taken)
                root = _write(tmp_path / f"state-{taken}", files)
                try:
                    pending = store.begin(tasks=["0", "1"])
                    states[pending.id] = files
                    pending.acknowledge("0", store.snapshot("0", root))
                    pending.acknowledge("1", store.snapshot("1", root))
                    pending.complete()
                except BlobError:
                    return  # the kill
                acknowledged.append(pending.id)

        driver = threading.Thread(target=drive)
        driver.start()
        threading.Event().wait(delay)
        os.kill(server.process.pid, signal.SIGKILL)
        stop.set()
        driver.join(30)
        assert not driver.is_alive()
        client.close()

        server = spawn_server()  # same data directory
        with BlobClient(server.address, timeout=10.0) as reader:
            listed = CheckpointStore(reader, "crash").list()
            ids = [checkpoint.id for checkpoint in listed]
            assert set(ids) <= set(states), "a checkpoint that was never triggered is listed"
            if acknowledged:
                assert acknowledged[-1] in ids, f"round {round_}: the last acknowledged completion is lost"
                # A completion whose answer a kill cut off, in this round or an earlier one, may
                # be durable: then it and the last acknowledged are the two retained. Else the
                # two last acknowledged must be.
                unacknowledged_newer = [i for i in ids if i > acknowledged[-1]]
                if len(acknowledged) > 1 and not unacknowledged_newer:
                    assert acknowledged[-2] in ids, f"round {round_}: an older retained checkpoint is lost"
            for checkpoint in listed:
                for task in ("0", "1"):
                    out = tmp_path / f"restore-{round_}-{checkpoint.id}-{task}"
                    restored = checkpoint.restore(task, out)
                    assert {p.name: p.read_bytes() for p in restored.iterdir()} == states[checkpoint.id]
    assert len(acknowledged) >= 2, "the kills all landed before any checkpoint completed: nothing was tested"

    # Once a checkpoint completes after the crashes, no state is left that nothing references.
    with BlobClient(server.address, timeout=10.0) as client, CheckpointStore(client, "crash", retain=2) as store:
        with store.begin(tasks=["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", b"after the crashes"))
        assert pending.id > max(states)  # the counter never went back
        referenced = {
            state_name(bytes.fromhex(entry.key))
            for checkpoint in store.list()
            for handle in checkpoint.tasks.values()
            for entry in handle.files
        }
        assert state_name(blake3.blake3(b"after the crashes").digest()) in referenced
        names = {info.name or "" for info in client.list(pipeline_job("crash"))}
        assert {name for name in names if name.startswith("state/")} == referenced


@pytest.mark.parametrize(
    ("point", "kept"),
    [
        ("before-record", {2}),  # the third never completed
        ("after-record", {2, 3}),  # completed, the second not subsumed yet: one too many, never one too few
        ("after-subsume", {3}),  # subsumed, its state not yet discarded
        ("mid-discard", {3}),  # part of the second's state discarded
    ],
)
def test_sigkill_at_each_point_of_a_completion_keeps_a_whole_checkpoint(
    spawn_server: Callable[..., ServerProcess],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    point: str,
    kept: set[int],
) -> None:
    """The exact points a kill from outside hits by chance, hit with the server's own
    SIGKILL (``BLOBSVC_CHECKPOINTS_CRASH_AT``) during the third completion."""
    monkeypatch.setenv("BLOBSVC_CHECKPOINTS_CRASH_AT", f"{point}:3")
    server = spawn_server()
    client = BlobClient(server.address, timeout=5.0, retries=0)
    store = CheckpointStore(client, "crash", retain=1)
    for number in (1, 2, 3):
        root = _write(tmp_path / f"state-{number}", _state(number))
        pending = store.begin(tasks=["0"])
        pending.acknowledge("0", store.snapshot("0", root))
        if number < 3 or point == "mid-discard":  # discarding comes after the answer
            pending.complete()
            continue
        with pytest.raises(BlobError):  # the server died answering
            pending.complete()
    assert server.process.wait(10) == -signal.SIGKILL
    client.close()
    monkeypatch.delenv("BLOBSVC_CHECKPOINTS_CRASH_AT")
    server = spawn_server()
    with BlobClient(server.address, timeout=10.0) as reader, CheckpointStore(reader, "crash", retain=1) as after:
        listed = after.list()
        assert {c.id for c in listed} == kept
        for checkpoint in listed:
            restored = checkpoint.restore("0", tmp_path / f"restore-{checkpoint.id}")
            assert {p.name: p.read_bytes() for p in restored.iterdir()} == _state(checkpoint.id)
        with after.begin(tasks=["0"]) as last:  # the next completion subsumes and discards the rest
            last.acknowledge("0", after.snapshot("0", b"next"))
        assert last.id == 4 and [c.id for c in after.list()] == [4]
        after.records()  # waits for the discard the completion started
        names = {info.name or "" for info in reader.list(pipeline_job("crash"))}
        assert {name for name in names if name.startswith("state/")} == {state_name(blake3.blake3(b"next").digest())}
