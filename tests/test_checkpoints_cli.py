"""``blobsvc checkpoints``: history, keep, whole restores and one-line mistakes, against a real server."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from blobsvc._exceptions import InvalidArgument, NotFound
from blobsvc.checkpoints import CheckpointError, CheckpointStore
from blobsvc.cli import main
from blobsvc.wire._checkpoints import pipeline_job, state_name
from tests.conftest import ServerThread


def run(server: ServerThread, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["checkpoints", *args, "-s", server.address])
    assert "Traceback" not in result.output and "Usage" not in result.output, result.output
    return result.exit_code, result.output


def take(store: CheckpointStore, tasks: dict[str, bytes]) -> int:
    with store.begin(tasks=list(tasks)) as pending:
        for task, data in tasks.items():
            pending.acknowledge(task, store.snapshot(task, data))
    return pending.id


def test_restore_without_a_task_restores_every_task_at_once(server_thread: ServerThread, tmp_path: Path) -> None:
    with CheckpointStore(server_thread.address, "whole", retain=None) as store:
        checkpoint_id = take(store, {"0": b"zero", "1": b"one", "2": b"two"})
        checkpoint = store.get(checkpoint_id)
        with pytest.raises(InvalidArgument, match="no task '7'; its tasks: 0, 1, 2"):
            checkpoint.restore("7", tmp_path / "seven")
    code, output = run(server_thread, "restore", "whole", "-o", str(tmp_path / "all"))
    assert code == 0 and "restored 3 tasks" in output
    assert {p.name: p.read_bytes() for p in (tmp_path / "all").iterdir()} == {"0": b"zero", "1": b"one", "2": b"two"}
    code, output = run(server_thread, "restore", "whole", "-o", str(tmp_path / "all"))
    assert code == 1 and "exists" in output
    code, output = run(server_thread, "restore", "whole", "--task", "7", "-o", str(tmp_path / "x"))
    assert code == 1 and "its tasks: 0, 1, 2" in output
    code, output = run(server_thread, "restore", "whole", "--task", "0", "-o", "/proc/blobsvc-restore")
    assert code == 1 and "/proc/blobsvc-restore" in output and ".restore-" not in output and ".part" not in output
    code, output = run(server_thread, "restore", "whole", "-o", "/proc/blobsvc-restore")
    assert code == 1 and "/proc/blobsvc-restore" in output and ".restore-" not in output and ".part" not in output
    code, output = run(server_thread, "restore", "whole", "-o", str(tmp_path / "no" / "parent"))
    assert code == 1 and "is not a directory" in output


def test_a_whole_restore_that_fails_leaves_nothing(server_thread: ServerThread, tmp_path: Path) -> None:
    with CheckpointStore(server_thread.address, "whole-fail") as store:
        take(store, {"0": b"zero", "1": b"one"})
        checkpoint = store.latest()
        assert checkpoint is not None
        # A task's state gone from the server: the restore of the later task fails, no half shows.
        (tmp_path / "out").mkdir()
        key = bytes.fromhex(checkpoint.tasks["1"].files[0].key)
        store.client.delete(job=pipeline_job("whole-fail"), name=state_name(key))
        with pytest.raises(NotFound, match="state/"):
            checkpoint.restore_all(tmp_path / "out" / "half")
        assert os.listdir(tmp_path / "out") == []


def test_history_keep_delete_and_list_say_what_they_did(
    server_thread: ServerThread, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = CheckpointStore(server_thread.address, "cli-history", retain=1)
    with store:
        first = take(store, {"0": b"a"})
        pending = store.begin(tasks=["0"])
        pending.abort("declined by task 0")
        second = take(store, {"0": b"b"})
        taken_at = store.get(second).timestamp
    code, output = run(server_thread, "history", "cli-history")
    lines = [line.split("\t") for line in output.splitlines()]
    assert code == 0 and [(line[0], line[1]) for line in lines] == [
        (str(second), "completed"),
        (str(pending.id), "aborted"),
        (str(first), "subsumed"),
    ]
    assert lines[1][-1] == "declined by task 0" and lines[0][5] == "1/1" and lines[0][3].endswith("Z")
    code, output = run(server_thread, "history", "cli-history", "--json")
    assert [json.loads(line)["status"] for line in output.splitlines()] == ["completed", "aborted", "subsumed"]
    monkeypatch.setenv("TZ", "Asia/Kolkata")  # times are UTC whatever the host's zone
    time.tzset()
    try:
        code, output = run(server_thread, "list", "cli-history")
    finally:
        monkeypatch.undo()
        time.tzset()
    taken = datetime.fromtimestamp(taken_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert output.split("\t")[1] == taken
    code, output = run(server_thread, "keep", "cli-history", str(second))
    assert code == 0 and f"kept checkpoint {second}" in output
    code, output = run(server_thread, "list", "cli-history", "--json")
    assert [(json.loads(line)["id"], json.loads(line)["tasks"]) for line in output.splitlines()] == [(second, 1)]
    code, output = run(server_thread, "delete", "cli-history", str(second))
    assert code == 0 and f"deleted checkpoint {second} of cli-history" in output and "discarded" in output
    code, output = run(server_thread, "list", "cli-history")
    assert code == 0 and output.strip() == "pipeline cli-history has no completed checkpoint on this server"
    code, output = run(server_thread, "keep", "cli-history", str(second))
    assert code == 1 and f"no checkpoint {second}" in output


def test_spark_tasks_refuse_a_checkpoint_of_other_partitions(server_thread: ServerThread) -> None:
    from blobsvc.spark._checkpoints import SparkCheckpoints
    from blobsvc.spark._local import CacheOptions

    store = CheckpointStore(server_thread.address, "repartitioned")
    with SparkCheckpoints(store, CacheOptions(server_thread.address)) as ckpt:
        take(store, {str(p): b"%d" % p for p in range(8)})
        latest = ckpt.latest()
        assert ckpt.tasks(latest, partitions=8).restore_from is not None
        with pytest.raises(CheckpointError, match="has 8 tasks, not this job's 4 partitions: use another pipeline"):
            ckpt.tasks(latest, partitions=4)


def test_a_one_shot_command_gives_up_once_when_zookeeper_is_down() -> None:
    import socket

    with socket.socket() as probe:  # a port nobody listens on: ZooKeeper down
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = CliRunner().invoke(
        main, ["checkpoints", "list", "p", "-s", f"zk://127.0.0.1:{port}/c", "--connect-timeout", "1"]
    )
    assert result.exit_code == 1 and "cannot reach ZooKeeper" in result.output and "1 attempt)" in result.output
