"""A real S3 endpoint on 127.0.0.1 for tests: moto's standalone server (``moto[server]``,
the endpoint s3fs's own tests run against), started as a child process and stopped by its
PID alone. blobsvc and s3fs reach it through the standard settings every AWS SDK reads
(``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``),
which :meth:`MotoServer.environ` returns and :meth:`MotoServer.export` sets for this process.
Every wait is bounded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

START_TIMEOUT = 60.0  # moto imports boto and flask: a few seconds on a loaded 2-core machine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MotoServer:
    """``moto_server`` on 127.0.0.1 at a free port; :meth:`stop` kills it by PID."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def environ(self) -> dict[str, str]:
        """The standard AWS settings that point any SDK (s3fs through aiobotocore) here."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ACCESS_KEY_ID": "blobsvc-test",
            "AWS_SECRET_ACCESS_KEY": "blobsvc-test",
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def start(self) -> MotoServer:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2):
                    return self
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"moto_server exited with {self.process.returncode}") from None
                if time.monotonic() > deadline:
                    self.stop()
                    raise TimeoutError(f"moto_server did not answer within {START_TIMEOUT}s") from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        if self.process is not None:
            self.process.wait(10)

    @contextmanager
    def export(self) -> Iterator[None]:
        """This process's environment points at the endpoint while the block runs (s3fs
        reads it when a filesystem is made; children inherit it)."""
        saved = {name: os.environ.get(name) for name in self.environ()}
        os.environ.update(self.environ())
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def s3(**options: Any) -> Any:
    """A fresh s3fs filesystem (no instance cache) from the environment's settings."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, **options)
