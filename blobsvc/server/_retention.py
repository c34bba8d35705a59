"""Retention: the server's disk in bounds, never at the cost of a blob a job names.

:Status: Production.

Two settings, both off by default. With ``content_ttl``, content that no job names and that
nobody has read for that long is deleted. With ``max_store_bytes``, once the server's blobs
(:meth:`BlobStorage.usage`) pass the limit, unreferenced content is deleted, least recently
read first, until they are under it. A :class:`Retention` sweep does both: the first
:data:`LIMIT_CHECK` seconds after the start, then every ``retention_interval`` seconds, and
within :data:`LIMIT_CHECK` seconds of the store passing its limit (unless the last sweep
could not bring it under).

What holds, each pinned by ``tests/test_retention.py``:

1. **Never what a job names.** Only an object with exactly two links, itself and its
   content-addressed name ``cache/<key>``, is ever a candidate; that is checked again, with
   the deletion, under the key's lock (:meth:`BlobStorage.evict`), which every link of a
   job's name to an object holds too. A LINK racing a deletion therefore either links first
   (the content is kept) or finds no content (NOT_FOUND; nothing dangles).
2. **Never what is being read or written.** A read in progress holds its descriptor, which
   outlives the unlink; a hot blob is dropped from memory with its name. An upload is a
   staging file until its publication, which takes the key's lock and makes the object
   anew if it was deleted meanwhile.
3. **Never within the grace period.** Content stored, read, or left by its last job name
   less than ``retention_grace`` seconds ago is kept: a ``publish`` uploads content, then
   LINKs it, and a job whose names were deleted leaves its content there a while.
4. **A last use is never taken for earlier than it was.** Storage writes the atime, in the
   server's clock, when a PUT stores content (new or again), when a job's name that linked
   it goes and leaves it unreferenced, and when it is read. A read is GET (binary or HTTP,
   hot blobs served from memory included), HTTP HEAD, STAT, and the lazy fetch of a blob
   from the HA store: whatever opens a blob (:meth:`BlobStorage.open_blob`) or serves it
   from memory. STAT counts: a client asking whether content is there is about to use it
   (fetch it, or link it instead of uploading). LINK is not a read: it makes the content
   referenced, which keeps it anyway, and its name's going is recorded. :class:`ReadClock`
   writes a read only when the atime is :data:`READ_GRANULARITY` or more older than it, so
   a hot blob costs one ``utime`` a minute, not one per GET; a sweep takes ``atime +
   READ_GRANULARITY`` as the last use, since no read after that went unrecorded. The atime
   is in the inode, so a restart keeps it; nothing is held in memory that a restart could
   lose, and nothing is ever written older than it was (a clock gone backwards leaves the
   atime in the future: content kept).
5. **Chosen and deleted as seen.** A candidate is deleted only if its atime and ctime are
   still those the sweep chose it by: read, stored, linked or unlinked since, it is kept.
6. **In recovery mode zookeeper only the leader deletes, fenced.** A sweep starts only on a
   server that may write (:meth:`check`), and each deletion goes through the HA delete path
   (:meth:`ZooKeeperHA.delete`): the epoch is confirmed with ZooKeeper, then the HA copy's
   content name is removed, then the local copy. A deletion the local check then refuses
   (rule 5: read or linked meanwhile) puts the HA content name back from the local object.

Session loss: when the ZooKeeper session is SUSPENDED or LOST mid-sweep, or leadership goes
to another server, the next deletion's check (or its epoch confirmation) fails with
NOT_LEADER; that deletion removes nothing, HA copy or local, and the sweep stops. The new
leader's sweeps plan afresh from its own disk.

Each deletion is logged (one line: key, bytes, ``ttl`` or ``limit``) and counted in
:meth:`Retention.status`, which STATUS and the metrics show.

Caveats: the atime a ``utime`` wrote reaches the disk with the inode's next write-back (ext4
commits metadata every 5 s), so a crash can lose the uses of its last few seconds. A sweep
stats every object in a worker thread: about 20 µs each on a loaded 2-core machine, some
20 s per million blobs. A client DELETE of
the very content a refused deletion is putting back in the HA store (rule 6) may leave its
HA content name, which a later GET would fetch again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from .._exceptions import NotLeader
from ..files._layout import key_from_filename
from ..storage._readclock import READ_GRANULARITY, ReadClock
from ..wire._protocol import ContentKey
from ..wire._threads import wait_out

if TYPE_CHECKING:
    from ..config import Settings
    from ..ha import HighAvailability
    from ..storage import BlobStorage

__all__ = ["READ_GRANULARITY", "Candidate", "ReadClock", "Retention"]

log = logging.getLogger("blobsvc.retention")

# Seconds between checks of the store's size against max_store_bytes, between sweeps.
LIMIT_CHECK = 10.0
# Deletions under way at once: in zookeeper mode they share one epoch confirmation.
DELETE_BATCH = 32
REASONS = ("ttl", "limit")


@dataclass(frozen=True, slots=True)
class Candidate:
    """Unreferenced content a sweep chose, and what it saw of it."""

    key: bytes
    size: int
    last_read: float
    """``atime + READ_GRANULARITY``: no read after it went unrecorded (rule 4)."""
    atime_ns: int
    ctime_ns: int
    reason: str = ""

    def unchanged(self, info: os.stat_result) -> bool:
        """Not read, linked nor unlinked since it was chosen (rule 5)."""
        return info.st_atime_ns == self.atime_ns and info.st_ctime_ns == self.ctime_ns


class Retention:
    """The sweeps of one server's storage; see the module docstring for the rules."""

    def __init__(
        self,
        storage: BlobStorage,
        ha: HighAvailability,
        *,
        content_ttl: float | None = None,
        max_store_bytes: int | None = None,
        grace: float = 600.0,
        interval: float = 300.0,
    ) -> None:
        self.storage = storage
        self.ha = ha
        self.content_ttl = content_ttl
        self.max_store_bytes = max_store_bytes
        self.grace = grace
        self.interval = interval
        self.sweeps = 0
        self.last_sweep: float | None = None
        self.deleted = dict.fromkeys(REASONS, 0)
        self.deleted_bytes = dict.fromkeys(REASONS, 0)
        self._sweeping = asyncio.Lock()
        self._stuck = False  # the last sweep left the store over its limit

    @classmethod
    def from_settings(cls, storage: BlobStorage, ha: HighAvailability, settings: Settings) -> Retention:
        return cls(
            storage,
            ha,
            content_ttl=settings.content_ttl,
            max_store_bytes=settings.max_store_bytes,
            grace=settings.retention_grace,
            interval=settings.retention_interval,
        )

    @property
    def enabled(self) -> bool:
        return self.content_ttl is not None or self.max_store_bytes is not None

    # --- planning (a worker thread) ------------------------------------------------------------

    def plan(self) -> list[Candidate]:
        """The content to delete now, each with its reason: expired first, then least
        recently read past the limit. Reads only; a stat of every object."""
        reads = self.storage.reads
        now = reads.clock()
        layout = self.storage.layout
        unreferenced: list[Candidate] = []
        with os.scandir(layout.objects) as entries:
            for entry in entries:
                key = key_from_filename(entry.name)
                if key is None:
                    continue
                try:
                    info = entry.stat(follow_symlinks=False)
                    if info.st_nlink != 2:
                        continue  # a job names it (rule 1), or it is garbage on its way out
                    last_read = info.st_atime + reads.granularity
                    if now - last_read < self.grace:
                        continue  # rule 3
                    # Its other link may be a job's name instead: only the content name counts.
                    if os.stat(layout.content(key)).st_ino != info.st_ino:
                        continue
                except FileNotFoundError:
                    continue
                unreferenced.append(Candidate(key, info.st_size, last_read, info.st_atime_ns, info.st_ctime_ns))
        unreferenced.sort(key=lambda candidate: candidate.last_read)
        chosen: list[Candidate] = []
        rest = unreferenced
        if self.content_ttl is not None:
            ttl = self.content_ttl
            chosen = [replace(c, reason="ttl") for c in unreferenced if now - c.last_read >= ttl]
            rest = [c for c in unreferenced if now - c.last_read < ttl]
        if self.max_store_bytes is not None:
            over = self.storage.usage()[1] - sum(c.size for c in chosen) - self.max_store_bytes
            for candidate in rest:
                if over <= 0:
                    break
                chosen.append(replace(candidate, reason="limit"))
                over -= candidate.size
            self._stuck = over > 0
        return chosen

    # --- deleting (the event loop) -------------------------------------------------------------

    def _may_delete(self) -> bool:
        try:
            self.ha.check()
        except NotLeader:
            return False
        return True

    async def sweep(self) -> list[Candidate]:
        """Plan, then delete; returns what was deleted. Nothing on a server that may not write
        (a standby, or a suspended session); stops at the first NOT_LEADER (rule 6)."""
        async with self._sweeping:
            if not self._may_delete():
                return []
            chosen = await asyncio.to_thread(self.plan)  # only reads: left to finish alone on shutdown
            deleted: list[Candidate] = []
            for start in range(0, len(chosen), DELETE_BATCH):
                batch = chosen[start : start + DELETE_BATCH]
                outcomes = await asyncio.gather(*map(self._delete, batch), return_exceptions=True)
                deposed = False
                for candidate, outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, NotLeader):
                        deposed = True
                    elif isinstance(outcome, BaseException):
                        log.warning("retention could not delete %s: %s", candidate.key.hex(), outcome)
                    elif outcome:
                        deleted.append(candidate)
                if deposed:
                    log.warning("retention stopped: this server may no longer write (not the leader)")
                    break
            self.sweeps += 1
            self.last_sweep = self.storage.reads.clock()
            return deleted

    async def _delete(self, candidate: Candidate) -> bool:
        target = ContentKey(candidate.key)
        self.ha.check()  # a session suspended mid-sweep stops it here (rule 6)
        if self.ha.copies_uploads:
            # The HA copy first, as DELETE does: a lazy recovery must not bring it back.
            # Fenced: the epoch is confirmed before anything is removed.
            await self.ha.delete(target)
        # Waited out even when the server shuts down: storage closes its journal next.
        evicting = asyncio.ensure_future(asyncio.to_thread(self.storage.evict, candidate.key, candidate.unchanged))
        await wait_out(evicting)
        size = evicting.result()
        if size is None:
            if self.ha.copies_uploads:
                await self._restore(candidate.key)
            return False
        log.info("retention deleted %s, %d bytes (%s)", candidate.key.hex(), size, candidate.reason)
        self.deleted[candidate.reason] += 1
        self.deleted_bytes[candidate.reason] += size
        return True

    async def _restore(self, key: bytes) -> None:
        """Put back the HA content name of content the local check kept (rule 6)."""
        layout = self.storage.layout
        if await asyncio.to_thread(os.path.exists, layout.content(key)):
            await self.ha.link(layout.object(key), key, None)

    async def run(self) -> None:
        """Sweep every ``interval`` seconds, and sooner when the store passes its limit
        (unless the last sweep could not bring it under: it would only stat everything
        again). Runs until cancelled."""
        loop = asyncio.get_running_loop()
        next_sweep = loop.time() + min(self.interval, LIMIT_CHECK)  # not in the start-up rush
        while True:
            await asyncio.sleep(max(0.0, min(next_sweep - loop.time(), LIMIT_CHECK)))
            limit = self.max_store_bytes
            over = limit is not None and not self._stuck and self.storage.usage()[1] > limit
            if loop.time() < next_sweep and not over:
                continue
            try:
                await self.sweep()
            except Exception:
                log.exception("retention sweep failed")
            next_sweep = loop.time() + self.interval

    def status(self) -> dict[str, Any]:
        """For STATUS and the metrics: reads only."""
        return {
            "retention": {
                "content_ttl": self.content_ttl,
                "max_store_bytes": self.max_store_bytes,
                "grace": self.grace,
                "sweeps": self.sweeps,
                "last_sweep": self.last_sweep,
                "deleted": dict(self.deleted),
                "deleted_bytes": dict(self.deleted_bytes),
            }
        }
