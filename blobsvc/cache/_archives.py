"""Archives unpacked once per host per content digest: atomically, safely, read-only.

``unpack(root, key, archive, kind)`` returns ``<root>/<key>/``, the archive's members. The
first process to take ``<root>/.<key>.lock`` unpacks into a temporary directory beside it,
makes the tree read-only and renames it into place; every other process, on this host and
in any later application, finds the directory and uses it as it is. So no task ever sees a
half-unpacked directory, and a process killed midway leaves only a temporary directory that
the next unpack removes.

Unpacked trees are not counted in the cache's byte limit; each lives as long as its archive
is in the cache, and :func:`prune` (run as each new tree is unpacked) removes the others.

Like the cache's downloads, trees are not fsynced: ``<root>/.<key>.boot`` records the boot of
the host they were unpacked in, and a tree of an earlier boot (whose files a crash of the host
may have cut short) is unpacked afresh before its first use in this one.

Every member is checked before a byte is written: an absolute path, a ``..`` component, a
device or FIFO, or a link whose target lands outside the directory refuses the whole archive
with :class:`UnsafeArchive`, and nothing is unpacked. Tar members are extracted with
:mod:`tarfile`'s ``data`` filter as well, a second guard that also drops set-uid bits.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import secrets
import shutil
import stat
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

from .._exceptions import BlobError, InvalidArgument
from ._lock import FileLock
from ._store import boot_id

__all__ = ["ARCHIVE_SUFFIXES", "UnsafeArchive", "archive_kind", "prune", "remove_unpacked", "unpack"]

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
_TEMP_PREFIX = ".unpacking-"


class UnsafeArchive(BlobError):
    """An archive holds a member that would land outside its directory (or is no archive)."""


def archive_kind(filename: str) -> str:
    """``"zip"`` or ``"tar"`` by the file name's suffix; InvalidArgument for anything else."""
    lower = filename.lower()
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith((".tar", ".tar.gz", ".tgz")):
        return "tar"
    raise InvalidArgument(f"{filename!r} is not an archive blobsvc unpacks ({', '.join(ARCHIVE_SUFFIXES)})")


def _inside(member: str, what: str) -> str:
    """``member`` normalised, or UnsafeArchive when it is absolute or climbs out."""
    if member.startswith(("/", "\\")) or (len(member) > 1 and member[1] == ":"):
        raise UnsafeArchive(f"{what} {member!r} is an absolute path")
    parts = member.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafeArchive(f"{what} {member!r} climbs out of the directory with '..'")
    return posixpath.normpath("/".join(parts))


def _check_link(member: str, target: str, *, hard: bool) -> None:
    """A link's target must stay inside: relative to the link's directory for a symlink,
    to the archive's root for a hard link."""
    if target.startswith("/"):
        raise UnsafeArchive(f"link {member!r} points to the absolute path {target!r}")
    base = "" if hard else posixpath.dirname(member)
    resolved = posixpath.normpath(posixpath.join(base, target))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchive(f"link {member!r} points outside the directory ({target!r})")


def _check_tar(archive: tarfile.TarFile) -> None:
    for member in archive.getmembers():
        name = _inside(member.name, "member")
        if member.issym() or member.islnk():
            _check_link(name, member.linkname, hard=member.islnk())
        elif not (member.isfile() or member.isdir()):
            raise UnsafeArchive(f"member {member.name!r} is a device or FIFO")


def _zip_is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _check_zip(archive: zipfile.ZipFile) -> None:
    for info in archive.infolist():
        name = _inside(info.filename, "member")
        if _zip_is_symlink(info):
            _check_link(name, archive.read(info).decode("utf-8", "replace"), hard=False)


def _extract(archive_path: Path, kind: str, dest: Path) -> None:
    try:
        if kind == "zip":
            with zipfile.ZipFile(archive_path) as archive:
                _check_zip(archive)
                for info in archive.infolist():
                    if _zip_is_symlink(info):  # zipfile would write the target as a file
                        link = dest / _inside(info.filename, "member")
                        link.parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(archive.read(info).decode(), link)
                    else:
                        archive.extract(info, dest)
        else:
            with tarfile.open(archive_path) as archive:
                _check_tar(archive)
                archive.extractall(dest, filter="data")
    except (zipfile.BadZipFile, tarfile.TarError, EOFError) as exc:
        raise UnsafeArchive(f"{archive_path.name} is not a readable {kind} archive: {exc}") from exc


def _make_read_only(tree: Path) -> None:
    for parent, dirs, files in os.walk(tree):
        for name in files:
            path = os.path.join(parent, name)
            mode = os.lstat(path).st_mode
            if stat.S_ISREG(mode):
                os.chmod(path, 0o555 if mode & 0o111 else 0o444)
        for name in dirs:
            os.chmod(os.path.join(parent, name), 0o555)
    os.chmod(tree, 0o555)


def remove_unpacked(tree: Path) -> None:
    """Remove a (read-only) unpacked tree; what is gone already is fine."""
    if not tree.exists():
        return
    for parent, dirs, _ in os.walk(tree):
        os.chmod(parent, 0o755)
        for name in dirs:
            with contextlib.suppress(OSError):
                os.chmod(os.path.join(parent, name), 0o755, follow_symlinks=False)
    shutil.rmtree(tree, ignore_errors=True)


@contextlib.contextmanager
def _lock(root: Path, key: str) -> Iterator[None]:
    lock = FileLock(root / f".{key}.lock")
    with lock:
        yield


def prune(root: Path, content_dir: Path) -> list[str]:
    """Remove the trees whose archive has left the cache (``content_dir/<key>`` is gone): an
    archive a registered job uses is never evicted, so no task is using such a tree. A tree
    being unpacked right now (its lock held) is left alone. Returns the keys removed."""
    removed = []
    for tree in root.iterdir() if root.is_dir() else ():
        key = tree.name
        if key.startswith(".") or (content_dir / key).exists():
            continue
        lock = FileLock(root / f".{key}.lock")
        if not lock.acquire(blocking=False):
            continue
        try:
            if not (content_dir / key).exists():
                remove_unpacked(tree)
                _boot_record(root, key).unlink(missing_ok=True)
                removed.append(key)
            lock.unlink()
        finally:
            lock.release()
    return removed


def _boot_record(root: Path, key: str) -> Path:
    return root / f".{key}.boot"


def _unpacked_in_this_boot(root: Path, key: str, boot: str) -> bool:
    try:
        return (root / key).is_dir() and _boot_record(root, key).read_text() == boot
    except FileNotFoundError:
        return False


def unpack(root: Path, key: str, archive: Path, kind: str) -> Path:
    """The unpacked directory of ``archive`` (content ``key``) under ``root``, unpacking it
    first when no process on this host has yet in this boot of the host."""
    final, boot = root / key, boot_id()
    if _unpacked_in_this_boot(root, key, boot):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root, key):
        if _unpacked_in_this_boot(root, key, boot):
            return final
        # No process of an earlier boot is alive to use a tree of that boot.
        _boot_record(root, key).unlink(missing_ok=True)
        remove_unpacked(final)
        for leftover in root.glob(f"{_TEMP_PREFIX}{key}-*"):  # a killed unpacker's
            remove_unpacked(leftover)
        temp = root / f"{_TEMP_PREFIX}{key}-{secrets.token_hex(4)}"
        temp.mkdir()
        try:
            _extract(archive, kind, temp)
            _make_read_only(temp)
            os.rename(temp, final)
        except BaseException:
            remove_unpacked(temp)
            raise
        # Written in place: a record cut short matches no boot, which only means "unpack again".
        _boot_record(root, key).write_text(boot)
    return final
