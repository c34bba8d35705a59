"""Checkpoint records: each pipeline's writer epoch, id counter and completed checkpoints.

:Status: Production, tested against a real ZooKeeper (tests/test_checkpoints_zookeeper.py).

Flink's ``CheckpointIDCounter`` and the handles of its ``CompletedCheckpointStore``, kept where
the recovery mode keeps what must survive: a record is a few fields (id, time, savepoint flag,
the key and size of the metadata blob) and the metadata itself is a blob. Two kinds:

* :class:`FileCheckpointRecords` (standalone): ``<data dir>/checkpoints/<pipeline>/`` holds
  ``writer`` (the epoch), ``counter`` (the last id given), ``pending/<id>`` and
  ``completed/<id>``, each file written to a temporary name, fsynced, renamed and its
  directory fsynced.
* :class:`ZooKeeperCheckpointRecords` (zookeeper): nodes ``checkpoints/<pipeline>/writer``
  (its version is the epoch), ``counter``, ``pending/<id>`` and ``completed/<id>`` under the
  cluster's root. Every write is one transaction that first checks the cluster's ``epoch``
  node still has this server's fencing token: only the leader writes, and a deposed one's
  write fails whole.

Pending checkpoints are records too (their writer's epoch and deadline, wall-clock), so that a
restarted server or a new leader knows what is in flight and discards none of its state.

**Writer epochs** fence coordinators as leader epochs fence servers: :meth:`register` bumps
the pipeline's epoch and returns it; :meth:`add` and a subsuming :meth:`remove` check, in the
same atomic step as the write (the transaction; in standalone, under the records' lock), that
the epoch given is still the pipeline's, else raise :class:`Fenced`; so do
:meth:`add_pending` (a trigger). So once a new coordinator
registered, an older one can never complete or subsume.

Session loss (zookeeper): every write's transaction fails on a SUSPENDED or LOST session or a
newer epoch (NOT_LEADER); reads may fail (the caller answers INTERNAL_ERROR). Nothing here is
cached, so a new leader reads the records as the last one left them.

Every method blocks: the server calls them in worker threads.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from .._exceptions import Fenced, NotFound, NotLeader
from ..wire._checkpoints import check_pipeline
from .discovery import ZkPaths
from .store import _LocalFiles

__all__ = ["CheckpointRecords", "FileCheckpointRecords", "ZooKeeperCheckpointRecords", "Record"]

log = logging.getLogger("blobsvc.checkpoints")

Record = dict[str, Any]
"""``{"id", "timestamp", "savepoint", "metadata" (key hex), "metadata_size", "epoch"}``; a
record that cannot be read is ``{"id", "problem"}``."""

_ID_WIDTH = 20  # zero-padded ids sort as numbers do


def _id_name(checkpoint_id: int) -> str:
    return f"{checkpoint_id:0{_ID_WIDTH}d}"


def _parse_record(checkpoint_id: int, raw: bytes) -> Record:
    try:
        record = json.loads(raw)
        if not isinstance(record, dict) or record.get("id") != checkpoint_id:
            raise ValueError("not this checkpoint's record")
        return record
    except (ValueError, UnicodeDecodeError) as exc:
        return {"id": checkpoint_id, "problem": f"its record is damaged: {exc}"}


def _parse_pending(raw: bytes) -> Record:
    """A pending checkpoint's entry; a damaged one is taken as pending for ever (nothing of the
    pipeline is discarded) rather than as ended."""
    try:
        entry = json.loads(raw)
        if isinstance(entry, dict) and isinstance(entry.get("deadline"), int | float):
            return entry
    except (ValueError, UnicodeDecodeError):
        pass
    return {"epoch": None, "deadline": float("inf")}


def _encode(record: Record) -> bytes:
    return json.dumps(record, separators=(",", ":"), sort_keys=True).encode()


class CheckpointRecords(Protocol):
    def register(self, pipeline: str) -> int:
        """A new writer epoch for ``pipeline``, fencing every earlier one at once."""

    def writer(self, pipeline: str) -> int:
        """The pipeline's current writer epoch (0: never registered)."""

    def next_id(self, pipeline: str) -> int:
        """The next checkpoint id: greater than every id given before, across restarts."""

    def add(self, pipeline: str, epoch: int, record: Record) -> None:
        """Add a completed checkpoint's record durably, if ``epoch`` is still the writer's
        (else :class:`Fenced`). Adding the same record again is a no-op."""

    def remove(self, pipeline: str, epoch: int | None, checkpoint_id: int) -> None:
        """Remove a record: as the writer ``epoch`` (subsuming; :class:`Fenced` if replaced), or
        as an operator (None). :class:`NotFound` when there is none."""

    def records(self, pipeline: str) -> list[Record]:
        """The completed checkpoints' records, by id."""

    def add_pending(
        self, pipeline: str, epoch: int, checkpoint_id: int, deadline: float, savepoint: bool = False
    ) -> None:
        """Record a triggered checkpoint (a savepoint or not) until ``deadline`` (Unix time), if
        ``epoch`` is still the writer's (else :class:`Fenced`)."""

    def remove_pending(self, pipeline: str, checkpoint_ids: list[int]) -> None:
        """Forget pending checkpoints (completed, aborted, expired); those not there are skipped."""

    def pending(self, pipeline: str) -> dict[int, Record]:
        """The pending checkpoints: id → ``{"epoch", "deadline", "savepoint"}``."""

    def pipelines(self) -> list[str]:
        """Every pipeline that has records."""


