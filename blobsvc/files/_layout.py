"""Where things live in a server's data directory, and how blob names become file names.

    <data dir>/
      incoming/               staging files of uploads in progress, and deleted jobs on
                              their way out; emptied at every start
      journal/0, journal/1    records of small blobs not yet checkpointed (blobsvc.storage._journal)
      objects/<key hex>       one file per distinct content: the only copy of its bytes
      cache/<key hex>         a content-addressed blob: a hard link to its object
      job_<job hex>/<name>    a job-scoped blob: a hard link to its object

Hard links make identical content cost one copy however many names it has, while deleting
one name never touches another; an object whose link count falls to one (itself) is garbage.

Job-scoped names may be any UTF-8 (``..``, ``a/b``, 255 bytes), so they are stored as
unpadded URL-safe base64, which has no ``/``, ``.`` or NUL and cannot escape the job
directory. A name longer than one file name allows is cut into components; every component
but the last ends in ``~``, which base64 never produces, so a directory never collides with
a blob. Anything whose name starts with ``.`` is a temporary file of a publication.
"""

from __future__ import annotations

import base64
import binascii
from pathlib import Path

from ..wire._protocol import JOB_SIZE, KEY_SIZE, name_error

__all__ = ["Layout", "decode_name", "encode_name"]

_COMPONENT = 200  # base64 characters per path component, well under NAME_MAX (255)
_DIR_MARK = "~"
JOB_PREFIX = "job_"


def encode_name(name: str) -> Path:
    """The relative path a job-scoped blob name is stored under."""
    text = base64.urlsafe_b64encode(name.encode("utf-8")).rstrip(b"=").decode("ascii")
    parts = [text[i : i + _COMPONENT] for i in range(0, len(text), _COMPONENT)]
    return Path(*[p + _DIR_MARK for p in parts[:-1]], parts[-1])


def decode_name(relative: Path) -> str | None:
    """The blob name stored at ``relative``, or None when it is not one this layout makes."""
    text = "".join(part.removesuffix(_DIR_MARK) for part in relative.parts)
    try:
        name = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None
    if name_error(name.encode("utf-8")) or encode_name(name) != relative:
        return None
    return name


class Layout:
    """The paths of one data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.incoming = root / "incoming"
        self.objects = root / "objects"
        self.cache = root / "cache"
        self.journal = root / "journal"

    def object(self, key: bytes) -> Path:
        return self.objects / key.hex()

    def content(self, key: bytes) -> Path:
        return self.cache / key.hex()

    def job_dir(self, job: bytes) -> Path:
        return self.root / f"{JOB_PREFIX}{job.hex()}"

    def job_blob(self, job: bytes, name: str) -> Path:
        return self.job_dir(job) / encode_name(name)

    def job_dirs(self) -> dict[bytes, Path]:
        """Every job directory present, by job id."""
        found: dict[bytes, Path] = {}
        for path in self.root.glob(f"{JOB_PREFIX}*"):
            try:
                job = bytes.fromhex(path.name[len(JOB_PREFIX) :])
            except ValueError:
                continue
            if len(job) == JOB_SIZE and path.is_dir():
                found[job] = path
        return found


def key_from_filename(name: str) -> bytes | None:
    """The key an ``objects/`` or ``cache/`` file name stands for, if it is one."""
    if len(name) != 2 * KEY_SIZE or name != name.lower():
        return None
    try:
        return bytes.fromhex(name)
    except ValueError:
        return None
