"""Finding a cluster's leader from a ``zk://HOST:PORT[,HOST:PORT…]/CLUSTER_ID`` URL.

:Status: Production, tested against a real ZooKeeper (tests/test_ha_zookeeper.py).

Session loss: a client only reads. While its ZooKeeper connection is SUSPENDED its reads
fail and the caller retries; after LOST kazoo opens a new session by itself. Nothing is
cached across a failure: each look-up after a failed request reads the ``leader`` node
afresh, and waits (bounded) for it to name someone other than the server that just
failed, which is how a client rides out a failover without being told.

The URL's syntax (:func:`~blobsvc.config.parse_zk_url`) lives in :mod:`blobsvc.config`, below this
package, so that settings check a ``zk://`` server without importing HA.

One kazoo client per ZooKeeper ensemble per process, started on first use and replaced
after a fork (Spark forks its Python workers).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._exceptions import ConnectError
from ..config import ZK_SCHEME, check_cluster_id, is_zk_url, parse_zk_url

__all__ = [
    "ZK_SCHEME",
    "LeaderResolver",
    "ZkPaths",
    "check_cluster_id",
    "connect_zookeeper",
    "is_zk_url",
    "parse_zk_url",
    "require_kazoo",
]

# kazoo logs each failed connection attempt at WARNING. A server configures logging and keeps
# those lines; in a process that configures none (the CLI's client commands, a user's script)
# Python's last-resort handler would print them to stderr around blobsvc's own one-line error.
logging.getLogger("kazoo").addHandler(logging.NullHandler())

INSTALL_HINT = "pip install blobsvc[ha]"


def require_kazoo() -> None:
    """Fail with one line naming the extra when kazoo is not installed."""
    try:
        import kazoo  # noqa: F401
    except ImportError:
        raise ImportError(f"ZooKeeper high availability needs kazoo and fsspec: {INSTALL_HINT}") from None


@dataclass(frozen=True)
class ZkPaths:
    """The ZooKeeper nodes of one cluster (drawn in :mod:`blobsvc.ha.leader`)."""

    cluster_id: str

    @property
    def root(self) -> str:
        return f"/blobsvc/{self.cluster_id}"

    @property
    def election(self) -> str:
        return f"{self.root}/election"

    @property
    def epoch(self) -> str:
        return f"{self.root}/epoch"

    @property
    def leader(self) -> str:
        return f"{self.root}/leader"


def connect_zookeeper(hosts: str, *, session_timeout: float, timeout: float) -> Any:
    """A started KazooClient; fails with :class:`ConnectError` after ``timeout`` seconds.

    Once started, the client reconnects for ever (a running server suspends and waits, see
    :mod:`.leader`); only this first connection is bounded."""
    require_kazoo()
    from kazoo.client import KazooClient
    from kazoo.retry import KazooRetry

    try:
        client = KazooClient(
            hosts=hosts,
            timeout=session_timeout,
            connection_retry=KazooRetry(max_tries=-1, max_delay=1.0),
        )
    except ValueError as exc:  # a port out of range
        raise ValueError(f"not a ZooKeeper address: {hosts!r} ({exc})") from None
    # Not client.start(timeout): on a timeout it waits for the connection thread, which can
    # sit in one handshake with a silent peer for the whole session timeout.
    if not client.start_async().wait(timeout):
        threading.Thread(target=_discard, args=(client,), name="blobsvc-zk-discard", daemon=True).start()
        raise ConnectError(f"cannot reach ZooKeeper at {hosts} within {timeout:g}s (connect_timeout)")
    return client


def _discard(client: Any) -> None:
    """Stop a client that never connected, however long its connection thread takes."""
    with contextlib.suppress(Exception):  # kazoo gives up on a thread stuck past its own limit
        client.stop()
        client.close()


_clients: dict[tuple[int, str], Any] = {}
_clients_lock = threading.Lock()


@atexit.register
def _close_clients() -> None:
    """Close this process's sessions at exit rather than leave them to reconnect and expire."""
    with _clients_lock:
        for (pid, _), client in list(_clients.items()):
            if pid == os.getpid():
                client.stop()
                client.close()
        _clients.clear()


class LeaderResolver:
    """The leader's address for clients of a ``zk://`` URL. Blocking: call in a thread."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.hosts, cluster_id = parse_zk_url(url)
        self.paths = ZkPaths(cluster_id)
        require_kazoo()

    def _client(self, timeout: float) -> Any:
        with _clients_lock:
            key = (os.getpid(), self.hosts)
            client = _clients.get(key)
            if client is None:
                client = connect_zookeeper(self.hosts, session_timeout=10.0, timeout=timeout)
                _clients[key] = client
            return client

    def leader(self, avoid: str | None, timeout: float) -> tuple[str, int]:
        """The leader's ``(host, port)``. With ``avoid`` (a server that could not be reached),
        wait up to ``timeout`` for the leader node to name another."""
        deadline = time.monotonic() + timeout
        client = self._client(timeout)
        while True:
            changed = threading.Event()
            left = max(0.0, deadline - time.monotonic())
            try:
                # exists() sets a watch whether or not the node is there; a request made while
                # disconnected waits for the connection, hence the bound on each.
                stat = client.exists_async(self.paths.leader, watch=_setter(changed)).get(timeout=left)
                data = client.get_async(self.paths.leader).get(timeout=left)[0] if stat else b""
                named, failed = data.decode() or None, False
            except Exception:  # NoNodeError in between, a lost connection, a timeout
                named, failed = None, True
            if named is not None and named != avoid:
                return _split(named)
            left = deadline - time.monotonic()
            if left <= 0:
                if named is not None:
                    return _split(named)  # the failure was not a failover after all
                raise ConnectError(f"no leader for cluster {self.paths.cluster_id!r} at {self.hosts}")
            if failed:
                time.sleep(min(left, 0.1))
            else:
                changed.wait(left)


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """A ZooKeeper watch that sets ``event``."""
    return lambda _: event.set()


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)
