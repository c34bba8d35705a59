"""GETs of hot small blobs answered from the event loop's reader callback, without waking the
connection's task.

Between requests a plain (non-TLS) binary connection is not read by its task: the task parks
in :meth:`HotGets.next_event` while a reader callback receives what the client sends, feeds
the connection's parser and answers each GET of a blob in :class:`~blobsvc._hotblobs.HotBlobs`
on the spot with one ``send`` of the reply encoded when the entry was made. A coroutine step,
a future, a timer and a reader registration per request is what made a small GET cost about
80 µs of server CPU; this path costs a ``recv``, a parse, a dictionary lookup and a ``send``.

Everything else wakes the task, which acts as it always has: any other request (and a GET
this path cannot answer: not hot, past the end, before AUTH, on an HA standby), the client's
hang-up, a protocol error, the start of a frame not yet whole (the task reads the rest under
the header deadline), and a reply the socket did not take whole (the task sends the rest
under the body deadline, see :attr:`HotGets.unsent`). Replies stay in request order: the
callback stops reading the moment it wakes the task, and the task answers what the parser
still holds before it parks again.

What the task does per request the callback does too: ``server.requests``, the observers
(metrics, request logs), ``waiting_since`` for the slots, the HA check, and the idle timeout,
kept by one timer per park that re-arms itself rather than one per request.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from ._exceptions import ReadTimeout, ServerError
from ._netio import connection_closed
from ._observe import ABORTED
from ._protocol import CLOSED, NEED_DATA, GetRequest, ServerEvent, Signal

if TYPE_CHECKING:
    from .server import _Connection

__all__ = ["HotGets"]

# Requests are small; a PUT body that follows its header in the same read goes to the parser.
RECV_SIZE = 64 << 10


class HotGets:
    """One plain binary connection's reader callback (see the module's documentation)."""

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection
        self._server = connection.server
        self._parser = connection.parser
        self._hot = connection.storage.hot
        self._sock = connection.stream.sock
        self._loop = asyncio.get_running_loop()
        self._idle_timeout = connection.settings.idle_timeout
        self._woken: asyncio.Future[ServerEvent | Signal] | None = None
        self._idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self.unsent: memoryview | None = None
        """The rest of a hot GET's reply the socket did not take: the task sends it."""
        self.unsent_count = 0  # the body bytes of that GET (what it moved, for the observers)

    async def next_event(self) -> ServerEvent | Signal:
        """What the task must act on next, hot GETs answered meanwhile: a request, CLOSED, or
        NEED_DATA when a frame has begun. Raises what broke the connection."""
        event = self._answer_buffered()
        if event is not None:
            return event
        loop, fd = self._loop, self._sock.fileno()
        woken: asyncio.Future[ServerEvent | Signal] = loop.create_future()
        self._woken = woken
        self._idle_since = loop.time()
        loop.add_reader(fd, self._on_readable)
        self._timer = loop.call_at(self._idle_since + self._idle_timeout, self._check_idle)
        try:
            return await woken
        finally:
            self._woken = None
            loop.remove_reader(fd)
            if self._timer is not None:
                self._timer.cancel()

    def _check_idle(self) -> None:
        # One timer per park: each answered GET moves ``_idle_since``, and the timer, when it
        # fires early, re-arms itself for the deadline as it now stands.
        deadline = self._idle_since + self._idle_timeout
        if self._loop.time() < deadline:
            self._timer = self._loop.call_at(deadline, self._check_idle)
        else:
            self._wake(ReadTimeout("timed out"))

    def _on_readable(self) -> None:
        if self._woken is None or self._woken.done():
            return  # the task is about to act: what the client sent next is for it to read
        try:
            data = self._sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._wake(connection_closed(exc))
            return
        try:
            self._parser.receive_data(data)
            event = self._answer_buffered()
        except Exception as exc:  # a protocol error, a failed send: the task deals with it
            self._wake(exc)
            return
        if event is not None:
            self._wake(event)

    def _wake(self, outcome: ServerEvent | Signal | Exception) -> None:
        woken = self._woken
        if woken is None or woken.done():
            return
        self._loop.remove_reader(self._sock.fileno())  # nothing more is read before the task runs
        if isinstance(outcome, Exception):
            woken.set_exception(outcome)
        else:
            woken.set_result(outcome)

    def _answer_buffered(self) -> ServerEvent | Signal | None:
        """Answer the hot GETs the parser holds; the first event for the task, or None when
        nothing is buffered."""
        parser = self._parser
        while True:
            event = parser.next_event()
            if event is NEED_DATA:
                return None if parser.between_requests else NEED_DATA
            if type(event) is not GetRequest or not self._answer(event):
                return event
            if self._connection.slots.closing:
                return CLOSED  # as the task does: no new request once the server shuts down

    def _answer(self, request: GetRequest) -> bool:
        """Answer ``request`` if its blob is hot and the socket takes the reply whole; the
        part it does not take is left in :attr:`unsent`, and False tells the caller to hand
        the request to the task."""
        connection = self._connection
        if not connection.authenticated:
            return False
        cached = self._hot.get(request.target)
        if cached is None or request.offset > cached.size:
            return False
        server = self._server
        try:
            server.ha.check()
        except ServerError:
            return False  # the task answers NOT_LEADER
        observers = server.observers
        began = time.perf_counter() if observers else 0.0
        server.requests["GET"] += 1
        reply = cached.reply(request.offset)
        count = cached.size - request.offset
        try:
            sent = self._sock.send(reply)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            self._observe(request, ABORTED, 0, began)
            raise connection_closed(exc) from None
        if sent < len(reply):
            self.unsent, self.unsent_count = memoryview(reply)[sent:], count
            return False
        self._idle_since = connection.waiting_since = self._loop.time()
        if observers:
            self._observe(request, 0, count, began)
        return True

    def _observe(self, request: GetRequest, outcome: int, moved: int, began: float) -> None:
        seconds = time.perf_counter() - began
        for observe in self._server.observers:
            observe(request, outcome, moved, seconds, self._connection.stream)
