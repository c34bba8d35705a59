"""Connection slots: what binary and HTTP connections share under ``max_connections``.

A server holds one :class:`Slots`, which runs each accepted :class:`Connection` on its own
task and counts it against the limit from its accept until it ends, or until it gives up its
slot early with :meth:`Connection._stop_counting` (every refusal, binary or HTTP, does before its lingering
close, so refused clients draining out cannot crowd out others). A newcomer over the limit is
admitted only if :meth:`Slots.admit` makes room by closing the connection that has waited
longest for its client, binary or HTTP; a request under way is never cut short. ``closing``
tells every connection to finish the request in hand and go.
"""

from __future__ import annotations

import abc
import asyncio
import logging
import socket
from collections.abc import Callable
from typing import ClassVar

from .._exceptions import TransportError
from ..wire._netio import SocketStream

__all__ = ["Connection", "Slots"]

log = logging.getLogger("blobsvc.server")


class Slots:
    """The connections of one server and the slots they hold."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.connections: dict[asyncio.Task[None], Connection] = {}
        self.live = 0  # connections counting against ``limit``
        self.closing = False  # the server shuts down: no new request on any connection
        self.refused = 0  # newcomers refused at the limit

    async def accept(self, listener: socket.socket, make: Callable[[socket.socket], Connection]) -> None:
        """Serve each connection ``listener`` accepts, made by ``make``, until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, _ = await loop.sock_accept(listener)
            except OSError as exc:  # EMFILE and friends: back off rather than spin
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            self.serve(make(sock))

    async def drain(self, timeout: float) -> None:
        """Shutdown's end, in uvicorn's order: connections between requests go at once, busy
        ones get ``timeout`` seconds to finish the request in hand, then the rest are cancelled.
        Set ``closing`` and stop accepting first."""
        for task, connection in list(self.connections.items()):
            if not connection.busy:
                task.cancel()
        if self.connections:
            await asyncio.wait(list(self.connections), timeout=timeout)
        for task in list(self.connections):
            task.cancel()
        if self.connections:
            await asyncio.wait(list(self.connections))

    def abort(self) -> None:
        """Cancel every connection now, busy or not (a second Ctrl-C during shutdown)."""
        for task in self.connections:
            task.cancel()

    def serve(self, connection: Connection) -> None:
        """Count ``connection`` against the limit and run it on a task of its own."""
        connection._counted = True
        self.live += 1
        task = asyncio.create_task(connection.run())
        self.connections[task] = connection
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        # Also for a task cancelled before it ran a step (at shutdown), whose own
        # clean-up never ran.
        self.connections.pop(task).end()

    def admit(self, newcomer: Connection) -> bool:
        """Whether ``newcomer`` may be served: the server is within its limit, or room was
        made for it. A refusal is counted; the caller answers it."""
        if self.live <= self.limit or self._make_room(newcomer):
            return True
        self.refused += 1
        return False

    def _make_room(self, newcomer: Connection) -> bool:
        """Close the connection that has waited longest for its client, if one is waiting
        (idle, or sending a preamble or header); a request under way is never cut short."""
        waiting = [
            (connection.waiting_since, task)
            for task, connection in self.connections.items()
            if connection is not newcomer and connection.waiting and connection._counted
        ]
        if not waiting:
            return False
        _, task = min(waiting, key=lambda pair: pair[0])
        victim = self.connections[task]
        log.info("%s: closed to make room for %s", victim.stream.peer, newcomer.stream.peer)
        victim._stop_counting()
        task.cancel()
        return True


class Connection(abc.ABC):
    """One accepted connection's life in its slot: a subclass speaks the protocol in
    :meth:`_serve` and gives its last answer in :meth:`_fail`; this class keeps the
    bookkeeping :class:`Slots` relies on."""

    log: ClassVar[logging.Logger] = log  # where a connection's transport errors are told

    def __init__(self, slots: Slots, stream: SocketStream) -> None:
        self.slots = slots
        self.stream = stream
        self.busy = False  # a request is in hand: shutdown lets it finish
        self._loop = asyncio.get_running_loop()
        # Since when the connection waits for its client (idle, or in a header); at the limit
        # the longest-waiting connection makes room for a newcomer.
        self.waiting_since = self._loop.time()
        self._counted = False  # holds a slot (Slots.serve)

    @property
    def waiting(self) -> bool:
        """Waiting for the client between requests or in a header, with nothing under way."""
        return not self.busy

    async def run(self) -> None:
        try:
            await self._serve()
        except TransportError as exc:
            self.log.info("%s: %s", self.stream.peer, exc)
        except asyncio.CancelledError:
            pass
        except Exception as exc:
            await self._fail(exc)
        finally:
            self.end()

    @abc.abstractmethod
    async def _serve(self) -> None:
        """Speak the protocol until the client goes or ``slots.closing`` is set."""

    @abc.abstractmethod
    async def _fail(self, exc: Exception) -> None:
        """The last answer after ``exc`` (neither a transport error nor a cancellation) ended
        the connection: the peer's protocol error, a refusal, or an internal error."""

    def _request_done(self) -> None:
        """The request in hand is answered: the connection waits for its client again."""
        self.busy = False
        self.waiting_since = self._loop.time()

    def end(self) -> None:
        """Close the socket and give up the slot; safe to call more than once."""
        self._stop_counting()
        self.stream.close()

    def _stop_counting(self) -> None:
        if self._counted:
            self._counted = False
            self.slots.live -= 1
