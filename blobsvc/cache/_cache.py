"""The executor side: :class:`BlobCache` fetches blobs into a :class:`CacheStore` once per host."""

from __future__ import annotations

import contextlib
import logging
import os
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .. import config
from .._exceptions import BadOffset, BlobError, DigestMismatch, InvalidArgument, InvalidArgumentType
from ..client import BlobClient
from ..ha.reads import StoreCopyRefused, StoreReader, StoreUnreadable
from ..wire._ids import JobLike, KeyLike, job_bytes, key_bytes
from ..wire._protocol import name_error
from ._counters import Counters
from ._store import CacheStats, CacheStore, CollectReport, RecoveryReport

__all__ = ["DEFAULT_CLEANUP_INTERVAL", "DEFAULT_MAX_BYTES", "BlobCache", "JobBlobs"]

log = logging.getLogger("blobsvc.cache")

DEFAULT_CLEANUP_INTERVAL = config.DEFAULT_CLEANUP_INTERVAL
DEFAULT_MAX_BYTES = config.DEFAULT_CACHE_MAX_BYTES
# How often one path() starts over because the server's blob of a job name changed under it.
MAX_NAME_CHANGES = 3
# The janitor sweeps at least once per cleanup interval, so that a job whose last holder died
# is noticed by some live process; but not more often than this, whatever the interval.
MIN_SWEEP_SECONDS = 1.0


class _NameChanged(Exception):
    """The job name held other content by the time the download asked for it."""


