"""Which completed checkpoints a pipeline keeps: its retention policy, as the server applies it.

Ray Train's ``CheckpointConfig`` (``num_to_keep``, ``checkpoint_score_attribute``,
``checkpoint_score_order``) with Flink's rule that the latest checkpoint is always kept (a
restart resumes from it):

* ``retain=None``: every checkpoint is kept;
* ``retain=N`` without a score: the newest N;
* ``retain=N`` with ``score`` (a property of the checkpoints) and ``order`` (``"max"``: higher
  is better; ``"min"``: lower is): the N best by that property, and the latest besides.

A checkpoint completed under a score policy must carry the property as a finite number
(BAD_REQUEST otherwise; the client refuses it at ``begin`` already). Older checkpoints without
a recorded score (completed under another policy) count as the worst. Savepoints are outside
every policy: never subsumed.

The policy travels with each completion and is stored in its record: the newest completion's
policy is the pipeline's, applied to every checkpoint of it, so two drivers of one pipeline
(one fenced) never apply two policies at once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .._exceptions import BadRequest
from ..wire._checkpoints import Metadata

__all__ = ["MAX_RETAIN", "RetentionPolicy"]

MAX_RETAIN = 10_000
MAX_SCORE_NAME = 200  # characters of a score property's name


@dataclass(frozen=True)
class RetentionPolicy:
    retain: int | None
    score: str | None = None
    order: str = "max"

    @classmethod
    def from_request(cls, request: dict[str, Any]) -> RetentionPolicy:
        """The policy a ``complete`` request names, every field checked (BAD_REQUEST)."""
        retain = request.get("retain")
        if retain is not None and (
            not isinstance(retain, int) or isinstance(retain, bool) or not 1 <= retain <= MAX_RETAIN
        ):
            raise BadRequest(f"'retain' is null (keep every checkpoint) or from 1 to {MAX_RETAIN:,}")
        score = request.get("score")
        if score is not None and (not isinstance(score, str) or not 0 < len(score) <= MAX_SCORE_NAME):
            raise BadRequest(f"score is null or a property's name (1 to {MAX_SCORE_NAME} characters)")
        order = request.get("score_order", "max")
        if order not in ("max", "min"):
            raise BadRequest('score_order is "max" (higher is better) or "min" (lower is)')
        return cls(retain, score, order)

    def to_record(self) -> dict[str, Any]:
        return {"retain": self.retain, "score": self.score, "order": self.order}

    def score_of(self, metadata: Metadata) -> float | None:
        """The checkpoint's score under this policy: None without a score policy or for a
        savepoint; BAD_REQUEST when the property is missing or not a finite number."""
        if self.score is None or metadata.savepoint:
            return None
        value = metadata.properties.get(self.score)
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise BadRequest(
                f"checkpoint {metadata.checkpoint_id} of {metadata.pipeline}: the pipeline keeps its best "
                f"checkpoints by {self.score!r}, and its property {self.score!r} is {value!r}, not a number"
            )
        return float(value)

    def subsumed(self, records: list[dict[str, Any]]) -> list[int]:
        """The ids of ``records`` (oldest first) this policy no longer keeps."""
        regular = [record for record in records if not record.get("savepoint")]
        if self.retain is None or len(regular) <= self.retain:
            return []
        latest = regular[-1]["id"]
        if self.score is None:
            kept = {record["id"] for record in regular[-self.retain :]}
        else:
            kept = {record["id"] for record in sorted(regular, key=self._rank)[: self.retain]} | {latest}
        return [record["id"] for record in regular if record["id"] not in kept]

    def _rank(self, record: dict[str, Any]) -> tuple[int, float, int]:
        """Best first: scored before unscored, then by score, then newest first."""
        score = record.get("score")
        if not isinstance(score, int | float) or isinstance(score, bool):
            return (1, 0.0, -record["id"])
        return (0, -score if self.order == "max" else score, -record["id"])
