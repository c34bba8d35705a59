"""The server's blobs on local disk: staging, atomic publication, sharing, deletion, recovery.

The layout is drawn in :mod:`blobsvc.files._layout`. What this module promises, each pinned by
``tests/test_storage.py``:

1. **Nothing partial is ever visible, nothing acknowledged is lost.** An upload is written
   to a staging file in ``incoming/`` while it is hashed; only when its digest matches the
   client's is it made durable and linked into ``objects/`` and under its name, before
   :meth:`BlobStorage.publish` returns. A large one is fsynced, and so are the directories
   of its names; a small one (held in memory) is durable by its record in the journal
   (:mod:`blobsvc.storage._journal`), which start-up replays.
2. **One copy per distinct content**, however many content-addressed or job-scoped names it
   has and however many uploads race to store it.
3. **No staging file outlives its upload**: a failed, rejected or duplicate upload removes
   its own, and every start empties ``incoming/``. Nor does a directory made for a name
   that could not be linked (no space, no inode left).
4. **Names are independent**: replacing or deleting one name never changes another's bytes.
5. **Start-up repairs**: the journal is replayed; staging leftovers, stray files and every
   blob whose bytes no longer hash to its key are deleted; the rest is served.

Thread safety: methods may be called from any thread. Publication and deletion hold a lock
per key (and per job for job-scoped names) only while they link and unlink, never while
bytes stream. Whatever removes or replaces a name outside the journal first waits, holding
none of those locks, until the journal has no record of it (:meth:`BlobStorage._settled`).
Opening a blob for reading takes no lock at all: published files are never modified in
place, so an open descriptor always sees one complete version.

The part ``blobsvc/storage/``: this module (staging, publication, deletion, recovery) and its
helpers: ``_journal`` (small publications, one append and one flush a batch), ``_commit``
(group commit), ``_hotblobs`` (recently read small blobs), ``_readclock`` (reads recorded in
atimes, for retention). Where files live and how they are written (shared with the client,
the cache and the HA store) is :mod:`blobsvc.files`. May import :mod:`blobsvc.files`,
:mod:`blobsvc.wire`, :mod:`blobsvc.config` and :mod:`blobsvc._exceptions`. Its helpers never
import this module, but for ``_commit``, which sits above it (the server calls it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import itertools
import os
import secrets
import shutil
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TypeVar

import blake3

from .._exceptions import DigestMismatch, InsufficientStorage, InternalError, NotFound
from ..files._filewrite import preallocate, pwrite_all
from ..files._layout import Layout, decode_name, key_from_filename
from ..files._locks import LockTable, make_dirs
from ..files._writeback import fsync_dir, start_writeback
from ..wire._ids import hash_file
from ..wire._protocol import ContentKey, JobBlob, ListEntry, WholeJob
from ._hotblobs import HotBlob, HotBlobs
from ._journal import SEGMENT_BYTES, Journal, Record
from ._readclock import ReadClock

__all__ = ["BlobStorage", "OpenBlob", "Publication", "RecoveryReport", "StagedUpload"]

# Threads that fsync files and directories for the process's flushes and LINKs: enough for
# several of them at once, few enough to cost nothing idle.
FLUSH_THREADS = 16
# Threads one flush shares its fsyncs among. A thread per file (16 at 32 connections) cost
# more CPU per PUT in wakeups and GIL handoffs than it saved in waiting; one thread alone
# waited on the disk once per file (issue 9, benchmarks/RESULTS.md).
FLUSH_WAYS = 4

# Uploads announced at most this long are held in memory until published (see
# StagedUpload): small PUTs are where the event loop's file system calls cost the most per
# byte, and a few hundred of them in flight hold a few MiB.
MEMORY_STAGING_LIMIT = 64 << 10

_T = TypeVar("_T")

_FULL_DISK = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


class _DiskErrors:
    """``with _disk_errors:`` makes a full disk or quota the client's INSUFFICIENT_STORAGE,
    not an internal error. A class rather than a generator: it wraps the file system calls of
    every small PUT, where a generator's frames cost more than the calls."""

    def __enter__(self) -> None:
        pass

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, OSError) and exc.errno in _FULL_DISK:
            raise InsufficientStorage(f"the server's disk is full: {exc.strerror}") from exc


_disk_errors = _DiskErrors()


