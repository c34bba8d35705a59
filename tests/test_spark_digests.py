"""The driver remembers file digests by stamp, so re-publishing an unchanged file reads none of it."""

from __future__ import annotations

import os
import time
from pathlib import Path

import blake3
import pytest

from blobsvc.driver import _digests
from blobsvc.driver._digests import file_digest
from blobsvc.files import _stamps


def aged(path: Path, data: bytes) -> Path:
    """``path`` with ``data``, last changed long enough ago not to be racy."""
    path.write_bytes(data)
    past = time.time() - 60
    os.utime(path, (past, past))
    time.sleep(_stamps.RACY_SECONDS + 0.1)  # ctime, which utime cannot move back, ages too
    return path


@pytest.fixture(autouse=True)
def short_racy_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_stamps, "RACY_SECONDS", 0.2)


def test_an_unchanged_file_is_not_read_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = aged(tmp_path / "model.bin", b"weights")
    assert file_digest(model, tmp_path / "memory") == blake3.blake3(b"weights").digest()
    monkeypatch.setattr(_digests, "hash_file", lambda path: pytest.fail("read again"))
    assert file_digest(model, tmp_path / "memory") == blake3.blake3(b"weights").digest()


def test_a_rewrite_that_keeps_size_and_mtime_is_seen_through_ctime(tmp_path: Path) -> None:
    model = aged(tmp_path / "model.bin", b"weights")
    file_digest(model, tmp_path / "memory")
    st = os.stat(model)
    model.write_bytes(b"WEIGHTS")  # same size
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime put back
    assert file_digest(model, tmp_path / "memory") == blake3.blake3(b"WEIGHTS").digest()


def test_a_file_changed_just_now_is_hashed_every_time(tmp_path: Path) -> None:
    model = tmp_path / "model.bin"
    model.write_bytes(b"fresh")
    file_digest(model, tmp_path / "memory")
    assert not list((tmp_path / "memory").glob("*")), "a racy stamp was remembered"
