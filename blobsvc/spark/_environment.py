"""A packed Python environment for the executors' Python workers, fetched through each host's agent."""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

import pyspark
from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from .._exceptions import InvalidArgument, InvalidArgumentType
from ..client import BlobClient
from ..driver import _spark_conf
from ..driver._contents import ARROW_MODULES, ARROW_UDF_KEY, arrow_warning
from ._master import effective_master
from ._publish import CONF_KEYS, conf_settings

__all__ = ["environment"]

log = logging.getLogger("blobsvc.spark")

_Target = TypeVar("_Target", SparkSession.Builder, SparkConf)


def environment(
    builder: _Target,
    archive: str | os.PathLike[str],
    *,
    alias: str = _spark_conf.DEFAULT_ALIAS,
    agent: str | None = None,
    server: str | None = None,
    unpack: str = _spark_conf.DEFAULT_UNPACK,
) -> _Target:
    """Run the executors' Python workers in the packed environment ``archive``, which every
    host fetches through its blobsvc agent; returns ``builder``, to start the session from.

    ``builder`` is a ``SparkSession.Builder`` or a ``SparkConf`` whose SparkContext has not
    started: Spark ships ``spark.archives`` and picks the workers' Python only as a context
    starts. The archive is uploaded to the server as a content blob, its bytes sent only when
    the server lacks them (an unchanged file is not even read again: its digest is
    remembered under the cache directory). Then, with ``unpack="host"`` (the default), the
    environment is unpacked once per host, by its agent, into the host cache, and ``builder``
    gets

    * ``spark.files`` += ``<agent>/python/<key>/<archive's file name>/<alias>-python``: a
      launcher script, ``exec <the host's tree>/bin/python "$@"``, which Spark fetches into
      each executor's working directory and makes executable; entries already there are
      kept, except one fetched under the same file name, which this one replaces;
    * ``spark.pyspark.python`` = ``./<alias>-python``, which spark-submit reads.

    With ``unpack="spark"`` Spark unpacks the archive itself, in every executor (and the
    driver) of every application, and ``builder`` gets

    * ``spark.archives`` += ``<agent>/blobs/<key>/<archive's file name>#<alias>``: a URL whose
      path ends in the file name, since Spark picks how to unpack by it (``.tar.gz``,
      ``.tgz``, ``.tar``, ``.zip``); entries already there are kept, except one unpacked
      under the same ``alias``, which this one replaces;
    * ``spark.pyspark.python`` = ``./<alias>/bin/python``.

    Either way, this process's ``PYSPARK_PYTHON`` environment variable is set to the same,
    because a plain Python driver gives its executors the Python that variable names when its
    SparkContext starts, not the conf's.

    The agent is ``agent``, else the conf's ``spark.blobsvc.agent``, else the ``agent_url``
    setting (``BLOBSVC_AGENT_URL``): the same URL on every host, the driver's included, since
    the driver fetches ``spark.archives`` too. The server and its secret come as for
    ``publish``: ``server``, else ``spark.blobsvc.server``, else ``BLOBSVC_SERVER``; the URL
    is signed for 7 days when there is a secret.

    The blob belongs to no job, since a builder has no end of life: it stays on the server
    until deleted there (``blobsvc delete KEY``), and each host keeps its copy under its
    cache's size limit, evicted least recently used.

    What the archive needs: a **conda-pack** archive ships its interpreter and is fully
    relocatable, the choice when hosts differ. A **venv-pack** archive's ``bin/python`` is a
    symlink to the absolute path of the interpreter the venv was made from, which must exist
    at that path on every host. A **pex** file is no archive: ship it with
    ``spark.files`` and ``spark.pyspark.python=./env.pex`` instead. A host tree lives as long
    as its archive in the host cache: evicted (least recently used, under the cache's limit),
    both go, even under a Python worker still running from the tree.

    The archive must hold ``bin/python`` at its root, which every Python worker runs; its
    listing is read before anything is uploaded (see :mod:`blobsvc.driver._contents`). When
    the session's Python UDFs will run with Arrow (Spark 4's default, with pyarrow and pandas
    on the driver) and the archive holds no pyarrow or pandas, one line is logged at warning:
    their tasks would fail with ``No module named 'pyarrow'``.

    Not for a ``local`` master, whose Python workers start in the driver's directory rather
    than where archives and files are fetched to: the master Spark will use counts, the one
    set on ``builder`` or, unset, the one spark-submit, ``spark-defaults.conf`` or Spark's
    default ``local[*]`` gives (see :mod:`blobsvc.spark._master`). A missing file, a name
    Spark does not unpack, an archive without ``bin/python``, an alias that is no plain
    directory name, an ``unpack`` other than ``"host"`` or ``"spark"``, no agent, a
    ``local`` master, or a SparkContext already running raises :class:`InvalidArgument`.
    """
    conf = _conf_of(builder)
    path = _spark_conf.archive_path(archive)
    alias = _spark_conf.check_alias(alias)
    unpack = _spark_conf.check_unpack(unpack)
    if SparkContext._active_spark_context is not None:
        raise InvalidArgument("a SparkContext is running: stop it before giving a new one an environment")
    master, source = effective_master(conf.get)
    if master.startswith("local") and not master.startswith("local-cluster"):
        # Spark unpacks archives into a temporary directory there, not where workers start.
        raise InvalidArgument(
            f"master {master!r} ({source}) runs Python workers where no archive is unpacked: "
            "set a cluster's (builder.master(...), --master, spark.master)"
        )
    settings, _ = conf_settings(conf.get, server=server, agent_url=agent)
    agent_url = _spark_conf.agent_url(settings, f"pass agent=, or set {CONF_KEYS['agent_url']} or BLOBSVC_AGENT_URL")
    contents = _spark_conf.environment_contents(path, settings)
    if _arrow_udfs(conf.get):
        warning = arrow_warning(path.name, contents, "Python UDFs (with Arrow: Spark 4's default) and pandas UDFs")
        if warning is not None:
            log.warning("%s", warning)
    with BlobClient.from_settings(settings) as client:
        key, sent = _spark_conf.ship(client, path, settings.cache_dir / "digests")
    values = _spark_conf.environment_conf(
        agent_url,
        key,
        path,
        alias,
        settings,
        unpack=unpack,
        archives=conf.get("spark.archives"),
        files=conf.get("spark.files"),
    )
    for name, value in values.items():
        conf.set(name, value)
    os.environ["PYSPARK_PYTHON"] = values["spark.pyspark.python"]
    held = "uploaded" if sent else "held already"
    log.info("environment %s (%s, %s) through %s, unpacked by %s", path.name, key, held, agent_url, unpack)
    return builder


