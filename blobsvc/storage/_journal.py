"""The journal: small publications made durable by one append and one ``fdatasync`` a batch.

A small PUT used to be durable by fsyncs of its own: its file, then each directory its names
live in. On this kind of disk every fsync of a new file ends with a flush of the device's
write cache, so a batch of small PUTs cost one flush per file (``benchmarks/experiments/bench_fsync.py``).
Now :meth:`BlobStorage.publish_batch` writes a small upload's file and names *without*
fsync, and the upload is durable by its record here instead: its key, its name and its
bytes, appended with the rest of the batch in one write to a segment file, then one
``fdatasync``. The files reach the disk later, all at once, at a checkpoint.

What holds, and where it is pinned (``tests/test_journal.py``):

1. **A record before its names.** A batch's records are durable before any of its names
   is made, so every name made since the last checkpoint has a durable record.
2. **Replay restores.** At start (:meth:`Journal.replay`, run by
   :meth:`BlobStorage.recover`) each record is applied in the order written: an object
   whose bytes did not reach the disk is written again in place (every name linking it
   then reads right), and a name that did not reach it is made again. The result is
   synced, and only then is the journal cleared. A crash during replay replays again.
3. **A checkpoint before clearing.** A segment is cleared only after ``syncfs`` on the
   data directory's file system made every file and name of its records durable, and
   after every batch that wrote to it has made its names.
4. **Nothing removed comes back.** Replay would bring back a name that was removed or
   replaced outside the journal after its record was written. So whatever removes or
   replaces a name the journal holds a record of (:meth:`Journal.holds`) first waits for a
   checkpoint (:meth:`Journal.settle`), holding no lock a publication needs.
5. **Order.** Records are appended under one lock, in the order their batches are
   acknowledged; a record is valid only if its header's checksum holds, its generation is
   its segment's, and its bytes hash to its key. Replay stops at the first invalid record:
   a torn append was never acknowledged.
6. **Room for blobs.** The journal never takes the space blobs need: the zeros ahead of the
   records are at most 1/16 of what the file system has free when they are written, a
   segment is truncated as it is cleared if its blocks are more than that (the deletions
   that empty a full disk checkpoint, so they give the space back), and an upload the disk
   refuses gets the blocks no record needs before it is refused (:meth:`Journal.give_back`).
   Pinned on small tmpfs mounts in ``tests/test_crash_safety.py``.

Two segment files take turns: while one receives records, the other is checkpointed and
cleared; a batch waits only when both are full. A clean :meth:`Journal.close` checkpoints
what is left, so that the next start has nothing to replay. A segment is reused, not
truncated unless rule 6 asks it (its header's generation tells its records from the last
round's), and a new one grows by zeros ahead of its records, so that an append writes over
allocated blocks and its ``fdatasync`` writes no metadata.

The cost of a checkpoint is ``syncfs``: it also writes whatever else is dirty on that file
system, so a data directory on a disk shared with heavy writers checkpoints more slowly.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import struct
import threading
import zlib
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import blake3

from ..files._filewrite import pwrite_all
from ..wire._protocol import JOB_SIZE, KEY_SIZE, JobBlob

__all__ = ["Journal", "Record", "SEGMENT_BYTES"]

log = logging.getLogger("blobsvc.storage")

# Each segment's size: at 4 KiB blobs about 8,000 records, so a checkpoint's syncfs every
# couple of seconds under full load, and at most 64 MiB to replay at a start.
SEGMENT_BYTES = 32 << 20
_HEADER_BYTES = 4096  # a segment's header block; records follow it
# A new segment file grows by this many zeros at a time, ahead of the records: an append
# that grows the file makes its fdatasync allocate blocks and write the inode too, and small
# PUTs ran 15-20 % slower for it in a same-run A/B (benchmarks/RESULTS.md).
_GROWTH = 4 << 20
# But the zeros ahead of the records, and a cleared segment's blocks kept for its next
# round, never take more than this share of the space the file system has free: blobs need
# that space more than appends need the speed (on an 8 MiB disk, 4 MiB of zeros after the
# first small PUT left room for half the blobs). A segment cleared when space is that short
# gives its blocks back.
_FREE_SHARE = 16

_SEGMENT_HEAD = struct.Struct("<4sQI")  # magic, generation, crc32 of both
_SEGMENT_MAGIC = b"BSJ1"
# generation, key, job (zeros for a content-addressed blob), name length, body length, then
# the crc32 of all that and the name; then the name (UTF-8) and the body.
_RECORD_HEAD = struct.Struct("<Q32s16sHI")
_CRC = struct.Struct("<I")
_NO_JOB = bytes(JOB_SIZE)
assert KEY_SIZE == 32 and JOB_SIZE == 16


@dataclass(frozen=True, slots=True)
class Record:
    """A published blob: its key, its job-scoped name (None: content-addressed), its bytes."""

    key: bytes
    target: JobBlob | None
    body: bytes | bytearray | memoryview

    def marks(self) -> tuple[Hashable, ...]:
        """What :meth:`Journal.holds` answers for while this record is not checkpointed:
        the content key, or the job and the job's name."""
        if self.target is None:
            return (self.key,)
        return (self.target.job, (self.target.job, self.target.name))

    def encode(self, generation: int) -> bytes:
        job, name = (_NO_JOB, b"") if self.target is None else (self.target.job, self.target.name.encode())
        head = _RECORD_HEAD.pack(generation, self.key, job, len(name), len(self.body))
        return b"".join((head, _CRC.pack(zlib.crc32(name, zlib.crc32(head))), name, self.body))


