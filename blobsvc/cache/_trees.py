"""The cache's ``unpacked/`` directory: the archives' trees, their records and locks.

    <cache dir>/unpacked/
      <key>/ , <key>.env/         the trees of archive ``key`` (the default mode's, an
                                  environment's), read-only
      .<name>.lock                held while the tree ``name`` is unpacked or removed
      .<name>.boot                the boot of the host it was unpacked in, and its bytes:
                                  "<boot id>\\n<bytes>"
      .unpacking-<name>-<random>  a tree being unpacked, or one a killed unpacker left

Both :mod:`._archives` (which unpacks) and :mod:`._store` (which counts the trees' bytes in
the cache's total and removes an archive's trees with it) read this layout from here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import stat
from pathlib import Path

from ._lock import FileLock
from ._walk import DIR_FLAGS, empty

__all__ = ["ENVIRONMENT_SUFFIX", "TEMP_PREFIX", "lock", "read_record", "remove", "remove_all", "sizes", "write_record"]

# An environment's tree is <key>.env, apart from the same archive unpacked by the default rules.
log = logging.getLogger(__name__)

ENVIRONMENT_SUFFIX = ".env"
TEMP_PREFIX = ".unpacking-"


def lock(root: Path, name: str) -> FileLock:
    return FileLock(root / f".{name}.lock")


def _record(root: Path, name: str) -> Path:
    return root / f".{name}.boot"


def read_record(root: Path, name: str) -> tuple[str, int] | None:
    """The boot the tree ``name`` was unpacked in and its bytes; None when it has no record
    (none yet, or one cut short: "unpack again")."""
    try:
        boot, _, size = _record(root, name).read_text().partition("\n")
    except FileNotFoundError:
        return None
    return (boot, int(size)) if size.isdigit() else None


def write_record(root: Path, name: str, boot: str, size: int) -> None:
    """Written in place: a record cut short is no record, which only means "unpack again"."""
    _record(root, name).write_text(f"{boot}\n{size}")


def sizes(root: Path) -> dict[str, int]:
    """The bytes of every archive's trees, by the archive's key."""
    found: dict[str, int] = {}
    names: set[str] = set()
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
        names = {entry.name for entry in entries if entry.is_dir(follow_symlinks=False)}
    # A tree's leftover (set aside by a removal cut short) counts its tree's record; a tree
    # being unpacked has none yet.
    counted = {name for name in names if not name.startswith(".")}
    counted |= {name[len(TEMP_PREFIX) :].rpartition("-")[0] for name in names if name.startswith(TEMP_PREFIX)}
    for name in counted:
        record = read_record(root, name)
        key = name.removesuffix(ENVIRONMENT_SUFFIX)
        found[key] = found.get(key, 0) + (record[1] if record else 0)
    return found


def remove(root: Path, name: str) -> None:
    """Remove a tree, and what an earlier removal or unpack of it left, then its record; the
    caller holds the tree's lock. The tree is first renamed aside, so no process takes a tree
    half removed for one unpacked; its record goes last, so a removal cut short (a crash, an
    error) still counts what it left, which the next eviction or unpack removes."""
    with contextlib.suppress(FileNotFoundError):
        os.rename(root / name, root / f"{TEMP_PREFIX}{name}-{secrets.token_hex(4)}")
    for leftover in root.glob(f"{TEMP_PREFIX}{name}-*"):
        remove_unpacked(leftover)
    _record(root, name).unlink(missing_ok=True)


def remove_all(root: Path, key: str) -> bool:
    """Remove every tree of ``key`` (and their locks) unless one is being unpacked or removed
    right now, or cannot be removed (said in the log): then False."""
    held: list[FileLock] = []
    try:
        for name in (key, key + ENVIRONMENT_SUFFIX):
            tree_lock = lock(root, name)
            if not tree_lock.acquire(blocking=False):
                return False
            held.append(tree_lock)
        for name, tree_lock in zip((key, key + ENVIRONMENT_SUFFIX), held, strict=True):
            try:
                remove(root, name)
            except OSError as exc:  # its record stays: what is left still counts, and goes next time
                log.warning("could not remove the unpacked tree %s: %s", root / name, exc)
                return False
            tree_lock.unlink()
        return True
    finally:
        for tree_lock in held:
            tree_lock.release()


def remove_unpacked(tree: Path) -> None:
    """Remove a (read-only) unpacked tree, however deep; what is gone already is fine. Its
    directories are made writable through their own descriptors before they are listed (one
    without even search permission is given it first), and no link in it is ever followed."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISDIR(os.lstat(tree).st_mode):
            return
        os.chmod(tree, 0o700)
        fd = os.open(tree, DIR_FLAGS)
        try:
            empty(fd)
        finally:
            os.close(fd)
        os.rmdir(tree)
