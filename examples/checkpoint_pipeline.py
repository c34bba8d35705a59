"""A PySpark pipeline with per-partition state over several batches, checkpointed each batch.

Run a blob server, then the pipeline (from the repository's root):

    scripts/serve &                          # blobsvc on 127.0.0.1:6130
    .venv/bin/python examples/checkpoint_pipeline.py --pipeline clicks

Each batch is a Spark job over the batch's events (user, clicks), hash-partitioned by user into
8 partitions. A partition's state is a directory of segment files, one per batch, holding that
batch's clicks per user (immutable once written, like a RocksDB instance's SST files): each
task restores its partition's state from the latest checkpoint, adds the batch's segment and
snapshots the directory; the driver acknowledges the 8 handles and the checkpoint completes.
A segment unchanged since the last checkpoint is linked on the server, not sent again.

Kill the driver at any time (even in the middle of a checkpoint's uploads) and run it again:
it resumes after the latest completed checkpoint and prints the same totals as a run that
was never killed. The server comes from ``--conf spark.blobsvc.server`` or ``BLOBSVC_SERVER``
(default 127.0.0.1:6130), the host cache from ``BLOBSVC_CACHE_DIR``; ``SPARK_MASTER``
overrides ``local-cluster[2,1,1024]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PARTITIONS = 8
USERS = 1000


def events(batch: int) -> list[tuple[int, int]]:
    """The batch's events, (user, clicks): the same for every run, as a replayable source's."""
    rng = random.Random(batch)
    return [(rng.randrange(USERS), rng.randrange(1, 10)) for _ in range(5000)]


def run(spark: Any, pipeline: str, batches: int) -> dict[int, int]:
    """Run batches up to ``batches`` after the latest completed checkpoint; the clicks per user."""
    from blobsvc.spark import checkpoints

    with checkpoints(spark, pipeline, retain=2) as ckpt:
        latest = ckpt.latest()
        first = latest.properties["batch"] + 1 if latest is not None else 0
        print(f"resuming after checkpoint {latest.id} (batch {first - 1})" if latest else "starting afresh")
        for batch in range(first, batches):
            data = spark.sparkContext.parallelize(events(batch)).partitionBy(PARTITIONS)
            step = batch_step(ckpt.tasks(latest, partitions=PARTITIONS), batch)
            with ckpt.begin(PARTITIONS, properties={"batch": batch}) as pending:
                for handle in data.mapPartitionsWithIndex(step).collect():
                    pending.acknowledge(handle.task, handle)
            latest = pending.completed
            assert latest is not None
            sent = sum(handle.bytes_sent for handle in latest.tasks.values())
            print(f"batch {batch}: checkpoint {latest.id} completed, {sent} of {latest.size} bytes of state sent")
        return totals(spark, ckpt.tasks(latest))


def batch_step(tasks: Any, batch: int) -> Callable[[int, Iterator[tuple[int, int]]], Iterator[Any]]:
    """A task of ``batch``: its partition's state restored, the batch's segment added to it, the
    state snapshotted; the task returns its handle."""

    def step(partition: int, rows: Iterator[tuple[int, int]]) -> Iterator[Any]:
        with tempfile.TemporaryDirectory() as workdir:
            state = tasks.restore(partition, Path(workdir, "state")) or Path(workdir, "state")
            state.mkdir(exist_ok=True)
            segment: Counter[int] = Counter()
            for user, clicks in rows:
                segment[user] += clicks
            (state / f"batch-{batch:05d}.json").write_text(json.dumps(sorted(segment.items())))
            yield tasks.snapshot(partition, state)

    return step


def totals(spark: Any, tasks: Any) -> dict[int, int]:
    """The clicks per user in the state ``tasks`` restores from, summed on the executors."""

    def read(partition: int, rows: Iterator[Any]) -> Iterator[tuple[int, int]]:
        with tempfile.TemporaryDirectory() as workdir:
            state = tasks.restore(partition, Path(workdir, "state"))
            for segment in sorted(state.iterdir()) if state else []:
                yield from json.loads(segment.read_text())

    sums = spark.sparkContext.parallelize(range(PARTITIONS), PARTITIONS).mapPartitionsWithIndex(read)
    return dict(sums.reduceByKey(lambda a, b: a + b).collect())


def main() -> None:
    from pyspark.sql import SparkSession

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="clicks", help="the pipeline's name (default clicks)")
    parser.add_argument("--batches", type=int, default=5, help="batches in all (default 5)")
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local-cluster[2,1,1024]"))
        .appName("blobsvc-checkpoint-example")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        result = run(spark, args.pipeline, args.batches)
    finally:
        spark.stop()
    print(f"users: {len(result)}, clicks: {sum(result.values())}")
    print("totals:", json.dumps(sorted(result.items())), flush=True)


if __name__ == "__main__":
    main()
