"""blobsvc.spark without a Spark session: the extra's error, publishing's checks, the handle, and
the task side of checkpoints.

``publish`` reads only ``getConf()`` of what it is given, so these tests hand it a real
``SparkConf`` (pure Python until a SparkContext exists) instead of starting a JVM."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import trustme
from pyspark import SparkConf

from blobsvc import BlobCache, BlobClient, InvalidArgument, Settings
from blobsvc.spark import NotOwner, Shipped, UnknownArtifact, checkpoints, publish

from .conftest import ServerThread, with_secret


class Conf:
    def __init__(self, **conf: str) -> None:
        self._conf = SparkConf(loadDefaults=False).setAll(list(conf.items()))

    def getConf(self) -> SparkConf:
        return self._conf


def test_importing_without_pyspark_names_the_extra() -> None:
    code = "import sys; sys.modules['pyspark'] = None; import blobsvc.spark"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "ImportError: blobsvc.spark needs PySpark: pip install blobsvc[spark]" in result.stderr


def test_publish_uploads_under_basenames_and_aliases_and_release_deletes_the_job(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    (tmp_path / "model.bin").write_bytes(b"weights")
    (tmp_path / "env.tgz").write_bytes(b"not checked until unpacked")
    spark = Conf(**{"spark.blobsvc.server": server_thread.address, "spark.blobsvc.cacheDir": str(tmp_path / "c")})
    with publish(spark, [tmp_path / "model.bin"], archives=[f"{tmp_path / 'env.tgz'}#env"]) as shipped:
        assert shipped.sent_bytes == len(b"weights") + len(b"not checked until unpacked")
        with BlobClient(server_thread.address) as client:
            assert sorted(info.name or "" for info in client.list(shipped.job)) == ["env", "model.bin"]
        assert shipped.path("model.bin").read_bytes() == b"weights"
        with pytest.raises(
            UnknownArtifact, match=r"^'nope' was not published .*\(published: env, model.bin\)"
        ) as caught:
            shipped.path("nope")
        assert isinstance(caught.value, KeyError)  # what code written against a dict catches
    with BlobClient(server_thread.address) as client:
        assert client.list(shipped.job) == []
    shipped.release()  # idempotent


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"files": ["missing.bin"]}, "no such file"),
        ({"py_files": ["model.bin"]}, "py_files take"),
        ({"archives": ["model.bin"]}, "not an archive"),
        ({"jars": ["model.bin"]}, "jars must end in .jar"),
        ({"files": ["model.bin", "other/model.bin"]}, "two artifacts are named 'model.bin'"),
        ({"jars": ["udf.jar"]}, "jars reach the executor JVMs over HTTP: set spark.blobsvc.agent"),
    ],
)
def test_publish_refuses_bad_input_before_uploading_anything(
    server_thread: ServerThread,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    kwargs: dict[str, list[str]],
    words: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("model.bin").write_bytes(b"m")
    Path("other").mkdir()
    Path("other/model.bin").write_bytes(b"m2")
    Path("udf.jar").write_bytes(b"PK")
    with pytest.raises(InvalidArgument, match=words):
        publish(Conf(**{"spark.blobsvc.server": server_thread.address}), **kwargs)  # type: ignore[arg-type]
    assert server_thread.server.requests["PUT"] == server_thread.server.requests["LINK"] == 0


@pytest.mark.parametrize("url", ["ftp://127.0.0.1:6131", "http://127.0.0.1", "http://127.0.0.1:6131/jars", "h:1"])
def test_publish_refuses_an_agent_url_that_is_not_http_host_port_in_one_line(
    server_thread: ServerThread, tmp_path: Path, url: str
) -> None:
    (tmp_path / "udf.jar").write_bytes(b"PK")
    spark = Conf(**{"spark.blobsvc.server": server_thread.address, "spark.blobsvc.agent": url})
    with pytest.raises(InvalidArgument, match=r"^setting agent_url: not an agent URL: [^\n]*$"):
        publish(spark, jars=[tmp_path / "udf.jar"])
    assert server_thread.server.requests["PUT"] == server_thread.server.requests["LINK"] == 0


def test_the_handle_pickles_small_without_the_secret_and_only_the_driver_releases(
    server_thread: ServerThread, tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text("s3cret-value")
    (tmp_path / "a.bin").write_bytes(b"a")
    server = server_thread.address
    with publish(
        Conf(**{"spark.blobsvc.server": server, "spark.blobsvc.secretFile": str(tmp_path / "secret")}),
        [tmp_path / "a.bin"],
    ) as shipped:
        wire = pickle.dumps(shipped)
        assert len(wire) < 1024 and b"s3cret" not in wire and str(tmp_path / "secret").encode() in wire
        copy = pickle.loads(wire)
        assert isinstance(copy, Shipped) and copy.job == shipped.job
        with pytest.raises(NotOwner, match="only the driver") as caught:
            copy.release()
        assert isinstance(caught.value, RuntimeError)
    with pytest.raises(InvalidArgument, match="cannot read secret file"):  # named but missing: before any upload
        publish(
            Conf(**{"spark.blobsvc.server": server, "spark.blobsvc.secretFile": str(tmp_path / "nope")}),
            [tmp_path / "a.bin"],
        )


def test_with_a_secret_from_the_environment_publish_resolve_and_release_authenticate(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret"
    secret.write_text("cluster-secret")
    server = ServerThread(replace(settings, secret_file=secret)).start()
    try:
        monkeypatch.setenv("BLOBSVC_SECRET_FILE", str(secret))
        monkeypatch.setenv("BLOBSVC_CACHE_DIR", str(tmp_path / "cache"))
        (tmp_path / "a.bin").write_bytes(b"a")
        with publish(Conf(**{"spark.blobsvc.server": server.address}), [tmp_path / "a.bin"]) as shipped:
            assert shipped.path("a.bin").read_bytes() == b"a"
            assert b"cluster-secret" not in pickle.dumps(shipped)
        with BlobClient(server.address, secret=b"cluster-secret") as client:
            assert client.list(shipped.job) == []
    finally:
        server.stop()


def test_over_tls_the_handle_carries_the_ca_path_and_every_process_builds_its_own_context(
    settings: Settings, tmp_path: Path
) -> None:
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    server = ServerThread(replace(settings, tls_cert=tmp_path / "server.pem")).start()
    try:
        (tmp_path / "a.bin").write_bytes(b"over tls")
        conf = Conf(
            **{
                "spark.blobsvc.server": server.address,
                "spark.blobsvc.tlsCa": str(tmp_path / "ca.pem"),
                "spark.blobsvc.cacheDir": str(tmp_path / "cache"),
            }
        )
        with publish(conf, [tmp_path / "a.bin"]) as shipped:
            copy = pickle.loads(pickle.dumps(shipped))
            assert ("tls_ca", str(tmp_path / "ca.pem")) in copy.options.conf
            assert copy.path("a.bin").read_bytes() == b"over tls"
        assert server.server.requests["DELETE"] == 1
    finally:
        server.stop()


def test_tasks_snapshot_and_restore_through_the_host_cache_with_the_executors_secret_file(
    settings: Settings, tmp_path: Path
) -> None:
    server = ServerThread(with_secret(settings, tmp_path)).start()
    try:
        conf = Conf(
            **{
                "spark.blobsvc.server": server.address,
                "spark.blobsvc.secretFile": str(tmp_path / "secret"),
                "spark.blobsvc.cacheDir": str(tmp_path / "cache"),
            }
        )
        state = tmp_path / "state"
        state.mkdir()
        (state / "a.sst").write_bytes(b"a" * 10_000)
        with checkpoints(conf, "p", timeout=30) as ckpt:
            first = pickle.loads(pickle.dumps(ckpt.tasks(ckpt.latest())))
            assert first.restore(0, tmp_path / "nothing") is None and not (tmp_path / "nothing").exists()
            with ckpt.begin(2, properties={"batch": 0}) as pending:
                for handle in [first.snapshot(0, state), first.snapshot("1", b"one")]:
                    pending.acknowledge(handle.task, handle)
            shipped = pickle.dumps(ckpt.tasks(pending.completed))
        assert b"s3cr3t" not in shipped  # the file's path travels, each executor reads it
        tasks = pickle.loads(shipped)
        assert (tasks.restore(0, tmp_path / "r0") / "a.sst").read_bytes() == b"a" * 10_000
        assert tasks.restore(1, tmp_path / "r1").read_bytes() == b"one"
        with pytest.raises(InvalidArgument, match="has no task '2'"):
            tasks.restore(2, tmp_path / "r2")
        with BlobCache(server.address, tmp_path / "cache", secret=b"s3cr3t") as cache:
            downloads = cache.stats().downloads
            tasks.restore(0, tmp_path / "again")  # the host has it: no transfer
            assert cache.stats().downloads == downloads == 2
    finally:
        server.stop()
