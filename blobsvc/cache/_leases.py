"""Leases: the references processes hold on a job, as files every process on the host can count.

A lease is an empty file ``<job dir>/.leases/<pid>-<start>-<n>``: the holder's process id,
the holder's start time (clock ticks since boot, field 22 of ``/proc/<pid>/stat``) and a
number unique within the holder. A job's reference count is the number of its leases whose
holder is alive, so a process that dies holding a reference (SIGKILL, OOM killer, a lost
executor) stops counting the moment it dies, with nobody having to clean up after it. The
start time is what tells a live holder from a new process that was given a recycled pid.

The files are created and removed under the cache directory's lock; counting and purging
the dead ones happens there too.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Holder", "LeaseFiles", "current_holder", "holder_alive", "name_alive", "parse_holder"]

_PROC = Path("/proc")
_HAS_PROC = (_PROC / "self" / "stat").exists()
_numbers = itertools.count(1)


@dataclass(frozen=True, slots=True)
class Holder:
    """A process, told apart from any later process that reuses its pid."""

    pid: int
    start: int


def _start_time(pid: int) -> int | None:
    """When ``pid`` started, or None when it is gone or a zombie (dead but not reaped)."""
    try:
        stat = (_PROC / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # The command name in parentheses may hold spaces or ")"; the fields after the last ")"
    # are: state (field 3), then on to starttime (field 22).
    fields = stat[stat.rindex(b")") + 2 :].split()
    if fields[0] in (b"Z", b"X"):
        return None
    return int(fields[19])


def current_holder() -> Holder:
    """This process. Computed on each call, because a forked child is another holder."""
    pid = os.getpid()
    start = _start_time(pid) if _HAS_PROC else 0
    assert start is not None
    return Holder(pid, start)


def holder_alive(holder: Holder) -> bool:
    if _HAS_PROC:
        return _start_time(holder.pid) == holder.start
    try:  # without /proc, a recycled pid passes for the holder: the best this can do
        os.kill(holder.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process, alive
    return True


def parse_holder(name: str) -> Holder | None:
    """The holder a ``<pid>-<start>-<n>`` file name names, or None when it is no such name."""
    parts = name.split("-")
    if len(parts) != 3 or not all(part.isdigit() for part in parts):
        return None
    return Holder(int(parts[0]), int(parts[1]))


class LeaseFiles:
    """The leases of one job, in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def take(self) -> str:
        """Add a lease held by this process; its name is what :meth:`drop` takes back."""
        holder = current_holder()
        name = f"{holder.pid}-{holder.start}-{next(_numbers)}"
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / name).touch(exist_ok=False)
        return name

    def drop(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            (self.directory / name).unlink()

    def count(self, *, purge: bool = False) -> int:
        """Leases whose holder is alive; with ``purge``, the others are deleted."""
        live = 0
        for name in _listdir(self.directory):
            if name_alive(name):
                live += 1
            elif purge:
                self.drop(name)
        return live

    def dead(self) -> list[str]:
        """Leases whose holder has died (and files whose name is no lease's)."""
        return [name for name in _listdir(self.directory) if not name_alive(name)]


def name_alive(name: str) -> bool:
    """Whether the process a ``<pid>-<start>-<n>`` name names is alive."""
    holder = parse_holder(name)
    return holder is not None and holder_alive(holder)


def _listdir(directory: Path) -> list[str]:
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
