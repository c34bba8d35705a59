"""Restores' holds on checkpoints: what a restore under way keeps from being discarded.

A hold lives in this server's memory until it is released or its deadline (monotonic clock)
passes; :meth:`Holds.expire` drops every pipeline's expired holds at once, so that an idle
pipeline's forgotten holds never count against another's restores (:data:`MAX_HOLDS`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

__all__ = ["MAX_HOLDS", "Holds"]

MAX_HOLDS = 10_000  # a restore per task: a pipeline of thousands of partitions restores at once


class Holds:
    """Every pipeline's holds: pipeline → token → (deadline, checkpoint id, state keys)."""

    def __init__(self) -> None:
        self._holds: dict[str, dict[str, tuple[float, int, frozenset[bytes]]]] = {}

    def __len__(self) -> int:
        return sum(map(len, self._holds.values()))

    def add(self, pipeline: str, token: str, seconds: float, checkpoint_id: int, keys: frozenset[bytes]) -> None:
        self._holds.setdefault(pipeline, {})[token] = (time.monotonic() + seconds, checkpoint_id, keys)

    def release(self, pipeline: str, token: object) -> bool:
        """Whether ``token`` was a hold of ``pipeline`` (it is gone now)."""
        holds = self._holds.get(pipeline, {})
        if not isinstance(token, str) or holds.pop(token, None) is None:
            return False
        if not holds:
            del self._holds[pipeline]
        return True

    def held(self, pipeline: str) -> Iterator[tuple[int, frozenset[bytes]]]:
        """The checkpoint id and state keys of each of ``pipeline``'s holds."""
        for _, checkpoint_id, keys in self._holds.get(pipeline, {}).values():
            yield checkpoint_id, keys

    def expire(self) -> list[str]:
        """Drop every expired hold; the pipelines that lost one (their state may go now)."""
        now = time.monotonic()
        touched = []
        for pipeline, holds in list(self._holds.items()):
            expired = [token for token, (deadline, _, _) in holds.items() if deadline < now]
            for token in expired:
                del holds[token]
            if expired:
                touched.append(pipeline)
            if not holds:
                del self._holds[pipeline]
        return touched
