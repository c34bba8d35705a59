"""``blobsvc cache ls | stats | gc``: look into and clean a host's blob cache directory.

These commands work on the directory alone, never on a server, and are safe while executors
use the cache: they take the same locks as :class:`~blobsvc.cache.BlobCache`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from ..config import ENV_PREFIX
from ._cli_settings import config_option, load_settings, setting_option
from ._text import when

if TYPE_CHECKING:  # imported when a command runs: the rest of the command line never loads the cache
    from ..cache import CacheStore

__all__ = ["cache"]

_F = TypeVar("_F", bound=Callable[..., Any])


def _dir_option(command: _F) -> _F:
    return config_option(setting_option("cache_dir", "--dir", type=click.Path(file_okay=False))(command))


def _json_option(command: _F) -> _F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON, one object per line.")(command)


def _store(ctx: click.Context, directory: str | None) -> CacheStore:
    from ..cache import CacheStore

    directory = str(load_settings(ctx, {"cache_dir": directory}).cache_dir)
    if not (Path(directory) / "content").is_dir():  # never lay a cache out in a stranger's directory
        raise click.ClickException(f"{directory} is not a blob cache: it has no content/ directory")
    try:
        return CacheStore(directory)
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


@click.group(name="cache")
def cache() -> None:
    """Inspect and clean the blob cache an executor host shares between its processes."""


@cache.command(name="ls")
@_dir_option
@_json_option
@click.pass_context
def ls(ctx: click.Context, /, cache_dir: str | None, as_json: bool) -> None:
    """List cached blobs (key, size, last access, in use, jobs) and jobs (id, references,
    idle since, blobs), one per line."""
    blobs, jobs = _store(ctx, cache_dir).entries()
    for blob in blobs:
        if as_json:
            click.echo(json.dumps({"blob": blob.key, **_fields(blob, "key")}))
        else:
            use = "in-use" if blob.in_use else "-"
            click.echo(f"blob\t{blob.key}\t{blob.size}\t{when(blob.last_access)}\t{use}\t{','.join(blob.jobs) or '-'}")
    for job in jobs:
        if as_json:
            click.echo(json.dumps({"job": job.job, **_fields(job, "job")}))
        else:
            click.echo(f"job\t{job.job}\t{job.references}\t{when(job.idle_since)}\t{len(job.files)}")
            for name, key in job.files:
                click.echo(f"\t{name}\t{key}")


def _fields(entry: Any, skip: str) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(entry).items() if k != skip}


@cache.command()
@_dir_option
@setting_option("cache_max_bytes", "--max-bytes")
@_json_option
@click.pass_context
def stats(ctx: click.Context, /, cache_dir: str | None, cache_max_bytes: str | None, as_json: bool) -> None:
    """Print totals: blobs and bytes against the limit, those in use, jobs, references
    (pinned jobs), unfinished downloads; and the counters of every process of the host since
    the cache was made: hits, misses, downloads, bytes fetched, evictions."""
    settings = load_settings(ctx, {"cache_dir": cache_dir, "cache_max_bytes": cache_max_bytes})
    totals = dataclasses.asdict(_store(ctx, str(settings.cache_dir)).stats(settings.cache_max_bytes))
    if as_json:
        click.echo(json.dumps(totals))
        return
    for name, value in totals.items():
        click.echo(f"{name.replace('_', ' ')}: {value}")
    click.echo(f"used: {totals['bytes'] / settings.cache_max_bytes:.1%} of max bytes")


@cache.command()
@_dir_option
@setting_option("cleanup_interval")
@setting_option("cache_max_bytes", "--max-bytes", default_text="none (no eviction)")
@click.option("--verify", is_flag=True, help="Also rehash every blob and repair what is wrong.")
@click.pass_context
def gc(
    ctx: click.Context,
    /,
    cache_dir: str | None,
    cleanup_interval: str | None,
    cache_max_bytes: str | None,
    verify: bool,
) -> None:
    """Delete expired jobs, forget dead processes' references, remove unfinished downloads
    nobody is finishing, and evict least recently used blobs no job uses down to the limit.

    Blobs are evicted only when a limit is set: by --max-bytes, BLOBSVC_CACHE_MAX_BYTES or
    cache_max_bytes in the --config file. The default limit is not applied, since the
    executors may have opened the cache with a larger one."""
    settings = load_settings(
        ctx, {"cache_dir": cache_dir, "cleanup_interval": cleanup_interval, "cache_max_bytes": cache_max_bytes}
    )
    store = _store(ctx, str(settings.cache_dir))
    max_bytes = settings.cache_max_bytes if _limit_set(ctx, cache_max_bytes) else None
    report = store.collect(settings.cleanup_interval, max_bytes, partials=True)
    click.echo(
        f"removed {len(report.removed_jobs)} jobs, evicted {len(report.evicted)} blobs ({report.freed_bytes} bytes), "
        f"removed {report.removed_partials} unfinished downloads"
    )
    if verify:
        for warning in store.check(fix=True):
            click.echo(f"repaired: {warning}")


def _limit_set(ctx: click.Context, option: str | None) -> bool:
    """Whether the cache's byte limit was set rather than left at its default: Settings tell
    its value but not where it came from, so look where it may be set (as Settings.load does,
    which has already read and checked the file)."""
    if option is not None or f"{ENV_PREFIX}CACHE_MAX_BYTES" in os.environ:
        return True
    config_file = ctx.find_root().obj or os.environ.get(f"{ENV_PREFIX}CONFIG")
    if not config_file:
        return False
    with open(config_file, "rb") as f:
        return any(key.replace("-", "_") == "cache_max_bytes" for key in tomllib.load(f))
