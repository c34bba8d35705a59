"""Checkpoints against a real server: the store, the coordinator, the server's rules."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import BlobClient
from blobsvc._exceptions import BadRequest, Busy, DigestMismatch, InvalidArgument, NotFound
from blobsvc.cache import BlobCache
from blobsvc.checkpoints import (
    CheckpointAborted,
    CheckpointError,
    CheckpointFailuresExceeded,
    CheckpointStore,
    Fenced,
    TaskHandle,
)
from blobsvc.config import Settings
from blobsvc.files._layout import Layout
from blobsvc.wire._checkpoints import metadata_name, pipeline_job, state_name
from tests.conftest import ServerThread


@pytest.fixture
def store(server_thread: ServerThread) -> Iterator[CheckpointStore]:
    with CheckpointStore(server_thread.address, "pipe", retain=2, timeout=30) as opened:
        yield opened


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for relative, data in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def read_tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def names(client: BlobClient, pipeline: str = "pipe") -> set[str]:
    """The pipeline's blobs, once the discard a completion started is done (``list`` waits for it)."""
    client.checkpoints({"action": "list", "pipeline": pipeline})
    return {info.name or "" for info in client.list(pipeline_job(pipeline))}


def test_a_checkpoint_restores_every_task_byte_for_byte(store: CheckpointStore, tmp_path: Path) -> None:
    tree = {"a": b"A" * 5000, "sub/b": b"B", "sub/deeper/c": b""}
    state = write_tree(tmp_path / "state", tree)
    (tmp_path / "one").write_bytes(b"one file")
    with store.begin(tasks=["0", "1", "2"], properties={"batch": 7}) as pending:
        pending.acknowledge("0", store.snapshot("0", state))
        pending.acknowledge("1", store.snapshot("1", tmp_path / "one"))
        pending.acknowledge("2", store.snapshot("2", b"bytes"))
    latest = store.latest()
    assert latest is not None and latest.id == pending.id and latest.properties == {"batch": 7}
    assert sorted(latest.tasks) == ["0", "1", "2"]
    assert read_tree(latest.restore("0", tmp_path / "r0")) == tree
    assert latest.restore("1", tmp_path / "r1").read_bytes() == b"one file"
    assert latest.restore("2", tmp_path / "r2").read_bytes() == b"bytes"


