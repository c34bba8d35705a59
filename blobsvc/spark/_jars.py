"""How a publication's jars reach the JVMs that run the job, by the kind of session given.

* **A classic SparkSession with an agent** (``spark.blobsvc.agent``): each executor JVM
  fetches each jar from the agent on its own host (``SparkContext.addJar`` of the agent's
  URL of the job's blob, signed when the server has a secret), so a jar crosses the network
  once per host, verified, and stays in the host's cache for later applications. The
  driver's session class loader loads the *local file being published* instead: it is on
  the driver already, and the driver's host may run no agent. That is what ``ADD JAR`` does
  (``SparkContext.addJar``, then ``sharedState.jarClassLoader.addURL``, then the calling
  thread's context class loader set to it), with the executors' half pointed at the agent
  and the driver's at the file. ``registerJavaFunction`` finds the classes through the
  session's class loader in Spark 4.3, through the calling thread's context class loader in
  earlier versions: there, register from the thread that published, as after ``ADD JAR``.
  Leave the file as it is while the session runs: the loader reads it lazily.
* **A classic SparkSession without an agent**: ``ADD JAR`` of the server's HTTP URL; the
  driver and the executors fetch the jar from the server's HTTP face.
* **A bare SparkContext**: ``addJar`` of the URL (the agent's, else the server's): the
  executors get the jar; there is no session class loader to give it to.
* **A Spark Connect session** has no SparkContext and no driver JVM of its own: the jar goes
  up through the session's artifact API (``addArtifacts``), and the Connect server serves it
  to its executors and to the session's class loader. No URL is involved, so neither the
  agent nor the server's HTTP face is.

Spark keeps every jar it is given until the application ends, and an executor that starts
later fetches them all before its first task: a handle that ships jars by URL must stay
unreleased (its job, and so its URLs, alive) until the application has stopped.
"""

from __future__ import annotations

import sys
from typing import Any

from ..driver._spark_conf import URL_LIFETIME
from ..http import blob_url
from ._artifacts import Source
from ._handle import Shipped

__all__ = ["add_jars", "is_connect"]


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session."""
    # Whoever made a Connect session imported its module; looking in sys.modules keeps the
    # Connect client (grpc, pandas, pyarrow) out of a classic driver.
    connect = sys.modules.get("pyspark.sql.connect.session")
    return connect is not None and isinstance(spark, connect.SparkSession)


def add_jars(
    spark: Any, shipped: Shipped, jars: list[Source], *, base_url: str | None, agent: bool, secret: bytes | None
) -> None:
    """Give Spark the published ``jars`` of ``shipped`` as the module's docstring says: by URL
    under ``base_url`` (the agent's when ``agent``, else the server's HTTP face), or through
    the Connect session's artifacts (``base_url`` unused, None allowed)."""
    if is_connect(spark):
        for jar in jars:
            spark.addArtifacts(str(jar.path))
        return
    assert base_url is not None, "publish requires a URL for the jars of a classic session"
    context = getattr(spark, "sparkContext", spark)
    session = None if context is spark else spark
    for jar in jars:
        url = blob_url(base_url, job=shipped.job, name=jar.name, secret=secret, expires_in=URL_LIFETIME)
        if session is not None and not agent:
            session.sql(f"ADD JAR '{url}'")
        else:
            context._jsc.addJar(url)  # PySpark's SparkContext has no addJar of its own
            if session is not None:
                _load_on_driver(session, jar)
        shipped.jar_urls[jar.name] = url


def _load_on_driver(spark: Any, jar: Source) -> None:
    """The driver's half of ``ADD JAR`` for the local file: the session's jar class loader
    takes it, and becomes the calling thread's context class loader (where Sparks before
    4.3 look for a Java UDF's class)."""
    jvm = spark._jvm
    loader = spark._jsparkSession.sharedState().jarClassLoader()
    loader.addURL(jvm.java.io.File(str(jar.path.resolve())).toURI().toURL())
    jvm.java.lang.Thread.currentThread().setContextClassLoader(loader)
