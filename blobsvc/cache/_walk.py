"""Walking an unpacked tree by descriptors, without recursion, whatever its depth.

:func:`walk` visits every directory under an open directory descriptor, children before their
parent, holding one descriptor at a time (so a tree thousands of directories deep needs
neither Python's stack nor thousands of open files): it goes down by name with
``O_NOFOLLOW | O_DIRECTORY`` and back up by ``..``, which is never a link. Each directory is
listed once; the names still to visit are kept on an explicit stack. Used to seal a tree
read-only after unpacking (:mod:`._extract`) and to empty one (:func:`empty`, for :mod:`._trees`).
"""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["DIR_FLAGS", "empty", "walk"]

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _open_child(name: str, parent: int, unlock: bool) -> int:
    try:
        return os.open(name, DIR_FLAGS, dir_fd=parent)
    except PermissionError:
        if not unlock:
            raise
        # A directory without read or search permission: ours, in a tree no one else
        # writes, so the name is still the directory just listed.
        os.chmod(name, 0o700, dir_fd=parent)
        return os.open(name, DIR_FLAGS, dir_fd=parent)


def walk(
    top: int,
    *,
    enter: Callable[[int], None] | None = None,
    other: Callable[[int, str], None] | None = None,
    leave: Callable[[int, list[str]], None] | None = None,
    remove: bool = False,
) -> None:
    """Visit the directories under ``top`` (a descriptor, left open), ``top`` itself last:
    ``enter(fd)`` before listing one, ``other(fd, name)`` for each entry of it that is not a
    directory, ``leave(fd, path)`` once its children are done (``path``: its components from
    ``top``); with ``remove``, each directory below ``top`` is removed once left, and one
    without permissions is given them (``chmod 0700``) to be entered."""
    fd = os.dup(top)
    path: list[str] = []
    pending: list[list[str]] = [_list(fd, enter, other)]
    try:
        while pending:
            if pending[-1]:
                name = pending[-1].pop()
                child = _open_child(name, fd, remove)
                os.close(fd)
                fd = child
                path.append(name)
                pending.append(_list(fd, enter, other))
                continue
            pending.pop()
            if leave is not None:
                leave(fd, path)
            if not path:
                break
            parent = os.open("..", DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            name = path.pop()
            if remove:
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)


def _list(fd: int, enter: Callable[[int], None] | None, other: Callable[[int, str], None] | None) -> list[str]:
    if enter is not None:
        enter(fd)
    directories = []
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                directories.append(entry.name)
            elif other is not None:
                other(fd, entry.name)
    return directories


def empty(top: int) -> None:
    """Remove everything under ``top`` (a descriptor, left open), each directory made
    writable through its own descriptor before it is listed."""
    walk(top, enter=_writable, other=_unlink, remove=True)


def _writable(fd: int) -> None:
    os.fchmod(fd, 0o700)


def _unlink(fd: int, name: str) -> None:
    os.unlink(name, dir_fd=fd)
