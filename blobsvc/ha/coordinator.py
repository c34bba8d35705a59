"""What a BlobServer asks about high availability, in either recovery mode.

:Status: Production.

The server asks a few questions and nothing more: *may I serve?* (:meth:`check`), *store
this durably* (:meth:`store`, :meth:`link`), *may I acknowledge?* (:meth:`acknowledge`),
*fetch what I lack* (:meth:`recover`), and of content only the HA store holds, *name it
there* (:meth:`adopt`) and *what is it?* (:meth:`stat_stored`), neither reading its bytes.
:class:`Standalone` answers yes, done, yes, nothing, no and nothing.

Session loss, in :class:`ZooKeeperHA` (the rules themselves live in :mod:`.leader`): while
the session is SUSPENDED or LOST, or on a standby, :meth:`check` answers NOT_LEADER, so no
request starts; :meth:`acknowledge` asks ZooKeeper to confirm the epoch, so a PUT or
DELETE in flight when leadership went is never acknowledged. HA data is only ever removed
by a DELETE, or a retention deletion (:mod:`blobsvc.server._retention`), that passed that check.

A server's own data directory is a cache of the HA store. When a server is elected and
another server led since it last did, names in its cache that the HA store no longer holds
(or holds with other bytes) are dropped from the cache before it serves: a blob deleted or
replaced under another leader is never served stale.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import math
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .._exceptions import BlobError, InternalError, NotLeader
from ..config import Settings
from ..files._layout import key_from_filename
from ..storage import BlobStorage, StagedUpload
from ..wire._protocol import ContentKey, JobBlob, WholeJob
from .checkpoints import FileCheckpointRecords, ZooKeeperCheckpointRecords
from .discovery import INSTALL_HINT, ZkPaths, check_cluster_id, connect_zookeeper, require_kazoo
from .store import FileSystemBlobStore, check_store, failure, open_blob_store

__all__ = ["HighAvailability", "Standalone", "ZooKeeperHA", "high_availability"]

log = logging.getLogger("blobsvc.ha")
_T = TypeVar("_T")

SERVER_ID_FILE = "server-id"
HA_COUNT_INTERVAL = 60.0  # seconds between counts of the HA store's blobs for status
# Names stat-ed in the HA store at once when a completion checks state only the store holds.
STAT_WAYS = 16
# The leader sweeps the HA store of objects no name holds this often, removing those older than
# ORPHAN_GRACE: a task links what it wrote within seconds; an hour leaves room for a slow one.
SWEEP_INTERVAL = 3600.0
ORPHAN_GRACE = 3600.0


class Standalone:
    """Recovery mode ``standalone``: one server, its local disk, no ZooKeeper."""

    mode = "standalone"
    copies_uploads = False
    """Whether :meth:`store` does anything: the server skips the call when it does not."""
    confirms_acknowledgements = False
    """Whether :meth:`acknowledge` asks anyone: when neither it nor :meth:`store` does, a
    small PUT may be answered from the event loop's reader callback (:mod:`blobsvc.server._fastpath`)."""

    async def start(self, address: tuple[str, int], storage: BlobStorage) -> None:
        pass

    async def stop(self) -> None:
        pass

    def check(self) -> None:
        pass

    async def store(self, upload: StagedUpload, target: JobBlob | None, digest: bytes) -> None:
        pass

    async def link(self, source: Path, key: bytes, target: JobBlob | None) -> None:
        pass

    async def acknowledge(self) -> None:
        pass

    async def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        pass

    async def recover(self, target: ContentKey | JobBlob) -> bool:
        return False

    async def adopt(self, key: bytes, target: JobBlob) -> int | None:
        return None

    async def stat_stored(self, targets: Sequence[ContentKey | JobBlob]) -> list[tuple[int, bytes] | None]:
        return [None] * len(targets)

    async def recover_job(self, job: bytes) -> None:
        pass

    async def holds_job(self, job: bytes) -> bool:
        return False

    async def names(self, job: bytes) -> list[str]:
        return []

    def status(self) -> dict[str, Any]:
        return {"mode": self.mode}

    def checkpoint_records(self, storage: BlobStorage) -> FileCheckpointRecords:
        """The pipelines' checkpoint records: fsynced files in the data directory."""
        return FileCheckpointRecords(storage.layout.root / "checkpoints")


