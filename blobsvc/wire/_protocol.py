"""The blobsvc wire protocol, version 1, as pure state machines over bytes (sans-IO).

``docs/protocol.md`` is the contract; this module is its only implementation. Nothing here
reads or writes a socket, so every rule can be tested on bytes alone and the server and
client stay thin I/O loops around two objects:

* :class:`ServerConnection` parses what a client sends (preamble, requests, PUT bodies and
  trailers) and encodes the server's replies.
* :class:`ClientConnection` encodes requests and parses the replies, matching each to the
  request it answers (requests may be pipelined).

Both follow h11's three calls: ``receive_data(data)`` only buffers (``b""`` means the peer
closed), ``next_event()`` returns the next frame or :data:`NEED_DATA` / :data:`CLOSED`, and
``send(frame)`` returns the bytes to write. A peer that breaks the contract raises
:class:`RemoteProtocolError` carrying the error code to answer with; asking this side to send
something invalid raises :class:`LocalProtocolError`.

Bodies (PUT uploads and GET downloads) come out as :class:`Data` frames whose total length
is the one the header announced, so neither side ever buffers a whole blob here.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import re
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from .._exceptions import (
    ERRORS,
    ConnectionClosed,
    InvalidArgument,
    LocalProtocolError,
    ProtocolError,
    RemoteProtocolError,
    UnsupportedVersion,
)
from .._numbers import TooManyDigits, json_int

__all__ = [
    "CLOSED",
    "FLAG_AUTH_REQUIRED",
    "JOB_SIZE",
    "KEY_SIZE",
    "MAC_SIZE",
    "MAGIC",
    "MAX_CHECKPOINTS_REPLY_BYTES",
    "MAX_CHECKPOINTS_REQUEST_BYTES",
    "MAX_ERROR_MESSAGE",
    "MAX_HEARTBEAT_BYTES",
    "MAX_HOSTS_BYTES",
    "MAX_LIST_ENTRIES",
    "MAX_NAME_BYTES",
    "MAX_STATUS_BYTES",
    "NEED_DATA",
    "NONCE_SIZE",
    "VERSION",
    "Addressing",
    "AuthOk",
    "AuthRequest",
    "CheckpointsOk",
    "CheckpointsRequest",
    "ClientConnection",
    "ContentKey",
    "Data",
    "DeleteOk",
    "DeleteRequest",
    "EndOfBody",
    "ErrorFrame",
    "GetOk",
    "GetRequest",
    "HeartbeatOk",
    "HeartbeatRequest",
    "HostsOk",
    "HostsRequest",
    "Hello",
    "JobBlob",
    "LinkOk",
    "LinkRequest",
    "ListEntry",
    "ListOk",
    "ListRequest",
    "Op",
    "PutOk",
    "PutRequest",
    "PutTrailer",
    "ServerConnection",
    "ServerHello",
    "Signal",
    "StatOk",
    "StatRequest",
    "StatusOk",
    "StatusRequest",
    "WholeJob",
]

MAGIC = b"BLOB"
VERSION = 1
FLAG_AUTH_REQUIRED = 0x01
KEY_SIZE = 32  # BLAKE3's default output: 256 bits
JOB_SIZE = 16
NONCE_SIZE = 32
MAC_SIZE = 32  # HMAC-SHA256
MAX_NAME_BYTES = 255  # one filename's worth on every common filesystem, like Flink's limit
# Server messages are one line; a client refuses to buffer an "error" the size of a blob.
MAX_ERROR_MESSAGE = 64 * 1024
# A LIST answer is buffered whole; a million entries is ~300 MB at most and far beyond any job.
MAX_LIST_ENTRIES = 1_000_000
# What a peer on the wrong port of a server says first: an HTTP reply's status line (a binary
# client at the HTTP face, or at any HTTP server), or an HTTP request line (curl at the
# binary port). Neither can begin the binary preamble.
HTTP_REPLY = b"HTTP/"
# How much of an HTTP answer in place of the server's preamble is read to tell whose it is.
MAX_HTTP_HEAD = 8 << 10
_HTTP_REQUEST = re.compile(rb"[A-Z]{3,7} [/*h]")
# A STATUS document is a few hundred bytes of counters, and HA adds a few fields: a megabyte
# is far more than it needs, and a client never buffers a "status" the size of a blob. Every
# cache asks it once, so it stays small: the hosts' list has a request of its own.
MAX_STATUS_BYTES = 1 << 20
# A HOSTS document lists the hosts reporting to the server (blobsvc.server.hosts): at most ~900
# bytes each, for at most 10,000 of them; 16 MiB holds them all. Operators ask for it.
MAX_HOSTS_BYTES = 16 << 20
# A heartbeat is a few hundred bytes of an agent's counters plus the jobs it holds, 35 bytes
# each: 64 KiB lists some 1,800 jobs, far more than one host runs at once. It is the largest
# frame the server buffers (every other request is a header of at most 307 bytes), so it is
# kept small: the server holds at most this much per connection for it. The reply names a
# subset of those jobs and is bounded the same way.
MAX_HEARTBEAT_BYTES = 64 << 10
# A CHECKPOINTS request names a pipeline, an action and a few numbers; a checkpoint's handles
# travel as a blob, never in it. 64 KiB, like a heartbeat: the server buffers it whole. Its
# answer lists a pipeline's completed checkpoints, a few hundred bytes each: 4 MiB holds some
# 15,000 of them (savepoints are never subsumed, so a pipeline may keep many).
MAX_CHECKPOINTS_REQUEST_BYTES = 64 << 10
MAX_CHECKPOINTS_REPLY_BYTES = 4 << 20

_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_ERROR_HEADER = struct.Struct("<BHI")
_SIZE_DIGEST = struct.Struct(f"<Q{KEY_SIZE}s")
_STATUS_OK = 0x00
_STATUS_ERROR = 0x01


class Op(enum.IntEnum):
    PUT = 0x00
    GET = 0x01
    DELETE = 0x02
    STAT = 0x03
    LIST = 0x04
    LINK = 0x05
    STATUS = 0x06
    HEARTBEAT = 0x07
    HOSTS = 0x08
    CHECKPOINTS = 0x09
    AUTH = 0x7F


class Addressing(enum.IntEnum):
    CONTENT = 0x00
    JOB = 0x01
    JOB_ALL = 0x02


class Signal(enum.Enum):
    NEED_DATA = "NEED_DATA"
    CLOSED = "CLOSED"

    def __repr__(self) -> str:
        return self.value


NEED_DATA = Signal.NEED_DATA
"""``next_event()``: no complete frame is buffered yet; feed more bytes."""
CLOSED = Signal.CLOSED
"""``next_event()``: the peer closed the connection cleanly, between frames."""


# --- addressing -------------------------------------------------------------------------


def _check_key(key: bytes) -> None:
    if len(key) != KEY_SIZE:
        raise InvalidArgument(f"a key is {KEY_SIZE} bytes, not {len(key)}")


def _check_job(job: bytes) -> None:
    if len(job) != JOB_SIZE:
        raise InvalidArgument(f"a job id is {JOB_SIZE} bytes, not {len(job)}")


def name_error(raw: bytes) -> str | None:
    """Why ``raw`` is not a valid encoded blob name, or None when it is."""
    if not 1 <= len(raw) <= MAX_NAME_BYTES:
        return f"a name is 1 to {MAX_NAME_BYTES} bytes of UTF-8, not {len(raw)}"
    if b"\x00" in raw:
        return "a name may not contain NUL"
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return "a name must be valid UTF-8"
    return None


@dataclass(frozen=True, slots=True)
class ContentKey:
    """A content-addressed blob: its key is the BLAKE3 digest of its bytes."""

    key: bytes

    def __post_init__(self) -> None:
        _check_key(self.key)


@dataclass(frozen=True, slots=True)
class JobBlob:
    """A named blob that belongs to one job."""

    job: bytes
    name: str

    def __post_init__(self) -> None:
        _check_job(self.job)
        problem = name_error(self.name.encode("utf-8", "surrogatepass"))
        if problem:
            raise InvalidArgument(problem)


@dataclass(frozen=True, slots=True)
class WholeJob:
    """Every blob of one job (DELETE and LIST only)."""

    job: bytes

    def __post_init__(self) -> None:
        _check_job(self.job)


Target = ContentKey | JobBlob | WholeJob


# --- frames -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hello:
    """The client's preamble."""

    version: int = VERSION


