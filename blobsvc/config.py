"""One settings object for every blobsvc command, with documented defaults.

Each setting is read from, in order of precedence: a command-line option, a ``BLOBSVC_<NAME>``
environment variable, a TOML file (``--config`` or ``BLOBSVC_CONFIG``), its default. The
defaults need nothing: ``blobsvc serve`` stores under a local data directory, standalone.
Sizes accept a unit (``512MiB``, ``8G``); durations are seconds.

Imports nothing of blobsvc but its exceptions and its number parser: every other part reads
its settings here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from ._exceptions import InvalidArgument
from ._numbers import parse_decimal

__all__ = [
    "DEFAULT_CACHE_MAX_BYTES",
    "DEFAULT_AGENT_PORT",
    "DEFAULT_CLEANUP_INTERVAL",
    "DEFAULT_PORT",
    "ENV_PREFIX",
    "Settings",
    "parse_address",
    "parse_port_range",
    "package_version",
    "parse_size",
]

DEFAULT_PORT = 6130
# The agent's port on every executor host: the server's port plus one, easy to remember.
DEFAULT_AGENT_PORT = 6131
# Flink keeps a released job's blobs for an hour (blob.service.cleanup.interval = 3600 s): long
# enough for the next stage or a retried job to find them, short enough not to hoard.
DEFAULT_CLEANUP_INTERVAL = 3600.0
# The jars, wheels and models of a few jobs at once, well under an executor's local disk.
DEFAULT_CACHE_MAX_BYTES = 10 << 30
ENV_PREFIX = "BLOBSVC_"

_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


@functools.cache
def package_version() -> str:
    """blobsvc's installed version, as STATUS, heartbeats and metrics report it."""
    from importlib import metadata  # with email, zipfile and lzma: milliseconds a client command does without

    try:
        return metadata.version("blobsvc")
    except metadata.PackageNotFoundError:
        return "unknown"