class ZooKeeperHA:
    """Recovery mode ``zookeeper``: leader election, fencing, and a FileSystemBlobStore."""

    mode = "zookeeper"
    copies_uploads = True
    confirms_acknowledgements = True

    def __init__(self, settings: Settings) -> None:
        if not settings.zookeeper or not settings.ha_dir:
            raise ValueError("recovery mode zookeeper needs --zookeeper HOST:PORT[,…] and --ha-dir PATH_OR_URL")
        require_kazoo()
        self.settings = settings
        self.paths = ZkPaths(check_cluster_id(settings.cluster_id))
        location = f"{settings.ha_dir.rstrip('/')}/{settings.cluster_id}"
        # What caches open to read blobs from the store (blobsvc.ha.reads): a directory by its
        # absolute path, so that a relative --ha-dir means the same on every host mounting it.
        self.store_url = location if "://" in location else os.path.abspath(os.path.expanduser(location))
        try:
            self.blobs: FileSystemBlobStore = open_blob_store(location, connect_timeout=settings.connect_timeout)
        except ImportError as exc:  # fsspec, or the backend of the URL's scheme
            raise ImportError(f"--ha-dir {settings.ha_dir}: {exc} ({INSTALL_HINT})") from None
        self._client: Any = None
        self._election: Any = None
        self._storage: BlobStorage | None = None
        self._ha_blobs: int | None = None
        self._store_error: str | None = None  # the last failure of the HA store, until it works again
        self._counted_at = -math.inf
        self._counting = threading.Lock()
        self._fence = _SharedCheck(lambda: self._election.fence(settings.zookeeper_session_timeout))
        self._sweeping: asyncio.Task[None] | None = None

    async def start(self, address: tuple[str, int], storage: BlobStorage) -> None:
        from .leader import LeaderElection

        self._storage = storage
        # Before ZooKeeper: a server that cannot use its store must not become a leader that
        # fails every PUT, but exit naming it, as it does for ZooKeeper.
        await asyncio.to_thread(
            check_store,
            self.blobs.location,
            create_bucket=self.settings.ha_create_bucket,
            connect_timeout=self.settings.connect_timeout,
        )
        host = self.settings.host
        if host in {"", "0.0.0.0", "::"}:
            host = socket.getfqdn()
        advertised = f"[{host}]:{address[1]}" if ":" in host else f"{host}:{address[1]}"
        self._client = await asyncio.to_thread(
            connect_zookeeper,
            self.settings.zookeeper,
            session_timeout=self.settings.zookeeper_session_timeout,
            timeout=self.settings.connect_timeout,
        )
        self._election = LeaderElection(
            self._client,
            self.paths,
            address=advertised,
            server_id=self._server_id(storage),
            on_elected=self._forget_stale,
        )
        self._election.start()
        self._sweeping = asyncio.create_task(self._sweep_forever())

    async def stop(self) -> None:
        if self._sweeping is not None:
            self._sweeping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeping
        if self._election is not None:
            await asyncio.to_thread(self._election.stop)
        if self._client is not None:
            client, self._client = self._client, None
            await asyncio.to_thread(client.stop)
            client.close()

    @staticmethod
    def _server_id(storage: BlobStorage) -> str:
        """This data directory's id, kept across restarts, to tell whether it led last."""
        path = storage.layout.root / SERVER_ID_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            server_id = uuid.uuid4().hex
            path.write_text(server_id + "\n")
            return server_id

    # --- the server's questions -------------------------------------------------------------

    def check(self) -> None:
        election = self._election
        if election is not None and election.may_write():
            return
        if election is not None and election.role == "suspended":
            raise NotLeader("this server's ZooKeeper session is suspended; it serves nothing until it is back")
        leader = election.leader if election is not None else None
        raise NotLeader(f"this server is a standby; the leader is {leader}" if leader else "no leader is elected yet")

    async def store(self, upload: StagedUpload, target: JobBlob | None, digest: bytes) -> None:
        if upload.digest() != digest:
            return  # publication refuses it, with the precise error
        token = self._election.token or 0
        # upload.file(): a small upload held in memory is written to its staging file here.
        failed = f"could not store {digest.hex()}, not acknowledged"
        await self._in_store(failed, lambda: self.blobs.put(upload.file(), digest, target, token))

    async def link(self, source: Path, key: bytes, target: JobBlob | None) -> None:
        """Make a LINKed name (or, None, the content-addressed name) durable: the HA store
        copies the bytes from ``source`` (the local object) only when it lacks them, else
        records the name alone."""
        token = self._election.token or 0
        failed = f"could not store {key.hex()}, not acknowledged"
        await self._in_store(failed, lambda: self.blobs.put(source, key, target, token))

    async def adopt(self, key: bytes, target: JobBlob) -> int | None:
        """Name ``target`` the content of ``key`` that only the HA store holds (a task wrote it
        there, or another leader stored it), in the store alone, no byte copied: its size, or
        None when the store has no such object. This server reads the bytes only when asked
        for them (lazy recovery, verified)."""
        token = self._election.token or 0
        failed = f"could not name {key.hex()}, not acknowledged"
        return await self._in_store(failed, lambda: self.blobs.adopt(key, target, token))

    async def stat_stored(self, targets: Sequence[ContentKey | JobBlob]) -> list[tuple[int, bytes] | None]:
        """The size and key of each of ``targets`` in the HA store (None for one it lacks),
        from records and object sizes alone, asked :data:`STAT_WAYS` at a time: an object
        store answers each in a round trip."""

        epoch = self._election.token

        def stat_all() -> list[tuple[int, bytes] | None]:
            with concurrent.futures.ThreadPoolExecutor(STAT_WAYS, thread_name_prefix="blobsvc-ha-stat") as pool:
                return list(pool.map(lambda target: self.blobs.stat_name(target, epoch), targets))

        return await self._in_store("could not be read", stat_all)

    async def sweep(self) -> int:
        """Remove from the HA store the objects that no name holds, written more than
        :data:`ORPHAN_GRACE` seconds ago (a task's write it never linked); only while leading."""
        if not self._election.may_write():
            return 0
        before = time.time() - ORPHAN_GRACE
        return await self._in_store("could not be swept", lambda: self.blobs.sweep(before))

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            try:
                await self.sweep()
            except BlobError as exc:  # logged by _in_store; the next sweep tries again
                log.debug("sweep failed: %s", exc)

    async def acknowledge(self) -> None:
        if not await self._fence.confirm():
            raise NotLeader("this server could not confirm its leadership with ZooKeeper; nothing acknowledged")

    async def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        await self.acknowledge()  # a deposed leader never removes HA data
        await asyncio.to_thread(self.blobs.delete, target)

    async def recover(self, target: ContentKey | JobBlob) -> bool:
        """Fetch a blob the local disk lacks from the HA store (verified), keep it locally;
        False when the HA store does not have it either."""
        return await self._in_store("could not be read", lambda: self._recover(target))

    async def _in_store(self, failed: str, work: Callable[[], _T]) -> _T:
        """``work`` on the HA store in a worker thread. A failure of the store itself (an
        endpoint down, credentials refused: fsspec backends raise their own errors, not only
        OSError) becomes one line naming the store, what ``failed`` and why, logged at warning
        and answered as INTERNAL_ERROR: the request is not acknowledged. blobsvc's own
        errors (NOT_LEADER, a damaged copy) pass as they are."""
        try:
            result = await asyncio.to_thread(work)
        except BlobError:
            raise
        except Exception as exc:
            cause = failure(exc)
            self._store_error = cause
            message = f"the HA store {self.blobs.location} {failed}: {cause}"
            log.warning("%s", message)
            raise InternalError(message) from None
        self._store_error = None
        return result

    def _recover(self, target: ContentKey | JobBlob) -> bool:
        storage = self._storage
        assert storage is not None
        named = self.blobs.key_of(target)
        if named is None:
            return False
        # Staged as a PUT of its size is: a disk that cannot hold it refuses it (as
        # INSUFFICIENT_STORAGE) before a byte is fetched, not at the byte that does not fit.
        with storage.stage(self.blobs.size_of(named)) as upload:
            key = self.blobs.fetch(target, upload.write)
            if key is None:
                return False
            storage.publish(upload, target if isinstance(target, JobBlob) else None, key)
        log.info("recovered %s from the HA store", key.hex())
        return True

    async def recover_job(self, job: bytes) -> None:
        """Fetch every blob of ``job`` the local disk lacks (before a LIST)."""
        storage = self._storage
        assert storage is not None
        held = {entry.name for entry in await asyncio.to_thread(storage.list_job, job)}
        for name in await asyncio.to_thread(self.blobs.names, job):
            if name not in held:
                await self.recover(JobBlob(job, name))

    async def holds_job(self, job: bytes) -> bool:
        """Whether the HA store holds a blob of ``job`` that the local disk may lack (a new
        leader recovers lazily). When the store cannot be asked the answer is yes: an agent
        told that a live job is gone would drop what its executors still use."""
        try:
            return await asyncio.to_thread(self.blobs.has_job, job)
        except OSError as exc:
            log.warning("could not ask the HA store about job %s: %s", job.hex(), exc)
            return True

    async def names(self, job: bytes) -> list[str]:
        """The names of ``job`` the HA store holds (a new leader's disk may lack some)."""
        return await self._in_store("could not be listed", lambda: self.blobs.names(job))

    def status(self) -> dict[str, Any]:
        """For STATUS and the metrics: reads only. ``store`` is where caches read blobs from
        (docs/protocol.md, "STATUS"). ``ha_blobs`` is counted in a worker thread
        at most once a minute (listing a large store, or S3, takes a while); None until then."""
        election = self._election
        now = time.monotonic()
        if now - self._counted_at > HA_COUNT_INTERVAL and not self._counting.locked():
            self._counted_at = now
            threading.Thread(target=self._count, name="blobsvc-ha-count", daemon=True).start()
        return {
            "mode": self.mode,
            "role": election.role if election is not None else "standby",
            "leader": election.leader if election is not None else None,
            "leader_changes": election.leader_changes if election is not None else 0,
            "cluster_id": self.paths.cluster_id,
            "zookeeper": self.settings.zookeeper,
            "ha_store": self.blobs.location,
            "store": self.store_url,
            "ha_blobs": self._ha_blobs,
            "ha_store_error": self._store_error,
        }

    def checkpoint_records(self, storage: BlobStorage) -> ZooKeeperCheckpointRecords:
        """The pipelines' checkpoint records: ZooKeeper nodes, written while this server leads
        only (after :meth:`start`)."""
        election = self._election
        assert self._client is not None and election is not None, "start() first"
        return ZooKeeperCheckpointRecords(
            self._client, self.paths, lambda: election.token if election.may_write() else None
        )

    def _count(self) -> None:
        with self._counting:
            try:
                self._ha_blobs = self.blobs.count()
            except Exception as exc:  # a backend's own errors (botocore's) are not OSErrors
                self._store_error = failure(exc)
                log.warning("could not count the HA store's blobs: %s", self._store_error)
            else:
                self._store_error = None

    # --- on election ------------------------------------------------------------------------

    def _forget_stale(self, previous: str) -> None:
        """Drop cached names the HA store contradicts, unless this server led last."""
        storage = self._storage
        assert storage is not None
        if previous == self._election.server_id:
            return
        dropped = 0
        for path in list(storage.layout.cache.iterdir()):
            key = key_from_filename(path.name)
            if key is not None and self.blobs.key_of(ContentKey(key)) != key:
                storage.delete(ContentKey(key))
                dropped += 1
        for job in storage.layout.job_dirs():
            for entry in storage.list_job(job):
                if self.blobs.key_of(JobBlob(job, entry.name)) != entry.digest:
                    storage.delete(JobBlob(job, entry.name))
                    dropped += 1
        if dropped:
            log.warning("dropped %d cached blobs that the HA store no longer holds as they were", dropped)


