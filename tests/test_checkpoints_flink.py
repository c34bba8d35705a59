"""Apache Flink's own checkpoint tests, as behaviours of blobsvc's checkpoints, against real servers.

Each behaviour Flink's tests assert (flink-runtime/src/test/java/org/apache/flink/runtime/
checkpoint/), and what blobsvc does with it: **ported** (a test here, or the one named,
whose comment names the Flink test), **differs on purpose** (docs/checkpoints.md, "Where
blobsvc differs from Flink", says why) or **does not apply** (with the reason).

CheckpointCoordinatorTest
* testTriggerAndConfirmSimpleCheckpoint: complete once every task acknowledged: ported
  (tests/test_checkpoints.py::test_a_checkpoint_restores_every_task_byte_for_byte).
* testTriggerAndDeclineCheckpointSimple/Complex: a decline aborts, late acknowledgements are
  refused, the aborted state is discarded: ported (test_a_declined_checkpoint_...).
* testSuccessfulCheckpointSubsumesUnsuccessful: completing N aborts the older pending
  checkpoints, freeing their places: ported (test_completing_a_checkpoint_subsumes_...).
* testMultipleConcurrentCheckpoints, testMaxConcurrentAttempts1/2: at most max_concurrent
  pending: ported (tests/test_checkpoints.py::test_at_most_max_concurrent_checkpoints_pend);
  Flink queues the trigger beyond it, blobsvc refuses it: differs on purpose.
* testMinTimeBetweenCheckpointsInterval: a trigger waits out min_pause: ported
  (tests/test_checkpoints.py::test_a_trigger_waits_out_the_minimum_pause_after_a_completion).
* testMinDelayBetweenSavepoints, testConcurrentSavepoints, testSavepointsAreNotSubsumed:
  savepoints ignore min_pause and max_concurrent and are never subsumed by a completion:
  ported (test_a_savepoint_is_neither_refused_nor_delayed, test_completing_...).
* testCheckpointTimeoutIsolated: a checkpoint past its timeout is aborted: ported
  (tests/test_checkpoints.py::test_a_checkpoint_that_times_out_is_aborted_by_its_timer; the
  server's own clock: tests/test_checkpoints_authority.py).
* testHandleMessagesForNonExistingCheckpoints, testStateCleanupForLateOrUnknownMessages: an
  acknowledgement of an unknown task or of an aborted checkpoint is refused: ported
  (test_a_declined_checkpoint_...); the server refuses forged ids: test_checkpoints_authority.
* testTriggerCheckpointWithShuttingDownCoordinator / master hooks / operator coordinators /
  unaligned and channel state / stats trackers / externalized checkpoint locations / regional
  and finished-task checkpoints: does not apply (no such parts in blobsvc).

PendingCheckpointTest
* testCanBeSubsumed, testSyncSavepointCannotBeSubsumed: a savepoint pending is not subsumed:
  ported (test_completing_a_checkpoint_subsumes_...).
* testCompletionFuture: completing without every acknowledgement fails and aborts: ported
  (tests/test_checkpoints.py::test_leaving_the_block_with_a_task_missing_...).
* testAbortDiscardsState (declined, expired, subsumed): ported (test_a_declined_checkpoint_...,
  test_completing_a_checkpoint_subsumes_...).
* testSetCanceller: an aborted checkpoint's timer is cancelled: ported (test_completing_...: the
  subsumed checkpoint's timer is not alive).
* testNullSubtaskStateLeadsToStatelessTask, testMasterState*, stats callbacks: does not apply
  (a task always acknowledges a handle; no master state, no stats callbacks).

CheckpointCoordinatorFailureTest
* testFailingCompletedCheckpointStoreAdd: a completion the store refuses fails the pending
  checkpoint, which is then aborted, and keeps the older ones: ported
  (test_a_completion_the_server_refuses_aborts_it_and_keeps_the_older_ones).

CheckpointFailureManagerTest
* testContinuousFailure: failures in a row beyond the tolerable stop the pipeline: ported
  (test_a_completed_checkpoint_resets_the_failures_in_a_row).
* testBreakContinuousFailure: a success resets the count: ported (same test).
* testIgnoresPastCheckpoints: a failure of a checkpoint older than the last completed one is
  not counted: ported (test_a_decline_of_a_checkpoint_older_than_the_last_completed_...).
* testTotalCountValue (which reasons count): a trigger that cannot reach the server, the
  checkpoints' storage, counts (IO_EXCEPTION, with no checkpoint id), a subsumed checkpoint
  does not (CHECKPOINT_SUBSUMED): ported (test_a_trigger_the_server_could_not_take_counts_...,
  test_completing_...); an exception in the block counts (EXCEPTION does not in recent Flink):
  differs on purpose.
* testIgnoreOneCheckpointRepeatedlyCountMultiTimes: one checkpoint counts once: ported by
  construction (a pending checkpoint ends once: tests/test_checkpoints_state_machine.py).

CheckpointRequestDeciderTest
* testForce, testSavepointTiming: a savepoint starts at once, whatever is pending and
  min_pause: ported (test_a_savepoint_is_neither_refused_nor_delayed).
* testCheckpointTiming: a periodic checkpoint inside min_pause is dropped, a manual one runs
  at once: differs on purpose (``begin`` waits the pause out).
* testEnqueueOnTooManyPending, queue ordering and size limits, testEnqueueOnTooManyCleaning:
  does not apply (no request queue: ``begin`` is a call, refused or not at once).
* testNonForcedEnqueueOnTooManyPending: does not apply (every blobsvc savepoint is a forced
  one, as Flink's user-triggered savepoints are by default; a pending one still takes a place).

DefaultCompletedCheckpointStoreTest
* testNotSubsumedIfNotNeeded, testRecoverSortedCheckpoints: retain N keeps N, listed oldest
  first: ported (test_retain_keeps_n_oldest_first_and_savepoints_until_deleted).
* testAtLeastOneCheckpointRetained, testOlderSavepointSubsumed, testSubsumeAfterStopping...:
  Flink drops older savepoints from the store; blobsvc keeps every savepoint until deleted:
  differs on purpose (same test).
* testAddCheckpointSuccessfullyShouldRemoveOldOnes / FailedShouldNotRemoveOldOnes: ported
  (test_retain_..., test_a_completion_the_server_refuses_...).
* testCorruptDataInStateHandleStoreShouldNotBeSkipped: Flink fails the recovery; blobsvc logs,
  counts and falls back to the previous checkpoint: differs on purpose
  (tests/test_checkpoints.py::test_damaged_or_missing_metadata_is_reported_and_latest_falls_back).
* testShutdown*: does not apply (a pipeline has no terminal state; ``delete`` is explicit).
  Closing a store keeps its checkpoints: ported (test_closing_a_store_keeps_its_checkpoints).

ZooKeeperCompletedCheckpointStoreITCase
* testRecover, testLatestCheckpointRecovery: a new leader lists the same checkpoints and the
  latest: ported (tests/test_checkpoints_zookeeper.py::test_failover_during_completion_...).
* testConcurrentCheckpointOperations: a replaced writer cannot add: ported
  (tests/test_checkpoints_zookeeper.py, the SIGSTOPped coordinator; test_checkpoints_authority).
* testShutdownDiscardsCheckpoints, testSuspendKeepsCheckpoints: see the store's above.

CheckpointIDCounterTestBase (standalone and ZooKeeper)
* testCounterIsNeverNegative, testSerialIncrementAndGet: ids are positive and go up, aborted
  ones never reused: ported (test_ids_are_positive_and_go_up_...).
* testConcurrentGetAndIncrement: concurrent triggers get distinct ids: ported, standalone and
  zookeeper (test_begin_from_8_threads_..., test_begin_from_8_threads_on_a_zookeeper_leader...).
* testSetCount: does not apply (no user-set counter: ids only go up).

state/SharedStateRegistryTest
* testRegistryNormal, unregister at zero references: shared state goes only when no retained
  checkpoint references it: ported (tests/test_checkpoints.py::
  test_shared_state_is_discarded_only_when_no_retained_checkpoint_references_it).
* testRegisterWithEqualStateHandle, placeholders: a file unchanged sends no bytes and is one
  name per content: ported (tests/test_checkpoints.py::test_unchanged_files_send_no_bytes).

Besides Flink's: a TaskHandle object is checked as its JSON would be, a restore walks no tree
by recursion, a restore through a cache catches rot, and a checkpoint's metadata must be
that checkpoint's at the client.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from benchmarks.harness.zk import HaServer, ZooKeeper, running_zookeeper, started_servers, wait_for_leader
from blobsvc import BlobClient
from blobsvc._exceptions import InvalidArgument, InvalidArgumentType, NotFound, TransportError
from blobsvc.cache import BlobCache
from blobsvc.checkpoints import (
    CheckpointAborted,
    CheckpointError,
    CheckpointFailuresExceeded,
    CheckpointState,
    CheckpointStore,
    FileEntry,
    PendingCheckpoint,
    TaskHandle,
)
from blobsvc.checkpoints._restore import remove_tree
from blobsvc.config import Settings
from blobsvc.wire._checkpoints import metadata_name, pipeline_job
from tests.conftest import ServerThread

from .test_checkpoints import free_port, names

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerThread]:
    directory = tmp_path_factory.mktemp("flink")
    settings = Settings(
        host="127.0.0.1", port=str(free_port()), data_dir=directory / "data", idle_timeout=5.0, io_timeout=2.0
    )
    running = ServerThread(settings).start()
    yield running
    running.stop()


def _store(server: ServerThread, pipeline: str, **options: object) -> CheckpointStore:
    return CheckpointStore(server.address, pipeline, timeout=30, **options)  # type: ignore[arg-type]


def _take(store: CheckpointStore, state: bytes = b"state", *, savepoint: bool = False) -> int:
    with store.begin(tasks=["0"], savepoint=savepoint) as pending:
        pending.acknowledge("0", store.snapshot("0", state))
    return pending.id


def _server_pending(store: CheckpointStore) -> list[int]:
    pending: list[int] = store.client.checkpoints({"action": "list", "pipeline": store.pipeline})["pending"]
    return pending


# --- the coordinator ---------------------------------------------------------------------------


def test_completing_a_checkpoint_subsumes_the_older_pending_ones_but_savepoints(server: ServerThread) -> None:
    # CheckpointCoordinatorTest.testSuccessfulCheckpointSubsumesUnsuccessful,
    # PendingCheckpointTest.testCanBeSubsumed / testAbortDiscardsState (subsumed) / testSetCanceller,
    # CheckpointFailureManagerTest.testTotalCountValue (CHECKPOINT_SUBSUMED does not count).
    with _store(server, "subsume", max_concurrent=3, tolerable_failures=0) as store:
        savepoint = store.begin(tasks=["0"], savepoint=True)
        older = store.begin(tasks=["0"])
        older.acknowledge("0", store.snapshot("0", b"older"))
        newer = store.begin(tasks=["0"])
        newer.acknowledge("0", store.snapshot("0", b"newer"))
        newer.complete()
        assert older.state is CheckpointState.ABORTED and f"subsumed by checkpoint {newer.id}" in (older.reason or "")
        assert not older._timer.is_alive()
        with pytest.raises(CheckpointAborted):
            older.complete()  # it can never complete later
        assert store.coordinator.pending == [savepoint] and _server_pending(store) == [savepoint.id]
        third, fourth = store.begin(tasks=["0"]), store.begin(tasks=["0"])  # the older one's place is free
        savepoint.acknowledge("0", store.snapshot("0", b"savepoint"))
        savepoint.complete()  # a savepoint is never subsumed
        third.abort("done")  # (no failure was counted for the subsumed one: tolerable_failures=0)
        fourth.abort("done")
        assert [c.id for c in store.list()] == [savepoint.id, newer.id]
        assert f"state/{_key_of(b'older')}" not in names(store.client, "subsume")  # discarded


def _key_of(data: bytes) -> str:
    return blake3.blake3(data).hexdigest()


def test_a_savepoint_is_neither_refused_nor_delayed(server: ServerThread) -> None:
    # CheckpointCoordinatorTest.testMinDelayBetweenSavepoints / testConcurrentSavepoints,
    # CheckpointRequestDeciderTest.testForce / testSavepointTiming.
    with _store(server, "savepoints", max_concurrent=1, min_pause=60) as store:
        _take(store)
        started = time.monotonic()
        first = store.begin(tasks=["0"], savepoint=True)  # inside min_pause
        second = store.begin(tasks=["0"], savepoint=True)  # beyond max_concurrent
        assert time.monotonic() - started < 30  # not the 60 s pause
        assert second.id > first.id and len(store.coordinator.pending) == 2
        first.abort("done")
        second.abort("done")


def test_a_declined_checkpoint_is_aborted_late_messages_refused_and_its_state_discarded(
    server: ServerThread,
) -> None:
    # CheckpointCoordinatorTest.testTriggerAndDeclineCheckpointSimple,
    # testHandleMessagesForNonExistingCheckpoints / testStateCleanupForLateOrUnknownMessages,
    # PendingCheckpointTest.testAbortDiscardsState (declined).
    with _store(server, "decline") as store:
        kept = _take(store, b"kept")
        pending = store.begin(tasks=["0", "1"])
        with pytest.raises(InvalidArgument, match="does not expect task"):
            pending.acknowledge("2", store.snapshot("2", b"unknown task"))
        pending.acknowledge("0", store.snapshot("0", b"declined"))
        pending.decline("1", "no room")
        with pytest.raises(CheckpointAborted, match="declined"):
            pending.acknowledge("1", store.snapshot("1", b"late"))
        assert [c.id for c in store.list()] == [kept]
        assert f"state/{_key_of(b'declined')}" not in names(store.client, "decline")


def test_a_completion_the_server_refuses_aborts_it_and_keeps_the_older_ones(server: ServerThread) -> None:
    # CheckpointCoordinatorFailureTest.testFailingCompletedCheckpointStoreAdd,
    # DefaultCompletedCheckpointStoreTest.testAddCheckpointFailedShouldNotRemoveOldOnes.
    with _store(server, "refused", retain=1) as store:
        kept = _take(store, b"kept")
        pending = store.begin(tasks=["0"])
        missing = "ab" * 32  # a key the server never held
        pending.acknowledge("0", TaskHandle("0", "bytes", (FileEntry("", 3, missing),)))
        with pytest.raises(NotFound, match="is not on the server"):
            pending.complete()
        assert pending.state is CheckpointState.ABORTED and store.coordinator.pending == []
        latest = store.latest()
        assert latest is not None and latest.id == kept and [c.id for c in store.list()] == [kept]


def test_retain_keeps_n_oldest_first_and_savepoints_until_deleted(server: ServerThread) -> None:
    # DefaultCompletedCheckpointStoreTest.testNotSubsumedIfNotNeeded / testRecoverSortedCheckpoints
    # / testAddCheckpointSuccessfullyShouldRemoveOldOnes; testOlderSavepointSubsumed and
    # testAtLeastOneCheckpointRetained differ on purpose: savepoints stay until deleted.
    with _store(server, "retain", retain=3) as store:
        ids = [_take(store, b"%d" % n) for n in range(3)]
        assert [c.id for c in store.list()] == ids
        savepoint = _take(store, b"savepoint", savepoint=True)
        newer = [_take(store, b"new %d" % n) for n in range(3)]
        assert [c.id for c in store.list()] == [savepoint, *newer]
        store.delete(savepoint)
        assert [c.id for c in store.list()] == newer


def test_closing_a_store_keeps_its_checkpoints(server: ServerThread) -> None:
    # ZooKeeperCompletedCheckpointStoreITCase.testSuspendKeepsCheckpoints,
    # DefaultCompletedCheckpointStoreTest.testShutdownShouldNotDiscardStateHandle...
    with _store(server, "suspend", retain=2) as store:
        ids = [_take(store, b"a"), _take(store, b"b")]
    with _store(server, "suspend") as again:
        latest = again.latest()
        assert latest is not None and latest.id == ids[-1] and [c.id for c in again.list()] == ids


# --- failures in a row -------------------------------------------------------------------------


def test_a_completed_checkpoint_resets_the_failures_in_a_row(server: ServerThread) -> None:
    # CheckpointFailureManagerTest.testBreakContinuousFailure / testContinuousFailure.
    with _store(server, "reset", tolerable_failures=1) as store:
        store.begin(tasks=["0"]).decline("0", "one")
        _take(store)  # resets the count
        store.begin(tasks=["0"]).decline("0", "one again")
        last = store.begin(tasks=["0"])  # one in a row is tolerated
        last.decline("0", "two in a row")
        with pytest.raises(CheckpointFailuresExceeded, match="2 checkpoints failed in a row"):
            store.begin(tasks=["0"])


def test_a_decline_of_a_checkpoint_older_than_the_last_completed_does_not_count(server: ServerThread) -> None:
    # CheckpointFailureManagerTest.testIgnoresPastCheckpoints: a savepoint outlives a newer
    # completion (it is not subsumed), so its decline comes after checkpoint N completed.
    with _store(server, "past", tolerable_failures=0, max_concurrent=2) as store:
        older = store.begin(tasks=["0"], savepoint=True)
        _take(store)
        older.decline("0", "late")
        _take(store)  # not CheckpointFailuresExceeded


def test_a_trigger_the_server_could_not_take_counts_as_a_failure(settings: Settings) -> None:
    # CheckpointFailureManagerTest.testTotalCountValue: IO_EXCEPTION (no checkpoint id) counts.
    settings = dataclasses.replace(settings, port=str(free_port()))  # the same port after the restart
    running = ServerThread(settings).start()
    client = BlobClient(running.address, timeout=2.0, connect_timeout=1.0, retries=0)
    store = CheckpointStore(client, "down", tolerable_failures=0)
    try:
        store.coordinator  # noqa: B018 - registered while the server is up
        running.stop()
        with pytest.raises(TransportError):
            store.begin(tasks=["0"])
        running = ServerThread(settings).start()
        with pytest.raises(CheckpointFailuresExceeded, match="a trigger: the trigger failed"):
            store.begin(tasks=["0"])
        assert store.records() == []  # the server is back: the refusal was the count's
    finally:
        store.close()
        client.close()
        running.stop()


# --- ids and one coordinator -------------------------------------------------------------------


def test_ids_are_positive_and_go_up_and_an_aborted_id_is_never_given_again(server: ServerThread) -> None:
    # CheckpointIDCounterTestBase.testCounterIsNeverNegative / testSerialIncrementAndGet.
    with _store(server, "ids") as store:
        ids = []
        for n in range(4):
            pending = store.begin(tasks=["0"])
            ids.append(pending.id)
            if n % 2:
                pending.abort("an aborted id is spent too")
            else:
                pending.acknowledge("0", store.snapshot("0", b"x"))
                pending.complete()
        assert ids[0] > 0 and ids == sorted(set(ids))


def _begin_from_threads(store: CheckpointStore, threads: int) -> list[PendingCheckpoint | BaseException]:
    """``begin`` from ``threads`` threads released at once, on a store that has no coordinator yet."""
    barrier = threading.Barrier(threads)
    results: list[PendingCheckpoint | BaseException] = []

    def begin() -> None:
        barrier.wait()
        try:
            results.append(store.begin(tasks=["0"]))
        except BaseException as exc:
            results.append(exc)

    workers = [threading.Thread(target=begin) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    return results


def _complete_all(store: CheckpointStore, results: list[PendingCheckpoint | BaseException]) -> list[int]:
    failures = [result for result in results if isinstance(result, BaseException)]
    assert not failures, failures
    pendings = [result for result in results if isinstance(result, PendingCheckpoint)]
    assert len({id(pending._coordinator) for pending in pendings}) == 1
    for pending in sorted(pendings, key=lambda p: p.id):  # oldest first: none is subsumed
        pending.acknowledge("0", store.snapshot("0", b"%d" % pending.id))
        pending.complete()
    return sorted(p.id for p in pendings)


def test_begin_from_8_threads_registers_one_coordinator(server: ServerThread) -> None:
    # CheckpointIDCounterTestBase.testConcurrentGetAndIncrement, on one store's lazy coordinator.
    with _store(server, "threads", max_concurrent=8, retain=8) as store:
        ids = _complete_all(store, _begin_from_threads(store, 8))
        assert len(set(ids)) == 8  # distinct; and every one completed: none was fenced


zookeeper = pytest.fixture(scope="module")(running_zookeeper)
servers = pytest.fixture(started_servers)


def test_begin_from_8_threads_on_a_zookeeper_leader_gets_distinct_ids_that_go_up(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    # CheckpointIDCounterTestBase.testConcurrentGetAndIncrement (ZooKeeperCheckpointIDCounter).
    url = f"zk://{zookeeper.hosts}/ckflink"
    servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="ckflink"))
    wait_for_leader(url)
    client = BlobClient(url, timeout=10.0, connect_timeout=20.0, retries=6, backoff=0.1)
    with CheckpointStore(client, "zk-threads", max_concurrent=8, retain=8, timeout=60) as store:
        first = _take(store)
        ids = _complete_all(store, _begin_from_threads(store, 8))
        assert len(set(ids)) == 8 and min(ids) > first
        assert [c.id for c in store.list()] == ids
    client.close()


# --- restores ----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["../escape", "a/../../escape", "ABSOLUTE", ""])
def test_a_handle_object_is_checked_as_its_json_would_be(server: ServerThread, tmp_path: Path, path: str) -> None:
    path = str(tmp_path / "escape") if path == "ABSOLUTE" else path
    (tmp_path / "dest").mkdir()
    with _store(server, "hostile") as store:
        checkpoint_id = _take(store, b"x")
        handle = TaskHandle("0", "directory", (FileEntry(path, 1, _key_of(b"x")),))
        with pytest.raises(InvalidArgument, match=r"relative path|paths are distinct and not empty"):
            store.restore(checkpoint_id, handle, tmp_path / "dest" / "r")
        assert sorted(os.listdir(tmp_path)) == ["dest"] and os.listdir(tmp_path / "dest") == []


def test_a_handle_object_of_other_objects_is_a_clear_error(server: ServerThread, tmp_path: Path) -> None:
    with _store(server, "hostile") as store:
        checkpoint_id = _take(store, b"x")
        forged = TaskHandle("0", "directory", ({"path": "../x", "size": 1, "key": _key_of(b"x")},))  # type: ignore[arg-type]
        with pytest.raises(InvalidArgumentType, match="FileEntry objects"):
            store.restore(checkpoint_id, forged, tmp_path / "r")
        assert os.listdir(tmp_path) == []


def test_a_1500_level_path_restores_or_is_refused_without_recursion(server: ServerThread, tmp_path: Path) -> None:
    deep = "/".join(["d"] * 1500) + "/f"
    with _store(server, "deep") as store:
        checkpoint_id = _take(store, b"deep")
        handle = TaskHandle("0", "directory", (FileEntry(deep, 4, _key_of(b"deep")),))
        out = tmp_path / "out"
        out.mkdir()
        refused = False
        try:
            try:
                restored = store.restore(checkpoint_id, handle, out / "r")
            except InvalidArgument:  # a depth the handle's check refuses: a clear error, nothing written
                refused = True
            else:
                assert (restored / deep).read_bytes() == b"deep"
            assert os.listdir(out) == ([] if refused else ["r"])
            # A restore that fails after writing the deep file removes it all (a loop, no recursion).
            second = FileEntry("z", 1, "cd" * 32)  # not on the server
            broken = TaskHandle("0", "directory", (FileEntry(deep, 4, _key_of(b"deep")), second))
            with pytest.raises(InvalidArgument if refused else NotFound):
                store.restore(checkpoint_id, broken, out / "r2")
            assert os.listdir(out) == ([] if refused else ["r"])
        finally:
            remove_tree(out)  # pytest's own cleanup would recurse 1,500 levels deep


def test_a_snapshot_walks_a_1500_level_tree_without_recursion(server: ServerThread, tmp_path: Path) -> None:
    source = tmp_path / "source"
    directory = source
    for _ in range(1500):  # made level by level: os.makedirs recurses too
        directory = directory / "d"
        directory.mkdir(parents=directory.parent == source)
    (directory / "f").write_bytes(b"deep")
    try:
        with _store(server, "deepwalk") as store:
            handle = store.snapshot("0", source)
        assert [entry.path for entry in handle.files] == ["/".join(["d"] * 1500) + "/f"]
    finally:
        remove_tree(source)


def test_a_restore_through_a_cache_catches_rot_that_keeps_size_mtime_and_inode(
    server: ServerThread, tmp_path: Path
) -> None:
    with _store(server, "rot") as store:
        checkpoint_id = _take(store, b"r" * 4096)
        cache = BlobCache(server.address, tmp_path / "cache")
        with CheckpointStore(server.address, "rot", cache=cache) as through_cache:
            checkpoint = through_cache.get(checkpoint_id)
            assert checkpoint.restore("0", tmp_path / "first").read_bytes() == b"r" * 4096
            cached = cache.store.content(_key_of(b"r" * 4096))
            before = os.stat(cached)
            os.chmod(cached, 0o644)
            with open(cached, "r+b") as rotten:
                rotten.write(b"R")  # one byte, size kept
            os.chmod(cached, before.st_mode & 0o777)
            os.utime(cached, ns=(before.st_atime_ns, before.st_mtime_ns))
            after = os.stat(cached)
            assert (after.st_size, after.st_mtime_ns, after.st_ino) == (
                before.st_size,
                before.st_mtime_ns,
                before.st_ino,
            )
            assert checkpoint.restore("0", tmp_path / "second").read_bytes() == b"r" * 4096
        assert cache.stats().downloads == 2  # the rotten copy was dropped and fetched again
        assert cache.check() == []
        cache.close()


def test_a_checkpoints_metadata_must_be_that_checkpoints_at_the_client(server: ServerThread) -> None:
    """The server checks it when completing; the client checks again what it reads, so a record
    whose metadata blob is another checkpoint's (intact, hashing to the record's key) is refused."""
    with _store(server, "metarule", retain=2) as store:
        first, second = _take(store, b"1"), _take(store, b"2")
        job = pipeline_job("metarule")
        other = store.client.get(job=job, name=metadata_name(second))
        key = store.client.put(other, job=job, name=metadata_name(first))  # checkpoint 2's under 1's name
        with pytest.raises(CheckpointError, match=f"its metadata is checkpoint {second} of metarule"):
            store.load({"id": first, "timestamp": 1.0, "savepoint": False, "metadata": key})
