"""The server decides each checkpoint's life, at a bounded cost: raw CHECKPOINTS requests
(``BlobClient.checkpoints`` sends the request's JSON as it is) against a real server, forging
what a client could forge: ids, epochs, metadata, holds (blobsvc/server/checkpoints.py)."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

import blobsvc.server._checkpoint_metadata as metadata_module
import blobsvc.server.checkpoints as server_checkpoints
import blobsvc.wire._checkpoints as wire
from blobsvc import BlobClient
from blobsvc._exceptions import BadRequest, Busy, Fenced, InvalidArgument, NotFound
from blobsvc.config import Settings
from blobsvc.ha.checkpoints import FileCheckpointRecords
from blobsvc.wire._checkpoints import metadata_name, parse_metadata, pipeline_job, state_name
from tests.conftest import ServerThread


@pytest.fixture
def client(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, retries=0) as opened:
        yield opened


def request(client: BlobClient, action: str, pipeline: str = "pipe", **fields: Any) -> dict[str, Any]:
    return client.checkpoints({"action": action, "pipeline": pipeline, **fields})


def put_metadata(
    client: BlobClient,
    checkpoint_id: int,
    pipeline: str = "pipe",
    *,
    as_id: int | None = None,
    as_pipeline: str | None = None,
    savepoint: bool = False,
    state: bytes = b"state",
) -> str:
    """Put a state blob and checkpoint ``checkpoint_id``'s metadata naming it (or claiming to be
    another's); the metadata blob's key."""
    job = pipeline_job(pipeline)
    key = client.put(state, job=job, name=state_name(blake3.blake3(state).digest()))
    document = {
        "format": 1,
        "pipeline": as_pipeline or pipeline,
        "id": as_id or checkpoint_id,
        "timestamp": 1.0,
        "savepoint": savepoint,
        "properties": {},
        "tasks": [{"task": "0", "kind": "bytes", "files": [{"path": "", "size": len(state), "key": key}]}],
    }
    return client.put(json.dumps(document).encode(), job=job, name=metadata_name(checkpoint_id))


def complete(client: BlobClient, epoch: int, checkpoint_id: int, key: str, pipeline: str = "pipe") -> dict[str, Any]:
    return request(client, "complete", pipeline, epoch=epoch, id=checkpoint_id, metadata=key, retain=1)


def completed_ids(client: BlobClient, pipeline: str = "pipe") -> list[int]:
    return [record["id"] for record in request(client, "list", pipeline)["checkpoints"]]


def test_only_an_id_the_server_triggered_completes(client: BlobClient) -> None:
    epoch = request(client, "register")["epoch"]
    with pytest.raises(NotFound, match="no pending checkpoint 4611686018427387904"):
        complete(client, epoch, 1 << 62, put_metadata(client, 1 << 62))
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id))
    assert completed_ids(client) == [checkpoint_id]
    other = request(client, "register", "other")["epoch"]
    with pytest.raises(NotFound):  # an id of another pipeline is not this one's
        complete(client, other, checkpoint_id, put_metadata(client, checkpoint_id, "other"), "other")


def test_an_abort_is_final(client: BlobClient) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    key = put_metadata(client, checkpoint_id)
    request(client, "abort", epoch=epoch, id=checkpoint_id)
    with pytest.raises(NotFound, match="aborted"):
        complete(client, epoch, checkpoint_id, key)
    assert completed_ids(client) == []
    assert request(client, "trigger", epoch=epoch, timeout=30)["id"] > checkpoint_id  # ids only go up


def test_only_the_coordinator_that_triggered_a_checkpoint_aborts_it(client: BlobClient) -> None:
    old = request(client, "register")["epoch"]
    stale = request(client, "trigger", epoch=old, timeout=30)["id"]
    new = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=new, timeout=30)["id"]
    with pytest.raises(Fenced):  # a replaced coordinator, cleaning up late
        request(client, "abort", epoch=old, id=checkpoint_id)
    with pytest.raises(BadRequest, match="epoch"):
        request(client, "abort", id=checkpoint_id)
    assert request(client, "list")["pending"] == [checkpoint_id]
    request(client, "abort", epoch=new, id=stale)  # forgotten at the new registration: aborted already
    request(client, "abort", epoch=new, id=checkpoint_id)
    assert request(client, "list")["pending"] == []


def test_a_checkpoint_past_its_deadline_never_completes(client: BlobClient) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=0.2)["id"]
    key = put_metadata(client, checkpoint_id)
    time.sleep(0.3)
    with pytest.raises(NotFound, match="timed out"):
        complete(client, epoch, checkpoint_id, key)


def test_a_stale_epoch_or_unknown_id_is_refused_before_the_metadata_is_read(client: BlobClient) -> None:
    """Metadata that is not JSON at all: only reading it could say BAD_REQUEST."""
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    garbage = client.put(b"{" * 1000, job=pipeline_job("pipe"), name=metadata_name(checkpoint_id))
    with pytest.raises(Fenced, match="epoch 99"):
        complete(client, 99, checkpoint_id, garbage)
    with pytest.raises(NotFound):
        complete(client, epoch, checkpoint_id + 1, garbage)
    with pytest.raises(BadRequest, match="not UTF-8 JSON"):  # the id and epoch are right: now it is read
        complete(client, epoch, checkpoint_id, garbage)


@pytest.mark.parametrize(
    ("claim", "words"),
    [
        ({"as_id": 1234}, "is checkpoint 1234 of pipe"),
        ({"as_pipeline": "elsewhere"}, "of elsewhere"),
        ({"savepoint": True}, "is savepoint"),
    ],
)
def test_the_metadata_must_be_that_checkpoints(client: BlobClient, claim: dict[str, Any], words: str) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    with pytest.raises(BadRequest, match=words):
        complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id, **claim))
    assert completed_ids(client) == []


def test_a_replaced_coordinator_is_fenced_even_after_its_metadata_went(client: BlobClient) -> None:
    old = request(client, "register")["epoch"]
    stale = request(client, "trigger", epoch=old, timeout=30)["id"]
    stale_key = put_metadata(client, stale, state=b"old state")
    new = request(client, "register")["epoch"]
    fresh = request(client, "trigger", epoch=new, timeout=30)["id"]
    complete(client, new, fresh, put_metadata(client, fresh))
    assert completed_ids(client) == [fresh]  # and the discard it started is done
    assert metadata_name(stale) not in {info.name for info in client.list(pipeline_job("pipe"))}
    with pytest.raises(Fenced, match=f"epoch {old} was replaced"):
        complete(client, old, stale, stale_key)


def test_completing_a_checkpoint_aborts_the_older_pending_ones_but_savepoints(client: BlobClient) -> None:
    """Server rule from Flink's CheckpointCoordinatorTest
    (testSuccessfulCheckpointSubsumesOlderPendingCheckpoints)."""
    epoch = request(client, "register")["epoch"]
    older = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    savepoint = request(client, "trigger", epoch=epoch, timeout=30, savepoint=True)["id"]
    newer = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    older_key = put_metadata(client, older)
    complete(client, epoch, newer, put_metadata(client, newer))
    assert request(client, "list")["pending"] == [savepoint]
    with pytest.raises(NotFound):
        complete(client, epoch, older, older_key)
    complete(client, epoch, savepoint, put_metadata(client, savepoint, savepoint=True))
    assert completed_ids(client) == [savepoint, newer]


def test_the_server_aborts_a_silent_coordinators_checkpoint_at_its_deadline(
    client: BlobClient, server_thread: ServerThread
) -> None:
    """No request names the pipeline after the trigger: only the server's clock can abort it."""
    epoch = request(client, "register")["epoch"]
    request(client, "trigger", epoch=epoch, timeout=0.3)
    job = pipeline_job("pipe")
    name = state_name(blake3.blake3(b"orphan").digest())
    client.put(b"orphan", job=job, name=name)
    deadline = time.monotonic() + 10
    while name in {info.name for info in client.list(job)}:
        assert time.monotonic() < deadline, "the expired checkpoint's state was never discarded"
        time.sleep(0.1)
    assert client.status()["checkpoints_aborted"] == 1


