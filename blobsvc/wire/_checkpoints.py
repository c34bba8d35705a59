"""What the client and the server both know of checkpoints: a pipeline's name and job, the
names of its blobs, and the format of a checkpoint's metadata.

A pipeline's blobs live under one job, derived from its name: its state files as
``state/<key>`` (one name per content, shared by every checkpoint whose tasks hold it) and
each checkpoint's metadata as ``meta/<id>``. A name per content is what keeps the content on
the server: retention never deletes what a job names.

The metadata is JSON: the checkpoint's id, time, savepoint flag, properties, and per task a
handle listing its files (relative path, size, key, whether its bytes were sent). Everything
in it is parsed as hostile (:func:`parse_metadata`): it comes from a client, and a restore
turns its paths into files.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from typing import Any

import blake3

from .._exceptions import InvalidArgument
from ._protocol import JOB_SIZE

__all__ = [
    "MAX_FILES",
    "MAX_METADATA_BYTES",
    "MAX_METADATA_VALUES",
    "MAX_TASKS",
    "METADATA_FORMAT",
    "FileEntry",
    "Metadata",
    "Task",
    "TaskHandle",
    "check_pipeline",
    "check_task",
    "metadata_id",
    "metadata_name",
    "parse_metadata",
    "pipeline_job",
    "state_key",
    "state_name",
]

# A pipeline name is a directory name on the server and a ZooKeeper node's: letters, digits,
# dot, dash and underscore, starting with a letter or digit (never "." or "..").
_PIPELINE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
# A task name appears in paths nowhere, but in every listing: printable, short.
_TASK = re.compile(r"[A-Za-z0-9._:-]{1,128}")
METADATA_FORMAT = 1
# Limits on what a metadata blob may hold: the server reads it whole to learn what state a
# checkpoint references. 10,000 tasks of 100,000 files between them is far beyond a pipeline.
MAX_TASKS = 10_000
MAX_FILES = 100_000
# 100,000 files make 13.8 MiB of metadata with 30-byte paths, 16.7 MiB with 60-byte ones: 16
# MiB holds 100,000 files whose paths average up to 50 bytes. Parsing costs the server about
# five times the blob's size at its peak (benchmarks/RESULTS.md), so this bounds its memory.
MAX_METADATA_BYTES = 16 << 20
# JSON values a metadata blob may hold, counted before it is parsed: a file entry is about
# five (object, separators), a task a few more, the properties a bounded allowance. A blob of
# tiny values ("[[],[],...]") would otherwise cost the parser ~20 times its size in objects.
MAX_METADATA_VALUES = 8 * MAX_FILES + 8 * MAX_TASKS + 100_000
MAX_PATH_BYTES = 4096
STATE_PREFIX = "state/"
METADATA_PREFIX = "meta/"


def check_pipeline(pipeline: object) -> str:
    """``pipeline`` when it is a valid pipeline name, else :class:`InvalidArgument`."""
    if not isinstance(pipeline, str) or not _PIPELINE.fullmatch(pipeline):
        raise InvalidArgument(
            f"a pipeline name is 1 to 128 letters, digits, '.', '-' or '_', starting with a letter or digit, "
            f"not {pipeline!r}"
        )
    return pipeline


Task = str | int
"""A task's name: text, or a number (a partition's) that stands for its decimal text."""


def check_task(task: object) -> str:
    """``task``'s name (a number as its decimal text) when it is a valid one, else
    :class:`InvalidArgument`."""
    if isinstance(task, int) and not isinstance(task, bool) and task >= 0:
        task = str(task)
    if not isinstance(task, str) or not _TASK.fullmatch(task):
        raise InvalidArgument(f"a task name is 1 to 128 letters, digits, '.', ':', '-' or '_', not {task!r}")
    return task


def pipeline_job(pipeline: str) -> bytes:
    """The job that holds ``pipeline``'s blobs: the same on every server, for every run."""
    return blake3.blake3(b"blobsvc checkpoints\0" + check_pipeline(pipeline).encode()).digest(JOB_SIZE)


def state_name(key: bytes) -> str:
    return STATE_PREFIX + key.hex()


def metadata_name(checkpoint_id: int) -> str:
    return f"{METADATA_PREFIX}{checkpoint_id:020d}"


def state_key(name: str) -> bytes | None:
    """The key a ``state/<key>`` name holds, None for any other name."""
    if not name.startswith(STATE_PREFIX):
        return None
    hexa = name[len(STATE_PREFIX) :]
    return bytes.fromhex(hexa) if re.fullmatch(r"[0-9a-f]{64}", hexa) else None


def metadata_id(name: str) -> int | None:
    """The checkpoint id a ``meta/<id>`` name holds, None for any other name."""
    if not name.startswith(METADATA_PREFIX):
        return None
    digits = name[len(METADATA_PREFIX) :]
    return int(digits) if re.fullmatch(r"[0-9]{20}", digits) else None


