"""The read-only HTTP face of the BlobServer: GET and HEAD of blobs for Spark's fetcher, pip, curl.

Spark reads ``http(s)://`` URLs in ``spark.jars``, ``spark.archives``, ``spark.files`` and
``sc.addJar`` with its own fetcher, which knows nothing of blobsvc's binary protocol and sends
no custom headers. This face serves the same blobs as the binary GET, read-only:

* ``/blobs/<key hex>`` — a content-addressed blob; ``/blobs/<key hex>/<file name>`` is the same
  blob under a file name of the caller's choice (fetchers name the file after the last segment);
* ``/jobs/<job hex>/<name>`` — a job-scoped blob. Each ``/``-separated part of the name is
  percent-encoded on its own and the parts are joined with a literal ``/``, so the URL's last
  segment is the blob's basename (``/jobs/<job>/lib/udfs.jar`` → name ``lib/udfs.jar``).

When the server has a shared secret, every request needs ``?expires=<unix seconds>&signature=
<hex HMAC-SHA256>`` over the blob's canonical path and the expiry (like an S3 presigned URL):
the driver holding the secret mints URLs with :func:`blob_url` and executors use them as they
are. docs/protocol.md ("The HTTP face") is the contract: URLs, headers, the string signed.

Layers, in h11's sans-IO spirit: :class:`HttpFace` turns an :class:`HttpRequest` into an
:class:`HttpResponse` through a table of routes keyed by the path's first segment (the seam for
``/metrics``); :class:`HttpConnection` is the thin I/O loop that feeds socket bytes to an
``h11.Connection`` and sends bodies with ``sendfile``. It runs under the BlobServer's accept
machinery, so HTTP and binary connections share ``max_connections``, the timeouts and the
graceful shutdown.

The part ``blobsvc/http/``: this module (URLs, routes, the HTTP connection loop) and what
the BlobServer and the agent share to serve connections: ``_slots`` (connection slots under
``max_connections``) and ``_observe`` (what request observers are told). May import
:mod:`blobsvc.storage` (the :class:`~blobsvc.storage.OpenBlob` it sends), :mod:`blobsvc.wire`,
config and exceptions; never the server or the agent, which it knows only as an
:class:`HttpHost`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TYPE_CHECKING, ClassVar, Protocol, cast
from urllib.parse import parse_qsl, quote, unquote, urlsplit

import h11

from .._exceptions import (
    DigestMismatch,
    InternalError,
    InvalidArgument,
    NotFound,
    NotLeader,
    RemoteProtocolError,
    TransportError,
    WriteTimeout,
)
from .._numbers import TooManyDigits, parse_decimal
from ..config import Settings
from ..wire._ids import JobLike, KeyLike, job_bytes, key_bytes
from ..wire._netio import SocketStream, body_deadline, header_deadline
from ..wire._protocol import MAGIC, ContentKey, JobBlob, name_error
from ._observe import ABORTED, RequestObserver, http_outcome, op_name
from ._slots import Connection, Slots

if TYPE_CHECKING:  # the files it sends are opened by its host: URLs alone (Spark, the driver) load no storage
    from ..storage import OpenBlob

__all__ = [
    "BlobOpener",
    "HttpConnection",
    "HttpError",
    "HttpFace",
    "HttpHost",
    "HttpRequest",
    "HttpResponse",
    "PYTHON_ROUTE",
    "blob_path",
    "blob_url",
    "parse_python_path",
    "python_path",
    "signed_url",
    "url_signature",
]

log = logging.getLogger("blobsvc.http")

# A request line plus headers larger than this is refused with 431, however TCP splits them.
# Fetchers send a few hundred bytes; 16 KiB is h11's own default and above nginx's usual 8 KiB.
MAX_HEADER_BYTES = 16 << 10
RECV_SIZE = 64 << 10


def bad_request_bytes(text: str) -> bytes:
    """A whole ``400 Bad Request`` that closes, for a peer that h11 never got to parse."""
    body = (text + "\n").encode()
    head = "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\n"
    return f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body


_PLAIN_AT_TLS = bad_request_bytes("this server requires TLS: use https://")
# What this face says to a binary client (its preamble): at once, rather than wait out
# io_timeout for a request line that never comes. The client recognises the HTTP reply.
_BINARY_AT_HTTP = (
    "this is blobsvc's HTTP port: binary clients (blobsvc get/put, BlobClient) use the binary protocol port"
)
# Bodies up to this size go out with their headers in one send; sendfile pays off above it.
INLINE_BODY_LIMIT = 64 << 10
# Prefixes the string a URL signature covers, so it can never be mistaken for another MAC
# made with the same secret (the binary AUTH signs a random 32-byte nonce).
SIGNATURE_CONTEXT = "blobsvc-url-v1"
DEFAULT_EXPIRES_IN = 3600.0

_READ_METHODS = ("GET", "HEAD")
_SIGNATURE = re.compile(r"[0-9a-fA-F]{64}")


# --- URLs and signatures ----------------------------------------------------------------


def _quote_part(part: str) -> str:
    # "." and ".." would be collapsed by URL normalisation in clients; encode them.
    if part in {".", ".."}:
        return part.replace(".", "%2E")
    return quote(part, safe="")


def blob_path(*, key: KeyLike | None = None, job: JobLike | None = None, name: str | None = None) -> str:
    """The canonical URL path of a blob: ``key`` (with an optional download file ``name``), or
    ``job`` and ``name``. This path, not the request's spelling of it, is what is signed."""
    if key is not None and job is None:
        path = f"/blobs/{key_bytes(key).hex()}"
        if name is None:
            return path
    elif key is None and job is not None and name is not None:
        path = f"/jobs/{job_bytes(job).hex()}"
    else:
        raise InvalidArgument("name the blob with key= (and optionally name=), or with job= and name=")
    problem = name_error(name.encode("utf-8", "surrogatepass"))
    if problem:
        raise InvalidArgument(problem)
    return path + "/" + "/".join(_quote_part(part) for part in name.split("/"))


