"""High availability: recovery modes, the HA blob store, leader election, leader discovery.

Recipe-like modules, each opening with what it does when the ZooKeeper session is
SUSPENDED or LOST:

* :mod:`blobsvc.ha.store`: the FileSystemBlobStore (a directory or an fsspec URL) and the
  standalone mode's void store.
* :mod:`blobsvc.ha.leader`: leader election with a fencing token (needs kazoo).
* :mod:`blobsvc.ha.discovery`: ``zk://`` URLs and finding the leader from a client.
* :mod:`blobsvc.ha.reads`: executor hosts copying content objects from the store, verified.
* :mod:`blobsvc.ha.coordinator`: what the server asks: may I serve, store durably, may I
  acknowledge, fetch what I lack.

kazoo and fsspec are the ``ha`` extra (``pip install blobsvc[ha]``); nothing here imports
them until the zookeeper mode or a ``zk://`` URL asks for them.

May import :mod:`blobsvc.storage`, :mod:`blobsvc.files`, :mod:`blobsvc.wire`, config and
exceptions; never the server that asks it, the client or the HTTP face.
"""

import typing

from .. import _lazy

# Loaded on first use: a client that finds the leader (discovery) or a cache that reads the
# store (reads) loads neither the coordinator nor the server's storage under it.
if typing.TYPE_CHECKING:
    from .coordinator import HighAvailability, Standalone, ZooKeeperHA, high_availability
    from .store import BlobStore, FileSystemBlobStore, VoidBlobStore, open_blob_store

__getattr__, __dir__ = _lazy.lazy_exports(
    __name__,
    {
        ".coordinator": ["HighAvailability", "Standalone", "ZooKeeperHA", "high_availability"],
        ".store": ["BlobStore", "FileSystemBlobStore", "VoidBlobStore", "open_blob_store"],
    },
)

__all__ = [
    "BlobStore",
    "FileSystemBlobStore",
    "HighAvailability",
    "Standalone",
    "VoidBlobStore",
    "ZooKeeperHA",
    "high_availability",
    "open_blob_store",
]
