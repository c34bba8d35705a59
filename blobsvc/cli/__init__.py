"""The ``blobsvc`` command line.

Exit status: 0 on success; 1 with a one-line ``Error: …`` on stderr when the operation
failed (not found, refused, unreachable); 2 for a usage error.

The part ``blobsvc/cli/``: this module (the commands) and its helpers ``_cli_settings``
(options that are settings), ``_cache_cli`` (``blobsvc cache``), ``_checkpoints_cli``
(``blobsvc checkpoints``) and ``_ui_cli`` (``blobsvc ui``). The top floor: it may
import every other part, but at the top only click, the settings and its helpers: each
command imports the parts it uses (the client, the server, the agent) in its own body, so
that ``--help``, ``--version`` and a client command start in a few tens of milliseconds. A
command group lives in a module of its own, as ``_cache_cli`` does, whose commands import
their part of blobsvc when they run; it is registered at the end of this module with
``main.add_command``. ``tests/test_imports.py`` fails when ``--help`` loads more.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import logging
import os
import shlex
import signal
import sys
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .._exceptions import BlobError, InvalidArgument
from ..config import LOG_FORMATS, LOG_LEVELS, Settings, parse_size
from ..driver import _conf_defaults
from ._cache_cli import cache
from ._checkpoints_cli import checkpoints_group
from ._cli_settings import CONFIG_HELP, config_option, given_before, load_settings, setting_help, setting_option
from ._http_face import http_face, http_face_options
from ._text import when
from ._ui_cli import ui

# What a command needs beyond click and the settings (the client, the server, the agent, the
# bench, the Spark conf) it imports when it runs: --version, --help and a client command then
# load only what they use (tests/test_imports.py keeps it so).
if TYPE_CHECKING:
    from ..client import AsyncBlobClient, BlobInfo, Progress

__all__ = ["main"]

PROGRESS_THRESHOLD = 4 << 20  # smaller transfers finish before a bar is worth drawing

log = logging.getLogger("blobsvc.server")

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")


ACCESS_SETTINGS = ("secret_file", "tls_ca", "tls_client_cert", "tls_client_key")
CLIENT_SETTINGS = ("server", "timeout", "connect_timeout", "retries", *ACCESS_SETTINGS)


def access_options(command: _F, *, before_command: bool = False) -> _F:
    """What a client needs to be let in: the shared secret and the TLS files."""
    for name in reversed(ACCESS_SETTINGS):  # files: a missing one is a usage error
        file = click.Path(dir_okay=False, exists=True)
        command = setting_option(name, type=file, before_command=before_command)(command)
    return command


def client_options(command: _F, *, before_command: bool = False) -> _F:
    """The options every command that talks to a server shares; the group takes them too
    (``before_command``), so that they work before the command as after it."""
    command = access_options(command, before_command=before_command)
    for name in reversed(CLIENT_SETTINGS[: -len(ACCESS_SETTINGS)]):
        decls = ["-s"] if name == "server" else []
        command = setting_option(name, *decls, before_command=before_command)(command)
    return command if before_command else config_option(command)


def blob_options(
    *,
    key: bool = True,
    job_help: str = "Job id of a job-scoped blob.",
    name_help: str = "Name of the blob within --job.",
) -> Callable[[_F], _F]:
    """The blob a command is about: an optional KEY argument (unless ``key`` is false), then
    --job and --name with each command's own help."""

    def decorate(command: _F) -> _F:
        command = click.option("--name", "-n", help=name_help)(command)
        command = click.option("--job", "-j", help=job_help)(command)
        return click.argument("key", required=False)(command) if key else command

    return decorate


