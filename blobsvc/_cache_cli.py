"""``blobsvc cache ls | stats | gc``: look into and clean a host's blob cache directory.

These commands work on the directory alone, never on a server, and are safe while executors
use the cache: they take the same locks as :class:`~blobsvc.cache.BlobCache`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from .cache import DEFAULT_CLEANUP_INTERVAL, CacheStore
from .config import parse_size

__all__ = ["cache"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _dir_option(command: _F) -> _F:
    return click.option(
        "--dir",
        "directory",
        required=True,
        envvar="BLOBSVC_CACHE_DIR",
        type=click.Path(file_okay=False, exists=True),
        help="The cache directory (also BLOBSVC_CACHE_DIR).",
    )(command)


def _json_option(command: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON, one object per line.")(command)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).isoformat(timespec="seconds")


def _store(directory: str) -> CacheStore:
    if not (Path(directory) / "content").is_dir():  # never lay a cache out in a stranger's directory
        raise click.ClickException(f"{directory} is not a blob cache: it has no content/ directory")
    try:
        return CacheStore(directory)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    try:
        return None if value is None else parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@click.group(name="cache")
def cache() -> None:
    """Inspect and clean the blob cache an executor host shares between its processes."""


@cache.command(name="ls")
@_dir_option
@_json_option
def ls(directory: str, as_json: bool) -> None:
    """List cached blobs (key, size, last access, in use, jobs) and jobs (id, references,
    idle since, blobs), one per line."""
    blobs, jobs = _store(directory).entries()
    for blob in blobs:
        if as_json:
            click.echo(json.dumps({"blob": blob.key, **_fields(blob, "key")}))
        else:
            use = "in-use" if blob.in_use else "-"
            click.echo(f"blob\t{blob.key}\t{blob.size}\t{_when(blob.last_access)}\t{use}\t{','.join(blob.jobs) or '-'}")
    for job in jobs:
        if as_json:
            click.echo(json.dumps({"job": job.job, **_fields(job, "job")}))
        else:
            click.echo(f"job\t{job.job}\t{job.references}\t{_when(job.idle_since)}\t{len(job.files)}")
            for name, key in job.files:
                click.echo(f"\t{name}\t{key}")


def _fields(entry: Any, skip: str) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(entry).items() if k != skip}


@cache.command()
@_dir_option
@_json_option
def stats(directory: str, as_json: bool) -> None:
    """Print totals: blobs and bytes, those in use, jobs, references, unfinished downloads."""
    totals = dataclasses.asdict(_store(directory).stats())
    if as_json:
        click.echo(json.dumps(totals))
    else:
        for name, value in totals.items():
            click.echo(f"{name.replace('_', ' ')}: {value}")


@cache.command()
@_dir_option
@click.option(
    "--cleanup-interval",
    type=click.FloatRange(min=0),
    default=DEFAULT_CLEANUP_INTERVAL,
    show_default=True,
    help="Delete jobs without references for this many seconds.",
)
@click.option(
    "--max-bytes", callback=_size, help="Evict least recently used blobs no job uses down to this size (e.g. 8GiB)."
)
@click.option("--verify", is_flag=True, help="Also rehash every blob and repair what is wrong.")
def gc(directory: str, cleanup_interval: float, max_bytes: int | None, verify: bool) -> None:
    """Delete expired jobs, forget dead processes' references, remove unfinished downloads
    nobody is finishing, and with --max-bytes evict down to that size."""
    store = _store(directory)
    report = store.collect(cleanup_interval, max_bytes, partials=True)
    click.echo(
        f"removed {len(report.removed_jobs)} jobs, evicted {len(report.evicted)} blobs ({report.freed_bytes} bytes), "
        f"removed {report.removed_partials} unfinished downloads"
    )
    if verify:
        for warning in store.check(fix=True):
            click.echo(f"repaired: {warning}")
