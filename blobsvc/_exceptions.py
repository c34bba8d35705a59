"""Every error blobsvc raises, in one hierarchy.

    BlobError
    ├── ProtocolError                 a frame broke the wire contract
    │   ├── LocalProtocolError        ... and it was ours (a bug or a bad argument)
    │   │   └── InvalidArgument       a malformed key, job id, name or address (also a ValueError)
    │   │       └── InvalidArgumentType   an argument of a kind that does not fit there (also a TypeError)
    │   └── RemoteProtocolError       ... and it was the peer's
    ├── TransportError                the connection itself failed
    │   ├── ConnectError              could not connect (refused, unreachable, DNS)
    │   │   └── TLSError              the TLS handshake failed (certificate, host name, version)
    │   ├── ConnectionClosed          the peer closed or reset mid-exchange
    │   └── Timeout
    │       ├── ConnectTimeout
    │       ├── ReadTimeout
    │       └── WriteTimeout
    ├── ClientClosed                  a client used after close() (also a RuntimeError)
    ├── CheckpointError               a checkpoint could not be taken (blobsvc.checkpoints)
    │   ├── CheckpointAborted         ... it was aborted: declined, timed out, not fully acknowledged
    │   └── CheckpointFailuresExceeded  more checkpoints in a row failed than tolerated
    └── ServerError                   the server answered with an error frame
        ├── BadRequest                  1
        ├── NotFound                    2
        ├── DigestMismatch              3   (also: a GET whose bytes fail the client's check)
        ├── TooLarge                    4
        ├── AuthRequired                5
        ├── AuthFailed                  6
        ├── NotLeader                   7
        ├── Busy                        8
        ├── InsufficientStorage         9
        ├── UnsupportedVersion         10
        ├── InternalError              11
        ├── BadOffset                  12
        └── Fenced                     13   a checkpoint coordinator that a newer one replaced

``ERRORS`` maps each wire code to its class, as kazoo's exception registry does; the server
turns a raised ``ServerError`` into an error frame with ``.code`` and the client turns an
error frame back into the same class with :func:`error_for_code`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = [
    "ERRORS",
    "AuthFailed",
    "AuthRequired",
    "BadOffset",
    "BadRequest",
    "BlobError",
    "Busy",
    "CheckpointAborted",
    "CheckpointError",
    "CheckpointFailuresExceeded",
    "ClientClosed",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DigestMismatch",
    "Fenced",
    "InsufficientStorage",
    "InternalError",
    "InvalidArgument",
    "InvalidArgumentType",
    "LocalProtocolError",
    "NotFound",
    "NotLeader",
    "ProtocolError",
    "ReadTimeout",
    "RemoteProtocolError",
    "ServerError",
    "TLSError",
    "Timeout",
    "TooLarge",
    "TransportError",
    "UnsupportedVersion",
    "WriteTimeout",
    "error_for_code",
]


class BlobError(Exception):
    """Base class of every blobsvc error."""


class ProtocolError(BlobError):
    """A frame that breaks the wire contract."""


class LocalProtocolError(ProtocolError):
    """We were about to send a frame that breaks the contract: a bug or a bad argument."""


class InvalidArgument(LocalProtocolError, ValueError):
    """An argument blobsvc cannot use: a malformed key, job id, blob name or server address,
    or arguments that do not go together. A ``ValueError`` too, as Python code expects."""


class InvalidArgumentType(InvalidArgument, TypeError):
    """An argument of a kind blobsvc cannot take where it was given (a job id where a
    content key belongs). A ``TypeError`` too."""


class ClientClosed(BlobError, RuntimeError):
    """A client was used after it was closed."""


class CheckpointError(BlobError):
    """A checkpoint could not be taken or used (:mod:`blobsvc.checkpoints`)."""


class CheckpointAborted(CheckpointError):
    """A checkpoint was aborted and will never be visible: a task declined, it timed out, or
    its block ended before every task acknowledged. ``checkpoint_id`` says which."""

    def __init__(self, message: str, checkpoint_id: int | None = None) -> None:
        super().__init__(message)
        self.checkpoint_id = checkpoint_id


class CheckpointFailuresExceeded(CheckpointError):
    """More checkpoints failed in a row than the coordinator's ``tolerable_failures``: the
    pipeline should stop, as a Flink job fails."""


class RemoteProtocolError(ProtocolError):
    """The peer sent bytes that break the contract.

    ``code`` is the error code a server answers it with: BAD_REQUEST unless the parser knows
    better (UNSUPPORTED_VERSION for a preamble of another version).
    """

    def __init__(self, message: str, *, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


class TransportError(BlobError):
    """The connection failed underneath the protocol."""


class ConnectError(TransportError):
    """The server could not be reached. ``nobody_there`` is true when its name does not
    resolve or every address it resolves to refused the connection: an answer, not a
    transient fault, for a one-shot command (a long-lived client's server may be restarting).
    ``no_leader`` is true when a ``zk://`` address named no leader within ``connect_timeout``
    (ZooKeeper down, or no such cluster): a one-shot command has waited enough."""

    nobody_there: bool = False
    no_leader: bool = False


class TLSError(ConnectError):
    """The TLS handshake failed: an untrusted certificate, a host name it does not cover, no
    common protocol version, or one side without TLS. A retry cannot cure it."""


class ConnectionClosed(TransportError):
    """The peer closed or reset the connection in the middle of an exchange."""


class Timeout(TransportError):
    """An I/O step took longer than its timeout."""


class ConnectTimeout(Timeout):
    """Connecting took longer than its timeout."""


class ReadTimeout(Timeout):
    """Reading from the peer took longer than its timeout."""


class WriteTimeout(Timeout):
    """Writing to the peer took longer than its timeout."""


class ServerError(BlobError):
    """An error frame: the server refused or failed a request.

    ``code`` is the wire code; whether the connection stays usable afterwards is
    ``keeps_connection``, straight from the protocol's error table.
    """

    code: int = 0
    keeps_connection: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message or type(self).__name__


ERRORS: dict[int, type[ServerError]] = {}

_E = TypeVar("_E", bound=type[ServerError])


def _code(code: int, *, keeps_connection: bool = False) -> Callable[[_E], _E]:
    def register(cls: _E) -> _E:
        cls.code = code
        cls.keeps_connection = keeps_connection
        ERRORS[code] = cls
        return cls

    return register


@_code(1)
class BadRequest(ServerError):
    """Malformed frame, bad addressing or bad name."""


@_code(2, keeps_connection=True)
class NotFound(ServerError):
    """No blob under that key or name."""


@_code(3, keeps_connection=True)
class DigestMismatch(ServerError):
    """Bytes and digest disagree: on a PUT the server stored nothing; on a GET the client
    rejected what it received."""


@_code(4)
class TooLarge(ServerError):
    """The PUT length is over the server's maximum blob size."""


@_code(5)
class AuthRequired(ServerError):
    """The server requires AUTH before any other request."""


@_code(6)
class AuthFailed(ServerError):
    """The AUTH answer did not match the server's secret."""


@_code(7)
class NotLeader(ServerError):
    """This server is a standby; the message names the leader when it is known."""


@_code(8)
class Busy(ServerError):
    """The server is at its connection or load limit."""


@_code(9)
class InsufficientStorage(ServerError):
    """Disk or quota full; nothing was stored."""


@_code(10)
class UnsupportedVersion(ServerError):
    """The peer speaks a protocol version this side does not."""


@_code(11)
class InternalError(ServerError):
    """The server failed for a reason of its own."""


@_code(12, keeps_connection=True)
class BadOffset(ServerError):
    """A GET offset beyond the end of the blob."""


@_code(13, keeps_connection=True)
class Fenced(ServerError):
    """A checkpoint coordinator that a newer one of its pipeline replaced (a zombie driver):
    it may no longer complete, subsume or abort checkpoints."""


def error_for_code(code: int, message: str) -> ServerError:
    """The exception for an error frame; an unknown code is a protocol violation."""
    try:
        cls = ERRORS[code]
    except KeyError:
        raise RemoteProtocolError(f"unknown error code {code}: {message}") from None
    return cls(message)