def url_signature(secret: bytes, path: str, expires: int) -> str:
    """Hex HMAC-SHA256 under ``secret`` of ``"blobsvc-url-v1\\n<path>\\n<expires>"``."""
    message = f"{SIGNATURE_CONTEXT}\n{path}\n{expires}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def blob_url(
    base_url: str,
    *,
    key: KeyLike | None = None,
    job: JobLike | None = None,
    name: str | None = None,
    secret: bytes | str | None = None,
    expires_in: float = DEFAULT_EXPIRES_IN,
) -> str:
    """An HTTP URL of a blob on the server whose HTTP face is at ``base_url``
    (``http://host:port``), signed to stay valid ``expires_in`` seconds when ``secret`` is given.

    ``blob_url(base, job=job, name="lib/udfs.jar", secret=secret)`` gives
    ``http://host:port/jobs/<job>/lib/udfs.jar?expires=…&signature=…``; ``key=`` names content
    (``name=`` then only sets the file name the URL ends with). Pass the server's shared secret
    (``Settings.secret()``) when it requires auth; without one the URL carries no signature.
    Surrounding whitespace is dropped, as the server drops it when it reads its secret file, so
    the contents of that file (trailing newline and all) sign as the server checks.
    """
    return signed_url(base_url, blob_path(key=key, job=job, name=name), secret, expires_in)


# The launcher of a Python environment an agent unpacked (blobsvc.agent._python). Both names end
# up as file names (Spark names a fetched file after the URL's last segment): plain names only,
# which need no percent-encoding, so the path signed is the path requested.
PYTHON_ROUTE = "python"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}")


def python_path(key: KeyLike, archive: str, launcher: str) -> str:
    """The canonical path of the launcher of environment ``key`` (an archive named ``archive``;
    the agent tells its kind by the name's suffix)."""
    for what, name in (("archive", archive), ("launcher", launcher)):
        if not _PLAIN_NAME.fullmatch(name):
            raise InvalidArgument(f"the {what} name {name!r} is not a plain file name (letters, digits, '._+-')")
    return f"/{PYTHON_ROUTE}/{key_bytes(key).hex()}/{archive}/{launcher}"


