"""What a packed Python environment holds, read from its archive's listing on the driver
before it is shipped: an archive without the interpreter the launcher runs is refused in one
line, rather than fail every task on every executor, and one without what Spark's Python
workers import for Arrow earns a one-line warning.

Both ways of unpacking run ``<tree>/bin/python`` (the agent's launcher execs it; Spark's
``./<alias>/bin/python``), so the archive must hold ``bin/python`` at its root, as venv-pack
and conda-pack write it. Python UDFs run with Arrow in Spark 4 by default
(``spark.sql.execution.pythonUDF.arrow.enabled``), pandas UDFs always: their workers import
``pyarrow`` and ``pandas`` (:data:`ARROW_MODULES`) from the environment.

Reading a ``.tar.gz`` listing decompresses the whole archive, so what it holds is remembered
under the digest memory's directory by the archive's digest (content: it never changes), and
an unchanged archive is not read again (see :mod:`blobsvc.driver._digests`).
"""

from __future__ import annotations

import contextlib
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import InvalidArgument
from ..files._stamps import save_record

__all__ = ["ARROW_MODULES", "PYTHON", "Contents", "arrow_warning", "checked_contents"]

PYTHON = "bin/python"
ARROW_MODULES = ("pyarrow", "pandas")
ARROW_UDF_KEY = "spark.sql.execution.pythonUDF.arrow.enabled"
_MODULE = re.compile(r"(?:^|/)site-packages/([A-Za-z0-9_]+)/__init__\.py$")


@dataclass(frozen=True)
class Contents:
    """What the launcher and Spark's workers look for in an environment."""

    python: bool
    """``bin/python`` is at the archive's root."""
    nested: str | None
    """The directory holding ``bin/python`` one level down (an archive of the environment's
    directory rather than of its contents), or None."""
    modules: frozenset[str]
    """Those of :data:`ARROW_MODULES` in a ``site-packages`` of the archive."""

    @property
    def missing_modules(self) -> list[str]:
        return [name for name in ARROW_MODULES if name not in self.modules]


def checked_contents(path: Path, key: bytes, memory: Path | None) -> Contents:
    """What the environment archive ``path`` (content ``key``) holds; InvalidArgument in one
    line when it lacks ``bin/python`` or cannot be read as the archive its name says."""
    contents = _remembered(key, memory) or _read(path)
    _remember(key, memory, contents)
    if not contents.python:
        where = (
            f"it is under {contents.nested}/: pack the environment's contents, not its directory"
            if contents.nested
            else "pack a venv (venv-pack) or a conda environment (conda-pack)"
        )
        raise InvalidArgument(f"{path.name} holds no {PYTHON} at its root, which every Python worker runs: {where}")
    return contents


def arrow_warning(name: str, contents: Contents, when: str) -> str | None:
    """The one-line warning for an environment (the archive ``name``) that lacks what Arrow
    needs, ``when`` saying when that matters; None when it holds it all."""
    missing = contents.missing_modules
    if not missing:
        return None
    return (
        f"{name} holds no {' or '.join(missing)}: {when} fail with \"No module named '{missing[0]}'\"; "
        f"add {' and '.join(missing)} to the environment, or set {ARROW_UDF_KEY}=false for Python UDFs"
    )


def _members(path: Path) -> Iterator[str]:
    """The archive's member names, without a leading ``./`` or a trailing ``/``. A tar is
    read header by header (a compressed one decompressed as far as it is read), nothing
    extracted."""
    if path.name.lower().endswith(".zip"):
        with zipfile.ZipFile(path) as archive:
            names: Iterator[str] = iter(archive.namelist())
            yield from map(_plain, names)
        return
    with tarfile.open(path) as archive:
        for member in archive:
            yield _plain(member.name)


def _plain(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.rstrip("/")


def _read(path: Path) -> Contents:
    python, nested, modules = False, None, set()
    try:
        for name in _members(path):
            if name == PYTHON:
                python = True
            elif name.count("/") == 2 and name.endswith("/" + PYTHON):
                nested = name.partition("/")[0]
            found = _MODULE.search(name)
            if found and found.group(1) in ARROW_MODULES:
                modules.add(found.group(1))
            if python and len(modules) == len(ARROW_MODULES):
                break  # all there: the rest of a large tar.gz need not be decompressed
    except (tarfile.TarError, zipfile.BadZipFile, EOFError, OSError) as exc:
        raise InvalidArgument(f"cannot read {path.name} as an archive: {exc}") from None
    return Contents(python, nested, frozenset(modules))


def _record(key: bytes, memory: Path) -> Path:
    return memory / f"{key.hex()}.contents"


def _remembered(key: bytes, memory: Path | None) -> Contents | None:
    if memory is None:
        return None
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        saved = json.loads(_record(key, memory).read_text())
        return Contents(bool(saved["python"]), saved["nested"], frozenset(map(str, saved["modules"])))
    return None


def _remember(key: bytes, memory: Path | None, contents: Contents) -> None:
    if memory is None:
        return
    record = _record(key, memory)
    if not record.exists():
        save_record(record, {"python": contents.python, "nested": contents.nested, "modules": sorted(contents.modules)})
