"""The handle ``publish`` returns: small, picklable, and at home on the driver and in tasks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .._exceptions import BlobError, InvalidArgument
from ..client import BlobClient
from ._artifacts import Artifact, Kind
from ._local import CacheOptions, add_py_files, current_task, release_driver, resolve

__all__ = ["NotOwner", "Shipped", "UnknownArtifact"]


class UnknownArtifact(InvalidArgument, KeyError):
    """``shipped.path(name)`` for a name the publication does not hold. A ``KeyError`` too."""

    __str__ = BaseException.__str__  # KeyError's would quote the whole message


class NotOwner(BlobError, RuntimeError):
    """A job released through a handle other than the driver's that published it. A
    ``RuntimeError`` too."""


class Shipped:
    """The artifacts of one publication: ``shipped.path(name)``, ``shipped.job``.

    Pickled into a task's closure it carries the server's address, the cache settings and
    each artifact's name, kind, digest and size; no secret. Unpickled inside a task, it
    makes the py_files importable at once. ``release()`` (or leaving ``with``) deletes the
    job on the server; only the driver's own handle can.
    """

    def __init__(
        self,
        job: str,
        options: CacheOptions,
        artifacts: tuple[Artifact, ...],
        *,
        owner: dict[str, Any] | None = None,
    ) -> None:
        self.job = job
        self.options = options
        self.artifacts = {artifact.name: artifact for artifact in artifacts}
        # The driver's client options (secret, TLS context) to delete the job with; None in
        # a copy that was unpickled. Never pickled.
        self._owner = owner
        self.released = False
        self.jar_urls: dict[str, str] = {}
        """The URL Spark was given for each jar (signed when the server has a secret); none
        for a Spark Connect session, whose jars go up as its own artifacts."""
        self.sent_bytes = 0
        """Bytes publish uploaded (0 when the server held every artifact already)."""

    def path(self, name: str) -> Path:
        """The local path of the artifact published as ``name`` (its base name or ``#alias``):
        a verified read-only file, or for an archive its unpacked read-only directory."""
        if self.released:
            raise BlobError(f"job {self.job} was released: its artifacts are gone")
        try:
            artifact = self.artifacts[name]
        except KeyError:
            known = ", ".join(sorted(self.artifacts)) or "none"
            raise UnknownArtifact(f"{name!r} was not published in job {self.job} (published: {known})") from None
        return resolve(self.options, self.job, artifact)

    def release(self) -> None:
        """Delete the job on the server; tasks can no longer fetch its artifacts. Idempotent."""
        if self._owner is None:
            raise NotOwner("only the driver that published a job can release it")
        if self.released:
            return
        self.released = True
        release_driver(self.options, self.job)
        with BlobClient(self.options.server, **self._owner) as client:
            client.delete_job(self.job)

    def __enter__(self) -> Shipped:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __reduce__(self) -> tuple[Any, ...]:
        return _arrive, (self.job, self.options, tuple(self.artifacts.values()))

    def __repr__(self) -> str:
        return f"Shipped(job={self.job!r}, artifacts={sorted(self.artifacts)!r}, server={self.options.server!r})"


def _arrive(job: str, options: CacheOptions, artifacts: tuple[Artifact, ...]) -> Shipped:
    """Unpickling: inside a task, the py_files go on ``sys.path`` before the task's code runs."""
    shipped = Shipped(job, options, artifacts)
    if current_task() is not None:
        add_py_files(options, job, [a for a in artifacts if a.kind is Kind.PY])
    return shipped