def _remove(path: Path) -> None:
    """Remove a file or a tree; what is already gone is fine (another thread won the race)."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


class StagedUpload:
    """An upload in progress: a staging file that hashes everything written to it.

    Use it as a context manager: leaving the block removes the staging file; publication
    links it into ``objects/`` first.

    The staging file has a name from its first byte. An unnamed one (``O_TMPFILE``, linked
    into ``objects/`` when published) would save a directory entry per upload, but its
    fsync writes an inode without links, and only a journal ties the link made later to
    the name: on a file system without one (ext4 made without a journal) a power cut could
    leave the name pointing at an inode that e2fsck then deletes.

    An upload made ``in_memory`` (a small one, see :data:`MEMORY_STAGING_LIMIT`) keeps its
    bytes in memory and creates its staging file only when something needs it: :meth:`file`
    or publication, on a worker thread. The event loop that receives it then makes no file
    system call for it, and one refused or cut short creates no file. One made with its
    ``body`` (received whole) holds those bytes as they are, and hashes them only when its
    :meth:`digest` is asked for (by its publication, on a worker thread). One whose size is
    known (``reserve``) gets that many bytes of disk blocks with its file (see
    :mod:`blobsvc.files._filewrite`).
    """

    def __init__(self, path: str, *, in_memory: bool = False, body: bytearray | None = None, reserve: int = 0) -> None:
        self.location = path
        """The staging file's path, for system calls (a :class:`Path` costs a small PUT more
        to make than to use)."""
        self.inode = 0
        """The staging file's inode, known once :meth:`seal` has run."""
        self._fd: int | None = None
        self._owns_path = False  # whether a file at self.location is ours to remove
        # None for an upload received whole, until :meth:`digest` hashes it in one call.
        self._hasher: blake3.blake3 | None
        if body is None:
            self.size = 0
            self._hasher = blake3.blake3()
            self._buffer: bytearray | None = bytearray() if in_memory else None
            if not in_memory:
                self._create(reserve)
        else:
            self.size, self._hasher, self._buffer = len(body), None, body

    def _create(self, reserve: int = 0) -> None:
        with _disk_errors:
            self._fd = os.open(self.location, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            self._owns_path = True
            try:
                preallocate(self._fd, 0, reserve)
            except BaseException:
                self.discard()  # the constructor raises: nobody else will remove the file
                raise

    def _write_file(self, data: bytes | bytearray | memoryview, offset: int) -> None:
        assert self._fd is not None, "write after the upload was finished"
        with _disk_errors:
            pwrite_all(self._fd, data, offset)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert self._hasher is not None, "an upload received whole takes no more bytes"
        self._hasher.update(data)
        if self._buffer is not None:
            self._buffer += data
        else:
            self._write_file(data, self.size)
        self.size += len(data)

    def digest(self) -> bytes:
        """The BLAKE3 digest of the bytes written. That of an upload received whole is
        computed by the first call: a publication's, on its thread, not the event loop."""
        if self._hasher is None:
            assert self._buffer is not None, "the digest of an upload received whole is taken before it is written out"
            self._hasher = blake3.blake3(self._buffer)
        return self._hasher.digest()

    @property
    def path(self) -> Path:
        return Path(self.location)

    @property
    def held(self) -> bytearray | None:
        """The bytes of an upload held in memory, until they are written out."""
        return self._buffer

    def file(self) -> Path:
        """The staging file, holding every byte written so far (not yet durable); an
        upload held in memory is written out now. Blocks: call it off the event loop."""
        self.write_out()
        return self.path

    def write_out(self) -> None:
        """Write an upload held in memory to its staging file, and start writing the file's
        bytes to disk without waiting for them (the :meth:`seal` that follows waits less).
        Blocks: call it off the event loop."""
        self._write_held()
        assert self._fd is not None
        start_writeback(self._fd, 0, 0)

    def write_journaled(self) -> None:
        """Write an upload held in memory to its staging file and learn :attr:`inode`,
        leaving the bytes to reach the disk at the journal's next checkpoint: its record
        there makes it durable. Blocks: call it off the event loop."""
        self._write_held()
        assert self._fd is not None
        self.inode = os.fstat(self._fd).st_ino

    def _write_held(self) -> None:
        if self._buffer is not None:
            buffer, self._buffer = self._buffer, None
            self._create()
            self._write_file(buffer, 0)

    def seal(self) -> None:
        """Make every byte written durable and learn :attr:`inode`; the upload takes no more
        writes. Blocks: call it off the event loop."""
        assert self._fd is not None
        with _disk_errors:
            os.fsync(self._fd)
            self.inode = os.fstat(self._fd).st_ino

    def place(self, directory: int, name: str) -> None:
        """Move the sealed file to ``name`` in the open ``directory``, which must not have
        it (:class:`FileExistsError`: then nothing changes). A link and an unlink rather
        than a rename, which would replace a name already taken."""
        os.link(self.location, name, dst_dir_fd=directory)
        os.unlink(self.location)  # the object's link count counts its names only
        self._owns_path = False

    def discard(self) -> None:
        self._buffer = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._owns_path:
            self._owns_path = False
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.location)

    def __enter__(self) -> StagedUpload:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.discard()


def _seal_share(uploads: Sequence[StagedUpload]) -> None:
    """Seal one thread's share of a batch. Every file is written and its writeback started
    before the first fsync waits, so that the disk gets them together."""
    for upload in uploads:
        upload.write_out()
    for upload in uploads:
        upload.seal()


def _fsync_dirs(directories: Sequence[Path]) -> None:
    for directory in directories:
        fsync_dir(directory)


@dataclass(frozen=True, slots=True)
class Publication:
    """An upload to publish under ``target`` (content-addressed when None), if its bytes
    hash to ``digest``."""

    upload: StagedUpload
    target: JobBlob | None
    digest: bytes


