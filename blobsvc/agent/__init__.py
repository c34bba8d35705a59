"""``blobsvc agent``: one per executor host, the host's BlobCache behind a loopback HTTP face.

What an executor JVM fetches by URL before any Python runs (``spark.jars``, ``spark.archives``
such as a packed Python environment) bypasses Python's BlobCache; pointed at the agent, it
comes through the host cache too: downloaded once per host, verified, shared by every
executor of every application, and released when its job ends.

The face serves what the server's HTTP face serves, at the same paths and under the same
signed-URL rule (:mod:`blobsvc.http`): ``GET``/``HEAD`` of ``/blobs/<key>[/<file name>]`` and
``/jobs/<job>/<name>``, with Range and ETag, the body sent with ``sendfile`` from the local
copy; and ``/metrics``. It also unpacks packed Python environments once per host:
``/python/<key>/<archive>/<launcher>`` answers a launcher script of the host's tree
(:mod:`._python`), which ``blobsvc.spark.environment`` puts in ``spark.files``. Its rules:

* **Nothing unverified is served.** Every answer is a file the BlobCache has just returned,
  complete and checked against its key; its size is known before the header goes out, so a
  200 is never followed by a short body.
* **One download per blob per host.** Requests for one blob share one fetch in the agent, and
  the cache's key locks make it one across every process that opens the cache directory.
* **A job's files stay while the job exists on the server.** A ``/jobs/...`` request makes the
  agent hold a reference on the job; it is dropped when the server's answer to a heartbeat
  says the job is gone, and the files go one ``cleanup_interval`` later unless another
  process still holds the job; shared content stays under the cache's LRU rule.
* **The server knows which hosts hold what.** Heartbeats report the agent's host, version,
  cache bytes and limit, counts and jobs; ``blobsvc status --hosts`` lists them.
* **It fails closed.** Its first heartbeat goes out before it listens: when the server
  requires a secret the agent lacks (or refuses the agent's), it does not start, and a later
  heartbeat so refused stops it, since it would otherwise serve unsigned what the host's
  secret holders cached.
* **A request it cannot satisfy gets a clear status:** 404 for what the server does not have,
  502 naming the server when it cannot be reached or fails, 507 when the cache cannot hold the
  blob, 400 and 403 as on the server.

Modules: ``_source`` (blobs out of the cache for the face: one flight per blob, job references,
failures as statuses; environments unpacked), ``_python`` (the launcher route's paths and
script), ``_heartbeat`` (reports to the server, releases of gone jobs) and
``_agent`` (:class:`Agent`: listener, connections, metrics, shutdown).

May import the cache, the client, :mod:`blobsvc.http`, storage's :class:`OpenBlob`, the wire,
config and exceptions; never the server, the Spark integration or the benchmark.
"""

from ._agent import Agent

__all__ = ["Agent"]
