"""The server's side of checkpoints: the CHECKPOINTS request's actions for each pipeline.

:Status: Production.

Flink's ``CompletedCheckpointStore``, ``CheckpointIDCounter`` and ``SharedStateRegistry`` as
the server keeps them; the records themselves are the recovery mode's
(:mod:`blobsvc.ha.checkpoints`), the state and metadata are blobs of the pipeline's job
(:mod:`blobsvc.wire._checkpoints`). Each rule is enforced here, once:

1. **The server decides each checkpoint's life.** ``complete`` succeeds only for an id this
   pipeline's ``trigger`` gave, still pending (an abort is final: an aborted, timed-out or
   subsumed id never completes), before its deadline, under the caller's writer epoch, which
   is still the pipeline's; each of these is checked from the records before any metadata
   blob is read. A replaced coordinator is FENCED whatever its successor cleaned up since.
   The metadata must be that checkpoint's (its id, pipeline and savepoint flag). Ids only go
   up: the counter is durable before an id is given (:mod:`blobsvc.ha.checkpoints`).
   Completing checkpoint N aborts every older pending checkpoint of the pipeline but
   savepoints: N subsumes them, as in Flink (``CheckpointCoordinatorTest``'s
   ``testSuccessfulCheckpointSubsumesOlderPendingCheckpoints``). A pending checkpoint past its
   deadline is aborted by the server on a clock (every :data:`TICK_SECONDS`), whether or not
   any request names its pipeline, and its state becomes discardable; so do restores' expired
   holds (:mod:`blobsvc.server._checkpoint_holds`).
2. **Complete only what is whole.** ``complete`` reads the checkpoint's metadata blob, checks
   its bytes against the key the coordinator names (a damaged or replaced blob is refused),
   and checks that every state file it references is there under ``state/<key>`` with that
   key and size: on this server's disk (hashed when received), or else in the HA store (a
   task wrote it there: its record and size, the bytes verified by whoever reads them).
   Only then is the record added; a checkpoint whose state is not all there is refused, and
   stays invisible.
3. **Add first, subsume after.** The record is durable (fsynced file, or ZooKeeper node)
   before the checkpoints the pipeline's retention policy no longer keeps are subsumed
   (:mod:`blobsvc.server.checkpoint_retention`): if adding fails, nothing retained is lost.
   Savepoints are never subsumed. Each action also tells the pipeline's history
   (:mod:`blobsvc.server.checkpoint_stats`).
4. **A replaced writer is fenced.** ``register`` gives a coordinator a new writer epoch;
   ``trigger``, ``complete`` and subsuming name it, and the records refuse (FENCED) an epoch
   that is no longer the pipeline's, in the same atomic step as the write. A new coordinator's
   registration also forgets the pending checkpoints of every older one.
5. **Discard only what nothing references.** A state name goes when no retained checkpoint's
   metadata and no restore's hold references its content, and never while a checkpoint of the
   pipeline is pending (its tasks may just have linked it; pending checkpoints are records, so
   a restarted server or a new leader knows them). When a retained
   checkpoint's references are unknown (its record or metadata cannot be read, and this server
   never read that metadata intact), nothing is discarded. After a completion, discarding runs
   in the background, after the answer; ``list`` waits for it.
6. **Never silently fall back.** A record whose metadata blob is missing or damaged is logged
   at WARNING once, counted (``checkpoints_damaged``) and named in STATUS; ``list`` marks it
   with a ``problem`` so that a restore takes the previous one, saying so.

Holds live in this server's memory: a restart or a failover forgets them. That costs no
safety (a restore verifies every byte it reads) but may cost that restore.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import secrets
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from .._exceptions import (
    BadRequest,
    BlobError,
    Busy,
    DigestMismatch,
    Fenced,
    InternalError,
    InvalidArgument,
    NotFound,
    NotLeader,
)
from ..wire._checkpoints import check_pipeline, metadata_id, pipeline_job, state_key
from ..wire._protocol import ContentKey, JobBlob
from ._checkpoint_holds import MAX_HOLDS, Holds
from ._checkpoint_metadata import MetadataReader
from .checkpoint_retention import RetentionPolicy
from .checkpoint_stats import DEFAULT_HISTORY, MAX_HISTORY, CheckpointStats, Entry

if TYPE_CHECKING:
    from ..ha import HighAvailability
    from ..ha.checkpoints import CheckpointRecords, Record
    from ..storage import BlobStorage, OpenBlob

__all__ = ["CheckpointServer", "Checkpoints"]

log = logging.getLogger("blobsvc.checkpoints")
_T = TypeVar("_T")

MAX_TIMEOUT = 7 * 86400.0  # a pending checkpoint or a hold: a week is beyond any use
MAX_DAMAGED_LISTED = 20  # STATUS names this many damaged records; the count says how many
# What a client can make the server keep: pending checkpoints (a coordinator has one or a few;
# each is a record) and restores' holds (one per restore under way, in memory, with its
# checkpoint's keys) are bounded; past the bound, BUSY (they expire, so a retry succeeds).
MAX_PENDING = 1_000  # per pipeline
# How often the server aborts pending checkpoints past their deadline and drops expired holds:
# a coordinator that died without a word leaves its checkpoint pending this long at most.
TICK_SECONDS = 1.0
# Every this many ticks the clock lists every pipeline the records have, not only those this
# server saw triggered: a follower that became leader, or a restarted server, learns of the
# checkpoints another left pending.
LIST_EVERY_TICKS = 10
# Requests of one pipeline that write take turns under its lock: one of this many, chosen by
# the pipeline's name, so that names a client makes up cost no memory.
LOCK_STRIPES = 64

# Fault injection for tests/test_checkpoints_crash.py, off unless the variable is set: the
# server SIGKILLs itself when its Nth completion (``point:N``) reaches the named point. A
# SIGKILL from outside lands in these windows (microseconds each) only by chance.
_CRASH_AT = os.environ.get("BLOBSVC_CHECKPOINTS_CRASH_AT", "")
_completions = [0]


def _crash_point(point: str) -> None:
    if _CRASH_AT and f"{point}:{_completions[0]}" == _CRASH_AT:
        os.kill(os.getpid(), signal.SIGKILL)


class CheckpointServer(Protocol):
    """What the checkpoints need of the server: its storage and HA, reading and deleting blobs."""

    @property
    def storage(self) -> BlobStorage: ...

    @property
    def ha(self) -> HighAvailability: ...

    async def open_blob(self, target: ContentKey | JobBlob) -> OpenBlob: ...

    async def delete_blob(self, target: JobBlob) -> None: ...


class Checkpoints:
    """Every pipeline's checkpoints on one server; :meth:`handle` answers a CHECKPOINTS request."""

    def __init__(self, server: CheckpointServer, history: int = DEFAULT_HISTORY) -> None:
        self.server = server
        self.stats = CheckpointStats(history)
        self._records: CheckpointRecords | None = None
        self._stripes = [asyncio.Lock() for _ in range(LOCK_STRIPES)]
        self._holds = Holds()
        self.metadata = MetadataReader(server)
        # Pipelines that may have pending checkpoints: every one the records had when last
        # listed, and every one triggered since; the clock looks at these only.
        self._pending_pipelines: set[str] = set()
        self._ticking: asyncio.Task[None] | None = None
        self._undiscarded: set[str] = set()  # pipelines whose expired checkpoints or holds kept state
        self.counts: collections.Counter[str] = collections.Counter()
        self.damaged: dict[tuple[str, int], str] = {}
        self.last_completed: tuple[str, int, float] | None = None
        self._discarding: dict[str, asyncio.Task[None]] = {}

    def _lock(self, pipeline: str) -> asyncio.Lock:
        return self._stripes[hash(pipeline) % LOCK_STRIPES]

    def start(self) -> None:
        """Open the records and start the clock (in the server's event loop)."""
        self._records = self.server.ha.checkpoint_records(self.server.storage)
        self._ticking = asyncio.create_task(self._tick_forever())

    async def _tick_forever(self) -> None:
        for ticks in itertools.count():
            if ticks % LIST_EVERY_TICKS == 0:
                try:
                    listed = await self._records_call(self.records.pipelines)
                    self._pending_pipelines.update(listed)
                    self.stats.known.update(listed)  # their history is rebuilt when asked for
                except BlobError as exc:  # ZooKeeper away: the next listing finds them
                    log.debug("checkpoints: pipelines not listed: %s", exc)
            await asyncio.sleep(TICK_SECONDS)
            try:
                await self.tick()
            except Exception as exc:  # the clock goes on: the next tick does what this one could not
                log.warning("checkpoints: a tick of the clock failed: %s: %s", type(exc).__name__, exc)

    async def tick(self) -> None:
        """Abort every pending checkpoint past its deadline and drop expired holds, for every
        pipeline; discard what they kept. A pipeline whose request is under way waits for the
        next tick: that request checks the deadlines itself, and the clock never waits on it."""
        self._undiscarded.update(self._holds.expire())
        for pipeline in sorted(self._pending_pipelines):
            if self._lock(pipeline).locked():
                continue
            async with self._lock(pipeline):
                try:
                    pending = await self._records_call(self.records.pending, pipeline)
                    if not pending:
                        self._pending_pipelines.discard(pipeline)
                    elif len(await self._live_pending(pipeline)) < len(pending):
                        self._undiscarded.add(pipeline)
                except BlobError as exc:  # not the leader (any more): its successor's clock ticks
                    log.debug("pipeline %s: deadlines not checked: %s", pipeline, exc)
        for pipeline in sorted(self._undiscarded):
            if self._lock(pipeline).locked():
                continue
            async with self._lock(pipeline):
                self._undiscarded.discard(pipeline)
                try:
                    await self._discard(pipeline)
                except BlobError as exc:  # the pipeline's next completion or abort discards
                    log.debug("pipeline %s: not discarded: %s", pipeline, exc)

    @property
    def records(self) -> CheckpointRecords:
        assert self._records is not None, "start() first"
        return self._records

    async def handle(self, request: dict[str, Any]) -> dict[str, Any]:
        action = request.get("action")
        try:
            pipeline = check_pipeline(request.get("pipeline"))
        except InvalidArgument as exc:
            raise BadRequest(str(exc)) from None
        match action:
            case "register":
                return await self._register(pipeline)
            case "trigger":  # under the lock: a registration cannot slip between its check and its id
                async with self._lock(pipeline):
                    savepoint = _flag(request, "savepoint")
                    reply = await self._trigger(
                        pipeline, _integer(request, "epoch"), _seconds(request, "timeout"), savepoint
                    )
                self.stats.triggered(
                    pipeline, reply["id"], time.time(), savepoint=savepoint, expected=request.get("expected")
                )
                return reply
            case "complete":
                async with self._lock(pipeline):
                    return await self._complete(pipeline, request)
            case "abort":
                return await self._abort(
                    pipeline, _integer(request, "epoch"), _integer(request, "id"), _reason(request)
                )
            case "list":
                return await self._list(pipeline)
            case "delete":
                return await self._delete(pipeline, _integer(request, "id"))
            case "hold":
                return await self._hold(pipeline, _integer(request, "id"), _seconds(request, "seconds"))
            case "release":
                return await self._release(pipeline, request.get("token"))
            case "keep":
                return await self._keep(pipeline, _integer(request, "id"))
            case "history":
                limit = _integer(request, "limit", 1, MAX_HISTORY) if "limit" in request else DEFAULT_HISTORY
                return {"history": await self.history(pipeline, limit)}
        raise BadRequest(f"unknown checkpoints action {action!r}")

    def pipelines(self) -> list[str]:
        """The pipelines this server knows, sorted: those with records (listed by the clock
        soon after a start) and those it saw checkpoints of."""
        return self.stats.pipelines()

    async def history(self, pipeline: str, limit: int = DEFAULT_HISTORY) -> list[Entry]:
        """The pipeline's last ``limit`` checkpoints' statistics, newest first
        (:mod:`blobsvc.server.checkpoint_stats`). The first call for a pipeline after a start
        rebuilds its completed checkpoints from their records and metadata."""
        pipeline = check_pipeline(pipeline)
        await self._live_pending(pipeline)  # those past their deadline show as aborted
        if pipeline not in self.stats.rebuilt:
            await self._rebuild(pipeline)
        return self.stats.history(pipeline, limit)

    async def _rebuild(self, pipeline: str) -> None:
        records = await self._records_call(self.records.records, pipeline)
        for record in records[-self.stats.limit :]:
            if "problem" in record or self.stats.get(pipeline, record["id"]) is not None:
                continue
            try:
                metadata, _ = await self.metadata.read(pipeline, record["id"], record["metadata"])
            except (NotFound, DigestMismatch, BadRequest):
                continue  # list reports it; a history shows what can be shown
            self.stats.completed(
                pipeline, record, state_bytes=metadata.size, bytes_sent=metadata.bytes_sent, tasks=len(metadata.tasks)
            )
        self.stats.mark_rebuilt(pipeline)

    # --- actions ------------------------------------------------------------------------------

    async def _register(self, pipeline: str) -> dict[str, Any]:
        async with self._lock(pipeline):
            epoch = await self._records_call(self.records.register, pipeline)
            # The older coordinators' pending checkpoints can never complete now.
            pending = await self._records_call(self.records.pending, pipeline)
            older = [i for i, entry in pending.items() if entry.get("epoch") != epoch]
            await self._records_call(self.records.remove_pending, pipeline, older)
            self.counts["aborted"] += len(older)
            for checkpoint_id in older:
                self.stats.aborted(
                    pipeline, checkpoint_id, f"its coordinator was replaced by epoch {epoch}", time.time()
                )
        log.info("pipeline %s: coordinator epoch %d registered", pipeline, epoch)
        return {"epoch": epoch}

    async def _trigger(self, pipeline: str, epoch: int, timeout: float, savepoint: bool) -> dict[str, Any]:
        await self._check_writer(pipeline, epoch)  # before an id goes to a replaced coordinator
        if len(await self._live_pending(pipeline)) >= MAX_PENDING:
            raise Busy(f"{MAX_PENDING} checkpoints of {pipeline} are pending: wait for some to end")
        checkpoint_id = await self._records_call(self.records.next_id, pipeline)
        self._pending_pipelines.add(pipeline)
        # FENCED here too, in one step with the write, if a registration came between.
        deadline = time.time() + timeout
        await self._records_call(self.records.add_pending, pipeline, epoch, checkpoint_id, deadline, savepoint)
        return {"id": checkpoint_id}

    async def _check_writer(self, pipeline: str, epoch: int) -> None:
        current = await self._records_call(self.records.writer, pipeline)
        if epoch != current:
            raise Fenced(f"pipeline {pipeline}: coordinator epoch {epoch} was replaced by epoch {current}")

    async def _complete(self, pipeline: str, request: dict[str, Any]) -> dict[str, Any]:
        epoch, checkpoint_id = _integer(request, "epoch"), _integer(request, "id")
        _completions[0] += 1
        policy = RetentionPolicy.from_request(request)
        key = request.get("metadata")
        if not isinstance(key, str) or len(key) != 64:
            raise BadRequest("complete names its metadata blob's key: 64 hex characters")
        # Everything the records can refuse is refused before a byte of metadata is read.
        await self._check_writer(pipeline, epoch)
        entry = await self._pending_entry(pipeline, epoch, checkpoint_id)
        if entry is None:  # completed already: a retry whose first answer was lost
            done = next(
                (r for r in await self._records_call(self.records.records, pipeline) if r["id"] == checkpoint_id), None
            )
            if done is not None and done.get("metadata") == key:
                return {"record": done, "subsumed": []}
            raise NotFound(
                f"pipeline {pipeline} has no pending checkpoint {checkpoint_id}: "
                "it was never triggered, or it was aborted, timed out, subsumed or completed"
            )
        metadata, size = await self.metadata.read(pipeline, checkpoint_id, key)
        savepoint = bool(entry.get("savepoint", False))
        if (metadata.checkpoint_id, metadata.pipeline, metadata.savepoint) != (checkpoint_id, pipeline, savepoint):
            found, wanted = _kind(metadata.savepoint), _kind(savepoint)
            raise BadRequest(
                f"the metadata is {found} {metadata.checkpoint_id} of {metadata.pipeline}, "
                f"not {wanted} {checkpoint_id} of {pipeline}"
            )
        score = policy.score_of(metadata)  # before the state is checked: a refused checkpoint costs little
        try:
            await self.metadata.check_state(pipeline, metadata)
        except (NotFound, DigestMismatch):
            # A replaced coordinator's state is discarded once the new one completes: say why.
            await self._check_writer(pipeline, epoch)
            raise
        triggered = self.stats.get(pipeline, checkpoint_id)
        started = metadata.timestamp if triggered is None else triggered["trigger_time"]
        record = {
            "id": checkpoint_id,
            "timestamp": metadata.timestamp,
            "savepoint": metadata.savepoint,
            "metadata": key,
            "metadata_size": size,
            "epoch": epoch,
            "retention": policy.to_record(),  # the pipeline's policy from now on (checkpoint_retention)
            "score": score,
            # Statistics for the history, so that they outlive this server (checkpoint_stats).
            "trigger_time": started,
            "duration": max(0.0, time.time() - started),
            "expected": len(metadata.tasks) if triggered is None else triggered["expected"] or len(metadata.tasks),
        }
        _crash_point("before-record")
        await self._records_call(self.records.add, pipeline, epoch, record)  # FENCED when replaced
        self.metadata.remember(pipeline, record, metadata)
        _crash_point("after-record")
        await self._records_call(self.records.remove_pending, pipeline, [checkpoint_id])
        await self._subsume_pending(pipeline, checkpoint_id)
        self.counts["completed"] += 1
        self.counts["bytes_sent"] += metadata.bytes_sent
        self.counts["bytes_reused"] += metadata.size - metadata.bytes_sent
        self.last_completed = (pipeline, checkpoint_id, time.time())
        self.stats.observe(
            self.stats.completed(
                pipeline, record, state_bytes=metadata.size, bytes_sent=metadata.bytes_sent, tasks=len(metadata.tasks)
            )
        )
        subsumed = await self._subsume(pipeline, epoch, policy)
        self.stats.subsumed(pipeline, subsumed)
        _crash_point("after-subsume")
        self._discard_later(pipeline)
        return {"record": record, "subsumed": subsumed}

    async def _pending_entry(self, pipeline: str, epoch: int, checkpoint_id: int) -> Record | None:
        """The pending checkpoint's entry if this writer may complete it, None when it is not
        pending; past its deadline it is aborted here (NOT_FOUND)."""
        entry = (await self._live_pending(pipeline)).get(checkpoint_id)
        if entry is not None and entry.get("epoch") != epoch:
            raise Fenced(f"pipeline {pipeline}: checkpoint {checkpoint_id} was triggered by another coordinator")
        return entry

    async def _subsume_pending(self, pipeline: str, checkpoint_id: int) -> None:
        """Abort the pipeline's pending checkpoints older than ``checkpoint_id``, savepoints
        excepted: a completed checkpoint subsumes them, as Flink's does."""
        pending = await self._records_call(self.records.pending, pipeline)
        older = [i for i, entry in pending.items() if i < checkpoint_id and not entry.get("savepoint")]
        if older:
            await self._records_call(self.records.remove_pending, pipeline, older)
            self.counts["aborted"] += len(older)
            for older_id in older:
                self.stats.aborted(pipeline, older_id, f"subsumed by checkpoint {checkpoint_id}", time.time())
            log.info("pipeline %s: checkpoint %d subsumed pending checkpoints %s", pipeline, checkpoint_id, older)

    def _discard_later(self, pipeline: str) -> None:
        """Discard after the answer, as Flink discards subsumed checkpoints in the background:
        the completion is durable and visible already, and deleting names costs a directory
        fsync each (a fencing check each, in zookeeper mode). It takes the pipeline's lock once
        the completion lets it go; ``list`` waits for it (:meth:`_settle`)."""

        async def discard() -> None:
            async with self._lock(pipeline):
                await self._discard(pipeline)

        task = asyncio.create_task(discard())
        self._discarding[pipeline] = task
        task.add_done_callback(lambda done: self._discarded(pipeline, done))

    def _discarded(self, pipeline: str, task: asyncio.Task[None]) -> None:
        if self._discarding.get(pipeline) is task:
            del self._discarding[pipeline]
        if not task.cancelled() and task.exception() is not None:
            log.warning("pipeline %s: discarding failed: %s", pipeline, task.exception())

    async def _settle(self, pipeline: str) -> None:
        """Wait for the pipeline's discard in progress, if any (its failure is logged)."""
        task = self._discarding.get(pipeline)
        if task is not None:
            await asyncio.wait([task])

    async def stop(self) -> None:
        """Stop the clock; cancel the discards in progress (the next completion's discard does their work)."""
        tasks = list(self._discarding.values()) + ([self._ticking] if self._ticking is not None else [])
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        self.metadata.close()

    async def _subsume(self, pipeline: str, epoch: int, policy: RetentionPolicy) -> list[int]:
        """Remove the checkpoints ``policy`` no longer keeps (savepoints never), as the writer."""
        records = await self._records_call(self.records.records, pipeline)
        subsumed = []
        for checkpoint_id in policy.subsumed(records):
            try:
                await self._records_call(self.records.remove, pipeline, epoch, checkpoint_id)
            except NotFound:  # an operator deleted it meanwhile
                continue
            subsumed.append(checkpoint_id)
            self.counts["subsumed"] += 1
        if subsumed:
            log.info("pipeline %s: subsumed checkpoints %s", pipeline, subsumed)
        return subsumed

    async def _abort(self, pipeline: str, epoch: int, checkpoint_id: int, reason: str) -> dict[str, Any]:
        """Abort a pending checkpoint for the coordinator that triggered it: FENCED for any
        other (a replaced coordinator cannot abort its successor's checkpoints). An id not
        pending is aborted already."""
        async with self._lock(pipeline):
            await self._check_writer(pipeline, epoch)
            if await self._pending_entry(pipeline, epoch, checkpoint_id) is not None:
                await self._records_call(self.records.remove_pending, pipeline, [checkpoint_id])
                self.counts["aborted"] += 1
                self.stats.aborted(pipeline, checkpoint_id, reason, time.time())
            discarded = await self._discard(pipeline)
        return {"discarded": discarded}

    async def _list(self, pipeline: str) -> dict[str, Any]:
        await self._settle(pipeline)  # what a list shows is what stays
        records = await self._records_call(self.records.records, pipeline)
        for record in records:
            if "problem" not in record:
                try:
                    await self.metadata.verify(pipeline, record)
                except (NotFound, DigestMismatch, BadRequest) as exc:
                    record["problem"] = str(exc)
            if "problem" in record:
                self._report_damaged(pipeline, record)
            else:
                self.damaged.pop((pipeline, record["id"]), None)
        return {
            "checkpoints": records,
            "epoch": await self._records_call(self.records.writer, pipeline),
            "pending": sorted(await self._live_pending(pipeline)),
        }

    async def _delete(self, pipeline: str, checkpoint_id: int) -> dict[str, Any]:
        async with self._lock(pipeline):
            await self._records_call(self.records.remove, pipeline, None, checkpoint_id)
            self.damaged.pop((pipeline, checkpoint_id), None)
            self.stats.forget(pipeline, checkpoint_id)
            log.info("pipeline %s: checkpoint %d deleted", pipeline, checkpoint_id)
            discarded = await self._discard(pipeline)
        return {"discarded": discarded}

    async def _keep(self, pipeline: str, checkpoint_id: int) -> dict[str, Any]:
        async with self._lock(pipeline):
            record = await self._records_call(self.records.keep, pipeline, checkpoint_id)
        if "problem" in record:
            raise NotFound(f"checkpoint {checkpoint_id} of {pipeline} cannot be kept: {record['problem']}")
        self.stats.kept(pipeline, checkpoint_id)
        log.info("pipeline %s: checkpoint %d kept as a savepoint", pipeline, checkpoint_id)
        return {"record": record}

    async def _hold(self, pipeline: str, checkpoint_id: int, seconds: float) -> dict[str, Any]:
        async with self._lock(pipeline):
            records = await self._records_call(self.records.records, pipeline)
            record = next((r for r in records if r["id"] == checkpoint_id), None)
            if record is None or "problem" in record:
                raise NotFound(f"pipeline {pipeline} has no checkpoint {checkpoint_id} to restore")
            if len(self._holds) >= MAX_HOLDS:
                self._holds.expire()
                if len(self._holds) >= MAX_HOLDS:
                    raise Busy(f"{MAX_HOLDS} restores hold checkpoints on this server: wait for some to end")
            keys = await self.metadata.keys(pipeline, record)
            token = secrets.token_hex(16)
            self._holds.add(pipeline, token, seconds, checkpoint_id, keys)
        return {"token": token}

    async def _release(self, pipeline: str, token: object) -> dict[str, Any]:
        async with self._lock(pipeline):
            if self._holds.release(pipeline, token):
                return {"discarded": await self._discard(pipeline)}
        return {"discarded": 0}

    async def _records_call(self, work: Callable[..., _T], *args: Any) -> _T:
        """A call of the records in a worker thread. Their store failing is one line, logged at
        WARNING: a disk error is INTERNAL_ERROR; ZooKeeper unreachable or the session lost is
        NOT_LEADER, so that the client finds the leader again and retries."""
        try:
            return await asyncio.to_thread(work, *args)
        except BlobError:
            raise
        except Exception as exc:
            cause = " ".join(f"{type(exc).__name__}: {exc}".split())
            log.warning("checkpoint records: %s failed: %s", work.__name__, cause)
            if isinstance(exc, OSError):
                raise InternalError(f"the checkpoint records could not be read or written: {cause}") from None
            raise NotLeader(f"this server could not reach ZooKeeper for the checkpoint records: {cause}") from None

    # --- the rules ----------------------------------------------------------------------------

    def _report_damaged(self, pipeline: str, record: Record) -> None:
        if (pipeline, record["id"]) not in self.damaged:
            log.warning("pipeline %s: checkpoint %d cannot be restored: %s", pipeline, record["id"], record["problem"])
        self.damaged[(pipeline, record["id"])] = record["problem"]

    async def _discard(self, pipeline: str) -> int:
        """Delete the pipeline's state and metadata names nothing references (rule 4); the
        caller holds the pipeline's lock. Returns how many names went."""
        if await self._live_pending(pipeline):
            return 0
        records = await self._records_call(self.records.records, pipeline)
        referenced: set[bytes] = set()
        keep_ids = {record["id"] for record in records}
        for record in records:
            try:
                if "problem" in record:
                    raise BadRequest(record["problem"])
                referenced |= await self.metadata.keys(pipeline, record)
            except (NotFound, DigestMismatch, BadRequest) as exc:
                record.setdefault("problem", str(exc))
                self._report_damaged(pipeline, record)
                return 0
        for held_id, keys in self._holds.held(pipeline):
            referenced |= keys
            keep_ids.add(held_id)
        job = pipeline_job(pipeline)
        local = await asyncio.to_thread(self.server.storage.list_job, job)
        names = {entry.name for entry in local} | set(await self.server.ha.names(job))
        discarded = 0
        for name in sorted(names):
            key, checkpoint_id = state_key(name), metadata_id(name)
            unreferenced = key is not None and key not in referenced
            if unreferenced or (checkpoint_id is not None and checkpoint_id not in keep_ids):
                try:
                    await self.server.delete_blob(JobBlob(job, name))
                    _crash_point("mid-discard")
                except BlobError as exc:  # NOT_LEADER mid-way: the next discard finishes
                    log.warning("pipeline %s: could not discard %s: %s", pipeline, name, exc)
                    break
                discarded += 1
        self.metadata.forget(pipeline, keep_ids)
        if discarded:
            self.counts["discarded"] += discarded
            log.info("pipeline %s: discarded %d blobs no checkpoint references", pipeline, discarded)
        return discarded

    async def _live_pending(self, pipeline: str) -> dict[int, Record]:
        """The pipeline's pending checkpoints; those past their deadline are aborted here."""
        pending = await self._records_call(self.records.pending, pipeline)
        now = time.time()
        expired = [checkpoint_id for checkpoint_id, entry in pending.items() if entry["deadline"] < now]
        if expired:
            await self._records_call(self.records.remove_pending, pipeline, expired)
            self.counts["aborted"] += len(expired)
            for checkpoint_id in expired:
                self.stats.aborted(pipeline, checkpoint_id, "timed out before every task acknowledged", now)
            log.info("pipeline %s: checkpoints %s timed out", pipeline, expired)
        return {checkpoint_id: entry for checkpoint_id, entry in pending.items() if checkpoint_id not in expired}

    def status(self) -> dict[str, Any]:
        """For STATUS and the metrics, counted since this server started: reads only."""
        last = self.last_completed
        return {
            "checkpoints_completed": self.counts["completed"],
            "checkpoints_aborted": self.counts["aborted"],
            "checkpoints_subsumed": self.counts["subsumed"],
            "checkpoints_discarded_blobs": self.counts["discarded"],
            "checkpoints_state_bytes_sent": self.counts["bytes_sent"],
            "checkpoints_state_bytes_reused": self.counts["bytes_reused"],
            "checkpoints_last_completed": None if last is None else f"{last[0]}/{last[1]}",
            "checkpoints_last_completed_id": None if last is None else last[1],
            "checkpoints_last_completed_age_seconds": None if last is None else round(time.time() - last[2], 3),
            "checkpoints_damaged": len(self.damaged),
            "checkpoints_last_duration_seconds": None if self.stats.last is None else self.stats.last["duration"],
            "checkpoints_last_state_bytes": None if self.stats.last is None else self.stats.last["state_bytes"],
            "checkpoints_durations": [*self.stats.durations, self.stats.duration_sum],
            "checkpoints_damaged_records": [
                f"{pipeline}/{checkpoint_id}: {problem}"
                for (pipeline, checkpoint_id), problem in list(self.damaged.items())[:MAX_DAMAGED_LISTED]
            ],
        }


def _integer(request: dict[str, Any], field: str, low: int = 0, high: int = (1 << 63) - 1) -> int:
    value = request.get(field)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise BadRequest(f"a checkpoints request's {field!r} is an integer from {low} to {high}, not {value!r}")
    return value


def _seconds(request: dict[str, Any], field: str) -> float:
    value = request.get(field)
    if not isinstance(value, int | float) or isinstance(value, bool) or not 0 < value <= MAX_TIMEOUT:
        raise BadRequest(f"a checkpoints request's {field!r} is a number of seconds up to {MAX_TIMEOUT:g}")
    return float(value)


def _reason(request: dict[str, Any]) -> str:
    """Why the coordinator says a checkpoint was aborted: for the history only, shortened."""
    reason = request.get("reason")
    return reason if isinstance(reason, str) and reason else "aborted by its coordinator"


def _flag(request: dict[str, Any], field: str) -> bool:
    value = request.get(field, False)
    if not isinstance(value, bool):
        raise BadRequest(f"a checkpoints request's {field!r} is true or false, not {value!r}")
    return value


def _kind(savepoint: bool) -> str:
    return "savepoint" if savepoint else "checkpoint"
