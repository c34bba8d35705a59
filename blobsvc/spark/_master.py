"""The master a SparkContext about to start will run on, as Spark itself will choose it.

``spark.master`` set on the builder or the SparkConf wins. Otherwise, when the driver's JVM
is already up (a plain Python driver that started a context before, or spark-submit's, whose
gateway it connects to), its system properties hold what spark-submit was given. Otherwise
PySpark will launch the JVM with spark-submit, which takes ``--master`` from
``PYSPARK_SUBMIT_ARGS``, else ``spark.master`` from ``spark-defaults.conf`` (in
``SPARK_CONF_DIR``, else ``SPARK_HOME/conf``), else the ``MASTER`` variable, else
``local[*]``: what ``python app.py`` gets. Nothing here launches a JVM, which would start it
without the builder's driver settings (``spark.driver.memory``, say).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import shlex
from collections.abc import Callable
from pathlib import Path

from pyspark import SparkContext

__all__ = ["DEFAULT_MASTER", "effective_master"]

DEFAULT_MASTER = "local[*]"
_PROPERTY = re.compile(r"\s*spark\.master\s*[=:\s]\s*(\S.*?)\s*$")


def effective_master(get: Callable[[str], str | None]) -> tuple[str, str]:
    """The master, and where it comes from (for a message)."""
    master = get("spark.master")
    if master:
        return master, "set"
    jvm = SparkContext._jvm
    if jvm is None and os.environ.get("PYSPARK_GATEWAY_PORT"):
        SparkContext._ensure_initialized()  # spark-submit's JVM: connects, launches nothing
        jvm = SparkContext._jvm
    if jvm is not None:
        master = jvm.java.lang.System.getProperty("spark.master")
        return (master, "the driver's JVM") if master else (DEFAULT_MASTER, "Spark's default: none was set")
    with contextlib.suppress(ValueError):  # unbalanced quotes: spark-submit would refuse them itself
        words = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
        for flag, value in itertools.pairwise(words):
            if flag == "--master":
                return value, "PYSPARK_SUBMIT_ARGS"
    defaults = _defaults_file()
    if defaults is not None:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            for line in defaults.read_text().splitlines():
                found = _PROPERTY.match(line)
                if found:
                    return found.group(1), str(defaults)
    if os.environ.get("MASTER"):
        return os.environ["MASTER"], "MASTER"
    return DEFAULT_MASTER, "Spark's default: none was set"


def _defaults_file() -> Path | None:
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        from pyspark.find_spark_home import _find_spark_home

        with contextlib.suppress(Exception, SystemExit):  # no Spark home to be found (it exits): no defaults
            conf_dir = os.path.join(_find_spark_home(), "conf")
    return Path(conf_dir) / "spark-defaults.conf" if conf_dir else None
