"""blobsvc servers and child processes for the benchmarks and the tests: a BlobServer on an
event loop of its own in a daemon thread, and ``python -m blobsvc`` children ended only by
their PIDs."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import threading
from dataclasses import dataclass

from blobsvc import BlobServer, Settings

__all__ = ["ChildProcess", "ServerThread", "address_text"]


def address_text(address: tuple[str, int]) -> str:
    return f"{address[0]}:{address[1]}"


class ServerThread:
    """A BlobServer running on its own event loop in a daemon thread."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self.server = BlobServer(settings)
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def start(self) -> ServerThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(30)
        return self

    @property
    def address(self) -> str:
        return address_text(self.server.address)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(1.0), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class ChildProcess:
    """A ``python -m blobsvc`` process a test started, and ended only by its PID."""

    process: subprocess.Popen[str]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)

    def terminate(self, timeout: float = 15.0) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)
