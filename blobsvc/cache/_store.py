"""The cache directory: layout, publication, checks, job links, eviction and collection.

Everything here is local to the host; fetching is :class:`~blobsvc.cache.BlobCache`'s job.

    <cache dir>/
      .lock                       the directory lock: jobs, leases, links, eviction, collection
      content/<key>               a verified blob, read-only, published by rename
      meta/<key>                  its stamp (JSON: size, mtime_ns, inode, boot id);
                                  the stamp file's own mtime is the blob's last access
      partial/<key>.<size>        a download in progress, or one its downloader left behind;
                                  the size in its name is the room it has reserved
      locks/<key>                 one download or check of a key at a time
      jobs/<job>/.leases/…        references held on the job (see ``_leases``)
      jobs/<job>/.idle            there while the job has no live lease; its mtime says since when
      jobs/<job>/<encoded name>/<key>/<file name>
                                  a job blob: a hard link to content/<key>, under the last
                                  component of its name so that ``x.jar`` still ends in ``.jar``
      unpacked/                   archives' trees, with their records and locks (see ``_trees``)
      trash/                      job directories on their way out
      stats/                      counters: one file per process, and those of dead ones
                                  (see ``_counters``)

Locks are taken in one order, a key's lock before the directory lock, and nothing ever waits
for a key's lock while holding the directory lock (it only tries), so no two processes can
deadlock. Only the holder of a key's lock writes that key's partial, content or stamp.

A job file always shares its inode with ``content/<key>``: bytes are stored once however many
jobs name them, and the size of the cache is the sum of ``content/``, of the downloads in
flight, and of the archives' unpacked trees (the bytes their records hold). Removing a blob
removes its job links first, and its trees with it; a blob whose tree is being unpacked or
removed right now is not evicted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import blake3

from .._exceptions import BlobError
from ..files._layout import decode_name, encode_name, key_from_filename
from . import _trees
from ._counters import Counters
from ._leases import LeaseFiles
from ._lock import FileLock

__all__ = [
    "CacheError",
    "CacheFull",
    "CacheStats",
    "CacheStore",
    "CollectReport",
    "ContentEntry",
    "JobEntry",
    "RecoveryReport",
    "TooLargeForCache",
    "boot_id",
]

_JOB_HEX = 32
_BACKDATE_NS = 2_000_000_000  # well beyond any file system's timestamp granularity (FAT: 2 s)
_ROOM_POLL = 0.05  # how often a reservation waiting for downloads in flight looks again


class CacheError(BlobError):
    """The local cache cannot hold a blob."""


class TooLargeForCache(CacheError):
    """One blob is larger than the cache's whole byte limit."""


class CacheFull(CacheError):
    """Blobs in use by registered jobs leave no room for another under the byte limit, or
    downloads in flight still hold it after a reservation has waited as long as it may."""


class _RoomInFlight(CacheFull):
    """No room now, but there would be without the downloads in flight and the blobs being
    checked or linked right now: room that waiting can make."""


def boot_id() -> str:
    """Which boot of the host this is (the kernel's random id, new at every boot). Downloads
    are not fsynced: a crash of the host is what loses their writes behind a stamp's back,
    so a blob stamped in another boot is rehashed before it is used. Empty when unknown;
    then every download is fsynced instead (see ``BlobCache``)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


@dataclass(frozen=True, slots=True)
class _Stamp:
    """What a verified file looked like: a change of size, mtime or inode means "rehash"."""

    size: int
    mtime_ns: int
    inode: int
    boot: str

    @classmethod
    def of(cls, st: os.stat_result, boot: str) -> _Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ino, boot)

    def matches(self, st: os.stat_result) -> bool:
        return (self.size, self.mtime_ns, self.inode) == (st.st_size, st.st_mtime_ns, st.st_ino)


@dataclass(frozen=True, slots=True)
class _Partial:
    key: str
    size: int
    """The blob's whole size: the room the download holds, however far it has got."""
    path: Path


@dataclass(frozen=True, slots=True)
class _JobFile:
    job: str
    name: str
    key: str
    path: Path

    @property
    def key_dir(self) -> Path:
        return self.path.parent


