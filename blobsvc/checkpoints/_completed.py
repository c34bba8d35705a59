"""CompletedCheckpoint: what a restore reads, Flink's ``CompletedCheckpoint``.

A completed checkpoint is its server record (id, time, savepoint flag, the key of its
metadata blob) and the metadata read from that blob, verified against the key: the
properties given at trigger and every task's handle. :meth:`CompletedCheckpoint.restore`
writes one task's state back into files.

While a restore runs, the checkpoint is *held* on the server: its state is not discarded even
if the checkpoint is subsumed or deleted meanwhile. The hold lives in the server's memory
(the leader's, in zookeeper mode) and lasts ``hold_seconds`` at most; a server restart or a
failover drops it, and a restore whose state went meanwhile fails (every byte is verified)
rather than return other bytes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import blake3

from .._exceptions import BlobError, CheckpointError, InvalidArgument
from ..cache import BlobCache
from ..client import BlobClient
from ..wire._checkpoints import Metadata, Task, TaskHandle, check_task, metadata_name, parse_metadata, pipeline_job
from ._restore import discard, restore

__all__ = ["DEFAULT_HOLD_SECONDS", "CompletedCheckpoint", "holding", "load_checkpoint"]

log = logging.getLogger("blobsvc.checkpoints")

DEFAULT_HOLD_SECONDS = 3600.0


@contextlib.contextmanager
def holding(client: BlobClient, pipeline: str, checkpoint_id: int, seconds: float) -> Iterator[None]:
    """Keep completed checkpoint ``checkpoint_id``'s state on the server for the block (at most
    ``seconds``), even if it is subsumed or deleted meanwhile: a restore under way."""
    request = {"action": "hold", "pipeline": pipeline, "id": checkpoint_id, "seconds": seconds}
    token = client.checkpoints(request)["token"]
    try:
        yield
    finally:
        try:
            client.checkpoints({"action": "release", "pipeline": pipeline, "token": token})
        except BlobError as exc:  # the hold expires by itself
            log.warning("pipeline %s: could not release the hold on checkpoint %d: %s", pipeline, checkpoint_id, exc)


class _Hold:
    """The server's hold on a checkpoint, shared by the restores under way in this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.held = contextlib.ExitStack()


