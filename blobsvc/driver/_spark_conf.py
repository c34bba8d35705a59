"""The Spark conf that has every host fetch a packed Python environment and jars through its agent.

Each file goes to the server as a content blob, its bytes sent only when the server lacks
them, and Spark is given the blob's URL on the agent (``<agent>/blobs/<key>/<file name>``),
the same on every host: each host's agent downloads the blob once, verified, for every
application. Nothing here needs PySpark, so that ``blobsvc spark-conf`` serves spark-submit
users whose blobsvc has no Spark extra; ``blobsvc.spark.environment`` sets the same values on
a session builder.

An environment is unpacked one of two ways (``unpack``):

* ``"host"`` (the default): once per host, by the agent, into its cache; ``spark.files``
  fetches a tiny launcher script (``<agent>/python/<key>/<file name>/<alias>-python``) into
  each executor's working directory, and ``spark.pyspark.python=./<alias>-python`` runs the
  host's tree's Python through it (see :mod:`blobsvc.agent._python`);
* ``"spark"``: ``spark.archives``, which Spark unpacks in every executor of every application.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from .._exceptions import InvalidArgument, NotFound
from ..client import BlobClient
from ..config import Settings
from ..http import blob_url, python_path, signed_url
from ._conf_defaults import ARCHIVE_SUFFIXES, DEFAULT_ALIAS, DEFAULT_UNPACK, UNPACK_MODES, URL_LIFETIME
from ._contents import Contents, checked_contents
from ._digests import file_digest

__all__ = [
    "ARCHIVE_SUFFIXES",
    "DEFAULT_ALIAS",
    "DEFAULT_UNPACK",
    "UNPACK_MODES",
    "URL_LIFETIME",
    "agent_url",
    "archive_path",
    "check_alias",
    "check_unpack",
    "environment_conf",
    "environment_contents",
    "jar_path",
    "ship",
    "url",
]

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


def check_unpack(unpack: str) -> str:
    if unpack not in UNPACK_MODES:
        raise InvalidArgument(f"unpack={unpack!r}: give one of {', '.join(map(repr, UNPACK_MODES))}")
    return unpack


def agent_url(settings: Settings, how: str) -> str:
    """The agent's URL from ``settings``; InvalidArgument saying ``how`` to give one."""
    if settings.agent_url is None:
        raise InvalidArgument(f"no blobsvc agent to fetch through: {how} (http://HOST:PORT, the same on every host)")
    return settings.agent_url


def environment_contents(path: Path, settings: Settings) -> Contents:
    """What the environment archive at ``path`` holds, checked before it is shipped (see
    :mod:`blobsvc.driver._contents`): InvalidArgument when it has no ``bin/python``."""
    memory = settings.cache_dir / "digests"
    return checked_contents(path, file_digest(path, memory), memory)


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


def environment_conf(
    agent: str,
    key: str,
    path: Path,
    alias: str,
    settings: Settings,
    *,
    unpack: str = DEFAULT_UNPACK,
    archives: str | None = None,
    files: str | None = None,
    expires_in: float = URL_LIFETIME,
) -> dict[str, str]:
    """The conf that runs the Python workers in the environment ``path`` (content ``key``)
    fetched through ``agent``, unpacked by the ``unpack`` way (see the module's docstring).
    The entries of ``archives`` (``spark.archives``) or ``files`` (``spark.files``) already set
    are kept, but one Spark would put where this one goes (the same alias or file name)."""
    if unpack == "spark":
        archive_url = url(agent, key, path, settings, expires_in)
        kept = _kept(archives, lambda entry: _alias_of(entry) != alias)
        return {
            "spark.archives": ",".join([*kept, f"{archive_url}#{alias}"]),
            "spark.pyspark.python": f"./{alias}/bin/python",
        }
    check_unpack(unpack)
    launcher = f"{alias}-python"
    launcher_url = signed_url(agent, python_path(key, path.name, launcher), settings.secret(), expires_in)
    kept = _kept(files, lambda entry: _file_name_of(entry) != launcher)
    return {"spark.files": ",".join([*kept, launcher_url]), "spark.pyspark.python": f"./{launcher}"}


def _kept(entries: str | None, keep: Callable[[str], bool]) -> list[str]:
    return [entry for entry in (entries or "").split(",") if entry.strip() and keep(entry)]


def _file_name_of(entry: str) -> str:
    """The file name Spark fetches an entry of ``spark.files`` as: its path's last segment."""
    return entry.strip().split("#")[0].split("?")[0].rstrip("/").rsplit("/", 1)[-1]


def _alias_of(entry: str) -> str:
    """The directory Spark unpacks an entry of ``spark.archives`` into: its #fragment, else
    its file name."""
    location, _, fragment = entry.strip().partition("#")
    return fragment or _file_name_of(location)
