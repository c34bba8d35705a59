"""The agent's heartbeats: it tells the server that it lives, what its cache holds and which
jobs it holds; the server answers which of those jobs are gone, and the agent lets them go.

Rules (docs/protocol.md, "HEARTBEAT", has the fields):

* The first heartbeat goes out as the agent starts, before it listens (waited for at most
  ``connect_timeout``), then one every ``interval`` seconds, as the server's last answer
  asked (``DEFAULT_INTERVAL`` until one came; an answer's interval is held between
  ``MIN_INTERVAL`` and ``MAX_INTERVAL``).
* **Fail closed.** A heartbeat the server refuses for want of a secret (the agent has none,
  or not the server's) raises :class:`~blobsvc.AuthRequired` or :class:`~blobsvc.AuthFailed`
  instead of being logged: the agent then refuses to start, or stops serving. Without a
  secret it would serve, unsigned, whatever the host's secret-holding processes cached.
* A job is released only on the server's word (``gone_jobs``); a heartbeat that fails releases
  nothing, since a server that cannot be reached says nothing of its jobs. The files of a
  released job go one ``cleanup_interval`` later, unless another process holds the job or a
  later request takes it again; its content stays under the cache's LRU rule.
* A server that cannot be reached is logged once when the outage begins and once when it
  ends, not at every beat; the agent keeps serving its cache meanwhile.
* An agent that shuts down cleanly sends a last heartbeat saying so (``stopping``, no jobs:
  it is releasing them all), within ``FAREWELL_TIMEOUT`` seconds, so that the server lists
  its host as stopped rather than lost; one that cannot say it is listed lost in time.
* A heartbeat names at most ``MAX_REPORTED_JOBS`` jobs, so that it stays well inside the
  protocol's 64 KiB; an agent holding more names the next ones in the next heartbeat.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
from collections.abc import Callable, Mapping
from typing import Any

from .._exceptions import AuthFailed, AuthRequired, BlobError
from ..client import AsyncBlobClient
from ..config import package_version
from ._source import CacheSource

__all__ = ["DEFAULT_INTERVAL", "FAREWELL_TIMEOUT", "MAX_INTERVAL", "MAX_REPORTED_JOBS", "MIN_INTERVAL", "Heartbeats"]

log = logging.getLogger("blobsvc.agent")

DEFAULT_INTERVAL = 10.0  # the server's default agent_heartbeat_interval
# The intervals an answer may ask for: no server is asked every millisecond, and an hour
# between heartbeats (or infinity) would keep a gone job's files, or a refusal, unnoticed.
MIN_INTERVAL, MAX_INTERVAL = 0.01, 3600.0
FAREWELL_TIMEOUT = 2.0  # of a shutdown's last heartbeat: a server that does not answer soon is not waited for
# 35 bytes a job id in JSON: 1,000 of them and the counters take about 36 KiB of 64.
MAX_REPORTED_JOBS = 1000


class Heartbeats:
    """Heartbeats of the agent whose face is at ``port``, sent through ``client``."""

    def __init__(
        self,
        client: AsyncBlobClient,
        source: CacheSource,
        port: int,
        counts: Callable[[], Mapping[str, int]],
    ) -> None:
        self.client = client
        self.source = source
        self.counts = counts
        # Every host's agent listens on 127.0.0.1:6131: the host name tells them apart.
        self.host = socket.gethostname()
        self.agent = f"{self.host}:{port}"
        self.interval = DEFAULT_INTERVAL
        self._next_job = 0  # where the next heartbeat's share of a long list of jobs begins
        self._failing = False
        self._refused = False  # the server refused the agent's secret (or its lack of one)

    async def run(self) -> None:
        """Beat every interval until cancelled, or until the server refuses the agent's secret
        (raised); the first :meth:`beat` is the caller's."""
        while True:
            await asyncio.sleep(self.interval)
            await self.beat()

    async def beat(self) -> None:
        """One heartbeat and what its answer says; a failure is logged, not raised, but for
        the server's refusal of the agent's secret (or of its lack of one)."""
        try:
            reply = await self.client.heartbeat(await self.report())
        except AuthRequired as exc:
            self._refused = True
            raise AuthRequired(
                f"{exc}, and this agent has none: give it the server's (--secret-file), so that it serves "
                "signed URLs only, not whatever the host's secret holders cached"
            ) from None
        except AuthFailed as exc:
            self._refused = True
            raise AuthFailed(f"the server {self.client.server} refused this agent's secret ({exc})") from None
        except BlobError as exc:
            if not self._failing:
                log.warning(
                    "heartbeat to %s failed (the agent serves its cache meanwhile): %s", self.client.server, exc
                )
            self._failing = True
            return
        if self._failing:
            log.info("heartbeats to %s go through again", self.client.server)
        self._failing = False
        interval = reply.get("interval")
        if isinstance(interval, int | float) and not math.isnan(interval):
            self.interval = min(max(float(interval), MIN_INTERVAL), MAX_INTERVAL)
        gone = reply.get("gone_jobs")
        for job in gone if isinstance(gone, list) else []:
            if not isinstance(job, str):
                continue  # release() ignores any job this agent does not hold
            log.info("job %s is gone from the server: its files go after the cleanup interval", job)
            await asyncio.to_thread(self.source.gone, job.lower())

    async def farewell(self, timeout: float = FAREWELL_TIMEOUT) -> None:
        """The last heartbeat, as the agent stops: the server lists the host as stopped. None
        from an agent the server refused: it was never listed, and would only be refused again."""
        if self._refused:
            return
        try:
            async with asyncio.timeout(timeout):
                await self.client.heartbeat({**await self.report(), "jobs": [], "stopping": True})
        except (BlobError, TimeoutError) as exc:
            log.info("could not tell %s that the agent stops: %s", self.client.server, exc)

    async def report(self) -> dict[str, Any]:
        cache = self.source.cache
        stats = await asyncio.to_thread(cache.stats)  # walks the cache directory: off the loop
        jobs = self.source.jobs
        if len(jobs) > MAX_REPORTED_JOBS:
            start = self._next_job % len(jobs)
            jobs = (jobs[start:] + jobs[:start])[:MAX_REPORTED_JOBS]
            self._next_job = start + MAX_REPORTED_JOBS
        return {
            "agent": self.agent,
            "host": self.host,
            "version": package_version(),
            "cache_bytes": stats.bytes,
            "cache_max_bytes": cache.max_bytes,
            **self.counts(),
            "jobs": jobs,
        }
