"""Job gates: in zookeeper mode, writes into a job and deletions in it take turns.

A PUT or LINK of a job blob writes two copies, the HA store's and the local disk's, one after
the other, and a DELETE of the job (or of the name) removes both. Interleaved, a deletion
could fall between a write's two copies: the name would then be acknowledged and served by
this leader but absent from the HA store, and gone after the next failover (or, for a LINK,
absent here and back after the failover). So each write into a job holds the job's gate
*shared* from its first copy to its last, and each deletion holds it *exclusively*: a write
comes wholly before a deletion or wholly after it, as the protocol lets a client assume.

Writes into one job share the gate, so they never wait for one another. A waiting deletion
goes first: writes arriving after it wait until it is done, so a stream of PUTs cannot put
off a deletion for ever. A gate exists only while someone holds or awaits it. Standalone
servers need none: their one copy is ordered by storage's own locks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator

__all__ = ["JobGates"]


class _Gate:
    def __init__(self) -> None:
        self.users = 0  # holders and waiters: the gate is dropped when none is left
        self.writers = 0  # writes into the job under way
        self.deleting = False
        self.deletions_waiting = 0
        self.changed = asyncio.Condition()


class JobGates:
    """The gates of a server's jobs, by job id; used on the server's event loop."""

    def __init__(self) -> None:
        self._gates: dict[bytes, _Gate] = {}

    @contextlib.asynccontextmanager
    async def writing(self, job: bytes) -> AsyncIterator[None]:
        """Hold ``job``'s gate shared for a write's copies."""
        with self._using(job) as gate:
            async with gate.changed:
                await gate.changed.wait_for(lambda: not gate.deleting and not gate.deletions_waiting)
                gate.writers += 1
            try:
                yield
            finally:
                async with gate.changed:
                    gate.writers -= 1
                    gate.changed.notify_all()

    @contextlib.asynccontextmanager
    async def deleting(self, job: bytes) -> AsyncIterator[None]:
        """Hold ``job``'s gate exclusively for a deletion of the job or of one of its names."""
        with self._using(job) as gate:
            async with gate.changed:
                gate.deletions_waiting += 1
                try:
                    await gate.changed.wait_for(lambda: not gate.deleting and not gate.writers)
                finally:
                    gate.deletions_waiting -= 1
                    gate.changed.notify_all()  # if it gave up, the writes held back for it may go
                gate.deleting = True
            try:
                yield
            finally:
                async with gate.changed:
                    gate.deleting = False
                    gate.changed.notify_all()

    @contextlib.contextmanager
    def _using(self, job: bytes) -> Iterator[_Gate]:
        # Counted before the first await: a gate that others hold or await is never dropped.
        gate = self._gates.setdefault(job, _Gate())
        gate.users += 1
        try:
            yield gate
        finally:
            gate.users -= 1
            if not gate.users:
                del self._gates[job]

    def __len__(self) -> int:
        """Gates in use: jobs being written or deleted right now."""
        return len(self._gates)