def test_restored_files_are_read_only_unless_asked(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", write_tree(tmp_path / "s", {"f": b"x"})))
    latest = store.latest()
    assert latest is not None
    assert (latest.restore("0", tmp_path / "ro") / "f").stat().st_mode & 0o777 == 0o444
    assert (latest.restore("0", tmp_path / "rw", writable=True) / "f").stat().st_mode & 0o777 == 0o644


def test_a_restore_never_writes_into_an_existing_destination(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", b"x"))
    latest = store.latest()
    assert latest is not None
    out = tmp_path / "out"
    out.mkdir()
    (out / "taken").write_bytes(b"mine")
    with pytest.raises(InvalidArgument, match="exists"):
        latest.restore("0", out / "taken")
    assert (out / "taken").read_bytes() == b"mine"
    assert [p.name for p in out.iterdir()] == ["taken"]  # no temporary left
    with pytest.raises(InvalidArgument, match="not a directory"):
        latest.restore("0", out / "missing" / "dest")


def test_leaving_the_block_with_a_task_missing_aborts_and_nothing_is_visible(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointAborted, match="tasks 1 did not acknowledge"), store.begin(tasks=["0", "1"]) as p:
        p.acknowledge("0", store.snapshot("0", b"x"))
    assert store.latest() is None and store.records() == []
    assert names(store.client) == set()  # its state discarded


def test_an_exception_in_the_block_aborts_and_goes_on(store: CheckpointStore) -> None:
    with pytest.raises(ZeroDivisionError), store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", b"x"))
        _ = 1 / 0
    assert pending.reason is not None and "ZeroDivisionError" in pending.reason
    assert store.latest() is None


def test_a_declined_checkpoint_is_aborted(store: CheckpointStore) -> None:
    with pytest.raises(CheckpointAborted, match="task 1 declined: disk full"), store.begin(tasks=["0", "1"]) as p:
        p.acknowledge("0", store.snapshot("0", b"x"))
        p.decline("1", "disk full")
        p.acknowledge("1", store.snapshot("1", b"y"))  # too late: it was aborted
    assert store.latest() is None


def test_a_checkpoint_that_times_out_is_aborted_by_its_timer(server_thread: ServerThread) -> None:
    with CheckpointStore(server_thread.address, "pipe", timeout=0.3) as store:
        pending = store.begin(tasks=["0"])
        time.sleep(0.6)  # nobody calls anything: the timer aborts it
        assert pending.state.value == "aborted" and "timed out" in (pending.reason or "")
        with pytest.raises(CheckpointAborted, match="timed out"):
            pending.acknowledge("0", store.snapshot("0", b"x"))
        deadline = time.monotonic() + 10  # the timer tells the server on its own thread
        while store.client.status()["checkpoints_aborted"] != 1:
            assert time.monotonic() < deadline, "the server never heard of the abort"
            time.sleep(0.01)


def test_ids_strictly_increase_even_across_a_server_restart(settings: Settings) -> None:
    ids = []
    for _ in range(2):
        running = ServerThread(settings).start()
        try:
            with CheckpointStore(running.address, "pipe") as store:
                for _ in range(2):
                    with store.begin(tasks=["0"]) as pending:
                        pending.acknowledge("0", store.snapshot("0", b"x"))
                    ids.append(pending.id)
                store.begin(tasks=["0"]).abort("on purpose")
        finally:
            running.stop()
    assert ids == sorted(ids) and len(set(ids)) == 4 and ids[2] > ids[1] + 1  # 3 went to the aborted one


def test_retain_keeps_the_newest_and_every_savepoint(store: CheckpointStore) -> None:
    completed = []
    for batch in range(5):
        with store.begin(tasks=["0"], savepoint=batch == 1) as pending:
            pending.acknowledge("0", store.snapshot("0", b"state %d" % batch))
        completed.append(pending.id)
    assert [c.id for c in store.list()] == [completed[1], completed[3], completed[4]]
    assert [c.savepoint for c in store.list()] == [True, False, False]
    assert store.client.status()["checkpoints_subsumed"] == 2
    # Only the retained checkpoints' state and metadata are left on the server.
    kept = {state_name(blake3.blake3(b"state %d" % b).digest()) for b in (1, 3, 4)}
    assert names(store.client) == kept | {metadata_name(completed[i]) for i in (1, 3, 4)}


def test_unchanged_files_send_no_bytes(store: CheckpointStore, tmp_path: Path) -> None:
    state = write_tree(tmp_path / "s", {f"f{i}": os.urandom(10_000) for i in range(10)})
    with store.begin(tasks=["0"]) as pending:
        first = store.snapshot("0", state)
        pending.acknowledge("0", first)
    (state / "f3").write_bytes(os.urandom(10_000))
    with store.begin(tasks=["0"]) as pending:
        second = store.snapshot("0", state)
        pending.acknowledge("0", second)
    assert first.bytes_sent == 100_000 and second.bytes_sent == 10_000
    status = store.client.status()
    assert status["checkpoints_state_bytes_sent"] == 110_000
    assert status["checkpoints_state_bytes_reused"] == 90_000


def test_shared_state_is_discarded_only_when_no_retained_checkpoint_references_it(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    with CheckpointStore(server_thread.address, "pipe", retain=1) as store:
        for data in (b"shared", b"shared", b"other"):
            with store.begin(tasks=["0"]) as pending:
                pending.acknowledge("0", store.snapshot("0", data))
            latest = store.latest()
            assert latest is not None
            assert latest.restore("0", tmp_path / str(pending.id)).read_bytes() == data
        assert names(store.client) == {state_name(blake3.blake3(b"other").digest()), metadata_name(pending.id)}


def test_a_replaced_coordinator_is_fenced(server_thread: ServerThread) -> None:
    with (
        CheckpointStore(server_thread.address, "pipe") as old,
        CheckpointStore(server_thread.address, "pipe") as new,
    ):
        zombie = old.begin(tasks=["0"])
        zombie.acknowledge("0", old.snapshot("0", b"same state"))
        with new.begin(tasks=["0"]) as pending:  # takes over at once: does not wait for the zombie
            pending.acknowledge("0", new.snapshot("0", b"same state"))
        with pytest.raises(Fenced, match="replaced"):  # its state is all there: the record is refused
            zombie.complete()
        with pytest.raises(Fenced):
            old.begin(tasks=["0"])
        latest = new.latest()
        assert latest is not None and latest.id == pending.id and [c.id for c in new.list()] == [pending.id]


def test_a_replaced_coordinator_whose_state_was_discarded_is_told_it_was_replaced(
    server_thread: ServerThread,
) -> None:
    with (
        CheckpointStore(server_thread.address, "pipe") as old,
        CheckpointStore(server_thread.address, "pipe") as new,
    ):
        zombie = old.begin(tasks=["0"])
        zombie.acknowledge("0", old.snapshot("0", b"old"))
        with new.begin(tasks=["0"]) as pending:
            pending.acknowledge("0", new.snapshot("0", b"new"))
        with pytest.raises(Fenced, match="replaced"):
            zombie.complete()
        assert [c.id for c in new.list()] == [pending.id]


def test_a_replaced_coordinator_cannot_trigger(server_thread: ServerThread) -> None:
    client = BlobClient(server_thread.address)
    with CheckpointStore(client, "pipe") as store:
        with store.begin(tasks=["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", b"x"))
        epoch = store.coordinator.epoch
        client.checkpoints({"action": "register", "pipeline": "pipe"})
        with pytest.raises(Fenced):
            client.checkpoints({"action": "trigger", "pipeline": "pipe", "epoch": epoch, "timeout": 5})
        assert [c.id for c in store.list()] == [pending.id]


def test_at_most_max_concurrent_checkpoints_pend(store: CheckpointStore) -> None:
    first = store.begin(tasks=["0"])
    with pytest.raises(CheckpointError, match="at most 1 at once"):
        store.begin(tasks=["0"])
    first.abort("done")
    store.begin(tasks=["0"]).abort("done")


def test_failures_beyond_the_tolerable_stop_the_next_trigger(server_thread: ServerThread) -> None:
    with CheckpointStore(server_thread.address, "pipe", tolerable_failures=1) as store:
        store.begin(tasks=["0"]).decline("0", "one")
        store.begin(tasks=["0"]).decline("0", "two")
        with pytest.raises(CheckpointFailuresExceeded, match="2 checkpoints failed in a row"):
            store.begin(tasks=["0"])


def test_a_checkpoint_whose_state_went_missing_is_not_completed(store: CheckpointStore) -> None:
    pending = store.begin(tasks=["0"])
    handle = store.snapshot("0", b"x")
    pending.acknowledge("0", handle)
    store.client.delete(job=pipeline_job("pipe"), name=state_name(bytes.fromhex(handle.files[0].key)))
    with pytest.raises(NotFound, match="not on the server"):
        pending.complete()
    assert pending.state.value == "aborted" and store.latest() is None


@pytest.mark.parametrize("damage", ["damaged", "missing"])
def test_damaged_or_missing_metadata_is_reported_and_latest_falls_back(
    store: CheckpointStore, server_thread: ServerThread, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    ids = []
    for data in (b"first", b"second"):
        with store.begin(tasks=["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", data))
        ids.append(pending.id)
    layout = server_thread.server.storage.layout
    metadata = layout.job_blob(pipeline_job("pipe"), metadata_name(ids[1]))
    if damage == "damaged":  # bit rot that leaves valid metadata: only its key tells
        metadata.write_bytes(metadata.read_bytes().replace(b'"savepoint":false', b'"savepoint":true'))
    else:
        store.client.delete(job=pipeline_job("pipe"), name=metadata_name(ids[1]))
    with caplog.at_level(logging.WARNING, "blobsvc.checkpoints"):
        latest = store.latest()
    assert latest is not None and latest.id == ids[0]
    assert f"falling back to checkpoint {ids[0]}" in caplog.text
    status = store.client.status()
    assert status["checkpoints_damaged"] == 1 and str(ids[1]) in status["checkpoints_damaged_records"][0]
    assert damage in store.records()[1]["problem"]
    with pytest.raises(CheckpointError, match="cannot be restored"):
        store.get(ids[1])
    aborted = store.begin(tasks=["0"])
    aborted.acknowledge("0", store.snapshot("0", b"orphan"))
    aborted.abort("on purpose")  # what the damaged one references was read intact: its state stays
    names = {info.name for info in store.client.list(pipeline_job("pipe"))}
    assert state_name(blake3.blake3(b"second").digest()) in names
    assert state_name(blake3.blake3(b"orphan").digest()) not in names


def test_nothing_is_discarded_while_a_retained_checkpoints_references_are_unknown(
    settings: Settings, tmp_path: Path
) -> None:
    running = ServerThread(settings).start()
    with CheckpointStore(running.address, "pipe", retain=2) as store:
        for data in (b"first", b"second"):
            with store.begin(tasks=["0"]) as pending:
                pending.acknowledge("0", store.snapshot("0", data))
    running.stop()
    metadata = Layout(settings.data_dir).job_blob(pipeline_job("pipe"), metadata_name(pending.id))
    metadata.write_bytes(metadata.read_bytes().replace(b'"format":1', b'"format":2'))  # rot while it was down
    running = ServerThread(settings).start()  # a new server: it never read that metadata intact
    try:
        with CheckpointStore(running.address, "pipe", retain=2) as store:
            aborted = store.begin(tasks=["0"])
            aborted.acknowledge("0", store.snapshot("0", b"orphan"))
            aborted.abort("on purpose")  # its discard keeps everything
            names = {info.name for info in store.client.list(pipeline_job("pipe"))}
            assert state_name(blake3.blake3(b"orphan").digest()) in names
            assert running.server.status()["checkpoints_damaged"] == 1
    finally:
        running.stop()


def test_a_restore_holds_its_checkpoint_state(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", b"held"))
    latest = store.latest()
    assert latest is not None
    with latest.held():
        store.delete(latest.id)
        assert store.latest() is None
        assert latest.restore("0", tmp_path / "r").read_bytes() == b"held"  # not discarded meanwhile
    assert names(store.client) == set()  # released: discarded now


def test_a_restore_through_a_cache_fetches_once_per_host(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", write_tree(tmp_path / "s", {"a": b"a" * 1000, "b": b"b"})))
    cache = BlobCache(store.client.server, tmp_path / "cache")
    with CheckpointStore(store.client, "pipe", cache=cache) as through_cache:
        latest = through_cache.latest()
        assert latest is not None
        assert read_tree(latest.restore("0", tmp_path / "r1")) == {"a": b"a" * 1000, "b": b"b"}
        assert read_tree(latest.restore("0", tmp_path / "r2")) == {"a": b"a" * 1000, "b": b"b"}
    assert cache.stats().downloads == 2  # two files, each fetched once
    cache.close()


@pytest.mark.parametrize("path", ["../x", "/abs", "a/../../b", "a//b", "", "a\\b", "./a"])
def test_a_handle_path_that_could_leave_its_directory_is_refused(path: str) -> None:
    document = {"task": "0", "kind": "directory", "files": [{"path": path, "size": 1, "key": "0" * 64}]}
    with pytest.raises(InvalidArgument):
        TaskHandle.from_json(document)


def test_handles_round_trip_through_json(store: CheckpointStore, tmp_path: Path) -> None:
    handle = store.snapshot("0", write_tree(tmp_path / "s", {"a": b"1", "b/c": b"2"}))
    assert TaskHandle.from_json(json.loads(json.dumps(handle.to_json()))) == handle
    assert pickle.loads(pickle.dumps(handle)) == handle


def test_the_server_refuses_metadata_with_a_hostile_path(store: CheckpointStore) -> None:
    pending = store.begin(tasks=["0"])
    job = pipeline_job("pipe")
    key = store.client.put(b"x", job=job, name=state_name(blake3.blake3(b"x").digest()))
    document = {
        "format": 1,
        "pipeline": "pipe",
        "id": pending.id,
        "timestamp": 1.0,
        "savepoint": False,
        "properties": {},
        "tasks": [{"task": "0", "kind": "directory", "files": [{"path": "../../etc/x", "size": 1, "key": key}]}],
    }
    metadata = store.client.put(json.dumps(document).encode(), job=job, name=metadata_name(pending.id))
    request = {"action": "complete", "pipeline": "pipe", "epoch": store.coordinator.epoch, "id": pending.id}
    with pytest.raises(BadRequest, match="not a relative path"):
        store.client.checkpoints({**request, "metadata": metadata, "retain": 1})
    assert store.records() == []
    pending.abort("done")


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        ({"action": "list", "pipeline": "../etc"}, "pipeline name"),
        ({"action": "list"}, "pipeline name"),
        ({"action": "explode", "pipeline": "p"}, "unknown checkpoints action"),
        ({"action": "trigger", "pipeline": "p", "epoch": "1", "timeout": 1}, "'epoch' is an integer"),
        ({"action": "trigger", "pipeline": "p", "epoch": 0, "timeout": -1}, "'timeout' is a number"),
        ({"action": "complete", "pipeline": "p", "epoch": 0, "id": 1, "retain": 0, "metadata": "x"}, "'retain'"),
    ],
)
def test_a_malformed_checkpoints_request_is_a_bad_request(
    server_thread: ServerThread, request_: dict[str, object], words: str
) -> None:
    with BlobClient(server_thread.address) as client, pytest.raises(BadRequest, match=words):
        client.checkpoints(request_)


def test_deleting_a_checkpoint_that_is_not_there_is_not_found(store: CheckpointStore) -> None:
    with pytest.raises(NotFound, match="no checkpoint 9"):
        store.delete(9)


def test_a_restore_verifies_what_it_reads(store: CheckpointStore, server_thread: ServerThread, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        handle = store.snapshot("0", b"original")
        pending.acknowledge("0", handle)
    latest = store.latest()
    assert latest is not None
    name = state_name(bytes.fromhex(handle.files[0].key))
    store.client.put(b"replaced", job=pipeline_job("pipe"), name=name)  # someone else's PUT under the name
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(DigestMismatch, match="other bytes"):
        latest.restore("0", out / "r")
    assert list(out.iterdir()) == []  # nothing at the destination, no temporary left


def test_checkpoints_are_metrics(settings: Settings, tmp_path: Path) -> None:
    from tests.test_metrics import scrape, value

    running = ServerThread(replace(settings, metrics_port="0")).start()
    try:
        with CheckpointStore(running.address, "pipe") as store:
            state = write_tree(tmp_path / "s", {"same": b"s" * 1000, "new": b"1"})
            for batch in (b"1", b"22"):
                (state / "new").write_bytes(batch)
                with store.begin(tasks=["0"]) as pending:
                    pending.acknowledge("0", store.snapshot("0", state))
            store.begin(tasks=["0"]).decline("0", "no")
        assert running.server.metrics is not None and running.server.metrics.address is not None
        samples = scrape(running.server.metrics.address)
    finally:
        running.stop()
    assert value(samples, "blobsvc_checkpoints_completed_total") == 2
    assert value(samples, "blobsvc_checkpoints_aborted_total") == 1
    assert value(samples, "blobsvc_checkpoints_subsumed_total") == 1
    assert value(samples, "blobsvc_checkpoints_state_sent_bytes_total") == 1000 + 1 + 2
    assert value(samples, "blobsvc_checkpoints_state_reused_bytes_total") == 1000
    assert value(samples, "blobsvc_checkpoints_last_completed_id") == pending.id
    assert 0 <= value(samples, "blobsvc_checkpoints_last_completed_age_seconds") < 60
    assert value(samples, "blobsvc_checkpoints_damaged") == 0


def test_records_refuse_a_replaced_writer_in_the_same_step_as_the_write(tmp_path: Path) -> None:
    from blobsvc.ha.checkpoints import FileCheckpointRecords

    records = FileCheckpointRecords(tmp_path)
    old = records.register("p")
    first = records.next_id("p")
    record: dict[str, Any] = {"id": first, "timestamp": 1.0, "savepoint": False, "metadata": "0" * 64}
    records.add("p", old, record)
    new = records.register("p")
    assert new == old + 1
    with pytest.raises(Fenced):
        records.add("p", old, {**record, "id": records.next_id("p")})
    with pytest.raises(Fenced):
        records.remove("p", old, first)  # a zombie cannot subsume
    with pytest.raises(Fenced):
        records.add_pending("p", old, 9, 1.0)  # nor trigger
    records.add_pending("p", new, 9, 1.0)
    assert records.pending("p") == {9: {"epoch": new, "deadline": 1.0, "savepoint": False}}
    records.remove_pending("p", [9, 10])
    assert records.pending("p") == {}
    assert [r["id"] for r in records.records("p")] == [first]
    records.remove("p", new, first)
    assert records.records("p") == []


def test_the_cli_lists_shows_restores_and_deletes(store: CheckpointStore, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from blobsvc.cli import main

    ids = []
    for batch in range(2):
        with store.begin(tasks=["0", "1"], properties={"batch": batch}) as pending:
            pending.acknowledge("0", store.snapshot("0", write_tree(tmp_path / f"s{batch}", {"a": b"%d" % batch})))
            pending.acknowledge("1", store.snapshot("1", b"one"))
        ids.append(pending.id)
    runner = CliRunner()
    server = ["-s", store.client.server]
    listed = runner.invoke(main, ["checkpoints", "list", "pipe", *server])
    assert listed.exit_code == 0, listed.output
    assert [line.split("\t")[0] for line in listed.output.splitlines()] == [str(i) for i in ids]
    as_json = runner.invoke(main, ["checkpoints", "list", "pipe", "--json", *server])
    assert [json.loads(line)["id"] for line in as_json.output.splitlines()] == ids
    shown = runner.invoke(main, ["checkpoints", "show", "pipe", "--json", *server])
    assert json.loads(shown.output)["properties"] == {"batch": 1}
    shown = runner.invoke(main, ["checkpoints", "show", "pipe", str(ids[0]), *server])
    assert shown.exit_code == 0 and '{"batch": 0}' in shown.output and "task 1: bytes, 1 files, 3 bytes" in shown.output
    out = tmp_path / "out"
    restored = runner.invoke(main, ["checkpoints", "restore", "pipe", "--task", "0", "-o", str(out), *server])
    assert restored.exit_code == 0, restored.output
    assert read_tree(out) == {"a": b"1"}
    again = runner.invoke(main, ["checkpoints", "restore", "pipe", "--task", "0", "-o", str(out), *server])
    assert again.exit_code == 2 and "exists" in again.output  # a usage error, one line
    deleted = runner.invoke(main, ["checkpoints", "delete", "pipe", str(ids[1]), *server])
    assert deleted.exit_code == 0
    missing = runner.invoke(main, ["checkpoints", "delete", "pipe", str(ids[1]), *server])
    assert missing.exit_code == 1 and f"no checkpoint {ids[1]}" in missing.output
    assert "Traceback" not in missing.output
    none = runner.invoke(main, ["checkpoints", "show", "nothing-here", *server])
    assert none.exit_code == 1 and "no completed checkpoint" in none.output
    bad = runner.invoke(main, ["checkpoints", "list", "../etc", *server])
    assert bad.exit_code == 2 and "pipeline name" in bad.output


def test_the_pages_examples_run_as_written(server_thread: ServerThread, tmp_path: Path) -> None:
    from tests.test_docs_examples import ROOT, blocks

    page = ROOT / "docs" / "checkpoints.md"
    first, driver = blocks(page, "python")[:2]  # the third, On Spark, runs in tests/test_spark_checkpoints.py
    for code in (first, driver, driver):  # the driver twice: the second run goes on from the first
        code = code.replace("127.0.0.1:6130", server_thread.address).replace("/tmp/", f"{tmp_path}/")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    with CheckpointStore(server_thread.address, "clicks") as store:
        latest = store.latest()
        assert latest is not None and latest.properties == {"batch": 13}  # 7, then 8 to 10, then 11 to 13
        assert [c.properties["batch"] for c in store.list()] == [12, 13]


def test_a_record_is_fsynced_before_its_rename_and_its_directory_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blobsvc.ha.checkpoints import FileCheckpointRecords
    from tests.test_durability import CallLog

    records = FileCheckpointRecords(tmp_path)
    epoch = records.register("p")
    log = CallLog(tmp_path)
    for name, path_args in (("fsync", 1), ("replace", 2)):
        monkeypatch.setattr(os, name, log.wrap(name, getattr(os, name), path_args))
    records.add("p", epoch, {"id": 1, "timestamp": 1.0, "savepoint": False, "metadata": "0" * 64})
    final = "p/completed/00000000000000000001"
    renamed = log.index("replace", lambda paths: paths[1] == final)
    temporary = log.calls[renamed].paths[0]
    synced = log.index("fsync", lambda paths: paths == (temporary,))
    directory_synced = log.index("fsync", lambda paths: paths == ("p/completed",))
    assert synced < renamed < directory_synced, log.calls


def test_discarded_state_frees_the_servers_disk(server_thread: ServerThread, tmp_path: Path) -> None:
    storage = server_thread.server.storage
    with CheckpointStore(server_thread.address, "pipe", retain=1) as store:
        unchanged = {f"f{i}": os.urandom(100_000) for i in range(3)}
        for generation in range(4):  # twice the same state (linked again), then new state twice
            files = unchanged if generation < 2 else {f"f{i}": os.urandom(100_000) for i in range(3)}
            state = write_tree(tmp_path / f"s{generation}", files)
            with store.begin(tasks=["0"]) as pending:
                pending.acknowledge("0", store.snapshot("0", state))
            metadata_size = store.records()[0]["metadata_size"]
            assert storage.usage() == (3 + 1, 300_000 + metadata_size)  # the retained checkpoint's, nothing else


def test_holds_and_pending_checkpoints_are_bounded(
    store: CheckpointStore, monkeypatch: pytest.MonkeyPatch, server_thread: ServerThread
) -> None:
    import blobsvc.server.checkpoints as records

    monkeypatch.setattr(records, "MAX_HOLDS", 2)
    monkeypatch.setattr(records, "MAX_PENDING", 1)
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", b"x"))
    request = {"action": "hold", "pipeline": "pipe", "id": pending.id, "seconds": 60}
    with BlobClient(server_thread.address, retries=0) as client:
        tokens = [client.checkpoints(request)["token"] for _ in range(2)]
        with pytest.raises(Busy, match="2 restores hold"):
            client.checkpoints(request)
    with BlobClient(server_thread.address, retries=0) as client:
        client.checkpoints({"action": "release", "pipeline": "pipe", "token": tokens[0]})
        client.checkpoints(request)  # room again
    store.begin(tasks=["0"])
    epoch = store.coordinator.epoch
    with (
        BlobClient(server_thread.address, retries=0) as client,
        pytest.raises(Busy, match="1 checkpoints of pipe are pending"),
    ):
        client.checkpoints({"action": "trigger", "pipeline": "pipe", "epoch": epoch, "timeout": 60})


def test_a_task_restores_from_the_handle_its_driver_sent(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", write_tree(tmp_path / "s", {"a": b"1", "b/c": b"2"})))
    latest = store.latest()
    assert latest is not None
    shipped = pickle.dumps((latest.id, latest.tasks["0"]))  # what the driver sends the task
    checkpoint_id, handle = pickle.loads(shipped)
    with CheckpointStore(store.client.server, "pipe") as on_the_executor:
        restored = on_the_executor.restore(checkpoint_id, handle, tmp_path / "r")
        assert read_tree(restored) == {"a": b"1", "b/c": b"2"}
        with pytest.raises(NotFound):  # a checkpoint that is not there is not held
            on_the_executor.restore(checkpoint_id + 1, handle.to_json(), tmp_path / "r2")
    assert not (tmp_path / "r2").exists()


def test_retention_never_deletes_state_a_checkpoint_references(settings: Settings, tmp_path: Path) -> None:
    aggressive = replace(settings, content_ttl=0.001, max_store_bytes=1, retention_grace=0.0)
    running = ServerThread(aggressive).start()
    try:
        with CheckpointStore(running.address, "pipe", retain=2) as store:
            for data in (b"first" * 1000, b"second" * 1000):
                with store.begin(tasks=["0"]) as pending:
                    pending.acknowledge("0", store.snapshot("0", data))
            store.client.put(b"unreferenced content" * 1000)  # what retention may take
            for stored in (settings.data_dir / "objects").iterdir():  # every blob unread for an hour
                os.utime(stored, (time.time() - 3600, stored.stat().st_mtime))
            swept = asyncio.run_coroutine_threadsafe(running.server.retention.sweep(), running.loop).result(30)
            assert [candidate.size for candidate in swept] == [len(b"unreferenced content" * 1000)]
            for checkpoint, data in zip(store.list(), (b"first" * 1000, b"second" * 1000), strict=True):
                assert checkpoint.restore("0", tmp_path / str(checkpoint.id)).read_bytes() == data
    finally:
        running.stop()


def test_a_trigger_waits_out_the_minimum_pause_after_a_completion(server_thread: ServerThread) -> None:
    with CheckpointStore(server_thread.address, "pipe", min_pause=0.3) as store:
        with store.begin(tasks=["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", b"x"))
        completed = time.monotonic()
        store.begin(tasks=["0"]).abort("only the wait mattered")
        assert time.monotonic() - completed >= 0.3


def test_nothing_is_discarded_while_a_checkpoint_is_pending(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=["0"]) as old:
        old.acknowledge("0", store.snapshot("0", b"old"))
    pending = store.begin(tasks=["0"])
    pending.acknowledge("0", store.snapshot("0", b"linked while pending"))
    store.delete(old.id)  # a discard: the pending checkpoint's state is referenced by nothing retained yet
    assert store.records() == []
    completed = pending.complete()  # its state is all there still
    assert completed.restore("0", tmp_path / "r").read_bytes() == b"linked while pending"


def test_a_checkpoint_completed_inside_its_block_leaves_it_quietly(store: CheckpointStore) -> None:
    with store.begin(tasks=["0"]) as pending:
        pending.acknowledge("0", store.snapshot("0", b"x"))
        completed = pending.complete()
    assert pending.completed == completed and [c.id for c in store.list()] == [completed.id]


def test_a_store_of_something_else_than_a_server_or_blocking_client_is_refused() -> None:
    from blobsvc import AsyncBlobClient

    with pytest.raises(TypeError, match="not AsyncBlobClient"):
        CheckpointStore(AsyncBlobClient("127.0.0.1:1"), "pipe")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pipeline name"):
        CheckpointStore("127.0.0.1:1", "no/slashes")


def test_a_restarted_server_still_knows_what_is_pending(settings: Settings, tmp_path: Path) -> None:
    fixed = replace(settings, port=str(free_port()))  # the client finds the restarted server there
    running = ServerThread(fixed).start()
    client = BlobClient(running.address, retries=5, backoff=0.05)
    try:
        with CheckpointStore(client, "pipe") as store:
            with store.begin(tasks=["0"]) as old:
                old.acknowledge("0", store.snapshot("0", b"old"))
            pending = store.begin(tasks=["0"])
            pending.acknowledge("0", store.snapshot("0", b"linked before the restart"))
            running.stop()
            running = ServerThread(fixed).start()
            assert store.client.checkpoints({"action": "list", "pipeline": "pipe"})["pending"] == [pending.id]
            store.delete(old.id)  # a discard: the pending checkpoint's state must stay
            assert pending.complete().restore("0", tmp_path / "r").read_bytes() == b"linked before the restart"
    finally:
        client.close()
        running.stop()


def free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("properties", [{1: "a"}, {"t": (1, 2)}, {"x": object()}, {"n": float("nan")}])
def test_properties_that_would_not_come_back_as_given_are_refused(
    store: CheckpointStore, properties: dict[Any, Any]
) -> None:
    with pytest.raises(InvalidArgument, match="properties"):
        store.begin(tasks=["0"], properties=properties)
    assert store.coordinator.pending == []


def test_the_package_needs_no_pyspark() -> None:
    """(That it never imports the server is import-linter's contract: ``blobsvc`` itself does.)"""
    code = "import sys, blobsvc.checkpoints; print('pyspark' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "False"


def test_partition_numbers_are_task_names(store: CheckpointStore, tmp_path: Path) -> None:
    with store.begin(tasks=range(2)) as pending:
        for partition in range(2):
            pending.acknowledge(partition, store.snapshot(partition, b"partition %d" % partition))
    latest = store.latest()
    assert latest is not None and sorted(latest.tasks) == ["0", "1"]
    assert latest.restore(1, tmp_path / "r").read_bytes() == b"partition 1"
    with pytest.raises(InvalidArgument, match="task name"):
        store.begin(tasks=[-1])
