"""Leader election among the servers of one cluster, with a fencing token.

:Status: Production, tested against a real ZooKeeper (tests/test_ha_zookeeper.py).

Session loss: kazoo's Lock and Election recipes keep believing they hold leadership when
the session is suspended or lost (Curator's LeaderLatch revokes it); this module revokes.

* **SUSPENDED** (the connection dropped, the session may live on): writes stop being
  acknowledged at once. If the connection comes back within the session (CONNECTED) and
  the epoch is still ours, they resume.
* **LOST** (the session expired: our lock node and leader node are gone, another server
  may already lead): step down, then contend again with the new session.
* **Fencing**: the persistent ``epoch`` node's version is bumped by every new leader
  before it acknowledges anything; that version is its token. Every acknowledgement first
  commits a ZooKeeper transaction that only checks ``epoch`` still has our version. ZooKeeper
  orders that check against the next leader's bump, so once another server has been
  elected, the old leader's next check fails: two servers never both acknowledge.
* Nothing here deletes HA data, whatever happens to the session.

ZooKeeper nodes, under ``/blobsvc/<cluster id>``::

    election/…   the contenders' ephemeral sequential lock nodes (kazoo's Lock recipe)
    epoch        persistent; data = id of the last server to lead, version = fencing token
    leader       ephemeral; data = the leader's host:port, for clients and standbys
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import CancelledError, KazooException, NodeExistsError
from kazoo.protocol.states import KazooState

from .discovery import ZkPaths

__all__ = ["LeaderElection"]

log = logging.getLogger("blobsvc.ha")

# How long a stopping server waits for its election thread: a lock acquire in progress
# notices the cancel at its next ZooKeeper reply.
STOP_WAIT = 5.0


class LeaderElection:
    """Contends for leadership of one cluster until :meth:`stop`, in a daemon thread.

    ``on_elected(previous)`` runs in that thread once this server holds the lock and has
    bumped the epoch, before it acknowledges anything; ``previous`` is the id of the server
    that led last ("" for the first leader ever).
    """

    def __init__(
        self,
        client: KazooClient,
        paths: ZkPaths,
        *,
        address: str,
        server_id: str,
        on_elected: Callable[[str], None],
    ) -> None:
        self.client = client
        self.paths = paths
        self.address = address
        self.server_id = server_id
        self.on_elected = on_elected
        self.token: int | None = None
        self.leader: str | None = None
        """The leader's host:port as the ``leader`` node says, None while there is none."""
        self.leader_changes = 0
        """Leaders this server has seen take office (itself included)."""
        self._leader_node: int | None = None
        self._writable = threading.Event()
        self._lost = threading.Event()
        self._stopping = threading.Event()
        self._lock: Any = None
        self._thread = threading.Thread(target=self._campaign, name="blobsvc-election", daemon=True)

    # --- for the server ---------------------------------------------------------------------

    @property
    def role(self) -> str:
        if self._writable.is_set():
            return "leader"
        return "suspended" if self.token is not None else "standby"

    def may_write(self) -> bool:
        """Whether this server leads with a live session right now (no round trip)."""
        return self._writable.is_set()

    def fence(self, timeout: float) -> bool:
        """Whether ZooKeeper confirms our epoch, checked in order with every other write."""
        token = self.token
        if token is None or not self._writable.is_set():
            return False
        transaction = self.client.transaction()
        transaction.check(self.paths.epoch, token)
        try:
            results = transaction.commit_async().get(timeout=timeout)
        except Exception as exc:  # connection loss, timeout: no confirmation, not a verdict
            log.warning("fencing check failed: %s", exc)
            return False
        if results[0] is not True:
            log.error("another server holds a newer epoch than %d: stepping down", token)
            self._step_down()
            return False
        return True

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self.client.add_listener(self._on_state)
        self.client.DataWatch(self.paths.leader, self._on_leader)
        self._thread.start()

    def stop(self) -> None:
        """Step down (the leader node goes at once, so clients move on) and stop contending."""
        self._stopping.set()
        self._step_down()
        lock = self._lock
        if lock is not None:
            lock.cancel()
        self._thread.join(STOP_WAIT)
        self.client.remove_listener(self._on_state)

    def _on_leader(self, data: bytes | None, stat: Any) -> None:
        if stat is not None and stat.czxid != self._leader_node:  # a new node: a new term
            self._leader_node = stat.czxid
            self.leader_changes += 1
        self.leader = data.decode() if data else None

    def _on_state(self, state: str) -> None:
        # kazoo calls this on its connection thread, which must not block on ZooKeeper.
        if state == KazooState.SUSPENDED:
            if self._writable.is_set():
                log.warning("ZooKeeper connection suspended: no writes acknowledged until it returns")
            self._writable.clear()
        elif state == KazooState.LOST:
            self._step_down()
        elif state == KazooState.CONNECTED and self.token is not None and not self._lost.is_set():
            self.client.handler.spawn(self._reconfirm)

    def _reconfirm(self) -> None:
        """After a reconnection within the session: lead on only if the epoch is still ours."""
        try:
            stat = self.client.exists(self.paths.epoch)
        except KazooException as exc:
            log.warning("could not reconfirm leadership: %s", exc)
            return
        if stat is not None and stat.version == self.token and not self._lost.is_set():
            log.info("ZooKeeper connection back within the session: acknowledging writes again")
            self._writable.set()
        else:
            self._step_down()

    def _step_down(self) -> None:
        was_leader = self.token is not None
        self._writable.clear()
        self._lost.set()
        if was_leader:
            log.warning("stepped down from leadership (epoch %s)", self.token)

    # --- the election thread ----------------------------------------------------------------

    def _campaign(self) -> None:
        while not self._stopping.is_set():
            self._lost.clear()
            self._lock = self.client.Lock(self.paths.election, self.address)
            try:
                self._lock.acquire()
                if self._stopping.is_set():
                    break
                self._promote()
            except CancelledError:
                break
            except Exception as exc:  # ZooKeeper trouble, or the local cache could not be reconciled
                log.warning("election attempt failed, trying again: %s", exc)
                self._release()
                self._stopping.wait(0.2)
                continue
            self._lost.wait()
            self._resign()
        self._resign()

    def _promote(self) -> None:
        self.client.ensure_path(self.paths.root)
        with contextlib.suppress(NodeExistsError):
            self.client.create(self.paths.epoch, b"")
        data, stat = self.client.get(self.paths.epoch)
        # A conditional set: if anyone else bumped the epoch since we read it, we are not alone.
        bumped = self.client.set(self.paths.epoch, self.server_id.encode(), version=stat.version)
        self.token = bumped.version
        self.on_elected(data.decode())
        self._writable.set()
        try:
            self.client.create(self.paths.leader, self.address.encode(), ephemeral=True)
        except NodeExistsError:
            # Our own node from before a reconnection; a dead leader's went with its session.
            self.client.set(self.paths.leader, self.address.encode())
        if self._lost.is_set():  # LOST arrived while we were promoting
            self._writable.clear()
        else:
            log.info("elected leader of %s at %s (epoch %d)", self.paths.root, self.address, self.token)

    def _resign(self) -> None:
        """Leave leadership: our leader node and lock node go if the session still lives."""
        self._writable.clear()
        if self.token is not None:
            try:
                _, stat = self.client.get(self.paths.leader)
                if stat.ephemeralOwner == self.client.client_id[0]:
                    self.client.delete(self.paths.leader, version=stat.version)
            except (KazooException, TypeError):
                pass  # gone with the session, or no session to ask with
        self.token = None
        self._release()

    def _release(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            with contextlib.suppress(KazooException):  # the node went with the session
                lock.release()