def _arrow_udfs(get: Callable[[str], str | None]) -> bool:
    """Whether this session's Python UDFs will run with Arrow, so that its workers import
    pyarrow and pandas: as the conf says, else as this PySpark does by default (from Spark 4
    on, when the driver has both; without them PySpark falls back to pickled rows)."""
    value = get(ARROW_UDF_KEY)
    if value is not None:
        return value.strip().lower() == "true"
    major = int(pyspark.__version__.split(".")[0])
    return major >= 4 and all(importlib.util.find_spec(name) is not None for name in ARROW_MODULES)


class _BuilderConf:
    """A builder's options read and written like a SparkConf's. PySpark's Builder has no
    getter: its options dict is where what was set on it lives until the session starts."""

    def __init__(self, builder: SparkSession.Builder) -> None:
        self.builder = builder

    def get(self, key: str) -> str | None:
        value = self.builder._options.get(key)
        return None if value is None else str(value)

    def set(self, key: str, value: str) -> None:
        self.builder.config(key, value)


def _conf_of(builder: Any) -> SparkConf | _BuilderConf:
    if isinstance(builder, SparkConf):
        return builder
    if isinstance(builder, SparkSession.Builder):
        return _BuilderConf(builder)
    what = type(builder).__name__
    raise InvalidArgumentType(f"environment() takes a SparkSession.Builder or a SparkConf, not a {what}")
