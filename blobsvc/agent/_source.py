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
server; :meth:`CacheSource.gone` drops it once the server says the job is gone, and
remembers that (the last ``MAX_GONE_JOBS``), so that the agent's face answers for the job as
the server does at once, while its files wait out the cleanup interval.

:meth:`CacheSource.environment` is a packed Python environment's tree: its archive fetched
as above, then unpacked once per host (in environment mode, see :mod:`blobsvc.cache._archives`)
under the cache's ``unpacked/``, where ``blobsvc.spark`` unpacks its archives, and pruned as
they are once the archive leaves the cache. Requests for one environment share one flight too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._exceptions import BlobError, NotFound
from ..cache import BlobCache, CacheError
from ..cache._archives import (
    ENVIRONMENT_SUFFIX,
    ArchiveTooLarge,
    UnsafeArchive,
    archive_kind,
    discard,
    prune,
    unpack_once,
)
from ..http import HttpError
from ..storage import OpenBlob
from ..wire._protocol import ContentKey, JobBlob

__all__ = ["FETCH_THREADS", "MAX_GONE_JOBS", "CacheSource"]

log = logging.getLogger("blobsvc.agent")

# Distinct blobs fetched at once; more wait their turn. Each is one connection to the server,
# and a host rarely asks for more than a few jars and an environment at a time.
FETCH_THREADS = 16

Target = ContentKey | JobBlob
# Jobs the server said are gone, remembered: a job id is 32 bytes of text, so some 1 MB. Past
# that the oldest are forgotten, and their files (gone one cleanup interval after release
# unless asked for again) are served as they were until then.
MAX_GONE_JOBS = 10_000


class CacheSource:
    """The HTTP face's blobs, fetched once into ``cache`` from the server it reads."""

    def __init__(self, cache: BlobCache, server: str) -> None:
        self.cache = cache
        self.server = server
        self._pool = ThreadPoolExecutor(FETCH_THREADS, thread_name_prefix="blobsvc-agent-fetch")
        self._flights: dict[Hashable, asyncio.Future[Path]] = {}  # a Target, or ("python", key)
        self.unpacks = 0  # environments this agent unpacked
        self._jobs: set[str] = set()  # the jobs this agent holds a reference on
        self._jobs_lock = threading.Lock()  # fetch threads take references
        self._gone: OrderedDict[str, None] = OrderedDict()  # jobs the server said are gone, oldest first

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

    async def environment(self, key: bytes, filename: str) -> Path:
        """The tree of the packed Python environment ``key`` (an archive named ``filename``),
        unpacked on this host; fetched and unpacked first if the host lacks it."""
        kind = archive_kind(filename)
        return await self._flight(("python", key), lambda: self._unpack(key.hex(), kind))

    async def _path(self, target: Target) -> Path:
        return await self._flight(target, lambda: self._fetch(target))

    async def _flight(self, token: Hashable, work: Callable[[], Path]) -> Path:
        """``work``'s result, run on the pool once for all the requests for ``token`` that
        arrive while it runs."""
        flight = self._flights.get(token)
        if flight is None:
            loop = asyncio.get_running_loop()
            flight = loop.run_in_executor(self._pool, work)
            self._flights[token] = flight
            flight.add_done_callback(lambda done: self._landed(token, done))
        # Shielded: a client that hangs up must not cancel the fetch the others wait for.
        return await asyncio.shield(flight)

    def _landed(self, token: Hashable, flight: asyncio.Future[Path]) -> None:
        self._flights.pop(token, None)
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

    def _unpack(self, key: str, kind: str) -> Path:
        """The environment's tree (a worker thread); failures as the HTTP face answers them."""
        trees = self.cache.store.unpacked_dir
        for attempt in (1, 2):
            archive = self._fetch(ContentKey(bytes.fromhex(key)))
            try:
                if not (trees / (key + ENVIRONMENT_SUFFIX)).is_dir():  # a new tree: drop stale ones
                    prune(trees, self.cache.store.content_dir)
                tree, fresh = unpack_once(
                    trees, key, archive, kind, environment=True, max_bytes=self.cache.max_bytes, store=self.cache.store
                )
            except FileNotFoundError:  # the archive evicted between the fetch and the unpack
                if attempt == 2:
                    raise
                continue
            except ArchiveTooLarge as exc:
                log.warning("refused the environment %s: %s", key, exc)
                raise HttpError(507, f"the host cache cannot hold the environment unpacked: {exc}") from None
            except UnsafeArchive as exc:
                log.warning("refused the environment %s: %s", key, exc)
                raise HttpError(400, f"not an environment the agent unpacks: {exc}") from None
            except OSError as exc:
                status = 507 if exc.errno in (errno.ENOSPC, errno.EDQUOT) else 500
                raise HttpError(status, f"unpacking into {trees}: {exc.strerror or exc}") from None
            if fresh:
                with self._jobs_lock:  # fetch threads of other environments count too
                    self.unpacks += 1
            return tree
        raise AssertionError("unreachable")

    def discard_environment(self, key: bytes) -> None:
        """Remove the environment ``key``'s tree, found of no use (no Python to launch)."""
        discard(self.cache.store.unpacked_dir, key.hex(), environment=True)

    def _hold(self, job: str) -> None:
        with self._jobs_lock:
            if job not in self._jobs:
                self.cache.register_job(job)
                self._jobs.add(job)

    def gone(self, job: str) -> None:
        """The server says ``job`` (hex) is gone: drop the reference this agent holds on it, if
        any (its files go one cleanup interval later unless another process or a later request
        holds the job), and remember it until :meth:`back`."""
        with self._jobs_lock:
            self._gone[job] = None
            self._gone.move_to_end(job)
            while len(self._gone) > MAX_GONE_JOBS:
                self._gone.popitem(last=False)
            if job not in self._jobs:
                return
            self._jobs.discard(job)
            self.cache.release_job(job)

    def is_gone(self, job: str) -> bool:
        with self._jobs_lock:
            return job in self._gone

    def back(self, job: str) -> None:
        """``job`` exists on the server again (its id reused after it was deleted)."""
        with self._jobs_lock:
            self._gone.pop(job, None)

    def close(self) -> None:
        """Wait for fetches under way, then release every reference and close the cache."""
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._jobs_lock:
            self._jobs.clear()
        self.cache.close()  # releases this process's leases
