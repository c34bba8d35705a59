"""Prometheus metrics of a :class:`~blobsvc.server.BlobServer` (the ``metrics`` extra).

Two kinds of figures, each gathered the cheaper way:

* **Per request**, counted as requests end (:meth:`ServerMetrics.observe` is one of the
  server's observers): requests by operation and outcome, body bytes in and out, latency
  histograms. Counting happens on the event loop in plain dicts and lists, with no lock and no
  prometheus-client object on the request path; a scrape copies them (each copy is one atomic
  step under the GIL) and builds the metric families.
* **State**, read at scrape time from :meth:`BlobServer.status`: connections, BUSY refusals,
  stored blobs and bytes, free disk, staging files, uploads in flight, what the start-up scan
  removed, the role (and, once HA gives them, leader changes), agents live and lost and their
  heartbeats, checkpoints completed, aborted, subsumed and damaged, the last one's id and
  age, state bytes sent and reused. Nothing is kept for these.

Scrapes are answered by prometheus-client's HTTP server in a daemon thread on
``metrics_port``, and by the ``/metrics`` route of the server's HTTP face (built in a worker
thread), so a slow scrape never holds up the event loop; ``metrics_port = "http"`` keeps the
route alone. Without prometheus-client installed, asking for metrics raises
:class:`MetricsUnavailable`, naming the extra.

HA feeds the ``role`` gauge and the ``leader_changes`` counter through the fields its
``status()`` adds to :meth:`BlobServer.status` (``server.status_sources``).
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left as _bisect
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from ..http._observe import RequestObserver, op_name, outcome_name
from .checkpoint_stats import DURATION_BUCKETS
from .hosts import STATES

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.registry import CollectorRegistry

    from ..http import HttpFace, HttpRequest, HttpResponse
    from ..wire._netio import SocketStream

__all__ = ["BUCKETS", "EXTRA", "MetricsServer", "MetricsUnavailable", "ServerMetrics"]

EXTRA = "pip install 'blobsvc[metrics]'"
# Request latency buckets, seconds: a 4 KiB GET on loopback takes ~0.1 ms, a PUT of a new blob
# a few ms (fsync), a GB-sized transfer tens of seconds.
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class MetricsServer(Protocol):
    """What the metrics need of the server they count: its request observers, to count each
    request, and its state at scrape time. The BlobServer is one."""

    @property
    def observers(self) -> list[RequestObserver]: ...

    def status(self) -> dict[str, Any]: ...


# Metrics read from BlobServer.status() at scrape time: (name, status field, help).
_STATE_COUNTERS = (
    ("blobsvc_busy_refusals", "busy_refusals", "Connections refused with BUSY at the connection limit."),
    ("blobsvc_journal_checkpoints", "journal_checkpoints", "Checkpoints of the journal of small PUTs (syncfs)."),
    ("blobsvc_agent_heartbeats", "heartbeats", "Heartbeats answered from executor hosts' agents."),
    ("blobsvc_checkpoints_completed", "checkpoints_completed", "Checkpoints completed (since the server started)."),
    ("blobsvc_checkpoints_aborted", "checkpoints_aborted", "Checkpoints aborted: declined, timed out, replaced."),
    ("blobsvc_checkpoints_subsumed", "checkpoints_subsumed", "Completed checkpoints subsumed beyond retain."),
    ("blobsvc_checkpoints_discarded_blobs", "checkpoints_discarded_blobs", "State and metadata blobs discarded."),
    (
        "blobsvc_checkpoints_state_sent_bytes",
        "checkpoints_state_bytes_sent",
        "Bytes of completed checkpoints' state whose bytes were sent (new or changed files).",
    ),
    (
        "blobsvc_checkpoints_state_reused_bytes",
        "checkpoints_state_bytes_reused",
        "Bytes of completed checkpoints' state linked, not sent (unchanged files).",
    ),
)
_STATE_GAUGES = (
    ("blobsvc_connections", "connections", "Open client connections."),
    ("blobsvc_max_connections", "max_connections", "The connection limit; more are refused with BUSY."),
    ("blobsvc_uploads_in_flight", "uploads_in_flight", "PUTs being received or published."),
    ("blobsvc_staging_files", "staging_files", "Files in incoming/: uploads in flight, jobs being deleted."),
    ("blobsvc_stored_blobs", "blobs", "Distinct blobs stored (objects, however many names each has)."),
    ("blobsvc_stored_bytes", "bytes", "Bytes of the distinct blobs stored."),
    ("blobsvc_disk_free_bytes", "disk_free_bytes", "Free bytes on the data directory's file system."),
    ("blobsvc_disk_size_bytes", "disk_total_bytes", "Size of the data directory's file system."),
    ("blobsvc_start_time_seconds", "started", "When the server started, in Unix time."),
)


class MetricsUnavailable(RuntimeError):
    """Metrics were asked for, but prometheus-client is not installed."""


def _require_prometheus() -> None:
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsUnavailable(f"metrics need prometheus-client: {EXTRA}") from None


class _Op:
    """What is counted of one operation: requests by outcome, the latency histogram (a count
    per bucket, the count above the last (+Inf), then the sum of seconds), body bytes."""

    __slots__ = ("histogram", "moved", "name", "outcomes")

    def __init__(self, name: str) -> None:
        self.name = name
        self.outcomes: dict[int, int] = {}  # named at scrape time
        self.histogram: list[float] = [0] * (len(BUCKETS) + 1) + [0.0]
        self.moved = 0


class ServerMetrics:
    """The metrics of one server, in a registry of their own (several servers may share a
    process, as they do in tests). Creating one starts counting; :meth:`serve` exposes them."""

    def __init__(self, server: MetricsServer) -> None:
        _require_prometheus()
        from prometheus_client import CollectorRegistry, PlatformCollector, ProcessCollector

        self.server = server
        self._ops: dict[str, _Op] = {}
        # The op of each kind of request, so that counting one costs a lookup by its type, not
        # naming it (an HTTP request's op depends on its method: it is named each time).
        self._op_of: dict[type, _Op] = {}
        self.registry: CollectorRegistry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)
        ProcessCollector(registry=self.registry)  # memory, CPU, open descriptors
        PlatformCollector(registry=self.registry)
        self._httpd: WSGIServer | None = None
        server.observers.append(self.observe)

    def observe(self, event: Any, outcome: int, moved: int, seconds: float, stream: SocketStream) -> None:
        """Count one request (a server observer): on the event loop, so no lock."""
        op = self._op_of.get(type(event)) or self._op(event)
        outcomes = op.outcomes
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        histogram = op.histogram
        histogram[_bisect(BUCKETS, seconds)] += 1
        histogram[-1] += seconds
        op.moved += moved

    def _op(self, event: Any) -> _Op:
        name = op_name(event)
        op = self._ops.get(name)
        if op is None:
            op = self._ops[name] = _Op(name)
        if not name.startswith("HTTP_"):
            self._op_of[type(event)] = op
        return op

    # --- scrape ------------------------------------------------------------------------------

    def collect(self) -> Iterator[Any]:
        """The metric families, built at scrape time (prometheus-client's collector protocol)."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

        status = self.server.status()
        requests = CounterMetricFamily(
            "blobsvc_requests", "Requests by operation and outcome (ok, aborted, or the error code's name).",
            labels=["op", "outcome"],
        )  # fmt: skip
        ops = list(self._ops.values())
        for op in ops:
            for outcome, count in list(op.outcomes.items()):
                requests.add_metric([op.name, outcome_name(outcome)], count)
        yield requests
        received = sum(op.moved for op in ops if op.name == "PUT")
        sent = sum(op.moved for op in ops if op.name != "PUT")
        yield CounterMetricFamily("blobsvc_received_bytes", "Body bytes received (PUT).", value=received)
        yield CounterMetricFamily("blobsvc_sent_bytes", "Body bytes sent (GET).", value=sent)
        latency = HistogramMetricFamily(
            "blobsvc_request_duration_seconds", "Time from a request's header to its answer.", labels=["op"]
        )
        for op in ops:
            *counts, seconds = list(op.histogram)
            buckets: list[tuple[str, float]] = []
            total = 0.0
            for bound, in_bucket in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                total += in_bucket
                buckets.append((bound, total))
            latency.add_metric([op.name], buckets, seconds)
        yield latency
        for name, key, text in _STATE_COUNTERS:
            yield CounterMetricFamily(name, text, value=status[key])
        for name, key, text in _STATE_GAUGES:
            yield GaugeMetricFamily(name, text, value=status[key])
        removed = GaugeMetricFamily(
            "blobsvc_removed_at_start", "What the start-up scan removed, by reason.", labels=["reason"]
        )
        for reason, count in status["removed_at_start"].items():
            removed.add_metric([reason], count)
        yield removed
        agents = GaugeMetricFamily(
            "blobsvc_agents",
            "Executor hosts whose agents report, by state (lost: no heartbeat lately; stopped: said goodbye).",
            labels=["state"],
        )  # fmt: skip
        for state in STATES:
            agents.add_metric([state], status[f"hosts_{state}"])
        yield agents
        role = GaugeMetricFamily("blobsvc_role", "1 for the role this server has now.", labels=["role"])
        role.add_metric([str(status["role"])], 1)
        yield role
        info = GaugeMetricFamily("blobsvc_build_info", "The blobsvc version serving.", labels=["version"])
        info.add_metric([str(status["version"])], 1)
        yield info
        retention = status.get("retention")
        if retention is not None:  # given by retention's status source
            deleted = CounterMetricFamily(
                "blobsvc_retention_deleted",
                "Content blobs retention deleted, by reason (ttl, limit).",
                labels=["reason"],
            )
            freed = CounterMetricFamily(
                "blobsvc_retention_deleted_bytes",
                "Bytes of the content retention deleted, by reason.",
                labels=["reason"],
            )
            for reason, count in retention["deleted"].items():
                deleted.add_metric([reason], count)
                freed.add_metric([reason], retention["deleted_bytes"][reason])
            yield deleted
            yield freed
        # Described always, sampled once a checkpoint completed: no made-up id before the first.
        last_id = GaugeMetricFamily("blobsvc_checkpoints_last_completed_id", "The id of the last checkpoint completed.")
        last_age = GaugeMetricFamily(
            "blobsvc_checkpoints_last_completed_age_seconds", "Seconds since the last checkpoint completed."
        )
        if status["checkpoints_last_completed_id"] is not None:
            last_id.add_metric([], status["checkpoints_last_completed_id"])
            last_age.add_metric([], status["checkpoints_last_completed_age_seconds"])
        last_duration = GaugeMetricFamily(
            "blobsvc_checkpoints_last_duration_seconds",
            "Seconds from trigger to completion of the last checkpoint completed.",
        )
        last_size = GaugeMetricFamily(
            "blobsvc_checkpoints_last_state_bytes", "Bytes of state of the last checkpoint completed."
        )
        if status["checkpoints_last_duration_seconds"] is not None:
            last_duration.add_metric([], status["checkpoints_last_duration_seconds"])
            last_size.add_metric([], status["checkpoints_last_state_bytes"])
        yield last_id
        yield last_age
        yield last_duration
        yield last_size
        *in_buckets, duration_sum = status["checkpoints_durations"]
        cumulative, total = [], 0
        for bound, count in zip((*map(str, DURATION_BUCKETS), "+Inf"), in_buckets, strict=True):
            total += count
            cumulative.append((bound, float(total)))
        durations = HistogramMetricFamily(
            "blobsvc_checkpoints_duration_seconds", "Seconds from trigger to completion of the checkpoints completed."
        )
        durations.add_metric([], cumulative, duration_sum)
        yield durations
        yield GaugeMetricFamily(
            "blobsvc_checkpoints_damaged",
            "Completed checkpoints whose metadata is missing or damaged (restores fall back).",
            value=status["checkpoints_damaged"],
        )
        if "leader_changes" in status:  # given by HA's status source
            yield CounterMetricFamily(
                "blobsvc_leader_changes", "Leaders this server has seen elected.", value=status["leader_changes"]
            )

    def add_route(self, face: HttpFace) -> None:
        """Serve ``/metrics`` on the server's HTTP face too (when its ``http_port`` is set)."""
        face.routes["metrics"] = self._http_scrape

    async def _http_scrape(self, request: HttpRequest) -> HttpResponse:
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        from ..http import HttpResponse, text_response

        if request.path.rstrip("/") != "/metrics":
            return text_response(404, "the metrics are at /metrics")
        # Built in a worker thread, as the dedicated port does: a scrape lists incoming/ and
        # calls statvfs, which must not stall the event loop on a slow disk.
        body = await asyncio.to_thread(generate_latest, self.registry)
        return HttpResponse(200, [("Content-Type", CONTENT_TYPE_LATEST)], body)

    # --- the endpoint ------------------------------------------------------------------------

    def serve(self, host: str, port: int) -> None:
        """Answer scrapes on ``host:port`` (0: any free port) from a daemon thread."""
        from prometheus_client import start_http_server

        try:
            self._httpd, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise OSError(exc.errno, f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from None

    @property
    def address(self) -> tuple[str, int] | None:
        """The metrics port's bound address; None without one (``/metrics`` on the HTTP face only)."""
        if self._httpd is None:
            return None
        host, port, *_ = self._httpd.server_address
        return str(host), int(port)

    def close(self) -> None:
        """Stop answering scrapes (blocks up to half a second: the HTTP server's poll)."""
        httpd, self._httpd = self._httpd, None
        if httpd is not None:
            httpd.shutdown()
            httpd.server_close()