@dataclass(slots=True)
class CollectReport:
    """What one collection removed, and when the next idle job expires (epoch seconds)."""

    removed_jobs: list[str] = field(default_factory=list)
    evicted: list[str] = field(default_factory=list)
    freed_bytes: int = 0
    removed_partials: int = 0
    next_deadline: float | None = None


@dataclass(slots=True)
class RecoveryReport:
    """What the scan at start found and removed; ``repaired`` holds the warnings of
    :meth:`CacheStore.check` it fixed (dead leases, stray files)."""

    rehashed: int = 0
    removed_corrupt: list[str] = field(default_factory=list)
    removed_partials: int = 0
    repaired: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ContentEntry:
    key: str
    size: int
    last_access: float
    jobs: tuple[str, ...]
    in_use: bool


@dataclass(frozen=True, slots=True)
class JobEntry:
    job: str
    references: int
    idle_since: float | None
    files: tuple[tuple[str, str], ...]
    """(name, key) of each blob of the job held here."""


@dataclass(frozen=True, slots=True)
class CacheStats:
    """What the cache holds now, and what every process of the host has counted since the
    directory was made: ``hits`` are ``path()`` calls answered without a download, ``misses``
    those that downloaded; ``bytes_fetched`` came from the server, ``bytes_from_store`` from
    the HA store; ``store_refused`` copies from the store did not verify (never kept), and
    ``store_fallbacks`` store reads failed, so the server was asked instead."""

    blobs: int
    bytes: int
    in_use_blobs: int
    in_use_bytes: int
    jobs: int
    referenced_jobs: int
    references: int
    partials: int
    partial_bytes: int
    unpacked_bytes: int
    """Archives' unpacked trees, which count in the limit too."""
    max_bytes: int | None = None
    hits: int = 0
    misses: int = 0
    downloads: int = 0
    bytes_fetched: int = 0
    evictions: int = 0
    evicted_bytes: int = 0
    bytes_from_store: int = 0
    store_refused: int = 0
    store_fallbacks: int = 0


def _file_name(name: str) -> str:
    """The last component of a blob name, the name its file gets; "blob" when it has none."""
    last = PurePosixPath(name).name
    return last if last not in ("", ".", "..") else "blob"


