"""docs/checkpoints.md runs as written: every Python and shell block, in order, twice, against
a fresh server. The Spark recipe's blocks (examples/checkpoint_pipeline.py and the command that
runs it) need PySpark on local-cluster: tests/test_spark_checkpoints.py runs that file, and
tests/test_docs_examples.py checks the page shows it whole."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ServerProcess
from tests.test_docs_examples import ROOT, blocks

PAGE = ROOT / "docs" / "checkpoints.md"
SPARK = "checkpoint_pipeline"  # the Spark recipe's blocks


def runnable() -> list[tuple[str, str]]:
    found = [("python", body) for body in blocks(PAGE, "python")] + [("sh", body) for body in blocks(PAGE, "sh")]
    text = PAGE.read_text()
    found.sort(key=lambda block: text.index(block[1]))
    return [(language, body) for language, body in found if SPARK not in body and "def batch_step(" not in body]


def test_the_page_runs_in_order_twice(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = spawn_server()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("BLOBSVC_SERVER", None)
    assert [language for language, _ in runnable()].count("sh") >= 1 and len(runnable()) >= 5
    outputs = []
    for _ in range(2):
        for language, body in runnable():
            code = body.replace("127.0.0.1:6130", server.address).replace("/tmp/", f"{tmp_path}/")
            command = [sys.executable, "-c", code] if language == "python" else ["bash", "-euo", "pipefail", "-c", code]
            done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path)
            assert done.returncode == 0, f"{body}\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr and "Usage:" not in done.stderr, done.stderr
            outputs.append(done.stdout + done.stderr)
    text = "\n".join(outputs)
    assert "[0.4, 0.5, 0.8] 0.4" in text  # the first run's best two by loss, and the latest
    assert "pipeline no-such-pipeline has no completed checkpoint" in text
    assert "aborted task 0 ran out of memory" in text