def parse_python_path(path: str) -> tuple[bytes, str, str]:
    """The key, archive name and launcher name of a launcher URL's path; ValueError if it is none."""
    parts = path.split("/")
    if len(parts) != 5 or parts[1] != PYTHON_ROUTE:
        raise ValueError(f"expected /{PYTHON_ROUTE}/<key hex>/<archive file name>/<launcher name>")
    key, archive, launcher = parts[2:]
    python_path(key, archive, launcher)  # InvalidArgument (a ValueError) for a bad key or name
    return key_bytes(key), archive, launcher


def signed_url(base_url: str, path: str, secret: bytes | str | None, expires_in: float = DEFAULT_EXPIRES_IN) -> str:
    """``base_url`` + the canonical ``path``, signed as :func:`blob_url` signs (for any route
    that checks :meth:`HttpFace.authorise`)."""
    url = base_url.rstrip("/") + path
    if secret is None:
        return url
    if isinstance(secret, str):
        secret = secret.encode()
    secret = secret.strip()
    expires = int(time.time() + expires_in)
    return f"{url}?expires={expires}&signature={url_signature(secret, path, expires)}"


# --- requests, responses, routes --------------------------------------------------------


@dataclass(frozen=True)
class HttpRequest:
    """What a route sees of a request: the method, the percent-encoded path, the query, and
    the headers by lower-case name (repeated headers joined with ``", "``)."""

    method: str
    path: str
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_h11(cls, event: h11.Request) -> HttpRequest:
        target = urlsplit(event.target.decode("latin-1"))
        headers: dict[str, str] = {}
        for name, value in event.headers:
            key = name.decode("latin-1")
            text = value.decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        return cls(event.method.decode("latin-1"), target.path, dict(parse_qsl(target.query)), headers)


@dataclass
class HttpResponse:
    """A status, headers, and a body: ``body`` bytes, or ``count`` bytes of ``file`` from
    ``offset``. The response owns ``file`` and closes it once sent (or dropped)."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""
    file: OpenBlob | None = None
    offset: int = 0
    count: int = 0

    @property
    def content_length(self) -> int:
        return self.count if self.file is not None else len(self.body)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


class HttpError(Exception):
    """A refusal whose status its raiser chooses, such as an agent's 502 when its server cannot
    be reached: answered as ``status`` with the message as a one-line body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def text_response(status: int, message: str, headers: list[tuple[str, str]] | None = None) -> HttpResponse:
    """A short plain-text answer, as every error gets."""
    headers = [("Content-Type", "text/plain; charset=utf-8"), *(headers or [])]
    return HttpResponse(status, headers, (message + "\n").encode())


Route = Callable[[HttpRequest], Awaitable[HttpResponse]]


BlobOpener = Callable[[ContentKey | JobBlob], Awaitable["OpenBlob"]]


class HttpFace:
    """Requests to responses for one server or agent: ``routes`` maps a path's first segment
    to the coroutine that answers it (``"blobs"``, ``"jobs"``; ``/metrics`` goes in here too).
    A route checks its own authorisation; the blob routes require a signed URL when there is
    a secret. ``open_blob`` finds a blob's bytes: the server's storage (refusing on an HA
    standby, recovering from the HA store), or an agent's host cache."""

    def __init__(self, open_blob: BlobOpener, secret: bytes | None) -> None:
        self.secret = secret
        self._open_blob = open_blob
        self.routes: dict[str, Route] = {"blobs": self._blob, "jobs": self._blob}

    async def respond(self, request: HttpRequest) -> HttpResponse:
        if request.method not in _READ_METHODS:
            return text_response(405, f"{request.method} is not allowed: this face is read-only (GET, HEAD)",
                                 [("Allow", "GET, HEAD")])  # fmt: skip
        route = self.routes.get(request.path.split("/", 2)[1] if request.path.startswith("/") else "")
        if route is None:
            return text_response(404, "nothing here: blobs are at /blobs/<key> and /jobs/<job>/<name>")
        try:
            return await route(request)
        except HttpError as exc:
            return text_response(exc.status, str(exc))
        except NotFound as exc:
            return text_response(404, str(exc))
        except InternalError as exc:
            return text_response(500, str(exc))
        except NotLeader as exc:
            return text_response(503, str(exc))
        except DigestMismatch as exc:  # a damaged HA copy, never served
            return text_response(500, str(exc))

    def authorise(self, path: str, query: Mapping[str, str]) -> HttpResponse | None:
        """The 403 for a request of the canonical ``path`` that its query does not authorise
        (when there is a secret), or None to go on: the rule of every route but /metrics."""
        if self.secret is None:
            return None
        problem = _signature_problem(self.secret, path, query)
        return None if problem is None else text_response(403, problem)

    async def _blob(self, request: HttpRequest) -> HttpResponse:
        try:
            target, path = _parse_blob_path(request.path)
        except ValueError as exc:
            return text_response(400, f"not a blob URL: {exc}")
        refused = self.authorise(path, request.query)
        if refused is not None:
            return refused
        blob = await self._open_blob(target)
        try:
            return _blob_response(request, blob)
        except BaseException:
            blob.close()
            raise


