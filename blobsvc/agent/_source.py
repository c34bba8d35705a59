"""Blobs for the agent's HTTP face, out of the host's :class:`~blobsvc.cache.BlobCache`.

:meth:`CacheSource.open_blob` is the face's opener: the file it opens is one the cache has
just returned, complete and verified against its key, so the face never sends a byte that is
not; its size is known before the answer's header goes out, so a body is never cut short
behind a 200. Requests for one blob that arrive together share one fetch (one flight per
blob in this process; the cache's key locks make it one download per host across processes
too). The cache blocks, so fetches run on a pool of threads of their own: a multi-gigabyte
download never holds up the event loop, nor the threads asyncio lends to others.

A job blob's request makes the agent hold a reference on its job (a lease of this process in
the cache), so the job's files are neither evicted nor cleaned up while the job exists on the
server; :meth:`CacheSource.release` drops it once the server says the job is gone.
"""

from __future__ import annotations

import asyncio
import errno
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._exceptions import BlobError, NotFound
from ..cache import BlobCache, CacheError
from ..http import HttpError
from ..storage import OpenBlob
from ..wire._protocol import ContentKey, JobBlob

__all__ = ["FETCH_THREADS", "CacheSource"]

# Distinct blobs fetched at once; more wait their turn. Each is one connection to the server,
# and a host rarely asks for more than a few jars and an environment at a time.
FETCH_THREADS = 16

Target = ContentKey | JobBlob


class CacheSource:
    """The HTTP face's blobs, fetched once into ``cache`` from the server it reads."""

    def __init__(self, cache: BlobCache, server: str) -> None:
        self.cache = cache
        self.server = server
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="blobsvc-agent-fetch")
        self._flights: dict[Target, asyncio.Future[Path]] = {}
        self._jobs: set[str] = set()  # the jobs this agent holds a reference on
        self._jobs_lock = threading.Lock()  # fetch threads take references

    @property
    def in_flight(self) -> int:
        """Blobs being fetched right now (a blob already cached takes no time)."""
        return len(self._flights)

    @property
    def jobs(self) -> list[str]:
        """The jobs (hex) this agent holds a reference on."""
        with self._jobs_lock:
            return sorted(self._jobs)

    async def open_blob(self, target: Target) -> OpenBlob:
        """``target``'s verified local copy, open; fetched from the server if the host lacks it."""
        for attempt in (1, 2):
            path = await self._path(target)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # evicted between the fetch and the open: fetch again
                if attempt == 2:
                    raise
                continue
            key = bytes.fromhex(self.cache.store.key_of(path))
            return OpenBlob(fd, os.fstat(fd).st_size, key)
        raise AssertionError("unreachable")

    async def _path(self, target: Target) -> Path:
        flight = self._flights.get(target)
        if flight is None:
            loop = asyncio.get_running_loop()
            flight = loop.run_in_executor(self._pool, self._fetch, target)
            self._flights[target] = flight
            flight.add_done_callback(lambda done: self._landed(target, done))
        # Shielded: a client that hangs up must not cancel the fetch the others wait for.
        return await asyncio.shield(flight)

    def _landed(self, target: Target, flight: asyncio.Future[Path]) -> None:
        self._flights.pop(target, None)
        if not flight.cancelled():
            flight.exception()  # retrieved: a fetch whose waiters all left must not be reported unseen

    def _fetch(self, target: Target) -> Path:
        """The cache's path of ``target`` (a worker thread); failures as the HTTP face answers them."""
        try:
            if isinstance(target, ContentKey):
                return self.cache.path(target.key.hex())
            path = self.cache.path(target.job.hex(), target.name)
            self._hold(target.job.hex())
            return path
        except NotFound:
            raise
        except CacheError as exc:  # larger than the limit, or no room that blobs in use leave
            raise HttpError(507, f"the host cache cannot hold it: {exc}") from None
        except BlobError as exc:
            raise HttpError(502, f"cannot fetch it from the blobsvc server {self.server}: {exc}") from None
        except OSError as exc:
            status = 507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 500
            raise HttpError(status, f"the host cache at {self.cache.root}: {exc.strerror or exc}") from None

    def _hold(self, job: str) -> None:
        with self._jobs_lock:
            if job not in self._jobs:
                self.cache.register_job(job)
                self._jobs.add(job)

    def release(self, job: str) -> None:
        """Drop the reference this agent holds on ``job`` (hex), if it holds one: its files go
        one cleanup interval later unless another process or a later request holds the job."""
        with self._jobs_lock:
            if job not in self._jobs:
                return
            self._jobs.discard(job)
            self.cache.release_job(job)

    def close(self) -> None:
        """Wait for fetches under way, then release every reference and close the cache."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._jobs_lock:
            self._jobs.clear()
        self.cache.close()  # releases this process's leases
