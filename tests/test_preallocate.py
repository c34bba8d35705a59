"""``preallocate``: disk blocks before bytes, the file's size untouched, and nothing at all
where a file cannot have blocks reserved."""

from __future__ import annotations

import os
from pathlib import Path

from blobsvc._preallocate import preallocate

MiB = 1 << 20


def test_blocks_are_reserved_and_the_size_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "partial"
    path.write_bytes(b"x" * 1000)  # a partial download: its size says what it holds
    fd = os.open(path, os.O_WRONLY)
    try:
        preallocate(fd, 1000, 16 * MiB)
        info = os.fstat(fd)
    finally:
        os.close(fd)
    assert info.st_size == 1000
    assert info.st_blocks * 512 >= 16 * MiB


def test_a_file_that_cannot_have_blocks_is_left_alone() -> None:
    read_end, write_end = os.pipe()
    try:
        preallocate(write_end, 0, MiB)  # ESPIPE: the writes go on without a reservation
        os.write(write_end, b"still writable")
        assert os.read(read_end, 100) == b"still writable"
    finally:
        os.close(read_end)
        os.close(write_end)