def _parse_blob_path(path: str) -> tuple[ContentKey | JobBlob, str]:
    """The blob a URL path names, and its canonical path (what a signature covers)."""
    parts = path.split("/")
    if len(parts) >= 3 and parts[1] == "blobs":
        name = _unquote_name(parts[3:]) if len(parts) > 3 else None
        key = key_bytes(parts[2])
        return ContentKey(key), blob_path(key=key, name=name)
    if len(parts) >= 4 and parts[1] == "jobs":
        job, name = job_bytes(parts[2]), _unquote_name(parts[3:])
        return JobBlob(job, name), blob_path(job=job, name=name)
    raise ValueError("expected /blobs/<key hex> or /jobs/<job hex>/<name>")


def _unquote_name(parts: list[str]) -> str:
    try:
        return "/".join(unquote(part, errors="strict") for part in parts)
    except UnicodeDecodeError:
        raise ValueError("the name is not percent-encoded UTF-8") from None


def _signature_problem(secret: bytes, path: str, query: Mapping[str, str]) -> str | None:
    """Why the query does not authorise reading ``path``, or None when it does."""
    expires, signature = query.get("expires"), query.get("signature")
    if expires is None or signature is None:
        return "this server requires a signed URL (?expires=…&signature=…); mint one with `blobsvc url`"
    try:
        expiry = parse_decimal(expires, "expires")
    except ValueError:
        expiry = None
    if expiry is None or not _SIGNATURE.fullmatch(signature):
        return "malformed signed URL: expires is unix seconds, signature 64 hex digits"
    if not hmac.compare_digest(url_signature(secret, path, expiry), signature.lower()):
        return "bad signature: the URL was altered or signed with another secret"
    if expiry < time.time():
        return f"the signed URL expired at {expiry} (unix time); mint a new one"
    return None


def _blob_response(request: HttpRequest, blob: OpenBlob) -> HttpResponse:
    """The answer for an open blob: 200, 206, 304 or 416 (the file closed when unused)."""
    etag = f'"{blob.digest.hex()}"'
    headers = [("ETag", etag), ("Accept-Ranges", "bytes"), ("Content-Type", "application/octet-stream")]
    if _etag_matches(request.headers.get("if-none-match"), etag):
        blob.close()
        return HttpResponse(304, headers[:1])
    wanted = request.headers.get("range")
    if_range = request.headers.get("if-range")
    if wanted is None or (if_range is not None and if_range.strip() != etag):
        return HttpResponse(200, headers, file=blob, count=blob.size)
    try:
        span = parse_range(wanted, blob.size)
    except TooManyDigits as exc:  # past the end of any blob, whichever end it is
        span, problem = range(0), f"Range: {exc}"
    else:
        problem = f"range {wanted!r} is outside the {blob.size}-byte blob"
    if span is None:
        return HttpResponse(200, headers, file=blob, count=blob.size)
    if not span:
        blob.close()
        return text_response(416, problem, [("Content-Range", f"bytes */{blob.size}")])
    headers.append(("Content-Range", f"bytes {span.start}-{span.stop - 1}/{blob.size}"))
    return HttpResponse(206, headers, file=blob, offset=span.start, count=len(span))