@dataclass(frozen=True, slots=True)
class FileEntry:
    """One file of a task's state: where it goes under the restore's destination (``""``: the
    state is that one file), its size and key, and whether a snapshot sent its bytes."""

    path: str
    size: int
    key: str
    sent: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size, "key": self.key, "sent": self.sent}


@dataclass(frozen=True, slots=True)
class TaskHandle:
    """A task's state in a checkpoint: what :meth:`CheckpointStore.snapshot` returns and a
    task hands to its coordinator. Small, immutable, picklable and JSON-able
    (:meth:`to_json`, :meth:`from_json`): a Spark task returns it to the driver.

    ``kind`` is ``"bytes"``, ``"file"`` or ``"directory"``; a bytes or file state is one
    entry whose path is ``""``."""

    task: str
    kind: str
    files: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(entry.size for entry in self.files)

    @property
    def bytes_sent(self) -> int:
        return sum(entry.size for entry in self.files if entry.sent)

    def same_state(self, other: TaskHandle) -> bool:
        """Whether ``other`` names the same state (whichever snapshot sent the bytes)."""
        return (self.task, self.kind, _contents(self.files)) == (other.task, other.kind, _contents(other.files))

    def to_json(self) -> dict[str, Any]:
        return {"task": self.task, "kind": self.kind, "files": [entry.to_json() for entry in self.files]}

    @classmethod
    def from_json(cls, document: object) -> TaskHandle:
        """A handle from its JSON form, every field checked (:class:`InvalidArgument`)."""
        if not isinstance(document, dict):
            raise InvalidArgument("a task handle is a JSON object")
        task = check_task(document.get("task"))
        kind = document.get("kind")
        if kind not in ("bytes", "file", "directory"):
            raise InvalidArgument(f"task {task}: a handle's kind is bytes, file or directory, not {kind!r}")
        raw_files = document.get("files")
        if not isinstance(raw_files, list) or len(raw_files) > MAX_FILES:
            raise InvalidArgument(f"task {task}: a handle's files are a list of at most {MAX_FILES}")
        files = tuple(_file_entry(task, raw) for raw in raw_files)
        if kind != "directory" and (len(files) != 1 or files[0].path != ""):
            raise InvalidArgument(f"task {task}: a {kind} handle holds exactly one file, at path ''")
        if kind == "directory":
            paths = [entry.path for entry in files]
            if len(set(paths)) != len(paths) or "" in paths:
                raise InvalidArgument(f"task {task}: a directory handle's paths are distinct and not empty")
            _check_no_nesting(task, paths)
        return cls(task, kind, files)


def _contents(files: tuple[FileEntry, ...]) -> list[tuple[str, int, str]]:
    return [(entry.path, entry.size, entry.key) for entry in files]


class _Entry(tuple[Any, ...]):
    """A JSON object shaped like a file entry, as :func:`parse_metadata` reads it: its path,
    size, key and sent flag (:data:`_ABSENT` where the object has none). A tuple of four
    costs a third of a dict: no dict per file survives the parse of a 100,000-file metadata."""

    __slots__ = ()

    def as_dict(self) -> dict[str, Any]:
        return {name: value for name, value in zip(_ENTRY_FIELDS, self, strict=True) if value is not _ABSENT}


_ENTRY_FIELDS = ("path", "size", "key", "sent")
_ABSENT = object()


def _compact(pairs: list[tuple[str, Any]]) -> Any:
    """The parser's hook for each JSON object: an :class:`_Entry` for what looks like a file
    entry (path, size and key, perhaps sent, nothing else, once each), else the dict."""
    if 3 <= len(pairs) <= 4:
        found = dict(pairs)
        if len(found) == len(pairs) and found.keys() >= {"path", "size", "key"} and found.keys() <= {*_ENTRY_FIELDS}:
            return _Entry(found.get(name, _ABSENT) for name in _ENTRY_FIELDS)
    return dict(pairs)