_flush_threads: list[concurrent.futures.ThreadPoolExecutor] = []
_flush_threads_lock = threading.Lock()


def _flush_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's threads for parallel fsyncs, shared by every storage, started on first use."""
    with _flush_threads_lock:
        if not _flush_threads:
            _flush_threads.append(concurrent.futures.ThreadPoolExecutor(FLUSH_THREADS, thread_name_prefix="flush"))
        return _flush_threads[0]


_NO_LOCK = contextlib.nullcontext()


@contextlib.contextmanager
def _open_dir(path: Path) -> Iterator[int]:
    """A directory open for the ``*at`` calls of a batch, which then resolve no path."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        yield fd
    finally:
        os.close(fd)


def _done(results: list[bytes | Exception | None]) -> list[bytes | Exception]:
    assert all(result is not None for result in results)
    return [result for result in results if result is not None]


@dataclass
class OpenBlob:
    """A published blob open for reading; ``fd`` belongs to this object until ``close()``."""

    fd: int
    size: int
    digest: bytes
    inode: int = 0
    read_at: float = 0.0
    """The read recorded in its atime (now, or less than a read granularity ago)."""

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> OpenBlob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class RecoveryReport:
    """What a start-up scan found and did."""

    objects: int = 0
    bytes: int | None = None
    """Bytes of the objects kept; counted only when they are verified (``verify_on_start``),
    since counting alone would stat every object."""
    content_blobs: int = 0
    job_blobs: int = 0
    removed_staging: int = 0
    removed_corrupt: list[str] = field(default_factory=list)
    removed_stray: list[str] = field(default_factory=list)
    removed_orphans: int = 0
    replayed: int = 0
    """Journal records replayed: small blobs published since the last checkpoint."""
    repaired: int = 0
    """Of those, how many had an object or a name to make again (their bytes or name had
    not reached the disk before a crash)."""


class BlobStorage:
    """Blobs under one data directory; see the module docstring for what it guarantees."""

    def __init__(
        self,
        root: Path | str,
        *,
        verify_on_start: bool = True,
        journal_segment_bytes: int = SEGMENT_BYTES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.layout = Layout(Path(root))
        self.reads = ReadClock(clock)
        """Records each read in the blob's atime, coarsely (see :mod:`blobsvc.storage._readclock`)."""
        self.verify_on_start = verify_on_start
        self._journal_segment_bytes = journal_segment_bytes
        self._opened_journal: Journal | None = None  # opened by recover()
        # Which key each object inode holds: a job-scoped file is a hard link to its object,
        # so its inode says its digest without rehashing. Rebuilt from disk at every start.
        self._key_by_inode: dict[int, bytes] = {}
        # A lock per first byte of the key, which BLAKE3 spreads evenly: as good as a lock per
        # key while nothing holds two at once (nothing does), and a small PUT takes one
        # without a table to keep. Jobs are few and their names are not spread: a table.
        self._key_locks = [threading.Lock() for _ in range(256)]
        self._jobs = LockTable()
        # Distinct blobs and their bytes, kept as objects come and go: counting is cheaper
        # than walking objects/ at every scrape of the metrics.
        self._usage = [0, 0]
        self._usage_lock = threading.Lock()
        self._uncounted: set[int] = set()  # objects whose bytes usage() does not hold yet
        # Staging file names: unique in this process by the counter, against another process
        # on the same directory by the random part, and no random bytes to draw per upload.
        self._staging_prefix = os.path.join(self.layout.incoming, f"upload-{secrets.token_hex(8)}-")
        self._staged = itertools.count()
        self.hot = HotBlobs(reads=self.reads)
        """Small blobs recently read, for the server's GETs (see :mod:`blobsvc.storage._hotblobs`)."""

    @property
    def journal(self) -> Journal:
        """The journal of small publications (see :mod:`blobsvc.storage._journal`), opened by :meth:`recover`."""
        assert self._opened_journal is not None, "recover() first"
        return self._opened_journal

    def checkpoints(self) -> int:
        """The journal's checkpoints since :meth:`recover` (none before it, or after :meth:`close`)."""
        return 0 if self._opened_journal is None else self._opened_journal.checkpoints

    def close(self) -> None:
        """Close the journal, once its checkpoints under way are done. :meth:`recover`
        opens it again."""
        if self._opened_journal is not None:
            self._opened_journal.close()
            self._opened_journal = None

    def usage(self) -> tuple[int, int]:
        """Distinct blobs stored (objects, however many names each has) and their bytes."""
        with self._usage_lock:
            return self._usage[0], self._usage[1]

    def _key_lock(self, key: bytes) -> threading.Lock:
        return self._key_locks[key[0]]

    def _count(self, objects: int, size: int) -> None:
        with self._usage_lock:
            self._usage[0] += objects
            self._usage[1] += size

    # --- writing ---------------------------------------------------------------------------

    def stage(self, size: int | None = None) -> StagedUpload:
        """A new upload; one announced (``size``) to be at most :data:`MEMORY_STAGING_LIMIT`
        bytes is held in memory until it is published. A larger one gets the disk blocks of
        its size at once (the journal gives back the blocks no record needs if that is what
        it takes): a disk that cannot hold it raises :class:`InsufficientStorage` before a
        byte of it is received."""
        if size is not None and size <= MEMORY_STAGING_LIMIT:
            return StagedUpload(self._staging_name(), in_memory=True)
        try:
            return StagedUpload(self._staging_name(), reserve=size or 0)
        except InsufficientStorage:
            if not self.journal.give_back():  # blocks the journal holds ahead of its records
                raise
            return StagedUpload(self._staging_name(), reserve=size or 0)

    def stage_body(self, body: bytearray) -> StagedUpload:
        """An upload of ``body``, received whole and at most :data:`MEMORY_STAGING_LIMIT`
        bytes: held in memory (not copied: the upload owns it now) until it is published."""
        return StagedUpload(self._staging_name(), body=body)

    def _staging_name(self) -> str:
        return f"{self._staging_prefix}{next(self._staged)}"

    def publish(self, upload: StagedUpload, target: JobBlob | None, digest: bytes) -> bytes:
        """Verify ``upload`` against ``digest`` and make it visible under ``target``
        (content-addressed when None). Returns the key. The staging file is gone afterwards,
        whether it was published, found to be a duplicate, or rejected."""
        (result,) = self.publish_batch([Publication(upload, target, digest)])
        if isinstance(result, BaseException):
            raise result
        return result

    def publish_batch(self, batch: Sequence[Publication]) -> list[bytes | Exception]:
        """Publish several uploads with one flush for all: the key of each, or the error
        that refused it. Durability is that of :meth:`publish` for every one of them; what
        the batch shares is the waiting. In this order (``tests/test_group_commit.py``
        records the calls and pins it):

        1. every upload whose bytes do not hash to its digest is refused alone;
        2. the bytes of the rest are made durable before any name can reach them: the
           staging files of large uploads are sealed, a few threads sharing them; those of
           uploads held in memory are written and their records appended to the journal,
           with one ``fdatasync`` for all;
        3. each is linked into ``objects/`` and under its name, holding its key's (and
           job's) lock as :meth:`publish` always did, without fsync; the journaled ones
           first, then the large ones (each once the journal has no record of its name);
        4. every directory the large uploads' names live in (``objects/`` included, also
           for a blob found already stored: another batch may not have flushed it yet) is
           fsynced once, the same way; the journaled names are durable by their records. A
           job's directory found gone was removed with its names by a deletion of the job
           that came after they were linked: there is nothing left to flush;
        5. only then does any upload of the batch get its key; an error in 2 fails every
           upload it covers, an error flushing a directory in 4 every upload named there
           (``objects/``: all of them), since none of those is known to be durable.

        Blobs replaced under a job name are collected last.
        """
        results: list[bytes | Exception | None] = [None] * len(batch)
        journaled: list[int] = []
        sealed: list[int] = []
        for i, item in enumerate(batch):
            key = item.upload.digest()
            if key == item.digest:
                (sealed if item.upload.held is None else journaled).append(i)
                continue
            item.upload.discard()
            results[i] = DigestMismatch(
                f"the body hashes to {key.hex()} but the trailer says {item.digest.hex()}; nothing stored"
            )
        try:
            self._in_parallel(_seal_share, [batch[i].upload for i in sealed])
            records = [_record(batch[i]) for i in journaled]
            for i in journaled:
                batch[i].upload.write_journaled()
            with _disk_errors:
                segment = self.journal.append(records) if records else None
        except Exception as exc:
            for i in journaled + sealed:
                batch[i].upload.discard()
            return _done([exc if result is None else result for result in results])
        # Each directory the large uploads' names live in, and which of them live there.
        directories: dict[Path, list[int]] = {self.layout.objects: list(sealed)}
        replaced: list[bytes] = []
        stored = [0, 0]  # objects and bytes new to the disk
        with _open_dir(self.layout.objects) as objects, _open_dir(self.layout.cache) as cache:
            try:
                self._link_all(batch, journaled, results, objects, cache, None, stored, replaced)
            finally:
                if segment is not None:
                    self.journal.release(segment)
            self._link_all(batch, sealed, results, objects, cache, directories, stored, replaced)
        self._count(*stored)
        if any(results[i] is None for i in sealed):
            failed: dict[Path, Exception] = {}
            self._in_parallel(functools.partial(self._fsync_names, failed=failed), list(directories))
            for directory, error in failed.items():
                for i in directories[directory]:
                    results[i] = results[i] or error
        for i in journaled + sealed:
            results[i] = results[i] or batch[i].digest
        for key in replaced:
            self._collect(key)
        return _done(results)

    def _link_all(
        self,
        batch: Sequence[Publication],
        indices: Sequence[int],
        results: list[bytes | Exception | None],
        objects: int,
        cache: int,
        directories: dict[Path, list[int]] | None,
        stored: list[int],
        replaced: list[bytes],
    ) -> None:
        """:meth:`_link` the uploads at ``indices`` of the batch, each one's error its result."""
        for i in indices:
            item = batch[i]
            try:
                with _disk_errors:
                    old = self._link(item, i, objects, cache, stored, directories)
                if old is not None and old != item.digest:
                    replaced.append(old)
            except Exception as exc:
                results[i] = exc
            finally:
                item.upload.discard()

    def _fsync_names(self, directories: Sequence[Path], failed: dict[Path, Exception]) -> None:
        """Flush the names in each of ``directories``, recording each one's error in ``failed``.

        A job directory found gone was removed, with its names, after they were linked
        (under the job's lock): a deletion of the job came after them, and nothing is left
        to make durable."""
        for directory in directories:
            try:
                with _disk_errors:
                    fsync_dir(directory)
            except FileNotFoundError as exc:
                if directory in (self.layout.objects, self.layout.cache):
                    failed[directory] = exc
            except Exception as exc:
                failed[directory] = exc

    def _in_parallel(self, work: Callable[[Sequence[_T]], object], items: Sequence[_T]) -> None:
        """``work`` on shares of ``items``, one share for each of up to :data:`FLUSH_WAYS`
        threads (this one among them): fsyncs that wait on the disk together finish
        together, and a thread per item would cost more in handoffs (and in the GIL passed
        around) than it saves. The first error is raised after all are done."""
        shares = [items[way::FLUSH_WAYS] for way in range(min(FLUSH_WAYS, len(items)))]
        if not shares:
            return
        pool = _flush_pool()
        futures = [pool.submit(work, share) for share in shares[1:]]
        error: Exception | None = None
        try:
            work(shares[0])
        except Exception as exc:
            error = exc
        for future in futures:
            try:
                future.result()
            except Exception as exc:
                error = error or exc
        if error is not None:
            raise error

    def _link(
        self,
        item: Publication,
        index: int,
        objects: int,
        cache: int,
        stored: list[int],
        directories: dict[Path, list[int]] | None,
    ) -> bytes | None:
        """Link the durable upload at ``index`` of the batch into ``objects`` (unless its
        bytes are there already) and under its name; records what was stored and, unless it
        is journaled (``directories`` None), the directory of its name to flush; returns the
        key the name held before, if any."""
        key, target = item.digest, item.target
        name = key.hex()
        path = None if target is None else self.layout.job_blob(target.job, target.name)
        job_lock: AbstractContextManager[object]
        if directories is None:  # journaled: its record holds this name's place in the order
            job_lock = _NO_LOCK if target is None else self._jobs.hold(target.job)
        else:
            directories.setdefault(self.layout.cache if path is None else path.parent, []).append(index)
            job_lock = _NO_LOCK if target is None else self._job_lock_settled(target)
        with job_lock, self._key_lock(key):
            try:
                item.upload.place(objects, name)
            except FileExistsError:
                pass  # the same bytes are stored already; the staging copy goes with the upload
            else:
                self._key_by_inode[item.upload.inode] = key
                stored[0] += 1
                stored[1] += item.upload.size
            try:
                if path is None:
                    with contextlib.suppress(FileExistsError):
                        os.link(name, name, src_dir_fd=objects, dst_dir_fd=cache)
                    # Stored (again) just now: retention's grace counts from here.
                    self.reads.touch(name, dir_fd=objects)
                    return None
                return self._link_job(key, path)
            except BaseException:
                # A name that could not be made (a full disk): drop the object again when no
                # name has it, so that a refused PUT really stores nothing.
                self._collect_locked(key)
                raise

    def link(self, key: bytes, target: JobBlob) -> int:
        """Name content already stored (under any name) as ``target``, atomically replacing an
        older blob of that name, and return its size: publishing without the bytes.
        :class:`NotFound` when no name holds ``key``."""
        replaced = None
        path = self.layout.job_blob(target.job, target.name)
        with _disk_errors, self._job_lock_settled(target), self._key_lock(key):
            try:
                size = self.layout.object(key).stat().st_size
            except FileNotFoundError:
                raise NotFound(f"no blob with key {key.hex()} to link as {target.name!r}") from None
            replaced = self._link_job(key, path)
            # Durable before the answer, as a PUT's names are (objects/ too: a PUT of this key
            # in flight may not have flushed it yet).
            self._in_parallel(_fsync_dirs, [self.layout.objects, path.parent])
        if replaced is not None and replaced != key:
            self._collect(replaced)
        return size

    def _link_job(self, key: bytes, path: Path) -> bytes | None:
        """Link the object as a job's blob at ``path``, atomically replacing an older blob of
        that name; returns the replaced blob's key."""
        try:
            self._make_dirs(path.parent)
            replaced = self._key_of(path)
            _replace_link(self.layout.object(key), path)
        except BaseException:
            # No space or no inode left: the directories made for the name go with it, so
            # that a refused PUT leaves nothing (the job's lock is held: no name is coming).
            _prune_empty(path.parent, stop=self.layout.root)
            raise
        return replaced

    def _settled(self, mark: Hashable, lock: Callable[[], AbstractContextManager[object]]) -> contextlib.ExitStack:
        """``lock()``, entered at a moment the journal has no record of ``mark`` (a key, a
        job, or a job and name): for whatever removes or replaces a name outside the journal,
        which replay must not undo. Waits for a checkpoint when the journal has one, holding
        no lock then: the publications it waits for take them."""
        while True:
            held = contextlib.ExitStack()
            held.enter_context(lock())
            if not self.journal.holds(mark):
                return held
            held.close()
            self.journal.settle(mark)

    def _job_lock_settled(self, target: JobBlob) -> contextlib.ExitStack:
        return self._settled((target.job, target.name), lambda: self._jobs.hold(target.job))

    def _make_dirs(self, directory: Path) -> None:
        make_dirs(directory)

    # --- reading ---------------------------------------------------------------------------

    def _key_of(self, path: Path) -> bytes | None:
        try:
            return self._key_by_inode.get(path.stat().st_ino)
        except FileNotFoundError:
            return None

    def open_blob(self, target: ContentKey | JobBlob) -> OpenBlob:
        """Open a published blob for reading, which counts as a read of it (its atime, see
        :class:`~blobsvc.storage._readclock.ReadClock`). Takes no lock; cheap enough for the event loop."""
        path = self._path(target)
        for _ in range(3):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise NotFound(_describe(target)) from None
            info = os.fstat(fd)
            if isinstance(target, ContentKey):
                return OpenBlob(fd, info.st_size, target.key, info.st_ino, self.reads.opened(fd, info))
            key = self._key_by_inode.get(info.st_ino)
            if key is not None:
                return OpenBlob(fd, info.st_size, key, info.st_ino, self.reads.opened(fd, info))
            # Replaced and collected between open and lookup: the name now holds a newer blob.
            os.close(fd)
        raise InternalError(f"{_describe(target)} changed too often to be read")

    def remember_hot(self, target: ContentKey | JobBlob, generation: int, blob: OpenBlob, body: bytes) -> None:
        """Keep ``body``, the whole of ``blob`` just read, in :attr:`hot`; ``generation`` is
        ``hot.generation`` as it was before the blob was opened."""
        path = str(self._path(target))
        checked = None if isinstance(target, ContentKey) else path
        entry = HotBlob(blob.size, blob.digest, body, checked, blob.inode, source=path, read_at=blob.read_at)
        self.hot.remember(target, generation, entry)

    def stat(self, target: ContentKey | JobBlob) -> tuple[int, bytes]:
        with self.open_blob(target) as blob:
            return blob.size, blob.digest

    def list_job(self, job: bytes) -> list[ListEntry]:
        directory = self.layout.job_dir(job)
        entries = []
        with self._jobs.hold(job):
            for path in _files_under(directory):
                name = decode_name(path.relative_to(directory))
                info = path.stat()
                key = self._key_by_inode.get(info.st_ino)
                if name is not None and key is not None:
                    entries.append(ListEntry(name, info.st_size, key))
        return entries

    def has_job(self, job: bytes) -> bool:
        """Whether any blob is stored under ``job``: one ``stat`` of its directory, which
        DELETE of the whole job renames away at once and deleting its last blob removes."""
        return self.layout.job_dir(job).is_dir()

    def _path(self, target: ContentKey | JobBlob) -> Path:
        if isinstance(target, ContentKey):
            return self.layout.content(target.key)
        return self.layout.job_blob(target.job, target.name)

    # --- deleting --------------------------------------------------------------------------

    def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        """Remove a name (or a whole job); what does not exist is already deleted."""
        if isinstance(target, ContentKey):
            self._delete_content(target.key, None)
            return
        mark = target.job if isinstance(target, WholeJob) else (target.job, target.name)
        with self._settled(mark, lambda: self._jobs.hold(target.job)):
            keys = self._unlink_job_names(target)
        for key in keys:
            self._collect(key)

    def evict(self, key: bytes, still: Callable[[os.stat_result], bool]) -> int | None:
        """Delete the content-addressed blob ``key`` if no job names it and ``still(info)``
        holds for its object's ``stat`` (retention: not read, linked or unlinked since it was
        chosen); returns its size, or None when it was kept (or is gone). Checked and done
        under the key's lock, which every link of a job name to the object also holds: a
        LINK either comes first (the object has a third link: kept) or finds no object."""
        return self._delete_content(key, still)

    def _delete_content(self, key: bytes, still: Callable[[os.stat_result], bool] | None) -> int | None:
        name = self.layout.content(key)
        with self._settled(key, lambda: self._key_lock(key)):
            size = 0
            if still is not None:
                try:
                    info = self.layout.object(key).stat()
                    named = name.stat()
                except FileNotFoundError:
                    return None
                # Two links: the object and its content-addressed name, no job's.
                if info.st_nlink != 2 or named.st_ino != info.st_ino or not still(info):
                    return None
                size = info.st_size
            try:
                name.unlink()
            except FileNotFoundError:
                return None
            self.hot.forget(ContentKey(key))
            fsync_dir(self.layout.cache)
            self._collect_locked(key)
        return size

    def _unlink_job_names(self, target: JobBlob | WholeJob) -> set[bytes]:
        job_dir = self.layout.job_dir(target.job)
        if isinstance(target, JobBlob):
            path = self._path(target)
            key = self._key_of(path)
            try:
                path.unlink()
            except FileNotFoundError:
                return set()
            fsync_dir(path.parent)
            _prune_empty(path.parent, stop=job_dir.parent)
            return {key} if key else set()
        if not job_dir.exists():
            return set()
        keys = {self._key_by_inode.get(p.stat().st_ino) for p in _files_under(job_dir)}
        # Renaming makes the whole job vanish at once; a crash before rmtree finishes leaves
        # only staging debris, which the next start removes.
        doomed = self.layout.incoming / f"deleted-{job_dir.name}-{secrets.token_hex(4)}"
        os.rename(job_dir, doomed)
        fsync_dir(self.layout.root)
        shutil.rmtree(doomed, ignore_errors=True)
        return {key for key in keys if key}

    def _collect(self, key: bytes) -> None:
        with self._key_lock(key):
            self._collect_locked(key)

    def _collect_locked(self, key: bytes) -> None:
        """Delete the object once no name links to it."""
        path = self.layout.object(key)
        try:
            info = path.stat()
        except FileNotFoundError:
            return
        if info.st_nlink <= 1:
            self._key_by_inode.pop(info.st_ino, None)
            path.unlink()
            with self._usage_lock:
                counted = info.st_ino not in self._uncounted
                self._uncounted.discard(info.st_ino)
            self._count(-1, -info.st_size if counted else 0)
        elif info.st_nlink == 2:
            # Perhaps its last job name just went: retention's grace counts from here.
            self.reads.touch(path)

    # --- start-up --------------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """Create the layout, then bring it back to a state every promise holds for.

        Sized for millions of blobs: directories are read with ``os.scandir``, whose entries
        carry each name's inode and type, so an object or a name that links to a known
        object costs no system call of its own (a ``stat`` each cost 10 µs here: 12 s for a
        million). Only what looks wrong is stat-ed, hashed or removed; nothing is held per
        blob but :attr:`_key_by_inode` and, during the scan, a set of inodes.
        """
        layout = self.layout
        for directory in (layout.root, layout.incoming, layout.objects, layout.cache):
            directory.mkdir(parents=True, exist_ok=True)
        report = RecoveryReport()
        self._key_by_inode.clear()
        self.hot.clear()  # what it holds may be among what recovery removes
        for leftover in list(layout.incoming.iterdir()):
            _remove(leftover)
            report.removed_staging += 1
        self.close()
        self._opened_journal = Journal(layout.journal, segment_bytes=self._journal_segment_bytes)
        records = self._opened_journal.replay()
        report.replayed = len(records)
        report.repaired = sum(self._replay(record) for record in records)
        self._opened_journal.restart()

        corrupt_inodes = self._scan_objects(report)
        unnamed = set(self._key_by_inode)  # objects no name kept below links to (yet)
        unknown: list[tuple[Path, bytes | None]] = []
        with os.scandir(layout.cache) as entries:
            for entry in entries:
                inode = entry.inode()
                known = self._key_by_inode.get(inode)
                if known is not None and known.hex() == entry.name and entry.is_file(follow_symlinks=False):
                    report.content_blobs += 1
                    unnamed.discard(inode)
                else:
                    unknown.append((Path(entry.path), key_from_filename(entry.name)))
        for path, key in unknown:
            if self._keep(path, key, corrupt_inodes, report, unnamed):
                report.content_blobs += 1
        for job_dir in layout.job_dirs().values():
            for path in _files_under(job_dir):
                name = decode_name(path.relative_to(job_dir))
                if name is None:
                    report.removed_stray.append(str(path))
                    _remove(path)
                elif self._keep(path, None, corrupt_inodes, report, unnamed):
                    report.job_blobs += 1
            _prune_empty_tree(job_dir)

        for inode in unnamed:
            key = self._key_by_inode[inode]
            path = layout.object(key)
            info = path.stat()
            if info.st_nlink <= 1:
                self._key_by_inode.pop(inode)
                path.unlink()
                report.removed_orphans += 1
                if report.bytes is not None:
                    report.bytes -= info.st_size
        report.objects = len(self._key_by_inode)
        for directory in (layout.root, layout.incoming, layout.objects, layout.cache):
            fsync_dir(directory)
        with self._usage_lock:
            self._usage = [report.objects, report.bytes or 0]
            self._uncounted = set() if report.bytes is not None else set(self._key_by_inode)
        if self._uncounted:
            threading.Thread(target=self._count_bytes, name="blobsvc-count-bytes", daemon=True).start()
        return report

    def _replay(self, record: Record) -> bool:
        """Make the object and the name of a journal record as its publication left them
        (rule 2 of :mod:`blobsvc.storage._journal`); whether anything had to be made again. An
        object's bytes are written again in place, so that every name linking it reads
        them; nothing is served yet."""
        obj = self.layout.object(record.key)
        name = self.layout.content(record.key) if record.target is None else self._path(record.target)
        fd = os.open(obj, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            repaired = os.pread(fd, len(record.body) + 1, 0) != record.body
            if repaired:
                os.ftruncate(fd, 0)
                os.pwrite(fd, record.body, 0)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        try:
            if name.stat().st_ino == inode:
                return repaired
        except FileNotFoundError:
            pass
        self._make_dirs(name.parent)
        _replace_link(obj, name)
        return True

    def _count_bytes(self) -> None:
        """Add the sizes of the objects a start without verification did not stat to
        :meth:`usage`, in a thread, while the server already serves. Each object is counted
        under the usage lock, so that collecting it meanwhile subtracts its size only if it
        was added; one found gone is left for its collection to settle."""
        for inode in list(self._uncounted):
            with self._usage_lock:
                key = self._key_by_inode.get(inode)
                if inode not in self._uncounted or key is None:
                    continue
                try:
                    size = os.stat(self.layout.object(key)).st_size
                except FileNotFoundError:
                    continue
                self._uncounted.discard(inode)
                self._usage[1] += size
        with self._usage_lock:
            self._uncounted = set(self._uncounted)  # a compact copy: sets do not shrink

    def _scan_objects(self, report: RecoveryReport) -> set[int]:
        """Learn every object's inode; returns the inodes of objects found corrupt (and
        removed). When verifying, ``report.bytes`` sums the sizes of the objects kept."""
        corrupt: set[int] = set()
        doomed: list[str] = []
        if self.verify_on_start:
            report.bytes = 0
        with os.scandir(self.layout.objects) as entries:
            for entry in entries:
                key = key_from_filename(entry.name)
                if key is None or not entry.is_file(follow_symlinks=False):
                    report.removed_stray.append(entry.path)
                    doomed.append(entry.path)
                    continue
                inode = entry.inode()
                if self.verify_on_start:
                    if hash_file(Path(entry.path)) != key:
                        report.removed_corrupt.append(entry.path)
                        corrupt.add(inode)
                        doomed.append(entry.path)
                        continue
                    assert report.bytes is not None
                    report.bytes += entry.stat(follow_symlinks=False).st_size
                self._key_by_inode[inode] = key
        for path in doomed:  # not while the directory is being read
            _remove(Path(path))
        return corrupt

    def _keep(
        self, path: Path, expected: bytes | None, corrupt: set[int], report: RecoveryReport, unnamed: set[int]
    ) -> bool:
        """Whether a name found at start may be served; links it to its object if needed,
        and takes that object out of ``unnamed``."""
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or path.name.startswith("."):
            report.removed_stray.append(str(path))
            _remove(path)
            return False
        known = self._key_by_inode.get(info.st_ino)
        if known is not None and expected in (None, known):
            unnamed.discard(info.st_ino)
            return True
        if info.st_ino in corrupt:
            report.removed_corrupt.append(str(path))
            path.unlink()
            return False
        # A name without its object (a crash between link and rename, or a copied-in file):
        # trust it only if its bytes hash to what it claims.
        key = hash_file(path)
        if expected is not None and key != expected:
            report.removed_corrupt.append(str(path))
            path.unlink()
            return False
        adopted, size = self._adopt(path, key)
        unnamed.discard(adopted)
        if report.bytes is not None:
            report.bytes += size
        return True

    def _adopt(self, path: Path, key: bytes) -> tuple[int, int]:
        """Link a name to the object of its key, making it the object if there is none;
        returns the object's inode and the bytes of an object so made."""
        obj = self.layout.object(key)
        if obj.exists():
            _replace_link(obj, path)
            return obj.stat().st_ino, 0
        os.link(path, obj)
        info = obj.stat()
        self._key_by_inode[info.st_ino] = key
        return info.st_ino, info.st_size


