"""blobsvc: a BLOB server for Spark pipelines and the clients that fetch from it.

The public names are re-exported here; everything else is private to its module.

The package by part, each importing only parts below it (pyproject.toml's import-linter
contracts, run by scripts/test), top down:

* :mod:`blobsvc.cli`: the ``blobsvc`` command line;
* :mod:`blobsvc.spark`, :mod:`blobsvc.bench`, :mod:`blobsvc.agent`: PySpark, ``blobsvc bench``
  and its engine, the per-host agent;
* :mod:`blobsvc.cache`, :mod:`blobsvc.driver`: the host's blob cache; the driver's Spark conf
  and file digests;
* :mod:`blobsvc.client`, :mod:`blobsvc.server`: the clients; the BlobServer and its helpers
  (fast path, job gates, logs, metrics, the hosts' registry);
* :mod:`blobsvc.ha`, :mod:`blobsvc.http`: high availability; the HTTP face and the connection
  machinery the server and the agent share;
* :mod:`blobsvc.storage`: the server's disk (journal, group commit, recently read blobs);
* :mod:`blobsvc.files`: local files as every part writes them (layout, file writing, writeback);
* :mod:`blobsvc.wire`: the protocol, sockets, TLS;
* :mod:`blobsvc.config`, then ``_exceptions`` and ``_lazy`` (the re-exports below).

Importing the package, or a part of it, loads only what that part needs: the names below
that live in other parts (the client, the server, the cache) are loaded on first use.
"""

import typing

from . import _lazy
from ._exceptions import (
    AuthFailed,
    AuthRequired,
    BadOffset,
    BadRequest,
    BlobError,
    Busy,
    ClientClosed,
    ConnectError,
    ConnectionClosed,
    ConnectTimeout,
    DigestMismatch,
    InsufficientStorage,
    InternalError,
    InvalidArgument,
    InvalidArgumentType,
    LocalProtocolError,
    NotFound,
    NotLeader,
    ProtocolError,
    ReadTimeout,
    RemoteProtocolError,
    ServerError,
    Timeout,
    TLSError,
    TooLarge,
    TransportError,
    UnsupportedVersion,
    WriteTimeout,
)

# The rest is loaded when first asked for (blobsvc.BlobServer, from blobsvc import BlobClient):
# a client, a PySpark worker or the command line imports only the parts it uses.
if typing.TYPE_CHECKING:
    from .cache import BlobCache
    from .client import AsyncBlobClient, BlobClient, BlobInfo
    from .config import Settings
    from .server import BlobServer
    from .storage import BlobStorage
    from .wire._ids import digest_of, new_job_id
    from .wire._tls import client_tls_context, server_tls_context

__getattr__, __dir__ = _lazy.lazy_exports(
    __name__,
    {
        ".cache": ["BlobCache"],
        ".client": ["AsyncBlobClient", "BlobClient", "BlobInfo"],
        ".config": ["Settings"],
        ".server": ["BlobServer"],
        ".storage": ["BlobStorage"],
        ".wire._ids": ["digest_of", "new_job_id"],
        ".wire._tls": ["client_tls_context", "server_tls_context"],
    },
)

__all__ = [
    "AsyncBlobClient",
    "AuthFailed",
    "AuthRequired",
    "BadOffset",
    "BadRequest",
    "BlobCache",
    "BlobClient",
    "BlobError",
    "BlobInfo",
    "BlobServer",
    "BlobStorage",
    "Busy",
    "ClientClosed",
    "ConnectError",
    "ConnectTimeout",
    "ConnectionClosed",
    "DigestMismatch",
    "InsufficientStorage",
    "InternalError",
    "InvalidArgument",
    "InvalidArgumentType",
    "LocalProtocolError",
    "NotFound",
    "NotLeader",
    "ProtocolError",
    "ReadTimeout",
    "RemoteProtocolError",
    "ServerError",
    "Settings",
    "TLSError",
    "Timeout",
    "TooLarge",
    "TransportError",
    "UnsupportedVersion",
    "WriteTimeout",
    "client_tls_context",
    "digest_of",
    "new_job_id",
    "server_tls_context",
]
