"""Decimal numbers from outside, bounded in digits before Python converts them.

Python's ``int()`` of a decimal string takes time quadratic in its length and refuses more
than 4,300 digits with a ValueError (``sys.get_int_max_str_digits()``): unchecked in a request
handler, such a number was a 500 on the HTTP faces. Every decimal number blobsvc reads from a
request, an answer or a setting goes through :func:`parse_decimal` (or, inside a JSON
document, :func:`json_int`), which refuses a spelling of more than :data:`MAX_DIGITS` digits
before it converts anything. What each face answers then is in docs/protocol.md.
"""

from __future__ import annotations

__all__ = ["MAX_DIGITS", "TooManyDigits", "json_int", "parse_decimal"]

# Every number blobsvc reads is a byte count, an offset, a port, a counter or a unix time, and
# each fits the wire's widest field, 64 bits, whose largest value (18446744073709551615) has 20
# digits. A longer spelling, even of a small value (leading zeros), is refused.
MAX_DIGITS = 20


class TooManyDigits(ValueError):
    """A number spelt with more than :data:`MAX_DIGITS` digits."""


def parse_decimal(text: str, what: str = "a number") -> int:
    """The value of ``text``: ASCII decimal digits only (no sign, space, underscore or other
    script's digits), at most :data:`MAX_DIGITS` of them. ValueError naming ``what``
    otherwise (:class:`TooManyDigits` for a long one)."""
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"{what} is not a decimal number: {text[:40]!r}")
    return int(_bounded(text, what))


def json_int(text: str) -> int:
    """A JSON document's integer (``json.loads(..., parse_int=json_int)``): its digits bounded
    as :func:`parse_decimal` bounds them, a minus sign allowed."""
    _bounded(text.removeprefix("-"), "a number")
    return int(text)


def _bounded(digits: str, what: str) -> str:
    if len(digits) > MAX_DIGITS:
        raise TooManyDigits(f"{what} has {len(digits)} digits, more than the {MAX_DIGITS} any number here needs")
    return digits