@dataclass(frozen=True)
class CompletedCheckpoint:
    """A completed checkpoint of ``pipeline``: ``id``, ``timestamp`` (trigger time, Unix
    seconds), ``savepoint``, ``properties`` and ``tasks`` (task → :class:`TaskHandle`), from
    its ``metadata``, the blob whose key is ``metadata_key``."""

    metadata: Metadata
    metadata_key: str
    _client: BlobClient = field(repr=False, compare=False)
    _cache: BlobCache | None = field(default=None, repr=False, compare=False)
    hold_seconds: float = field(default=DEFAULT_HOLD_SECONDS, repr=False, compare=False)
    _hold: _Hold = field(default_factory=lambda: _Hold(), repr=False, compare=False)

    @property
    def pipeline(self) -> str:
        return self.metadata.pipeline

    @property
    def id(self) -> int:
        return self.metadata.checkpoint_id

    @property
    def timestamp(self) -> float:
        return self.metadata.timestamp

    @property
    def savepoint(self) -> bool:
        return self.metadata.savepoint

    @property
    def properties(self) -> Mapping[str, Any]:
        return self.metadata.properties

    @property
    def tasks(self) -> Mapping[str, TaskHandle]:
        return self.metadata.tasks

    @property
    def size(self) -> int:
        """Bytes of state, every task's together."""
        return self.metadata.size

    def restore(self, task: Task, dest: str | os.PathLike[str], *, writable: bool = False) -> Path:
        """Write ``task``'s state at ``dest`` (a directory for a directory's state, else a
        file), every byte verified; files read-only unless ``writable``. ``dest`` must not
        exist (or be an empty directory). Returns ``dest``."""
        handle = self.tasks.get(check_task(task))
        if handle is None:
            raise InvalidArgument(
                f"checkpoint {self.id} of {self.pipeline} has no task {task!r}; its tasks: {_names(self.tasks)}"
            )
        with self.held():
            return restore(self.pipeline, handle, dest, client=self._client, cache=self._cache, writable=writable)

    def restore_all(self, dest: str | os.PathLike[str], *, writable: bool = False) -> Path:
        """Write every task's state under ``dest/<task>``, verified, as one operation: all of
        it appears at ``dest`` at once, or nothing does. ``dest`` must not exist (or be an
        empty directory). For instance to go on with another number of partitions. Returns
        ``dest``."""
        dest = Path(dest)
        if os.path.lexists(dest) and not (dest.is_dir() and not dest.is_symlink() and not any(dest.iterdir())):
            raise InvalidArgument(f"{dest} exists: a restore writes a new directory (or into an empty one)")
        if not dest.parent.is_dir():
            raise InvalidArgument(f"{dest.parent} is not a directory: a restore writes into one that exists")
        temp = dest.parent / f".{dest.name}.restore-{secrets.token_hex(6)}"
        try:
            temp.mkdir()
            with self.held():
                for task, handle in self.tasks.items():
                    restore(
                        self.pipeline, handle, temp / task, client=self._client, cache=self._cache, writable=writable
                    )
            if dest.is_dir():
                dest.rmdir()
            os.rename(temp, dest)
        except BaseException as exc:
            discard(temp)
            if isinstance(exc, OSError | CheckpointError):  # name what the user gave
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
                raise CheckpointError(
                    f"cannot restore checkpoint {self.id} of {self.pipeline} to {dest}: {reason}"
                ) from exc
            raise
        return dest

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Keep this checkpoint's state on the server for the block (at most ``hold_seconds``),
        even if it is subsumed or deleted meanwhile. Blocks inside one share its hold."""
        hold = self._hold
        with hold.lock:
            if hold.users == 0:
                hold.held.enter_context(holding(self._client, self.pipeline, self.id, self.hold_seconds))
            hold.users += 1
        try:
            yield
        finally:
            with hold.lock:
                hold.users -= 1
                if hold.users == 0:
                    hold.held.close()

    def to_json(self) -> dict[str, Any]:
        """The checkpoint as JSON: what ``blobsvc checkpoints show --json`` prints."""
        return {
            "pipeline": self.pipeline,
            "id": self.id,
            "timestamp": self.timestamp,
            "savepoint": self.savepoint,
            "properties": dict(self.properties),
            "metadata": self.metadata_key,
            "size": self.size,
            "tasks": {task: handle.to_json() for task, handle in self.tasks.items()},
        }


def _names(tasks: Mapping[str, Any], shown: int = 10) -> str:
    names = sorted(tasks)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def load_checkpoint(
    client: BlobClient, pipeline: str, record: Mapping[str, Any], cache: BlobCache | None, hold_seconds: float
) -> CompletedCheckpoint:
    """The checkpoint of a server record, its metadata read and verified against the record's
    key: :class:`CheckpointError` when it is missing, damaged or malformed."""
    checkpoint_id = record["id"]
    if "problem" in record:
        raise CheckpointError(f"checkpoint {checkpoint_id} of {pipeline} cannot be restored: {record['problem']}")
    key = record.get("metadata")
    try:
        raw = client.get(job=pipeline_job(pipeline), name=metadata_name(checkpoint_id))
        if blake3.blake3(raw).hexdigest() != key:
            raise CheckpointError(f"its metadata blob does not hash to {key}")
        metadata = parse_metadata(raw)
        if (metadata.pipeline, metadata.checkpoint_id) != (pipeline, checkpoint_id):
            raise CheckpointError(f"its metadata is checkpoint {metadata.checkpoint_id} of {metadata.pipeline}")
    except (BlobError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {checkpoint_id} of {pipeline} cannot be restored: {exc}") from exc
    return CompletedCheckpoint(metadata, str(key), client, cache, hold_seconds)
