"""A real ``blobsvc agent`` process on 127.0.0.1 for the tests, and a few ways to ask it things."""

from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .processes import ChildProcess

START_WAIT = 30.0  # seconds: the agent opens (and checks) its cache before it listens


@dataclass
class AgentProcess(ChildProcess):
    url: str  # http://127.0.0.1:PORT
    cache_dir: Path

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def get(self, path: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """Status and body of one request (``path`` is the URL's path and query)."""
        request = urllib.request.Request(self.url + path, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            with error:
                return error.code, error.read()

    def metric(self, name: str) -> float:
        """One number of the agent's ``/metrics``."""
        status, body = self.get("/metrics")
        assert status == 200, body
        for line in body.decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)


def start_agent(server_address: str, cache_dir: Path, *args: str) -> AgentProcess:
    """``blobsvc agent -s server_address --cache-dir cache_dir --port 0 *args``, once it listens."""
    command = [
        sys.executable, "-m", "blobsvc", "agent", "-s", server_address, "--cache-dir", str(cache_dir),
        "--host", "127.0.0.1", "--port", "0", "--connect-timeout", "2", "--timeout", "10", "--retries", "1", *args,
    ]  # fmt: skip
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], START_WAIT)
    line = process.stdout.readline() if ready else "(nothing)"
    if not line.startswith("agent listening on "):
        process.kill()
        error = process.stderr.read() if process.stderr else ""
        raise RuntimeError(f"the agent did not start: {line!r} {error}")
    return AgentProcess(process, "http://" + line.split()[-1], cache_dir)


@contextlib.contextmanager
def run_agent(server_address: str, cache_dir: Path, *args: str) -> Iterator[AgentProcess]:
    """A running agent for the ``with`` block, killed (by its PID) at the end if still running."""
    agent = start_agent(server_address, cache_dir, *args)
    try:
        yield agent
    finally:
        agent.kill()
