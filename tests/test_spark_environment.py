"""Packed Python environments through the host's agent: ``blobsvc.spark.environment``.

Without Spark: what it sets on a SparkConf, and its errors. With real PySpark on
``local-cluster[2,1,1024]`` (three applications, one after the other): the executors' Python
workers run in a venv-pack environment that only the agent delivered and unpacked once for
the host; a second application's hosts fetch and unpack nothing more; and a third, with
``unpack="spark"``, has Spark unpack it in each executor from the host's copy.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import blake3
import pytest
from pyspark import SparkConf

from benchmarks.harness.agent import AgentProcess, run_agent
from benchmarks.harness.spark import ANSWER, MASTER, PROBE, probe_wheel, start_session
from blobsvc import BlobClient, InvalidArgument, Settings
from blobsvc.driver import _contents, _digests
from blobsvc.files import _stamps
from blobsvc.spark import environment

from .conftest import ServerThread, with_secret

TASKS = 8
AGENT = "http://127.0.0.1:6131"


def packed_environment(directory: Path) -> Path:
    """``env.tar.gz``: a venv-pack archive of a fresh venv holding only the probe.

    Not pyspark: Spark puts its own ``pyspark.zip`` and py4j on the Python workers'
    PYTHONPATH, so an environment needs only what the tasks import (as Spark's own guide
    to venv-pack has it)."""
    import venv_pack

    venv = directory / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "--disable-pip-version-check"]
    install = [*pip, "install", "--quiet", "--no-index", "--no-deps", str(probe_wheel(directory))]
    subprocess.run(install, check=True, timeout=120)
    archive = directory / "env.tar.gz"
    venv_pack.pack(prefix=str(venv), output=str(archive))
    return archive


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return packed_environment(tmp_path_factory.mktemp("environment"))


# --- without Spark: a SparkConf ------------------------------------------------------------


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The shared server settings with a secret."""
    return with_secret(settings, tmp_path)


