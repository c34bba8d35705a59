"""blobsvc: a BLOB server for Spark pipelines and the clients that fetch from it.

The public names are re-exported here; everything else is private to its module.
"""

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
from .cache import BlobCache
from .client import AsyncBlobClient, BlobClient, BlobInfo
from .config import Settings
from .server import BlobServer
from .storage import BlobStorage
from .wire._ids import digest_of, new_job_id
from .wire._tls import client_tls_context, server_tls_context

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
