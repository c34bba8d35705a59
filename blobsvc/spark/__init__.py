"""blobsvc for PySpark: ship files, Python modules, archives and jars to every executor, and
checkpoint each partition's state (``checkpoints``: see ``_checkpoints`` and docs/checkpoints.md).

```python
from blobsvc.spark import publish

with publish(spark, files=["model.bin"], py_files=["udfs.zip"], archives=["env.tar.gz#env"]) as shipped:
    def score(rows):
        import udfs                       # py_files are importable in tasks
        model = shipped.path("model.bin")  # a verified, read-only local file
        ...
    df.rdd.mapPartitions(score).collect()
```

The modules, one job each:

* ``_publish``: the driver uploads a job's artifacts, sending only bytes the server lacks;
* ``_jars``: how jars reach the JVMs (each host's agent, the server's HTTP face, or a Spark
  Connect session's artifacts) and the driver's class loader;
* ``_handle``: :class:`Shipped`, the picklable handle tasks resolve paths through;
* ``_local``: resolution through the host's BlobCache, and who holds a job's lease when;
* ``_artifacts``: what is shipped, under which name;
* ``_environment``: a packed Python environment for the Python workers, through each host's agent;
* ``_master``: the master a SparkContext about to start will run on, set or not;
* ``_checkpoints``: a pipeline's checkpoints taken by its tasks, acknowledged by the driver.

May import the cache, :mod:`blobsvc.checkpoints`, :mod:`blobsvc.driver`, the client,
:mod:`blobsvc.http` and what lies below them; never the server, the agent or the benchmark.
"""

try:
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - the test extra installs pyspark
    raise ImportError("blobsvc.spark needs PySpark: pip install blobsvc[spark]") from exc

from ..cache._archives import UnsafeArchive
from ._checkpoints import SparkCheckpoints, TaskCheckpoints, checkpoints
from ._environment import environment
from ._handle import NotOwner, Shipped, UnknownArtifact
from ._publish import CONF_KEYS, HTTP_URL_KEY, publish

__all__ = [
    "CONF_KEYS",
    "HTTP_URL_KEY",
    "NotOwner",
    "Shipped",
    "SparkCheckpoints",
    "TaskCheckpoints",
    "UnknownArtifact",
    "UnsafeArchive",
    "checkpoints",
    "environment",
    "publish",
]
