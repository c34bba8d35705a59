"""The driver's side of shipping to Spark that needs no PySpark: what :mod:`blobsvc.spark`
and the command line's ``blobsvc spark-conf`` share.

* ``_spark_conf``: the Spark conf that has every host fetch a packed Python environment and
  jars through its agent; ``_conf_defaults``, its defaults, which ``--help`` shows;
* ``_digests``: the driver's memory of file digests, so that an unchanged file is not read;
* ``_contents``: what a packed environment holds, read from its archive's listing before it
  is shipped (no ``bin/python``: refused; no pyarrow: a warning).

May import the client, :mod:`blobsvc.http` (for URLs) and what lies below them (wire, config,
exceptions); never the server, the cache or the Spark integration.
"""