def _decode(data: memoryview, offset: int, generation: int) -> tuple[Record, int] | None:
    """The valid record at ``offset`` and the offset after it, or None (see rule 5)."""
    end = offset + _RECORD_HEAD.size + _CRC.size
    if end > len(data):
        return None
    head = data[offset : offset + _RECORD_HEAD.size]
    written, key, job, name_length, body_length = _RECORD_HEAD.unpack(head)
    if written != generation or end + name_length + body_length > len(data):
        return None
    name = bytes(data[end : end + name_length])
    (crc,) = _CRC.unpack(data[end - _CRC.size : end])
    if crc != zlib.crc32(name, zlib.crc32(head)):
        return None
    body = data[end + name_length : end + name_length + body_length]
    if blake3.blake3(body).digest() != key:
        return None
    target = None if job == _NO_JOB else JobBlob(job, name.decode())
    return Record(key, target, bytes(body)), end + name_length + body_length


def _sync_file_system_call() -> Callable[[int], None]:
    with contextlib.suppress(OSError, AttributeError):
        syncfs = ctypes.CDLL(None, use_errno=True).syncfs
        syncfs.argtypes = [ctypes.c_int]

        def sync(fd: int) -> None:
            if syncfs(fd) != 0:
                number = ctypes.get_errno()
                raise OSError(number, f"syncfs failed: {os.strerror(number)}")

        return sync
    return lambda fd: os.sync()


_sync_file_system = _sync_file_system_call()
"""``_sync_file_system(fd)``: make everything written on the file system of ``fd`` durable
(``syncfs``; ``sync`` where libc lacks it)."""


def _free_bytes(fd: int) -> int:
    """Bytes an unprivileged writer may still take on the file system of ``fd``."""
    info = os.fstatvfs(fd)
    return info.f_bavail * info.f_frsize


class _Segment:
    """One segment file and what the journal knows of it."""

    CLEAN, ACTIVE, FULL, SYNCING = range(4)

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.generation = 0
        self.offset = _HEADER_BYTES
        self.state = _Segment.CLEAN
        self.users = 0  # batches that appended here and are still making their names
        self.marks: set[Hashable] = set()

    def read_generation(self) -> int | None:
        head = os.pread(self.fd, _SEGMENT_HEAD.size, 0)
        if len(head) < _SEGMENT_HEAD.size:
            return None
        magic, generation, crc = _SEGMENT_HEAD.unpack(head)
        if magic != _SEGMENT_MAGIC or crc != zlib.crc32(head[: -_CRC.size]):
            return None  # new, or a torn reset: its records were checkpointed before it
        return int(generation)

    def records(self) -> Iterator[Record]:
        generation = self.read_generation()
        if generation is None:
            return
        size = os.fstat(self.fd).st_size
        data = memoryview(os.pread(self.fd, size, 0)) if size else memoryview(b"")
        offset = _HEADER_BYTES
        while (found := _decode(data, offset, generation)) is not None:
            record, offset = found
            yield record

    def reset(self, generation: int) -> None:
        """Start the segment over, empty, at ``generation``, giving its blocks back if they
        are more than their share of the free space; durable before it returns."""
        head = _SEGMENT_MAGIC + struct.pack("<Q", generation)
        head += _CRC.pack(zlib.crc32(head))
        if self.size - _HEADER_BYTES > _free_bytes(self.fd) // _FREE_SHARE:
            os.ftruncate(self.fd, 0)
            self.size = 0
        os.pwrite(self.fd, head.ljust(_HEADER_BYTES, b"\0") if self.size < _HEADER_BYTES else head, 0)
        self.size = max(self.size, _HEADER_BYTES)
        os.fdatasync(self.fd)
        self.generation, self.offset, self.marks = generation, _HEADER_BYTES, set()


