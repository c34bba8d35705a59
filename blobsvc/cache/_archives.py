"""Archives unpacked once per host per content digest: atomically, safely, read-only.

``unpack(root, key, archive, kind)`` returns ``<root>/<key>/``, the archive's members. The
first process to take ``<root>/.<key>.lock`` unpacks into a temporary directory beside it,
makes the tree read-only and renames it into place; every other process, on this host and
in any later application, finds the directory and uses it as it is. So no task ever sees a
half-unpacked directory, and a process killed midway leaves only a temporary directory that
the next unpack removes.

An unpacked tree holds at most ``max_members`` members and ``max_bytes`` bytes of file
contents; given the cache's ``store`` (as :mod:`blobsvc.spark` and the agent give it, with the
cache's byte limit), the tree counts in the cache's total: it may take all the limit but what
blobs in use, downloads in flight and their trees hold, and once unpacked, the blobs least
recently used are evicted (their trees with them) until the cache fits again. An archive
that would pass a bound is refused with :class:`ArchiveTooLarge` as it is unpacked, at the
bound. A tree lives as long as its archive is in the cache; :func:`prune` (run as each new
tree is unpacked) removes those whose archive has left. The trees' directory is laid out in
:mod:`._trees`.

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

import os
import secrets
from pathlib import Path

from .._exceptions import InvalidArgument
from ..config import DEFAULT_CACHE_MAX_BYTES
from . import _trees
from ._extract import MAX_MEMBERS, ArchiveTooLarge, UnsafeArchive, extract
from ._store import CacheStore, boot_id
from ._trees import ENVIRONMENT_SUFFIX, remove_unpacked

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


def archive_kind(filename: str) -> str:
    """``"zip"`` or ``"tar"`` by the file name's suffix; InvalidArgument for anything else."""
    lower = filename.lower()
    if lower.endswith(".zip"):
        return "zip"
    if lower.endswith((".tar", ".tar.gz", ".tgz")):
        return "tar"
    raise InvalidArgument(f"{filename!r} is not an archive blobsvc unpacks ({', '.join(ARCHIVE_SUFFIXES)})")


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
        lock = _trees.lock(root, name)
        if not lock.acquire(blocking=False):
            continue
        try:
            if not (content_dir / key).exists():
                _trees.remove(root, name)
                removed.append(name)
            lock.unlink()
        finally:
            lock.release()
    return removed


def discard(root: Path, key: str, *, environment: bool = False) -> None:
    """Remove the tree of ``key`` that :func:`unpack` made, once no process is unpacking it:
    for a tree that is of no use (an environment without its interpreter)."""
    name = key + ENVIRONMENT_SUFFIX if environment else key
    with _trees.lock(root, name) as lock:
        _trees.remove(root, name)
        lock.unlink()


def _unpacked_in_this_boot(root: Path, name: str, boot: str) -> bool:
    record = _trees.read_record(root, name)
    return record is not None and record[0] == boot and (root / name).is_dir()


def unpack(
    root: Path,
    key: str,
    archive: Path,
    kind: str,
    *,
    environment: bool = False,
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    store: CacheStore | None = None,
) -> Path:
    """The unpacked directory of ``archive`` (content ``key``) under ``root``, unpacking it
    first when no process on this host has yet in this boot of the host. ``environment``: a
    Python environment, whose symlinks may name absolute paths (see the module's docstring).
    The tree holds at most ``max_members`` members and ``max_bytes`` bytes; with ``store``
    (the cache whose ``unpacked_dir`` ``root`` is), the room its byte limit ``max_bytes``
    leaves, as the tree counts in it (ArchiveTooLarge when it would not fit)."""
    return unpack_once(
        root, key, archive, kind, environment=environment, max_bytes=max_bytes, max_members=max_members, store=store
    )[0]


def unpack_once(
    root: Path,
    key: str,
    archive: Path,
    kind: str,
    *,
    environment: bool = False,
    max_bytes: int = DEFAULT_CACHE_MAX_BYTES,
    max_members: int = MAX_MEMBERS,
    store: CacheStore | None = None,
) -> tuple[Path, bool]:
    """:func:`unpack`, and whether this call unpacked (False when the tree was there)."""
    name = key + ENVIRONMENT_SUFFIX if environment else key
    final, boot = root / name, boot_id()
    if _unpacked_in_this_boot(root, name, boot):
        return final, False
    root.mkdir(parents=True, exist_ok=True)
    with _trees.lock(root, name) as lock:
        if _unpacked_in_this_boot(root, name, boot):
            return final, False
        # No process of an earlier boot is alive to use a tree of that boot; a killed unpacker's
        # temporary directory, or a removal's, goes with it.
        _trees.remove(root, name)
        temp = root / f"{_trees.TEMP_PREFIX}{name}-{secrets.token_hex(4)}"
        temp.mkdir()
        room = max_bytes if store is None else store.room_for_tree(key, max_bytes)
        try:
            try:
                size = extract(archive, kind, temp, environment=environment, max_bytes=room, max_members=max_members)
            except ArchiveTooLarge as exc:
                if room == max_bytes:
                    raise
                raise ArchiveTooLarge(
                    f"{exc}: the rest of the cache's {max_bytes} bytes hold the archive, blobs in use and downloads"
                ) from None
            os.rename(temp, final)
        except BaseException:
            remove_unpacked(temp)
            lock.unlink()  # nothing of a refused archive is left, its lock included
            raise
        _trees.write_record(root, name, boot, size)
        if store is not None:
            store.settle(max_bytes, keep=key)  # room for the tree, made by evicting what was least used
    return final, True
