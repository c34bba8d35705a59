"""``blobsvc bench`` runs end to end with ``--quick``: JSON lines, a table, a plot.

Speed is not asserted: this only proves the command works against a fresh local server.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme
from click.testing import CliRunner

from blobsvc.cli import main

from .conftest import ServerProcess


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
    # One transfer from the server per round, however many processes asked: the goal's
    # condition, counted by the server rather than assumed.
    assert fan_out["server_gets_many"] == fan_out["server_gets_one"] == [1]
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


@pytest.mark.slow
def test_quick_bench_measures_a_server_that_requires_auth_and_tls(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """Every part of the bench (the raw small-request load, the clients, the fan-out's caches
    in their own processes, the clean-up) is let in by --secret-file and --tls-ca."""
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    (tmp_path / "secret").write_text("bench secret\n")
    access = ["--secret-file", str(tmp_path / "secret")]
    server = spawn_server(*access, "--tls-cert", str(tmp_path / "server.pem"), "--max-blob-size", str(64 << 20))
    work = tmp_path / "work"
    work.mkdir()
    result = CliRunner().invoke(
        main,
        [
            "bench",
            "--quick",
            "--server",
            server.address,
            "--tmp-dir",
            str(work),
            *access,
            "--tls-ca",
            str(tmp_path / "ca.pem"),
        ],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert {"put", "get", "get_file", "fan_out"} <= {record["bench"] for record in records}
    assert next(r for r in records if r["bench"] == "get" and r["size"] == 4096)["ops_s"] > 0
    status = CliRunner().invoke(
        main, ["status", "--json", "-s", server.address, *access, "--tls-ca", str(tmp_path / "ca.pem")]
    )
    assert json.loads(status.stdout)["blobs"] == 0  # the bench deleted what it stored


def test_bench_without_the_secret_of_a_server_that_requires_one_says_so(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    (tmp_path / "secret").write_text("bench secret\n")
    server = spawn_server("--secret-file", str(tmp_path / "secret"))
    result = CliRunner().invoke(main, ["bench", "--quick", "--server", server.address, "--tmp-dir", str(tmp_path)])
    assert result.exit_code == 1
    assert f"Error: server {server.address} requires a shared secret" in result.output
    assert "Traceback" not in result.output


def test_server_given_before_the_command_is_the_one_measured(
    spawn_server: Callable[..., ServerProcess], tmp_path: Path
) -> None:
    """``blobsvc -s HOST:PORT bench``, as every client command takes -s: never a silent local server."""
    server = spawn_server()
    cell = ["--size", "4KiB", "--connections", "1"]
    args = ["-s", server.address, "bench", "--quick", "--tmp-dir", str(tmp_path), *cell]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    setup = next(json.loads(line) for line in result.stdout.splitlines() if '"setup"' in line)
    assert setup["server"] == server.address


def test_bench_access_options_go_with_server(tmp_path: Path) -> None:
    (tmp_path / "secret").write_text("s\n")
    result = CliRunner().invoke(main, ["bench", "--quick", "--secret-file", str(tmp_path / "secret")])
    assert result.exit_code == 2
    assert "go with --server" in result.output


def test_the_local_server_ignores_settings_exported_for_other_servers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user with BLOBSVC_SECRET_FILE exported for a cluster still measures a fresh default
    server: the bench's own `serve` must not pick the secret up and then refuse the bench."""
    (tmp_path / "secret").write_text("s\n")
    monkeypatch.setenv("BLOBSVC_SECRET_FILE", str(tmp_path / "secret"))
    args = ["bench", "--quick", "--tmp-dir", str(tmp_path), "--size", "4KiB", "--connections", "1"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output


def test_size_and_connections_measure_only_those_cells(tmp_path: Path) -> None:
    args = ["bench", "--quick", "--tmp-dir", str(tmp_path), "--size", "4KiB", "--connections", "2"]
    result = CliRunner().invoke(main, [*args, "--size", "4096"])  # the same size twice is one cell
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    cells = {(r["bench"], r["size"], r["connections"]) for r in records if "connections" in r}
    assert cells == {("put", 4096, 2), ("get", 4096, 2), ("baseline_publish_4KiB", 4096, 2)}
    assert not any(r["bench"] == "fan_out" for r in records)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--size", "4 bytes"], "Invalid value for '--size': not a size: '4 bytes'"),
        (["--size", "4"], "Invalid value for '--size': '4' is smaller than the smallest blob the bench measures"),
        (["--connections", "0"], "Invalid value for '--connections': 0 is not in the range x>=1"),
        (["--connections", "many"], "Invalid value for '--connections': 'many' is not a valid integer"),
    ],
)
def test_a_bad_size_or_connection_count_is_a_one_line_usage_error(option: list[str], message: str) -> None:
    result = CliRunner().invoke(main, ["bench", *option])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0]


def test_help_names_the_cell_options() -> None:
    result = CliRunner().invoke(main, ["bench", "--help"])
    assert result.exit_code == 0
    assert "--size SIZE" in result.output and "--connections N" in result.output
