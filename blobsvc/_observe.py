"""What a server tells its request observers (metrics, request logs), and how it is named.

An observer is called once per request after it ends, on the event loop, with the request
frame, its outcome (0 for OK, the error code answered, or :data:`ABORTED`), the body bytes it
moved, its duration in seconds and the connection's stream. It must be quick and must not
raise: it runs on the small-request path.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from ._exceptions import ERRORS
from ._netio import SocketStream

__all__ = ["ABORTED", "RequestObserver", "op_name", "outcome_name"]

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


def op_name(event: Any) -> str:
    """``GetRequest`` → ``GET``: the operation a request frame asks for."""
    return type(event).__name__.removesuffix("Request").upper()