class BlobCache:
    """A host's verified copies of the blobs of one server, shared by all its processes.

    ``path(key)`` and ``path(job, name)`` return the local path of a complete file whose
    BLAKE3 digest has been checked. However many threads and processes ask for one blob at
    once, the server sends it once: the first takes the blob's lock and downloads, the rest
    wait for the lock and find the file. The cache directory must be on a local file system.

    Job blobs are reference-counted across processes: ``register_job``/``release_job`` or
    ``with cache.job(job) as blobs: blobs.path(name)``. A blob of a registered job is never
    evicted; ``cleanup_interval`` seconds after its last release (or its last holder's death)
    a job's files are deleted, and registering it again before then reuses them. Content is
    shared between jobs: a job blob whose bytes are cached already costs a STAT, no download.

    The cache holds at most ``max_bytes``, evicting the least recently used blobs that no
    registered job uses; when downloads in flight hold the room a download needs, it waits for
    them up to ``timeout`` seconds before it fails with ``CacheFull``. Downloads get ``retries``
    more attempts after a failure, ``backoff`` seconds doubling (with jitter) in between, and
    resume from the bytes already on disk.
    When the server names a shared store (the HA store of recovery mode zookeeper) and
    ``store_reads`` is on, a download copies the bytes from the store instead, verified, and
    falls back to the server once when that fails (:class:`_StoreReads`).
    With ``verify_on_start``, opening the cache removes downloads nobody is finishing and
    rehashes every file whose stamp is off or from before the host's last boot; without it,
    such a file is rehashed at its first use. (Downloads are not fsynced: only a crash of
    the host can lose their bytes, and it starts a new boot.)
    """

    def __init__(
        self,
        server: str | tuple[str, int],
        cache_dir: str | os.PathLike[str],
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        cleanup_interval: float = DEFAULT_CLEANUP_INTERVAL,
        retries: int = 3,
        backoff: float = 0.1,
        timeout: float = 60.0,
        connect_timeout: float = 10.0,
        secret: bytes | None = None,
        verify_on_start: bool = True,
        tls: ssl.SSLContext | None = None,
        store_reads: bool = True,
    ) -> None:
        if max_bytes <= 0 or cleanup_interval < 0:
            raise InvalidArgument("max_bytes must be positive and cleanup_interval not negative")
        self.store = CacheStore(cache_dir)
        self.max_bytes = max_bytes
        self.cleanup_interval = cleanup_interval
        # How long a download waits for others in flight to free the room it needs: as long
        # as the client waits for a byte, since that is the time either side would stall anyway.
        self._room_wait = timeout
        self._client = BlobClient(
            server,
            retries=retries,
            backoff=backoff,
            timeout=timeout,
            connect_timeout=connect_timeout,
            secret=secret,
            tls=tls,
        )
        self._store_reads = _StoreReads(self._client, self.store.counters, connect_timeout) if store_reads else None
        self._lock = threading.Lock()
        self._leases: dict[str, list[str]] = {}
        self._leases_pid = os.getpid()
        self._janitor: _Janitor | None = None
        self.recovery: RecoveryReport | None = self.store.recover() if verify_on_start else None
        self.collect()

    @property
    def root(self) -> Path:
        return self.store.root

    # --- blobs ---------------------------------------------------------------------------------

    def path(self, key_or_job: KeyLike | JobLike, name: str | None = None) -> Path:
        """The local path of a blob: ``path(key)`` or ``path(job, name)``; fetched if needed.

        Take a job blob's path inside a registration of the job (:meth:`job`): outside one,
        nothing keeps the file from being evicted or cleaned up.
        """
        if name is None:
            if isinstance(key_or_job, uuid.UUID):
                raise InvalidArgumentType("a UUID is a job id: name the job's blob too")
            return self._content_path(key_bytes(key_or_job).hex())
        return self._job_path(job_bytes(key_or_job), name)

    def _content_path(self, key: str) -> Path:
        found = self.store.lookup(key)
        if found is None:
            with self.store.key_lock(key):
                if not self.store.verify(key):
                    size = self._client.stat(key).size
                    self._download(key, size, {"key": key})
                    return self.store.content(key)
        self.store.counters.add("hits")
        return self.store.content(key)

    def _job_path(self, job: bytes, name: str) -> Path:
        problem = name_error(name.encode("utf-8", "surrogatepass"))
        if problem:  # before the name becomes a path
            raise InvalidArgument(problem)
        job_hex = job.hex()
        found = self.store.find_job_file(job_hex, name)
        if found is not None:
            self.store.counters.add("hits")
            return found
        for _ in range(MAX_NAME_CHANGES):
            key = (info := self._client.stat(job=job, name=name)).key
            with self.store.key_lock(key):
                if self.store.verify(key):
                    self.store.counters.add("hits")  # the bytes are here under another name
                else:
                    try:
                        self._download(key, info.size, {"job": job, "name": name})
                    except _NameChanged:
                        continue
                return self.store.link(job_hex, name, key)
        server = self._client.server
        raise BlobError(f"blob {name!r} of job {job_hex} on {server} changed during {MAX_NAME_CHANGES} downloads")

    def _download(self, key: str, size: int, target: dict[str, Any]) -> None:
        """Fetch ``key`` (from ``target``, the client's arguments naming the blob) into its
        partial file and publish it. Holds the key's lock."""
        self.store.counters.add("misses")
        partial = self.store.reserve(key, size, self.max_bytes, wait=self._room_wait)
        # Not fsynced: a blob is rehashed before its first use in a later boot of the host
        # (the page cache outlives any process). Without a boot id to tell, it must be.
        fsync = not self.store.boot
        if self._store_reads is not None and self._store_reads.read(key, size, partial, fsync):
            self.store.publish(key, partial)
            self.store.counters.add("downloads")
            return
        held = os.stat(partial).st_size
        try:
            info = self._client.resume_file(partial, **target, fsync=fsync)
        except (BadOffset, DigestMismatch):
            if not held:
                raise
            # The bytes on disk were not this blob's beginning: once more, from zero.
            os.truncate(partial, 0)
            held = 0
            info = self._client.resume_file(partial, **target, fsync=fsync)
        self.store.counters.add("bytes_fetched", info.size - held)
        if info.key != key:
            os.unlink(partial)
            raise _NameChanged
        self.store.publish(key, partial)
        self.store.counters.add("downloads")

    # --- jobs ----------------------------------------------------------------------------------

    def register_job(self, job: JobLike) -> None:
        """Add a reference to ``job``, held by this process until released or until it ends."""
        job_hex = job_bytes(job).hex()
        lease = self.store.register(job_hex)
        with self._lock:
            self._own_leases().setdefault(job_hex, []).append(lease)

    def release_job(self, job: JobLike) -> None:
        """Drop a reference this process holds on ``job``; at zero, its idle time starts."""
        job_hex = job_bytes(job).hex()
        with self._lock:
            held = self._own_leases().get(job_hex)
            if not held:
                raise InvalidArgument(f"job {job_hex} is not registered by this process")
            lease = held.pop()
        if self.store.release(job_hex, lease) == 0:
            self._schedule(time.time() + self.cleanup_interval)

    def references(self, job: JobLike) -> int:
        """References to ``job`` held by live processes on this host."""
        return self.store.references(job_bytes(job).hex())

    @contextlib.contextmanager
    def job(self, job: JobLike) -> Iterator[JobBlobs]:
        """Hold a reference to ``job`` for the ``with`` block; its blobs are never evicted."""
        self.register_job(job)
        try:
            yield JobBlobs(self, job_bytes(job))
        finally:
            self.release_job(job)

    def _own_leases(self) -> dict[str, list[str]]:
        """This process's leases; a forked child starts with none, its parent's are not its own."""
        if self._leases_pid != os.getpid():
            self._leases, self._leases_pid = {}, os.getpid()
        return self._leases

    # --- upkeep --------------------------------------------------------------------------------

    def collect(self) -> CollectReport:
        """Delete expired jobs and evict down to the limit now, rather than when due. A job
        whose last holder died without releasing it starts its idle time here."""
        report = self.store.collect(self.cleanup_interval, self.max_bytes)
        self._schedule(self._next_sweep(report))
        return report

    def _next_sweep(self, report: CollectReport) -> float:
        sweep = time.time() + max(self.cleanup_interval, MIN_SWEEP_SECONDS)
        return sweep if report.next_deadline is None else min(sweep, report.next_deadline)

    def stats(self) -> CacheStats:
        """What the cache holds and the counters of every process of the host (hits, misses,
        downloads, bytes fetched, evictions), with this cache's limit."""
        return self.store.stats(self.max_bytes)

    def check(self, fix: bool = False) -> list[str]:
        """Rehash every blob and check the directory's rules; one warning per breach, [] when
        sound. With ``fix``, each breach is repaired."""
        return self.store.check(fix=fix, max_bytes=self.max_bytes)

    def _schedule(self, deadline: float) -> None:
        with self._lock:
            if self._janitor is None or not self._janitor.alive:
                self._janitor = _Janitor(self)
            self._janitor.schedule(deadline)

    def close(self) -> None:
        """Release this process's remaining references, stop the cleanup timer, disconnect."""
        with self._lock:
            leases, self._leases = self._own_leases(), {}
            janitor, self._janitor = self._janitor, None
        for job_hex, held in leases.items():
            for lease in held:
                self.store.release(job_hex, lease)
        if janitor is not None:
            janitor.stop()
        self._client.close()

    def __enter__(self) -> BlobCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _StoreReads:
    """Copies from the HA store the server names, for one cache: the blobsvc.ha.reads rules.

    The server is asked where its store is (STATUS ``store``) at the first download, and
    again at the first download after a store read failed (a new leader, a store that moved,
    a mount that came back). A read that fails or does not verify leaves the download to the
    server, once: a refused copy is emptied out of the partial file first, logged and counted,
    so no byte of it is kept; an unreadable store keeps the bytes it sent, which verify as
    part of the whole, as a broken transfer's do. The first fallback to the server is logged
    at warning with its cause, the next ones at info until a store read succeeds again: an
    operator learns that the store is not read, and why, without a line per blob. The store
    is connected to within ``connect_timeout``, and tried once."""

    def __init__(self, client: BlobClient, counters: Counters, connect_timeout: float) -> None:
        self._client = client
        self._counters = counters
        self._connect_timeout = connect_timeout
        self._warned = False  # of a fallback, since the last store read that worked
        self._lock = threading.Lock()
        self._reader: StoreReader | None = None
        self._asked = False
        self._pid = os.getpid()

    def read(self, key: str, size: int, partial: Path, fsync: bool) -> bool:
        """Whether ``partial`` now holds the verified blob, read from the store."""
        reader = self._current()
        if reader is None:
            return False
        try:
            reader.read_into(key, size, partial, fsync=fsync, received=self._received)
        except StoreCopyRefused as exc:
            os.truncate(partial, 0)
            self._counters.add("store_refused")
            log.warning(
                "refused the copy of %s from the HA store %s, fetching it from the server: %s",
                key,
                reader.location,
                exc,
            )
            return False
        except StoreUnreadable as exc:
            self._fell_back(f"fetching {key} from the server: {exc}")
            self._forget()
            return False
        self._warned = False
        return True

    def _fell_back(self, message: str) -> None:
        self._counters.add("store_fallbacks")
        if self._warned:
            log.info("%s", message)
            return
        self._warned = True
        log.warning("%s (store reads fall back to the server until the store answers again)", message)

    def _received(self, amount: int) -> None:
        self._counters.add("bytes_from_store", amount)

    def _current(self) -> StoreReader | None:
        with self._lock:
            if self._pid != os.getpid():  # a forked child opens its own (an fsspec client is per process)
                self._reader, self._asked, self._pid = None, False, os.getpid()
            if self._asked:
                return self._reader
            self._asked = True
            location = self._where()
            self._reader = None
            if location:
                try:
                    self._reader = StoreReader(location, connect_timeout=self._connect_timeout)
                except StoreUnreadable as exc:
                    self._asked = False  # as after any failure: the next download asks again
                    self._fell_back(f"reading from the server: {exc}")
            return self._reader

    def _where(self) -> str | None:
        """The store the server names; None when it names none or cannot be asked now."""
        try:
            store = self._client.status().get("store")
        except (BlobError, OSError) as exc:
            log.info("could not ask %s where its store is (%s); reading from the server", self._client.server, exc)
            self._asked = False  # the next download asks again
            return None
        return store if isinstance(store, str) and store else None

    def _forget(self) -> None:
        with self._lock:
            self._reader, self._asked = None, False


