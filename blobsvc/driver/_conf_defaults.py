"""The defaults of the Spark conf :mod:`._spark_conf` writes, apart from it so that the
command line shows them in ``--help`` without loading the client it ships files with."""

from __future__ import annotations

__all__ = ["ARCHIVE_SUFFIXES", "DEFAULT_ALIAS", "DEFAULT_UNPACK", "UNPACK_MODES", "URL_LIFETIME"]

# What Spark's fetcher unpacks, chosen by the file name the URL's path ends with
# (Utils.unpack); a file of any other name it leaves packed, and the interpreter is not there.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
DEFAULT_ALIAS = "environment"
UNPACK_MODES = ("host", "spark")
DEFAULT_UNPACK = "host"
# Executors that join later (dynamic allocation, a lost executor replaced) fetch spark.archives
# and spark.jars then: their signed URLs must outlive any application.
URL_LIFETIME = 7 * 24 * 3600.0