def _record(item: Publication) -> Record:
    assert item.upload.held is not None, "only an upload held in memory is journaled"
    return Record(item.digest, item.target, item.upload.held)


def _replace_link(source: Path, name: Path) -> None:
    """Make ``name`` a link to ``source``, atomically replacing whatever it was."""
    temp = name.parent / f".link-{secrets.token_hex(8)}"
    os.link(source, temp)
    try:
        os.replace(temp, name)
    finally:
        # Gone after a rename, but rename(2) does nothing when both names are links to one
        # file (``name`` held this content already): then the temporary link would stay.
        _remove(temp)


def _describe(target: ContentKey | JobBlob) -> str:
    if isinstance(target, ContentKey):
        return f"no blob with key {target.key.hex()}"
    return f"job {target.job.hex()} has no blob named {target.name!r}"


def _files_under(directory: Path) -> Iterator[Path]:
    for parent, _, files in os.walk(directory):
        for name in files:
            yield Path(parent, name)


def _prune_empty(directory: Path, *, stop: Path) -> None:
    """Remove ``directory`` and its parents up to ``stop`` while they are empty (or missing)."""
    while directory != stop:
        try:
            directory.rmdir()
        except FileNotFoundError:
            pass
        except OSError:
            return
        directory = directory.parent


def _prune_empty_tree(root: Path) -> None:
    """Remove every empty directory under ``root``, and ``root`` itself if it ends empty."""
    for parent, _, _ in os.walk(root, topdown=False):
        with contextlib.suppress(OSError):  # not empty
            Path(parent).rmdir()
