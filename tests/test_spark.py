"""blobsvc.spark with real PySpark on ``local-cluster[2,1,1024]``: two executor JVMs, each with
its own Python workers, one blob server, one host cache. One SparkSession per application;
the module starts two (the second application is the point of one test)."""

from __future__ import annotations

import importlib.util
import io
import os
import signal
import tarfile
import threading
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import blake3
import pytest

from benchmarks.harness.spark import compile_udf_jar, start_session
from blobsvc import BlobCache, BlobClient, Settings
from blobsvc.spark import Shipped, publish

from .conftest import ServerThread
from .test_cache_faults import FaultyProxy, running

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).parent.parent / "examples"
CLEANUP_INTERVAL = 2.0
TASKS = 8


@dataclass
class Cluster:
    server: ServerThread
    cache_dir: Path
    work_dir: Path
    session: Any

    @property
    def sc(self) -> Any:
        return self.session.sparkContext

    def requests(self) -> dict[str, int]:
        return dict(self.server.server.requests)

    def new_application(self) -> None:
        self.session.stop()
        self.session = start_session(self.work_dir, conf(self.server, self.cache_dir), name="second-application")


def conf(server: ServerThread, cache_dir: Path) -> dict[str, str]:
    http = server.server.http_address
    assert http is not None
    return {
        "spark.blobsvc.server": server.address,
        "spark.blobsvc.httpUrl": f"http://{http[0]}:{http[1]}",
        "spark.blobsvc.cacheDir": str(cache_dir),
        "spark.blobsvc.cleanupInterval": str(CLEANUP_INTERVAL),
    }


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("spark")
    settings = Settings(host="127.0.0.1", port="0", http_port="0", data_dir=root / "data", io_timeout=10.0)
    server = ServerThread(settings).start()
    cache_dir = root / "cache"
    session = start_session(root / "work", conf(server, cache_dir))
    running_cluster = Cluster(server, cache_dir, root / "work", session)
    yield running_cluster
    running_cluster.session.stop()
    server.stop()


@dataclass
class Artifacts:
    files: list[str]
    py_files: list[str]
    archives: list[str]
    jars: list[str]
    digests: dict[str, str]


