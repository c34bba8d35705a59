"""Keys and job ids: their raw wire form and the hex text users pass around."""

from __future__ import annotations

import uuid
from pathlib import Path

import blake3

from .._exceptions import InvalidArgument
from ._protocol import JOB_SIZE, KEY_SIZE

__all__ = ["KeyLike", "JobLike", "digest_of", "hash_file", "key_bytes", "job_bytes", "new_job_id", "shown"]

KeyLike = str | bytes
JobLike = str | bytes | uuid.UUID


def digest_of(data: bytes | bytearray | memoryview) -> bytes:
    """The BLAKE3 digest that keys ``data``."""
    return blake3.blake3(data).digest()


def hash_file(path: Path) -> bytes:
    """BLAKE3 of a file's content, using every core for large files."""
    if path.stat().st_size == 0:
        return blake3.blake3().digest()
    return blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(path).digest()


def _from_hex_or_raw(value: str | bytes, size: int, what: str) -> bytes:
    if isinstance(value, bytes) and len(value) == size:
        return value
    text = value.decode("ascii", "replace") if isinstance(value, bytes) else value
    if len(text) == 2 * size:
        try:
            return bytes.fromhex(text)
        except ValueError:
            pass
    raise InvalidArgument(f"a {what} is {2 * size} hex characters or {size} raw bytes, not {shown(value)}")


# Longer values are cut where an error message shows them: a URL path can be 16 KiB, a
# heartbeat's field 64 KiB, and an error is one line.
SHOWN_CHARS = 80


def shown(value: object) -> str:
    """``value`` as an error message shows it: its repr, cut after ``SHOWN_CHARS`` characters,
    saying how long a cut string was."""
    text = repr(value)
    if len(text) <= SHOWN_CHARS:
        return text
    length = f" ({len(value)} characters)" if isinstance(value, str | bytes) else ""
    return f"{text[:SHOWN_CHARS]}…{length}"


def key_bytes(key: KeyLike) -> bytes:
    """A blob key from its 64-character hex form (or its 32 raw bytes)."""
    return _from_hex_or_raw(key, KEY_SIZE, "key")


def job_bytes(job: JobLike) -> bytes:
    """A job id from its 32-character hex form, a UUID, or its 16 raw bytes."""
    if isinstance(job, uuid.UUID):
        return job.bytes
    if isinstance(job, str) and "-" in job:
        try:
            return uuid.UUID(job).bytes
        except ValueError:
            pass
    return _from_hex_or_raw(job, JOB_SIZE, "job id")


def new_job_id() -> str:
    """A fresh random job id in hex form."""
    return uuid.uuid4().hex
