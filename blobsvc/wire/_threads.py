"""Waiting for work handed to a worker thread, which no cancellation can stop."""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["wait_out"]


async def wait_out(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` (work a worker thread does) is done, through any number of
    cancellations (shutdown, then a second Ctrl-C), and re-raise the cancellation after: the
    caller is about to remove or close what the thread works on (a staging file, a file
    being downloaded into), and no thread may touch it after that."""
    cancelled = False
    while not future.done():
        try:
            await asyncio.wait([future])
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