@dataclass(frozen=True, slots=True)
class ServerHello:
    """The server's preamble; ``nonce`` is present exactly when AUTH is required."""

    version: int = VERSION
    nonce: bytes | None = None

    def __post_init__(self) -> None:
        if self.nonce is not None and len(self.nonce) != NONCE_SIZE:
            raise LocalProtocolError(f"a nonce is {NONCE_SIZE} bytes")


@dataclass(frozen=True, slots=True)
class AuthRequest:
    mac: bytes

    def __post_init__(self) -> None:
        if len(self.mac) != MAC_SIZE:
            raise LocalProtocolError(f"an AUTH answer is {MAC_SIZE} bytes")

    @classmethod
    def answering(cls, secret: bytes, nonce: bytes) -> AuthRequest:
        """The AUTH that proves knowledge of ``secret`` for the server's ``nonce``."""
        return cls(hmac.new(secret, nonce, hashlib.sha256).digest())


@dataclass(frozen=True, slots=True)
class PutRequest:
    """The header of a PUT; ``length`` bytes of :class:`Data` and a :class:`PutTrailer` follow."""

    length: int
    target: JobBlob | None = None  # None: content-addressed, keyed by its digest

    def __post_init__(self) -> None:
        if not 0 <= self.length < 1 << 64:
            raise LocalProtocolError(f"a PUT length is a u64, not {self.length}")


@dataclass(frozen=True, slots=True)
class PutTrailer:
    """The BLAKE3 digest of the PUT body, sent after it."""

    digest: bytes

    def __post_init__(self) -> None:
        _check_key(self.digest)


@dataclass(frozen=True, slots=True)
class GetRequest:
    target: ContentKey | JobBlob
    offset: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.offset < 1 << 64:
            raise LocalProtocolError(f"a GET offset is a u64, not {self.offset}")


@dataclass(frozen=True, slots=True)
class DeleteRequest:
    target: Target


@dataclass(frozen=True, slots=True)
class StatRequest:
    target: ContentKey | JobBlob