def test_an_expired_hold_lets_its_state_go_without_a_request_naming_its_pipeline(client: BlobClient) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id))
    request(client, "hold", id=checkpoint_id, seconds=0.3)
    request(client, "delete", id=checkpoint_id)  # only the hold keeps its state now
    job = pipeline_job("pipe")
    assert metadata_name(checkpoint_id) in {info.name for info in client.list(job)}
    deadline = time.monotonic() + 10
    while {info.name for info in client.list(job)}:
        assert time.monotonic() < deadline, "the expired hold kept its state"
        time.sleep(0.1)


def test_expired_holds_of_an_idle_pipeline_leave_room_for_others(
    client: BlobClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server_checkpoints, "MAX_HOLDS", 1)
    for pipeline in ("idle", "busy"):
        epoch = request(client, "register", pipeline)["epoch"]
        checkpoint_id = request(client, "trigger", pipeline, epoch=epoch, timeout=30)["id"]
        complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id, pipeline), pipeline)
    request(client, "hold", "idle", id=1, seconds=0.2)
    with pytest.raises(Busy):
        request(client, "hold", "busy", id=1, seconds=60)
    time.sleep(0.3)
    request(client, "hold", "busy", id=1, seconds=60)


def test_a_refused_completion_leaves_nothing_in_memory(client: BlobClient, server_thread: ServerThread) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    remembered = server_thread.server.checkpoints.metadata._keys
    for _ in range(3):
        with pytest.raises(BadRequest):
            complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id, as_id=77))
    assert server_thread.server.checkpoints.metadata._keys == remembered == {}
    complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id))
    assert len(server_thread.server.checkpoints.metadata._keys) == 1


