"""A real ZooKeeper and ``blobsvc serve --recovery-mode zookeeper`` children, for tests and
benchmarks. ZooKeeper comes from ``scripts/zookeeper`` (Debian's jars); only the processes
started here are ever stopped, by their PIDs, and every wait is bounded."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from blobsvc.ha import discovery
from blobsvc.ha.discovery import LeaderResolver

if TYPE_CHECKING:  # benchmarks/bench_ha.py imports this module without pytest
    import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "zookeeper"
START_TIMEOUT = 90.0  # the JVM starts slowly on a loaded 2-core machine


class ZooKeeper:
    """A standalone node or a 3-node ensemble in ``directory``."""

    def __init__(self, directory: Path, nodes: int = 1) -> None:
        self.directory = directory
        self.nodes = nodes
        self.hosts = ""

    def _script(self, *args: str) -> str:
        done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=START_TIMEOUT, check=False)
        if done.returncode:
            raise RuntimeError(f"scripts/zookeeper {' '.join(args)} failed: {done.stderr.strip()}")
        return done.stdout.strip()

    def start(self) -> ZooKeeper:
        self.hosts = self._script("start", str(self.directory), str(self.nodes))
        return self

    def stop(self, node: int | None = None) -> None:
        self._script("stop", str(self.directory), *([str(node)] if node else []))

    def restart(self, node: int = 1) -> None:
        self._script("restart", str(self.directory), str(node))

    def leader_node(self) -> int:
        """Which node (1-based) leads the ensemble, by asking each its ``srvr``."""
        for index, port_file in enumerate(sorted(self.directory.glob("node*/port")), start=1):
            with socket.create_connection(("127.0.0.1", int(port_file.read_text())), timeout=5) as sock:
                sock.sendall(b"srvr")
                reply = b"".join(iter(lambda: sock.recv(4096), b""))
            if b"Mode: leader" in reply or b"Mode: standalone" in reply:
                return index
        raise RuntimeError("no ZooKeeper node says it leads")

    def pids(self) -> list[int]:
        return [int(p.read_text()) for p in sorted(self.directory.glob("node*/pid"))]


class HaServer:
    """One ``blobsvc serve --recovery-mode zookeeper`` child process."""

    def __init__(
        self,
        zookeeper: str,
        ha_dir: Path | str,
        data_dir: Path,
        *,
        cluster_id: str = "test",
        session_timeout: float = 1.0,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        args = [
            sys.executable, "-m", "blobsvc", "serve", "--host", "127.0.0.1", "--port", "0",
            "--data-dir", str(data_dir), "--recovery-mode", "zookeeper", "--zookeeper", zookeeper,
            "--cluster-id", cluster_id, "--ha-dir", str(ha_dir),
            "--zookeeper-session-timeout", str(session_timeout), "--io-timeout", "5",
            "--log-level", "warning", *extra,
        ]  # fmt: skip
        self.data_dir = data_dir
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("listening on "):
            self.kill()
            raise RuntimeError(f"server did not start: {line!r}")
        self.address = line.split()[-1]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        self.process.wait(20)


def running_zookeeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeper]:
    """A module's ZooKeeper: ``zookeeper = pytest.fixture(scope="module")(running_zookeeper)``."""
    running = ZooKeeper(tmp_path_factory.mktemp("zookeeper")).start()
    yield running
    discovery._close_clients()  # the zk:// clients' sessions go before their ZooKeeper does
    running.stop()


def started_servers() -> Iterator[list[HaServer]]:
    """HaServer children a test starts: ``servers = pytest.fixture(started_servers)``; each is
    killed by its PID at the end."""
    started: list[HaServer] = []
    yield started
    for server in started:
        server.kill()


def wait_for_leader(url: str, *, avoid: str | None = None, timeout: float = 30.0) -> str:
    """The address the cluster's leader node names (another than ``avoid``), waiting for one."""
    deadline = time.monotonic() + timeout
    host, port = LeaderResolver(url).leader(avoid, timeout)
    address = f"{host}:{port}"
    if address == avoid and time.monotonic() >= deadline:
        raise TimeoutError(f"no leader other than {avoid} within {timeout}s")
    return address
