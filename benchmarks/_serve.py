"""A ``blobsvc serve`` child process for the benchmarks that need only its address.

The child runs on a temporary data directory, is started with the options given, and is
killed by PID when the block ends.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

__all__ = ["serve"]


@contextlib.contextmanager
def serve(*options: str, data_dir: Path | None = None) -> Iterator[str]:
    """Yield ``host:port`` of a fresh server on 127.0.0.1 started with ``options``."""
    with tempfile.TemporaryDirectory(prefix="blobsvc-bench-") as scratch:
        args = [sys.executable, "-m", "blobsvc", "serve", "--host", "127.0.0.1", "--port", "0"]
        args += ["--data-dir", str(data_dir or Path(scratch, "data")), "--log-level", "warning", *options]
        process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert process.stdout is not None
            line = process.stdout.readline()
            if not line.startswith("listening on "):
                raise RuntimeError(f"the server did not start: {line!r}")
            yield line.removeprefix("listening on ").strip()
        finally:
            process.kill()
            process.wait(10)
