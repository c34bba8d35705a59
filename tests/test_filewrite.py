"""Writing large files: disk blocks before bytes (the file's size untouched, nothing at all
where a file cannot have blocks reserved), then the bytes in pieces."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blobsvc.files._filewrite import WRITE_PIECE, preallocate, pwrite_all

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


def test_pwrite_all_writes_every_byte_at_its_offset_in_pieces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Large writes go in pieces of at most WRITE_PIECE (the page cache's folios follow the
    write's length: see the module). The sizes are read by wrapping the real ``os.pwrite``."""
    sizes: list[int] = []
    real_pwrite = os.pwrite

    def recording_pwrite(fd: int, data: memoryview, offset: int) -> int:
        sizes.append(len(data))
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", recording_pwrite)
    data = os.urandom(3 * WRITE_PIECE + 5)
    path = tmp_path / "blob"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        pwrite_all(fd, b"head", 0)
        pwrite_all(fd, data, 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + data
    assert sizes == [4, WRITE_PIECE, WRITE_PIECE, WRITE_PIECE, 5]
