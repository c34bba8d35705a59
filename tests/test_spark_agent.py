"""Jars through the host's agent, with real PySpark on ``local-cluster[2,1,1024]`` (two executor
JVMs), a blob server with a secret and no HTTP face (so a jar can reach Spark only through the
agent), and one ``blobsvc agent`` process for the host. One SparkSession per application; the
module starts two (the second application is the point of one test).

Spark keeps every jar it was given until the application ends, and an executor fetches them
all before its next task: so, as docs/spark.md asks, each handle that ships jars is released
only when its application has stopped."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.agent import AgentProcess, run_agent
from benchmarks.harness.spark import compile_udf_jar, start_session
from blobsvc import InvalidArgument, Settings
from blobsvc.spark import Shipped, publish

from .conftest import ServerThread

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

TASKS = 8
FETCHED = "blobsvc_agent_bytes_fetched_total"
SERVED = "blobsvc_agent_bytes_served_total"


@dataclass
class Cluster:
    server: ServerThread
    agent: AgentProcess
    work_dir: Path
    conf: dict[str, str]
    session: Any
    jar: Path
    handles: list[Shipped] = field(default_factory=list)

    def publish_jar(self, spark: Any) -> Shipped:
        """The jar, published for the rest of the application."""
        shipped = publish(spark, jars=[self.jar])
        self.handles.append(shipped)
        return shipped

    def stop_application(self) -> None:
        self.session.stop()
        for shipped in self.handles:
            shipped.release()
        self.handles.clear()

    def new_application(self) -> None:
        self.stop_application()
        self.session = start_session(self.work_dir, self.conf, name="second-application")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("spark-agent")
    secret_file = root / "secret"
    secret_file.write_text("agent test secret\n")
    settings = Settings(host="127.0.0.1", port="0", data_dir=root / "data", io_timeout=10.0, secret_file=secret_file)
    server = ServerThread(settings).start()
    cache_dir = root / "cache"  # the host's one cache: the agent's and the Python workers'
    jar = compile_udf_jar(root / "java")
    with run_agent(server.address, cache_dir, "--secret-file", str(secret_file)) as agent:
        conf = {
            "spark.blobsvc.server": server.address,
            "spark.blobsvc.cacheDir": str(cache_dir),
            "spark.blobsvc.secretFile": str(secret_file),
            "spark.blobsvc.agent": agent.url,
        }
        running = Cluster(server, agent, root / "work", conf, start_session(root / "work", conf), jar)
        yield running
        running.stop_application()
    server.stop()


def shout_on_executors(cluster: Cluster) -> list[tuple[str, str]]:
    """Publish the jar, register its UDF on the driver, and run it in tasks: (executor, result)
    per row."""
    from pyspark.sql.types import StringType

    def where(rows: Iterator[Any]) -> Iterator[tuple[str, str]]:
        executor = os.path.basename(os.getcwd())  # a standalone worker starts executor N in <app dir>/N
        for row in rows:
            yield executor, row.s

    session = cluster.session
    shipped = cluster.publish_jar(session)
    assert shipped.jar_urls["shout.jar"].startswith(f"{cluster.agent.url}/jobs/{shipped.job}/shout.jar?")
    session.udf.registerJavaFunction("shout", "blobsvc.test.Shout", StringType())
    # The UDF's column feeds a Python function in the same task: it ran in that executor.
    shouted = session.range(0, TASKS, 1, TASKS).selectExpr("shout(cast(id as string)) AS s")
    rows: list[tuple[str, str]] = shouted.rdd.mapPartitions(where).collect()
    return rows


def test_publish_refuses_jars_it_cannot_hand_to_spark_in_one_line(cluster: Cluster) -> None:
    conf = cluster.session.conf
    before = dict(cluster.server.server.requests)
    try:
        conf.set("spark.blobsvc.agent", "ftp://127.0.0.1:6131")
        with pytest.raises(InvalidArgument) as bad_url:
            publish(cluster.session, jars=[cluster.jar])
        conf.unset("spark.blobsvc.agent")  # and the server has no HTTP face either
        with pytest.raises(InvalidArgument) as no_url:
            publish(cluster.session, jars=[cluster.jar])
    finally:
        conf.set("spark.blobsvc.agent", cluster.agent.url)
    assert "agent_url" in str(bad_url.value) and "\n" not in str(bad_url.value)
    assert "spark.blobsvc.agent" in str(no_url.value) and "\n" not in str(no_url.value)
    assert dict(cluster.server.server.requests) == before, "refused before a byte was sent"


def test_executors_fetch_a_published_jar_through_the_agent_and_the_driver_loads_the_local_file(
    cluster: Cluster,
) -> None:
    served = cluster.agent.metric(SERVED)
    rows = shout_on_executors(cluster)
    assert {executor for executor, _ in rows} == {"0", "1"}, "the UDF ran on both executors"
    assert sorted(s for _, s in rows) == [f"{i}!" for i in range(TASKS)]
    assert cluster.agent.metric(SERVED) - served >= cluster.jar.stat().st_size, "the agent served the jar"
    # The driver's session class loader has the published file itself, not a URL of the agent.
    loader = cluster.session._jsparkSession.sharedState().jarClassLoader()
    assert f"file:{cluster.jar.resolve()}" in [url.toString() for url in loader.getURLs()]


def test_a_bare_spark_context_gives_its_executors_the_agent_url(cluster: Cluster) -> None:
    url = cluster.publish_jar(cluster.session.sparkContext).jar_urls["shout.jar"]
    assert url.startswith(f"{cluster.agent.url}/jobs/")
    assert url in [row[0] for row in cluster.session.sql("LIST JAR").collect()]


def test_a_second_application_gets_the_jar_from_the_agent_without_fetching_it_from_the_server(
    cluster: Cluster,
) -> None:
    shout_on_executors(cluster)  # the host has the jar after this, whatever ran before
    fetched, served = cluster.agent.metric(FETCHED), cluster.agent.metric(SERVED)
    cluster.new_application()
    rows = shout_on_executors(cluster)
    assert {executor for executor, _ in rows} == {"0", "1"}
    assert sorted(s for _, s in rows) == [f"{i}!" for i in range(TASKS)]
    assert cluster.agent.metric(SERVED) - served >= cluster.jar.stat().st_size, "the new executors asked the agent"
    assert cluster.agent.metric(FETCHED) == fetched, "the agent downloaded nothing from the server"
