"""The driver's side: ``publish`` uploads a job's artifacts (only bytes the server lacks)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._digests import file_digest
from .._exceptions import InvalidArgument
from .._ids import new_job_id
from .._spark_conf import URL_LIFETIME
from .._tls import client_context_for
from ..client import BlobClient
from ..config import Settings
from ._artifacts import Artifact, Kind, Source, parse_source
from ._handle import Shipped
from ._local import CacheOptions

__all__ = ["CONF_KEYS", "HTTP_URL_KEY", "conf_settings", "publish"]

log = logging.getLogger("blobsvc.spark")

CONF_KEYS = {
    "server": "spark.blobsvc.server",
    "cache_dir": "spark.blobsvc.cacheDir",
    "secret_file": "spark.blobsvc.secretFile",
    "cleanup_interval": "spark.blobsvc.cleanupInterval",
    "cache_max_bytes": "spark.blobsvc.cacheMaxBytes",
    "store_reads": "spark.blobsvc.storeReads",
    "http_port": "spark.blobsvc.httpPort",
    "agent_url": "spark.blobsvc.agent",
    "tls_ca": "spark.blobsvc.tlsCa",
    "tls_client_cert": "spark.blobsvc.tlsClientCert",
    "tls_client_key": "spark.blobsvc.tlsClientKey",
}
HTTP_URL_KEY = "spark.blobsvc.httpUrl"
"""Spark conf keys of the blobsvc settings ``publish`` reads (the ``BLOBSVC_*`` environment
and the defaults fill in the rest)."""

Paths = Iterable[str | os.PathLike[str]]


def publish(
    spark: Any,
    files: Paths = (),
    *,
    py_files: Paths = (),
    archives: Paths = (),
    jars: Paths = (),
    server: str | None = None,
) -> Shipped:
    """Upload artifacts as the blobs of a fresh job and return the handle tasks use.

    ``spark`` is a SparkSession or SparkContext. Each artifact is named by its base name or
    by a ``#alias`` (``"env.tar.gz#env"``). A file whose bytes the server holds already (an
    earlier run's) is linked, not sent. Use ``with publish(...) as shipped:`` so that the
    job is deleted on the server when the block ends.
    """
    context = getattr(spark, "sparkContext", spark)
    conf = context.getConf()
    settings, from_conf = conf_settings(conf.get, server=server)
    sources = [
        *(parse_source(f, Kind.FILE) for f in _each(files)),
        *(parse_source(f, Kind.PY) for f in _each(py_files)),
        *(parse_source(f, Kind.ARCHIVE) for f in _each(archives)),
        *(parse_source(f, Kind.JAR) for f in _each(jars)),
    ]
    seen: set[str] = set()
    for source in sources:
        if source.name in seen:
            raise InvalidArgument(f"two artifacts are named {source.name!r}: give one an #alias")
        seen.add(source.name)
    http_url = conf.get(HTTP_URL_KEY) or settings.http_url
    if http_url is None and any(source.kind is Kind.JAR for source in sources):
        raise InvalidArgument(
            f"jars reach the executor JVMs over the server's HTTP face: set {HTTP_URL_KEY} "
            f"(http://host:port) or {CONF_KEYS['http_port']}"
        )
    # What executors need of the conf travels in the handle; the address is resolved here.
    carried = {"server", "http_port"}
    options = CacheOptions(
        settings.server, tuple((k, v) for k, v in from_conf.items() if v is not None and k not in carried)
    )
    job = new_job_id()
    secret = settings.secret()
    client_options = {"secret": secret, "tls": client_context_for(settings), "timeout": settings.timeout}
    with BlobClient(settings.server, **client_options) as client:
        artifacts, sent = _upload(client, job, sources, settings.cache_dir / "digests")
    shipped = Shipped(job, options, artifacts, owner=client_options)
    if http_url is not None:
        _add_jars(spark, context, http_url, shipped, secret)
    shipped.sent_bytes = sent
    log.info("published %d artifact(s) as job %s on %s; %d bytes sent", len(artifacts), job, settings.server, sent)
    return shipped


def conf_settings(get: Callable[[str], str | None], **given: str | None) -> tuple[Settings, dict[str, str | None]]:
    """The settings a Spark conf holds (``get`` reads one of its keys; see :data:`CONF_KEYS`)
    over the ``BLOBSVC_*`` environment and the defaults, with the values ``given`` (unless
    None or empty) on top; and the conf's own values, by setting."""
    from_conf = {field: get(key) for field, key in CONF_KEYS.items()}
    return Settings.load({**from_conf, **{k: v for k, v in given.items() if v}}), from_conf


def _each(paths: Paths) -> list[str | os.PathLike[str]]:
    if isinstance(paths, str | os.PathLike):
        return [paths]  # one path given where a list was meant: not its characters
    return list(paths)


def _upload(client: BlobClient, job: str, sources: list[Source], digests: Path) -> tuple[tuple[Artifact, ...], int]:
    """Every source as a blob of ``job``; on any failure the half-published job is deleted.
    Digests of unchanged files come from ``digests`` (see :mod:`blobsvc._digests`)."""
    artifacts = []
    sent = 0
    try:
        for source in sources:
            key = file_digest(source.path, digests)
            info, uploaded = client.put_file(source.path, job=job, name=source.name, key=key)
            sent += info.size if uploaded else 0
            artifacts.append(Artifact(source.name, source.kind, info.key, info.size, source.path.name))
    except BaseException:
        client.delete_job(job)
        raise
    return tuple(artifacts), sent


def _add_jars(spark: Any, context: Any, http_url: str, shipped: Shipped, secret: bytes | None) -> None:
    """Hand each jar's URL to Spark: executors fetch it with Spark's own fetcher, and the
    driver's session class loader loads from it, so that ``registerJavaFunction`` finds its
    classes. ``ADD JAR`` does both; a bare SparkContext only reaches the executors."""
    from ..http import blob_url

    for artifact in shipped.artifacts.values():
        if artifact.kind is not Kind.JAR:
            continue
        url = blob_url(http_url, job=shipped.job, name=artifact.name, secret=secret, expires_in=URL_LIFETIME)
        if hasattr(spark, "sql"):
            spark.sql(f"ADD JAR '{url}'")
        else:
            context.addJar(url)
        shipped.jar_urls[artifact.name] = url