@dataclass(frozen=True, slots=True)
class ListRequest:
    job: bytes

    def __post_init__(self) -> None:
        _check_job(self.job)


@dataclass(frozen=True, slots=True)
class LinkRequest:
    """Name content the server already holds (its key) under a job name, sending no bytes."""

    target: JobBlob
    key: bytes

    def __post_init__(self) -> None:
        _check_key(self.key)


@dataclass(frozen=True, slots=True)
class StatusRequest:
    """Ask for the server's status: version, uptime, role, what it stores and serves."""


@dataclass(frozen=True, slots=True)
class HostsRequest:
    """Ask which executor hosts' agents report to the server, live or lost."""


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """An executor host's agent reports itself: a JSON object (its address, cache figures,
    the jobs it holds), documented in docs/operating.md, not fixed by the protocol."""

    report: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CheckpointsRequest:
    """A checkpoint coordinator's or operator's request about one pipeline's checkpoints: a
    JSON object with an ``action`` (register, trigger, complete, abort, list, delete, hold,
    release), documented in docs/protocol.md."""

    request: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Data:
    """A piece of a PUT or GET body."""

    data: bytes | bytearray | memoryview


@dataclass(frozen=True, slots=True)
class EndOfBody:
    """The last byte of a GET body has arrived."""


@dataclass(frozen=True, slots=True)
class AuthOk:
    pass


@dataclass(frozen=True, slots=True)
class PutOk:
    key: bytes


@dataclass(frozen=True, slots=True)
class GetOk:
    """A GET's header: the whole blob's size and digest; ``size - offset`` body bytes follow."""

    size: int
    digest: bytes
    offset: int = 0


@dataclass(frozen=True, slots=True)
class DeleteOk:
    pass


@dataclass(frozen=True, slots=True)
class StatOk:
    size: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class LinkOk:
    """The job name now holds the content: its size and digest, as STAT would answer."""

    size: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ListEntry:
    name: str
    size: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class ListOk:
    entries: tuple[ListEntry, ...]


@dataclass(frozen=True, slots=True)
class StatusOk:
    """The server's status as a JSON object: its fields are documented, not fixed by the
    protocol, so that a server may add some (HA's role and leader) without a new version."""

    status: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HostsOk:
    """The hosts as a JSON object, ``{"hosts": [...]}``: fields documented, not fixed."""

    hosts: dict[str, Any]


@dataclass(frozen=True, slots=True)
class HeartbeatOk:
    """The server's answer to a heartbeat as a JSON object: when to send the next one, and
    which of the agent's jobs are gone."""

    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CheckpointsOk:
    """The answer to a CHECKPOINTS request as a JSON object (docs/protocol.md)."""

    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ErrorFrame:
    code: int
    message: str = ""

    @property
    def keeps_connection(self) -> bool:
        cls = ERRORS.get(self.code)
        return cls is not None and cls.keeps_connection


Request = (
    AuthRequest
    | PutRequest
    | GetRequest
    | DeleteRequest
    | StatRequest
    | ListRequest
    | StatusRequest
    | LinkRequest
    | HeartbeatRequest
    | HostsRequest
    | CheckpointsRequest
)
Reply = (
    AuthOk
    | PutOk
    | GetOk
    | DeleteOk
    | StatOk
    | ListOk
    | StatusOk
    | LinkOk
    | HeartbeatOk
    | HostsOk
    | CheckpointsOk
    | ErrorFrame
)
ServerEvent = Hello | Request | Data | PutTrailer
ClientEvent = ServerHello | Reply | Data | EndOfBody


# --- encoding ---------------------------------------------------------------------------


def _encode_target(target: Target) -> bytes:
    if isinstance(target, ContentKey):
        return bytes([Addressing.CONTENT]) + target.key
    if isinstance(target, JobBlob):
        raw = target.name.encode("utf-8")
        return bytes([Addressing.JOB]) + target.job + _U16.pack(len(raw)) + raw
    return bytes([Addressing.JOB_ALL]) + target.job


# STATUS, HEARTBEAT, HOSTS and CHECKPOINTS carry a JSON object behind a u32 length: (document kind, limit).
_STATUS_DOCUMENT = ("status", MAX_STATUS_BYTES)
_HEARTBEAT_DOCUMENT = ("heartbeat", MAX_HEARTBEAT_BYTES)
_HOSTS_DOCUMENT = ("hosts", MAX_HOSTS_BYTES)
_CHECKPOINTS_REQUEST = ("checkpoints request", MAX_CHECKPOINTS_REQUEST_BYTES)
_CHECKPOINTS_REPLY = ("checkpoints reply", MAX_CHECKPOINTS_REPLY_BYTES)
_DOCUMENT_REPLIES: dict[type, tuple[type[StatusOk | HeartbeatOk | HostsOk | CheckpointsOk], tuple[str, int]]] = {
    StatusRequest: (StatusOk, _STATUS_DOCUMENT),
    HeartbeatRequest: (HeartbeatOk, _HEARTBEAT_DOCUMENT),
    HostsRequest: (HostsOk, _HOSTS_DOCUMENT),
    CheckpointsRequest: (CheckpointsOk, _CHECKPOINTS_REPLY),
}


def _encode_document(document: dict[str, Any], kind: tuple[str, int]) -> bytes:
    """A u32 length and the compact UTF-8 JSON of ``document``, refused over its limit."""
    what, limit = kind
    try:
        raw = json.dumps(document, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:  # a value JSON cannot hold, a circular reference
        raise InvalidArgument(f"a {what} document must be plain JSON: {exc}") from None
    if len(raw) > limit:
        raise LocalProtocolError(f"a {what} document of {len(raw)} bytes is over the limit of {limit}")
    return _U32.pack(len(raw)) + raw


def encode_request(frame: Hello | Request | PutTrailer) -> bytes:
    """The bytes of a client frame (PUT bodies are sent as they are, not through here)."""
    match frame:
        case Hello(version):
            return MAGIC + bytes([version, 0])
        case AuthRequest(mac):
            return bytes([Op.AUTH]) + mac
        case PutRequest(length, None):
            return bytes([Op.PUT, Addressing.CONTENT]) + _U64.pack(length)
        case PutRequest(length, target):
            assert target is not None
            return bytes([Op.PUT]) + _encode_target(target) + _U64.pack(length)
        case PutTrailer(digest):
            return digest
        case GetRequest(target, offset):
            return bytes([Op.GET]) + _encode_target(target) + _U64.pack(offset)
        case DeleteRequest(target):
            return bytes([Op.DELETE]) + _encode_target(target)
        case StatRequest(target):
            return bytes([Op.STAT]) + _encode_target(target)
        case ListRequest(job):
            return bytes([Op.LIST]) + _encode_target(WholeJob(job))
        case StatusRequest():
            return bytes([Op.STATUS])
        case HostsRequest():
            return bytes([Op.HOSTS])
        case HeartbeatRequest(report):
            return bytes([Op.HEARTBEAT]) + _encode_document(report, _HEARTBEAT_DOCUMENT)
        case LinkRequest(target, key):
            return bytes([Op.LINK]) + _encode_target(target) + key
        case CheckpointsRequest(request):
            return bytes([Op.CHECKPOINTS]) + _encode_document(request, _CHECKPOINTS_REQUEST)
    raise LocalProtocolError(f"a client does not send {type(frame).__name__}")


def encode_reply(frame: ServerHello | Reply) -> bytes:
    """The bytes of a server frame (GET bodies follow a GetOk as they are)."""
    match frame:
        case ServerHello(version, None):
            return MAGIC + bytes([version, 0])
        case ServerHello(version, nonce):
            assert nonce is not None
            return MAGIC + bytes([version, FLAG_AUTH_REQUIRED]) + nonce
        case AuthOk() | DeleteOk():
            return b"\x00"
        case PutOk(key):
            return b"\x00" + key
        case GetOk(size, digest) | StatOk(size, digest) | LinkOk(size, digest):
            return b"\x00" + _SIZE_DIGEST.pack(size, digest)
        case ListOk(entries):
            parts = [b"\x00", _U32.pack(len(entries))]
            for entry in entries:
                raw = entry.name.encode("utf-8")
                parts += [_U16.pack(len(raw)), raw, _SIZE_DIGEST.pack(entry.size, entry.digest)]
            return b"".join(parts)
        case StatusOk(status):
            return b"\x00" + _encode_document(status, _STATUS_DOCUMENT)
        case HeartbeatOk(reply):
            return b"\x00" + _encode_document(reply, _HEARTBEAT_DOCUMENT)
        case HostsOk(hosts):
            return b"\x00" + _encode_document(hosts, _HOSTS_DOCUMENT)
        case CheckpointsOk(reply):
            return b"\x00" + _encode_document(reply, _CHECKPOINTS_REPLY)
        case ErrorFrame(code, message):
            raw = message.encode("utf-8", "replace")[:MAX_ERROR_MESSAGE]
            return _ERROR_HEADER.pack(_STATUS_ERROR, code, len(raw)) + raw
    raise LocalProtocolError(f"a server does not send {type(frame).__name__}")


# --- decoding ---------------------------------------------------------------------------


_T = TypeVar("_T")


class _Incomplete(Exception):
    """Raised inside a parse attempt when the buffer ends before the frame does."""


class _Cursor:
    """Reads fields from the front of a buffer without consuming it until a frame is whole."""

    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytearray) -> None:
        self.buf = buf
        self.pos = 0

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise _Incomplete
        out = bytes(self.buf[self.pos : end])
        self.pos = end
        return out

    def u8(self) -> int:
        if self.pos >= len(self.buf):
            raise _Incomplete
        self.pos += 1
        return self.buf[self.pos - 1]

    def unpack(self, fmt: struct.Struct) -> tuple[Any, ...]:
        return fmt.unpack(self.take(fmt.size))


def _read_name(cursor: _Cursor) -> str:
    (length,) = cursor.unpack(_U16)
    if not 1 <= length <= MAX_NAME_BYTES:
        raise RemoteProtocolError(f"a name is 1 to {MAX_NAME_BYTES} bytes, not {length}")
    raw = cursor.take(length)
    problem = name_error(raw)
    if problem:
        raise RemoteProtocolError(problem)
    return raw.decode("utf-8")


