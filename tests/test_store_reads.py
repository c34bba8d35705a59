"""Store reads (blobsvc.ha.reads, docs/cache.md 18-21): a cache copies a blob's bytes from the
HA store the server names, verified, and falls back to the server once.

A real BlobServer and a real store on disk (a directory, written by the store's own ``put``,
as a leader writes it). The server is standalone, and a status source names the store as a
zookeeper-mode leader's does (``store``), so each test is quick; tests/test_ha_s3.py runs the
same paths against a real ZooKeeper and an S3 endpoint. Requests are counted on the server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest

from benchmarks.harness.agent import run_agent
from blobsvc import BlobClient, Settings, new_job_id
from blobsvc.cache import BlobCache
from blobsvc.ha.store import FileSystemBlobStore, _LocalFiles, object_path, open_blob_store

from .conftest import ServerThread

MiB = 1 << 20


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
def named(server_thread: ServerThread, store_dir: Path) -> Iterator[list[str]]:
    """The server names ``store_dir`` in STATUS; the list is what it names (change it to move)."""
    where = [str(store_dir)]
    server_thread.server.status_sources.append(lambda: {"store": where[0]})
    yield where


@pytest.fixture
def store(store_dir: Path) -> FileSystemBlobStore:
    return open_blob_store(store_dir)


@pytest.fixture
def uploader(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=10) as client:
        yield client


Put = Callable[..., str]


@pytest.fixture
def put(uploader: BlobClient, store: FileSystemBlobStore, tmp_path: Path) -> Put:
    """Store ``data`` on the server and in the HA store, as a leader acknowledging a PUT has."""

    def put_both(data: bytes, **target: Any) -> str:
        key = uploader.put(data, **target)
        source = tmp_path / "upload"
        source.write_bytes(data)
        store.put(source, bytes.fromhex(key), None)
        return key

    return put_both


def requests(server: ServerThread) -> dict[str, int]:
    return dict(server.server.requests)


def cache_at(server: ServerThread, directory: Path, **options: Any) -> BlobCache:
    return BlobCache(server.address, directory, retries=1, backoff=0.01, timeout=10, **options)


def damage(store_dir: Path, key: str, data: bytes) -> None:
    (store_dir / object_path(key)).write_bytes(data)


def test_a_miss_copies_the_bytes_from_the_store_and_the_server_answers_only_stat(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    data = os.urandom(3 * MiB + 5)
    key = put(data)
    before = requests(server_thread)
    with cache_at(server_thread, tmp_path / "cache") as cache:
        path = cache.path(key)
        assert path.read_bytes() == data
        assert cache.path(key) == path  # a hit: nothing more asked of anyone
        stats = cache.stats()
    after = requests(server_thread)
    assert {op: after[op] - before.get(op, 0) for op in after} == {"PUT": 0, "STATUS": 1, "STAT": 1} | {
        op: 0 for op in after if op not in {"PUT", "STATUS", "STAT"}
    }
    assert (stats.bytes_from_store, stats.bytes_fetched, stats.downloads, stats.store_refused) == (len(data), 0, 1, 0)


def test_a_job_blob_is_named_by_the_server_and_read_from_the_store(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    job = new_job_id()
    key = put(b"the jar's bytes" * 1000, job=job, name="lib/app.jar")
    with cache_at(server_thread, tmp_path / "cache") as cache, cache.job(job) as blobs:
        path = blobs.path("lib/app.jar")
        assert (path.name, path.read_bytes()) == ("app.jar", b"the jar's bytes" * 1000)
        assert cache.stats().bytes_from_store == 15000
    assert requests(server_thread).get("GET", 0) == 0
    assert key == blake3.blake3(b"the jar's bytes" * 1000).hexdigest()


@pytest.mark.parametrize(
    "damaged",
    [
        pytest.param(lambda data: bytes([data[0] ^ 1]) + data[1:], id="one-bit-flipped"),
        pytest.param(lambda data: data[:-1], id="short"),
        pytest.param(lambda data: data + b"x", id="long"),
    ],
)
def test_a_store_copy_that_does_not_verify_is_refused_counted_logged_and_fetched_from_the_server(
    server_thread: ServerThread,
    named: list[str],
    put: Put,
    store_dir: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    damaged: Callable[[bytes], bytes],
) -> None:
    data = os.urandom(2 * MiB)
    key = put(data)
    damage(store_dir, key, damaged(data))
    with caplog.at_level(logging.WARNING, "blobsvc.cache"), cache_at(server_thread, tmp_path / "cache") as cache:
        path = cache.path(key)
        assert path.read_bytes() == data  # the server's bytes, never the store's
        stats = cache.stats()
    assert (stats.store_refused, stats.bytes_fetched, stats.downloads) == (1, len(data), 1)
    assert requests(server_thread)["GET"] == 1
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and key in warning[0] and str(store_dir) in warning[0]


@pytest.mark.parametrize("how", ["missing-object", "not-mounted-here", "no-backend"])
def test_a_store_that_cannot_be_read_falls_back_to_the_server_once_and_is_asked_for_again(
    server_thread: ServerThread,
    named: list[str],
    put: Put,
    store_dir: Path,
    tmp_path: Path,
    how: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    first, second = put(os.urandom(MiB)), put(os.urandom(MiB))
    if how == "missing-object":
        for key in (first, second):
            (store_dir / object_path(key)).unlink()
    else:
        named[0] = str(tmp_path / "not-mounted") if how == "not-mounted-here" else "nosuchfs://bucket/blobs"
    with cache_at(server_thread, tmp_path / "cache") as cache:
        assert blake3.blake3(cache.path(first).read_bytes()).hexdigest() == first
        assert blake3.blake3(cache.path(second).read_bytes()).hexdigest() == second
        stats = cache.stats()
    counts = requests(server_thread)
    assert (counts["GET"], counts["STATUS"]) == (2, 2)  # one GET each; the store asked for anew
    assert (stats.store_fallbacks, stats.bytes_fetched, stats.bytes_from_store) == (2, 2 * MiB, 0)
    # Said once, at warning, with the cause; the second fallback only at info.
    warnings = [r.getMessage() for r in caplog.records if r.name == "blobsvc.cache" and r.levelname == "WARNING"]
    assert len(warnings) == 1, warnings
    cause = {"missing-object": "has no copy of", "not-mounted-here": "not-mounted", "no-backend": "nosuchfs"}[how]
    assert cause in warnings[0] and "fall back to the server" in warnings[0]


def test_a_fallback_is_warned_of_again_after_a_store_read_worked(
    server_thread: ServerThread, named: list[str], put: Put, store_dir: Path, tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    first, read, second, third = (put(os.urandom(1000 + i)) for i in range(4))
    for key in (first, second, third):
        (store_dir / object_path(key)).unlink()
    with cache_at(server_thread, tmp_path / "cache") as cache:
        for key in (first, second, read, third):
            cache.path(key)
        stats = cache.stats()
    assert stats.store_fallbacks == 3
    warned = [r.getMessage() for r in caplog.records if r.name == "blobsvc.cache" and r.levelname == "WARNING"]
    assert [first in warned[0], third in warned[1], len(warned)] == [True, True, 2], warned


def test_the_server_is_asked_for_its_store_once_per_cache(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    keys = [put(os.urandom(1000 + i)) for i in range(3)]
    with cache_at(server_thread, tmp_path / "cache") as cache:
        for key in keys:
            cache.path(key)
    assert requests(server_thread)["STATUS"] == 1
    assert requests(server_thread).get("GET", 0) == 0


def test_store_reads_off_never_asks_for_the_store(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    key = put(os.urandom(MiB))
    settings = Settings.load(environ={"BLOBSVC_STORE_READS": "0"})
    assert settings.store_reads is False
    with cache_at(server_thread, tmp_path / "cache", store_reads=settings.store_reads) as cache:
        cache.path(key)
        stats = cache.stats()
    assert "STATUS" not in requests(server_thread) or requests(server_thread)["STATUS"] == 0
    assert requests(server_thread)["GET"] == 1
    assert (stats.bytes_fetched, stats.bytes_from_store) == (MiB, 0)


def test_a_server_that_names_no_store_is_read_from_as_before(server_thread: ServerThread, tmp_path: Path) -> None:
    with BlobClient(server_thread.address) as client:
        key = client.put(b"standalone bytes")
    with cache_at(server_thread, tmp_path / "cache") as cache:
        assert cache.path(key).read_bytes() == b"standalone bytes"
        assert (cache.stats().bytes_fetched, cache.stats().bytes_from_store) == (16, 0)


def _partial(cache_dir: Path, key: str, size: int) -> Path:
    return cache_dir / "partial" / f"{key}.{size}"


def test_a_store_read_resumes_from_the_bytes_a_dead_downloader_left(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    data = os.urandom(3 * MiB)
    key = put(data)
    BlobCache(server_thread.address, tmp_path / "cache").close()  # lays the directory out
    _partial(tmp_path / "cache", key, len(data)).write_bytes(data[:MiB])
    with cache_at(server_thread, tmp_path / "cache", verify_on_start=False) as cache:
        assert cache.path(key).read_bytes() == data
        stats = cache.stats()
    assert (stats.bytes_from_store, stats.bytes_fetched, stats.store_refused) == (2 * MiB, 0, 0)


def test_bytes_on_disk_that_are_not_the_blobs_start_are_never_kept(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    data = os.urandom(3 * MiB)
    key = put(data)
    BlobCache(server_thread.address, tmp_path / "cache").close()
    _partial(tmp_path / "cache", key, len(data)).write_bytes(os.urandom(MiB))
    with cache_at(server_thread, tmp_path / "cache", verify_on_start=False) as cache:
        assert cache.path(key).read_bytes() == data
        stats = cache.stats()
    # The whole did not verify: nothing of it kept, the server sent all of it from zero.
    assert (stats.store_refused, stats.bytes_fetched) == (1, len(data))


def test_threads_asking_at_once_share_one_store_read(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    data = os.urandom(8 * MiB)
    key = put(data)
    with cache_at(server_thread, tmp_path / "cache") as cache:
        barrier, paths = threading.Barrier(4), []

        def ask() -> None:
            barrier.wait()
            paths.append(cache.path(key))

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        stats = cache.stats()
    assert len(set(paths)) == 1 and len(paths) == 4
    assert (stats.bytes_from_store, stats.downloads, stats.misses, stats.hits) == (len(data), 1, 1, 3)


def test_an_agent_reads_from_the_store_and_its_metrics_count_store_and_server_bytes(
    server_thread: ServerThread, named: list[str], put: Put, store_dir: Path, tmp_path: Path
) -> None:
    good, bad = os.urandom(MiB), os.urandom(MiB)
    good_key, bad_key = put(good), put(bad)
    damage(store_dir, bad_key, bad[::-1])
    with run_agent(server_thread.address, tmp_path / "cache") as agent:
        assert agent.get(f"/blobs/{good_key}") == (200, good)
        assert agent.get(f"/blobs/{bad_key}") == (200, bad)
        counted = {
            name: agent.metric(f"blobsvc_agent_{name}_total")
            for name in ("bytes_from_store", "bytes_fetched", "store_refused")
        }
    assert counted == {"bytes_from_store": 2 * MiB, "bytes_fetched": MiB, "store_refused": 1}
    assert requests(server_thread)["GET"] == 1


def test_an_agent_with_store_reads_off_fetches_from_the_server(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(MiB)
    key = put(data)
    monkeypatch.setenv("BLOBSVC_STORE_READS", "0")
    with run_agent(server_thread.address, tmp_path / "cache") as agent:
        assert agent.get(f"/blobs/{key}") == (200, data)
        assert agent.metric("blobsvc_agent_bytes_from_store_total") == 0
        assert agent.metric("blobsvc_agent_bytes_fetched_total") == MiB


def test_a_store_read_broken_midway_is_finished_by_the_server_after_the_bytes_it_brought(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store that fails after its first chunk (a mock: no real directory breaks mid-read on
    cue). The chunk stays in the partial file, the server sends the rest from there, and the
    whole is verified."""
    data = os.urandom(3 * MiB)
    key = put(data)
    whole = _LocalFiles.chunks

    def breaks_after_one_chunk(self: _LocalFiles, path: str, offset: int = 0) -> Iterator[bytes]:
        chunks = whole(self, path, offset)
        yield next(chunks)
        raise ConnectionResetError("the store went away")

    monkeypatch.setattr(_LocalFiles, "chunks", breaks_after_one_chunk)
    with cache_at(server_thread, tmp_path / "cache") as cache:
        assert cache.path(key).read_bytes() == data
        stats = cache.stats()
    assert (stats.bytes_from_store, stats.bytes_fetched, stats.store_fallbacks) == (MiB, 2 * MiB, 1)


def _path_in_child(cache: BlobCache, key: str, results: Any) -> None:
    results.put(blake3.blake3(cache.path(key).read_bytes()).hexdigest())


def test_a_forked_child_asks_for_the_store_itself_and_reads_from_it(
    server_thread: ServerThread, named: list[str], put: Put, tmp_path: Path
) -> None:
    """fsspec's clients (s3fs's event loop) belong to the process that made them: a child
    forked after the parent opened its reader opens its own."""
    first, second = put(os.urandom(MiB)), put(os.urandom(MiB))
    context = multiprocessing.get_context("fork")
    with cache_at(server_thread, tmp_path / "cache") as cache:
        cache.path(first)
        results = context.Queue()
        child = context.Process(target=_path_in_child, args=(cache, second, results))
        child.start()
        assert results.get(timeout=30) == second
        child.join(30)
        stats = cache.stats()
    assert child.exitcode == 0
    assert requests(server_thread)["STATUS"] == 2 and requests(server_thread).get("GET", 0) == 0
    assert stats.bytes_from_store == 2 * MiB
