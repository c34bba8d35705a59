"""Cache counters: hits, misses, downloads, bytes fetched and evictions, counted by every
process of the host and read by ``BlobCache.stats()`` and ``blobsvc cache stats``."""

from __future__ import annotations

import json
import multiprocessing
import os
import struct
from pathlib import Path

from click.testing import CliRunner

from blobsvc import BlobClient, new_job_id
from blobsvc.cache import BlobCache, CacheStore
from blobsvc.cache._counters import Counters
from blobsvc.cli import main

from .conftest import ServerThread
from .test_cache_processes import CONTEXT


def counters(stats: object) -> dict[str, int]:
    fields = ("hits", "misses", "downloads", "bytes_fetched", "evictions", "evicted_bytes")
    return {field: getattr(stats, field) for field in fields}


def test_hits_misses_and_evictions_of_one_process(server_thread: ServerThread, tmp_path: Path) -> None:
    with BlobClient(server_thread.address) as client:
        keys = [client.put(os.urandom(1000)) for _ in range(4)]
        job = new_job_id()
        client.put(b"j" * 10, job=job, name="a.jar")
        client.put(b"j" * 10, job=new_job_id(), name="same.jar")
    with BlobCache(server_thread.address, tmp_path, max_bytes=3000) as cache:
        cache.path(keys[0])  # miss
        cache.path(keys[0])  # hit
        cache.path(keys[1])  # miss
        cache.path(keys[2])  # miss: 3000 bytes, at the limit
        with cache.job(job) as blobs:
            blobs.path("a.jar")  # miss: evicts keys[0], the least recently used
            blobs.path("a.jar")  # hit
        cache.path(keys[1])  # hit
        stats = cache.stats()
    assert counters(stats) == {
        "hits": 3,
        "misses": 4,
        "downloads": 4,
        "bytes_fetched": 3010,
        "evictions": 1,
        "evicted_bytes": 1000,
    }
    assert stats.max_bytes == 3000 and stats.blobs == 3 and stats.bytes == 2010


def test_a_job_blob_whose_bytes_are_cached_is_a_hit(server_thread: ServerThread, tmp_path: Path) -> None:
    jobs = [new_job_id(), new_job_id()]
    with BlobClient(server_thread.address) as client:
        for job in jobs:
            client.put(b"the same jar", job=job, name="app.jar")
    with BlobCache(server_thread.address, tmp_path) as cache:
        for job in jobs:
            with cache.job(job) as blobs:
                blobs.path("app.jar")
        stats = cache.stats()
    assert (stats.misses, stats.hits, stats.downloads) == (1, 1, 1)


def fetch_all(address: str, cache_dir: Path, keys: list[str]) -> None:
    with BlobCache(address, cache_dir) as cache:
        for key in keys:
            cache.path(key)


def test_counts_of_every_process_add_up_and_outlive_them(server_thread: ServerThread, tmp_path: Path) -> None:
    with BlobClient(server_thread.address) as client:
        keys = [client.put(os.urandom(100)) for _ in range(3)]
    children = [CONTEXT.Process(target=fetch_all, args=(server_thread.address, tmp_path, keys)) for _ in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
        assert child.exitcode == 0
    before = CacheStore(tmp_path).stats()
    assert before.hits + before.misses == 9 and before.downloads == before.misses == 3
    assert before.bytes_fetched == 300
    assert len(os.listdir(tmp_path / "stats")) > 1  # the last child's file at least: nobody folded it
    with BlobCache(server_thread.address, tmp_path) as cache:  # its first collection folds them
        assert os.listdir(tmp_path / "stats") == ["retired"]
        assert counters(cache.stats()) == counters(before)
        cache.path(keys[0])
        cache.collect()  # a live process's file stays its own
        assert counters(cache.stats())["hits"] == before.hits + 1
        assert len(os.listdir(tmp_path / "stats")) == 2


def test_blobsvc_cache_stats_prints_the_counters_against_the_limit(server_thread: ServerThread, tmp_path: Path) -> None:
    with BlobClient(server_thread.address) as client:
        key = client.put(b"k" * 100)
    with BlobCache(server_thread.address, tmp_path) as cache:
        cache.path(key)
        cache.path(key)
    result = CliRunner().invoke(main, ["cache", "stats", "--dir", str(tmp_path), "--json", "--max-bytes", "1000"])
    assert result.exit_code == 0
    stats = json.loads(result.stdout)
    assert (stats["hits"], stats["misses"], stats["bytes_fetched"], stats["max_bytes"]) == (1, 1, 100, 1000)
    result = CliRunner().invoke(main, ["cache", "stats", "--dir", str(tmp_path), "--max-bytes", "1000"])
    lines = result.stdout.splitlines()
    assert {"hits: 1", "misses: 1", "downloads: 1", "evictions: 0", "used: 10.0% of max bytes"} <= set(lines)


def test_a_fold_cut_short_between_its_two_steps_counts_nothing_twice(tmp_path: Path) -> None:
    """The crash is staged by writing the files a fold leaves behind when it stops after
    writing ``retired`` and before unlinking what it folded."""
    stats = tmp_path / "stats"
    stats.mkdir()
    dead = "999999999-1-1"  # no such process
    (stats / dead).write_bytes(struct.pack("<6Q", 5, 1, 1, 10, 0, 0))
    (stats / "retired").write_text(json.dumps({"totals": {"hits": 5, "misses": 1, "downloads": 1}, "folded": [dead]}))
    counters = Counters(stats)
    assert counters.totals()["hits"] == 5
    counters.fold_dead()
    assert os.listdir(stats) == ["retired"] and counters.totals()["hits"] == 5
    assert json.loads((stats / "retired").read_text())["folded"] == [dead]
    counters.fold_dead()  # the name is forgotten once its file is gone
    assert json.loads((stats / "retired").read_text())["folded"] == []


def test_a_forked_child_counts_in_a_file_of_its_own(tmp_path: Path) -> None:
    counters = Counters(tmp_path)
    counters.add("hits")  # the parent's file is mapped before the fork
    child = multiprocessing.get_context("fork").Process(target=counters.add, args=("hits", 10))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    counters.add("hits")
    assert len(os.listdir(tmp_path)) == 2
    assert counters.totals()["hits"] == 12