def _read_document(cursor: _Cursor, kind: tuple[str, int]) -> dict[str, Any]:
    """A u32 length and that many bytes of a UTF-8 JSON object; the length is refused over
    the kind's limit before a byte of the document is buffered."""
    what, limit = kind
    (length,) = cursor.unpack(_U32)
    if length > limit:
        raise RemoteProtocolError(f"a {what} document of {length} bytes is over the limit of {limit}")
    raw = cursor.take(length)
    try:
        document = json.loads(raw.decode("utf-8"), parse_int=json_int)
    except TooManyDigits as exc:
        raise RemoteProtocolError(f"the {what} document: {exc}") from None
    except (ValueError, RecursionError):  # also UnicodeDecodeError; RecursionError: "[[[[…"
        raise RemoteProtocolError(f"the {what} document is not UTF-8 JSON") from None
    if not isinstance(document, dict):
        raise RemoteProtocolError(f"the {what} document is not a JSON object")
    return document


def _read_target(cursor: _Cursor, op: Op, allowed: tuple[Addressing, ...]) -> Target | None:
    byte = cursor.u8()
    try:
        addressing = Addressing(byte)
    except ValueError:
        raise RemoteProtocolError(f"unknown addressing byte 0x{byte:02x}") from None
    if addressing not in allowed:
        raise RemoteProtocolError(f"{op.name} does not take addressing {addressing.name}")
    if addressing is Addressing.CONTENT:
        return None if op is Op.PUT else ContentKey(cursor.take(KEY_SIZE))
    job = cursor.take(JOB_SIZE)
    if addressing is Addressing.JOB:
        return JobBlob(job, _read_name(cursor))
    return WholeJob(job)


_SINGLE = (Addressing.CONTENT, Addressing.JOB)
_ANY = (Addressing.CONTENT, Addressing.JOB, Addressing.JOB_ALL)


def _read_request(cursor: _Cursor) -> Request:
    byte = cursor.u8()
    try:
        op = Op(byte)
    except ValueError:
        raise RemoteProtocolError(f"unknown opcode 0x{byte:02x}") from None
    if op is Op.AUTH:
        return AuthRequest(cursor.take(MAC_SIZE))
    if op is Op.STATUS:
        return StatusRequest()
    if op is Op.HOSTS:
        return HostsRequest()
    if op is Op.HEARTBEAT:
        return HeartbeatRequest(_read_document(cursor, _HEARTBEAT_DOCUMENT))
    if op is Op.CHECKPOINTS:
        return CheckpointsRequest(_read_document(cursor, _CHECKPOINTS_REQUEST))
    if op is Op.LIST:
        target = _read_target(cursor, op, (Addressing.JOB_ALL,))
        assert isinstance(target, WholeJob)
        return ListRequest(target.job)
    if op is Op.LINK:
        target = _read_target(cursor, op, (Addressing.JOB,))
        assert isinstance(target, JobBlob)
        return LinkRequest(target, cursor.take(KEY_SIZE))
    target = _read_target(cursor, op, _ANY if op is Op.DELETE else _SINGLE)
    if op is Op.PUT:
        assert not isinstance(target, ContentKey | WholeJob)
        return PutRequest(cursor.unpack(_U64)[0], target)
    assert target is not None
    if op is Op.DELETE:
        return DeleteRequest(target)
    assert not isinstance(target, WholeJob)
    if op is Op.GET:
        return GetRequest(target, cursor.unpack(_U64)[0])
    return StatRequest(target)


def _check_magic(buf: bytearray, error: type[ProtocolError]) -> None:
    seen = bytes(buf[: len(MAGIC)])
    if not MAGIC.startswith(seen):
        raise error(f"expected the preamble magic {MAGIC.decode()!r}, got {seen!r}")


class _Receiver:
    """The buffer and body accounting both roles share."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._eof = False
        self._body_left = 0
        # A received ``bytes`` that is body and nothing else is handed on as it is: large
        # transfers then cost no copy here.
        self._passthrough: bytes | None = None

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer bytes from the peer; ``b""`` means the peer closed its side."""
        if not data:
            self._eof = True
            return
        if self._eof:
            raise LocalProtocolError("data received after the end of the stream")
        if self._passthrough is not None:
            self._buf += self._passthrough
            self._passthrough = None
        if not self._buf and isinstance(data, bytes) and len(data) <= self._body_left:
            self._passthrough = data
        else:
            self._buf += data

    @property
    def trailing_data(self) -> tuple[bytes, bool]:
        """Bytes buffered but not yet parsed, and whether the peer has closed."""
        return (self._passthrough or b"") + bytes(self._buf), self._eof

    def _try(self, read: Callable[[_Cursor], _T]) -> _T | Signal:
        cursor = _Cursor(self._buf)
        try:
            frame = read(cursor)
        except _Incomplete:
            return NEED_DATA
        del self._buf[: cursor.pos]
        return frame

    def _next_body_chunk(self) -> Data | Signal:
        if self._passthrough is not None:
            chunk, self._passthrough = self._passthrough, None
            self._body_left -= len(chunk)
            return Data(chunk)
        n = min(len(self._buf), self._body_left)
        if n == 0:
            return NEED_DATA
        if n == len(self._buf):
            chunk = bytes(self._buf)
            self._buf.clear()
        else:
            chunk = bytes(self._buf[:n])
            del self._buf[:n]
        self._body_left -= n
        return Data(chunk)


