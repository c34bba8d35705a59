"""Archives unpacked once per host per content digest: atomically, safely, read-only.

``unpack(root, key, archive, kind)`` returns ``<root>/<key>/``, the archive's members. The
first process to take ``<root>/.<key>.lock`` unpacks into a temporary directory beside it,
makes the tree read-only and renames it into place; every other process, on this host and
in any later application, finds the directory and uses it as it is. So no task ever sees a
half-unpacked directory, and a process killed midway leaves only a temporary directory that
the next unpack removes.

An unpacked tree holds at most ``max_bytes`` bytes of file contents (the cache's byte limit,
as the callers pass it: a tree no larger than the cache that holds its archive) and
``max_members`` members; an archive that would pass either is refused with
:class:`ArchiveTooLarge` as it is unpacked, at the bound. Trees are not counted in the
cache's total; each lives as long as its archive is in the cache, and :func:`prune` (run as
each new tree is unpacked) removes the others.

Like the cache's downloads, trees are not fsynced: ``<root>/.<key>.boot`` records the boot of
the host they were unpacked in, and a tree of an earlier boot (whose files a crash of the host
may have cut short) is unpacked afresh before its first use in this one.

The members are created by :mod:`._extract`, whose docstring states the rules: nothing is ever
followed, written or linked through a link, named twice or created outside the tree, modes
are read-only and never set-uid, nothing is chowned. A member that breaks one refuses the
whole archive with :class:`UnsafeArchive`, and what was unpacked of it is removed.

**Python environments** (``environment=True``) relax one rule, for a reason. A venv-pack
archive's ``bin/python`` is a symlink to the absolute path of the interpreter the venv was
made from, and without it the environment has no Python. In this mode a symlink may point to
an absolute path; nothing else changes: members still may not be absolute paths, climb with
``..``, be written through any link, or be devices or FIFOs; a relative link still may not
lead out of the tree, and hard links still join only files of the archive. The trade-off: the
tree holds links to anywhere on the host. Following one reads what the host's own users can
read anyway (no file is written, linked or chmodded through it), so an environment is as
trustworthy as the interpreter it names, which is the point of shipping one. Such a tree is
kept apart from the default mode's (``<key>.env`` beside ``<key>``), so an archive unpacked
both ways never hands its absolute links to a caller who did not ask for them.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from .._exceptions import InvalidArgument
from ..config import DEFAULT_CACHE_MAX_BYTES
from ._extract import MAX_MEMBERS, ArchiveTooLarge, UnsafeArchive, extract
from ._lock import FileLock
from ._store import boot_id

__all__ = [
    "ARCHIVE_SUFFIXES",
    "ENVIRONMENT_SUFFIX",
    "MAX_MEMBERS",
    "ArchiveTooLarge",
    "UnsafeArchive",
    "archive_kind",
    "discard",
    "prune",
    "remove_unpacked",
    "unpack",
    "unpack_once",
]

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# An environment's tree is <key>.env, apart from the same archive unpacked by the default rules.
ENVIRONMENT_SUFFIX = ".env"
_TEMP_PREFIX = ".unpacking-"


def archive_kind(filename: str) -> str:
    """``"zip"`` or ``"tar"`` by the file name's suffix; InvalidArgument for anything else."""
    lower = filename.lower()
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith((".tar", ".tar.gz", ".tgz")):
        return "tar"
    raise InvalidArgument(f"{filename!r} is not an archive blobsvc unpacks ({', '.join(ARCHIVE_SUFFIXES)})")


def remove_unpacked(tree: Path) -> None:
    """Remove a (read-only) unpacked tree; what is gone already is fine. Its directories are
    made writable through their own descriptors, so no link in the tree is ever followed."""
    if not tree.is_dir() or tree.is_symlink():
        return
    with contextlib.suppress(FileNotFoundError):
        os.chmod(tree, 0o700)
        for _, _, _, fd in os.fwalk(tree):  # follows no link, top-down: each made writable before its children
            os.fchmod(fd, 0o700)
    shutil.rmtree(tree, ignore_errors=True)


@contextlib.contextmanager
def _lock(root: Path, name: str) -> Iterator[FileLock]:
    lock = FileLock(root / f".{name}.lock")
    with lock:
        yield lock


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
                _remove_tree(root, name)
                removed.append(name)
            lock.unlink()
        finally:
            lock.release()
    return removed


def discard(root: Path, key: str, *, environment: bool = False) -> None:
    """Remove the tree of ``key`` that :func:`unpack` made, once no process is unpacking it:
    for a tree that is of no use (an environment without its interpreter)."""
    name = key + ENVIRONMENT_SUFFIX if environment else key
    with _lock(root, name) as lock:
        _remove_tree(root, name)
        lock.unlink()


def _remove_tree(root: Path, name: str) -> None:
    """Remove a tree and its boot record; the caller holds the tree's lock."""
    _boot_record(root, name).unlink(missing_ok=True)  # first: a record of no tree means "unpack"
    remove_unpacked(root / name)


def _boot_record(root: Path, name: str) -> Path:
    return root / f".{name}.boot"


def _unpacked_in_this_boot(root: Path, name: str, boot: str) -> bool:
    try:
        return (root / name).is_dir() and _boot_record(root, name).read_text() == boot
    except FileNotFoundError:
        return False


def unpack(
    root: Path,
    key: str,
    archive: Path,
    kind: str,
    *,
    environment: bool = False,
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    max_members: int = MAX_MEMBERS,
) -> Path:
    """The unpacked directory of ``archive`` (content ``key``) under ``root``, unpacking it
    first when no process on this host has yet in this boot of the host. ``environment``: a
    Python environment, whose symlinks may name absolute paths (see the module's docstring);
    ``max_bytes`` and ``max_members``: the most the tree may hold (ArchiveTooLarge)."""
    return unpack_once(root, key, archive, kind, environment=environment, max_bytes=max_bytes, max_members=max_members)[
        0
    ]


def unpack_once(
    root: Path,
    key: str,
    archive: Path,
    kind: str,
    *,
    environment: bool = False,
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    max_members: int = MAX_MEMBERS,
) -> tuple[Path, bool]:
    """:func:`unpack`, and whether this call unpacked (False when the tree was there)."""
    name = key + ENVIRONMENT_SUFFIX if environment else key
    final, boot = root / name, boot_id()
    if _unpacked_in_this_boot(root, name, boot):
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    with _lock(root, name) as lock:
        if _unpacked_in_this_boot(root, name, boot):
            return final, False
        _remove_tree(root, name)  # no process of an earlier boot is alive to use a tree of that boot
        for leftover in root.glob(f"{_TEMP_PREFIX}{name}-*"):  # a killed unpacker's
            remove_unpacked(leftover)
        temp = root / f"{_TEMP_PREFIX}{name}-{secrets.token_hex(4)}"
        temp.mkdir()
        try:
            extract(archive, kind, temp, environment=environment, max_bytes=max_bytes, max_members=max_members)
            os.rename(temp, final)
        except BaseException:
            remove_unpacked(temp)
            lock.unlink()  # nothing of a refused archive is left, its lock included
            raise
        # Written in place: a record cut short matches no boot, which only means "unpack again".
        _boot_record(root, name).write_text(boot)
    return final, True
