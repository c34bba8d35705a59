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

**Python environments** (``environment=True``) relax one rule, for a reason. A venv-pack
archive's ``bin/python`` is a symlink to the absolute path of the interpreter the venv was
made from, and without it the environment has no Python. In this mode a symlink may point to
an absolute path; nothing else changes: members still may not be absolute paths, climb with
``..``, or be devices or FIFOs, and a relative link still may not lead out of the tree. Tar
members are extracted with tarfile's ``tar`` filter (the ``data`` filter refuses absolute
link targets), which still refuses to write any member through a link to outside the tree
and still drops set-uid bits. The trade-off: the tree holds links to anywhere on the host.
Following one reads what the host's own users can read anyway (no file is written through
it), so an environment is as trustworthy as the interpreter it names, which is the point of
shipping one. Such a tree is kept apart from the default mode's (``<key>.env`` beside
``<key>``), so an archive unpacked both ways never hands its absolute links to a caller who
did not ask for them.
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

__all__ = [
    "ARCHIVE_SUFFIXES",
    "ENVIRONMENT_SUFFIX",
    "UnsafeArchive",
    "archive_kind",
    "prune",
    "remove_unpacked",
    "unpack",
    "unpack_once",
]

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# An environment's tree is <key>.env, apart from the same archive unpacked by the default rules.
ENVIRONMENT_SUFFIX = ".env"
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


def _check_link(member: str, target: str, *, hard: bool, environment: bool) -> None:
    """A link's target must stay inside: relative to the link's directory for a symlink,
    to the archive's root for a hard link. A Python environment's symlinks may name an
    absolute path (its ``bin/python``); its hard links may not."""
    if target.startswith("/"):
        if environment and not hard:
            return
        raise UnsafeArchive(f"link {member!r} points to the absolute path {target!r}")
    base = "" if hard else posixpath.dirname(member)
    resolved = posixpath.normpath(posixpath.join(base, target))
    if resolved == ".." or resolved.startswith("../"):
        raise UnsafeArchive(f"link {member!r} points outside the directory ({target!r})")


def _check_tar(archive: tarfile.TarFile, environment: bool) -> None:
    for member in archive.getmembers():
        name = _inside(member.name, "member")
        if member.issym() or member.islnk():
            _check_link(name, member.linkname, hard=member.islnk(), environment=environment)
        elif not (member.isfile() or member.isdir()):
            raise UnsafeArchive(f"member {member.name!r} is a device or FIFO")


def _zip_is_symlink(info: zipfile.ZipInfo) -> bool:
    return stat.S_ISLNK(info.external_attr >> 16)


def _check_zip(archive: zipfile.ZipFile, environment: bool) -> None:
    links = set()
    for info in archive.infolist():
        name = _inside(info.filename, "member")
        if _zip_is_symlink(info):
            target = archive.read(info).decode("utf-8", "replace")
            _check_link(name, target, hard=False, environment=environment)
            links.add(name)
    # zipfile writes through a symlinked directory without looking; in an environment that
    # link may point anywhere, so a member below one is refused.
    for info in archive.infolist() if environment and links else ():
        parent = posixpath.dirname(_inside(info.filename, "member"))
        while parent:
            if parent in links:
                raise UnsafeArchive(f"member {info.filename!r} would be written through the link {parent!r}")
            parent = posixpath.dirname(parent)


def _extract(archive_path: Path, kind: str, dest: Path, environment: bool) -> None:
    try:
        if kind == "zip":
            with zipfile.ZipFile(archive_path) as archive:
                _check_zip(archive, environment)
                for info in archive.infolist():
                    if _zip_is_symlink(info):  # zipfile would write the target as a file
                        link = dest / _inside(info.filename, "member")
                        link.parent.mkdir(parents=True, exist_ok=True)
                        os.symlink(archive.read(info).decode(), link)
                    else:
                        archive.extract(info, dest)
        else:
            with tarfile.open(archive_path) as archive:
                _check_tar(archive, environment)
                # "tar" still refuses a member written through a link to outside dest.
                archive.extractall(dest, filter="tar" if environment else "data")
    except tarfile.FilterError as exc:
        raise UnsafeArchive(f"{archive_path.name}: {exc}") from exc
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
            path = os.path.join(parent, name)
            if not os.path.islink(path):  # os.walk lists links to directories too: never chmod a target
                os.chmod(path, 0o555)
    os.chmod(tree, 0o555)


