"""The executor side of blobsvc: one verified copy of each blob per host.

``BlobCache(server, cache_dir)`` hands out local paths of verified blobs, downloads each
blob once however many threads and processes ask for it, counts references to jobs across
processes, deletes a job's files ``cleanup_interval`` after its last release, and keeps the
directory under a byte limit by evicting the least recently used blobs no job is using.
``docs/cache.md`` states its invariants; the modules are:

* ``_lock``: ``flock`` locks that hold between threads and between processes;
* ``_leases``: reference counts as lease files of live processes;
* ``_store``: the directory: layout, publication, checks, links, eviction, collection;
* ``_counters``: hits, misses, downloads, bytes fetched and evictions of every process;
* ``_cache``: :class:`BlobCache`, which fetches from the server (or from the HA store the
  server names, :mod:`blobsvc.ha.reads`) into the store;
* ``_archives``: archives unpacked once per host per digest, atomically and safely.
* ``_extract``: an archive's members created inside its tree and nowhere else, bounded;
* ``_trees``: the layout of the unpacked trees, which count in the cache's byte limit.

May import the client, :mod:`blobsvc.ha` (reads from the HA store), storage's layout, the
wire, config and exceptions; never the server, the agent or the Spark integration.
"""

from ._cache import DEFAULT_CLEANUP_INTERVAL, DEFAULT_MAX_BYTES, BlobCache, JobBlobs
from ._store import (
    CacheError,
    CacheFull,
    CacheStats,
    CacheStore,
    CollectReport,
    ContentEntry,
    JobEntry,
    RecoveryReport,
    TooLargeForCache,
)

__all__ = [
    "DEFAULT_CLEANUP_INTERVAL",
    "DEFAULT_MAX_BYTES",
    "BlobCache",
    "CacheError",
    "CacheFull",
    "CacheStats",
    "CacheStore",
    "CollectReport",
    "ContentEntry",
    "JobBlobs",
    "JobEntry",
    "RecoveryReport",
    "TooLargeForCache",
]