class JobBlobs:
    """The blobs of one registered job: ``blobs.path(name)``."""

    def __init__(self, cache: BlobCache, job: bytes) -> None:
        self.cache = cache
        self.job = job.hex()

    def path(self, name: str) -> Path:
        return self.cache.path(self.job, name)


class _Janitor:
    """A daemon thread that runs :meth:`BlobCache.collect` when the next idle job expires,
    and at least once per cleanup interval.

    Threads do not survive a fork, so one that is not alive (or belongs to the parent) is
    replaced by the next schedule."""

    def __init__(self, cache: BlobCache) -> None:
        self._cache = cache
        self._deadline: float | None = None
        self._wake = threading.Condition()
        self._stopped = False
        self._pid = os.getpid()
        self._thread = threading.Thread(target=self._run, name="blobsvc-cache-janitor", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._pid == os.getpid() and self._thread.is_alive()

    def schedule(self, deadline: float) -> None:
        with self._wake:
            self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
            self._wake.notify()

    def stop(self) -> None:
        with self._wake:
            self._stopped = True
            self._wake.notify()
        self._thread.join(10)

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._stopped and (self._deadline is None or self._deadline > time.time()):
                    self._wake.wait(None if self._deadline is None else self._deadline - time.time())
                if self._stopped:
                    return
                self._deadline = None
            try:
                report = self._cache.store.collect(self._cache.cleanup_interval, self._cache.max_bytes)
            except Exception:  # the timer must not die: try again at the next sweep
                log.exception("collecting the cache at %s failed", self._cache.root)
                report = CollectReport()
            self.schedule(self._cache._next_sweep(report))