def remove_unpacked(tree: Path) -> None:
    """Remove a (read-only) unpacked tree; what is gone already is fine."""
    if not tree.exists():
        return
    for parent, dirs, _ in os.walk(tree):
        os.chmod(parent, 0o755)
        for name in dirs:
            path = os.path.join(parent, name)
            if not os.path.islink(path):  # Linux cannot chmod a link itself, and its target is not ours
                with contextlib.suppress(OSError):
                    os.chmod(path, 0o755)
    shutil.rmtree(tree, ignore_errors=True)


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[None]:
    lock = FileLock(root / f".{name}.lock")
    with lock:
        yield


def prune(root: Path, content_dir: Path) -> list[str]:
    """Remove the trees whose archive has left the cache (``content_dir/<key>`` is gone): an
    archive a registered job uses is never evicted, so no task is using such a tree. A tree
    being unpacked right now (its lock held) is left alone. Returns the trees' names removed."""
    removed = []
    for tree in root.iterdir() if root.is_dir() else ():
        name = tree.name
        key = name.removesuffix(ENVIRONMENT_SUFFIX)
        if name.startswith(".") or (content_dir / key).exists():
            continue
        lock = FileLock(root / f".{name}.lock")
        if not lock.acquire(blocking=False):
            continue
        try:
            if not (content_dir / key).exists():
                remove_unpacked(tree)
                _boot_record(root, name).unlink(missing_ok=True)
                removed.append(name)
            lock.unlink()
        finally:
            lock.release()
    return removed


def _boot_record(root: Path, name: str) -> Path:
    return root / f".{name}.boot"


def _unpacked_in_this_boot(root: Path, name: str, boot: str) -> bool:
    try:
        return (root / name).is_dir() and _boot_record(root, name).read_text() == boot
    except FileNotFoundError:
        return False


def unpack(root: Path, key: str, archive: Path, kind: str, *, environment: bool = False) -> Path:
    """The unpacked directory of ``archive`` (content ``key``) under ``root``, unpacking it
    first when no process on this host has yet in this boot of the host. ``environment``: a
    Python environment, whose symlinks may name absolute paths (see the module's docstring)."""
    return unpack_once(root, key, archive, kind, environment=environment)[0]


def unpack_once(root: Path, key: str, archive: Path, kind: str, *, environment: bool = False) -> tuple[Path, bool]:
    """:func:`unpack`, and whether this call unpacked (False when the tree was there)."""
    name = key + ENVIRONMENT_SUFFIX if environment else key
    final, boot = root / name, boot_id()
    if _unpacked_in_this_boot(root, name, boot):
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root, name):
        if _unpacked_in_this_boot(root, name, boot):
            return final, False
        # No process of an earlier boot is alive to use a tree of that boot.
        _boot_record(root, name).unlink(missing_ok=True)
        remove_unpacked(final)
        for leftover in root.glob(f"{_TEMP_PREFIX}{name}-*"):  # a killed unpacker's
            remove_unpacked(leftover)
        temp = root / f"{_TEMP_PREFIX}{name}-{secrets.token_hex(4)}"
        temp.mkdir()
        try:
            _extract(archive, kind, temp, environment)
            _make_read_only(temp)
            os.rename(temp, final)
        except BaseException:
            remove_unpacked(temp)
            raise
        # Written in place: a record cut short matches no boot, which only means "unpack again".
        _boot_record(root, name).write_text(boot)
    return final, True
