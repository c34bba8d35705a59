"""The server's logs: text or JSON lines, one line per request at debug level, and the
start-up recovery report.

Log records carry their structured fields in ``record.fields`` (a dict): the text format
shows the message, the JSON format puts the fields beside it, so a collector needs no
parsing. Nothing logged here comes from a request's bytes but its operation, target, size
and outcome: never the AUTH answer, never the secret.
"""

from __future__ import annotations

import datetime
import json
import logging
import sys
from typing import Any

from ..http._observe import op_name, outcome_name
from ..storage import RecoveryReport
from ..wire._protocol import ContentKey, JobBlob, ListRequest, WholeJob

__all__ = ["JsonFormatter", "configure", "log_recovery", "log_request", "target_text"]

log = logging.getLogger("blobsvc.server")
request_log = logging.getLogger("blobsvc.requests")

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (UTC, ISO 8601), level, logger, message, the record's
    ``fields``, and the traceback of an exception when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(getattr(record, "fields", {}))
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(level: str, fmt: str) -> None:
    """Send every blobsvc log line to stderr at ``level``, as ``fmt`` (text or json). The
    libraries under it (botocore, s3fs, kazoo) say only warnings and errors, unless ``level``
    is debug: their info lines ("Found credentials in environment variables") are noise in
    an operator's log."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    wanted = logging.getLevelNamesMapping()[level.upper()]
    root.setLevel(wanted if wanted <= logging.DEBUG else max(wanted, logging.WARNING))
    logging.getLogger("blobsvc").setLevel(wanted)


def target_text(event: Any) -> str:
    """What a request names: a key, ``job/name``, ``job/*``, an HTTP path (without its query,
    which may hold a URL signature), or ``-``."""
    path = getattr(event, "path", None)
    if isinstance(path, str):
        return path
    target = getattr(event, "target", None)
    if isinstance(event, ListRequest):
        target = WholeJob(event.job)
    if isinstance(target, ContentKey):
        return target.key.hex()
    if isinstance(target, JobBlob):
        return f"{target.job.hex()}/{target.name}"
    if isinstance(target, WholeJob):
        return f"{target.job.hex()}/*"
    return "-"


def log_request(event: Any, outcome: int, moved: int, seconds: float, stream: Any) -> None:
    """A server observer: one debug line per request."""
    fields = {
        "peer": stream.peer,
        "op": op_name(event),
        "target": target_text(event),
        "outcome": outcome_name(outcome),
        "bytes": moved,
        "seconds": round(seconds, 6),
    }
    request_log.debug(
        "%(peer)s %(op)s %(target)s %(outcome)s %(bytes)d bytes %(seconds).6fs", fields, extra={"fields": fields}
    )


def log_recovery(report: RecoveryReport, data_dir: object) -> None:
    """The start-up scan's report: what is served, and each thing removed with the reason."""
    blobs = report.content_blobs + report.job_blobs
    size = "" if report.bytes is None else f" ({report.bytes} bytes)"  # not counted without verifying
    log.info(
        "serving %d blobs%s from %s",
        blobs,
        size,
        data_dir,
        extra={"fields": {"blobs": blobs, "objects": report.objects, "bytes": report.bytes}},
    )
    if report.replayed:
        log.info(
            "replayed %d journal records of small blobs not yet checkpointed; %d needed repair",
            report.replayed,
            report.repaired,
            extra={"fields": {"replayed": report.replayed, "repaired": report.repaired}},
        )
    if report.removed_staging:
        log.info(
            "removed %d staging files: uploads the last run did not finish",
            report.removed_staging,
            extra={"fields": {"removed": "staging", "count": report.removed_staging}},
        )
    for path in report.removed_corrupt:
        log.warning(
            "removed corrupt blob %s: its bytes no longer hash to its key",
            path,
            extra={"fields": {"removed": "corrupt", "path": path}},
        )
    for path in report.removed_stray:
        log.warning(
            "removed stray file %s: not a file this layout makes",
            path,
            extra={"fields": {"removed": "stray", "path": path}},
        )
    if report.removed_orphans:
        log.info(
            "removed %d objects no name linked: a crash between storing and naming them",
            report.removed_orphans,
            extra={"fields": {"removed": "orphaned", "count": report.removed_orphans}},
        )
