"""A toy sentiment model: the sum of each word's weight from a lexicon file.

The pipeline ships this package as a zip (a ``py_files`` entry) and the lexicon as a file."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

__all__ = ["score"]


@lru_cache(maxsize=4)
def _lexicon(path: str) -> dict[str, float]:
    # Once per Python worker: tasks reuse their worker, and the file never changes (it is
    # verified, read-only, and named by its content).
    weights: dict[str, float] = json.loads(Path(path).read_text())
    return weights


def score(text: str, lexicon: Path) -> float:
    weights = _lexicon(str(lexicon))
    return sum(weights.get(word, 0.0) for word in re.findall(r"[a-z']+", text.lower()))