@pytest.fixture
def blank_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No BLOBSVC_* variable from outside; PYSPARK_PYTHON put back after the test."""
    for name in list(os.environ):
        if name.startswith("BLOBSVC_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)


def blobsvc_conf(server: ServerThread, tmp_path: Path, **extra: str) -> SparkConf:
    conf = SparkConf(loadDefaults=False).setMaster(MASTER)
    conf.set("spark.blobsvc.server", server.address)
    conf.set("spark.blobsvc.secretFile", str(server.settings.secret_file))
    conf.set("spark.blobsvc.cacheDir", str(tmp_path / "cache"))
    for key, value in extra.items():
        conf.set(key, value)
    return conf


def assert_signed_for_a_week(url: str) -> None:
    expires = int(parse_qs(urlsplit(url).query)["expires"][0])
    assert abs(expires - (time.time() + 7 * 24 * 3600)) < 60, "signed for 7 days: executors join later"


@pytest.mark.usefixtures("blank_environ")
def test_a_conf_gets_the_launcher_of_the_tree_the_agent_unpacks_once_per_host(
    server_thread: ServerThread, archive: Path, tmp_path: Path
) -> None:
    conf = blobsvc_conf(server_thread, tmp_path, **{"spark.files": "hdfs:///data/words.txt"})
    secret = str(server_thread.settings.secret_file)
    with run_agent(server_thread.address, tmp_path / "agent", "--secret-file", secret) as running:
        agent = running.url
        assert environment(conf, archive, agent=agent) is conf
        kept, url = conf.get("spark.files", "").split(",")
        status, script = running.get(url.removeprefix(agent))
        assert status == 200 and script.startswith(b"#!/bin/sh\nexec ") and b"/unpacked/" in script
    key = blake3.blake3(archive.read_bytes()).hexdigest()
    assert kept == "hdfs:///data/words.txt", "files already set are kept"
    assert url.startswith(f"{agent}/python/{key}/env.tar.gz/environment-python?expires=")
    assert_signed_for_a_week(url)
    assert conf.get("spark.archives") is None, "Spark unpacks nothing"
    assert conf.get("spark.pyspark.python") == "./environment-python"
    assert os.environ["PYSPARK_PYTHON"] == "./environment-python"
    with BlobClient(server_thread.address, secret=b"s3cr3t") as client:
        assert client.stat(key).size == archive.stat().st_size  # content: a blob of no job


@pytest.mark.usefixtures("blank_environ")
def test_unpacked_by_spark_a_conf_gets_the_archives_url_on_the_agent_and_the_python_inside_it(
    server_thread: ServerThread, archive: Path, tmp_path: Path
) -> None:
    conf = blobsvc_conf(server_thread, tmp_path)
    secret = str(server_thread.settings.secret_file)
    with run_agent(server_thread.address, tmp_path / "agent", "--secret-file", secret) as running:
        agent = running.url
        assert environment(conf, archive, agent=agent, unpack="spark") is conf
        url = conf.get("spark.archives", "").partition("#")[0]
        assert running.get(url.removeprefix(agent)) == (200, archive.read_bytes()), "the URL works as given"
    key = blake3.blake3(archive.read_bytes()).hexdigest()
    url, _, alias = conf.get("spark.archives", "").partition("#")
    assert alias == "environment"
    assert url.startswith(f"{agent}/blobs/{key}/env.tar.gz?expires=")
    assert_signed_for_a_week(url)
    assert urlsplit(url).path.endswith("/env.tar.gz"), "Spark unpacks by the file name the URL's path ends in"
    assert conf.get("spark.pyspark.python") == "./environment/bin/python"
    assert os.environ["PYSPARK_PYTHON"] == "./environment/bin/python"


@pytest.mark.usefixtures("blank_environ")
def test_an_archive_the_server_holds_is_neither_read_nor_sent_again(
    server_thread: ServerThread, archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_stamps, "RACY_SECONDS", 0.0)  # the archive was just written
    environment(blobsvc_conf(server_thread, tmp_path), archive, agent=AGENT)
    puts = server_thread.server.requests["PUT"]
    monkeypatch.setattr(_digests, "hash_file", lambda path: pytest.fail("read again"))
    monkeypatch.setattr(_contents, "_read", lambda path: pytest.fail("listed again"))
    conf = environment(blobsvc_conf(server_thread, tmp_path), archive, agent=AGENT)
    assert server_thread.server.requests["PUT"] == puts, "no bytes sent"
    assert f"/python/{blake3.blake3(archive.read_bytes()).hexdigest()}/" in conf.get("spark.files", "")


@pytest.mark.usefixtures("blank_environ")
def test_entries_already_set_are_kept_but_one_spark_would_put_in_the_same_place(
    server_thread: ServerThread, archive: Path, tmp_path: Path
) -> None:
    earlier = "hdfs:///data/dicts.zip#dicts,http://old-agent:6131/blobs/00/env.tar.gz?expires=1&signature=ab#py"
    conf = blobsvc_conf(server_thread, tmp_path, **{"spark.archives": earlier})
    environment(conf, archive, alias="py", agent=AGENT, unpack="spark")
    entries = conf.get("spark.archives", "").split(",")
    assert entries[0] == "hdfs:///data/dicts.zip#dicts"
    assert len(entries) == 2 and entries[1].startswith(f"{AGENT}/blobs/") and entries[1].endswith("#py")
    assert conf.get("spark.pyspark.python") == "./py/bin/python"
    earlier = "hdfs:///data/words.txt,http://old-agent:6131/python/00/env.tar.gz/py-python?expires=1&signature=ab"
    conf = blobsvc_conf(server_thread, tmp_path, **{"spark.files": earlier})
    environment(conf, archive, alias="py", agent=AGENT)
    entries = conf.get("spark.files", "").split(",")
    assert entries[0] == "hdfs:///data/words.txt"
    assert len(entries) == 2 and entries[1].startswith(f"{AGENT}/python/") and "/py-python?" in entries[1]
    assert conf.get("spark.pyspark.python") == "./py-python"


@pytest.mark.usefixtures("blank_environ")
def test_the_agent_is_the_argument_else_the_conf_else_the_environment(
    server_thread: ServerThread, archive: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def agent_of(conf: SparkConf) -> str:
        return urlsplit(conf.get("spark.files", "")).netloc

    monkeypatch.setenv("BLOBSVC_AGENT_URL", "http://127.0.0.1:7003")
    with_conf = {"spark.blobsvc.agent": "http://127.0.0.1:7002"}
    assert agent_of(environment(blobsvc_conf(server_thread, tmp_path), archive)) == "127.0.0.1:7003"
    assert agent_of(environment(blobsvc_conf(server_thread, tmp_path, **with_conf), archive)) == "127.0.0.1:7002"
    conf = blobsvc_conf(server_thread, tmp_path, **with_conf)
    assert agent_of(environment(conf, archive, agent="http://127.0.0.1:7001")) == "127.0.0.1:7001"


@pytest.mark.usefixtures("blank_environ")
@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"archive": "missing.tar.gz"}, "no such file"),
        ({"archive": "env.rar"}, "Spark unpacks .tar.gz, .tgz, .tar, .zip archives, not 'env.rar'"),
        ({"alias": "envs/py"}, "alias 'envs/py' must be a directory name"),
        ({"alias": "a,b"}, "alias 'a,b' must be a directory name"),
        ({"alias": ".."}, "alias '..' must be a directory name"),
        (
            {"agent": None},
            "no blobsvc agent to fetch through: pass agent=, or set spark.blobsvc.agent or BLOBSVC_AGENT",
        ),
        ({"agent": "ftp://agent:21"}, "setting agent_url: not an agent URL"),
        ({"builder": "spark.archives=x"}, "takes a SparkSession.Builder or a SparkConf, not a str"),
        ({"master": "local[2]"}, "master 'local[2]' (set) runs Python workers where no archive is unpacked"),
        ({"unpack": "pex"}, "unpack='pex': give one of 'host', 'spark'"),
        ({"archive": "no-python.zip"}, "no-python.zip holds no bin/python at its root, which every Python worker"),
    ],
    ids=[
        "missing-file",
        "not-an-archive",
        "alias-with-slash",
        "alias-with-comma",
        "alias-dot-dot",
        "no-agent",
        "not-an-agent-url",
        "not-a-conf",
        "local-master",
        "unknown-unpack",
        "no-python",
    ],
)
def test_bad_input_is_one_line_invalid_argument(
    server_thread: ServerThread, archive: Path, tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    (tmp_path / "env.rar").write_bytes(b"Rar!")
    with zipfile.ZipFile(tmp_path / "no-python.zip", "w") as packed:
        packed.writestr("lib/python3.11/site-packages/udfs.py", "")
    conf = blobsvc_conf(server_thread, tmp_path)
    arguments: dict[str, Any] = {"builder": conf, "archive": archive, "alias": "environment", "agent": AGENT}
    arguments.update(change)
    if "master" in arguments:
        conf.setMaster(arguments.pop("master"))
    if isinstance(arguments["archive"], str):
        arguments["archive"] = tmp_path / arguments["archive"]
    with pytest.raises(InvalidArgument) as raised:
        environment(arguments.pop("builder"), arguments.pop("archive"), **arguments)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    assert conf.get("spark.archives") is None and conf.get("spark.files") is None
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_the_readmes_snippet_run_as_python_app_py_is_refused_for_spark_default_local_master(
    archive: Path, tmp_path: Path
) -> None:
    """No master set anywhere: Spark's default local[*], refused although nobody set it."""
    app = tmp_path / "app.py"
    app.write_text(
        "from pyspark.sql import SparkSession\n"
        "from blobsvc.spark import environment\n"
        'builder = SparkSession.builder.config("spark.blobsvc.agent", "http://127.0.0.1:6131")\n'
        f"spark = environment(builder, {str(archive)!r}).getOrCreate()\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_SUBMIT_ARGS", "MASTER", "SPARK_CONF_DIR")}
    done = subprocess.run([sys.executable, str(app)], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1
    assert done.stderr.splitlines()[-1] == (
        "blobsvc._exceptions.InvalidArgument: master 'local[*]' (Spark's default: none was set) runs Python "
        "workers where no archive is unpacked: set a cluster's (builder.master(...), --master, spark.master)"
    )


@pytest.mark.usefixtures("blank_environ")
def test_an_environment_without_pyarrow_is_shipped_with_one_warning_when_udfs_would_need_it(
    server_thread: ServerThread, archive: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """PySpark 4 runs Python UDFs with Arrow (the driver has pyarrow and pandas): the workers
    import them from the environment."""

    def warnings(conf: SparkConf, packed: Path) -> list[str]:
        caplog.clear()
        environment(conf, packed, agent=AGENT)
        return [r.getMessage() for r in caplog.records if r.name == "blobsvc.spark" and r.levelname == "WARNING"]

    (warning,) = warnings(blobsvc_conf(server_thread, tmp_path), archive)
    assert warning.startswith("env.tar.gz holds no pyarrow or pandas: Python UDFs") and "\n" not in warning
    off = {"spark.sql.execution.pythonUDF.arrow.enabled": "false"}
    assert warnings(blobsvc_conf(server_thread, tmp_path, **off), archive) == []
    with_arrow = tmp_path / "arrow.zip"
    with zipfile.ZipFile(with_arrow, "w") as packed:
        packed.writestr("bin/python", "")
        for module in ("pyarrow", "pandas"):
            packed.writestr(f"lib/python3.11/site-packages/{module}/__init__.py", "")
    assert warnings(blobsvc_conf(server_thread, tmp_path), with_arrow) == []


# --- with Spark: three applications through one agent -----------------------------------


@dataclass
class Cluster:
    server: ServerThread
    agent: AgentProcess
    root: Path
    conf: dict[str, str]

    def fetched(self) -> float:
        """Bytes the agent downloaded from the server."""
        return self.agent.metric("blobsvc_agent_bytes_fetched_total")

    def unpacks(self) -> float:
        return self.agent.metric("blobsvc_agent_unpacks_total")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A server with a secret (no HTTP face: every byte Spark fetches goes through the agent)
    and one agent, for this host's driver and both executors."""
    root = tmp_path_factory.mktemp("spark-environment")
    settings = with_secret(Settings(host="127.0.0.1", port="0", data_dir=root / "data"), root)
    secret = settings.secret_file
    assert secret is not None
    server = ServerThread(settings).start()
    try:
        with (
            run_agent(server.address, root / "agent-cache", "--secret-file", str(secret)) as agent,
            pytest.MonkeyPatch.context() as patch,
        ):
            patch.setenv("PYSPARK_PYTHON", sys.executable)  # environment() sets it: put it back after
            conf = {
                "spark.blobsvc.server": server.address,
                "spark.blobsvc.secretFile": str(secret),
                "spark.blobsvc.cacheDir": str(root / "driver-cache"),
                "spark.blobsvc.agent": agent.url,
            }
            yield Cluster(server, agent, root, conf)
    finally:
        server.stop()


Row = tuple[str, str, str]


def run_application(
    cluster: Cluster, archive: Path, name: str, unpack: str, during: Callable[[], object] = lambda: None
) -> list[Row]:
    """One application with the environment, run to its end: one row per task, the executor,
    the worker's Python and what the probe package answered. ``during`` runs while it runs."""

    def task(_: Iterator[int]) -> Iterator[Row]:
        import blobsvc_envprobe  # type: ignore[import-not-found]

        # A standalone worker starts executor N in <app dir>/N.
        yield os.path.basename(os.getcwd()), sys.executable, blobsvc_envprobe.ANSWER

    session = start_session(
        cluster.root / "work", cluster.conf, name=name, prepare=lambda b: environment(b, archive, unpack=unpack)
    )
    try:
        rows: list[Row] = session.sparkContext.parallelize(range(TASKS), TASKS).mapPartitions(task).collect()
        during()
    finally:
        session.stop()
    return rows


def assert_ran_in(rows: list[Row], python: Callable[[str], str]) -> None:
    """Both executors ran tasks, each in the Python ``python(executor)`` names, with the probe."""
    assert {row[0] for row in rows} == {"0", "1"}, "both executors ran tasks"
    for executor, executable, answer in rows:
        assert executable.endswith(python(executor)) and answer == ANSWER, (executable, python(executor))


@dataclass
class FirstApplication:
    rows: list[Row]
    fetched: float
    unpacks: float
    hits: float
    refused: str


@pytest.fixture(scope="module")
def first_application(cluster: Cluster, archive: Path) -> FirstApplication:
    """The first application with the environment unpacked by the host's agent."""
    assert importlib.util.find_spec(PROBE) is None, "the probe must come from the environment only"
    refused = []

    def another_environment() -> None:
        with pytest.raises(InvalidArgument) as raised:
            environment(SparkConf(loadDefaults=False).setAll(list(cluster.conf.items())), archive)
        refused.append(str(raised.value))

    rows = run_application(cluster, archive, "first-application", "host", another_environment)
    hits = cluster.agent.metric("blobsvc_agent_hits_total")
    return FirstApplication(rows, cluster.fetched(), cluster.unpacks(), hits, refused[0])


def host_python(cluster: Cluster, archive: Path) -> str:
    key = blake3.blake3(archive.read_bytes()).hexdigest()
    return str(cluster.agent.cache_dir / "unpacked" / f"{key}.env" / "bin" / "python")


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_executors_run_tasks_in_the_tree_the_agent_unpacked_once_for_the_host(
    cluster: Cluster, first_application: FirstApplication, archive: Path
) -> None:
    assert_ran_in(first_application.rows, lambda _: host_python(cluster, archive))
    assert first_application.fetched == archive.stat().st_size, "the agent fetched the archive once for the host"
    assert first_application.unpacks == 1, "and unpacked it once, for the driver and both executors"
    assert "a SparkContext is running" in first_application.refused


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_second_application_fetches_and_unpacks_nothing_more(
    cluster: Cluster, archive: Path, first_application: FirstApplication
) -> None:
    rows = run_application(cluster, archive, "second-application", "host")
    assert_ran_in(rows, lambda _: host_python(cluster, archive))
    assert cluster.fetched() == first_application.fetched, "no byte more from the server"
    assert cluster.unpacks() == first_application.unpacks, "no unpack more"
    # The driver and both executors fetched the launcher again: from the host's tree.
    assert cluster.agent.metric("blobsvc_agent_hits_total") >= first_application.hits + 3


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_unpacked_by_spark_executors_run_tasks_in_their_own_copy_fetched_from_the_host(
    cluster: Cluster, archive: Path, first_application: FirstApplication
) -> None:
    rows = run_application(cluster, archive, "unpacked-by-spark", "spark")
    # Each executor's own copy, in its working directory (<app dir>/<executor>).
    assert_ran_in(rows, lambda executor: f"/{executor}/environment/bin/python")
    assert cluster.fetched() == first_application.fetched, "spark.archives came from the host's copy"


SUBMITTED_APP = """\
import json, os, sys
from pyspark.sql import SparkSession

def task(_):
    import blobsvc_envprobe
    yield os.path.basename(os.getcwd()), sys.executable, blobsvc_envprobe.ANSWER

spark = SparkSession.builder.getOrCreate()
rows = spark.sparkContext.parallelize(range(8), 8).mapPartitions(task).collect()
print(json.dumps({"driver": sys.executable, "rows": rows}))
spark.stop()
"""


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_spark_submit_in_client_mode_runs_the_recipe_as_written(cluster: Cluster, archive: Path) -> None:
    """docs/spark.md's recipe, in a shell: the BLOBSVC_* variables exported, then
    ``eval "spark-submit --master ... $(blobsvc spark-conf --environment env.tar.gz) app.py"``,
    in spark-submit's default client mode: the driver runs here, in the Python spark-conf
    names, and the executors in the host's tree."""
    work = cluster.root / "submit"
    work.mkdir()
    (work / "app.py").write_text(SUBMITTED_APP)
    shutil.copy(archive, work / "env.tar.gz")
    secret = cluster.server.settings.secret_file
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PYSPARK_", "BLOBSVC_"))}
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",  # spark-submit and blobsvc
        BLOBSVC_SERVER=cluster.server.address,
        BLOBSVC_SECRET_FILE=str(secret),
        BLOBSVC_AGENT_URL=cluster.agent.url,
        BLOBSVC_CACHE_DIR=str(cluster.root / "driver-cache"),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_WORKER_DIR=str(work / "workers"),
    )
    recipe = f"""eval "spark-submit --master '{MASTER}' --conf spark.ui.enabled=false \\
        $(blobsvc spark-conf --environment env.tar.gz) app.py" """
    done = subprocess.run(["bash", "-c", recipe], cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["driver"] == sys.executable, "the driver runs in the Python spark-conf named"
    assert_ran_in([tuple(row) for row in result["rows"]], lambda _: host_python(cluster, archive))
