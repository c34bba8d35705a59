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
host's tree. The URL is signed like a blob's, over :func:`blobsvc.http.python_path`.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from ..http import HttpResponse, text_response

__all__ = ["launcher_problem", "launcher_response", "launcher_script"]


def launcher_script(tree: Path) -> bytes:
    """The shell script that runs ``tree``'s Python with the script's arguments. The path is
    absolute: the script runs in an executor's working directory, not the agent's."""
    return f'#!/bin/sh\nexec {shlex.quote(str(tree.absolute() / "bin" / "python"))} "$@"\n'.encode()


def launcher_problem(tree: Path) -> tuple[int, str] | None:
    """Why ``tree`` has no Python to launch (a status and a reason), or None when it has.
    Looks at ``bin/python`` without following it first: a link of its own is its interpreter."""
    python = tree / "bin" / "python"
    if not python.is_symlink() and not python.exists():
        return 400, "the archive has no bin/python: not a packed Python environment"
    if not python.exists():
        return 500, (
            f"bin/python points to {python.readlink()}, which this host lacks (a venv-pack environment needs "
            "its base interpreter at the same path on every host; conda-pack ships its own)"
        )
    return None


def launcher_response(tree: Path) -> HttpResponse:
    """200 with the launcher, or why ``tree`` has no Python to launch."""
    problem = launcher_problem(tree)
    if problem is not None:
        return text_response(*problem)
    return HttpResponse(200, [("Content-Type", "text/x-shellscript; charset=utf-8")], launcher_script(tree))