class FileCheckpointRecords:
    """Standalone: small fsynced files under ``root`` (the data directory's ``checkpoints/``)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._files = _LocalFiles(root)
        # Writes are a few hundred bytes each: one lock for every pipeline keeps them simple.
        self._lock = threading.Lock()

    def _read_int(self, path: str) -> int:
        try:
            return int((self.root / path).read_text() or 0)
        except FileNotFoundError:
            return 0

    def _bump(self, pipeline: str, name: str) -> int:
        """The number in ``<pipeline>/<name>`` plus one, durable before it is returned."""
        path = f"{check_pipeline(pipeline)}/{name}"
        with self._lock:
            number = self._read_int(path) + 1
            self._files.write_bytes(path, str(number).encode())
            return number

    def register(self, pipeline: str) -> int:
        return self._bump(pipeline, "writer")

    def writer(self, pipeline: str) -> int:
        return self._read_int(f"{check_pipeline(pipeline)}/writer")

    def next_id(self, pipeline: str) -> int:
        return self._bump(pipeline, "counter")

    def _check_writer(self, pipeline: str, epoch: int) -> None:
        current = self._read_int(f"{pipeline}/writer")
        if epoch != current:
            raise Fenced(f"pipeline {pipeline}: coordinator epoch {epoch} was replaced by epoch {current}")

    def add(self, pipeline: str, epoch: int, record: Record) -> None:
        check_pipeline(pipeline)
        path = f"{pipeline}/completed/{_id_name(record['id'])}"
        with self._lock:
            self._check_writer(pipeline, epoch)
            if (self.root / path).exists():
                return
            self._files.write_bytes(path, _encode(record))

    def remove(self, pipeline: str, epoch: int | None, checkpoint_id: int) -> None:
        check_pipeline(pipeline)
        path = f"{pipeline}/completed/{_id_name(checkpoint_id)}"
        with self._lock:
            if epoch is not None:
                self._check_writer(pipeline, epoch)
            if not (self.root / path).exists():
                raise NotFound(f"pipeline {pipeline} has no checkpoint {checkpoint_id}")
            self._files.remove(path)

    def add_pending(
        self, pipeline: str, epoch: int, checkpoint_id: int, deadline: float, savepoint: bool = False
    ) -> None:
        check_pipeline(pipeline)
        with self._lock:
            self._check_writer(pipeline, epoch)
            entry = {"epoch": epoch, "deadline": deadline, "savepoint": savepoint}
            self._files.write_bytes(f"{pipeline}/pending/{_id_name(checkpoint_id)}", _encode(entry))

    def remove_pending(self, pipeline: str, checkpoint_ids: list[int]) -> None:
        check_pipeline(pipeline)
        with self._lock:
            for checkpoint_id in checkpoint_ids:
                self._files.remove(f"{pipeline}/pending/{_id_name(checkpoint_id)}")

    def pending(self, pipeline: str) -> dict[int, Record]:
        check_pipeline(pipeline)
        found = {}
        for name in self._files.listdir(f"{pipeline}/pending"):
            if name.isdigit():
                try:
                    found[int(name)] = _parse_pending((self.root / pipeline / "pending" / name).read_bytes())
                except FileNotFoundError:  # removed since the listing
                    continue
        return found

    def pipelines(self) -> list[str]:
        return [name for name in self._files.listdir("") if (self.root / name).is_dir()]

    def records(self, pipeline: str) -> list[Record]:
        check_pipeline(pipeline)
        found = []
        for name in sorted(self._files.listdir(f"{pipeline}/completed")):
            if name.isdigit():
                try:
                    raw = (self.root / pipeline / "completed" / name).read_bytes()
                except FileNotFoundError:  # removed since the listing
                    continue
                found.append(_parse_record(int(name), raw))
        return found


class ZooKeeperCheckpointRecords:
    """Zookeeper mode: nodes under ``/blobsvc/<cluster id>/checkpoints``, written by the leader
    only: each write's transaction first checks the cluster epoch's version is ``token()``."""

    def __init__(self, client: Any, paths: ZkPaths, token: Callable[[], int | None]) -> None:
        self.client = client
        self.paths = paths
        self._token = token
        self._ensured: set[str] = set()  # pipelines whose nodes exist: three round trips saved a write

    def _root(self, pipeline: str) -> str:
        return f"{self.paths.root}/checkpoints/{check_pipeline(pipeline)}"

    def _transaction(self) -> Any:
        token = self._token()
        if token is None:
            raise NotLeader("this server does not lead; it writes no checkpoint records")
        transaction = self.client.transaction()
        transaction.check(self.paths.epoch, token)
        return transaction

    def _commit(self, transaction: Any, pipeline: str, epoch: int | None = None) -> list[Any]:
        """Commit; the first failed operation says why: the cluster epoch (NOT_LEADER), the
        writer epoch (FENCED), or the operation itself (its exception)."""
        from kazoo.exceptions import RolledBackError

        results = transaction.commit()
        failures = [result for result in results if isinstance(result, Exception)]
        if not failures:
            return list(results)
        if not isinstance(results[0], RolledBackError) and isinstance(results[0], Exception):
            raise NotLeader("another server holds a newer epoch: this one no longer leads")
        if epoch is not None and isinstance(results[1], Exception) and not isinstance(results[1], RolledBackError):
            raise Fenced(f"pipeline {pipeline}: coordinator epoch {epoch} was replaced by a newer one")
        raise next(failure for failure in failures if not isinstance(failure, RolledBackError))

    def _ensure(self, pipeline: str) -> str:
        root = self._root(pipeline)
        if root not in self._ensured:
            for node in (f"{root}/completed", f"{root}/pending", f"{root}/writer", f"{root}/counter"):
                self.client.ensure_path(node)
            self._ensured.add(root)
        return root

    def register(self, pipeline: str) -> int:
        from kazoo.exceptions import BadVersionError

        root = self._ensure(pipeline)
        while True:
            stat = self.client.exists(f"{root}/writer")
            transaction = self._transaction()
            transaction.set_data(f"{root}/writer", b"", version=stat.version)
            try:
                self._commit(transaction, pipeline)
            except BadVersionError:  # another registration came first: bump once more
                continue
            return int(stat.version) + 1

    def writer(self, pipeline: str) -> int:
        stat = self.client.exists(f"{self._root(pipeline)}/writer")
        return 0 if stat is None else int(stat.version)

    def next_id(self, pipeline: str) -> int:
        from kazoo.exceptions import BadVersionError

        root = self._ensure(pipeline)
        while True:
            data, stat = self.client.get(f"{root}/counter")
            checkpoint_id = int(data or b"0") + 1
            transaction = self._transaction()
            transaction.set_data(f"{root}/counter", str(checkpoint_id).encode(), version=stat.version)
            try:
                self._commit(transaction, pipeline)
            except BadVersionError:
                continue
            return checkpoint_id

    def add(self, pipeline: str, epoch: int, record: Record) -> None:
        from kazoo.exceptions import NodeExistsError

        root = self._ensure(pipeline)
        transaction = self._transaction()
        transaction.check(f"{root}/writer", epoch)
        transaction.create(f"{root}/completed/{_id_name(record['id'])}", _encode(record))
        try:
            self._commit(transaction, pipeline, epoch)
        except NodeExistsError:
            return

    def remove(self, pipeline: str, epoch: int | None, checkpoint_id: int) -> None:
        from kazoo.exceptions import NoNodeError

        root = self._root(pipeline)
        transaction = self._transaction()
        if epoch is not None:
            transaction.check(f"{root}/writer", epoch)
        transaction.delete(f"{root}/completed/{_id_name(checkpoint_id)}")
        try:
            self._commit(transaction, pipeline, epoch)
        except NoNodeError:
            raise NotFound(f"pipeline {pipeline} has no checkpoint {checkpoint_id}") from None

    def add_pending(
        self, pipeline: str, epoch: int, checkpoint_id: int, deadline: float, savepoint: bool = False
    ) -> None:
        root = self._ensure(pipeline)
        transaction = self._transaction()
        transaction.check(f"{root}/writer", epoch)
        entry = {"epoch": epoch, "deadline": deadline, "savepoint": savepoint}
        transaction.create(f"{root}/pending/{_id_name(checkpoint_id)}", _encode(entry))
        self._commit(transaction, pipeline, epoch)

    def remove_pending(self, pipeline: str, checkpoint_ids: list[int]) -> None:
        from kazoo.exceptions import NoNodeError

        root = self._root(pipeline)
        for checkpoint_id in checkpoint_ids:
            transaction = self._transaction()
            transaction.delete(f"{root}/pending/{_id_name(checkpoint_id)}")
            try:
                self._commit(transaction, pipeline)
            except NoNodeError:
                continue

    def pending(self, pipeline: str) -> dict[int, Record]:
        from kazoo.exceptions import NoNodeError

        root = self._root(pipeline)
        try:
            names = self.client.get_children(f"{root}/pending")
        except NoNodeError:
            return {}
        found = {}
        for name in names:
            if name.isdigit():
                try:
                    data, _ = self.client.get(f"{root}/pending/{name}")
                except NoNodeError:
                    continue
                found[int(name)] = _parse_pending(data)
        return found

    def pipelines(self) -> list[str]:
        from kazoo.exceptions import NoNodeError

        try:
            return list(self.client.get_children(f"{self.paths.root}/checkpoints"))
        except NoNodeError:
            return []

    def records(self, pipeline: str) -> list[Record]:
        from kazoo.exceptions import NoNodeError

        root = self._root(pipeline)
        try:
            names = self.client.get_children(f"{root}/completed")
        except NoNodeError:
            return []
        found = []
        for name in sorted(names):
            if name.isdigit():
                try:
                    data, _ = self.client.get(f"{root}/completed/{name}")
                except NoNodeError:
                    continue
                found.append(_parse_record(int(name), data))
        return found
