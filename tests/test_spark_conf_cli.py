"""``blobsvc spark-conf``: the --conf arguments that have spark-submit fetch a packed Python
environment and jars through each host's agent, and its one-line errors."""

from __future__ import annotations

import shlex
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import blake3
import pytest
from click.testing import CliRunner

from benchmarks.harness.agent import run_agent
from blobsvc import Settings
from blobsvc.cli import main

from .conftest import ServerThread, with_secret

AGENT = "http://127.0.0.1:6131"


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    """The shared server settings with a secret."""
    return with_secret(settings, tmp_path)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    with tarfile.open(tmp_path / "env.tar.gz", "w:gz") as tar:
        tar.add(__file__, "bin/python")
    (tmp_path / "udfs.jar").write_bytes(b"PK\x03\x04 udfs")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "udfs.jar").write_bytes(b"PK\x03\x04 another udfs")
    (tmp_path / "io.jar").write_bytes(b"PK\x03\x04 io")
    (tmp_path / "env.rar").write_bytes(b"Rar!")
    with tarfile.open(tmp_path / "no-python.tar.gz", "w:gz") as tar:
        tar.add(__file__, "lib/python3.11/site-packages/udfs.py")
    with tarfile.open(tmp_path / "nested.tar.gz", "w:gz") as tar:
        tar.add(__file__, "venv/bin/python")
    with zipfile.ZipFile(tmp_path / "arrow.zip", "w") as archive:
        archive.writestr("bin/python", "")
        for module in ("pyarrow", "pandas"):
            archive.writestr(f"lib/python3.11/site-packages/{module}/__init__.py", "")
    return tmp_path