class _ServerState(enum.Enum):
    HELLO = "HELLO"
    IDLE = "IDLE"
    BODY = "BODY"
    TRAILER = "TRAILER"


# A GET by content key is the same bytes every time a blob is asked for, a content PUT's
# header the same bytes for every blob of its length, and frames are immutable: the parsed
# frame is kept by its bytes, so a repeated one costs a lookup, not a parse. Bounded
# (emptied when full); shared by every connection, safe from any thread.
_GET_BY_KEY = bytes([Op.GET, Addressing.CONTENT])
_GET_BY_KEY_SIZE = len(_GET_BY_KEY) + KEY_SIZE + _U64.size
_PUT_BY_CONTENT = bytes([Op.PUT, Addressing.CONTENT])
_PUT_BY_CONTENT_SIZE = len(_PUT_BY_CONTENT) + _U64.size
_MAX_PARSED = 4096
_parsed: dict[bytes, Request] = {}


class ServerConnection(_Receiver):
    """The server's side of one connection: parses the client's frames.

    States: HELLO → IDLE ⇄ (BODY → TRAILER → IDLE for a PUT). A :class:`RemoteProtocolError`
    leaves the connection unusable; the server answers its ``code`` and closes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.state = _ServerState.HELLO

    @property
    def http_request(self) -> bool:
        """The client opened with an HTTP request line instead of the preamble (curl)."""
        return self.state is _ServerState.HELLO and _HTTP_REQUEST.match(self._buf) is not None

    @property
    def between_requests(self) -> bool:
        """No part of a request is buffered: the connection is idle."""
        return self.state is _ServerState.IDLE and not self._buf

    @property
    def body_remaining(self) -> int:
        """PUT body bytes still to come: the most a reader should fetch for this body."""
        return self._body_left if self.state is _ServerState.BODY else 0

    @property
    def body_buffered(self) -> bool:
        """The rest of the PUT body and its trailer are buffered: receiving them waits for
        nothing."""
        if self.state is not _ServerState.BODY:
            return False
        return len(self._passthrough or b"") + len(self._buf) >= self._body_left + KEY_SIZE

    def take_body(self) -> tuple[bytearray, bytes]:
        """The rest of the PUT body and its trailer's digest in one step, once both are
        buffered (:attr:`body_buffered`): what ``next_event`` would return as :class:`Data`
        frames and a :class:`PutTrailer`, without a frame (and a copy) per piece. The body
        is the caller's. :class:`LocalProtocolError` when they are not all buffered."""
        if not self.body_buffered:
            raise LocalProtocolError("a PUT body is taken whole only once it and its trailer are buffered")
        # Passed-through bytes are never more than the body left, so none are held now.
        assert self._passthrough is None
        buf, end = self._buf, self._body_left + KEY_SIZE
        digest = bytes(buf[self._body_left : end])
        if len(buf) == end:  # the common case: the buffer is this body, handed on as it is
            del buf[self._body_left :]
            body, self._buf = buf, bytearray()
        else:
            body = buf[: self._body_left]
            del buf[:end]
        self._body_left = 0
        self.state = _ServerState.IDLE
        return body, digest

    def next_event(self) -> ServerEvent | Signal:
        event = self._next()
        if event is NEED_DATA and self._eof:
            if self.state is _ServerState.IDLE and not self._buf:
                return CLOSED
            raise RemoteProtocolError(f"the client closed the connection mid-frame ({self.state.name})")
        return event

    def _next(self) -> ServerEvent | Signal:
        if self.state is _ServerState.HELLO:
            _check_magic(self._buf, RemoteProtocolError)
            if len(self._buf) < len(MAGIC) + 2:
                return NEED_DATA
            version, flags = self._buf[4], self._buf[5]
            if version != VERSION:
                raise RemoteProtocolError(
                    f"protocol version {version} is not supported; this server speaks {VERSION}",
                    code=UnsupportedVersion.code,
                )
            if flags:
                raise RemoteProtocolError(f"preamble flags must be 0, got 0x{flags:02x}")
            del self._buf[:6]
            self.state = _ServerState.IDLE
            return Hello(version)
        if self.state is _ServerState.BODY:
            if self._body_left == 0:
                self.state = _ServerState.TRAILER
                return self._next()
            return self._next_body_chunk()
        if self.state is _ServerState.TRAILER:
            if len(self._buf) < KEY_SIZE:
                return NEED_DATA
            digest = bytes(self._buf[:KEY_SIZE])
            del self._buf[:KEY_SIZE]
            self.state = _ServerState.IDLE
            return PutTrailer(digest)
        buf = self._buf
        if not buf:
            return NEED_DATA  # between requests, the common case: no parse attempt
        if buf.startswith(_GET_BY_KEY) and len(buf) >= _GET_BY_KEY_SIZE:
            return self._parsed_once(_GET_BY_KEY_SIZE)
        frame: Request | Signal
        if buf.startswith(_PUT_BY_CONTENT) and len(buf) >= _PUT_BY_CONTENT_SIZE:
            frame = self._parsed_once(_PUT_BY_CONTENT_SIZE)
        else:
            frame = self._try(_read_request)
        if isinstance(frame, PutRequest):
            self.state = _ServerState.BODY
            self._body_left = frame.length
        return frame

    def _parsed_once(self, size: int) -> Request:
        """The request of the first ``size`` bytes buffered (a whole frame), from ``_parsed``."""
        raw = bytes(self._buf[:size])
        frame = _parsed.get(raw)
        if frame is None:
            frame = _read_request(_Cursor(bytearray(raw)))
            if len(_parsed) >= _MAX_PARSED:
                _parsed.clear()
            _parsed[raw] = frame
        del self._buf[:size]
        return frame

    def send(self, frame: ServerHello | Reply) -> bytes:
        return encode_reply(frame)


