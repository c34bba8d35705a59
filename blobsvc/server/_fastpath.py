"""Small requests answered from the event loop's reader callback, without waking the
connection's task: GETs of hot small blobs, and small PUTs that arrived whole.

Between requests a plain (non-TLS) binary connection is not read by its task: the task parks
in :meth:`FastPath.next_event` while a reader callback receives what the client sends, feeds
the connection's parser and answers what it can on the spot. A coroutine step, a future, a
timer and a reader registration per request is what made a small request cost tens of µs of
the event loop's time on top of its own work.

* A GET of a blob in :class:`~blobsvc.storage._hotblobs.HotBlobs` is answered with one ``send`` of
  the reply encoded when the entry was made: a ``recv``, a parse, a dictionary lookup and a
  ``send``.
* A PUT whose header, every body byte and trailer are already buffered, announced at most
  :data:`~blobsvc.storage.MEMORY_STAGING_LIMIT` bytes (and ``max_blob_size``), on an
  authenticated connection of a server whose HA neither copies uploads nor confirms
  acknowledgements (standalone), is staged in memory and hashed here, and handed to the
  :class:`~blobsvc.storage._commit.GroupCommitter`. Until its publication is done the socket is not
  read, so replies stay in request order; the connection counts as busy meanwhile (shutdown
  lets it finish; it is never closed to make room for a newcomer). When the publication is
  done its callback answers PutOk, or the error frame of a refusal that keeps the connection
  (a digest mismatch), and goes on with what is buffered. Any other failure is handed to the
  task, which fails the connection as it always has. The upload is discarded only once its
  publication is done, whatever happened to the connection meanwhile; a task cancelled while
  one is in flight waits it out, as the task's own PUTs do, and acknowledges nothing.

Everything else wakes the task, which acts as it always has: any other request (and a GET
or PUT this path cannot answer: not hot, past the end, a body not yet whole, before AUTH, on
an HA standby or in ZooKeeper mode), the client's hang-up, a protocol error, the start of a
frame not yet whole (the task reads the rest under the header deadline), and a reply the
socket did not take whole (the task sends the rest under the body deadline, see
:attr:`FastPath.unsent`). Replies stay in request order: the callback stops reading the
moment it wakes the task, and the task answers what the parser still holds before it parks
again.

What the task does per request the callback does too: ``server.requests``, the observers
(metrics, request logs) with the same outcome, bytes moved and duration, ``busy`` and
``waiting_since`` for the slots, the HA check, and the idle timeout, kept by one timer per
park that re-arms itself rather than one per request (and never fires while a PUT publishes).
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Protocol

from .._exceptions import InternalError, ReadTimeout, ServerError
from ..config import Settings
from ..ha import HighAvailability
from ..http._observe import ABORTED, RequestObserver
from ..http._slots import Slots
from ..storage import MEMORY_STAGING_LIMIT, BlobStorage, StagedUpload
from ..storage._commit import GroupCommitter
from ..wire._netio import SocketStream, connection_closed
from ..wire._protocol import (
    CLOSED,
    NEED_DATA,
    ErrorFrame,
    GetRequest,
    PutOk,
    PutRequest,
    ServerConnection,
    ServerEvent,
    Signal,
)
from ..wire._threads import wait_out

__all__ = ["FastPath", "FastPathConnection", "FastPathServer"]


class FastPathServer(Protocol):
    """What the fast path reads of its server: the BlobServer is one."""

    @property
    def ha(self) -> HighAvailability: ...
    @property
    def committer(self) -> GroupCommitter: ...
    @property
    def observers(self) -> list[RequestObserver]: ...
    @property
    def requests(self) -> collections.Counter[str]: ...


class FastPathConnection(Protocol):
    """What the fast path uses of the binary connection it serves (the server's own), so that
    it needs nothing of the server module: read-only but for the three it sets."""

    busy: bool
    request: ServerEvent | None
    waiting_since: float

    @property
    def server(self) -> FastPathServer: ...
    @property
    def parser(self) -> ServerConnection: ...
    @property
    def storage(self) -> BlobStorage: ...
    @property
    def stream(self) -> SocketStream: ...
    @property
    def settings(self) -> Settings: ...
    @property
    def slots(self) -> Slots: ...
    @property
    def authenticated(self) -> bool: ...


# Requests are small; a PUT body that follows its header in the same read goes to the parser.
RECV_SIZE = 64 << 10


class FastPath:
    """One plain binary connection's reader callback (see the module's documentation)."""

    def __init__(self, connection: FastPathConnection) -> None:
        self._connection = connection
        self._server = server = connection.server
        self._parser = connection.parser
        self._hot = connection.storage.hot
        self._sock = connection.stream.sock
        self._fd = self._sock.fileno()
        self._loop = asyncio.get_running_loop()
        self._reading = False  # whether _on_readable is registered
        self._idle_timeout = connection.settings.idle_timeout
        self._woken: asyncio.Future[ServerEvent | Signal] | None = None
        self._idle_since = 0.0
        self._timer: asyncio.TimerHandle | None = None
        # PUTs up to this length may be answered here; none when the HA must see each upload
        # or confirm each acknowledgement (ZooKeeper), which takes the task's awaits.
        ha = server.ha
        plain_ha = not ha.copies_uploads and not ha.confirms_acknowledgements
        self._put_limit = min(MEMORY_STAGING_LIMIT, connection.settings.max_blob_size) if plain_ha else -1
        self._publishing: asyncio.Future[bytes] | None = None
        self._put: tuple[PutRequest, StagedUpload, float] | None = None  # what is publishing
        self.unsent: memoryview | None = None
        """The rest of a reply the socket did not take: the task sends it."""
        self.unsent_count = 0  # the body bytes of that request (what it moved, for the observers)
        self.unsent_outcome = 0  # what that reply answers: 0, or the code of its error frame

    async def next_event(self) -> ServerEvent | Signal:
        """What the task must act on next, small requests answered meanwhile: a request,
        CLOSED, or NEED_DATA when a frame has begun. Raises what broke the connection."""
        event = self._answer_buffered()
        if event is not None:
            return event
        loop = self._loop
        woken: asyncio.Future[ServerEvent | Signal] = loop.create_future()
        self._woken = woken
        self._idle_since = loop.time()
        if self._publishing is None:  # else its callback reads on once it is done
            self._read()
        self._timer = loop.call_at(self._idle_since + self._idle_timeout, self._check_idle)
        try:
            return await woken
        finally:
            self._woken = None
            self._stop_reading()
            if self._timer is not None:
                self._timer.cancel()
            if self._publishing is not None:  # cancelled (shutdown): never abandon a publication
                await wait_out(self._publishing)

    def _check_idle(self) -> None:
        # One timer per park: each answered request moves ``_idle_since``, and the timer, when
        # it fires early, re-arms itself for the deadline as it now stands. A PUT publishing
        # is not idleness: its completion moves ``_idle_since`` on.
        deadline = self._idle_since + self._idle_timeout
        now = self._loop.time()
        if self._publishing is not None:
            self._timer = self._loop.call_at(now + self._idle_timeout, self._check_idle)
        elif now < deadline:
            self._timer = self._loop.call_at(deadline, self._check_idle)
        else:
            self._wake(ReadTimeout("timed out"))

    def _read(self) -> None:
        if not self._reading:
            self._loop.add_reader(self._fd, self._on_readable)
            self._reading = True

    def _stop_reading(self) -> None:
        if self._reading:
            self._loop.remove_reader(self._fd)
            self._reading = False

    def _on_readable(self) -> None:
        if self._woken is None or self._woken.done():
            return  # the task is about to act: what the client sent next is for it to read
        if self._publishing is not None:
            # The client sent more (or hung up) while its PUT publishes: read it once that is
            # answered. The reader stays registered through a publication, since a client
            # that waits for its answer sends nothing meanwhile: two epoll_ctl per PUT saved.
            self._stop_reading()
            return
        try:
            data = self._sock.recv(RECV_SIZE)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._wake(connection_closed(exc))
            return
        try:
            self._parser.receive_data(data)
        except Exception as exc:  # data after the end of the stream: the task deals with it
            self._wake(exc)
            return
        self._go_on()

    def _go_on(self) -> None:
        """Answer what is buffered; wake the task for what this path does not answer, or
        read on when nothing is left and no PUT publishes."""
        try:
            event = self._answer_buffered()
        except Exception as exc:  # a protocol error, a failed send: the task deals with it
            self._wake(exc)
            return
        if event is not None:
            self._wake(event)
        elif self._publishing is None:
            self._read()

    def _wake(self, outcome: ServerEvent | Signal | Exception) -> None:
        woken = self._woken
        if woken is None or woken.done():
            return
        self._stop_reading()  # nothing more is read before the task runs
        if isinstance(outcome, Exception):
            woken.set_exception(outcome)
        else:
            woken.set_result(outcome)

    def _answer_buffered(self) -> ServerEvent | Signal | None:
        """Answer the small requests the parser holds; the first event for the task, or None
        when nothing is buffered or a PUT is publishing (nothing more is read until it is done)."""
        parser = self._parser
        while True:
            event = parser.next_event()
            if event is NEED_DATA:
                return None if parser.between_requests else NEED_DATA
            if type(event) is GetRequest:
                if not self._answer_get(event):
                    return event
            elif type(event) is PutRequest:
                return None if self._publish(event) else event
            else:
                return event
            if self._connection.slots.closing:
                return CLOSED  # as the task does: no new request once the server shuts down

    def _may_answer(self) -> bool:
        """What every request answered here needs: AUTH done, and a server that may serve."""
        if not self._connection.authenticated:
            return False
        try:
            self._server.ha.check()
        except ServerError:
            return False  # the task answers NOT_LEADER
        return True

    def _answer_get(self, request: GetRequest) -> bool:
        """Answer ``request`` if its blob is hot and the socket takes the reply whole; the
        part it does not take is left in :attr:`unsent`, and False tells the caller to hand
        the request to the task."""
        cached = self._hot.get(request.target)
        if cached is None or request.offset > cached.size or not self._may_answer():
            return False
        server = self._server
        began = time.perf_counter() if server.observers else 0.0
        server.requests["GET"] += 1
        return self._reply(request, cached.reply(request.offset), cached.size - request.offset, began)

    def _reply(
        self, request: GetRequest | PutRequest, reply: bytes, moved: int, began: float, outcome: int = 0
    ) -> bool:
        """Send the answer (``outcome``) of a request counted already; False when the socket
        did not take it whole (the rest is in :attr:`unsent`, for the task)."""
        try:
            sent = self._sock.send(reply)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError as exc:
            # As the task tells it: a PUT's body was received, a GET's was not sent.
            self._observe(request, ABORTED, moved if type(request) is PutRequest else 0, began)
            raise connection_closed(exc) from None
        if sent < len(reply):
            self.unsent, self.unsent_count, self.unsent_outcome = memoryview(reply)[sent:], moved, outcome
            return False
        self._idle_since = self._connection.waiting_since = self._loop.time()
        if self._server.observers:
            self._observe(request, outcome, moved, began)
        return True

    def _publish(self, request: PutRequest) -> bool:
        """Stage a whole small PUT in memory and hand it to the group commit; False when the
        task must take it (too long for this path, its body not all here, before AUTH, …)."""
        if request.length > self._put_limit or not self._parser.body_buffered or not self._may_answer():
            return False
        server, connection = self._server, self._connection
        began = time.perf_counter() if server.observers else 0.0
        server.requests["PUT"] += 1
        body, digest = self._parser.take_body()
        upload = connection.storage.stage_body(body)
        try:
            publishing = server.committer.publish(upload, request.target, digest)
        except BaseException:
            upload.discard()
            raise
        connection.busy, connection.request = True, request
        self._put, self._publishing = (request, upload, began), publishing
        publishing.add_done_callback(self._published)
        return True

    def _published(self, publishing: asyncio.Future[bytes]) -> None:
        assert self._put is not None
        (request, upload, began), self._put, self._publishing = self._put, None, None
        upload.discard()
        error = publishing.exception()  # also retrieved when nobody is left to answer
        if self._woken is None or self._woken.done():
            return  # the task was cancelled (shutdown): it acknowledges nothing
        connection = self._connection
        if error is None:
            reply, outcome = self._parser.send(PutOk(publishing.result())), 0
        elif isinstance(error, ServerError) and error.keeps_connection:
            reply, outcome = self._parser.send(ErrorFrame(error.code, str(error))), error.code
        else:  # the task answers it and closes, as for its own PUTs
            assert isinstance(error, Exception)  # the committer fails futures with Exceptions only
            outcome = error.code if isinstance(error, ServerError) else InternalError.code
            self._observe(request, outcome, request.length, began)
            self._wake(error)
            return
        try:
            whole = self._reply(request, reply, request.length, began, outcome)
        except Exception as exc:
            self._wake(exc)
            return
        if not whole:
            self._wake(request)  # the task sends the rest and observes the request
            return
        connection.busy, connection.request = False, None
        if connection.slots.closing:
            self._wake(CLOSED)
        else:
            self._go_on()

    def _observe(self, request: GetRequest | PutRequest, outcome: int, moved: int, began: float) -> None:
        seconds = time.perf_counter() - began
        for observe in self._server.observers:
            observe(request, outcome, moved, seconds, self._connection.stream)