def parse_size(text: str | int) -> int:
    """Bytes from ``1048576``, ``512KiB``, ``64M`` or ``8GB`` (binary units throughout)."""
    if isinstance(text, int):
        return text
    match = re.fullmatch(r"\s*([0-9]+)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not match:
        raise ValueError(f"not a size: {text!r} (try 1048576, 512KiB or 8GiB)")
    return parse_decimal(match[1], "a size") * _UNITS[match[2]]


def parse_port_range(text: str | int) -> range:
    """The ports to try binding, first free one wins: ``0`` (any), ``6130``, ``50100-50200``."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", str(text))
    if match:
        with contextlib.suppress(ValueError):  # too many digits
            first, last = parse_decimal(match[1], "a port"), parse_decimal(match[2] or match[1], "a port")
            if 0 <= first <= last <= 65535:
                return range(first, last + 1)
    raise ValueError(f"not a port or port range: {text!r}")


def parse_address(server: str) -> tuple[str, int]:
    """``(host, port)`` from ``host:port``, ``[v6 address]:port``, ``host`` (the default
    port) or ``:port`` (127.0.0.1)."""
    host, sep, port = server.strip().rpartition(":")
    if not sep:
        host, port = server.strip(), str(DEFAULT_PORT)
    if ":" not in host or host.startswith("["):  # not a bare IPv6 address
        with contextlib.suppress(ValueError):
            number = parse_decimal(port, "a port")
            if 0 < number <= 65535:
                return host.strip("[]") or "127.0.0.1", number
    example = f"127.0.0.1:{DEFAULT_PORT}"
    raise InvalidArgument(f"not a server address: {server!r} (expected host:port, such as {example})")


# --- zk:// URLs (the servers of a cluster, found through ZooKeeper: blobsvc.ha.discovery) ---

ZK_SCHEME = "zk://"

_CLUSTER_ID = re.compile(r"[A-Za-z0-9_.-]+")
_HOSTS = re.compile(r"[A-Za-z0-9_.\[\]:-]+(,[A-Za-z0-9_.\[\]:-]+)*")


def is_zk_url(server: object) -> TypeGuard[str]:
    return isinstance(server, str) and server.startswith(ZK_SCHEME)


def check_cluster_id(cluster_id: str) -> str:
    if not _CLUSTER_ID.fullmatch(cluster_id):
        raise ValueError(f"not a cluster id: {cluster_id!r} (letters, digits, '_', '.', '-')")
    return cluster_id


def parse_zk_url(url: str) -> tuple[str, str]:
    """``(hosts, cluster id)`` of ``zk://h1:2181,h2:2181/ID``."""
    hosts, _, cluster_id = url.removeprefix(ZK_SCHEME).partition("/")
    if not url.startswith(ZK_SCHEME) or not _HOSTS.fullmatch(hosts) or not _CLUSTER_ID.fullmatch(cluster_id):
        raise ValueError(f"not a ZooKeeper URL: {url!r} (try zk://host:2181,host2:2181/CLUSTER_ID)")
    return hosts, cluster_id


def _parse_server(text: str) -> str:
    text = text.strip()
    if text.startswith("zk://"):
        parse_zk_url(text)
    else:
        parse_address(text)
    return text


def _parse_agent_url(text: str | None) -> str | None:
    """``http://host:port`` of a blobsvc agent, without a path; None or empty for none. Plain
    HTTP only: an agent serves the host it runs on (see ``agent_host``)."""
    text = (text or "").strip().rstrip("/")
    if not text:
        return None
    match = re.fullmatch(r"(http)://(\[[0-9a-fA-F:.]+\]|[^/\s:?#\[\]]+):(\d{1,5})", text)
    if match is None or not 0 < int(match[3]) < 65536:
        raise ValueError(f"not an agent URL: {text!r} (try http://127.0.0.1:{DEFAULT_AGENT_PORT})")
    return text


def _parse_port(text: str | int) -> str:
    parse_port_range(text)
    return str(text).strip()


def _parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    lowered = text.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


_N = TypeVar("_N", int, float)


def _number(parse: Callable[[Any], _N], text: Any, what: str) -> _N:
    try:
        return parse(text)
    except (TypeError, ValueError):
        raise ValueError(f"not {what}: {text!r}") from None


def _parse_seconds(text: str | float) -> float:
    value = _number(float, text, "a number of seconds")
    if not 0 < value < math.inf:  # also refuses nan
        raise ValueError(f"a duration must be a positive number of seconds, not {text!r}")
    return value


def _parse_positive(text: str | int) -> int:
    value = _number(int, text, "a whole number")
    if value < 1:
        raise ValueError(f"must be at least 1: {text!r}")
    return value


def _parse_count(text: str | int) -> int:
    value = _number(int, text, "a whole number")
    if value < 0:
        raise ValueError(f"must not be negative: {text!r}")
    return value


def _parse_recovery_mode(text: str) -> str:
    mode = text.strip().lower()
    if mode not in {"standalone", "zookeeper"}:
        raise ValueError(f"not a recovery mode: {text!r} (standalone or zookeeper)")
    return mode


def _optional_path(text: str | Path | None) -> Path | None:
    return Path(text).expanduser() if text else None


def _metrics_port(text: str | int | None) -> str | None:
    """A port, ``http`` (the HTTP face's ``/metrics`` only), or None (off)."""
    text = None if text is None else str(text).strip().lower()
    if text in (None, "", "off", "none"):
        return None
    if text == "http":
        return text
    with contextlib.suppress(ValueError):
        port = parse_decimal(text, "a port")
        if port <= 65535:
            return str(port)
    raise ValueError(f"not a port or 'http': {text!r}")


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        lowered = str(text).strip().lower()
        if lowered not in choices:
            raise ValueError(f"{text!r} is not one of {', '.join(choices)}")
        return lowered

    return parse


LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")


def _parse_tls_version(text: str | float) -> str:
    value = str(text).strip()
    if value not in ("1.2", "1.3"):
        raise ValueError(f"a TLS version is 1.2 or 1.3, not {text!r}")
    return value


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(base) / "blobsvc"


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "blobsvc"


def _parse_interval(text: str | float) -> float:
    value = _number(float, text, "a number of seconds")
    if value < 0:
        raise ValueError(f"must not be negative: {text!r}")
    return value


def _off(parse: Callable[[Any], _N]) -> Callable[[Any], _N | None]:
    """``parse``, or None (off) for ``off``, ``none``, an empty value or 0."""

    def parse_or_off(text: Any) -> _N | None:
        if text is None or str(text).strip().lower() in ("", "off", "none", "0"):
            return None
        return parse(text)

    return parse_or_off


_seconds_or_off = _off(_parse_seconds)
_size_or_off = _off(parse_size)


def _setting(default: Any, parse: Callable[[Any], Any], help: str, *, factory: bool = False) -> Any:
    meta = {"parse": parse, "help": help}
    if factory:
        return field(default_factory=default, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Settings:
    """Every setting of a server and of the client commands. See docs/configuration.md."""

    # server
    host: str = _setting("127.0.0.1", str, "Address to listen on; 0.0.0.0 for every interface.")
    port: str = _setting(
        str(DEFAULT_PORT), _parse_port, "Port, 0 for any free one, or a range such as 50100-50200 (first free wins)."
    )
    data_dir: Path = _setting(
        _default_data_dir, lambda v: Path(v).expanduser(), "Directory the server stores blobs in.", factory=True
    )
    max_blob_size: int = _setting(8 << 30, parse_size, "Largest blob a PUT may store.")
    max_connections: int = _setting(256, _parse_positive, "Connections served at once; more are answered BUSY.")
    checkpoint_history: int = _setting(
        100, _parse_positive, "Checkpoints per pipeline whose statistics the server keeps (its history), up to 10,000."
    )
    idle_timeout: float = _setting(60.0, _parse_seconds, "Seconds a connection may sit idle between requests.")
    io_timeout: float = _setting(
        30.0, _parse_seconds, "Seconds a request may go without a byte moving before it is aborted."
    )
    shutdown_timeout: float = _setting(
        10.0, _parse_seconds, "Seconds in-flight requests get to finish on SIGTERM or SIGINT."
    )
    verify_on_start: bool = _setting(True, _parse_bool, "Rehash every stored blob at start and drop corrupt ones.")
    http_port: str | None = _setting(
        None,
        _parse_port,
        "Port of the read-only HTTP face (GET/HEAD of blobs; signed URLs when a secret is set); off when unset.",
    )
    metrics_port: str | None = _setting(
        None,
        _metrics_port,
        "Port of the Prometheus /metrics endpoint on the server's host (0: any free), or 'http' for the HTTP "
        "face's /metrics only; off when unset.",
    )
    log_format: str = _setting("text", _choice(*LOG_FORMATS), "Server log lines: text, or json (one object per line).")
    log_level: str = _setting("info", _choice(*LOG_LEVELS), "Server log level; debug logs one line per request.")
    tls_cert: Path | None = _setting(
        None, _optional_path, "PEM certificate chain the server presents; when set, the server speaks only TLS."
    )
    tls_key: Path | None = _setting(None, _optional_path, "PEM private key of tls_cert, if not in the same file.")
    tls_client_ca: Path | None = _setting(
        None, _optional_path, "CA bundle for client certificates; when set, clients must present one (mutual TLS)."
    )
    tls_min_version: str = _setting("1.3", _parse_tls_version, "Oldest TLS version the server accepts: 1.2 or 1.3.")
    # retention of unreferenced content (blobsvc.server._retention)
    content_ttl: float | None = _setting(
        None, _seconds_or_off, "Seconds after which content no job names and nobody read is deleted; off when unset."
    )
    max_store_bytes: int | None = _setting(
        None,
        _size_or_off,
        "Bytes of blobs past which unreferenced content is deleted, least recently read first; off when unset.",
    )
    retention_grace: float = _setting(
        600.0,
        _parse_seconds,
        "Seconds after its upload, last read or last job name going during which content is never deleted.",
    )
    retention_interval: float = _setting(
        300.0, _parse_seconds, "Seconds between retention sweeps (content_ttl, max_store_bytes)."
    )
    # high availability
    recovery_mode: str = _setting(
        "standalone", _parse_recovery_mode, "standalone (local disk only) or zookeeper (leader election, HA store)."
    )
    zookeeper: str = _setting("", str, "ZooKeeper ensemble, HOST:PORT[,HOST:PORT…], in recovery mode zookeeper.")
    cluster_id: str = _setting("default", str, "Which cluster of servers this is, in ZooKeeper and in the HA store.")
    ha_dir: str = _setting(
        "", str, "HA blob store shared by the cluster: a directory or an fsspec URL (file://, s3://, …)."
    )
    ha_create_bucket: bool = _setting(
        False,
        _parse_bool,
        "Create the HA store's bucket (s3://, gs://, …) when it does not exist; without it a missing one is an error.",
    )
    zookeeper_session_timeout: float = _setting(
        10.0, _parse_seconds, "Seconds a server's ZooKeeper session outlives a lost connection; bounds failover time."
    )
    # executor hosts' agents, as the server sees them
    agent_heartbeat_interval: float = _setting(
        10.0, _parse_seconds, "Seconds the server asks executor hosts' agents to wait between heartbeats."
    )
    agent_lost_after: float = _setting(
        30.0, _parse_seconds, "Seconds without a heartbeat after which the server lists an agent's host as lost."
    )
    # client
    server: str = _setting(
        f"127.0.0.1:{DEFAULT_PORT}",
        _parse_server,
        "host:port of the server the client commands use, or zk://HOST:PORT[,…]/CLUSTER_ID to follow a leader.",
    )
    connect_timeout: float = _setting(
        10.0, _parse_seconds, "Seconds to wait for a connection (a server's first to ZooKeeper too, then it exits 1)."
    )
    timeout: float = _setting(60.0, _parse_seconds, "Seconds a client waits for a byte before giving up.")
    retries: int = _setting(
        3, _parse_count, "Attempts after the first for a failed connection or read (commands: not for a refused one)."
    )
    tls_ca: Path | None = _setting(
        None,
        _optional_path,
        "CA bundle that the server's certificate and host name must match; when set, clients use TLS.",
    )
    tls_client_cert: Path | None = _setting(
        None, _optional_path, "PEM certificate (with its key, or see tls_client_key) a client presents for mutual TLS."
    )
    tls_client_key: Path | None = _setting(None, _optional_path, "PEM private key of tls_client_cert, if not in it.")
    # executor cache
    cache_dir: Path = _setting(
        _default_cache_dir,
        lambda v: Path(v).expanduser(),
        "Directory of an executor host's blob cache, shared by its processes.",
        factory=True,
    )
    cache_max_bytes: int = _setting(
        DEFAULT_CACHE_MAX_BYTES, parse_size, "Bytes the cache may hold; unused blobs are evicted, oldest first."
    )
    cleanup_interval: float = _setting(
        DEFAULT_CLEANUP_INTERVAL, _parse_interval, "Seconds a job's cached files stay after its last release."
    )
    store_reads: bool = _setting(
        True,
        _parse_bool,
        "Caches read blobs straight from the HA store the server names (verified; the server on failure); "
        "0 to fetch from the server only.",
    )
    store_writes: bool = _setting(
        True,
        _parse_bool,
        "Checkpoint snapshots write new state files straight into the HA store the server names "
        "(the server records their names; the server on failure); 0 to send them to the server.",
    )
    # agent
    agent_host: str = _setting("127.0.0.1", str, "Address the agent listens on; keep it on loopback.")
    agent_port: str = _setting(
        str(DEFAULT_AGENT_PORT), _parse_port, "Port of the agent's HTTP face, 0 for any free one."
    )
    agent_url: str | None = _setting(
        None,
        _parse_agent_url,
        "http://HOST:PORT of the blobsvc agent, the same on every executor host (and the driver's): "
        "jars and packed environments then come through each host's cache.",
    )
    # both
    secret_file: Path | None = _setting(
        None, _optional_path, "File holding the shared secret; when set, the server requires AUTH."
    )

    def __post_init__(self) -> None:
        if self.agent_lost_after <= self.agent_heartbeat_interval:
            raise InvalidArgument(
                f"setting agent_lost_after ({self.agent_lost_after:g} s) must be longer than "
                f"agent_heartbeat_interval ({self.agent_heartbeat_interval:g} s): every host would be lost "
                "between two heartbeats"
            )

    @classmethod
    def load(
        cls,
        overrides: Mapping[str, Any] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
        config_file: Path | str | None = None,
    ) -> Settings:
        """Settings from command-line ``overrides`` (None values are ignored), then the
        environment, then the TOML file, then the defaults. A value that cannot be used, or
        a config file that cannot be read, raises :class:`InvalidArgument` naming it."""
        environ = os.environ if environ is None else environ
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        config_file = config_file or environ.get(f"{ENV_PREFIX}CONFIG")
        if config_file:
            try:
                with open(config_file, "rb") as f:
                    table = tomllib.load(f)
            except OSError as exc:
                raise InvalidArgument(f"cannot read config file {config_file}: {exc.strerror or exc}") from None
            except tomllib.TOMLDecodeError as exc:
                raise InvalidArgument(f"config file {config_file}: {exc}") from None
            for key, value in table.items():
                name = key.replace("-", "_")
                if name not in fields:
                    raise InvalidArgument(f"{config_file}: unknown setting {key!r}")
                values[name] = value
        for name in fields:
            env_value = environ.get(ENV_PREFIX + name.upper())
            if env_value is not None:
                values[name] = env_value
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        parsed = {}
        for name, value in values.items():
            try:
                parsed[name] = fields[name].metadata["parse"](value)
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"setting {name}: {exc}") from None
        return cls(**parsed)

    @staticmethod
    def help(name: str) -> str:
        return str(_FIELDS[name].metadata["help"])

    @staticmethod
    def parse(name: str, value: Any) -> Any:
        """``value`` as setting ``name`` holds it; a ValueError says what is wrong."""
        return _FIELDS[name].metadata["parse"](value)

    @staticmethod
    def metavar(name: str) -> str:
        """What a value of setting ``name`` looks like, for ``--help``."""
        return _METAVARS.get(_FIELDS[name].metadata["parse"], "TEXT")

    @staticmethod
    def default_text(name: str) -> str:
        """The default of setting ``name`` as a person would write it."""
        field = _FIELDS[name]
        value = field.default
        if value is dataclasses.MISSING:
            value = field.default_factory()  # type: ignore[operator]
        if value is None or value == "":
            # Unset turns a listener or a limit off; a file, a URL or an address is just not given.
            return "off" if field.metadata["parse"] in _OFF_WHEN_UNSET else "none"
        if isinstance(value, bool):
            return str(value).lower()
        if field.metadata["parse"] is parse_size:
            return _size_text(value)
        if isinstance(value, float):
            return f"{value:g}"
        return str(value)

    @property
    def ports(self) -> range:
        return parse_port_range(self.port)

    @property
    def http_ports(self) -> range | None:
        return None if self.http_port is None else parse_port_range(self.http_port)

    @property
    def http_url(self) -> str | None:
        """``http(s)://<server host>:<http_port>``, the HTTP face of the server the client
        commands use; None unless ``http_port`` names one port."""
        ports = self.http_ports
        if ports is None or len(ports) != 1 or ports.start == 0:
            return None
        host = self.server_address[0]
        scheme = "https" if self.tls_ca is not None else "http"  # a TLS server's HTTP face is TLS too
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{ports.start}"

    @property
    def server_address(self) -> tuple[str, int]:
        return parse_address(self.server)

    def secret(self) -> bytes | None:
        """The shared secret's bytes (surrounding whitespace dropped), if one is configured.

        An empty file is an error, not "no secret": a secret file created before its secret
        was written must not quietly turn authentication off."""
        if self.secret_file is None:
            return None
        try:
            secret = self.secret_file.read_bytes().strip()
        except OSError as exc:
            raise InvalidArgument(f"cannot read secret file {self.secret_file}: {exc.strerror or exc}") from None
        if not secret:
            raise InvalidArgument(f"secret file {self.secret_file} is empty")
        return secret


_FIELDS = {f.name: f for f in dataclasses.fields(Settings)}
_OFF_WHEN_UNSET = (_seconds_or_off, _size_or_off, _metrics_port, _parse_port)
_METAVARS: dict[Callable[[Any], Any], str] = {
    _parse_seconds: "SECONDS",
    _seconds_or_off: "SECONDS|off",
    _size_or_off: "SIZE|off",
    _parse_interval: "SECONDS",
    parse_size: "SIZE",
    _parse_port: "PORT[-PORT]",
    _parse_positive: "N",
    _parse_count: "N",
    _parse_server: "HOST:PORT",
    _optional_path: "FILE",
    _parse_bool: "BOOL",
    _parse_tls_version: "1.2|1.3",
}


def _size_text(size: int) -> str:
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        scale = _UNITS[unit[0].lower()]
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
