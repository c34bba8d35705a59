"""The driver's side: ``publish`` uploads a job's artifacts (only bytes the server lacks)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .._exceptions import InvalidArgument
from ..client import BlobClient
from ..config import Settings
from ..driver._digests import file_digest
from ..wire._ids import new_job_id
from ..wire._tls import client_context_for
from ._artifacts import Artifact, Kind, Source, parse_source
from ._handle import Shipped
from ._jars import add_jars, is_connect
from ._local import CacheOptions

__all__ = ["CONF_KEYS", "HTTP_URL_KEY", "conf_settings", "publish", "spark_settings"]

log = logging.getLogger("blobsvc.spark")

CONF_KEYS = {
    "server": "spark.blobsvc.server",
    "cache_dir": "spark.blobsvc.cacheDir",
    "secret_file": "spark.blobsvc.secretFile",
    "cleanup_interval": "spark.blobsvc.cleanupInterval",
    "cache_max_bytes": "spark.blobsvc.cacheMaxBytes",
    "store_reads": "spark.blobsvc.storeReads",
    "store_writes": "spark.blobsvc.storeWrites",
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

    ``spark`` is a SparkSession (classic or Spark Connect) or a SparkContext; the blobsvc
    settings are read from its conf (a session's runtime conf, which starts as the Spark
    conf). Each artifact is named by its base name or by a ``#alias`` (``"env.tar.gz#env"``).
    A file whose bytes the server holds already (an earlier run's) is linked, not sent. Jars
    reach the JVMs as :mod:`._jars` says: through each executor host's agent when
    ``spark.blobsvc.agent`` is set. Use ``with publish(...) as shipped:`` so that the job is
    deleted on the server when the block ends.
    """
    conf = _conf_reader(spark)
    settings, options = spark_settings(spark, server=server)
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
    jar_sources = [source for source in sources if source.kind is Kind.JAR]
    jar_base = settings.agent_url or conf(HTTP_URL_KEY) or settings.http_url
    if jar_sources and jar_base is None and not is_connect(spark):
        raise InvalidArgument(
            f"jars reach the executor JVMs over HTTP: set {CONF_KEYS['agent_url']} (http://host:port of "
            f"each host's agent), or {HTTP_URL_KEY} (http://host:port) or {CONF_KEYS['http_port']} of the server"
        )
    job = new_job_id()
    secret = settings.secret()
    client_options = {"secret": secret, "tls": client_context_for(settings), "timeout": settings.timeout}
    with BlobClient(settings.server, **client_options) as client:
        artifacts, sent = _upload(client, job, sources, settings.cache_dir / "digests")
    shipped = Shipped(job, options, artifacts, owner=client_options)
    if jar_sources:
        try:
            agent = settings.agent_url is not None
            add_jars(spark, shipped, jar_sources, base_url=jar_base, agent=agent, secret=secret)
        except BaseException:
            shipped.release()  # a job whose jars Spark refused is of no use to anyone
            raise
    shipped.sent_bytes = sent
    log.info("published %d artifact(s) as job %s on %s; %d bytes sent", len(artifacts), job, settings.server, sent)
    return shipped


def spark_settings(spark: Any, *, server: str | None = None) -> tuple[Settings, CacheOptions]:
    """The blobsvc settings of ``spark``'s conf (see :func:`conf_settings`), and what of them
    executors need (:class:`CacheOptions`): the server's address, resolved here, and the conf's
    own values, which each executor reads there (a secret file's path, never its bytes)."""
    settings, from_conf = conf_settings(_conf_reader(spark), server=server)
    carried = {"server", "http_port"}
    conf = tuple((k, v) for k, v in from_conf.items() if v is not None and k not in carried)
    return settings, CacheOptions(settings.server, conf)


def _conf_reader(spark: Any) -> Callable[[str], str | None]:
    """How to read a conf key of ``spark``: a session's runtime conf (a Connect session has
    no other), a bare SparkContext's SparkConf."""
    if hasattr(spark, "conf"):
        return lambda key: spark.conf.get(key, None)
    spark_conf = spark.getConf()
    return lambda key: spark_conf.get(key)


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
    Digests of unchanged files come from ``digests`` (see :mod:`blobsvc.driver._digests`)."""
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
