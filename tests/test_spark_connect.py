"""blobsvc.spark with a Spark Connect session: a session without a SparkContext, whose blobsvc
conf ``publish`` reads over Connect and whose jars go up as the session's own artifacts.

The Connect server runs on ``local-cluster[2,1,1024]`` (two executor JVMs, each with its own
Python workers), in this process's driver JVM (see ``start_connect_session``); the blob server
has no HTTP face, so nothing can reach Spark over one. One Connect session for the module.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.spark import compile_udf_jar, start_connect_session
from blobsvc import Settings
from blobsvc.spark import publish

from .conftest import ServerThread

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = 8


@dataclass
class Connect:
    server: ServerThread
    classic: Any
    session: Any


@pytest.fixture(scope="module")
def connect(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Connect]:
    root = tmp_path_factory.mktemp("connect")
    server = ServerThread(Settings(host="127.0.0.1", port="0", data_dir=root / "data", io_timeout=10.0)).start()
    conf = {"spark.blobsvc.server": server.address, "spark.blobsvc.cacheDir": str(root / "cache")}
    classic, session = start_connect_session(root / "work", conf)
    yield Connect(server, classic, session)
    session.stop()
    classic.stop()
    server.stop()


def test_a_udf_over_connect_reads_a_published_file_and_imports_a_published_module_and_a_jar_registers(
    connect: Connect, tmp_path: Path
) -> None:
    from pyspark.sql.connect.functions import udf
    from pyspark.sql.types import StringType

    (tmp_path / "greeting.txt").write_text("hello")
    (tmp_path / "connect_shout.py").write_text("def exclaim(s):\n    return s.upper() + '!'\n")
    jar = compile_udf_jar(tmp_path / "java")
    with publish(
        connect.session, [tmp_path / "greeting.txt"], py_files=[tmp_path / "connect_shout.py"], jars=[jar]
    ) as shipped:

        def greet(_: int) -> str:
            import connect_shout  # type: ignore[import-not-found]  # the published py_file

            # a standalone worker starts executor N in <app dir>/N
            return f"{os.path.basename(os.getcwd())} {connect_shout.exclaim(shipped.path('greeting.txt').read_text())}"

        greeting: Any = udf(greet, StringType())
        rows = connect.session.range(0, TASKS, 1, TASKS).select(greeting("id").alias("s")).collect()
        # The jar went up as the Connect session's artifact: no URL, no HTTP face.
        assert shipped.jar_urls == {}
        connect.session.udf.registerJavaFunction("shout", "blobsvc.test.Shout", StringType())
        shouted = connect.session.range(0, TASKS, 1, TASKS).selectExpr("shout(cast(id as string)) AS s").collect()
    assert {row.s.split()[0] for row in rows} == {"0", "1"}, "both executors ran tasks"
    assert {row.s.split()[1] for row in rows} == {"HELLO!"}
    assert sorted(row.s for row in shouted) == [f"{i}!" for i in range(TASKS)]


def test_publish_over_connect_reads_what_spark_conf_set_sets(connect: Connect, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("a")
    conf = connect.session.conf
    conf.set("spark.blobsvc.cleanupInterval", "7")
    try:
        with publish(connect.session, [tmp_path / "a.txt"]) as shipped:
            assert ("cleanup_interval", "7") in shipped.options.conf
    finally:
        conf.unset("spark.blobsvc.cleanupInterval")
