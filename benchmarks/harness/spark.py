"""Real PySpark on ``local-cluster[2,1,1024]``, bound to loopback, for the Spark tests and
the Spark benchmark: two executor JVMs, each with its own Python workers.

Functions that tasks run must not come from here: executors cannot import this package.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyspark

MASTER = "local-cluster[2,1,1024]"
# Keys one module's session sets that a later module's, in the same process, must not inherit.
UNINHERITED = ("spark.blobsvc.", "spark.plugins", "spark.connect.", "spark.archives", "spark.jars", "spark.pyspark.")


def _forget_earlier_sessions() -> None:
    """A stopped SparkContext's conf stays in the JVM's system properties, which every later
    SparkContext of the process loads as defaults: drop the keys of :data:`UNINHERITED`."""
    from pyspark import SparkContext

    if SparkContext._jvm is None:  # no JVM yet: nothing to inherit
        return
    system = SparkContext._jvm.java.lang.System
    for key in list(system.getProperties().stringPropertyNames()):
        if key.startswith(UNINHERITED):
            system.clearProperty(key)


def start_session(
    work_dir: Path, conf: dict[str, str], *, name: str = "blobsvc-test", prepare: Callable[[Any], Any] | None = None
) -> Any:
    """A SparkSession on two executors. ``work_dir`` receives the workers' directories and
    logs (Spark puts them under its own install otherwise). ``prepare`` gets the builder
    last, and returns the one to start from."""
    from pyspark.sql import SparkSession

    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["SPARK_WORKER_DIR"] = str(work_dir)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    _forget_earlier_sessions()
    builder = (
        SparkSession.builder.master(MASTER)
        .appName(name)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.task.maxFailures", "4")
    )
    for key, value in conf.items():
        builder = builder.config(key, value)
    if prepare is not None:
        builder = prepare(builder)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def start_connect_session(work_dir: Path, conf: dict[str, str]) -> tuple[Any, Any]:
    """A Spark Connect server on two executors, and a Connect session of it: ``(classic,
    connect)``. The server runs in this process's driver JVM, as ``builder.remote("local")``
    starts it, but on 127.0.0.1 and a port the OS picks (that builder always dials
    localhost:15002, which another user of the machine may hold). ``conf`` goes to the server's
    Spark conf, so the Connect session reads it as its runtime conf."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    classic = start_session(
        work_dir,
        {
            **conf,
            "spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
            "spark.connect.grpc.binding.address": "127.0.0.1",
            "spark.connect.grpc.binding.port": "0",
        },
        name="blobsvc-connect-test",
    )
    service = getattr(getattr(classic._jvm, "org.apache.spark.sql.connect.service.SparkConnectService$"), "MODULE$")
    return classic, ConnectSession.builder.remote(f"sc://127.0.0.1:{service.localPort()}").getOrCreate()


def compile_udf_jar(directory: Path) -> Path:
    """A jar with ``blobsvc.test.Shout`` (a Spark ``UDF1<String, String>`` upper-casing its
    argument and appending ``!``), compiled here with the machine's javac."""
    source = directory / "src" / "blobsvc" / "test" / "Shout.java"
    source.parent.mkdir(parents=True)
    source.write_text(
        "package blobsvc.test;\n"
        "import org.apache.spark.sql.api.java.UDF1;\n"
        "public class Shout implements UDF1<String, String> {\n"
        '    public String call(String s) { return s == null ? null : s.toUpperCase() + "!"; }\n'
        "}\n"
    )
    jars = Path(pyspark.__file__).parent / "jars"
    classpath = os.pathsep.join(str(j) for j in jars.glob("spark-sql-api_*.jar"))
    classes = directory / "classes"
    subprocess.run(
        ["javac", "--release", "17", "-cp", classpath, "-d", str(classes), str(source)], check=True, timeout=120
    )
    jar = directory / "shout.jar"
    with zipfile.ZipFile(jar, "w") as out:
        out.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\n")
        for path in classes.rglob("*.class"):
            out.write(path, path.relative_to(classes).as_posix())
    return jar


PROBE = "blobsvc_envprobe"  # a package only the packed environment holds
ANSWER = "probe-1.0"


def probe_wheel(directory: Path) -> Path:
    """A pure-Python wheel of ``blobsvc_envprobe``, written by hand: a wheel is a zip."""
    path = directory / f"{PROBE}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr(f"{PROBE}/__init__.py", f"ANSWER = {ANSWER!r}\n")
        wheel.writestr(
            f"{PROBE}-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: blobsvc-envprobe\nVersion: 1.0\n"
        )
        wheel.writestr(f"{PROBE}-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{PROBE}-1.0.dist-info/RECORD", "")
    return path
