"""What the benchmarks and the tests share, real parts all: blobsvc servers and agents as
threads or child processes (``processes``, ``agent``), ZooKeeper and HA servers (``zk``), an
S3 endpoint (``s3``), PySpark on ``local-cluster`` (``spark``). Nothing here imports pytest,
so a benchmark runs with the ``bench`` extra (and the extras of what it measures)."""
