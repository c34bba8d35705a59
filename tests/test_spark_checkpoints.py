"""Checkpoints through Spark on ``local-cluster[2,1,1024]``: the example pipeline's driver is
killed with SIGKILL in the middle of a checkpoint's uploads, and a new application resumes
from the latest completed checkpoint and ends with the totals of a run never killed: the sums
of every batch's events, which the example's replayable source gives (so the test starts two
Spark applications, not three).

The drivers are separate processes running ``examples/checkpoint_pipeline.py`` as a user
would; the server runs here, and one of its request observers sends the SIGKILL when the first
state file of the chosen checkpoint has arrived (so the kill lands during that checkpoint's
uploads on every run, however slow the machine)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from blobsvc import Settings
from blobsvc.checkpoints import CheckpointStore
from blobsvc.wire._protocol import CheckpointsRequest, PutRequest

from .conftest import ServerThread

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLE = Path(__file__).parent.parent / "examples" / "checkpoint_pipeline.py"
PIPELINE = "clicks"
BATCHES = 4
KILLED_IN = 3  # the third checkpoint (batch 2): two completed before it


def load_example() -> Any:
    spec = importlib.util.spec_from_file_location("checkpoint_pipeline", EXAMPLE)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example


@dataclass
class KillAtUpload:
    """A server observer: SIGKILLs ``pid`` when the first state file of the ``checkpoint``-th
    trigger has been received; counts the state bytes the server received (a snapshot PUTs a
    file's bytes as ``state/<key>``, or by content alone and then LINKs that name)."""

    checkpoint: int
    pid: int | None = None
    triggers: int = 0
    killed: bool = False
    state_bytes: int = 0
    at_trigger: dict[int, int] = field(default_factory=dict)
    """State bytes received before each trigger, by the trigger's number (from 1)."""

    def __call__(self, event: Any, outcome: int, moved: int, seconds: float, stream: Any) -> None:
        if outcome != 0:
            return
        if isinstance(event, CheckpointsRequest) and event.request.get("action") == "trigger":
            self.triggers += 1
            self.at_trigger[self.triggers] = self.state_bytes
        elif isinstance(event, PutRequest) and (event.target is None or event.target.name.startswith("state/")):
            self.state_bytes += moved
            if self.pid is not None and self.triggers == self.checkpoint and not self.killed:
                os.kill(self.pid, signal.SIGKILL)
                self.killed = True


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    root = tmp_path_factory.mktemp("server")
    running = ServerThread(Settings(host="127.0.0.1", port="0", data_dir=root / "data", io_timeout=10.0)).start()
    yield running
    running.stop()


def start_driver(server: ServerThread, root: Path) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "BLOBSVC_SERVER": server.address,
        "BLOBSVC_CACHE_DIR": str(root / "cache"),
        "SPARK_WORKER_DIR": str(root / "work"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
    }
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--pipeline", PIPELINE, "--batches", str(BATCHES)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,  # its JVMs too, to end whatever outlives the driver
    )


def end_group(driver: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(driver.pid, signal.SIGKILL)


def test_a_driver_killed_mid_checkpoint_resumes_from_the_latest_and_ends_as_if_never_killed(
    server: ServerThread, tmp_path: Path
) -> None:
    example = load_example()
    observer = KillAtUpload(KILLED_IN)
    server.server.observers.append(observer)
    killed = start_driver(server, tmp_path)
    observer.pid = killed.pid
    try:
        killed.wait(timeout=120)
    finally:
        end_group(killed)  # the JVMs it started would go by themselves, a little later
    assert killed.stdout is not None
    output = killed.stdout.read()
    assert killed.returncode == -signal.SIGKILL and observer.killed, output
    assert "batch 1: checkpoint 2 completed" in output and "batch 2:" not in output
    with CheckpointStore(server.address, PIPELINE) as store:
        assert [record["id"] for record in store.records()] == [1, 2]  # checkpoint 3: never visible

    before = server.server.status()
    resumed = start_driver(server, tmp_path)
    try:
        output, _ = resumed.communicate(timeout=120)
    finally:
        end_group(resumed)
    assert resumed.returncode == 0, output
    assert "resuming after checkpoint 2 (batch 1)" in output
    uninterrupted: Counter[int] = Counter()
    for batch in range(BATCHES):
        for user, clicks in example.events(batch):
            uninterrupted[user] += clicks
    totals = next(line for line in output.splitlines() if line.startswith("totals: "))
    assert dict(json.loads(totals.removeprefix("totals: "))) == uninterrupted

    # Unchanged segments were linked, not sent: in each checkpoint only the batch's own segment
    # may have been sent, and the server received exactly the bytes the checkpoints say were.
    after = server.server.status()
    with CheckpointStore(server.address, PIPELINE) as store:
        retained = store.list()
    assert [checkpoint.properties["batch"] for checkpoint in retained] == [2, 3]
    for checkpoint in retained:
        new = f"batch-{checkpoint.properties['batch']:05d}.json"
        for handle in checkpoint.tasks.values():
            assert len(handle.files) == checkpoint.properties["batch"] + 1
            assert all(not entry.sent for entry in handle.files if entry.path != new), handle
    sent = after["checkpoints_state_bytes_sent"] - before["checkpoints_state_bytes_sent"]
    reused = after["checkpoints_state_bytes_reused"] - before["checkpoints_state_bytes_reused"]
    # Counted from the new driver's first trigger: the killed one's tasks may still have been
    # finishing an upload as their JVMs died.
    assert sent == observer.state_bytes - observer.at_trigger[KILLED_IN + 1]
    assert sent + reused == sum(checkpoint.size for checkpoint in retained)
    assert reused > 2 * sent  # 5 of the 7 segments in the two checkpoints were there already
