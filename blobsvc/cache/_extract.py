"""Unpacking an archive into a directory it cannot reach outside of, whatever it holds.

:func:`extract` uses :mod:`tarfile` and :mod:`zipfile` only to list members and read their
bytes; it creates every member itself, by these rules (the shape of libarchive's
``ARCHIVE_EXTRACT_SECURE_*`` flags and GNU tar's delayed links), so that no check rests on
resolving a path (``realpath``), which links and long paths can defeat:

* **Nothing is ever followed.** Every member is created relative to an open descriptor of its
  directory, reached from the tree's own descriptor one component at a time with
  ``O_NOFOLLOW | O_DIRECTORY``; files are created ``O_CREAT | O_EXCL | O_NOFOLLOW``; hard
  links are made between directory descriptors with ``follow_symlinks=False``.
* **Names** are relative, without a ``..`` component or a NUL, each component at most
  ``NAME_MAX`` bytes and the whole at most ``PATH_MAX``; ``.`` components are dropped.
* **Each name once:** a member named twice, one under (or at) an earlier link or file, or a
  link or file at a directory's name refuses the archive. The one exception: a regular file
  may replace an earlier regular file of its name, the last winning as in tar (venv-pack
  writes ``pyvenv.cfg`` twice); the earlier is unlinked, never written through.
* **Kinds:** regular files, directories, symbolic links, and (tar) hard links to a regular
  file this archive has already unpacked. A device, a FIFO or anything else refuses it.
* **Symbolic links come last,** after every file and directory, so no member is ever written
  through one. A relative target may start with ``..`` components but has none after a name,
  and may not climb above the tree from the link's own directory; an absolute target is
  refused, except with ``environment`` (a packed Python environment's ``bin/python`` names
  the interpreter it was made from).
* **Modes** are set through each file's descriptor: read-only, executable (0555) or not
  (0444); directories 0555 once full. Set-uid, set-gid and sticky bits are never set, and
  nothing is ever chowned: the tree belongs to whoever unpacks it.
* **Times:** a file's or directory's modification time is the member's, set through its
  descriptor; a link keeps the time it was made.
* **Bounds on disk:** at most ``max_bytes`` bytes and ``max_members`` members. A file counts
  its bytes, a directory or a link ``BLOCK`` bytes (what it takes on disk); the bytes are
  counted as they are written, and a member whose size would pass the bound is refused before
  its first byte. A member's name has at most ``MAX_DEPTH`` components.
* **Bounds in memory,** whatever the archive claims: tarfile reads at most
  ``_MAX_HEADER_READS`` headers for one member, and their pax records and GNU long names and
  links (chained as they may be) total at most ``MAX_HEADER_BYTES``, and the archive's pax global
  headers at most ``MAX_HEADER_BYTES`` in all; sparse members are refused before their map is
  read (no Python environment holds one); a link's target is at most ``PATH_MAX`` bytes, a
  zip's central directory (names, extra fields, comments) at most ``MAX_ZIP_DIRECTORY`` bytes
  and ``max_members`` entries, and the names the unpacker keeps (members', their directories',
  links' targets) ``MAX_NAME_BYTES`` in all. The bound this gives is in docs/security.md.

A refused archive raises :class:`UnsafeArchive` (:class:`ArchiveTooLarge` for the bounds)
and leaves what it wrote in the tree, which the caller removes. This module needs nothing
but the standard library and :mod:`blobsvc._exceptions`.
"""

from __future__ import annotations

import bz2
import contextlib
import functools
import gzip
import io
import lzma
import os
import stat
import tarfile
import time
import zipfile
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO, TypeVar

from .._exceptions import BlobError
from ._walk import DIR_FLAGS as _DIR_FLAGS
from ._walk import walk

__all__ = [
    *("BLOCK", "MAX_DEPTH", "MAX_HEADER_BYTES", "MAX_MEMBERS", "MAX_NAME_BYTES", "MAX_ZIP_DIRECTORY"),
    *("ArchiveTooLarge", "UnsafeArchive", "extract"),
]