def _etag_matches(header: str | None, etag: str) -> bool:
    """If-None-Match's weak comparison: ``*`` or any listed tag, ``W/`` or not."""
    if header is None:
        return False
    tags = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    return "*" in tags or etag in tags


_RANGE = re.compile(r"\s*bytes\s*=\s*([0-9]*)\s*-\s*([0-9]*)\s*")


def parse_range(header: str, size: int) -> range | None:
    """The byte offsets a ``Range`` header asks of a ``size``-byte blob; an empty range when
    unsatisfiable (416); None to ignore the header and send everything (another unit, a
    malformed header, or several ranges, which RFC 9110 lets a server answer whole).
    :class:`~blobsvc._numbers.TooManyDigits` for a number longer than any blob's size."""
    match = _RANGE.fullmatch(header)
    if match is None or match[1] == match[2] == "":
        return None
    first, last = (parse_decimal(text, "a Range position") if text else None for text in match.groups())
    if first is None:  # "-n": the last n bytes
        assert last is not None
        return range(max(size - last, 0), size if last else 0)
    if last is not None and last < first:
        return None
    return range(first, size if last is None else min(last + 1, size))


# --- the connection ---------------------------------------------------------------------


class _BodySegment:
    """Stands for ``count`` file bytes in h11's Data event: h11 counts them against
    Content-Length and hands the object back, and we send the bytes with sendfile."""

    def __init__(self, count: int) -> None:
        self.count = count

    def __len__(self) -> int:
        return self.count


class HttpHost(Protocol):
    """What an HTTP connection needs of the server or agent it answers for."""

    settings: Settings  # idle_timeout, io_timeout, max_connections
    slots: Slots  # shared with the host's other connections, under max_connections
    http: HttpFace
    requests: Counter[str]  # requests served, by kind
    observers: list[RequestObserver]  # metrics, request logs