def test_list_never_parses_a_metadata_it_parsed_intact_before(
    client: BlobClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    complete(client, epoch, checkpoint_id, put_metadata(client, checkpoint_id))
    parsed: list[int] = []

    def counted(raw: bytes) -> wire.Metadata:
        parsed.append(len(raw))
        return parse_metadata(raw)

    monkeypatch.setattr(metadata_module, "parse_metadata", counted)
    for _ in range(3):
        assert completed_ids(client) == [checkpoint_id]
    assert parsed == []


def test_metadata_over_the_cap_is_refused_from_its_size(client: BlobClient, monkeypatch: pytest.MonkeyPatch) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    key = put_metadata(client, checkpoint_id)
    monkeypatch.setattr(metadata_module, "MAX_METADATA_BYTES", 100)
    read: list[int] = []
    monkeypatch.setattr(metadata_module, "_read", lambda *args: read.append(1))
    with pytest.raises(BadRequest, match="over the limit of 100"):
        complete(client, epoch, checkpoint_id, key)
    assert read == []


def test_metadata_of_too_many_json_values_is_refused_before_it_is_parsed() -> None:
    tiny = b'{"format":1,"properties":[' + b",".join([b"[]"] * (wire.MAX_METADATA_VALUES + 1)) + b"]}"
    assert len(tiny) < wire.MAX_METADATA_BYTES
    with pytest.raises(InvalidArgument, match=r"more than \d+ JSON values"):
        parse_metadata(tiny)


@pytest.mark.parametrize(
    ("paths", "nested"),
    [
        (["a", "a-b", "a/b"], "'a'"),  # "a-b" sorts between "a" and "a/b" byte-wise
        (["x/y", "x/y.z", "x/y/z/w"], "'x/y'"),
        (["a/b", "a/c", "ab", "a.b/c"], None),
    ],
)
def test_a_path_that_is_another_ones_directory_is_refused(paths: list[str], nested: str | None) -> None:
    if nested is None:
        wire._check_no_nesting("0", paths)
    else:
        with pytest.raises(InvalidArgument, match=f"{nested} is both a file and a directory"):
            wire._check_no_nesting("0", paths)


def test_the_id_counter_and_writer_epoch_are_fsynced_before_they_are_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lost page cache (power cut) cannot be shown by a real part: the fsyncs are watched."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    records = FileCheckpointRecords(tmp_path)
    for bump, name in ((records.register, "writer"), (records.next_id, "counter")):
        synced.clear()
        assert bump("p") == 1
        folder = str(tmp_path / "p")
        files = [path for path in synced if os.path.dirname(path) == folder]
        assert files and folder in synced[synced.index(files[-1]) :], f"{name} was not fsynced, then its directory"
        assert (tmp_path / "p" / name).read_text() == "1"


def test_properties_shaped_like_file_entries_come_back_as_they_were() -> None:
    """The parser keeps file entries as tuples (no dict per file): the properties stay the user's JSON."""
    shaped = {"path": "a", "size": 1, "key": "k"}
    properties = {"entry": shaped, "deeper": [[{**shaped, "sent": True}], {"x": shaped}]}
    document = {"format": 1, "pipeline": "p", "id": 1, "timestamp": 1.0, "savepoint": False, "tasks": []}
    parsed = parse_metadata(json.dumps({**document, "properties": properties}).encode())
    assert parsed.properties == properties
    assert json.dumps(parsed.properties) == json.dumps(properties)


def test_a_restarted_server_aborts_what_its_predecessor_left_pending(settings: Settings) -> None:
    """The clock learns of pending checkpoints from the records, not only from its own triggers."""
    running = ServerThread(settings).start()
    try:
        with BlobClient(running.address, retries=0) as client:
            epoch = request(client, "register")["epoch"]
            request(client, "trigger", epoch=epoch, timeout=1.5)
    finally:
        running.stop()
    records = FileCheckpointRecords(Path(settings.data_dir) / "checkpoints")
    assert len(records.pending("pipe")) == 1
    running = ServerThread(settings).start()
    try:
        deadline = time.monotonic() + 10
        while records.pending("pipe"):
            assert time.monotonic() < deadline, "the restarted server never aborted it"
            time.sleep(0.1)
    finally:
        running.stop()


def test_metadata_is_parsed_off_the_event_loop_one_at_a_time(
    client: BlobClient, server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pipelines complete at once: their parses never overlap, and neither runs on the loop."""
    seen: list[tuple[bool, int]] = []
    active = [0]

    def spied(raw: bytes) -> wire.Metadata:
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        active[0] += 1
        seen.append((on_loop, active[0]))
        time.sleep(0.2)
        active[0] -= 1
        return parse_metadata(raw)

    monkeypatch.setattr(metadata_module, "parse_metadata", spied)
    work = []
    for pipeline in ("left", "right"):
        epoch = request(client, "register", pipeline)["epoch"]
        checkpoint_id = request(client, "trigger", pipeline, epoch=epoch, timeout=30)["id"]
        work.append((pipeline, epoch, checkpoint_id, put_metadata(client, checkpoint_id, pipeline)))

    def run(pipeline: str, epoch: int, checkpoint_id: int, key: str) -> None:
        with BlobClient(server_thread.address, retries=0) as own:
            complete(own, epoch, checkpoint_id, key, pipeline)

    threads = [threading.Thread(target=run, args=args) for args in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert seen == [(False, 1), (False, 1)]
    assert completed_ids(client, "left") == [work[0][2]] and completed_ids(client, "right") == [work[1][2]]


def test_a_checkpoint_triggered_under_another_epoch_is_fenced(
    client: BlobClient, server_thread: ServerThread, settings: Settings
) -> None:
    """A registration whose server died before it forgot the older coordinator's pending
    checkpoints (written here straight into the records): the new writer cannot complete them."""
    old = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=old, timeout=30)["id"]
    new = FileCheckpointRecords(Path(settings.data_dir) / "checkpoints").register("pipe")
    with pytest.raises(Fenced, match="triggered by another coordinator"):
        complete(client, new, checkpoint_id, put_metadata(client, checkpoint_id))


def test_a_completion_retried_with_its_metadata_answers_its_record_and_nothing_else_does(client: BlobClient) -> None:
    epoch = request(client, "register")["epoch"]
    checkpoint_id = request(client, "trigger", epoch=epoch, timeout=30)["id"]
    key = put_metadata(client, checkpoint_id)
    first = complete(client, epoch, checkpoint_id, key)
    assert complete(client, epoch, checkpoint_id, key)["record"] == first["record"]  # an answer lost, retried
    with pytest.raises(NotFound, match="no pending checkpoint"):
        complete(client, epoch, checkpoint_id, "0" * 64)


def test_the_clock_never_waits_for_a_pipelines_request_under_way(
    client: BlobClient, server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A completion that holds its pipeline for seconds (its parse made slow here) does not hold
    up the deadline of another pipeline, which the clock visits after it."""
    checkpoints = server_thread.server.checkpoints
    slow = "a-slow"
    quick = next(f"b-quick-{n}" for n in range(100) if checkpoints._lock(f"b-quick-{n}") is not checkpoints._lock(slow))
    parsing, parsed = threading.Event(), threading.Event()

    def slowly(raw: bytes) -> wire.Metadata:
        parsing.set()
        time.sleep(4)
        parsed.set()
        return parse_metadata(raw)

    epoch = request(client, "register", slow)["epoch"]
    checkpoint_id = request(client, "trigger", slow, epoch=epoch, timeout=60)["id"]
    key = put_metadata(client, checkpoint_id, slow)
    request(client, "trigger", quick, epoch=request(client, "register", quick)["epoch"], timeout=0.2)
    monkeypatch.setattr(metadata_module, "parse_metadata", slowly)

    def run() -> None:
        with BlobClient(server_thread.address, retries=0) as own:
            complete(own, epoch, checkpoint_id, key, slow)

    completing = threading.Thread(target=run)
    completing.start()
    assert parsing.wait(10)
    while client.status()["checkpoints_aborted"] == 0:
        assert completing.is_alive()
        time.sleep(0.05)
    assert not parsed.is_set(), "the clock waited for the slow pipeline's completion"
    completing.join(30)
