"""What a publication ships: artifacts, their kinds, and the names tasks know them by."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import InvalidArgument
from ..cache._archives import archive_kind

__all__ = ["Artifact", "Kind", "PY_SUFFIXES", "Source", "parse_source"]

PY_SUFFIXES = (".py", ".zip", ".whl", ".egg")


class Kind(enum.Enum):
    FILE = "file"
    PY = "py_file"
    ARCHIVE = "archive"
    JAR = "jar"


@dataclass(frozen=True, slots=True)
class Source:
    """A local file to publish, and the name tasks ask for it by."""

    path: Path
    name: str
    kind: Kind


@dataclass(frozen=True, slots=True)
class Artifact:
    """A published artifact, as the handle carries it to the tasks."""

    name: str
    kind: Kind
    key: str  # hex BLAKE3 of the bytes
    size: int
    filename: str  # the source's base name: an archive's format is read from it


def parse_source(spec: str | os.PathLike[str], kind: Kind) -> Source:
    """``"path"`` or ``"path#alias"`` (Spark's syntax) as a Source, checked; InvalidArgument when
    the file is missing or of a kind that cannot be shipped as asked."""
    text = os.fspath(spec)
    path_text, _, alias = text.partition("#")
    path = Path(path_text).expanduser()
    if not path.is_file():
        raise InvalidArgument(f"cannot publish {text!r}: no such file")
    if kind is Kind.ARCHIVE:
        archive_kind(path.name)
    elif kind is Kind.PY and not path.name.lower().endswith(PY_SUFFIXES):
        raise InvalidArgument(f"py_files take {', '.join(PY_SUFFIXES)}, not {path.name!r}")
    elif kind is Kind.JAR and not path.name.lower().endswith(".jar"):
        raise InvalidArgument(f"jars must end in .jar: {path.name!r}")
    name = alias or path.name
    if "/" in name or name in (".", ".."):
        raise InvalidArgument(f"{name!r} is not a plain file name")
    return Source(path, name, kind)
