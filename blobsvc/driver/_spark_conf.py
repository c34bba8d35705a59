"""The Spark conf that has every host fetch a packed Python environment and jars through its agent.

Each file goes to the server as a content blob, its bytes sent only when the server lacks
them, and Spark is given the blob's URL on the agent (``<agent>/blobs/<key>/<file name>``),
the same on every host: each host's agent downloads the blob once, verified, for every
application. Nothing here needs PySpark, so that ``blobsvc spark-conf`` serves spark-submit
users whose blobsvc has no Spark extra; ``blobsvc.spark.environment`` sets the same values on
a session builder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .._exceptions import InvalidArgument, NotFound
from ..client import BlobClient
from ..config import Settings
from ..http import blob_url
from ..wire._tls import client_context_for
from ._digests import file_digest

__all__ = [
    "ARCHIVE_SUFFIXES",
    "DEFAULT_ALIAS",
    "URL_LIFETIME",
    "agent_url",
    "archive_path",
    "blob_client",
    "check_alias",
    "environment_conf",
    "jar_path",
    "ship",
    "url",
]

# What Spark's fetcher unpacks, chosen by the file name the URL's path ends with
# (Utils.unpack); a file of any other name it leaves packed, and the interpreter is not there.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
DEFAULT_ALIAS = "environment"
# Executors that join later (dynamic allocation, a lost executor replaced) fetch spark.archives
# and spark.jars then: their signed URLs must outlive any application.
URL_LIFETIME = 7 * 24 * 3600.0
# The directory Spark unpacks into, and a URL fragment: no "/", no "," (it separates entries).
_ALIAS = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")


def archive_path(archive: str | os.PathLike[str]) -> Path:
    """``archive`` as a Path, checked: an existing file whose name Spark unpacks by."""
    path = _existing(archive)
    if not path.name.lower().endswith(ARCHIVE_SUFFIXES):
        raise InvalidArgument(f"Spark unpacks {', '.join(ARCHIVE_SUFFIXES)} archives, not {path.name!r}")
    return path


def jar_path(jar: str | os.PathLike[str]) -> Path:
    path = _existing(jar)
    if not path.name.lower().endswith(".jar"):
        raise InvalidArgument(f"jars must end in .jar: {path.name!r}")
    return path


def _existing(spec: str | os.PathLike[str]) -> Path:
    path = Path(spec).expanduser()
    if not path.is_file():
        raise InvalidArgument(f"no such file: {os.fspath(spec)!r}")
    return path


def check_alias(alias: str) -> str:
    if not _ALIAS.fullmatch(alias):
        raise InvalidArgument(f"alias {alias!r} must be a directory name of letters, digits, '.', '_' and '-'")
    return alias


def agent_url(settings: Settings, how: str) -> str:
    """The agent's URL from ``settings``; InvalidArgument saying ``how`` to give one."""
    if settings.agent_url is None:
        raise InvalidArgument(f"no blobsvc agent to fetch through: {how} (http://HOST:PORT, the same on every host)")
    return settings.agent_url


def blob_client(settings: Settings) -> BlobClient:
    return BlobClient(
        settings.server,
        secret=settings.secret(),
        tls=client_context_for(settings),
        connect_timeout=settings.connect_timeout,
        timeout=settings.timeout,
        retries=settings.retries,
    )


def ship(client: BlobClient, path: Path, digests: Path | None) -> tuple[str, bool]:
    """Store the file at ``path`` as a content blob; returns its hex key and whether its bytes
    were sent (not when the server holds them already). ``digests`` remembers the digests of
    unchanged files (see :mod:`blobsvc.driver._digests`)."""
    key = file_digest(path, digests)
    try:
        return client.stat(key).key, False
    except NotFound:
        return client.put(path), True


def url(agent: str, key: str, path: Path, settings: Settings, expires_in: float = URL_LIFETIME) -> str:
    """The blob's URL on the agent, its path ending in the file's name, signed with the
    server's secret (which the agents share) when there is one."""
    return blob_url(agent, key=key, name=path.name, secret=settings.secret(), expires_in=expires_in)


def environment_conf(archive_url: str, alias: str, archives: str | None = None) -> dict[str, str]:
    """``spark.archives`` (the entries of ``archives`` kept, but one of the same alias) with
    ``archive_url`` unpacked as ``./<alias>``, and the Python workers' interpreter in it."""
    kept = [entry for entry in (archives or "").split(",") if entry.strip() and _alias_of(entry) != alias]
    return {
        "spark.archives": ",".join([*kept, f"{archive_url}#{alias}"]),
        "spark.pyspark.python": f"./{alias}/bin/python",
    }


def _alias_of(entry: str) -> str:
    """The directory Spark unpacks an entry of ``spark.archives`` into: its #fragment, else
    its file name."""
    location, _, fragment = entry.strip().partition("#")
    return fragment or location.split("?")[0].rstrip("/").rsplit("/", 1)[-1]