class HttpConnection(Connection):
    """One HTTP/1.1 connection's loop: read a request, answer it, keep alive or close."""

    log: ClassVar[logging.Logger] = log

    def __init__(self, host: HttpHost, stream: SocketStream) -> None:
        super().__init__(host.slots, stream)  # HTTP and binary connections share max_connections
        self.host = host
        self.settings = host.settings
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEADER_BYTES)
        self._header_deadline: float | None = None  # when the request header being read must be whole
        self._head_bytes = 0  # the size of the last request line and headers read
        self._first_bytes = True

    async def _fail(self, exc: Exception) -> None:
        if isinstance(exc, RemoteProtocolError):  # plain HTTP at a TLS port: h11 has not begun
            log.info("%s: %s", self.stream.peer, exc)
            with contextlib.suppress(TransportError):
                await self.stream.send_all(_PLAIN_AT_TLS, self.settings.io_timeout)
                await self.stream.linger_close()
            return
        log.exception("%s: internal error", self.stream.peer, exc_info=exc)
        with contextlib.suppress(TransportError, h11.LocalProtocolError):
            await self._send_response(text_response(500, "internal server error"), head=False, close=True)

    async def _serve(self) -> None:
        first = True
        while True:
            try:
                event = await self._next_event()
            except h11.RemoteProtocolError as exc:
                log.info("%s: bad HTTP request: %s", self.stream.peer, exc)
                status = exc.error_status_hint
                message = "request header too large" if status == 431 else f"bad request: {exc}"
                await self._refuse(text_response(status, message))
                return
            if not isinstance(event, h11.Request):  # the client hung up between requests
                return
            self.busy = True
            head = event.method == b"HEAD"
            if self._head_bytes > MAX_HEADER_BYTES:  # arrived whole, so h11's own cap never saw it
                log.info("%s: request header of %d bytes refused", self.stream.peer, self._head_bytes)
                await self._refuse(text_response(431, "request header too large"), head=head)
                return
            request = HttpRequest.from_h11(event)
            self.host.requests[op_name(request)] += 1
            if first and not self.slots.admit(self):
                limit = self.settings.max_connections
                message = f"busy: at its limit of {limit} connections"
                await self._refuse(text_response(503, message), head=head)
                return
            first = False
            # A request body (a PUT, say) is never read: answer, then close instead of draining it.
            # A write method is refused and closed even without one, as docs/protocol.md says.
            body_follows = not self._request_ended()
            close = body_follows or request.method not in _READ_METHODS or self.slots.closing
            began = time.perf_counter()
            response = await self.host.http.respond(request)
            outcome, sent = http_outcome(response.status), 0 if head else response.content_length
            try:
                if body_follows:
                    await self._refuse(response, head=head)
                    return
                await self._send_response(response, head=head, close=close)
            except BaseException:
                outcome, sent = ABORTED, 0
                raise
            finally:
                for observe in self.host.observers:  # metrics, request logs
                    observe(request, outcome, sent, time.perf_counter() - began, self.stream)
            self._request_done()
            if close or self.slots.closing or self.h11.our_state is not h11.DONE:
                return
            self.h11.start_next_cycle()

    def _request_ended(self) -> bool:
        """Whether the request just read has no body (its end is already buffered)."""
        try:
            return isinstance(self.h11.next_event(), h11.EndOfMessage)
        except h11.RemoteProtocolError:
            return False

    async def _next_event(self) -> h11.Event | type[h11.PAUSED] | type[h11.NEED_DATA]:
        while True:
            # h11 caps only an incomplete header; what a whole one took is measured here, as
            # the bytes its parsing consumed from h11's buffer.
            buffered = len(self.h11.trailing_data[0])
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                self._header_deadline = None
                self._head_bytes = buffered - len(self.h11.trailing_data[0])
                return event
            between_requests = self.h11.their_state is h11.IDLE and not self.h11.trailing_data[0]
            timeout = self.settings.idle_timeout if between_requests else self.settings.io_timeout
            if not between_requests and self._header_deadline is None:
                self._header_deadline = self._loop.time() + self.settings.io_timeout
            async with header_deadline(self._header_deadline, self.settings.io_timeout):
                data = await self.stream.recv(RECV_SIZE, timeout)
            if self._first_bytes:
                self._first_bytes = False
                if data.startswith(MAGIC):
                    raise h11.RemoteProtocolError(_BINARY_AT_HTTP, error_status_hint=400)
            self.h11.receive_data(data)

    async def _refuse(self, response: HttpResponse, *, head: bool = False) -> None:
        """Answer and close gracefully, so that a client still sending reads our answer. The
        slot is given up first: a client draining out must not crowd out others. ``head``: the
        request was a HEAD, whose answer has no body (h11 refuses to send one)."""
        self._stop_counting()
        with contextlib.suppress(TransportError, h11.LocalProtocolError):
            await self._send_response(response, head=head, close=True)
            await self.stream.linger_close()

    async def _send_response(self, response: HttpResponse, *, head: bool, close: bool) -> None:
        try:
            headers = [*response.headers, ("Content-Length", str(response.content_length)), ("Server", "blobsvc")]
            if close:
                headers.append(("Connection", "close"))
            reason = HTTPStatus(response.status).phrase.encode()
            start = self.h11.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
            assert start is not None
            io_timeout = self.settings.io_timeout
            async with body_deadline(0 if head else response.content_length, io_timeout, WriteTimeout):
                if head or response.status == 304:
                    await self.stream.send_all(start, io_timeout)
                elif response.file is None:
                    await self.stream.send_all(start + self._data(response.body), io_timeout)
                else:
                    self._data(cast(bytes, _BodySegment(response.count)))
                    fd, offset, count = response.file.fd, response.offset, response.count
                    if count <= INLINE_BODY_LIMIT:
                        await self.stream.send_all(start + os.pread(fd, count, offset), io_timeout)
                    else:
                        await self.stream.send_all(start, io_timeout)
                        await self.stream.sendfile(fd, offset, count, io_timeout)
            self.h11.send(h11.EndOfMessage())
        finally:
            response.close()

    def _data(self, data: bytes) -> bytes:
        """Tell h11 the body is being sent; with Content-Length framing it comes back as is."""
        if not data:
            return b""
        (passed,) = self.h11.send_with_data_passthrough(h11.Data(data=data)) or [b""]
        return passed