class ClientConnection(_Receiver):
    """The client's side of one connection: encodes requests, parses the replies.

    Each request sent queues the kind of reply it expects, so requests may be pipelined; a
    PUT's body must be sent whole (``Data`` frames adding up to its length, then its
    ``PutTrailer``) before the next request. After an error frame whose code closes the
    connection, ``closed`` is true and nothing more may be sent. ``peer`` names the server
    in errors (``"host:port"``).
    """

    def __init__(self, peer: str = "the server") -> None:
        super().__init__()
        self.peer = peer
        self._expected: deque[Hello | Request] = deque()
        self._send_body_left: int | None = None
        self._get: GetOk | None = None
        self._list: list[ListEntry] | None = None
        self._list_left = 0
        self.closed = False
        self.server_hello: ServerHello | None = None

    @property
    def pending(self) -> int:
        """Requests sent whose replies have not been read."""
        return len(self._expected)

    def send(self, frame: Hello | Request | Data | PutTrailer) -> bytes | bytearray | memoryview:
        if self.closed:
            raise LocalProtocolError("the connection is closed")
        if isinstance(frame, Data):
            return self._send_body(frame)
        if isinstance(frame, PutTrailer):
            if self._send_body_left != 0:
                raise LocalProtocolError("PUT trailer sent before the whole body")
            self._send_body_left = None
            return encode_request(frame)
        if self._send_body_left is not None:
            raise LocalProtocolError("a PUT body must be finished before the next request")
        if isinstance(frame, Hello) != (self.server_hello is None and not self._expected):
            raise LocalProtocolError("the preamble is sent once, first")
        wire = encode_request(frame)  # first: a frame that cannot be sent leaves the connection as it was
        if isinstance(frame, PutRequest):
            self._send_body_left = frame.length
        self._expected.append(frame)
        return wire

    @property
    def body_unread(self) -> int:
        """GET body bytes neither buffered here nor handed out yet: what a caller may read
        from the socket itself, straight into its own buffer, once ``next_event`` returns
        NEED_DATA in the middle of a body (see :meth:`body_received`)."""
        if self._get is None:
            return 0
        return self._body_left - len(self._buf) - len(self._passthrough or b"")

    def body_received(self, count: int) -> None:
        """Account for ``count`` body bytes the caller read from the socket itself. Only
        with nothing buffered, so that the bytes cannot be out of order, and never past the
        body's end: the framing stays this object's to decide."""
        if self._get is None or self._buf or self._passthrough is not None:
            raise LocalProtocolError("body bytes may be read past the parser only mid-body with nothing buffered")
        if not 0 < count <= self._body_left:
            raise LocalProtocolError(f"{count} body bytes received with {self._body_left} left")
        self._body_left -= count

    def _send_body(self, frame: Data) -> bytes | bytearray | memoryview:
        self.body_sent(len(frame.data))
        return frame.data

    def body_sent(self, count: int) -> None:
        """Account for ``count`` PUT body bytes the caller sends itself (``os.sendfile``
        from a file) instead of through ``send(Data(...))``."""
        if self._send_body_left is None or count > self._send_body_left:
            raise LocalProtocolError("PUT body longer than its announced length")
        self._send_body_left -= count

    def next_event(self) -> ClientEvent | Signal:
        try:
            event = self._next()
        except RemoteProtocolError:
            self.closed = True
            raise
        if event is NEED_DATA and self._eof:
            self.closed = True
            if self._buf or self._expected:
                raise ConnectionClosed("the server closed the connection mid-reply")
            return CLOSED
        return event

    def _next(self) -> ClientEvent | Signal:
        if self._get is not None:
            if self._body_left == 0:
                self._get = None
                self._expected.popleft()
                return EndOfBody()
            return self._next_body_chunk()
        if self._list is not None:
            return self._next_list_entry()
        if not self._expected:
            if self._buf:
                raise RemoteProtocolError("the server sent bytes nobody asked for")
            return NEED_DATA
        request = self._expected[0]
        if isinstance(request, Hello):
            return self._read_server_hello()
        if not self._buf:
            return NEED_DATA
        status = self._buf[0]
        if status == _STATUS_ERROR:
            return self._read_error()
        if status != _STATUS_OK:
            raise RemoteProtocolError(f"unknown reply status 0x{status:02x}")
        return self._read_ok(request)

    def _read_server_hello(self) -> ServerHello | ErrorFrame | Signal:
        if self._buf[:1] == bytes([_STATUS_ERROR]):
            return self._read_error()  # BUSY, UNSUPPORTED_VERSION: refused at the door
        if self._buf and HTTP_REPLY.startswith(self._buf[: len(HTTP_REPLY)]):  # not a bare EOF
            head_end = self._buf.find(b"\r\n\r\n")
            if head_end < 0 and len(self._buf) < MAX_HTTP_HEAD and not self._eof:
                return NEED_DATA
            head = bytes(self._buf[: head_end if head_end >= 0 else MAX_HTTP_HEAD]).lower()
            if b"\r\nserver: blobsvc" in head:  # what blobsvc's HTTP faces answer a binary preamble
                raise RemoteProtocolError(
                    f"{self.peer} is a blobsvc HTTP face (a server's --http-port, or an agent), "
                    "not the binary protocol port"
                )
            raise RemoteProtocolError(f"{self.peer} answered HTTP: it is an HTTP server, not the binary protocol port")
        _check_magic(self._buf, RemoteProtocolError)
        if len(self._buf) < 6:
            return NEED_DATA
        version, flags = self._buf[4], self._buf[5]
        if version != VERSION:
            raise RemoteProtocolError(f"the server speaks protocol version {version}, not {VERSION}")
        nonce = None
        if flags & FLAG_AUTH_REQUIRED:
            if len(self._buf) < 6 + NONCE_SIZE:
                return NEED_DATA
            nonce = bytes(self._buf[6 : 6 + NONCE_SIZE])
        del self._buf[: 6 + (NONCE_SIZE if nonce else 0)]
        self._expected.popleft()
        self.server_hello = ServerHello(version, nonce)
        return self.server_hello

    def _read_error(self) -> ErrorFrame | Signal:
        if len(self._buf) < _ERROR_HEADER.size:
            return NEED_DATA
        _, code, length = _ERROR_HEADER.unpack_from(self._buf)
        if length > MAX_ERROR_MESSAGE:
            raise RemoteProtocolError(f"error message of {length} bytes is over the limit")
        end = _ERROR_HEADER.size + length
        if len(self._buf) < end:
            return NEED_DATA
        message = bytes(self._buf[_ERROR_HEADER.size : end]).decode("utf-8", "replace")
        del self._buf[:end]
        self._expected.popleft()
        frame = ErrorFrame(code, message)
        if not frame.keeps_connection:
            self.closed = True
        return frame

    def _read_ok(self, request: Hello | Request) -> ClientEvent | Signal:
        if isinstance(request, GetRequest | StatRequest | LinkRequest):
            if len(self._buf) < 1 + _SIZE_DIGEST.size:
                return NEED_DATA
            size, digest = _SIZE_DIGEST.unpack_from(self._buf, 1)
            del self._buf[: 1 + _SIZE_DIGEST.size]
            if isinstance(request, StatRequest):
                self._expected.popleft()
                return StatOk(size, digest)
            if isinstance(request, LinkRequest):
                self._expected.popleft()
                return LinkOk(size, digest)
            if request.offset > size:
                raise RemoteProtocolError(f"GET reply of size {size} for offset {request.offset}")
            self._get = GetOk(size, digest, request.offset)
            self._body_left = size - request.offset
            return self._get
        if isinstance(request, PutRequest):
            if len(self._buf) < 1 + KEY_SIZE:
                return NEED_DATA
            key = bytes(self._buf[1 : 1 + KEY_SIZE])
            del self._buf[: 1 + KEY_SIZE]
            self._expected.popleft()
            return PutOk(key)
        if isinstance(request, StatusRequest | HeartbeatRequest | HostsRequest | CheckpointsRequest):
            return self._read_document_reply(request)
        if isinstance(request, ListRequest):
            if len(self._buf) < 1 + _U32.size:
                return NEED_DATA
            (count,) = _U32.unpack_from(self._buf, 1)
            if count > MAX_LIST_ENTRIES:
                raise RemoteProtocolError(f"LIST of {count} entries is over the limit")
            del self._buf[: 1 + _U32.size]
            self._list, self._list_left = [], count
            return self._next_list_entry()
        del self._buf[:1]
        self._expected.popleft()
        return AuthOk() if isinstance(request, AuthRequest) else DeleteOk()

    def _read_document_reply(
        self, request: StatusRequest | HeartbeatRequest | HostsRequest | CheckpointsRequest
    ) -> StatusOk | HeartbeatOk | HostsOk | CheckpointsOk | Signal:
        frame, kind = _DOCUMENT_REPLIES[type(request)]
        document = self._try(lambda cursor: _read_ok_document(cursor, kind))
        if isinstance(document, Signal):
            return document
        self._expected.popleft()
        return frame(document)

    def _next_list_entry(self) -> ListOk | Signal:
        assert self._list is not None
        while self._list_left:
            entry = self._try(_read_list_entry)
            if isinstance(entry, Signal):
                return entry
            self._list.append(entry)
            self._list_left -= 1
        frame = ListOk(tuple(self._list))
        self._list = None
        self._expected.popleft()
        return frame


def _read_ok_document(cursor: _Cursor, kind: tuple[str, int]) -> dict[str, Any]:
    cursor.u8()  # the OK status, checked by the caller
    return _read_document(cursor, kind)


def _read_list_entry(cursor: _Cursor) -> ListEntry:
    name = _read_name(cursor)
    size, digest = cursor.unpack(_SIZE_DIGEST)
    return ListEntry(name, size, digest)