def _scandir(directory: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except FileNotFoundError:
        return []


def _unlink(path: Path) -> None:
    """Remove a file another process may have removed first."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _hash_file(path: Path) -> str:
    hasher = blake3.blake3()
    hasher.update_mmap(path)
    return str(hasher.hexdigest())


def _partial_of(entry: os.DirEntry[str]) -> _Partial | None:
    key, _, size = entry.name.partition(".")
    if key_from_filename(key) is None or not size.isdigit():
        return None
    return _Partial(key, int(size), Path(entry.path))


class CacheStore:
    """One cache directory, shared by every thread and process that opens it."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.content_dir = self.root / "content"
        self.meta_dir = self.root / "meta"
        self.partial_dir = self.root / "partial"
        self.locks_dir = self.root / "locks"
        self.jobs_dir = self.root / "jobs"
        self.trash_dir = self.root / "trash"
        self.unpacked_dir = self.root / "unpacked"
        self.counters = Counters(self.root / "stats")
        for directory in (
            self.content_dir,
            self.meta_dir,
            self.partial_dir,
            self.locks_dir,
            self.jobs_dir,
            self.trash_dir,
            self.counters.directory,
        ):
            directory.mkdir(parents=True, exist_ok=True)
        self.boot = boot_id()

    # --- paths and locks -----------------------------------------------------------------------

    def content(self, key: str) -> Path:
        return self.content_dir / key

    def key_of(self, path: Path) -> str:
        """The key of a file that :meth:`content`, :meth:`find_job_file` or :meth:`link` named:
        ``content/<key>``, or ``jobs/<job>/<encoded name>/<key>/<file name>``."""
        return path.name if path.parent == self.content_dir else path.parent.name

    def _meta(self, key: str) -> Path:
        return self.meta_dir / key

    def _job_dir(self, job: str) -> Path:
        return self.jobs_dir / job

    def _leases(self, job: str) -> LeaseFiles:
        return LeaseFiles(self._job_dir(job) / ".leases")

    def _idle_marker(self, job: str) -> Path:
        return self._job_dir(job) / ".idle"

    def directory_lock(self) -> FileLock:
        return FileLock(self.root / ".lock")

    def key_lock(self, key: str) -> FileLock:
        return FileLock(self.locks_dir / key)

    # --- stamps --------------------------------------------------------------------------------

    def _read_stamp(self, key: str) -> _Stamp | None:
        try:
            data = json.loads(self._meta(key).read_bytes())
            return _Stamp(int(data["size"]), int(data["mtime_ns"]), int(data["inode"]), str(data["boot"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _write_stamp(self, key: str, path: Path) -> None:
        """Record the stamp of a file just verified; written whole and renamed, so never read
        half. The file's mtime is first set a while back: file times tick coarsely (jiffies),
        so a write in the tick of the verification could otherwise leave the mtime as it was
        (git's "racy clean" entries); after this, any write moves it."""
        now = time.time_ns()
        os.utime(path, ns=(now, now - _BACKDATE_NS))
        stamp = _Stamp.of(os.stat(path), self.boot)
        temp = self.meta_dir / f".{key}.{uuid.uuid4().hex}"
        temp.write_text(
            json.dumps({"size": stamp.size, "mtime_ns": stamp.mtime_ns, "inode": stamp.inode, "boot": stamp.boot})
        )
        os.replace(temp, self._meta(key))

    def _fresh(self, key: str, path: Path) -> bool:
        """The cheap check of every access: the file is as it was when last verified, and
        that was in this boot of the host (whose page cache holds what was written since)."""
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return False
        stamp = self._read_stamp(key)
        return stamp is not None and stamp.boot == self.boot and stamp.matches(st)

    def _touch(self, key: str) -> bool:
        """Record an access, for LRU; False when the blob has just been removed."""
        now = time.time_ns()  # not utime's default, whose clock ticks too coarsely to order accesses
        try:
            os.utime(self._meta(key), ns=(now, now))
        except FileNotFoundError:
            return False
        return True

    # --- content -------------------------------------------------------------------------------

    def lookup(self, key: str) -> Path | None:
        """The content file of ``key`` when present and unchanged since verified; no lock."""
        path = self.content(key)
        if self._fresh(key, path) and self._touch(key):
            return path
        return None

    def verify(self, key: str, *, rehash: bool = False) -> bool:
        """Whether ``key`` is present and sound, rehashing it when its stamp is off (or
        ``rehash`` says so) and removing it when its bytes are wrong. The caller holds the
        key's lock."""
        path = self.content(key)
        if not rehash and self._fresh(key, path):
            return self._touch(key)
        try:
            sound = _hash_file(path) == key
        except FileNotFoundError:
            return False
        if sound:
            self._write_stamp(key, path)
            return True
        with self.directory_lock():
            self._remove_content(key, self._links())
        return False

    def reserve(self, key: str, size: int, max_bytes: int, *, wait: float = 0.0) -> Path:
        """The partial file to download ``key`` into, with room made for all of it by
        evicting what is least recently used. A partial left by an earlier attempt is kept,
        so the download resumes. The caller holds the key's lock.

        When the room is held by downloads in flight (or by blobs being checked or linked),
        which end by themselves, this waits for them up to ``wait`` seconds, looking again
        every ``_ROOM_POLL`` without the directory lock, before it raises :class:`CacheFull`.
        It waits holding no partial file: its own is dropped first. A partial is thus held
        only by a reservation that succeeded, whose download waits for no reservation, so two
        reservations can never wait for each other."""
        if size > max_bytes:
            raise TooLargeForCache(
                f"blob {key} is {size} bytes, more than the limit of {max_bytes} bytes of the cache at {self.root}"
            )
        partial = self.partial_dir / f"{key}.{size}"
        deadline = time.monotonic() + wait
        while True:
            try:
                with self.directory_lock():
                    for other in self._partials():  # an attempt at another size is no prefix of this one
                        if other.key == key and other.path != partial:
                            _unlink(other.path)
                    self._make_room(size, max_bytes, keep=key)
                    partial.touch(exist_ok=True)
                return partial
            except _RoomInFlight as exc:
                if time.monotonic() >= deadline:
                    raise CacheFull(f"{exc}, after waiting {wait:g} s for downloads in flight") from None
            _unlink(partial)  # the bytes of an earlier attempt would hold room while we wait
            time.sleep(_ROOM_POLL)

    def publish(self, key: str, partial: Path) -> Path:
        """Make a verified download visible: read-only, stamped, renamed into place in one
        step, so no reader ever sees part of it. The caller holds the key's lock."""
        os.chmod(partial, 0o444)
        self._write_stamp(key, partial)
        os.replace(partial, self.content(key))
        return self.content(key)

    def room_for_tree(self, key: str, max_bytes: int) -> int:
        """The most bytes a tree of archive ``key`` may unpack to: ``max_bytes`` less what
        eviction could not free (blobs in use, ``key`` itself, downloads in flight, and trees
        of those blobs). The caller holds the tree's lock."""
        with self.directory_lock():
            files = self._content_files()
            kept = self._in_use(self._links()) | {key}
            trees = _trees.sizes(self.unpacked_dir)
            held = sum(files[k][0] + trees.get(k, 0) for k in kept if k in files)
            held += sum(p.size for p in self._partials())
        return max(0, max_bytes - held)

    def settle(self, max_bytes: int, *, keep: str) -> None:
        """Evict what is least recently used until the cache, with the tree of ``keep`` just
        unpacked, is under ``max_bytes`` again (as far as blobs in use and work in flight
        allow: the next collection evicts the rest)."""
        with self.directory_lock():
            self._make_room(0, max_bytes, keep=keep, strict=False)

    def _remove_content(self, key: str, links: dict[str, list[_JobFile]]) -> int:
        """Remove a blob and every job link to it; its size. Holds key and directory locks."""
        for job_file in links.get(key, []):
            self._remove_job_file(job_file)
        try:
            size = os.stat(self.content(key)).st_size
        except FileNotFoundError:
            size = 0
        _unlink(self.content(key))
        _unlink(self._meta(key))
        return size

    def _remove_job_file(self, job_file: _JobFile) -> None:
        shutil.rmtree(job_file.key_dir, ignore_errors=True)
        stop = self._job_dir(job_file.job)
        parent = job_file.key_dir.parent
        while parent != stop:  # drop the name's now empty directories
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    # --- jobs ----------------------------------------------------------------------------------

    def find_job_file(self, job: str, name: str) -> Path | None:
        """The file of a job blob when present and unchanged since verified; no lock."""
        name_dir = self._job_dir(job) / encode_name(name)
        keys = _scandir(name_dir)
        if len(keys) != 1:
            return None
        files = _scandir(Path(keys[0].path))
        if len(files) != 1:
            return None
        key, path = keys[0].name, Path(files[0].path)
        if self._fresh(key, path) and self._touch(key):
            return path
        if key_from_filename(key) is None:
            return None
        # Changed since verified, or verified in an earlier boot: rehash here, which needs
        # no word from the server when the bytes are sound.
        with self.key_lock(key), contextlib.suppress(FileNotFoundError):
            if self.verify(key) and os.path.samefile(path, self.content(key)):
                return path
        return None

    def link(self, job: str, name: str, key: str) -> Path:
        """Give the job blob ``name`` the content of ``key``. The caller holds the key's lock,
        so the content cannot go away meanwhile."""
        job_dir = self._job_dir(job)
        name_dir = job_dir / encode_name(name)
        target = name_dir / key / _file_name(name)
        with self.directory_lock():
            content = os.stat(self.content(key))
            try:
                current = os.stat(target)
            except FileNotFoundError:
                current = None
            if current is None or current.st_ino != content.st_ino:
                target.parent.mkdir(parents=True, exist_ok=True)
                temp = job_dir / f".link-{uuid.uuid4().hex}"
                os.link(self.content(key), temp)
                os.replace(temp, target)  # atomic: a reader sees the old file or the new
            for other in _scandir(name_dir):  # what the name held before
                if other.name != key:
                    shutil.rmtree(other.path, ignore_errors=True)
        return target

    def register(self, job: str) -> str:
        """Add a reference to ``job`` held by this process; the lease name to release."""
        with self.directory_lock():
            lease = self._leases(job).take()
            _unlink(self._idle_marker(job))
        return lease

    def release(self, job: str, lease: str) -> int:
        """Drop a reference; the references left. At zero the job's idle time starts."""
        with self.directory_lock():
            leases = self._leases(job)
            leases.drop(lease)
            left = leases.count(purge=True)
            if left == 0:
                # The job directory may be gone already (removed by hand, or by a check that
                # found it broken): then there is nothing left to mark idle.
                with contextlib.suppress(FileNotFoundError):
                    self._idle_marker(job).touch()
        return left

    def references(self, job: str) -> int:
        """Live references to ``job`` from every process; the dead ones' are deleted."""
        with self.directory_lock():
            return self._leases(job).count(purge=True)

    def _jobs(self) -> list[str]:
        return sorted(
            entry.name
            for entry in _scandir(self.jobs_dir)
            if len(entry.name) == _JOB_HEX and all(c in "0123456789abcdef" for c in entry.name)
        )

    def _job_files(self, job: str, strays: list[Path] | None = None) -> Iterator[_JobFile]:
        """Every blob file of a job; what does not fit the layout goes to ``strays``."""
        job_dir = self._job_dir(job)
        pending: list[tuple[Path, tuple[str, ...]]] = [(job_dir, ())]
        while pending:
            directory, parts = pending.pop()
            for entry in _scandir(directory):
                if entry.name.startswith(".") and not parts:
                    continue  # leases, idle marker, link in the making
                here = (*parts, entry.name)
                if not entry.is_dir(follow_symlinks=False):
                    if strays is not None:
                        strays.append(Path(entry.path))
                elif entry.name.endswith("~"):
                    pending.append((Path(entry.path), here))
                else:
                    yield from self._name_dir(job, Path(entry.path), here, strays)

    def _name_dir(
        self, job: str, name_dir: Path, parts: tuple[str, ...], strays: list[Path] | None
    ) -> Iterator[_JobFile]:
        name = decode_name(Path(*parts))
        for key_entry in _scandir(name_dir):
            files = _scandir(Path(key_entry.path)) if key_entry.is_dir(follow_symlinks=False) else []
            if name is None or key_from_filename(key_entry.name) is None or len(files) != 1:
                if strays is not None:
                    strays.append(Path(key_entry.path))
                continue
            yield _JobFile(job, name, key_entry.name, Path(files[0].path))

    def _links(self) -> dict[str, list[_JobFile]]:
        """Every job file, by key."""
        links: dict[str, list[_JobFile]] = {}
        for job in self._jobs():
            for job_file in self._job_files(job):
                links.setdefault(job_file.key, []).append(job_file)
        return links

    def _in_use(self, links: dict[str, list[_JobFile]]) -> set[str]:
        """Keys linked by a job that a live process has registered."""
        referenced = {job for job in self._jobs() if self._leases(job).count() > 0}
        return {key for key, files in links.items() if any(f.job in referenced for f in files)}

    # --- size limit ----------------------------------------------------------------------------

    def _content_files(self) -> dict[str, tuple[int, float]]:
        """Size and last access of every blob."""
        found: dict[str, tuple[int, float]] = {}
        for entry in _scandir(self.content_dir):
            if key_from_filename(entry.name) is None:
                continue
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            try:
                access = os.stat(self._meta(entry.name)).st_mtime
            except FileNotFoundError:
                access = 0.0  # never verified since a crash: the first to go
            found[entry.name] = (size, access)
        return found

    def _partials(self) -> list[_Partial]:
        return [p for p in map(_partial_of, _scandir(self.partial_dir)) if p is not None]

    def _drop_abandoned(self, partial: _Partial) -> bool:
        """Remove a download whose downloader is gone; False while one is at work on it.
        Left alone, such a file lets the next download of its key resume."""
        lock = self.key_lock(partial.key)
        if not lock.acquire(blocking=False):
            return False
        try:
            _unlink(partial.path)
        finally:
            lock.release()
        return True

    def _make_room(self, need: int, max_bytes: int, *, keep: str | None = None, strict: bool = True) -> CollectReport:
        """Evict least recently used blobs no live job uses until ``need`` more bytes fit.
        Holds the directory lock; ``keep`` is the key whose lock the caller holds."""
        report = CollectReport()
        # What is not ours to remove now but frees itself: downloads in flight end, published
        # or abandoned; blobs locked by a check or a link, and trees being unpacked, are free
        # again a moment later.
        passing = 0
        files = self._content_files()
        partials = [p for p in self._partials() if p.key != keep]
        trees = _trees.sizes(self.unpacked_dir)
        used = sum(size for size, _ in files.values()) + sum(p.size for p in partials) + sum(trees.values())
        if used + need <= max_bytes:
            return report
        for key in [key for key in trees if key not in files and key != keep]:  # their archive is gone
            if used + need <= max_bytes:
                break
            if _trees.remove_all(self.unpacked_dir, key):
                used -= trees.pop(key)
            else:
                passing += trees[key]
        for partial in partials:  # abandoned downloads go first: they may never be finished
            if used + need <= max_bytes:
                break
            if self._drop_abandoned(partial):
                used -= partial.size
                report.removed_partials += 1
            else:
                passing += partial.size
        links = self._links()
        in_use = self._in_use(links)
        for key in sorted(files, key=lambda k: files[k][1]):
            if used + need <= max_bytes:
                break
            if key in in_use or key == keep:
                continue
            lock = self.key_lock(key)
            if not lock.acquire(blocking=False):
                passing += files[key][0]
                continue  # being checked or linked right now: not a candidate
            try:
                if key in trees and not _trees.remove_all(self.unpacked_dir, key):
                    passing += files[key][0] + trees[key]
                    continue  # its tree is being unpacked or removed right now
                freed = self._remove_content(key, links) + trees.get(key, 0)
                lock.unlink()
            finally:
                lock.release()
            used -= freed
            report.freed_bytes += freed
            report.evicted.append(key)
            self.counters.add("evictions")
            self.counters.add("evicted_bytes", freed)
        if strict and used + need > max_bytes:
            full = _RoomInFlight if passing and used - passing + need <= max_bytes else CacheFull
            raise full(
                f"the cache at {self.root} holds {used} bytes in use or in flight; {need} more do not fit "
                f"under its limit of {max_bytes} bytes"
            )
        return report

    # --- collection ----------------------------------------------------------------------------

    def collect(
        self,
        cleanup_interval: float,
        max_bytes: int | None = None,
        *,
        partials: bool = False,
        now: float | None = None,
    ) -> CollectReport:
        """Delete jobs idle for ``cleanup_interval`` seconds, forget dead processes' leases,
        evict down to ``max_bytes`` when given, and with ``partials`` remove downloads whose
        downloader is gone. A job found without live references and no idle mark (its last
        holder died) is marked idle now and deleted one interval later."""
        now = time.time() if now is None else now
        report = CollectReport()
        with self.directory_lock():
            for job in self._jobs():
                if self._leases(job).count(purge=True):
                    _unlink(self._idle_marker(job))
                    continue
                marker = self._idle_marker(job)
                try:
                    since = os.stat(marker).st_mtime
                except FileNotFoundError:
                    marker.touch()
                    since = now
                if now - since >= cleanup_interval:
                    os.rename(self._job_dir(job), self.trash_dir / f"{job}.{uuid.uuid4().hex}")
                    report.removed_jobs.append(job)
                else:
                    deadline = since + cleanup_interval
                    report.next_deadline = min(report.next_deadline or deadline, deadline)
            if partials:
                report.removed_partials += sum(map(self._drop_abandoned, self._partials()))
            if max_bytes is not None:
                evicted = self._make_room(0, max_bytes, strict=False)
                report.evicted, report.freed_bytes = evicted.evicted, evicted.freed_bytes
                report.removed_partials += evicted.removed_partials
            self._remove_idle_locks()
            self.counters.fold_dead()
        self._empty_trash()
        return report

    def _remove_idle_locks(self) -> None:
        """Lock files of keys with neither content nor a download. Holds the directory lock."""
        busy = {entry.name for entry in _scandir(self.content_dir)}
        busy.update(entry.name.partition(".")[0] for entry in _scandir(self.partial_dir))
        for entry in _scandir(self.locks_dir):
            if entry.name in busy:
                continue
            lock = FileLock(Path(entry.path))
            if lock.acquire(blocking=False):
                try:
                    lock.unlink()
                finally:
                    lock.release()

    def _empty_trash(self) -> None:
        for entry in _scandir(self.trash_dir):
            shutil.rmtree(entry.path, ignore_errors=True)

    # --- start and check -----------------------------------------------------------------------

    def recover(self) -> RecoveryReport:
        """The scan at start: remove partial downloads nobody is finishing, rehash every blob
        whose stamp is off or from an earlier boot of the host, remove what fails."""
        report = RecoveryReport(removed_partials=sum(map(self._drop_abandoned, self._partials())))
        self._empty_trash()
        for entry in _scandir(self.content_dir):
            key = entry.name
            if key_from_filename(key) is None:
                continue  # a stray, for check() below
            stamp = self._read_stamp(key)
            with contextlib.suppress(FileNotFoundError):
                if stamp is not None and stamp.boot == self.boot and stamp.matches(entry.stat()):
                    continue
            lock = self.key_lock(key)
            if not lock.acquire(blocking=False):
                continue  # its holder is checking it already
            try:
                report.rehashed += 1
                if not self.verify(key, rehash=True):
                    report.removed_corrupt.append(key)
            finally:
                lock.release()
        report.repaired = self.check(fix=True, rehash=False)
        return report

    def check(self, *, fix: bool = False, rehash: bool = True, max_bytes: int | None = None) -> list[str]:
        """Compare the directory with its rules and return one warning per breach; with
        ``fix``, repair each. ``rehash`` rehashes every blob, whatever its stamp says."""
        warnings: list[str] = []
        if rehash:
            for key in sorted(self._content_files()):
                warnings += self._check_content(key, fix)
        with self.directory_lock():
            warnings += self._check_layout(fix)
            if max_bytes is not None:
                used = sum(size for size, _ in self._content_files().values())
                used += sum(_trees.sizes(self.unpacked_dir).values())
                if used > max_bytes:
                    warnings.append(f"the cache holds {used} bytes, over its limit of {max_bytes}")
                    if fix:
                        self._make_room(0, max_bytes, strict=False)
        return warnings

    def _check_content(self, key: str, fix: bool) -> list[str]:
        path = self.content(key)
        with self.key_lock(key):
            try:
                st = os.stat(path)
            except FileNotFoundError:
                return []
            actual = _hash_file(path)
            if actual != key:
                if fix:
                    with self.directory_lock():
                        self._remove_content(key, self._links())
                return [f"{path}: its bytes hash to {actual}"]
            stamp = self._read_stamp(key)
            if stamp is None or not stamp.matches(st):
                if fix:
                    self._write_stamp(key, path)
                return [f"{self._meta(key)}: the stamp does not match the file"]
        return []

    def _check_layout(self, fix: bool) -> list[str]:
        """Everything but the bytes of blobs. Holds the directory lock."""
        warnings: list[str] = []

        def stray(path: Path, why: str) -> None:
            warnings.append(f"{path}: {why}")
            if fix:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    _unlink(path)

        contents = {entry.name for entry in _scandir(self.content_dir)}
        for entry in _scandir(self.content_dir):
            if key_from_filename(entry.name) is None:
                stray(Path(entry.path), "not a blob")
        for entry in _scandir(self.meta_dir):
            if entry.name in contents:
                continue
            key = entry.name.lstrip(".").partition(".")[0]  # a stamp, or a stamp being written
            if key_from_filename(key) is None:
                stray(Path(entry.path), "not a stamp")
                continue
            lock = self.key_lock(key)
            if lock.acquire(blocking=False):  # else its holder is writing it
                try:
                    # Its blob may have been published since ``contents`` was listed (a download
                    # that ended just before we took the lock): then the stamp is a fresh one.
                    # A stamp half written, under its temporary name, is a stray either way.
                    if entry.name != key or not self.content(key).exists():
                        stray(Path(entry.path), "a stamp of no blob")
                finally:
                    lock.release()
        for entry in _scandir(self.partial_dir):
            partial = _partial_of(entry)
            if partial is None:
                stray(Path(entry.path), "not a download")
                continue
            lock = self.key_lock(partial.key)
            if lock.acquire(blocking=False):
                try:
                    stray(partial.path, "a download nobody is finishing")
                finally:
                    lock.release()
        jobs = self._jobs()
        for entry in _scandir(self.jobs_dir):
            if entry.name not in jobs:
                stray(Path(entry.path), "not a job directory")
        for job in jobs:
            warnings += self._check_job(job, fix, stray)
        return warnings

    def _check_job(self, job: str, fix: bool, stray: Callable[[Path, str], None]) -> list[str]:
        warnings: list[str] = []
        leases = self._leases(job)
        for name in leases.dead():
            warnings.append(f"{leases.directory / name}: the lease of a process that is gone")
            if fix:
                leases.drop(name)
        for entry in _scandir(self._job_dir(job)):
            if entry.name.startswith(".link-"):
                stray(Path(entry.path), "a link nobody is finishing")
        strays: list[Path] = []
        for job_file in self._job_files(job, strays):
            try:
                linked = os.stat(job_file.path).st_ino == os.stat(self.content(job_file.key)).st_ino
            except FileNotFoundError:
                linked = False
            if not linked:
                warnings.append(f"{job_file.path}: not a link to {self.content(job_file.key)}")
                if fix:
                    self._remove_job_file(job_file)
        for path in strays:
            stray(path, "not a job blob")
        return warnings

    # --- reports -------------------------------------------------------------------------------

    def entries(self) -> tuple[list[ContentEntry], list[JobEntry]]:
        """Every blob and every job, for ``blobsvc cache ls``."""
        with self.directory_lock():
            files = self._content_files()
            links = self._links()
            in_use = self._in_use(links)
            jobs = []
            for job in self._jobs():
                try:
                    idle_since: float | None = os.stat(self._idle_marker(job)).st_mtime
                except FileNotFoundError:
                    idle_since = None
                held = tuple(sorted((f.name, f.key) for f in self._job_files(job)))
                jobs.append(JobEntry(job, self._leases(job).count(), idle_since, held))
        blobs = [
            ContentEntry(key, size, access, tuple(sorted({f.job for f in links.get(key, [])})), key in in_use)
            for key, (size, access) in sorted(files.items())
        ]
        return blobs, jobs

    def stats(self, max_bytes: int | None = None) -> CacheStats:
        """Totals for ``blobsvc cache stats`` and :meth:`BlobCache.stats`; ``max_bytes`` is
        the limit to report, which only the processes using the cache know."""
        blobs, jobs = self.entries()
        partials = self._partials()
        with self.directory_lock():
            counted = self.counters.totals()
        return CacheStats(
            blobs=len(blobs),
            bytes=sum(b.size for b in blobs),
            in_use_blobs=sum(1 for b in blobs if b.in_use),
            in_use_bytes=sum(b.size for b in blobs if b.in_use),
            jobs=len(jobs),
            referenced_jobs=sum(1 for j in jobs if j.references),
            references=sum(j.references for j in jobs),
            partials=len(partials),
            partial_bytes=sum(_size_on_disk(p.path) for p in partials),
            unpacked_bytes=sum(_trees.sizes(self.unpacked_dir).values()),
            max_bytes=max_bytes,
            **counted,
        )


def _size_on_disk(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0
