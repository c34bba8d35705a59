"""Error codes round-trip between the wire and the exception classes; the public surface is pinned."""

from __future__ import annotations

import types

import pytest

import blobsvc
from blobsvc import RemoteProtocolError, ServerError
from blobsvc._exceptions import ERRORS, error_for_code
from blobsvc.wire._protocol import ErrorFrame

SPEC_CODES = {
    1: ("BadRequest", False),
    2: ("NotFound", True),
    3: ("DigestMismatch", True),
    4: ("TooLarge", False),
    5: ("AuthRequired", False),
    6: ("AuthFailed", False),
    7: ("NotLeader", False),
    8: ("Busy", False),
    9: ("InsufficientStorage", False),
    10: ("UnsupportedVersion", False),
    11: ("InternalError", False),
    12: ("BadOffset", True),
    13: ("Fenced", True),
}


def test_every_code_of_the_spec_has_its_class_and_connection_rule() -> None:
    assert {code: (cls.__name__, cls.keeps_connection) for code, cls in ERRORS.items()} == SPEC_CODES


@pytest.mark.parametrize("code", sorted(SPEC_CODES))
def test_codes_round_trip(code: int) -> None:
    error = error_for_code(code, "message")
    assert isinstance(error, ServerError) and error.code == code and str(error) == "message"
    assert ErrorFrame(code).keeps_connection is error.keeps_connection


def test_an_unknown_code_is_a_protocol_error() -> None:
    with pytest.raises(RemoteProtocolError, match="unknown error code 99"):
        error_for_code(99, "?")


def test_exported_members_are_exactly_the_public_names() -> None:
    public = [
        name
        for name in dir(blobsvc)
        if not name.startswith("_") and not isinstance(getattr(blobsvc, name), types.ModuleType)
    ]
    assert sorted(blobsvc.__all__) == sorted(public)
    for name in blobsvc.__all__:
        assert getattr(blobsvc, name).__module__.startswith("blobsvc")