# How many members an unpacked tree may hold: well above the tens of thousands of files of
# the largest Python environments.
MAX_MEMBERS = 200_000
# The most a tar's headers for one member may read (pax records, GNU long names), and the
# most all its pax global headers may; _MAX_HEADER_READS bounds how many headers chain.
MAX_HEADER_BYTES = 1 << 20
_MAX_HEADER_READS = 16
# The most components a member's name may have (PATH_MAX allows 2,048).
MAX_DEPTH = 1024
# The most bytes of names the unpacker keeps for one tree: some 100 times a large environment's.
MAX_NAME_BYTES = 16 << 20
# The largest zip central directory read (zipfile reads it whole, and keeps every entry).
MAX_ZIP_DIRECTORY = 8 << 20
# How many directories' descriptors an unpack keeps open (venv-pack lists a directory's
# members together, and a deep tree's members share their directories).
_OPEN_DIRS = 64
# What a directory or a link counts against the tree's bytes: a block of the usual file systems.
BLOCK = 4096
_NAME_MAX = 255
_PATH_MAX = 4095
_CHUNK = 256 << 10
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
# What reading a broken archive raises, besides the formats' own errors.
_READ_ERRORS: tuple[type[Exception], ...] = (
    *(tarfile.TarError, zipfile.BadZipFile, EOFError, zlib.error, lzma.LZMAError, OSError, ValueError),
    *(RuntimeError, NotImplementedError),  # zipfile: encrypted, or an unknown compression
)
_T = TypeVar("_T")


class UnsafeArchive(BlobError):
    """An archive holds a member that would land outside its directory (or is no archive)."""


class ArchiveTooLarge(UnsafeArchive):
    """An archive unpacks to more bytes or members than its tree may hold."""


@dataclass(frozen=True, slots=True)
class _Member:
    name: str
    """As the archive spells it, for messages."""
    kind: str
    """``file``, ``dir``, ``symlink`` or ``hardlink``."""
    size: int = 0
    executable: bool = False
    mtime: float | None = None
    target: str = ""
    open: Callable[[], IO[bytes] | None] | None = None


def extract(
    archive: Path,
    kind: str,
    dest: Path,
    *,
    environment: bool = False,
    max_bytes: int,
    max_members: int = MAX_MEMBERS,
) -> int:
    """Unpack ``archive`` (``"tar"`` or ``"zip"``) into the empty directory ``dest`` by the
    module's rules, leaving it read-only; the bytes of its files. UnsafeArchive (or
    ArchiveTooLarge) when refused."""
    fd = os.open(dest, _DIR_FLAGS)
    tree = _Tree(fd, environment, max_bytes, max_members)
    try:
        try:
            with _members(archive, kind, max_members) as members:
                for member in members:
                    tree.add(member)
        except _ArchiveReadError as exc:
            raise UnsafeArchive(f"{archive.name} is not a readable {kind} archive: {exc.__cause__}") from exc
        tree.finish()
        return tree.written
    finally:
        tree.close()
        os.close(fd)


# --- reading ------------------------------------------------------------------------------------


class _ArchiveReadError(Exception):
    """Reading the archive failed (not writing the tree): the reader's own error is its cause."""


def _reading(call: Callable[[], _T]) -> _T:
    """``call()``, whose errors are the archive's (a write of the tree's raises OSError as is)."""
    try:
        return call()
    except UnsafeArchive:
        raise
    except _READ_ERRORS as exc:
        raise _ArchiveReadError(exc) from exc


@contextlib.contextmanager
def _members(archive: Path, kind: str, max_members: int) -> Iterator[Iterator[_Member]]:
    with open(archive, "rb") as raw:
        if kind == "zip":
            _check_zip_directory(raw, max_members)
            with _reading(lambda: zipfile.ZipFile(raw)) as zipped:
                yield _zip_members(zipped)
            return
        decompressed = _decompressor(raw)
        with contextlib.closing(decompressed or raw):
            stream = _CappedReads(decompressed or raw)
            opening = functools.partial(tarfile.open, fileobj=stream, mode="r:", tarinfo=_BoundedTarInfo)
            with _reading(opening) as tarred:
                yield _tar_members(tarred, stream)


def _decompressor(raw: BinaryIO) -> io.BufferedIOBase | None:
    """The tar's decompressed bytes, decompressed here rather than by tarfile, so that each
    read is capped (see _CappedReads); None when it is not compressed."""
    magic = _reading(lambda: raw.read(6))
    raw.seek(0)
    if magic.startswith(b"\x1f\x8b"):
        return gzip.GzipFile(fileobj=raw, mode="rb")
    if magic.startswith(b"BZh"):
        return bz2.BZ2File(raw)
    if magic.startswith(b"\xfd7zXZ\x00"):
        return lzma.LZMAFile(raw)
    return None