def _run(coroutine: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine on uvloop when it is installed, its errors in one line."""
    with _one_line_errors(), asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(coroutine)


@contextlib.contextmanager
def _one_line_errors() -> Iterator[None]:
    """Errors end in one line: exit 2 for a bad argument, 1 for anything else."""
    try:
        yield
    except InvalidArgument as exc:  # a malformed key, job id or name
        raise click.UsageError(str(exc)) from None
    except BlobError as exc:
        raise click.ClickException(str(exc)) from None
    except ValueError as exc:  # a setting that cannot be used (a secret file that is empty)
        raise click.UsageError(str(exc)) from None
    except OSError as exc:  # a local file: unreadable, unwritable, a full disk
        where = f"{exc.filename}: " if exc.filename else ""
        raise click.ClickException(f"{where}{exc.strerror or exc}") from None


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


@contextlib.contextmanager
def _progress(size: int, label: str) -> Iterator[Progress | None]:
    """A bar on stderr for transfers worth watching, when a person is watching."""
    if size < PROGRESS_THRESHOLD or not sys.stderr.isatty():
        yield None
        return
    with click.progressbar(length=size, label=label, file=sys.stderr) as bar:
        yield bar.update


def _blob_args(key: str | None, job: str | None, name: str | None, *, whole_job: bool = False) -> dict[str, Any]:
    if key is not None and job is None and name is None:
        return {"key": key}
    if key is None and job is not None and (name is not None or whole_job):
        return {"job": job, "name": name}
    wanted = "a KEY, or --job (with --name for one blob)" if whole_job else "a KEY, or --job and --name"
    raise click.UsageError(f"name the blob with {wanted}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    type=click.Path(dir_okay=False, exists=True),
    envvar="BLOBSVC_CONFIG",
    help=CONFIG_HELP,
)
@functools.partial(client_options, before_command=True)
@click.version_option(package_name="blobsvc")
@click.pass_context
def main(ctx: click.Context, config: str | None) -> None:
    """blobsvc: a BLOB server for Spark pipelines, and its clients.

    Keys are 64 hex characters (the BLAKE3 digest of a blob); job ids are 32 hex
    characters. Every option can also be set as BLOBSVC_<OPTION> or in the --config file.
    The client options work before the command as after it: blobsvc -s HOST:PORT put FILE.
    """
    ctx.obj = config


@main.command()
@config_option
@setting_option("host")
@setting_option("port")
@setting_option("data_dir", type=click.Path(file_okay=False))
@setting_option("max_blob_size")
@setting_option("max_connections")
@setting_option("idle_timeout")
@setting_option("io_timeout")
@setting_option("shutdown_timeout")
@setting_option("http_port")
@setting_option("secret_file", type=click.Path(dir_okay=False, exists=True))
@setting_option("tls_cert", type=click.Path(dir_okay=False, exists=True))
@setting_option("tls_key", type=click.Path(dir_okay=False, exists=True))
@setting_option("tls_client_ca", type=click.Path(dir_okay=False, exists=True))
@setting_option("tls_min_version", type=click.Choice(["1.2", "1.3"]))
@click.option("--verify-on-start/--no-verify-on-start", default=None, help=setting_help("verify_on_start"))
@setting_option("metrics_port")
@setting_option("log_format", type=click.Choice(LOG_FORMATS, case_sensitive=False))
@setting_option("log_level", type=click.Choice(LOG_LEVELS, case_sensitive=False))
@setting_option("recovery_mode", type=click.Choice(["standalone", "zookeeper"], case_sensitive=False))
@setting_option("zookeeper")
@setting_option("cluster_id")
@setting_option("ha_dir")
@click.option("--ha-create-bucket/--no-ha-create-bucket", default=None, help=setting_help("ha_create_bucket"))
@setting_option("zookeeper_session_timeout")
@setting_option("agent_heartbeat_interval")
@setting_option("agent_lost_after")
@setting_option("connect_timeout")
@setting_option("content_ttl")
@setting_option("max_store_bytes")
@setting_option("retention_grace")
@setting_option("retention_interval")
@click.pass_context
def serve(ctx: click.Context, /, **options: Any) -> None:
    """Run a blob server until SIGTERM or SIGINT.

    Prints "listening on HOST:PORT" once it accepts connections. With no options it stores
    blobs under a local data directory, standalone.
    """
    from ..server._logs import configure as configure_logs
    from ..server.metrics import MetricsUnavailable

    settings = load_settings(ctx, options)
    configure_logs(settings.log_level, settings.log_format)
    try:
        _run(_serve(settings))
    except (OSError, MetricsUnavailable, ImportError) as exc:  # ImportError: the ha extra missing
        raise click.ClickException(str(exc)) from None


def _stop_on_signals(abort: Callable[[], None]) -> asyncio.Event:
    """An event that SIGTERM or SIGINT sets; a second signal also calls ``abort`` (stop
    waiting for requests in flight). Installed before "listening on" is printed: whoever
    reads it may signal at once."""
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            abort()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, on_signal)
    return stop


async def _serve(settings: Settings) -> None:
    from ..server import BlobServer
    from ..server._logs import log_recovery

    server = BlobServer(settings)
    await server.start()
    assert server.recovery is not None
    log_recovery(server.recovery, settings.data_dir)
    if server.metrics is not None:
        for address in (server.metrics.address, server.http_address):
            if address is not None:
                log.info("metrics on http://%s:%d/metrics", *address)
    if settings.recovery_mode == "zookeeper":
        log.info(
            "recovery mode zookeeper: cluster %r at %s, HA store %s; serving once elected leader",
            settings.cluster_id,
            settings.zookeeper,
            settings.ha_dir,
        )
    stop = _stop_on_signals(server.abort_requests)
    host, port = server.address
    click.echo(f"listening on {host}:{port}")
    if server.http_address is not None:
        http_host, http_port = server.http_address
        click.echo(f"http listening on {http_host}:{http_port}")
    sys.stdout.flush()
    serving = asyncio.create_task(server.serve_forever())
    await stop.wait()
    log.info("shutting down")
    await server.shutdown()
    serving.cancel()


@main.command()
@setting_option("agent_host", "--host")
@setting_option("agent_port", "--port")
@setting_option("cache_dir", type=click.Path(file_okay=False))
@setting_option("cache_max_bytes", "--max-bytes")
@setting_option("cleanup_interval")
@setting_option("max_connections")
@setting_option("idle_timeout")
@setting_option("io_timeout")
@setting_option("shutdown_timeout")
@setting_option("log_format", type=click.Choice(LOG_FORMATS, case_sensitive=False))
@setting_option("log_level", type=click.Choice(LOG_LEVELS, case_sensitive=False))
@client_options
@click.pass_context
def agent(ctx: click.Context, /, **options: Any) -> None:
    """Serve this host's blob cache over HTTP, until SIGTERM or SIGINT.

    Executor JVMs fetch jars and packed Python environments (spark.jars, spark.archives) from
    the agent at http://HOST:PORT/blobs/<key>/<file name> or /jobs/<job>/<name>: each blob is
    downloaded once per host from the server (-s), verified, and shared by every application.
    Prints "agent listening on HOST:PORT" once it accepts connections; /metrics has its counts.
    """
    from ..server._logs import configure as configure_logs

    settings = load_settings(ctx, options)
    configure_logs(settings.log_level, settings.log_format)
    try:
        _run(_serve_agent(settings))
    except OSError as exc:
        raise click.ClickException(str(exc)) from None


async def _serve_agent(settings: Settings) -> None:
    from ..agent import Agent

    host_agent = Agent(settings)
    await host_agent.start()
    stop = _stop_on_signals(host_agent.slots.abort)
    click.echo("agent listening on {}:{}".format(*host_agent.address))
    sys.stdout.flush()
    agent_log = logging.getLogger("blobsvc.agent")
    agent_log.info("agent for %s, cache %s", settings.server, settings.cache_dir)
    serving = asyncio.create_task(host_agent.serve_forever())
    await asyncio.wait((serving, asyncio.create_task(stop.wait())), return_when=asyncio.FIRST_COMPLETED)
    agent_log.info("shutting down")
    await host_agent.shutdown()
    serving.cancel()
    if serving.done() and not serving.cancelled():
        serving.result()  # the server refused the agent for want of its secret: one line, exit 1


def _client_command(func: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Turn ``async def func(client, **args)`` into a click callback that loads the settings."""

    @functools.wraps(func)
    @click.pass_context
    def command(ctx: click.Context, /, **args: Any) -> None:
        from ..client import AsyncBlobClient

        settings = load_settings(ctx, {name: args.pop(name) for name in CLIENT_SETTINGS})

        async def go() -> None:
            async with AsyncBlobClient.from_settings(settings, one_shot=True) as client:
                await func(client, **args)

        _run(go())

    return command


@main.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True, exists=True))
@blob_options(
    key=False, job_help="Store under this job id (needs --name).", name_help="Store under this name within --job."
)
@client_options
@_client_command
async def put(client: AsyncBlobClient, file: str, job: str | None, name: str | None) -> None:
    """Upload FILE ('-' for stdin) and print its key.

    Stdin is first copied to a temporary file in $TMPDIR, which needs room for it: a PUT
    sends the blob's length before its bytes, and a failed upload can then be retried.
    """
    if (job is None) != (name is None):
        raise click.UsageError("--job and --name go together")
    source: Any = sys.stdin.buffer if file == "-" else Path(file)
    size = os.stat(file).st_size if file != "-" else 0
    with _progress(size, "uploading") as progress:
        key = await client.put(source, job=job, name=name, progress=progress)
    click.echo(key)


