"""The bytes of recently read small blobs, so that a GET of a hot small blob costs no
``open``, ``fstat``, ``pread`` or ``close``: a dictionary lookup and one send of the whole
answer, its GetOk header and body encoded once when the entry is made (:meth:`HotBlob.reply`).

What keeps it from serving what is gone or replaced:

* a content-addressed blob's bytes never change under its key; only a DELETE (or retention)
  removes it, and :meth:`BlobStorage.delete` (and ``evict``) calls :meth:`HotBlobs.forget` once the name is unlinked;
* a job-scoped name can be replaced (or removed) by paths this module does not see, so its
  entry keeps the inode it was read from and is served only while a ``stat`` of the name
  still finds that inode (one system call instead of four);
* an entry read before a ``forget`` and stored after it would bring the old bytes back:
  every ``forget`` bumps a generation, and :meth:`HotBlobs.remember` drops entries read
  under an older one.

Bounded by ``max_bytes`` (least recently used entries go first); safe from any thread.
"""

from __future__ import annotations

import collections
import contextlib
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..wire._protocol import ContentKey, GetOk, JobBlob, encode_reply

if TYPE_CHECKING:
    from ._readclock import ReadClock

__all__ = ["HotBlob", "HotBlobs"]

# The bytes kept at most: a few thousand small blobs, a small part of a server's memory.
DEFAULT_MAX_BYTES = 32 << 20


@dataclass(slots=True, eq=False)
class HotBlob:
    size: int
    digest: bytes
    body: bytes | memoryview  # a view into ``_reply`` once made: the bytes are kept once
    path: str | None = None  # job-scoped names: checked against ``inode`` before use
    inode: int = 0
    source: str = ""  # the file it was read from, whose atime records its reads
    read_at: float = 0.0  # the read its atime records (see blobsvc.storage._readclock.ReadClock)
    _reply: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        reply = encode_reply(GetOk(self.size, self.digest)) + self.body
        self._reply = reply
        self.body = memoryview(reply)[len(reply) - len(self.body) :]

    def reply(self, offset: int) -> bytes:
        """The whole answer to a GET from ``offset`` (at most ``size``): header and body."""
        if offset == 0:
            return self._reply
        return self._reply[: len(self._reply) - len(self.body)] + self.body[offset:]


class HotBlobs:
    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES, *, reads: ReadClock | None = None) -> None:
        self.max_bytes = max_bytes
        self.reads = reads
        """Told of every hit, so that a read served from memory counts as one too."""
        self._entries: collections.OrderedDict[ContentKey | JobBlob, HotBlob] = collections.OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.generation = 0
        """Read before opening a blob, passed to :meth:`remember` after reading it."""

    def get(self, target: ContentKey | JobBlob) -> HotBlob | None:
        entry = self._entries.get(target)
        if entry is None:
            return None
        if entry.path is not None:
            try:
                if os.stat(entry.path).st_ino != entry.inode:
                    return None
            except OSError:
                return None
        with self._lock, contextlib.suppress(KeyError):  # forgotten meanwhile
            self._entries.move_to_end(target)
        if self.reads is not None:
            self.reads.hit(entry)
        return entry

    def remember(self, target: ContentKey | JobBlob, generation: int, entry: HotBlob) -> None:
        if len(entry.body) > self.max_bytes:
            return
        with self._lock:
            if generation != self.generation:
                return  # a forget() ran since this was read: it may be of what is gone
            old = self._entries.pop(target, None)
            if old is not None:
                self._bytes -= len(old.body)
            self._entries[target] = entry
            self._bytes += len(entry.body)
            while self._bytes > self.max_bytes:
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= len(evicted.body)

    def forget(self, target: ContentKey | JobBlob) -> None:
        with self._lock:
            self.generation += 1
            old = self._entries.pop(target, None)
            if old is not None:
                self._bytes -= len(old.body)

    def clear(self) -> None:
        with self._lock:
            self.generation += 1
            self._entries.clear()
            self._bytes = 0
