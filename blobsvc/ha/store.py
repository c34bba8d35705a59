"""HA blob stores: where a blob's durable copy lives, shared by every server of a cluster.

:Status: Production for local directories and shared mounts; fsspec URLs as their backend allows.

Session loss (SUSPENDED, LOST) never reaches this module: a store is written only by the
server that holds leadership (see :mod:`blobsvc.ha.leader`) and nothing here ever deletes a
blob except an explicit DELETE. A server that loses leadership leaves the store as it is.

Layout under ``<root>`` (one root per cluster id)::

    objects/<k[:2]>/<k>/data       the bytes of content key k, written once however many names share it
    objects/<k[:2]>/<k>/content    k has its content-addressed name
    objects/<k[:2]>/<k>/<job>-<h>  job <job> names k under the name whose BLAKE3 is h
    names/<job>/<h>/<epoch>-<seq>  "<k>\\n<epoch>\\n<name>": a record that job <job> names key k
                                   under that name, written by the leader of <epoch> (both
                                   parts of the file name 16 hex digits)
    jobs/<job>/<h>                 the same, the one record of a name in a store written by an
                                   earlier blobsvc: read as the oldest record of its epoch,
                                   removed by the name's next write
    corrupt/<k>-<time>             a copy a read found damaged, moved aside for an operator

Executor hosts read ``objects/`` too (:mod:`blobsvc.ha.reads`: by key, never a name record,
never a write), which is why an object appears only complete under its final name where the
store can promise it (a rename; an S3 PUT), and why readers verify what they read anyway.
Tasks write checkpoint state into ``objects/`` (:mod:`blobsvc.ha.writes`: an object's
``data``, never a ref or a record); the leader names such an object without reading it
(:meth:`FileSystemBlobStore.adopt`), and sweeps one that no ref holds an hour after it was
written (:meth:`FileSystemBlobStore.sweep`). The leader remembers what it recorded under its
epoch (:mod:`._recorded`), so a name linked again costs no request.

Writes go object, then ref, then name record, and deletes the other way round, so a crash
between steps leaves an unreferenced object or ref (space, never a dangling name). A write
of a name the writer's own newest record already gives that key, its ref and whole object
there, writes nothing (it reads the record, the ref's and the object's sizes). An
object goes when its last ref does. A key's bytes and refs share a directory so that one
directory fsync makes a new object and its first ref durable together.

**Name records never go back in time.** A name record is never overwritten, as Flink's
ZooKeeperCompletedCheckpointStore never overwrites a completed checkpoint: each write of a
name creates a new record (unless the writer's own newest record says the same, above),
ordered by its file name (the writer's epoch, then a sequence within it), with an exclusive
create (a link of a synced temporary file in a directory, ``If-None-Match`` where fsspec
offers ``mode="create"``, as S3 does). A reader takes the newest valid record; older ones
are removed only once a newer one is durable (oldest first when a name is deleted, so a
crash never leaves an older version as the newest). A leader refuses to write under a name
whose newest record has a newer epoch, but that check is only a courtesy: a deposed leader
paused between it and its write adds a record that orders below the newer leader's, and is
never read.

Durability: a local directory (a path, or a ``file://`` URL) writes a temporary file beside
the final one, fsyncs it, renames it into place and fsyncs the directory, so a crash leaves
no partial file under a final name; the next write of that object removes a crashed copy's
temporary file. Other fsspec filesystems have neither fsync nor atomic rename (and
S3 no rename at all), so there the final key is written directly, and its size checked
afterwards unless the store is an object store (whose PUTs are atomic). Either way every
read hashes the bytes and refuses a copy whose digest is not its key: a damaged copy is
never served.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol

import blake3

from .._exceptions import DigestMismatch, NotFound, NotLeader
from ..files._locks import LockTable, make_dirs
from ..files._writeback import fsync_dir
from ..wire._protocol import KEY_SIZE, ContentKey, JobBlob, WholeJob
from ._recorded import Recorded, RecordedNames

__all__ = [
    "BUCKETED",
    "BlobStore",
    "FileSystemBlobStore",
    "VoidBlobStore",
    "check_store",
    "failure",
    "object_path",
    "open_blob_store",
    "open_files",
]

log = logging.getLogger("blobsvc.ha")

CHUNK = 1 << 20
# A file a writer sends to an fsspec store in one request, held in memory: checked whole
# before it is sent, and an object store's multipart upload costs more requests below this.
WHOLE_WRITE_LIMIT = 32 << 20
_CONTENT_REF = "content"
_DATA = "data"  # never a ref's name: refs are "content" or "<job hex>-<name hash hex>"
_TEMP_PREFIX = ".tmp-"  # listings skip dot files
# fsspec schemes whose first path component is a bucket: made only when asked (check_store's
# create_bucket), never as a side effect of a write, since their makedirs creates one.
BUCKETED = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})

Writer = Callable[[bytes], object]


class BlobStore(Protocol):
    """What a server asks of an HA store. Every call blocks: run it in a worker thread."""

    location: str

    def put(self, source: Path, key: bytes, target: JobBlob | None, epoch: int = 0) -> None:
        """Make the bytes at ``source`` (which hash to ``key``) durable under ``target``
        (content-addressed when None). Returns only once the copy is durable. A job name
        written under a newer ``epoch`` (the leader's fencing token) is not overwritten:
        :class:`NotLeader` instead."""

    def fetch(self, target: ContentKey | JobBlob, write: Writer) -> bytes | None:
        """Feed the blob's bytes to ``write`` and return its key, or None when the store has
        no such blob. Raises :class:`DigestMismatch` (after ``write`` saw the bytes) when
        the copy is damaged."""

    def key_of(self, target: ContentKey | JobBlob) -> bytes | None:
        """The key the store holds under ``target``, without reading the bytes."""

    def size_of(self, key: bytes) -> int | None:
        """The size of the bytes of ``key``, None when the store has none."""

    def adopt(self, key: bytes, target: JobBlob, epoch: int = 0) -> int | None:
        """Name ``target`` the object of ``key`` the store holds (written by a task); its size,
        None when the store has no such object."""

    def stat_name(self, target: ContentKey | JobBlob, epoch: int | None = None) -> tuple[int, bytes] | None:
        """The size and key of ``target`` in the store, no byte read (or as this writer
        recorded it under ``epoch``); None when it has none."""

    def names(self, job: bytes) -> list[str]:
        """The names of ``job`` the store holds."""

    def has_job(self, job: bytes) -> bool:
        """Whether the store holds any name of ``job``: one listing, no record read."""

    def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        """Remove a name, or every name of a job; bytes go with their last name."""

    def count(self) -> int:
        """How many distinct blobs (objects) the store holds."""


class VoidBlobStore:
    """The standalone mode's store: holds nothing, so a server's local disk is all there is."""

    location = ""

    def put(self, source: Path, key: bytes, target: JobBlob | None, epoch: int = 0) -> None:
        pass

    def fetch(self, target: ContentKey | JobBlob, write: Writer) -> bytes | None:
        return None

    def key_of(self, target: ContentKey | JobBlob) -> bytes | None:
        return None

    def size_of(self, key: bytes) -> int | None:
        return None

    def adopt(self, key: bytes, target: JobBlob, epoch: int = 0) -> int | None:
        return None

    def stat_name(self, target: ContentKey | JobBlob, epoch: int | None = None) -> tuple[int, bytes] | None:
        return None

    def names(self, job: bytes) -> list[str]:
        return []

    def has_job(self, job: bytes) -> bool:
        return False

    def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        pass

    def count(self) -> int:
        return 0


class _Files(Protocol):
    """The few file operations the store needs, on paths relative to its root."""

    location: str

    def write_file(self, path: str, source: Path, marker: str | None = None) -> None: ...
    def write_bytes(self, path: str, data: bytes) -> None: ...
    def create_bytes(self, path: str, data: bytes) -> None:
        """Write a new file at ``path``, durable before it returns; :class:`FileExistsError`
        (and nothing written) when there is one."""

    def write_checked(self, path: str, chunks: Iterable[bytes], check: Callable[[], object], size: int) -> None:
        """Write ``chunks`` (``size`` bytes) as the file at ``path``, calling ``check`` once
        all are read (it raises to refuse them): before the file appears under ``path``
        where the store can promise that (a rename; a small file sent whole), else just
        after, the file then removed. Written by a writer that holds none of the store's
        locks: it leaves others' temporary files be."""

    def chunks(self, path: str, offset: int = 0) -> Iterator[bytes]:
        """The file's bytes from ``offset`` on; :class:`FileNotFoundError` when there is none."""

    def size(self, path: str) -> int | None: ...
    def listdir(self, path: str) -> list[str]: ...
    def files_under(self, path: str) -> Iterator[tuple[str, float | None]]:
        """Every file under ``path`` (dot files aside), relative to the root, with its time
        of last modification (None when the backend gives none)."""

    def remove(self, path: str) -> None: ...
    def move(self, path: str, new_path: str) -> None: ...
    def check(self, create_bucket: bool) -> None:
        """Raise :class:`OSError` naming the store unless it can be used (see :func:`check_store`)."""


class _LocalFiles:
    """A directory: temp file, fsync, rename, directory fsync."""

    def __init__(self, root: Path, location: str | None = None) -> None:
        self.root = root
        self.location = location or str(root)

    def _path(self, path: str) -> Path:
        return self.root / path

    @contextlib.contextmanager
    def _replacing(
        self, path: str, marker: str | None = None, *, exclusive: bool = False, locked: bool = True
    ) -> Iterator[Path]:
        """A temporary file to fill; on success it is synced and renamed to ``path`` (linked
        there if ``exclusive``: :class:`FileExistsError` if ``path`` is taken), and an empty
        ``marker`` is created beside it before the directory is synced.

        The temporary files a crashed write left in that directory go first (a key's or a
        job's directory holds a few files: cheap to look). Safe to take, since the caller
        holds the lock that orders writes there (the key's or the job's), and a deposed
        leader whose file goes was never going to be acknowledged; a writer that is not
        ``locked`` (a task's store write) leaves them be."""
        final = self._path(path)
        make_dirs(final.parent)
        for stale in final.parent.glob(f"{_TEMP_PREFIX}*") if locked else ():
            stale.unlink(missing_ok=True)
        temp = final.parent / f"{_TEMP_PREFIX}{secrets.token_hex(8)}"
        try:
            yield temp
            fd = os.open(temp, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            if exclusive:
                os.link(temp, final)
            else:
                os.replace(temp, final)
            if marker is not None:
                (final.parent / marker).touch()
        finally:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()
        fsync_dir(final.parent)

    def write_file(self, path: str, source: Path, marker: str | None = None) -> None:
        with self._replacing(path, marker) as temp:
            shutil.copyfile(source, temp)

    def write_bytes(self, path: str, data: bytes) -> None:
        if data:
            with self._replacing(path) as temp:
                temp.write_bytes(data)
            return
        # An empty marker has no bytes to lose: creating it is atomic, its directory entry
        # is all that needs syncing.
        final = self._path(path)
        make_dirs(final.parent)
        final.touch()
        fsync_dir(final.parent)

    def create_bytes(self, path: str, data: bytes) -> None:
        with self._replacing(path, exclusive=True) as temp:
            temp.write_bytes(data)

    def write_checked(self, path: str, chunks: Iterable[bytes], check: Callable[[], object], size: int) -> None:
        with self._replacing(path, locked=False) as temp:
            with open(temp, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            check()

    def chunks(self, path: str, offset: int = 0) -> Iterator[bytes]:
        with open(self._path(path), "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                yield chunk

    def size(self, path: str) -> int | None:
        try:
            return self._path(path).stat().st_size
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            return [name for name in os.listdir(self._path(path)) if not name.startswith(".")]
        except FileNotFoundError:
            return []

    def files_under(self, path: str) -> Iterator[tuple[str, float | None]]:
        stack = [path]
        while stack:
            directory = stack.pop()
            try:
                entries = list(os.scandir(self._path(directory)))
            except (FileNotFoundError, NotADirectoryError):
                continue
            for entry in entries:
                if entry.name.startswith("."):
                    continue
                relative = f"{directory}/{entry.name}"
                if entry.is_dir(follow_symlinks=False):
                    stack.append(relative)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        yield relative, entry.stat(follow_symlinks=False).st_mtime

    def remove(self, path: str) -> None:
        target = self._path(path)
        try:
            if target.is_dir():
                target.rmdir()  # only ever asked of directories that should be empty
            else:
                target.unlink()
        except (FileNotFoundError, OSError):
            return
        fsync_dir(target.parent)

    def move(self, path: str, new_path: str) -> None:
        final = self._path(new_path)
        make_dirs(final.parent)
        os.replace(self._path(path), final)
        fsync_dir(final.parent)

    def check(self, create_bucket: bool) -> None:
        # A directory is made, as a data directory is; one that cannot be written is an error.
        make_dirs(self.root)
        if not os.access(self.root, os.W_OK | os.X_OK):
            raise PermissionError(f"the HA store {self.location} is not writable by this user")


class _FsspecFiles:
    """Any fsspec filesystem: the final path is written directly, then its size checked."""

    def __init__(self, url: str, options: dict[str, Any]) -> None:
        import fsspec

        self.fs: Any
        self.fs, root = fsspec.core.url_to_fs(url, **options)
        self.root = root.rstrip("/")
        self.location = url
        self.bucketed = url.partition("://")[0].lower() in BUCKETED

    def _make_parent(self, full: str) -> None:
        if not self.bucketed:  # an object store's prefixes need no making (and its buckets must not be)
            self.fs.makedirs(full.rpartition("/")[0], exist_ok=True)

    def _path(self, path: str) -> str:
        return f"{self.root}/{path}"

    def _checked(self, path: str, size: int) -> None:
        if self.bucketed:  # an object store's PUT is atomic: the object is whole once it is answered
            return
        written = self.size(path)
        if written != size:
            raise OSError(f"{self.location}/{path}: wrote {size} bytes but the store holds {written}")

    def write_file(self, path: str, source: Path, marker: str | None = None) -> None:
        full = self._path(path)
        self._make_parent(full)
        self.fs.put_file(str(source), full)
        self._checked(path, source.stat().st_size)
        if marker is not None:
            self.write_bytes(f"{path.rpartition('/')[0]}/{marker}", b"")

    def write_bytes(self, path: str, data: bytes) -> None:
        full = self._path(path)
        self._make_parent(full)
        self.fs.pipe_file(full, data)
        self._checked(path, len(data))

    def create_bytes(self, path: str, data: bytes) -> None:
        full = self._path(path)
        self._make_parent(full)
        # s3fs makes this a PUT with If-None-Match: *; fsspec's default checks, then writes.
        self.fs.pipe_file(full, data, mode="create")
        self._checked(path, len(data))

    def write_checked(self, path: str, chunks: Iterable[bytes], check: Callable[[], object], size: int) -> None:
        full = self._path(path)
        self._make_parent(full)
        if size <= WHOLE_WRITE_LIMIT:  # one request, checked before it is sent
            data = b"".join(chunks)
            check()
            self.fs.pipe_file(full, data)
            self._checked(path, len(data))
            return
        written = 0
        with self.fs.open(full, "wb") as f:
            for chunk in chunks:
                f.write(chunk)
                written += len(chunk)
        try:
            check()
        except BaseException:
            with contextlib.suppress(Exception):  # a reader refuses it anyway: it does not hash to its key
                self.fs.rm_file(full)
            raise
        self._checked(path, written)

    def chunks(self, path: str, offset: int = 0) -> Iterator[bytes]:
        with self.fs.open(self._path(path), "rb") as f:
            f.seek(offset)
            while chunk := f.read(CHUNK):
                yield chunk

    def size(self, path: str) -> int | None:
        try:
            return int(self.fs.size(self._path(path)))
        except FileNotFoundError:
            return None

    def listdir(self, path: str) -> list[str]:
        try:
            entries = self.fs.ls(self._path(path), detail=False)
        except FileNotFoundError:
            return []
        return [str(entry).rstrip("/").rpartition("/")[2] for entry in entries]

    def files_under(self, path: str) -> Iterator[tuple[str, float | None]]:
        try:
            found = self.fs.find(self._path(path), detail=True)
        except FileNotFoundError:
            return
        for full, info in found.items():
            relative = str(full)[len(self.root) + 1 :]
            if not relative.rpartition("/")[2].startswith("."):
                yield relative, _modified(info)

    def remove(self, path: str) -> None:
        full = self._path(path)
        with contextlib.suppress(FileNotFoundError, OSError):
            if self.fs.isdir(full):
                self.fs.rmdir(full)
            else:
                self.fs.rm_file(full)

    def move(self, path: str, new_path: str) -> None:
        full = self._path(new_path)
        self._make_parent(full)
        self.fs.mv(self._path(path), full)

    def check(self, create_bucket: bool) -> None:
        if not self.bucketed:
            self.fs.makedirs(self.root, exist_ok=True)
            self.fs.ls(self.root)
            return
        bucket = self.root.partition("/")[0]
        try:
            self.fs.info(bucket)
        except FileNotFoundError:
            if not create_bucket:
                raise FileNotFoundError(
                    f"the HA store's bucket {bucket!r} does not exist ({self.location}): create it, "
                    "or let the server create it with --ha-create-bucket"
                ) from None
            self.fs.mkdir(bucket)
            log.warning("created the HA store's bucket %r (ha_create_bucket)", bucket)


def _modified(info: dict[str, Any]) -> float | None:
    """A file's time of last modification from an fsspec listing: each backend names it its
    own way (s3fs ``LastModified``, a datetime; local ``mtime``; memory ``created``)."""
    for field in ("LastModified", "mtime", "created", "last_modified"):
        value = info.get(field)
        if isinstance(value, datetime.datetime):
            return value.timestamp()
        if isinstance(value, int | float):
            return float(value)
    return None


def _key_dir(key: str) -> str:
    return f"objects/{key[:2]}/{key}"


def object_path(key: str) -> str:
    """Where the bytes of the key whose hex is ``key`` live, relative to the store's root."""
    return f"{_key_dir(key)}/{_DATA}"


class _Record(NamedTuple):
    """A job name record: the key it names, the epoch of the leader that wrote it, the name."""

    key: bytes
    epoch: int
    name: str


def _name_hash(name: str) -> str:
    return str(blake3.blake3(name.encode("utf-8")).hexdigest())


_ORDER = re.compile("[0-9a-f]{16}-[0-9a-f]{16}")
MAX_JOBS_REMEMBERED = 100_000  # jobs known to have no record of the earlier layout (16 bytes each)
_EARLIER_LAYOUT = -1
"""The sequence a name's record in the earlier layout orders at: before any record of its epoch."""

Order = tuple[int, int]


class _Name(NamedTuple):
    """Where the records of one job name live."""

    job: bytes
    hash: str

    @property
    def records(self) -> str:
        return f"names/{self.job.hex()}/{self.hash}"

    @property
    def earlier(self) -> str:
        """Where the earlier layout kept the name's one record, written over by every write."""
        return f"jobs/{self.job.hex()}/{self.hash}"

    def path(self, order: Order) -> str:
        """A record's path: its file name is its order, so that names sort as records do."""
        if order[1] == _EARLIER_LAYOUT:
            return self.earlier
        return f"{self.records}/{order[0]:016x}-{order[1]:016x}"


class FileSystemBlobStore:
    """Content-addressed durable copies under a directory or an fsspec URL.

    Only the leader writes, so the locks here (per key, per job) are in-process: they keep
    a DELETE from collecting an object that a concurrent PUT is naming.
    """

    def __init__(self, files: _Files) -> None:
        self.files = files
        self.location = files.location
        self._keys = LockTable()
        self._jobs = LockTable()
        self._recorded = RecordedNames()
        self._without_earlier: set[bytes] = set()  # jobs known to have no record of the earlier layout

    # --- paths ------------------------------------------------------------------------------

    @staticmethod
    def _key_dir(key: str) -> str:
        return _key_dir(key)

    @staticmethod
    def _object(key: str) -> str:
        return object_path(key)

    @staticmethod
    def _ref(target: JobBlob | None) -> str:
        return _CONTENT_REF if target is None else f"{target.job.hex()}-{_name_hash(target.name)}"

    # --- writing ----------------------------------------------------------------------------

    def put(self, source: Path, key: bytes, target: JobBlob | None, epoch: int = 0) -> None:
        k = key.hex()
        size = source.stat().st_size
        if target is not None and self._holds_already(size, key, target, epoch):
            return
        with self._keys.hold(key):
            # An object of the wrong size is the debris of a write that never finished.
            if self.files.size(self._object(k)) != size:
                self.files.write_file(self._object(k), source, marker=self._ref(target))
            else:
                self.files.write_bytes(f"{self._key_dir(k)}/{self._ref(target)}", b"")
        if target is not None:
            self._record(key, size, target, epoch)

    def adopt(self, key: bytes, target: JobBlob, epoch: int = 0) -> int | None:
        """Name ``target`` the object of ``key`` that the store holds already, whoever wrote
        it (a task's state file, :mod:`blobsvc.ha.writes`), without reading a byte of it:
        its size, or None when the store has no such object. Its bytes are as trustworthy as
        whoever could write to the store: every reader verifies them."""
        known = self._recorded.get(target.job, _name_hash(target.name))
        if known is not None and (known.key, known.epoch) == (key, epoch):
            return known.size
        k = key.hex()
        with self._keys.hold(key):
            size = self.files.size(self._object(k))
            if size is None:
                return None
            # The ref in the same hold as the size: no collection takes the object between them.
            self.files.write_bytes(f"{self._key_dir(k)}/{self._ref(target)}", b"")
        self._record(key, size, target, epoch, unless_newest=True)
        return size

    def _record(self, key: bytes, size: int, target: JobBlob, epoch: int, *, unless_newest: bool = False) -> None:
        """Write the name record of ``target`` naming ``key`` (whose object, of ``size``
        bytes, and ref are durable), then drop the name's older records; ``unless_newest``,
        nothing when the name's newest record is this epoch's and names ``key`` already."""
        k = key.hex()
        name = _Name(target.job, _name_hash(target.name))
        with self._jobs.hold(target.job):
            orders = self._orders(name)
            newest = orders[-1] if orders else (epoch, -1)
            if newest[0] > epoch:
                # A deposed leader finishing a slow write: the newer leader's name stands.
                raise NotLeader(f"a newer leader (epoch {newest[0]}) wrote this name; not overwritten")
            if unless_newest and orders and newest[0] == epoch and newest[1] != _EARLIER_LAYOUT:
                record = self._read_quietly(name.path(newest))
                if record is not None and record.key == key:
                    self._recorded.remember(name.job, name.hash, Recorded(key, size, epoch))
                    return
            order = (epoch, newest[1] + 1 if newest[0] == epoch else 0)
            try:
                self.files.create_bytes(name.path(order), f"{k}\n{epoch}\n{target.name}".encode())
            except FileExistsError:
                raise NotLeader(f"another writer took the name record {name.path(order)}; not written") from None
            if orders:  # a new name has no older record to drop (a deposed leader's, added since, is never read)
                self._drop_older(name, order, key)
            self._recorded.remember(name.job, name.hash, Recorded(key, size, epoch))

    def _holds_already(self, size: int, key: bytes, target: JobBlob, epoch: int) -> bool:
        """Whether the store holds ``target`` as ``key`` by a record of this writer's own
        ``epoch``, with the object whole and this name's ref: a name written again (a
        checkpoint LINKs every unchanged state file each time) then costs a few reads, no
        write or fsync. The object's size is read every time, not taken from this writer's
        memory: the caller has the bytes, and writes them again if they went. Only a record
        of this epoch will do: after one of an older epoch, a deposed leader could still add
        a record above it, so a new one is written."""
        name = _Name(target.job, _name_hash(target.name))
        k = key.hex()
        with self._jobs.hold(target.job):
            orders = self._orders(name)
            if not orders or orders[-1][0] != epoch or orders[-1][1] == _EARLIER_LAYOUT:
                return False
            record = self._read_quietly(name.path(orders[-1]))
        held = (
            record is not None
            and record.key == key
            and self.files.size(f"{self._key_dir(k)}/{self._ref(target)}") is not None
            and self.files.size(self._object(k)) == size
        )
        if held:
            self._recorded.remember(name.job, name.hash, Recorded(key, size, epoch))
        return held

    def _drop_older(self, name: _Name, order: Order, key: bytes) -> None:
        """Remove a name's records ordered before ``order`` (whose record, naming ``key``, is
        durable), oldest first, then the refs of keys no remaining record names. Job's lock
        held."""
        orders = self._orders(name)
        older = [found for found in orders if found < order]
        dropped = self._keys_named(name, older)
        # A newer leader's records, written since this one checked, keep their keys.
        kept = {key} | self._keys_named(name, [found for found in orders if found > order])
        for found in older:
            self.files.remove(name.path(found))
        for stale in dropped - kept:
            self._unref(stale, f"{name.job.hex()}-{name.hash}")

    def _keys_named(self, name: _Name, orders: list[Order]) -> set[bytes]:
        """The keys a name's records of ``orders`` name (a damaged record names none)."""
        found = (self._read_quietly(name.path(order)) for order in orders)
        return {record.key for record in found if record is not None}

    # --- reading ----------------------------------------------------------------------------

    def _orders(self, name: _Name) -> list[Order]:
        """The orders (epoch, sequence) of a name's records, oldest first. A record of the
        earlier layout orders before every record of its epoch (a damaged one before all)."""
        found = []
        for entry in self.files.listdir(name.records):
            epoch, _, sequence = entry.partition("-")
            if _ORDER.fullmatch(entry):
                found.append((int(epoch, 16), int(sequence, 16)))
        if self._may_have_earlier(name.job) and self.files.size(name.earlier) is not None:
            earlier = self._read_quietly(name.earlier)
            found.append((-1 if earlier is None else earlier.epoch, _EARLIER_LAYOUT))
        return sorted(found)

    def _may_have_earlier(self, job: bytes) -> bool:
        """Whether ``job`` may have records in the earlier layout: this blobsvc writes none,
        so a job found without them once never has any (a request saved per name read)."""
        if job in self._without_earlier:
            return False
        if self.files.listdir(f"jobs/{job.hex()}"):
            return True
        if len(self._without_earlier) >= MAX_JOBS_REMEMBERED:
            self._without_earlier.clear()
        self._without_earlier.add(job)
        return False

    def _read_record(self, record: str) -> _Record | None:
        """What a name record holds; None when there is no record."""
        try:
            text = b"".join(self.files.chunks(record)).decode("utf-8", "replace")
        except FileNotFoundError:
            return None
        try:
            key_hex, epoch, name = text.split("\n", 2)
            parsed = _Record(bytes.fromhex(key_hex), int(epoch), name)
        except ValueError:
            parsed = None
        if parsed is None or len(parsed.key) != KEY_SIZE:
            raise DigestMismatch(f"the HA store's name record {self.location}/{record} is damaged; not served")
        return parsed

    def _read_quietly(self, record: str) -> _Record | None:
        """A name record, or None when it is missing or damaged (it names nothing)."""
        with contextlib.suppress(DigestMismatch):
            return self._read_record(record)
        return None

    def _newest(self, name: _Name) -> _Record | None:
        """The name's newest valid record; None when it has none. A damaged record newer
        than it is a write that never finished (a crash on a store without atomic writes),
        never acknowledged; a name whose every record is damaged is refused."""
        with self._jobs.hold(name.job):  # so that no write of ours removes what was just listed
            orders = self._orders(name)
            for order in reversed(orders):
                record = self._read_quietly(name.path(order))
                if record is not None:
                    return record
        if orders:
            raise DigestMismatch(f"the HA store's records of {self.location}/{name.records} are damaged; not served")
        return None

    def key_of(self, target: ContentKey | JobBlob) -> bytes | None:
        if isinstance(target, ContentKey):
            k = target.key.hex()
            return target.key if self.files.size(f"{self._key_dir(k)}/{_CONTENT_REF}") is not None else None
        record = self._newest(_Name(target.job, _name_hash(target.name)))
        return None if record is None else record.key

    def size_of(self, key: bytes) -> int | None:
        return self.files.size(self._object(key.hex()))

    def stat_name(self, target: ContentKey | JobBlob, epoch: int | None = None) -> tuple[int, bytes] | None:
        """The size and key of ``target`` as the store holds it: its newest record and its
        object's size, no byte read (the bytes are verified by whoever reads them), or what
        this writer recorded under ``epoch`` (no request). None when the store has no such
        name, or has lost its bytes."""
        if isinstance(target, JobBlob) and epoch is not None:
            known = self._recorded.get(target.job, _name_hash(target.name))
            if known is not None and known.epoch == epoch:
                return known.size, known.key
        key = self.key_of(target)
        size = None if key is None else self.size_of(key)
        return None if key is None or size is None else (size, key)

    def fetch(self, target: ContentKey | JobBlob, write: Writer) -> bytes | None:
        key = self.key_of(target)
        if key is None:
            return None
        path = self._object(key.hex())
        hasher = blake3.blake3()
        try:
            for chunk in self.files.chunks(path):
                hasher.update(chunk)
                write(chunk)
        except FileNotFoundError:
            raise NotFound(f"the HA store names {key.hex()} but has lost its bytes") from None
        if hasher.digest() != key:
            self._quarantine(path, key.hex())
            raise DigestMismatch(f"the HA store's copy of {key.hex()} is damaged; not served (moved to corrupt/)")
        return key

    def _quarantine(self, path: str, k: str) -> None:
        """Move a damaged copy aside, so the next PUT of these bytes writes them afresh."""
        self._recorded.forget_key(bytes.fromhex(k))
        with self._keys.hold(bytes.fromhex(k)), contextlib.suppress(OSError):
            self.files.move(path, f"corrupt/{k}-{int(time.time())}")

    def names(self, job: bytes) -> list[str]:
        found = []
        for name_hash in self._name_hashes(job):
            with contextlib.suppress(DigestMismatch):  # damaged records name nothing
                record = self._newest(_Name(job, name_hash))
                if record is not None:
                    found.append(record.name)
        return found

    def has_job(self, job: bytes) -> bool:
        return bool(self._name_hashes(job))

    def _name_hashes(self, job: bytes) -> set[str]:
        """The hashes of the names ``job`` has records of, in either layout."""
        earlier = set(self.files.listdir(f"jobs/{job.hex()}"))
        if earlier:  # left by a write cut short after its new record: read them again
            self._without_earlier.discard(job)
        return set(self.files.listdir(f"names/{job.hex()}")) | earlier

    def count(self) -> int:
        return sum(len(self.files.listdir(f"objects/{prefix}")) for prefix in self.files.listdir("objects"))

    # --- deleting ---------------------------------------------------------------------------

    def delete(self, target: ContentKey | JobBlob | WholeJob) -> None:
        if isinstance(target, ContentKey):
            self._unref(target.key, _CONTENT_REF)
            return
        job = target.job
        hashes = {_name_hash(target.name)} if isinstance(target, JobBlob) else self._name_hashes(job)
        with self._jobs.hold(job):
            if isinstance(target, WholeJob):
                self._recorded.forget(job)
            for name_hash in hashes:
                self._recorded.forget(job, name_hash)
                name = _Name(job, name_hash)
                orders = self._orders(name)
                held = self._keys_named(name, orders)
                for order in orders:  # oldest first: a crash never leaves an older version newest
                    self.files.remove(name.path(order))
                self.files.remove(name.records)
                for key in held:  # once no record is left to name them
                    self._unref(key, f"{job.hex()}-{name_hash}")
            self.files.remove(f"names/{job.hex()}")
            self.files.remove(f"jobs/{job.hex()}")

    def sweep(self, before: float) -> int:
        """Remove the objects that no ref holds and that were written before ``before`` (a
        ``time.time()``): bytes a task wrote and never linked (it died first, or its LINK
        was refused). Younger ones stay, since a task may be about to link them; so does an
        object the backend gives no time for. How many went. One listing per prefix
        (``objects/<k[:2]>``), so a sweep holds one 256th of the store's listing at a time."""
        removed = 0
        for prefix in self.files.listdir("objects"):
            contents: dict[str, dict[str, float | None]] = {}
            for path, modified in self.files.files_under(f"objects/{prefix}"):
                key_dir, _, name = path.rpartition("/")
                contents.setdefault(key_dir, {})[name] = modified
            for key_dir, files in contents.items():
                modified = files.get(_DATA)
                if set(files) == {_DATA} and modified is not None and modified < before:
                    removed += self._remove_unreferenced(key_dir.rpartition("/")[2])
        if removed:
            log.info("swept %d objects of the HA store that no name holds", removed)
        return removed

    def _remove_unreferenced(self, k: str) -> int:
        """Remove the object of ``k`` if it still has no ref (a write may have named it since)."""
        try:
            key = bytes.fromhex(k)
        except ValueError:
            return 0
        if len(key) != KEY_SIZE:
            return 0
        with self._keys.hold(key):
            if self.files.listdir(self._key_dir(k)) != [_DATA]:
                return 0
            self.files.remove(self._object(k))
            self.files.remove(self._key_dir(k))
        return 1

    def _unref(self, key: bytes, ref: str) -> None:
        k = key.hex()
        with self._keys.hold(key):
            self.files.remove(f"{self._key_dir(k)}/{ref}")
            if self.files.listdir(self._key_dir(k)) in ([], [_DATA]):
                self.files.remove(self._object(k))
                self.files.remove(self._key_dir(k))


def open_blob_store(location: str | os.PathLike[str], *, connect_timeout: float | None = None) -> FileSystemBlobStore:
    """The store at a directory path or an fsspec URL (``file://``, ``memory://``, ``s3://`` …)."""
    return FileSystemBlobStore(open_files(location, connect_timeout=connect_timeout))


def check_store(location: str | os.PathLike[str], *, create_bucket: bool, connect_timeout: float) -> None:
    """Raise :class:`OSError`, one line naming the store, unless the store at ``location`` can
    be used: a directory is made (or found writable); an fsspec URL's root is listed, and a
    bucketed one's bucket (:data:`BUCKETED`) must exist unless ``create_bucket``, which makes
    it. One attempt, connecting within ``connect_timeout``: a server checks its store at start
    and exits on failure rather than find out at its first PUT."""
    files = open_files(location, connect_timeout=connect_timeout, attempts=1)
    try:
        files.check(create_bucket)
    except OSError as exc:
        if files.location in str(exc):
            raise
        raise OSError(f"the HA store {files.location} cannot be used: {failure(exc)}") from None
    except Exception as exc:  # a backend's own errors (botocore's) are not OSErrors
        raise OSError(f"the HA store {files.location} cannot be reached: {failure(exc)}") from None


def failure(exc: BaseException) -> str:
    """A store's failure on one line: its type (a backend's own, botocore's say) and its text."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def open_files(
    location: str | os.PathLike[str], *, connect_timeout: float | None = None, attempts: int | None = None
) -> _Files:
    """The files of the store at ``location``: a directory's own, or an fsspec filesystem's.
    Nothing is created or read until asked; :class:`ImportError` when fsspec or the URL's
    backend is not installed. On ``s3://``, ``connect_timeout`` bounds each connection and
    ``attempts`` the tries of each request (botocore's own retries, s3fs's on top); other
    backends keep their own defaults."""
    text = str(location)
    if "://" not in text:
        return _LocalFiles(Path(text).expanduser())
    from fsspec.implementations.local import LocalFileSystem

    files = _FsspecFiles(text, _s3_options(text, connect_timeout, attempts))
    if isinstance(files.fs, LocalFileSystem):  # file://, local://: a directory, with rename and fsync
        return _LocalFiles(Path(files.root or "/"), location=text)
    return files


def _s3_options(url: str, connect_timeout: float | None, attempts: int | None) -> dict[str, Any]:
    """s3fs's options bounding connections and tries: by default botocore waits 60 s for a
    connection and tries 5 times, and s3fs 5 times over that (16 s to find an endpoint down)."""
    if url.partition("://")[0].lower() not in ("s3", "s3a"):
        return {}
    config: dict[str, Any] = {}
    if connect_timeout is not None:
        config["connect_timeout"] = connect_timeout
    if attempts is not None:
        config["retries"] = {"max_attempts": attempts}
    return {"config_kwargs": config} if config else {}