class _CappedReads:
    """A stream whose reads are at most MAX_HEADER_BYTES: tarfile reads a pax record or a GNU
    long name whole, as long as its header claims, and member bytes in smaller chunks. While
    tarfile reads one member's headers (from :meth:`headers` to :meth:`body`), their reads are
    counted: at most _MAX_HEADER_READS of MAX_HEADER_BYTES in all. The member's own bytes,
    read after :meth:`body` in _CHUNK pieces, are not headers: a large file is not refused."""

    def __init__(self, stream: BinaryIO | io.BufferedIOBase) -> None:
        self._stream = stream
        self._reads = 0
        self._bytes = 0
        self._counting = True  # tarfile.open reads the first member's headers

    def headers(self) -> None:
        """What follows, up to the member's bytes, is its headers."""
        self._reads = self._bytes = 0
        self._counting = True

    def body(self) -> None:
        """What follows is the member's bytes."""
        self._counting = False

    def read(self, size: int = -1) -> bytes:
        if size < 0 or size > MAX_HEADER_BYTES:
            raise UnsafeArchive(f"a tar header claims {size} bytes, more than the {MAX_HEADER_BYTES} allowed")
        if not self._counting:
            return self._stream.read(size)
        self._reads += 1
        if size > tarfile.BLOCKSIZE:  # a long name or pax record: the blocks are counted as reads
            self._bytes += size
        if self._bytes > MAX_HEADER_BYTES or self._reads > _MAX_HEADER_READS:
            raise UnsafeArchive(
                f"a tar member's headers pass {MAX_HEADER_BYTES} bytes or {_MAX_HEADER_READS} headers"
                " (long names, pax records)"
            )
        return self._stream.read(size)

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._stream.seek(offset, whence)

    def tell(self) -> int:
        return self._stream.tell()