def _wheel(path: Path) -> None:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("helpers/__init__.py", "def greet(name):\n    return 'hello ' + name\n")
        wheel.writestr("helpers-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: helpers\nVersion: 1.0\n")
        wheel.writestr("helpers-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("helpers-1.0.dist-info/RECORD", "")


def _tar_gz(path: Path, members: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("bin/current")
        link.type, link.linkname = tarfile.SYMTYPE, "tool.sh"
        tar.addfile(link)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Artifacts:
    root = tmp_path_factory.mktemp("artifacts")
    (root / "model.bin").write_bytes(os.urandom(3 << 20))
    (root / "scoring.py").write_text("def scale(x):\n    return 3 * x\n")
    with zipfile.ZipFile(root / "udfs.zip", "w") as z:
        z.writestr("udfs/__init__.py", "from .text import shout\n")
        z.writestr("udfs/text.py", "def shout(s):\n    return s.upper()\n")
    _wheel(root / "helpers-1.0-py3-none-any.whl")
    _tar_gz(root / "env.tar.gz", {"conf/settings.txt": b"mode=fast\n", "bin/tool.sh": b"#!/bin/sh\necho ok\n"})
    jar = compile_udf_jar(root / "java")
    files = [str(root / "model.bin")]
    return Artifacts(
        files=files,
        py_files=[str(root / n) for n in ("scoring.py", "udfs.zip", "helpers-1.0-py3-none-any.whl")],
        archives=[f"{root / 'env.tar.gz'}#env"],
        jars=[str(jar)],
        digests={
            "model.bin": blake3.blake3((root / "model.bin").read_bytes()).hexdigest(),
            "shout.jar": blake3.blake3(jar.read_bytes()).hexdigest(),
        },
    )


def publish_all(cluster: Cluster, artifacts: Artifacts) -> Shipped:
    return publish(
        cluster.session,
        artifacts.files,
        py_files=artifacts.py_files,
        archives=artifacts.archives,
        jars=artifacts.jars,
    )


def use_everything(cluster: Cluster, shipped: Shipped) -> list[tuple[Any, ...]]:
    """One row per task: which executor ran it and what it saw of each kind of artifact."""

    def task(_: Iterator[int]) -> Iterator[tuple[Any, ...]]:
        import helpers  # type: ignore[import-not-found]  # the wheel
        import scoring  # type: ignore[import-not-found]  # the .py file
        import udfs  # type: ignore[import-not-found]  # the zip

        env = shipped.path("env")
        yield (
            os.path.basename(os.getcwd()),  # a standalone worker starts executor N in <app dir>/N
            blake3.blake3(shipped.path("model.bin").read_bytes()).hexdigest(),
            blake3.blake3(shipped.path("shout.jar").read_bytes()).hexdigest(),
            udfs.shout("a") + helpers.greet("b") + str(scoring.scale(2)),
            (env / "conf" / "settings.txt").read_text(),
            (env / "bin" / "current").read_text(),
            any(
                os.stat(p).st_mode & 0o222
                for p in (env / "conf", env / "conf" / "settings.txt", shipped.path("model.bin"))
            ),
        )

    rows: list[tuple[Any, ...]] = cluster.sc.parallelize(range(TASKS), TASKS).mapPartitions(task).collect()
    return rows


def test_tasks_on_both_executors_get_every_kind_of_artifact_downloaded_once(
    cluster: Cluster, artifacts: Artifacts
) -> None:
    before = cluster.requests()
    with publish_all(cluster, artifacts) as shipped:
        rows = use_everything(cluster, shipped)
        gets = cluster.requests().get("GET", 0) - before.get("GET", 0)
        assert shipped.path("model.bin").read_bytes() == Path(artifacts.files[0]).read_bytes()  # on the driver too
    assert {row[0] for row in rows} == {"0", "1"}, "both executors ran tasks"
    for _, model, jar, code, settings, link, writable in rows:
        assert (model, jar) == (artifacts.digests["model.bin"], artifacts.digests["shout.jar"])
        assert code == "Ahello b6"
        assert (settings, link) == ("mode=fast\n", "#!/bin/sh\necho ok\n")
        assert not writable
    # One download per artifact for the whole host: 2 executors, 8 tasks, several workers.
    assert gets == 6
    assert len(list((cluster.cache_dir / "unpacked").iterdir())) == 3  # env's tree, its lock and boot record


def test_a_java_udf_from_a_shipped_jar_runs_on_the_executors(cluster: Cluster, artifacts: Artifacts) -> None:
    from pyspark.sql.types import StringType

    before = cluster.requests().get("HTTP_GET", 0)
    with publish(cluster.session, jars=artifacts.jars) as shipped:
        assert list(shipped.jar_urls) == ["shout.jar"]
        # The driver's class loader must see the class too: ADD JAR gave it the URL.
        cluster.session.udf.registerJavaFunction("shout", "blobsvc.test.Shout", StringType())
        rows = cluster.session.range(0, TASKS, 1, TASKS).selectExpr("shout(cast(id as string)) AS s").collect()
    assert sorted(row.s for row in rows) == [f"{i}!" for i in range(TASKS)]
    assert cluster.requests().get("HTTP_GET", 0) > before, "the jar came from blobsvc's HTTP face"


def test_the_example_pipeline_scores_with_its_shipped_model_and_module(cluster: Cluster, tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("score_pipeline", EXAMPLES / "score_pipeline.py")
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    scores = dict(example.run(cluster.session, tmp_path))
    assert scores["Great tool, I love it"] == 4.0 and scores["slow and broken"] == -2.5
    assert len(scores) == len(example.REVIEWS)


def test_a_second_application_uploads_and_downloads_nothing(cluster: Cluster, artifacts: Artifacts) -> None:
    with publish_all(cluster, artifacts) as first:  # the host's cache has it all after this
        use_everything(cluster, first)
    before = cluster.requests()
    cluster.new_application()
    with publish_all(cluster, artifacts) as second:
        assert second.sent_bytes == 0
        rows = use_everything(cluster, second)
    after = cluster.requests()
    assert {row[0] for row in rows} == {"0", "1"}
    assert after.get("PUT", 0) == before.get("PUT", 0), "no bytes uploaded"
    # Jars are the exception: executor JVMs fetch them with Spark's fetcher, over HTTP.
    assert after.get("GET", 0) == before.get("GET", 0), "no bytes downloaded"
    assert after["LINK"] - before["LINK"] == 6  # one per artifact, each answered with the size


def test_leaving_publish_deletes_the_job_and_host_caches_drop_its_files_after_the_interval(
    cluster: Cluster, artifacts: Artifacts
) -> None:
    with publish_all(cluster, artifacts) as shipped:
        use_everything(cluster, shipped)
        job_dir = cluster.cache_dir / "jobs" / shipped.job
        assert job_dir.is_dir()
    with BlobClient(cluster.server.address) as client:
        assert client.list(shipped.job) == []
    deadline = time.monotonic() + CLEANUP_INTERVAL + 20
    while job_dir.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job_dir.exists(), "the executors' caches kept the job's files"


def test_a_worker_killed_mid_download_leaves_no_partial_file_and_no_pinned_job(
    cluster: Cluster, tmp_path: Path
) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    digest = blake3.blake3(big.read_bytes()).hexdigest()
    partial_dir = cluster.cache_dir / "partial"
    # The executors download through a proxy slow enough (64 KiB per 10 ms) to be caught midway.
    proxy = FaultyProxy(cluster.server.server.address, throttle=0.01)
    with running(proxy, cluster.server), publish(cluster.session, [big], server=proxy.address) as shipped:

        def task(_: Iterator[int]) -> Iterator[tuple[int, str]]:
            from pyspark import TaskContext

            context = TaskContext.get()
            assert context is not None
            if context.attemptNumber() == 0:
                threading.Thread(target=shipped.path, args=("big.bin",), daemon=True).start()
                deadline = time.monotonic() + 60
                while not any(p.stat().st_size > 256 << 10 for p in partial_dir.iterdir()):
                    assert time.monotonic() < deadline, "the download never started"
                    time.sleep(0.005)
                os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-download
            yield context.attemptNumber(), blake3.blake3(shipped.path("big.bin").read_bytes()).hexdigest()

        rows = cluster.sc.parallelize([0], 1).mapPartitions(task).collect()
        assert rows[0][0] >= 1 and rows[0][1] == digest
        assert list(partial_dir.iterdir()) == []
    deadline = time.monotonic() + 10
    with BlobCache(cluster.server.address, cluster.cache_dir, verify_on_start=False) as cache:
        while cache.references(shipped.job) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cache.references(shipped.job) == 0, "a dead or finished worker still pins the job"
