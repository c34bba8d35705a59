"""A hypothesis state machine over the checkpoint store and coordinator, against a real server.

Random triggers, acknowledgements, declines, timeouts, completions, deletions, savepoints, and
restarts of the server (same data directory and port) and of the coordinator (a new one takes
over; the old one's pending checkpoint, a zombie, later tries to complete). After every step:
``latest()`` is the highest completed id, the retained checkpoints are exactly the model's and
each restores byte for byte, nothing pending or aborted is visible, and once the pipeline is
settled (nothing pending) no state blob remains that no retained checkpoint references.
"""

from __future__ import annotations

import contextlib
import itertools
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import blake3
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from blobsvc import BlobClient
from blobsvc._exceptions import InvalidArgument
from blobsvc.checkpoints import CheckpointAborted, CheckpointStore, Fenced, PendingCheckpoint
from blobsvc.config import Settings
from blobsvc.wire._checkpoints import pipeline_job, state_name

from .conftest import ServerThread
from .test_checkpoints import free_port

RETAIN = 2
TASKS = ("0", "1")
PIECES = (b"", b"a", b"bb", b"state" * 100)  # few values: unchanged state is common, as in life


@dataclass
class Expected:
    """What the model says a completed checkpoint holds."""

    savepoint: bool
    states: dict[str, dict[str, bytes]]  # task → relative path ("" for bytes) → content


@dataclass
class Pending:
    checkpoint: PendingCheckpoint
    acknowledged: dict[str, dict[str, bytes]] = field(default_factory=dict)


class CheckpointMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="ckpt-machine-"))
        self.settings = Settings(
            host="127.0.0.1",
            port=str(free_port()),
            data_dir=self.directory / "data",
            idle_timeout=5.0,
            io_timeout=2.0,
            shutdown_timeout=1.0,
        )
        self.server = ServerThread(self.settings).start()
        self.clients: list[BlobClient] = []
        self.store = self._new_store()
        self.completed: dict[int, Expected] = {}
        self.pending: Pending | None = None
        self.zombie: Pending | None = None
        self.settled = True  # nothing pending anywhere: discarding has had its turn
        self.counter = itertools.count()

    def _new_store(self) -> CheckpointStore:
        client = BlobClient(self.server.address, timeout=10.0, retries=5, backoff=0.05)
        self.clients.append(client)
        return CheckpointStore(client, "machine", retain=RETAIN, timeout=60)

    def teardown(self) -> None:
        for pending in (self.pending, self.zombie):
            if pending is not None:
                pending.checkpoint._timer.cancel()
        for client in self.clients:
            client.close()
        self.server.stop()
        shutil.rmtree(self.directory, ignore_errors=True)

    # --- rules -------------------------------------------------------------------------------

    @precondition(lambda self: self.pending is None)
    @rule(savepoint=st.booleans())
    def trigger(self, savepoint: bool) -> None:
        self.pending = Pending(self.store.begin(TASKS, {"n": next(self.counter)}, savepoint=savepoint))
        self.settled = False

    @precondition(lambda self: self.pending is None)
    @rule(
        savepoint=st.booleans(),
        pieces=st.lists(st.sampled_from(PIECES), min_size=2 * len(TASKS), max_size=2 * len(TASKS)),
    )
    def take_a_whole_checkpoint(self, savepoint: bool, pieces: list[bytes]) -> None:
        """The common path in one step: trigger, every task acknowledges, complete."""
        self.trigger(savepoint)
        for index, task in enumerate(TASKS):
            self.acknowledge(task, pieces[2 * index], pieces[2 * index + 1])
        self.complete()

    @precondition(lambda self: self.pending is not None)
    @rule(task=st.sampled_from(TASKS), first=st.sampled_from(PIECES), second=st.sampled_from(PIECES))
    def acknowledge(self, task: str, first: bytes, second: bytes) -> None:
        assert self.pending is not None
        if task == "0":
            state, handle = {"": first}, self.store.snapshot(task, first)
        else:
            root = self.directory / f"state-{next(self.counter)}"
            state = {"x": first, "sub/y": second}
            for relative, data in state.items():
                (root / relative).parent.mkdir(parents=True, exist_ok=True)
                (root / relative).write_bytes(data)
            handle = self.store.snapshot(task, root)
        if task in self.pending.acknowledged and self.pending.acknowledged[task] != state:
            with pytest.raises(InvalidArgument, match="already acknowledged"):  # a task's state is given once
                self.pending.checkpoint.acknowledge(task, handle)
            return
        self.pending.checkpoint.acknowledge(task, handle)
        self.pending.acknowledged[task] = state

    @precondition(lambda self: self.pending is not None)
    @rule()
    def complete(self) -> None:
        assert self.pending is not None
        pending, self.pending = self.pending, None
        if len(pending.acknowledged) < len(TASKS):
            with pytest.raises(CheckpointAborted, match="did not acknowledge"):
                pending.checkpoint.complete()
        else:
            completed = pending.checkpoint.complete()
            self._add(completed.id, Expected(pending.checkpoint.savepoint, pending.acknowledged))
        self.settled = True

    def _add(self, checkpoint_id: int, expected: Expected) -> None:
        self.completed[checkpoint_id] = expected
        regular = sorted(i for i, e in self.completed.items() if not e.savepoint)
        for subsumed in regular[: max(0, len(regular) - RETAIN)]:
            del self.completed[subsumed]

    @precondition(lambda self: self.pending is not None)
    @rule(task=st.sampled_from(TASKS))
    def decline(self, task: str) -> None:
        assert self.pending is not None
        self.pending.checkpoint.decline(task, "on purpose")
        self.pending = None
        self.settled = True

    @precondition(lambda self: self.pending is None)
    @rule()
    def time_out(self) -> None:
        checkpoint = self.store.begin(TASKS, timeout=0.05)
        deadline = time.monotonic() + 10
        request = {"action": "list", "pipeline": "machine"}
        # Its timer aborts it, then tells the server: the step ends once the server knows, or
        # the next step would find the abort still under way.
        while checkpoint.state.value == "pending" or checkpoint.id in self.store.client.checkpoints(request)["pending"]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert "timed out" in (checkpoint.reason or "")
        self.settled = True

    @precondition(lambda self: self.pending is None and self.completed)
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        checkpoint_id = data.draw(st.sampled_from(sorted(self.completed)))
        self.store.delete(checkpoint_id)
        del self.completed[checkpoint_id]
        self.settled = True

    @precondition(lambda self: self.pending is None and self.completed)
    @rule(data=st.data())
    def delete_while_restoring(self, data: st.DataObject) -> None:
        """A restore holds its checkpoint: deleted meanwhile, its state is still all there."""
        checkpoint_id = data.draw(st.sampled_from(sorted(self.completed)))
        (checkpoint,) = [c for c in self.store.list() if c.id == checkpoint_id]
        expected = self.completed.pop(checkpoint_id)
        with checkpoint.held():
            self.store.delete(checkpoint_id)
            for task, files in expected.states.items():
                target = self.directory / f"restore-{next(self.counter)}"
                checkpoint.restore(task, target)
                assert _read(target) == files
        self.settled = True

    @rule()
    def restart_server(self) -> None:
        self.server.stop()
        self.server = ServerThread(self.settings).start()  # same data directory, same port

    @rule()
    def restart_coordinator(self) -> None:
        """A new driver takes over; the old one is not told (it crashed, or only paused)."""
        if self.zombie is not None:
            self.zombie.checkpoint._timer.cancel()
        self.zombie, self.pending = self.pending, None
        self.store = self._new_store()
        self.store.coordinator  # noqa: B018 - registering is what takes over
        self.settled = self.zombie is None and self.settled

    @precondition(lambda self: self.zombie is not None)
    @rule()
    def zombie_completes(self) -> None:
        assert self.zombie is not None
        zombie, self.zombie = self.zombie, None
        expected: type[Exception] = Fenced if len(zombie.acknowledged) == len(TASKS) else CheckpointAborted
        with pytest.raises(expected):
            zombie.checkpoint.complete()

    # --- invariants --------------------------------------------------------------------------

    @invariant()
    def only_completed_checkpoints_are_visible_and_latest_is_the_highest(self) -> None:
        listed = self.store.list()
        assert [c.id for c in listed] == sorted(self.completed)
        latest = self.store.latest()
        assert (latest.id if latest is not None else None) == max(self.completed, default=None)

    @invariant()
    def every_retained_checkpoint_restores_byte_for_byte(self) -> None:
        for checkpoint in self.store.list():
            for task, expected in self.completed[checkpoint.id].states.items():
                target = self.directory / f"restore-{next(self.counter)}"
                checkpoint.restore(task, target)
                assert _read(target) == expected
                with contextlib.suppress(FileNotFoundError):
                    shutil.rmtree(target) if target.is_dir() else target.unlink()

    @invariant()
    def once_settled_no_state_remains_that_no_retained_checkpoint_references(self) -> None:
        if not self.settled or self.pending is not None or self.zombie is not None:
            return
        referenced = {
            state_name(blake3.blake3(data).digest())
            for expected in self.completed.values()
            for files in expected.states.values()
            for data in files.values()
        }
        self.store.records()  # waits for the discard a completion started
        names = {info.name or "" for info in self.store.client.list(pipeline_job("machine"))}
        assert {name for name in names if name.startswith("state/")} == referenced


def _read(target: Path) -> dict[str, bytes]:
    """A restored state as the model holds it: a file's bytes under "", a directory's by path."""
    if target.is_file():
        return {"": target.read_bytes()}
    return {p.relative_to(target).as_posix(): p.read_bytes() for p in target.rglob("*") if p.is_file()}


CheckpointMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No shrinking: each step costs server round trips, and 15 steps read well enough as they are.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
test_checkpoints_state_machine = CheckpointMachine.TestCase