@main.command()
@blob_options()
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, allow_dash=True),
    default="-",
    callback=lambda ctx, param, value: _writable_destination(ctx, param, value),
    help="Where to write the blob ('-' is stdout).",
)
@click.option("--fsync", is_flag=True, help="Flush -o FILE to disk before it appears (survives a power loss).")
@client_options
@_client_command
async def get(
    client: AsyncBlobClient, key: str | None, job: str | None, name: str | None, output: str, fsync: bool
) -> None:
    """Download a blob, by KEY or by --job and --name, verifying its digest.

    With -o FILE the file appears only once complete and verified; like curl's, its bytes
    are left to the page cache unless --fsync asks to wait for the disk. To stdout the bytes
    are written as they arrive (memory stays small however large the blob) and checked at
    the end: a non-zero exit status means the output is incomplete or wrong; discard it.
    """
    which = _blob_args(key, job, name)
    if fsync and output == "-":
        raise click.UsageError("--fsync needs -o FILE")
    if output == "-":
        sys.stdout.flush()
        await client.get_into(sys.stdout.buffer, **which)
        sys.stdout.buffer.flush()
        return
    size = (await client.stat(**which)).size if sys.stderr.isatty() else 0
    with _progress(size, "downloading") as progress:
        await client.get_file(output, **which, progress=progress, fsync=fsync)