class _BoundedTarInfo(tarfile.TarInfo):
    """tarfile's headers, but a sparse member is refused before its map is read (GNU's old
    extension blocks, or pax 0.0, 0.1 and 1.0 maps: millions of entries in a few kilobytes
    compressed), and pax global headers stop at MAX_HEADER_BYTES in all."""

    def _proc_pax(self, tar: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type == tarfile.XGLTYPE:
            total = getattr(tar, "_blobsvc_global_bytes", 0) + self.size
            if total > MAX_HEADER_BYTES:
                raise UnsafeArchive(f"the tar's pax global headers pass {MAX_HEADER_BYTES} bytes")
            tar._blobsvc_global_bytes = total  # type: ignore[attr-defined]
        return super()._proc_pax(tar)  # type: ignore[misc,no-any-return]

    def _sparse(self, *args: object) -> tarfile.TarInfo:
        # A pax map's member is the header after this one (the first argument), an old one's is this.
        name = args[0].name if isinstance(args[0], tarfile.TarInfo) else self.name
        raise UnsafeArchive(f"member {name[:80]!r} is a sparse file, which blobsvc does not unpack")

    _proc_sparse = _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _sparse


def _tar_members(tarred: tarfile.TarFile, stream: _CappedReads) -> Iterator[_Member]:
    while True:
        stream.headers()
        info = _reading(tarred.next)
        stream.body()
        if info is None:
            return
        tarred.members = []  # type: ignore[attr-defined]  # tarfile keeps every header it read: drop them
        if info.isreg():
            yield _Member(
                info.name,
                "file",
                info.size,
                bool(info.mode & 0o111),
                info.mtime,
                open=functools.partial(tarred.extractfile, info),
            )
        elif info.isdir():
            yield _Member(info.name, "dir", mtime=info.mtime)
        elif info.issym():
            yield _Member(info.name, "symlink", target=info.linkname)
        elif info.islnk():
            yield _Member(info.name, "hardlink", target=info.linkname)
        elif info.ischr() or info.isblk() or info.isfifo():
            raise UnsafeArchive(f"member {info.name!r} is a device or FIFO")
        else:
            raise UnsafeArchive(f"member {info.name!r} is of a kind blobsvc does not unpack ({info.type!r})")


def _check_zip_directory(raw: BinaryIO, max_members: int) -> None:
    """Refuse a zip whose central directory (which zipfile reads whole) is too large."""
    end = _reading(lambda: zipfile._EndRecData(raw))  # type: ignore[attr-defined]
    if end is None:
        return  # not a zip: zipfile says so
    entries, size = end[zipfile._ECD_ENTRIES_TOTAL], end[zipfile._ECD_SIZE]  # type: ignore[attr-defined]
    if entries > max_members:
        raise ArchiveTooLarge(f"the zip lists {entries} members, more than the {max_members} a tree may hold")
    if size > MAX_ZIP_DIRECTORY:
        raise ArchiveTooLarge(f"the zip's central directory passes {MAX_ZIP_DIRECTORY} bytes")
    raw.seek(0)


def _zip_members(zipped: zipfile.ZipFile) -> Iterator[_Member]:
    for number, info in enumerate(zipped.infolist(), 1):
        name = info.filename.replace("\\", "/")  # as zip tools of Windows wrote them
        if not name:  # zipfile cuts a name at its first NUL
            raise UnsafeArchive(f"zip member #{number} has an empty name (or one that starts with NUL)")
        mode = info.external_attr >> 16 if info.create_system == 3 else 0  # 3: made on Unix
        mtime = _zip_time(info.date_time)
        if stat.S_ISLNK(mode):
            with _reading(functools.partial(zipped.open, info)) as link:
                target = _reading(functools.partial(link.read, _PATH_MAX + 1))
            yield _Member(name, "symlink", target=target.decode("utf-8", "surrogateescape"))
        elif info.is_dir():
            yield _Member(name, "dir", mtime=mtime)
        elif stat.S_IFMT(mode) not in (0, stat.S_IFREG):  # 0: no type recorded, a file
            raise UnsafeArchive(f"member {name!r} is a device or FIFO")
        else:
            yield _Member(
                name,
                "file",
                info.file_size,
                bool(mode & 0o111),
                mtime,
                open=functools.partial(zipped.open, info),
            )


def _zip_time(date_time: tuple[int, int, int, int, int, int]) -> float | None:
    try:
        return time.mktime((*date_time, 0, 0, -1))
    except (OverflowError, ValueError):
        return None


# --- writing ------------------------------------------------------------------------------------


def _parts(name: str, what: str = "member") -> list[str]:
    """``name``'s components, or UnsafeArchive when it is absolute, climbs, or is too long."""
    if "\0" in name:
        raise UnsafeArchive(f"{what} {name[:80]!r} holds a NUL byte")
    if name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"{what} {name!r} is an absolute path")
    parts = [part for part in name.split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"{what} {name!r} climbs out of the directory with '..'")
    if any(len(os.fsencode(part)) > _NAME_MAX for part in parts):
        raise UnsafeArchive(f"{what} {name[:80]!r}... has a component longer than {_NAME_MAX} bytes")
    if len(os.fsencode(name)) > _PATH_MAX:
        raise UnsafeArchive(f"{what} {name[:80]!r}... is longer than {_PATH_MAX} bytes")
    if len(parts) > MAX_DEPTH:
        raise UnsafeArchive(f"{what} {name[:80]!r}... is deeper than {MAX_DEPTH} directories")
    return parts


def _check_symlink(name: str, parts: list[str], target: str, environment: bool) -> None:
    """A symlink's target, read as text: nothing on disk is consulted, or followed."""
    if not target or "\0" in target:
        raise UnsafeArchive(f"link {name[:80]!r} has an empty or NUL-holding target")
    if len(os.fsencode(target)) > _PATH_MAX:
        raise UnsafeArchive(f"link {name[:80]!r} has a target longer than {_PATH_MAX} bytes")
    if target.startswith("/"):
        if environment:
            return
        raise UnsafeArchive(f"link {name!r} points to the absolute path {target!r}")
    steps = [step for step in target.split("/") if step not in ("", ".")]
    ups = next((i for i, step in enumerate(steps) if step != ".."), len(steps))
    # A '..' after a name would climb from wherever that name leads, itself perhaps a link.
    if ".." in steps[ups:] or ups > len(parts) - 1:
        raise UnsafeArchive(f"link {name!r} points outside the directory ({target!r})")


