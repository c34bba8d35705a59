"""``blobsvc cache ls | stats | gc``: what they print, what gc removes, how they fail."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from blobsvc import BlobClient, new_job_id
from blobsvc.cache import BlobCache
from blobsvc.cli import main

from .conftest import ServerThread
from .test_cache import MiB, overwrite


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def filled_cache(server: ServerThread, directory: Path) -> tuple[str, str, str]:
    """A cache holding a content blob and a registered job's blob: (key, job key, job)."""
    job = new_job_id()
    with BlobClient(server.address) as client:
        key = client.put(os.urandom(MiB))
        job_key = client.put(b"jar", job=job, name="lib/app.jar")
    cache = BlobCache(server.address, directory)
    cache.path(key)
    cache.register_job(job)
    cache.path(job, "lib/app.jar")
    cache.close()  # releases the job: idle from now on
    return key, job_key, job


def test_ls_lists_blobs_and_jobs(server_thread: ServerThread, tmp_path: Path) -> None:
    key, job_key, job = filled_cache(server_thread, tmp_path)
    code, out, _ = run("cache", "ls", "--dir", str(tmp_path))
    assert code == 0
    lines = out.splitlines()
    assert any(line.startswith(f"blob\t{key}\t{MiB}\t") for line in lines)
    assert any(line.startswith(f"blob\t{job_key}\t3\t") and line.endswith(f"\t-\t{job}") for line in lines)
    assert any(line.startswith(f"job\t{job}\t0\t") and line.endswith("\t1") for line in lines)
    assert f"\tlib/app.jar\t{job_key}" in lines
    code, out, _ = run("cache", "ls", "--json", env={"BLOBSVC_CACHE_DIR": str(tmp_path)})
    assert code == 0
    records = [json.loads(line) for line in out.splitlines()]
    assert {r.get("blob") for r in records} >= {key, job_key}
    assert [r["files"] for r in records if r.get("job") == job] == [[["lib/app.jar", job_key]]]


def test_stats_prints_totals(server_thread: ServerThread, tmp_path: Path) -> None:
    filled_cache(server_thread, tmp_path)
    code, out, _ = run("cache", "stats", "--dir", str(tmp_path), "--json")
    assert code == 0
    stats = json.loads(out)
    assert stats["blobs"] == 2 and stats["bytes"] == MiB + 3 and stats["jobs"] == 1 and stats["references"] == 0
    code, out, _ = run("cache", "stats", "--dir", str(tmp_path))
    assert code == 0 and f"bytes: {MiB + 3}" in out.splitlines()


def test_gc_deletes_expired_jobs_evicts_to_a_size_and_repairs(server_thread: ServerThread, tmp_path: Path) -> None:
    key, job_key, job = filled_cache(server_thread, tmp_path)
    code, out, _ = run("cache", "gc", "--dir", str(tmp_path))
    assert code == 0 and out.startswith("removed 0 jobs, evicted 0 blobs")  # the hour has not passed
    overwrite(tmp_path / "content" / job_key, b"rot", keep_mtime=True)
    code, out, _ = run("cache", "gc", "--dir", str(tmp_path), "--cleanup-interval", "0", "--max-bytes", "1KiB")
    assert code == 0
    assert out.startswith(f"removed 1 jobs, evicted 1 blobs ({MiB} bytes)")
    assert not (tmp_path / "content" / key).exists()  # the least recently used
    code, out, _ = run("cache", "gc", "--dir", str(tmp_path), "--verify")
    assert code == 0 and f"repaired: {tmp_path / 'content' / job_key}: its bytes hash to" in out
    assert not (tmp_path / "jobs" / job).exists() and not list((tmp_path / "content").iterdir())


def test_gc_evicts_only_down_to_a_limit_that_was_set(server_thread: ServerThread, tmp_path: Path) -> None:
    """docs/cache.md: `gc` evicts down to a limit only when one is set (option, environment or
    config file), never down to the settings' default of 10 GiB, whatever limit the executors
    were opened with: on a host whose executors use 64 GiB, a cron'd `blobsvc cache gc` must
    not empty the cache. (The 11 GiB here is one sparse file, standing for the blobs of a
    large cache.)"""
    cache_dir = tmp_path / "cache"
    with BlobClient(server_thread.address) as client:
        key = client.put(os.urandom(MiB))
    with BlobCache(server_thread.address, cache_dir, max_bytes=64 << 30) as cache:
        cache.path(key)
    big = "ab" * 32
    with open(cache_dir / "content" / big, "wb") as file:
        file.truncate(11 << 30)
    (cache_dir / "meta" / big).write_text(json.dumps({"size": 11 << 30, "mtime_ns": 0, "inode": 0, "boot": ""}))
    os.utime(cache_dir / "meta" / key, (1, 1))  # the real blob: least recently used
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BLOBSVC_")}

    def gc(**env: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "blobsvc", "cache", "gc", "--dir", str(cache_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            env={**clean, **env},
        )
        assert result.returncode == 0, result.stderr
        return result.stdout

    out = gc()
    assert "evicted 0 blobs" in out, out
    assert (cache_dir / "content" / key).exists()
    out = gc(BLOBSVC_CACHE_MAX_BYTES="11GiB")  # set, if only in the environment: applied
    assert f"evicted 1 blobs ({MiB} bytes)" in out, out
    assert not (cache_dir / "content" / key).exists()
    config = tmp_path / "blobsvc.toml"
    config.write_text('cache-max-bytes = "1KiB"\n')
    out = gc(BLOBSVC_CONFIG=str(config))  # or in the config file
    assert "evicted 1 blobs" in out, out
    assert not (cache_dir / "content" / big).exists()


def test_cache_commands_refuse_a_directory_that_is_not_a_cache(tmp_path: Path) -> None:
    code, _, err = run("cache", "stats", "--dir", str(tmp_path))
    assert code == 1 and "is not a blob cache" in err
    assert list(tmp_path.iterdir()) == []
    code, _, err = run("cache", "gc", "--dir", str(tmp_path), "--max-bytes", "lots")
    assert code == 2 and "not a size" in err
    code, _, err = run("cache", "ls", env={"XDG_CACHE_HOME": str(tmp_path)})  # the default: $XDG_CACHE_HOME/blobsvc
    assert code == 1 and f"{tmp_path / 'blobsvc'} is not a blob cache" in err