@main.command()
@blob_options(job_help="Job id; without --name every blob of the job is deleted.")
@client_options
@_client_command
async def delete(client: AsyncBlobClient, key: str | None, job: str | None, name: str | None) -> None:
    """Delete a blob by KEY, one job blob (--job and --name), or a whole job (--job)."""
    which = _blob_args(key, job, name, whole_job=True)
    if "job" in which and name is None:
        await client.delete_job(which["job"])
    else:
        await client.delete(**which)


@main.command()
@blob_options()
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object.")
@client_options
@_client_command
async def stat(client: AsyncBlobClient, key: str | None, job: str | None, name: str | None, as_json: bool) -> None:
    """Print a blob's key and size; exit 1 if there is no such blob."""
    _print_infos([await client.stat(**_blob_args(key, job, name))], as_json)


@main.command(name="ls")
@click.option("--job", "-j", required=True, help="Job id whose blobs to list.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object per line.")
@client_options
@_client_command
async def ls(client: AsyncBlobClient, job: str, as_json: bool) -> None:
    """List the blobs of a job: key, size and name, one per line, sorted by name."""
    _print_infos(sorted(await client.list(job), key=lambda info: info.name or ""), as_json)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (with --hosts, the JSON list of hosts).")
@click.option("--hosts", is_flag=True, help="List the executor hosts whose agents report to the server, one per line.")
@client_options
@_client_command
async def status(client: AsyncBlobClient, as_json: bool, hosts: bool) -> None:
    """Print a server's version, uptime, role, blobs and bytes stored, free disk,
    connections and requests served; exit 1 when it cannot be reached.

    With --hosts: each executor host's agent address, host name, state (live; stopped when
    its agent said goodbye as it shut down; LOST when it has not sent a heartbeat for
    agent_lost_after seconds), version, cache bytes and limit,
    hits, misses, jobs held, and when it was last heard from.
    """
    if hosts:
        _print_hosts(await client.hosts(), as_json)
        return
    info = await client.status()
    if as_json:
        click.echo(json.dumps(info, sort_keys=True))
        return
    for name, value in info.items():
        click.echo(f"{name.replace('_', ' ')}: {_status_text(name, value, info)}")


def _status_text(name: str, value: Any, info: dict[str, Any]) -> str:
    """One STATUS field as a person reads it (``--json`` keeps the values as they are)."""
    if name == "started" and isinstance(value, int | float):
        uptime = info.get("uptime_seconds")
        return when(value) + (f" (up {_duration(uptime)})" if isinstance(uptime, int | float) else "")
    if isinstance(value, dict):
        return " ".join(f"{k}={_status_text(k, v, info)}" for k, v in sorted(_flat(value).items())) or "-"
    if value is None:
        return "off" if name.endswith("_address") else "-"
    return str(value)


