"""What a server tells its request observers (metrics, request logs), and how it is named.

An observer is called once per request after it ends, on the event loop, with the request
frame (or the HTTP face's ``HttpRequest``), its outcome (0 for OK, the error code answered, an
HTTP status of 400 or more, or :data:`ABORTED`), the body bytes it
moved, its duration in seconds and the connection's stream. It must be quick and must not
raise: it runs on the small-request path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, get_args

from .._exceptions import ERRORS
from ..wire._netio import SocketStream
from ..wire._protocol import Request

__all__ = ["ABORTED", "HTTP_OPS", "RequestObserver", "http_outcome", "op_name", "op_names", "outcome_name"]

ABORTED = -1
"""The outcome of a request that ended without an answer: the peer went away, a timeout, shutdown."""

RequestObserver = Callable[[Any, int, int, float, SocketStream], None]


def _spec_name(cls: type) -> str:
    """``NotFound`` → ``NOT_FOUND``, ``InternalError`` → ``INTERNAL``: the protocol's names."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__.removesuffix("Error")).upper()


_OUTCOMES: dict[int, str] = {0: "ok", ABORTED: "aborted", **{code: _spec_name(cls) for code, cls in ERRORS.items()}}


def outcome_name(outcome: int) -> str:
    """``ok``, ``aborted``, or the error code's name (``NOT_FOUND``)."""
    return _OUTCOMES.get(outcome) or str(outcome)


_OPS: dict[type, str] = {}
HTTP_OPS = ("HTTP_GET", "HTTP_HEAD", "HTTP_OTHER")
"""The HTTP face's ops: its read methods, and every other method (answered 405) as one, so
that a client making up methods cannot make up metric labels and counters without end."""


def _request_op(kind: type) -> str:
    return kind.__name__.removesuffix("Request").upper()


def op_name(event: Any) -> str:
    """The operation a request asks for: ``GetRequest`` → ``GET``; an HTTP request of the
    HTTP face (``HttpRequest``) → one of :data:`HTTP_OPS`."""
    kind = type(event)
    name = _OPS.get(kind)
    if name is None:
        name = _OPS[kind] = _request_op(kind)
    if name != "HTTP":
        return name
    op = f"HTTP_{event.method}"
    return op if op in HTTP_OPS else "HTTP_OTHER"


def op_names() -> list[str]:
    """Every op a request is counted under (metrics, request logs, STATUS's ``requests``): the
    binary protocol's requests, then the HTTP face's."""
    return [_request_op(kind) for kind in get_args(Request)] + list(HTTP_OPS)


def http_outcome(status: int) -> int:
    """The outcome of an HTTP answer: 0 (``ok``) below 400, else the status (``404``)."""
    return 0 if status < 400 else status