def _as_plain(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` (the properties) with every :class:`_Entry` in it a dict again, as its
    JSON said: walked with a stack, not recursion, in place."""
    stack: list[dict[Any, Any] | list[Any]] = [document]
    while stack:
        container = stack.pop()
        slots: dict[Any, Any] = container if isinstance(container, dict) else dict(enumerate(container))
        for slot, value in slots.items():
            if isinstance(value, _Entry):
                container[slot] = value.as_dict()
            elif isinstance(value, dict | list):
                stack.append(value)
    return document


def _file_entry(task: str, raw: object) -> FileEntry:
    if isinstance(raw, _Entry):
        path, size, key, sent = raw
        sent = False if sent is _ABSENT else sent
    elif isinstance(raw, dict):
        path, size, key, sent = raw.get("path"), raw.get("size"), raw.get("key"), raw.get("sent", False)
    else:
        raise InvalidArgument(f"task {task}: a file entry is a JSON object")
    if not isinstance(path, str) or (path and not _safe_relative(path)):
        raise InvalidArgument(f"task {task}: {path!r} is not a relative path inside the task's state")
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
        raise InvalidArgument(f"task {task}: {path!r} has no valid size")
    if not isinstance(key, str) or not re.fullmatch(r"[0-9a-f]{64}", key):
        raise InvalidArgument(f"task {task}: {path!r} has no valid key")
    if not isinstance(sent, bool):
        raise InvalidArgument(f"task {task}: {path!r}: 'sent' is true or false")
    return FileEntry(path, size, key, sent)


def _safe_relative(path: str) -> bool:
    """A POSIX relative path with no empty, ``.`` or ``..`` part, no NUL and no backslash:
    it can only ever name something under the directory it is joined to."""
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES or "\x00" in path or "\\" in path:
        return False
    parts = path.split("/")
    return all(part not in ("", ".", "..") for part in parts)


def _check_no_nesting(task: str, paths: list[str]) -> None:
    """No file's path is another's directory (``a`` and ``a/b``): a restore could not make both.

    Linear in the paths' bytes (and a sort), whatever their depth: with ``/`` ordered before
    every other character (paths hold no NUL), a path's descendants sort right after it, so
    each path needs comparing with its successor only."""
    ordered = sorted(path.replace("/", "\x00") for path in paths)
    for path, successor in itertools.pairwise(ordered):
        if successor.startswith(path + "\x00"):
            raise InvalidArgument(f"task {task}: {path.replace(chr(0), '/')!r} is both a file and a directory")


@dataclass(frozen=True, slots=True)
class Metadata:
    """A checkpoint's metadata: what its blob ``meta/<id>`` holds."""

    pipeline: str
    checkpoint_id: int
    timestamp: float
    savepoint: bool
    properties: dict[str, Any]
    tasks: dict[str, TaskHandle]

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": METADATA_FORMAT,
                "pipeline": self.pipeline,
                "id": self.checkpoint_id,
                "timestamp": self.timestamp,
                "savepoint": self.savepoint,
                "properties": self.properties,
                "tasks": [handle.to_json() for handle in self.tasks.values()],
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    def keys(self) -> set[bytes]:
        """Every state key the checkpoint references: what its discarding must keep while any
        other retained checkpoint references it too."""
        return {bytes.fromhex(entry.key) for handle in self.tasks.values() for entry in handle.files}

    @property
    def bytes_sent(self) -> int:
        return sum(handle.bytes_sent for handle in self.tasks.values())

    @property
    def size(self) -> int:
        return sum(handle.size for handle in self.tasks.values())


def parse_metadata(raw: bytes | bytearray | str) -> Metadata:
    """Metadata from its blob's bytes (or their text), every field checked (:class:`InvalidArgument`)."""
    if len(raw) > MAX_METADATA_BYTES:
        raise InvalidArgument(f"checkpoint metadata of {len(raw)} bytes is over the limit of {MAX_METADATA_BYTES}")
    try:
        text = raw if isinstance(raw, str) else raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument("checkpoint metadata is not UTF-8 JSON") from None
    del raw  # a caller that kept no reference of its own frees the bytes here, and the text below
    values = text.count("{") + text.count("[") + text.count(",")
    if values > MAX_METADATA_VALUES:
        raise InvalidArgument(f"checkpoint metadata holds more than {MAX_METADATA_VALUES} JSON values")
    try:
        document = json.loads(text, object_pairs_hook=_compact)
    except (ValueError, RecursionError):
        raise InvalidArgument("checkpoint metadata is not UTF-8 JSON") from None
    del text
    if not isinstance(document, dict) or document.get("format") != METADATA_FORMAT:
        raise InvalidArgument(f"checkpoint metadata is not a JSON object of format {METADATA_FORMAT}")
    checkpoint_id, timestamp = document.get("id"), document.get("timestamp")
    if not isinstance(checkpoint_id, int) or isinstance(checkpoint_id, bool) or not 0 < checkpoint_id < 1 << 63:
        raise InvalidArgument("checkpoint metadata has no valid id")
    if not isinstance(timestamp, int | float) or isinstance(timestamp, bool):
        raise InvalidArgument("checkpoint metadata has no valid timestamp")
    savepoint, properties, raw_tasks = document.get("savepoint"), document.get("properties"), document.get("tasks")
    if not isinstance(savepoint, bool) or not isinstance(properties, dict):
        raise InvalidArgument("checkpoint metadata has no valid savepoint flag or properties")
    if not isinstance(raw_tasks, list) or len(raw_tasks) > MAX_TASKS:
        raise InvalidArgument(f"checkpoint metadata's tasks are a list of at most {MAX_TASKS}")
    tasks = {}
    for raw_task in raw_tasks:
        handle = TaskHandle.from_json(raw_task)
        if handle.task in tasks:
            raise InvalidArgument(f"checkpoint metadata lists task {handle.task} twice")
        tasks[handle.task] = handle
    if sum(len(handle.files) for handle in tasks.values()) > MAX_FILES:
        raise InvalidArgument(f"checkpoint metadata lists more than {MAX_FILES} files")
    pipeline = check_pipeline(document.get("pipeline"))
    return Metadata(pipeline, checkpoint_id, float(timestamp), savepoint, _as_plain(properties), tasks)