class _SharedCheck:
    """One fencing check answers every acknowledgement that was waiting when it began.

    The check is a ZooKeeper write (its leader fsyncs it), so concurrent PUTs share one: a
    caller joins the next check that has *not yet started*, so the check it gets began after
    the caller's data was durable, and says whether we still led at that moment."""

    def __init__(self, check: Callable[[], bool]) -> None:
        self._check = check
        self._next: asyncio.Future[bool] | None = None
        self._runner: asyncio.Task[None] | None = None

    async def confirm(self) -> bool:
        if self._next is None:
            self._next = asyncio.get_running_loop().create_future()
        waiting = self._next
        if self._runner is None or self._runner.done():
            self._runner = asyncio.create_task(self._run())
        return await asyncio.shield(waiting)

    async def _run(self) -> None:
        while self._next is not None:
            current, self._next = self._next, None
            try:
                current.set_result(await asyncio.to_thread(self._check))
            except asyncio.CancelledError:  # the server is shutting down
                current.cancel()
                raise


HighAvailability = Standalone | ZooKeeperHA


def high_availability(settings: Settings) -> HighAvailability:
    """The recovery mode's coordinator; a missing extra or setting fails here, in one line."""
    if settings.recovery_mode == "zookeeper":
        return ZooKeeperHA(settings)
    return Standalone()
