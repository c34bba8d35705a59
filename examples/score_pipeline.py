"""A PySpark pipeline whose UDF uses a shipped model file and a shipped Python module.

Run a blob server, then the pipeline (from the repository's root):

    scripts/serve &                          # blobsvc on 127.0.0.1:6130
    .venv/bin/python examples/score_pipeline.py

It starts Spark on ``local-cluster[2,1,1024]`` (two executor JVMs; set ``SPARK_MASTER`` for
another master), zips ``examples/sentiment`` into a py_file, publishes it with the lexicon
``examples/lexicon.json``, scores a few reviews with a UDF on the executors, and prints them.
The server comes from ``--conf spark.blobsvc.server`` or ``BLOBSVC_SERVER`` (default
127.0.0.1:6130). Run it twice: the second run uploads nothing and downloads nothing.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REVIEWS = [
    "Great tool, I love it",
    "slow and broken",
    "good but slow",
    "I hate waiting",
    "fast, good, great",
    "nothing to say",
]


def zip_package(directory: Path) -> Path:
    """``sentiment.zip`` with the package at its root, as zipimport wants it."""
    archive = shutil.make_archive(str(directory / "sentiment"), "zip", HERE, "sentiment")
    return Path(archive)


def run(spark: Any, workdir: Path) -> list[tuple[str, float]]:
    """Publish the model and the module, score ``REVIEWS`` on the executors."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DoubleType

    from blobsvc.spark import publish

    with publish(spark, files=[HERE / "lexicon.json"], py_files=[zip_package(workdir)]) as shipped:
        # No type hints on a UDF: PySpark would read them as a pandas UDF's. useArrow=False:
        # rows pickled one at a time. PySpark 4 would otherwise run it with Arrow whenever the
        # driver has pyarrow and pandas, and then every executor's Python must have them too
        # (docs/spark.md, "What the environment must hold"); this pipeline needs neither.
        @F.udf(returnType=DoubleType(), useArrow=False)
        def score_review(text):  # type: ignore[no-untyped-def]
            import sentiment  # shipped as sentiment.zip: importable in every task

            return float(sentiment.score(text, shipped.path("lexicon.json")))

        reviews = spark.createDataFrame([(text,) for text in REVIEWS], ["review"]).repartition(4)
        rows = reviews.select("review", score_review("review").alias("score")).collect()
    return sorted(((row.review, row.score) for row in rows), key=lambda pair: -pair[1])


def main() -> None:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(os.environ.get("SPARK_MASTER", "local-cluster[2,1,1024]"))
        .appName("blobsvc-example")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        with tempfile.TemporaryDirectory() as workdir:
            for review, score in run(spark, Path(workdir)):
                print(f"{score:+5.1f}  {review}")
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