class _Tree:
    """The tree being unpacked, from its directory's descriptor; what it holds, by name."""

    def __init__(self, fd: int, environment: bool, max_bytes: int, max_members: int) -> None:
        self.fd = fd
        self.environment = environment
        self.max_bytes = max_bytes
        self.max_members = max_members
        self.written = 0
        self.members = 0
        self.kinds: dict[str, str] = {}  # "dir", "file" or "link", by normalised name
        self.named: set[str] = set()  # names members gave (the others are implicit directories)
        self.dirs: dict[str, float | None] = {}  # every directory made, with its member's time
        self.symlinks: list[tuple[list[str], str]] = []
        self.current = ""  # the member being added, as the archive names it
        self.name_bytes = 0  # of the names kept above
        self.open_dirs: dict[str, int] = {}  # descriptors of directories, by name, oldest used first

    def _keep(self, name: str) -> None:
        """Count a name kept in memory (and, for one made, its block on disk)."""
        self.name_bytes += len(name)
        if self.name_bytes > MAX_NAME_BYTES:
            raise ArchiveTooLarge(f"member {self.current[:80]!r}: the archive's names pass {MAX_NAME_BYTES} bytes")

    def _count_block(self) -> None:
        self.written += BLOCK
        if self.written > self.max_bytes:
            raise self._too_large()

    def add(self, member: _Member) -> None:
        self._trim()
        self.current = member.name
        self.members += 1
        if self.members > self.max_members:
            raise ArchiveTooLarge(f"the archive holds more than {self.max_members} members, the most a tree may hold")
        parts = _parts(member.name)
        if not parts:  # the tree itself ("./")
            if member.kind != "dir":
                raise UnsafeArchive(f"member {member.name!r} names the directory itself")
            return
        name = "/".join(parts)
        self._keep(name)
        # The one duplicate allowed: a file replacing a file, the last winning as in tar
        # (venv-pack writes its rewritten pyvenv.cfg after the original).
        replaces = name in self.named and member.kind == "file" and self.kinds.get(name) == "file"
        if name in self.named and not replaces:
            raise UnsafeArchive(f"member {member.name!r} appears twice")
        self.named.add(name)
        held = None if replaces else self.kinds.get(name)
        if held == "dir" and member.kind == "dir":
            self.dirs[name] = member.mtime
            return
        if held is not None:  # a directory made for earlier members
            raise UnsafeArchive(f"member {member.name!r} would replace the directory {name!r}")
        if member.kind == "symlink":
            self._directory(parts[:-1], create=True)  # its directory now, the link last
            _check_symlink(member.name, parts, member.target, self.environment)
            self._keep(member.target)
            self._count_block()
            self.kinds[name] = "link"
            self.symlinks.append((parts, member.target))
            return
        parent = self._directory(parts[:-1], create=True)
        if member.kind == "dir":
            self._count_block()
            os.mkdir(parts[-1], 0o700, dir_fd=parent)
            self.kinds[name] = "dir"
            self.dirs[name] = member.mtime
        elif member.kind == "hardlink":
            self._hard_link(member, parts[-1], parent)
            self.kinds[name] = "file"
        else:
            if replaces:
                os.unlink(parts[-1], dir_fd=parent)  # a file of ours: unlinking follows nothing
            self._write(member, parts[-1], parent)
            self.kinds[name] = "file"

    def _check_parents(self, prefixes: list[str]) -> None:
        """Refuse the directories ``prefixes`` (to make) when one is a link or a file."""
        for prefix in prefixes:
            held = self.kinds.get(prefix)
            if held == "link":
                raise UnsafeArchive(f"member {self.current!r} would be written through the link {prefix!r}")
            if held == "file":
                raise UnsafeArchive(f"member {self.current!r} lies under the file {prefix!r}")

    def _directory(self, parts: list[str], *, create: bool = False) -> int:
        """A descriptor of the tree's directory ``parts``, reached without following any link,
        from the deepest directory above it whose descriptor is kept (so a member costs the
        directories it adds, not its depth); with ``create``, the directories missing are made
        (0700 until :meth:`finish`). The descriptor is kept, and closed by the tree."""
        key = "/".join(parts)
        if key in self.open_dirs:  # checked and made when it was opened: nothing has changed it since
            self.open_dirs[key] = self.open_dirs.pop(key)  # the most recently used, kept longest
            return self.open_dirs[key]
        start, cut, base = 0, len(key), ""
        for depth in range(len(parts) - 1, 0, -1):  # the deepest kept above it, checked when opened
            cut = key.rindex("/", 0, cut)
            if key[:cut] in self.open_dirs:
                start, base = depth, key[:cut]
                break
        prefixes = [f"{base}/{prefix}" if base else prefix for prefix in _prefixes(parts[start:])]
        if create:
            self._check_parents(prefixes)
        fd = self.open_dirs[base] if start else self.fd
        kept = True  # fd is the tree's or a kept one, not ours to close
        try:
            for part, prefix in zip(parts[start:], prefixes, strict=True):
                if create and prefix not in self.kinds:
                    self._keep(prefix)
                    self._count_block()
                    os.mkdir(part, 0o700, dir_fd=fd)
                    self.kinds[prefix] = "dir"
                    self.dirs[prefix] = None
                try:
                    child = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except OSError as exc:  # ELOOP, ENOTDIR: a link or a file where a directory must be
                    raise UnsafeArchive(f"{prefix!r} is not a directory of the tree: {exc.strerror}") from None
                if not kept:
                    os.close(fd)
                fd, kept = child, False
        except BaseException:
            if not kept:
                os.close(fd)
            raise
        if not kept:
            self.open_dirs[key] = fd
        return fd

    def _trim(self) -> None:
        """Close the least recently used descriptors past _OPEN_DIRS; only between members, so
        none a member is using."""
        while len(self.open_dirs) > _OPEN_DIRS:
            os.close(self.open_dirs.pop(next(iter(self.open_dirs))))

    def close(self) -> None:
        while self.open_dirs:
            os.close(self.open_dirs.popitem()[1])

    def _write(self, member: _Member, base: str, parent: int) -> None:
        if self.written + member.size > self.max_bytes:
            raise self._too_large()
        assert member.open is not None
        reader = _reading(member.open)
        assert reader is not None, "a regular file's reader"
        fd = os.open(base, _FILE_FLAGS, 0o600, dir_fd=parent)
        try:
            with reader:
                while chunk := _reading(functools.partial(reader.read, _CHUNK)):
                    self.written += len(chunk)
                    if self.written > self.max_bytes:
                        raise self._too_large()
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            os.fchmod(fd, 0o555 if member.executable else 0o444)
            _set_time(fd, member.mtime)
        finally:
            os.close(fd)

    def _too_large(self) -> ArchiveTooLarge:
        return ArchiveTooLarge(f"the archive unpacks to more than {self.max_bytes} bytes, the most a tree may hold")

    def _hard_link(self, member: _Member, base: str, parent: int) -> None:
        if member.target.startswith("/"):
            raise UnsafeArchive(f"link {member.name!r} points to the absolute path {member.target!r}")
        try:
            target = _parts(member.target, "the target of link")
        except UnsafeArchive:
            raise UnsafeArchive(f"link {member.name!r} points outside the directory ({member.target!r})") from None
        if not target or self.kinds.get("/".join(target)) != "file":
            raise UnsafeArchive(f"link {member.name!r} points to {member.target!r}, no file unpacked before it")
        source = self._directory(target[:-1])
        os.link(target[-1], base, src_dir_fd=source, dst_dir_fd=parent, follow_symlinks=False)

    def finish(self) -> None:
        """Make the symbolic links, then every directory read-only (the deepest first)."""
        for parts, target in self.symlinks:
            self._trim()
            os.symlink(target, parts[-1], dir_fd=self._directory(parts[:-1], create=True))
        walk(self.fd, leave=self._seal)

    def _seal(self, fd: int, path: list[str]) -> None:
        """A directory's time, and read-only: its children are done (the tree's own last)."""
        if path:
            _set_time(fd, self.dirs.get("/".join(path)))
        os.fchmod(fd, 0o555)


def _prefixes(parts: list[str]) -> Iterator[str]:
    """``a``, ``a/b``, ``a/b/c`` for ``[a, b, c]``: each made from the one before."""
    prefix = ""
    for part in parts:
        prefix = f"{prefix}/{part}" if prefix else part
        yield prefix


def _set_time(fd: int, mtime: float | None) -> None:
    """The member's time, when it is one a file can hold."""
    if mtime is not None and 0 <= mtime < 1 << 33:
        ns = int(mtime * 1e9)
        os.utime(fd, ns=(ns, ns))
