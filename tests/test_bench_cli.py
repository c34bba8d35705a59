"""``blobsvc bench`` runs end to end with ``--quick``: JSON lines, a table, a plot.

Speed is not asserted: this only proves the command works against a fresh local server.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from blobsvc.cli import main


@pytest.mark.slow
def test_quick_bench_prints_json_lines_a_table_and_a_plot(tmp_path: Path) -> None:
    plot = tmp_path / "bench.png"
    result = CliRunner().invoke(main, ["bench", "--quick", "--tmp-dir", str(tmp_path), "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    records: list[dict[str, Any]] = [json.loads(line) for line in lines]
    benches = {record["bench"] for record in records}
    assert {"setup", "put", "get", "get_file", "baseline_sendfile", "baseline_write_fsync", "fan_out"} <= benches
    assert {"baseline_publish_4KiB"} <= benches
    small_get = next(r for r in records if r["bench"] == "get" and r["size"] == 4096 and r["connections"] == 4)
    assert small_get["ops_s"] > 0 and small_get["p99_ms"] >= small_get["p50_ms"]
    fan_out = next(r for r in records if r["bench"] == "fan_out")
    assert fan_out["ratio"] > 0
    assert "op" in result.stderr and "fan-out" in result.stderr  # the table
    assert plot.stat().st_size > 0
    assert [p.name for p in tmp_path.iterdir()] == ["bench.png"]  # the bench's own files are gone


def test_plot_without_matplotlib_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """matplotlib is installed for the tests, so its absence is simulated."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a)
    )
    result = CliRunner().invoke(main, ["bench", "--quick", "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 1
    assert "pip install 'blobsvc[bench]'" in result.output
