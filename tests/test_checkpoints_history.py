"""The checkpoint history (Flink's checkpoint statistics) against real servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from blobsvc.checkpoints import CheckpointStore
from blobsvc.config import Settings
from tests.conftest import ServerProcess, ServerThread


@pytest.fixture
def store(server_thread: ServerThread) -> Iterator[CheckpointStore]:
    with CheckpointStore(server_thread.address, "hist", retain=1, timeout=30) as opened:
        yield opened


def take(store: CheckpointStore, tasks: dict[str, bytes]) -> int:
    with store.begin(tasks=list(tasks)) as pending:
        for task, data in tasks.items():
            pending.acknowledge(task, store.snapshot(task, data))
    return pending.id


def test_history_shows_in_progress_aborted_completed_and_subsumed(store: CheckpointStore) -> None:
    first = take(store, {"0": b"a" * 100, "1": b"b" * 50})
    pending = store.begin(tasks=["0", "1"])
    pending.acknowledge("0", store.snapshot("0", b"a" * 100))
    in_progress = store.history()[0]
    assert (in_progress["id"], in_progress["status"], in_progress["expected"]) == (pending.id, "in_progress", 2)
    assert in_progress["duration"] is None and in_progress["state_bytes"] is None
    pending.abort("task 1 failed")
    second = take(store, {"0": b"a" * 100, "1": b"c" * 70})
    history = store.history()
    assert [(e["id"], e["status"]) for e in history] == [
        (second, "completed"),
        (pending.id, "aborted"),
        (first, "subsumed"),
    ]
    done, aborted = history[0], history[1]
    assert "task 1 failed" in aborted["reason"] and aborted["duration"] >= 0
    assert (done["acknowledged"], done["expected"], done["kind"]) == (2, 2, "checkpoint")
    assert (done["state_bytes"], done["bytes_sent"], done["bytes_reused"]) == (170, 70, 100)
    assert done["duration"] >= 0 and done["reason"] is None
    assert [e["id"] for e in store.history(limit=1)] == [second]


def test_the_server_object_answers_the_history_and_its_pipelines(server_thread: ServerThread) -> None:
    with CheckpointStore(server_thread.address, "seen", timeout=30) as store:
        checkpoint_id = take(store, {"0": b"x"})
    checkpoints = server_thread.server.checkpoints
    assert "seen" in checkpoints.pipelines()
    history = asyncio.run_coroutine_threadsafe(checkpoints.history("seen"), server_thread.loop).result(30)
    assert [(e["id"], e["status"]) for e in history] == [(checkpoint_id, "completed")]
    assert set(history[0]) == {  # what the web page codes against
        "id", "kind", "status", "reason", "trigger_time", "duration", "acknowledged", "expected",
        "state_bytes", "bytes_sent", "bytes_reused",
    }  # fmt: skip


def test_completed_checkpoints_history_outlives_a_restart(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    first = spawn_server()
    with CheckpointStore(first.address, "restarted", retain=2, timeout=30) as store:
        ids = [take(store, {"0": b"x" * 10}), take(store, {"0": b"y" * 20})]
        before = store.history()
    first.kill()
    second = spawn_server()
    with CheckpointStore(second.address, "restarted", retain=2, timeout=30) as store:
        after = store.history()
    assert [e["id"] for e in after] == ids[::-1]
    assert after == before


def test_the_history_is_bounded_by_its_setting_and_completions_are_metrics(settings: Settings) -> None:
    from tests.test_metrics import scrape, value

    running = ServerThread(replace(settings, metrics_port="0", checkpoint_history=2)).start()
    try:
        with CheckpointStore(running.address, "bounded", retain=None, timeout=30) as store:
            ids = [take(store, {"0": b"z" * size}) for size in (10, 20, 30)]
            assert [e["id"] for e in store.history()] == ids[:0:-1]  # the newest 2
        assert running.server.metrics is not None and running.server.metrics.address is not None
        samples = scrape(running.server.metrics.address)
    finally:
        running.stop()
    assert value(samples, "blobsvc_checkpoints_last_state_bytes") == 30
    assert 0 <= value(samples, "blobsvc_checkpoints_last_duration_seconds") < 30
    assert value(samples, "blobsvc_checkpoints_duration_seconds_count") == 3
    assert value(samples, "blobsvc_checkpoints_duration_seconds_bucket", le="+Inf") == 3
    assert value(samples, "blobsvc_checkpoints_duration_seconds_bucket", le="1800.0") == 3


def test_a_restarted_server_knows_the_pipelines_of_its_records(settings: Settings) -> None:
    first = ServerThread(settings).start()
    try:
        with CheckpointStore(first.address, "known-after-restart", timeout=30) as store:
            take(store, {"0": b"k"})
    finally:
        first.stop()
    second = ServerThread(settings).start()
    try:
        deadline = time.monotonic() + 10
        while "known-after-restart" not in second.server.checkpoints.pipelines() and time.monotonic() < deadline:
            time.sleep(0.05)  # the clock lists the records at its first tick
        assert second.server.checkpoints.pipelines() == ["known-after-restart"]
    finally:
        second.stop()


def test_asking_for_made_up_pipelines_costs_the_server_no_memory(server_thread: ServerThread) -> None:
    with CheckpointStore(server_thread.address, "made-up-0") as store:
        for n in range(50):
            reply = store.client.checkpoints({"action": "history", "pipeline": f"made-up-{n}"})
            assert reply == {"history": []}
    stats = server_thread.server.checkpoints.stats
    assert not any(name.startswith("made-up") for name in stats.rebuilt | set(stats.pipelines()))


def test_what_a_coordinator_reports_is_bounded_and_checked(store: CheckpointStore) -> None:
    epoch = store.coordinator.epoch
    request = {"action": "trigger", "pipeline": "hist", "epoch": epoch, "timeout": 30}
    lying = store.client.checkpoints({**request, "expected": 10**12})["id"]
    store.client.checkpoints(
        {"action": "abort", "pipeline": "hist", "epoch": epoch, "id": lying, "reason": "x" * 10_000}
    )
    odd = store.client.checkpoints({**request, "expected": "eight"})["id"]
    history = {entry["id"]: entry for entry in store.history()}
    assert history[lying]["expected"] is None and len(history[lying]["reason"]) == 500
    assert history[odd]["expected"] is None and history[odd]["status"] == "in_progress"