class Journal:
    """The records of small publications not yet checkpointed, in ``directory``, which must
    be on the file system of the files they describe (see the module docstring). Methods
    may be called from any thread."""

    def __init__(self, directory: Path, *, segment_bytes: int = SEGMENT_BYTES) -> None:
        directory.mkdir(exist_ok=True)
        self._segments = [_Segment(directory / str(i)) for i in range(2)]
        # A descriptor on the file system to sync: the journal's directory is on the one
        # the data directory is on.
        self._sync_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        self._segment_bytes = segment_bytes
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._active = self._segments[0]
        self._next_generation = 1
        self._background: list[threading.Thread] = []
        self._closed = False
        self.checkpoints = 0
        """Checkpoints made so far (for tests and operators)."""

    def close(self) -> None:
        """Checkpoint what is not yet, so that the next start has nothing to replay, and
        close the files. Call it once nothing appends any more."""
        with self._lock:
            self._closed = True
        for thread in self._background:
            thread.join()
        dirty = [segment for segment in self._segments if segment.offset > _HEADER_BYTES]
        with contextlib.suppress(OSError):  # then the next start replays them
            if dirty:
                _sync_file_system(self._sync_fd)
            for segment in dirty:
                segment.reset(self._take_generation())
        for fd in [segment.fd for segment in self._segments] + [self._sync_fd]:
            os.close(fd)

    # --- start-up --------------------------------------------------------------------------

    def replay(self) -> list[Record]:
        """Every valid record, oldest first. Call :meth:`restart` once what they describe is
        durable."""
        found = [(generation, segment) for segment in self._segments if (generation := segment.read_generation())]
        self._next_generation = max((generation for generation, _ in found), default=0) + 1
        return [record for _, segment in sorted(found, key=lambda pair: pair[0]) for record in segment.records()]

    def restart(self) -> None:
        """Make what replay returned durable (the caller has applied it: written again what
        had not reached the disk), clear both segments and start appending."""
        _sync_file_system(self._sync_fd)
        with self._lock:
            for segment in self._segments:
                segment.reset(self._take_generation())
                segment.state, segment.users = _Segment.CLEAN, 0
            self._active = self._segments[0]
            self._active.state = _Segment.ACTIVE

    def _take_generation(self) -> int:
        generation, self._next_generation = self._next_generation, self._next_generation + 1
        return generation

    # --- appending -------------------------------------------------------------------------

    def append(self, records: Sequence[Record]) -> _Segment:
        """Write ``records`` to one segment and make them durable; returns the segment, to
        be handed to :meth:`release` once the records' names are made. They count whole or
        not at all: if this raises, replay will stop before the first of them."""
        with self._lock:
            assert self._active.state == _Segment.ACTIVE, "restart() first"
            encoded = [record.encode(self._active.generation) for record in records]
            size = sum(map(len, encoded))
            if size > self._segment_bytes - _HEADER_BYTES:
                raise ValueError(f"{size} bytes of records do not fit in one journal segment")
            if self._active.offset + size > self._segment_bytes:
                self._swap()
                encoded = [record.encode(self._active.generation) for record in records]
            segment = self._write(b"".join(encoded))
            for record in records:
                segment.marks.update(record.marks())
            return segment

    def _write(self, data: bytes) -> _Segment:
        segment = self._active
        try:
            end = segment.offset + len(data)
            if end > segment.size:
                ahead = min(_GROWTH, _free_bytes(segment.fd) // _FREE_SHARE)
                grown = min(max(end, segment.size + ahead), self._segment_bytes)
                pwrite_all(segment.fd, bytes(grown - segment.size), segment.size)
                segment.size = grown
            written = os.pwrite(segment.fd, data, segment.offset)
            if written != len(data):
                raise OSError(f"journal append cut short: {written} of {len(data)} bytes")
            os.fdatasync(segment.fd)
        except BaseException:
            # A record left whole behind a failed append would be replayed though its PUT
            # failed: overwrite the start of the first, so that replay stops there.
            with contextlib.suppress(OSError):
                os.pwrite(segment.fd, bytes(_RECORD_HEAD.size), segment.offset)
            raise
        segment.offset += len(data)
        segment.users += 1
        return segment

    def release(self, segment: _Segment) -> None:
        """The names of an append's records are made: its segment may be checkpointed."""
        with self._lock:
            segment.users -= 1
            if not segment.users:
                self._changed.notify_all()

    def _swap(self) -> None:
        """Make the other segment the active one (checkpointing it first if it is not
        clean yet) and have the full one checkpointed in the background. Lock held."""
        while True:
            other = next(segment for segment in self._segments if segment is not self._active)
            if other.state == _Segment.CLEAN:
                break
            if other.state == _Segment.FULL:
                self._checkpoint(other)
            else:
                self._changed.wait()
        full, self._active = self._active, other
        full.state, other.state = _Segment.FULL, _Segment.ACTIVE
        self._background = [thread for thread in self._background if thread.is_alive()]
        thread = threading.Thread(target=self._checkpoint_soon, args=(full,), name="blobsvc-checkpoint", daemon=True)
        self._background.append(thread)
        thread.start()

    # --- checkpoints -----------------------------------------------------------------------

    def _checkpoint_soon(self, segment: _Segment) -> None:
        with self._lock:
            if segment.state == _Segment.FULL and not self._closed:
                try:
                    self._checkpoint(segment)
                except OSError as exc:
                    # Tried again by the append that needs the segment, which fails with the
                    # error if it persists: small PUTs then fail rather than wait forever.
                    log.warning("journal checkpoint failed, tried again when needed: %s", exc)

    def _checkpoint(self, segment: _Segment) -> None:
        """Make a full segment's files and names durable, then clear it. Lock held; released
        while waiting on the disk."""
        while segment.users:
            self._changed.wait()
        if segment.state != _Segment.FULL:
            return  # another thread checkpointed it while this one waited
        segment.state = _Segment.SYNCING
        generation = self._take_generation()
        self._lock.release()
        try:
            _sync_file_system(self._sync_fd)
            segment.reset(generation)
        except BaseException:
            self._lock.acquire()
            segment.state = _Segment.FULL
            self._changed.notify_all()
            raise
        self._lock.acquire()
        segment.state = _Segment.CLEAN
        self.checkpoints += 1
        self._changed.notify_all()

    def give_back(self) -> int:
        """Truncate each segment to what its records need (a cleared one to its header) and
        return the bytes so freed: for a write the disk refused (rule 6). The next append
        grows the active segment again, by what is free then."""
        freed = 0
        with self._lock:
            for segment in self._segments:
                if segment.state not in (_Segment.CLEAN, _Segment.ACTIVE):
                    continue  # its records wait for their checkpoint
                needed = segment.offset if segment.state == _Segment.ACTIVE else _HEADER_BYTES
                if segment.size > needed:
                    os.ftruncate(segment.fd, needed)
                    freed, segment.size = freed + segment.size - needed, needed
        return freed

    def holds(self, mark: Hashable) -> bool:
        """Whether a record not yet checkpointed is of ``mark``: a content key, a job, or a
        ``(job, name)``."""
        with self._lock:
            return bool(self._holding(mark))

    def _holding(self, mark: Hashable) -> list[_Segment]:
        return [segment for segment in self._segments if segment.state != _Segment.CLEAN and mark in segment.marks]

    def settle(self, mark: Hashable) -> None:
        """Return once no record of ``mark`` is left uncheckpointed (see rule 4). Call it
        holding no lock a publication takes: it waits for publications to make their names."""
        with self._lock:
            while True:
                holding = self._holding(mark)
                if not holding:
                    return
                segment = min(holding, key=lambda segment: segment.generation)
                if segment.state == _Segment.ACTIVE:
                    self._swap()
                elif segment.state == _Segment.FULL:
                    self._checkpoint(segment)
                else:
                    self._changed.wait()