def run(server: ServerThread, *args: str, agent: str | None = AGENT) -> tuple[int, str, str]:
    assert server.settings.secret_file is not None
    env = {
        "BLOBSVC_AGENT_URL": agent,
        "BLOBSVC_CACHE_DIR": str(server.settings.secret_file.parent / "cache"),
        "BLOBSVC_SECRET_FILE": str(server.settings.secret_file),
    }
    result = CliRunner().invoke(main, ["spark-conf", "-s", server.address, *args], env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def conf_of(out: str) -> dict[str, str]:
    words = shlex.split(out)
    assert out.count("\n") == 1 and words[::2] == ["--conf"] * (len(words) // 2)
    return dict(word.split("=", 1) for word in words[1::2])


def test_prints_the_conf_of_an_environment_and_jars_on_the_agent(server_thread: ServerThread, files: Path) -> None:
    secret = str(server_thread.settings.secret_file)
    with run_agent(server_thread.address, files / "agent", "--secret-file", secret) as agent:
        args = ["--environment", str(files / "env.tar.gz"), "--jar", str(files / "udfs.jar")]
        code, out, _ = run(server_thread, *args, "--jar", str(files / "io.jar"), agent=agent.url)
        assert code == 0
        conf = conf_of(out)

        def fetch(url: str) -> bytes:
            status, body = agent.get(url.removeprefix(agent.url).partition("#")[0])
            assert status == 200, body
            return body

        assert list(conf) == ["spark.files", "spark.pyspark.python", "spark.pyspark.driver.python", "spark.jars"]
        key = blake3.blake3((files / "env.tar.gz").read_bytes()).hexdigest()
        launcher = conf["spark.files"]
        assert launcher.startswith(f"{agent.url}/python/{key}/env.tar.gz/environment-python?expires=")
        tree = files / "agent" / "unpacked" / f"{key}.env"
        assert fetch(launcher) == f'#!/bin/sh\nexec {tree}/bin/python "$@"\n'.encode(), "unpacked once for the host"
        assert conf["spark.pyspark.python"] == "./environment-python"
        jars = conf["spark.jars"].split(",")
        assert [fetch(url) for url in jars] == [(files / "udfs.jar").read_bytes(), (files / "io.jar").read_bytes()]
        assert [urlsplit(url).path.rsplit("/", 1)[1] for url in jars] == ["udfs.jar", "io.jar"]


def test_a_second_run_sends_no_bytes_and_agent_beats_the_environment(server_thread: ServerThread, files: Path) -> None:
    assert run(server_thread, "--environment", str(files / "env.tar.gz"))[0] == 0
    puts = server_thread.server.requests["PUT"]
    code, out, _ = run(
        server_thread,
        *("--environment", str(files / "env.tar.gz"), "--alias", "py", "--unpack", "spark"),
        *("--agent", "http://10.0.0.1:7000", "--expires-in", "60"),
    )
    assert code == 0 and server_thread.server.requests["PUT"] == puts
    conf = conf_of(out)
    expires = int(parse_qs(urlsplit(conf["spark.archives"]).query)["expires"][0])
    assert time.time() < expires <= time.time() + 60
    assert conf["spark.archives"].startswith("http://10.0.0.1:7000/blobs/") and conf["spark.archives"].endswith("#py")
    assert conf["spark.pyspark.python"] == "./py/bin/python"


@pytest.mark.parametrize(
    ("args", "agent", "message"),
    [
        ([], AGENT, "give --environment, --jar or both"),
        (["--environment", "missing.tar.gz"], AGENT, "does not exist"),
        (["--environment", "env.rar"], AGENT, "Spark unpacks .tar.gz, .tgz, .tar, .zip archives, not 'env.rar'"),
        (["--environment", "env.tar.gz", "--alias", "a,b"], AGENT, "alias 'a,b' must be a directory name"),
        (["--jar", "env.tar.gz"], AGENT, "jars must end in .jar: 'env.tar.gz'"),
        (["--jar", "udfs.jar", "--jar", "lib/udfs.jar"], AGENT, "two jars have one file name"),
        (
            ["--environment", "env.tar.gz"],
            None,
            "no blobsvc agent to fetch through: give --agent, or set BLOBSVC_AGENT",
        ),
        (["--environment", "env.tar.gz", "--agent", "https://agent:1"], AGENT, "not an agent URL"),
        (["--environment", "env.tar.gz", "--unpack", "pex"], AGENT, "'pex' is not one of 'host', 'spark'"),
        (["--environment", "no-python.tar.gz"], AGENT, "no-python.tar.gz holds no bin/python at its root"),
        (["--environment", "nested.tar.gz"], AGENT, "it is under venv/: pack the environment's contents"),
        (
            ["--environment", "env.tar.gz", "--deploy-mode", "cluster", "--driver-python", "python3"],
            AGENT,
            "--driver-python goes with --environment in --deploy-mode client",
        ),
    ],
    ids=[
        "nothing-to-ship",
        "missing-file",
        "not-an-archive",
        "bad-alias",
        "not-a-jar",
        "same-jar-name",
        "no-agent",
        "not-an-agent-url",
        "unknown-unpack",
        "no-python",
        "python-one-level-down",
        "driver-python-in-cluster-mode",
    ],
)
def test_bad_input_is_a_usage_error_in_one_line(
    server_thread: ServerThread,
    files: Path,
    args: list[str],
    agent: str | None,
    message: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(files)
    puts = server_thread.server.requests["PUT"]
    code, out, err = run(server_thread, *args, agent=agent)
    assert (code, out) == (2, "")
    assert err.splitlines()[-1].startswith("Error: ") and message in err.splitlines()[-1]
    assert server_thread.server.requests["PUT"] == puts, "nothing uploaded"


def test_client_mode_names_the_drivers_python_and_cluster_mode_does_not(
    server_thread: ServerThread, files: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spark.pyspark.python wins over PYSPARK_DRIVER_PYTHON: a client-mode driver, which runs
    here, needs spark.pyspark.driver.python, or it looks for ./environment-python."""
    monkeypatch.delenv("PYSPARK_DRIVER_PYTHON", raising=False)
    environment = ["--environment", str(files / "env.tar.gz")]
    assert conf_of(run(server_thread, *environment)[1])["spark.pyspark.driver.python"] == sys.executable
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", "/opt/python/bin/python3")
    assert conf_of(run(server_thread, *environment)[1])["spark.pyspark.driver.python"] == "/opt/python/bin/python3"
    chosen = conf_of(run(server_thread, *environment, "--driver-python", "python3.11")[1])
    assert chosen["spark.pyspark.driver.python"] == "python3.11"
    in_cluster = conf_of(run(server_thread, *environment, "--deploy-mode", "cluster")[1])
    assert "spark.pyspark.driver.python" not in in_cluster and in_cluster["spark.pyspark.python"]


def test_an_environment_without_pyarrow_and_pandas_is_shipped_with_a_one_line_warning(
    server_thread: ServerThread, files: Path
) -> None:
    code, out, err = run(server_thread, "--environment", str(files / "env.tar.gz"))
    assert code == 0 and conf_of(out)["spark.pyspark.python"]
    assert err.count("\n") == 1 and err.startswith("Warning: env.tar.gz holds no pyarrow or pandas: ")
    assert "No module named 'pyarrow'" in err and "spark.sql.execution.pythonUDF.arrow.enabled=false" in err
    code, out, err = run(server_thread, "--environment", str(files / "arrow.zip"))
    assert (code, err) == (0, "")


def test_an_unreachable_server_exits_1_naming_it(files: Path) -> None:
    result = CliRunner().invoke(
        main,
        ["spark-conf", "-s", "127.0.0.1:1", "--environment", str(files / "arrow.zip")],
        env={"BLOBSVC_AGENT_URL": AGENT, "BLOBSVC_CACHE_DIR": str(files / "cache")},
    )
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == "Error: cannot connect to 127.0.0.1:1: Connection refused (1 attempt)\n"
