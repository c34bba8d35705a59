"""Unbounded streams in bounded memory: ``blobsvc get KEY`` to stdout and ``blobsvc put -``
from a pipe move a blob far larger than the memory they may use.

Each runs as a real ``blobsvc`` child process and its peak resident set is read from the
kernel (``os.wait4``), so the bound cannot pass by accident: the code that held the whole
blob in memory (twice, for get) peaks several times over it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import blake3
import pytest

from blobsvc import BlobClient, Settings

from .conftest import ServerThread

BLOB = 192 << 20
PEAK_LIMIT = 128 << 20  # far under the blob; a Python process with blobsvc loaded uses ~50 MiB
PATTERN = bytes(range(256)) * 4096  # 1 MiB


@pytest.fixture
def big_server(settings: Settings) -> Iterator[ServerThread]:
    running = ServerThread(replace(settings, max_blob_size=1 << 30)).start()
    yield running
    running.stop()


# Runs its arguments as a child and reports the child's exit status and peak RSS on stderr.
# The child is forked from this small process, not from pytest: a child's peak counts the
# memory of the process it was forked from, before its exec.
MEASURE = (
    "import os, subprocess, sys; child = subprocess.Popen(sys.argv[1:]); "
    "_, status, usage = os.wait4(child.pid, 0); "
    "print(os.waitstatus_to_exitcode(status), usage.ru_maxrss * 1024, file=sys.stderr)"
)


def run_measured(args: list[str], *, stdin: int | None = None, stdout: int | None = None) -> tuple[int, int]:
    """Run ``blobsvc ARGS`` to completion; its exit status and peak RSS in bytes (Linux)."""
    wrapper = [sys.executable, "-c", MEASURE, sys.executable, "-m", "blobsvc", *args]
    done = subprocess.run(wrapper, stdin=stdin, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)
    code, peak = done.stderr.split()[-2:]
    return int(code), int(peak)


@pytest.mark.slow
def test_get_to_stdout_streams_in_bounded_memory(big_server: ServerThread, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    with source.open("wb") as f:
        for _ in range(BLOB // len(PATTERN)):
            f.write(PATTERN)
    with BlobClient(big_server.address) as client:
        key = client.put(source)
    source.unlink()
    out = tmp_path / "out.bin"
    with out.open("wb") as sink:
        code, peak = run_measured(["get", key, "-s", big_server.address], stdout=sink.fileno())
    assert code == 0
    assert out.stat().st_size == BLOB
    assert blake3.blake3().update_mmap(out).hexdigest() == key
    assert peak < PEAK_LIMIT, f"peak RSS {peak >> 20} MiB for a {BLOB >> 20} MiB blob"


@pytest.mark.slow
def test_put_from_a_pipe_spools_in_bounded_memory(big_server: ServerThread, tmp_path: Path) -> None:
    read_end, write_end = os.pipe()

    def feed() -> None:
        with os.fdopen(write_end, "wb") as pipe:
            for _ in range(BLOB // len(PATTERN)):
                pipe.write(PATTERN)

    feeder = threading.Thread(target=feed)
    feeder.start()
    keys = tmp_path / "key.txt"
    try:
        with keys.open("wb") as key_out:
            code, peak = run_measured(["put", "-", "-s", big_server.address], stdin=read_end, stdout=key_out.fileno())
    finally:
        os.close(read_end)
        feeder.join(60)
    assert code == 0
    hasher = blake3.blake3()
    for _ in range(BLOB // len(PATTERN)):
        hasher.update(PATTERN)
    assert keys.read_text().strip() == hasher.hexdigest()
    assert peak < PEAK_LIMIT, f"peak RSS {peak >> 20} MiB for a {BLOB >> 20} MiB blob"