def _flat(fields: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested fields under dotted names: ``{"deleted": {"ttl": 0}}`` as ``deleted.ttl``."""
    flat: dict[str, Any] = {}
    for name, value in fields.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _duration(seconds: float) -> str:
    """``3 d 4 h``, ``2 h 5 min``, ``4 min 10 s``, ``12 s``: the two largest units."""
    left = int(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def _print_hosts(listing: dict[str, Any], as_json: bool) -> None:
    hosts = listing.get("hosts")
    if not isinstance(hosts, list):
        raise click.ClickException("the server's list of hosts is malformed: it has no 'hosts' list")
    if as_json:
        click.echo(json.dumps(hosts, sort_keys=True))
        return
    if not hosts:
        click.echo("no agent has reported to this server since it started (or became leader)")
        return
    now = listing.get("now", 0)  # the server's clock: no skew with ours
    rows = [
        [
            str(host.get("agent")),
            host.get("host") or "-",
            {"live": "live", "stopped": "stopped"}.get(host.get("state"), "LOST"),
            host.get("version") or "-",
            f"cache {_bytes_text(host.get('cache_bytes'))}/{_bytes_text(host.get('cache_max_bytes'))}",
            f"hits {_count_text(host.get('hits'))}",
            f"misses {_count_text(host.get('misses'))}",
            f"jobs {_count_text(host.get('jobs'))}",
            f"seen {max(0, round(now - host.get('last_seen', now)))} s ago",
        ]
        for host in hosts
    ]
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]) - 1)]
    for row in rows:
        click.echo("  ".join([*(cell.ljust(width) for cell, width in zip(row, widths, strict=False)), row[-1]]))


def _count_text(count: Any) -> str:
    return "-" if count is None else str(count)


def _bytes_text(size: Any) -> str:
    """``1.5GiB``, ``300KiB``, ``12B``; ``-`` when the agent did not say."""
    if not isinstance(size, int):
        return "-"
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size / scale:.1f}".removesuffix(".0") + unit
    return f"{size}B"


def _writable_destination(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """Refuse a destination in a directory that does not exist before anything is fetched."""
    parent = Path(value).parent
    if value != "-" and not parent.is_dir():
        raise click.BadParameter(f"directory {str(parent)!r} does not exist", ctx, param)
    return value


def _print_infos(infos: list[BlobInfo], as_json: bool) -> None:
    for info in infos:
        if as_json:
            click.echo(json.dumps({"key": info.key, "size": info.size, "name": info.name}))
        else:
            click.echo("\t".join(str(v) for v in (info.key, info.size, info.name) if v is not None))


@main.command()
@blob_options(name_help="Name of the blob within --job (with KEY: the file name the URL ends with).")
@http_face_options
@click.option(
    "--expires-in", type=click.FloatRange(min=0, min_open=True), default=3600.0, show_default=True,
    help="Seconds a signed URL stays valid.",
)  # fmt: skip
@click.pass_context
def url(ctx: click.Context, /, key: str | None, job: str | None, name: str | None, http_url: str | None,
        expires_in: float, **options: Any) -> None:  # fmt: skip
    """Print an HTTP URL of a blob, for curl, pip or Spark (spark.jars, spark.files).

    The URL is signed with the shared secret when --secret-file (or BLOBSVC_SECRET_FILE) is set.
    """
    from ..http import blob_url

    if key is None and (job is None or name is None):
        raise click.UsageError("name the blob with a KEY, or --job and --name")
    if key is not None and job is not None:
        raise click.UsageError("give a KEY or --job, not both")
    http_url, settings = http_face(ctx, options, http_url)
    try:
        click.echo(blob_url(http_url, key=key, job=job, name=name, secret=settings.secret(), expires_in=expires_in))
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None


@main.command(name="spark-conf")
@click.option(
    "--environment",
    type=click.Path(dir_okay=False, exists=True),
    help="Packed Python environment (venv-pack or conda-pack: .tar.gz, .tgz, .tar, .zip) for the Python workers.",
)
@click.option(
    "--alias",
    default=_conf_defaults.DEFAULT_ALIAS,
    show_default=True,
    help="Name of the environment in each executor's working directory (host: ./ALIAS-python, spark: ./ALIAS/).",
)
@click.option(
    "--unpack",
    type=click.Choice(_conf_defaults.UNPACK_MODES),
    default=_conf_defaults.DEFAULT_UNPACK,
    show_default=True,
    help="Who unpacks the environment: each host's agent, once per host (host), or Spark in every executor (spark).",
)
@click.option(
    "--jar",
    "jars",
    multiple=True,
    type=click.Path(dir_okay=False, exists=True),
    help="A jar for spark.jars (repeatable).",
)
@click.option(
    "--deploy-mode",
    type=click.Choice(["client", "cluster"]),
    default="client",
    show_default=True,
    help="spark-submit's: in client mode the driver runs here, in --driver-python, not the environment.",
)
@click.option(
    "--driver-python",
    metavar="PYTHON",
    help="The client-mode driver's Python (spark.pyspark.driver.python) "
    "[default: $PYSPARK_DRIVER_PYTHON, else the Python running blobsvc].",
)
@setting_option("agent_url", "--agent")
@click.option(
    "--expires-in",
    type=click.FloatRange(min=0, min_open=True),
    default=_conf_defaults.URL_LIFETIME,
    show_default=True,
    help="Seconds the URLs stay valid when signed (executors that join later fetch them then).",
)
@client_options
@click.pass_context
def spark_conf(ctx: click.Context, /, environment: str | None, alias: str, unpack: str, jars: tuple[str, ...],
               deploy_mode: str, driver_python: str | None, agent_url: str | None, expires_in: float,
               **options: Any) -> None:  # fmt: skip
    """Upload a packed Python environment and jars, and print the --conf arguments that have
    spark-submit fetch them through each host's blobsvc agent.

    Each file is stored as a content blob, its bytes sent only when the server lacks them
    (it stays until deleted there). The arguments come on one line, shell-quoted, for eval:

    \b
        eval "spark-submit $(blobsvc spark-conf --environment env.tar.gz) app.py"

    With --unpack host, spark.files (the agent's launcher of the environment it unpacked once
    for the host) and spark.pyspark.python (./ALIAS-python); with --unpack spark,
    spark.archives (URL#ALIAS) and spark.pyspark.python (./ALIAS/bin/python); and spark.jars.
    The URLs name the agent (--agent or BLOBSVC_AGENT_URL), the same on every host, the
    driver's included; they are signed when --secret-file is set. In client mode (--deploy-mode
    client, spark-submit's default) the driver runs here, from no executor's directory, so
    spark.pyspark.driver.python names a local Python (--driver-python): spark.pyspark.python
    would win over PYSPARK_DRIVER_PYTHON otherwise.

    The environment must hold bin/python at its root, or it is refused before anything is
    uploaded; one without pyarrow and pandas gets a warning on stderr (Python UDFs run with
    Arrow in Spark 4, pandas UDFs always).
    """
    from ..client import BlobClient
    from ..driver import _spark_conf

    if environment is None and not jars:
        raise click.UsageError("give --environment, --jar or both")
    if driver_python is not None and (deploy_mode == "cluster" or environment is None):
        raise click.UsageError("--driver-python goes with --environment in --deploy-mode client")
    settings = load_settings(ctx, {**options, "agent_url": agent_url})
    with _one_line_errors():
        archive = None if environment is None else _spark_conf.archive_path(environment)
        alias = _spark_conf.check_alias(alias)
        jar_paths = [_spark_conf.jar_path(jar) for jar in jars]
        names = [path.name for path in jar_paths]
        if len(set(names)) < len(names):
            raise InvalidArgument("two jars have one file name: Spark's fetcher puts both in one directory")
        agent = _spark_conf.agent_url(settings, "give --agent, or set BLOBSVC_AGENT_URL")
        if archive is not None:
            from ..driver._contents import arrow_warning

            contents = _spark_conf.environment_contents(archive, settings)
            when = "an application's Python UDFs (with Arrow: Spark 4's default) and pandas UDFs"
            warning = arrow_warning(archive.name, contents, when)
            if warning is not None:
                click.echo(f"Warning: {warning}", err=True)
        keys = {}
        with BlobClient.from_settings(settings, one_shot=True) as client:
            for path in [*jar_paths, *([archive] if archive else [])]:
                keys[path], _ = _spark_conf.ship(client, path, settings.cache_dir / "digests")
        urls = {path: _spark_conf.url(agent, keys[path], path, settings, expires_in) for path in jar_paths}
        conf = {}
        if archive is not None:
            conf = _spark_conf.environment_conf(
                agent, keys[archive], archive, alias, settings, unpack=unpack, expires_in=expires_in
            )
            if deploy_mode == "client":
                python = driver_python or os.environ.get("PYSPARK_DRIVER_PYTHON") or sys.executable
                conf["spark.pyspark.driver.python"] = python
    if jar_paths:
        conf["spark.jars"] = ",".join(urls[path] for path in jar_paths)
    click.echo(shlex.join(word for name, value in conf.items() for word in ("--conf", f"{name}={value}")))


@main.command()
@click.option(
    "-s",
    "--server",
    default=None,
    help="HOST:PORT of the server to measure, here or before the command [default: a fresh local one].",
)
@click.option("--quick", is_flag=True, help="Tiny sizes and counts: proves the bench runs, measures little.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False), help="Also draw the results into this PNG.")
@click.option("--tmp-dir", type=click.Path(file_okay=False), help="Parent of the bench's files [default: $TMPDIR].")
@click.option(
    "--size",
    "sizes",
    multiple=True,
    metavar="SIZE",
    callback=lambda ctx, param, values: _bench_sizes(ctx, param, values),
    help="Measure only blobs of this size, such as 4KiB or 64MiB (repeatable) [default: the whole matrix].",
)
@click.option(
    "--connections",
    "connections",
    multiple=True,
    type=click.IntRange(min=1),
    metavar="N",
    help="Measure only with this many connections (repeatable) [default: 1, 8 and 32].",
)
@access_options
@config_option
def bench(
    server: str | None,
    quick: bool,
    plot_path: str | None,
    tmp_dir: str | None,
    sizes: tuple[int, ...],
    connections: tuple[int, ...],
    **access: Any,
) -> None:
    """Measure a server beside baselines taken in the same run on this machine.

    PUT and GET of 4 KiB, 1 MiB, 64 MiB and 512 MiB blobs over 1, 8 and 32 connections,
    then 8 processes asking one host cache for one blob. Prints one JSON object per
    measurement on stdout and a summary table on stderr. Without --server it starts a local
    `blobsvc serve` on a temporary data directory and stops it at the end; with one, it
    deletes what it stored. --plot needs matplotlib (pip install 'blobsvc[bench]').
    --secret-file and the TLS options are for a --server that asks for them.
    --size and --connections measure only those cells of the matrix (and no fan-out), for
    example `blobsvc bench --size 4KiB --connections 32`.
    """
    from .. import bench as benchmark
    from ..bench import _measure
    from ..wire._tls import client_context_for

    ctx = click.get_current_context()
    server = server or given_before(ctx, "server")  # blobsvc -s HOST:PORT bench, as other commands take it
    if plot_path is not None and importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException("--plot needs matplotlib: pip install 'blobsvc[bench]'")
    if server is None and any(value is not None for value in access.values()):
        raise click.UsageError("--secret-file and --tls-* go with --server: the bench's own server uses neither")
    settings = load_settings(ctx, access) if server is not None else None
    if settings is not None:
        with _one_line_errors():  # an empty secret file, TLS files that do not fit: before any work
            settings.secret()
            client_context_for(settings)
    plan = (benchmark.Plan.quick(tmp_dir) if quick else benchmark.Plan(tmp_dir=tmp_dir)).only(sizes, connections)
    records: list[dict[str, Any]] = []

    def emit(record: dict[str, Any]) -> None:
        records.append(record)
        click.echo(json.dumps(record))

    try:
        with click.progressbar(length=len(benchmark.steps(plan)), label="measuring", file=sys.stderr) as bar:
            benchmark.run(plan, emit, address=server, access=settings, progress=lambda label: bar.update(1))
    except (_measure.BenchError, BlobError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(benchmark.table(records), err=True)
    if plot_path is not None:
        benchmark.plot(records, plot_path)
        click.echo(f"plot written to {plot_path}", err=True)


def _bench_sizes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> tuple[int, ...]:
    from ..bench import MIN_SIZE

    sizes = []
    for value in values:
        try:
            size = parse_size(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        if size < MIN_SIZE:
            message = f"{value!r} is smaller than the smallest blob the bench measures ({MIN_SIZE} bytes)"
            raise click.BadParameter(message, ctx, param)
        sizes.append(size)
    return tuple(sizes)


main.add_command(cache)
main.add_command(ui)
main.add_command(checkpoints_group(client_options, CLIENT_SETTINGS, _one_line_errors))
