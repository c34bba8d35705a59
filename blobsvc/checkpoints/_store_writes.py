"""A snapshot's store writes: new state files into the HA store the server names, or else to the server.

A server in recovery mode zookeeper names its HA store in STATUS (``store``, the one store
reads use); a snapshot asks once, at its first new file, and writes each new file there
(:class:`blobsvc.ha.writes.StoreWriter`) before LINKing its name. The first failure to
write is logged at WARNING (once a process per store, at INFO after, until a write works
again) and the rest of the snapshot sends its bytes to the server, as a standalone server
always has them sent.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from .._exceptions import BlobError
from ..client import BlobClient
from ..ha.writes import StoreUnwritable, StoreWriter

__all__ = ["StoreWrites"]

log = logging.getLogger("blobsvc.checkpoints")

_warned: set[str] = set()  # stores whose fall-back this process logged at warning
_warned_lock = threading.Lock()


class StoreWrites:
    """One snapshot's writes to the store ``client``'s server names."""

    def __init__(self, client: BlobClient) -> None:
        self._client = client
        self._lock = threading.Lock()
        self._asked = False
        self._writer: StoreWriter | None = None

    def write(self, key: bytes, path: Path) -> bool:
        """Whether the object of ``key`` is now in the store, written from ``path``; False
        when the server names no store, or it cannot be written (the bytes go to the server)."""
        writer = self._current()
        if writer is None:
            return False
        try:
            writer.write(key, path)
        except StoreUnwritable as exc:
            self._writer = None  # the rest of this snapshot goes to the server
            _fell_back(writer.location, str(exc))
            return False
        with _warned_lock:
            _warned.discard(writer.location)
        return True

    def _current(self) -> StoreWriter | None:
        with self._lock:
            if not self._asked:
                self._asked = True
                self._writer = self._open()
            return self._writer

    def _open(self) -> StoreWriter | None:
        try:
            location = self._client.status().get("store")
        except (BlobError, OSError) as exc:
            log.info("could not ask %s where its store is (%s); state goes to the server", self._client.server, exc)
            return None
        if not isinstance(location, str) or not location:
            return None  # a standalone server: it keeps the state itself
        try:
            return StoreWriter(location, connect_timeout=self._client.connect_timeout)
        except StoreUnwritable as exc:
            _fell_back(location, str(exc))
            return None


def _fell_back(location: str, cause: str) -> None:
    with _warned_lock:
        first = location not in _warned
        _warned.add(location)
    message = "%s: sending state to the server instead (store writes fall back until the store can be written)"
    log.log(logging.WARNING if first else logging.INFO, message, cause)
