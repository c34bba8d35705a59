"""How the commands print values for a person (``--json`` prints them as they are)."""

from __future__ import annotations

import datetime

__all__ = ["when"]


def when(timestamp: float | None) -> str:
    """A Unix time as ISO 8601 in UTC (``2026-11-26T21:04:05Z``), the same on every host
    whatever its time zone; ``-`` for none."""
    if timestamp is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")
