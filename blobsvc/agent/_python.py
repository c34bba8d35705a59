"""``/python/<key>/<archive>/<launcher>``: a packed Python environment unpacked once per host.

Spark's own ``spark.archives`` unpacks an environment into every executor's (and the
driver's) directory for every application: hundreds of megabytes written each time. Instead,
the agent unpacks the archive (content ``key``, named ``archive`` so its kind is known) once
per host into the host cache, and answers a two-line POSIX shell script::

    #!/bin/sh
    exec '<cache>/unpacked/<key>.env/bin/python' "$@"

Listed in ``spark.files`` under the URL whose last segment is ``launcher``, Spark fetches
that script into each executor's working directory as ``./<launcher>`` and makes it
executable, and ``spark.pyspark.python=./<launcher>`` starts the Python workers from the
host's tree. The URL is signed like a blob's, over :func:`python_path`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .._exceptions import InvalidArgument
from .._ids import key_bytes
from ..cache._archives import archive_kind
from ..http import HttpResponse, text_response

__all__ = ["ROUTE", "launcher_response", "launcher_script", "parse_python_path", "python_path"]

ROUTE = "python"
# Both names end up as file names (Spark names the fetched file after the last segment): plain
# names only, which need no percent-encoding, so the path signed is the path requested.
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]{0,254}")


def python_path(key: bytes | str, archive: str, launcher: str) -> str:
    """The canonical path of the launcher of environment ``key`` (an archive named ``archive``)."""
    for what, name in (("archive", archive), ("launcher", launcher)):
        if not _NAME.fullmatch(name):
            raise InvalidArgument(f"the {what} name {name!r} is not a plain file name (letters, digits, '._+-')")
    archive_kind(archive)  # InvalidArgument for a name the agent does not unpack by
    return f"/{ROUTE}/{key_bytes(key).hex()}/{archive}/{launcher}"


def parse_python_path(path: str) -> tuple[bytes, str, str]:
    """The key, archive name and launcher name of a launcher URL's path; ValueError if it is none."""
    parts = path.split("/")
    if len(parts) != 5 or parts[1] != ROUTE:
        raise ValueError(f"expected /{ROUTE}/<key hex>/<archive file name>/<launcher name>")
    key, archive, launcher = parts[2:]
    python_path(key, archive, launcher)  # InvalidArgument (a ValueError) for a bad key or name
    return key_bytes(key), archive, launcher


def launcher_script(tree: Path) -> bytes:
    """The shell script that runs ``tree``'s Python with the script's arguments."""
    return f'#!/bin/sh\nexec {shlex.quote(str(tree / "bin" / "python"))} "$@"\n'.encode()


def launcher_response(tree: Path) -> HttpResponse:
    """200 with the launcher, or why ``tree`` has no Python to launch."""
    python = tree / "bin" / "python"
    if not python.is_symlink() and not python.exists():
        return text_response(400, "the archive has no bin/python: not a packed Python environment")
    if not python.exists():
        target = python.readlink()
        return text_response(
            500,
            f"bin/python points to {target}, which this host lacks (a venv-pack environment needs "
            "its base interpreter at the same path on every host; conda-pack ships its own)",
        )
    return HttpResponse(200, [("Content-Type", "text/x-shellscript; charset=utf-8")], launcher_script(tree))
