"""The Flink comparison says in one line what it needs when Java or Flink's jars are missing,
and, where both are at hand (``pip install 'blobsvc[flink-bench]'`` and a JDK), runs end to end.

Speed is not asserted: the smoke run only proves the harness compiles against Flink and both
sides answer.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_flink

from .test_bench_smoke import run_quick

EXTRA = "pip install 'blobsvc[flink-bench]'"
OPERATIONS = ("put_memory", "get_memory", "put_file", "get_file")


def test_without_flink_jars_it_names_the_extra_to_install(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_flink.main(["--flink-lib", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert EXTRA in captured.err


def test_without_java_it_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no java, no javac
    monkeypatch.delenv("JAVA_HOME", raising=False)
    assert bench_flink.main([]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_flink: no java on PATH or in $JAVA_HOME/bin;")
    assert err.count("\n") == 1
    assert EXTRA in err


def _flink_at_hand() -> bool:
    try:
        bench_flink.java_tools()
        bench_flink.flink_jars(None)
    except bench_flink.Missing:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _flink_at_hand(), reason=f"needs a JDK and Flink's jars ({EXTRA})")
def test_quick_run_compares_every_operation(tmp_path: Path) -> None:
    records = {r.get("bench", "summary"): r for r in run_quick("benchmarks.bench_flink", "--tmp-dir", str(tmp_path))}
    for op in OPERATIONS:
        assert records[f"ratio_{op}_4KiB"]["ratio"] > 0
        assert records[f"ratio_{op}_8MiB"]["flink_MB_s"] > 0
        assert records[f"ratio_{op}_8MiB"]["ceiling_MB_s"] > 0
        assert records[f"blobsvc_{op}_8MiB"]["server_cpu_s"] >= 0
    for ceiling in ("baseline_sendfile", "baseline_sendfile_new_file", "baseline_write_fsync_kept"):
        assert records[f"{ceiling}_8MiB"]["MB_s"] > 0
    assert set(records["summary"]["targets_met"]) == {f"{op}_8MiB" for op in OPERATIONS}
    assert set(records["summary"]["targets_within_ceiling"]) == {f"{op}_8MiB" for op in OPERATIONS}
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone
