"""BlobCache shared by real processes: one download per host, reference counts that survive
SIGKILL, a download taken over from a killed process, and a stress run that leaves the
directory sound.

Children come from the "forkserver" context (never forked from this process, whose server
runs in a thread) and are killed by PID at teardown if they are still running.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

import pytest

from blobsvc import BlobClient, new_job_id
from blobsvc.cache import BlobCache

from .conftest import ServerThread
from .test_cache import MiB, gets, hex_digest, wait_until
from .test_cache_faults import FaultyProxy, running

CONTEXT: ForkServerContext = multiprocessing.get_context("forkserver")
CONTEXT.set_forkserver_preload(["blobsvc.cache"])

Start = Callable[..., BaseProcess]


@pytest.fixture
def start() -> Iterator[Start]:
    started: list[BaseProcess] = []

    def start_(target: Callable[..., None], *args: Any) -> BaseProcess:
        process = CONTEXT.Process(target=target, args=args, daemon=True)
        process.start()
        started.append(process)
        return process

    yield start_
    for process in started:
        if process.is_alive():
            process.kill()  # SIGKILL to this one PID
        process.join(10)


@pytest.fixture
def uploader(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=20) as client:
        yield client


# --- what the children run -------------------------------------------------------------------


def fetch_at_once(address: str, cache_dir: Path, key: str, barrier: Any, results: Any) -> None:
    with BlobCache(address, cache_dir, timeout=30) as cache:
        barrier.wait(60)
        path = cache.path(key)
        results.put((str(path), hex_digest(path)))


def hold_job(address: str, cache_dir: Path, job: str, name: str, ready: Any, release: Any) -> None:
    with BlobCache(address, cache_dir, timeout=30) as cache:
        cache.register_job(job)
        cache.path(job, name)
        ready.set()
        if release.wait(60):
            cache.release_job(job)


def fetch(address: str, cache_dir: Path, key: str) -> None:
    with BlobCache(address, cache_dir, timeout=30, retries=0) as cache:
        cache.path(key)


def stress(
    address: str, cache_dir: Path, keys: list[str], jobs: dict[str, dict[str, str]], seed: int, results: Any
) -> None:
    """Two threads of random fetches by key and by job; every path must hold its blob."""
    errors: list[str] = []
    with BlobCache(address, cache_dir, max_bytes=STRESS_LIMIT, cleanup_interval=0.2, timeout=30) as cache:

        def work(rng: random.Random) -> None:
            try:
                for _ in range(16):
                    if rng.random() < 0.6:
                        key = rng.choice(keys)
                        path = cache.path(key)
                        try:  # outside a job, a blob may be evicted right after: but never wrong
                            if hex_digest(path) != key:
                                errors.append(f"{path} does not hold {key}")
                        except FileNotFoundError:
                            pass
                    else:
                        job = rng.choice(sorted(jobs))
                        with cache.job(job) as blobs:
                            for name in rng.sample(sorted(jobs[job]), 2):
                                if hex_digest(blobs.path(name)) != jobs[job][name]:
                                    errors.append(f"{job}/{name} does not hold {jobs[job][name]}")
            except Exception as exc:
                errors.append(repr(exc))

        threads = [threading.Thread(target=work, args=(random.Random(seed * 10 + i),)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    results.put(errors)


STRESS_BLOB = 128 << 10
# The 8 blobs jobs use (1 MiB) and 8 downloads in flight (1 MiB) always fit; 32 blobs do not.
STRESS_LIMIT = 18 * STRESS_BLOB


# --- tests -----------------------------------------------------------------------------------


def test_eight_processes_asking_at_once_cause_one_get_and_share_one_path(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    data = os.urandom(64 * MiB)
    key = uploader.put(data)
    del data
    barrier, results = CONTEXT.Barrier(8), CONTEXT.Queue()
    for _ in range(8):
        start(fetch_at_once, server_thread.address, tmp_path / "cache", key, barrier, results)
    answers = [results.get(timeout=60) for _ in range(8)]
    assert len({path for path, _ in answers}) == 1
    assert {digest for _, digest in answers} == {key}
    assert gets(server_thread) == 1


def test_reference_counts_are_shared_between_processes(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    job = new_job_id()
    uploader.put(b"jar bytes", job=job, name="app.jar")
    with BlobCache(server_thread.address, tmp_path / "cache") as cache:
        cache.register_job(job)
        children = []
        for _ in range(2):
            ready, release = CONTEXT.Event(), CONTEXT.Event()
            process = start(hold_job, server_thread.address, tmp_path / "cache", job, "app.jar", ready, release)
            assert ready.wait(30)
            children.append((process, release))
        assert cache.references(job) == 3
        for count, (process, release) in zip((2, 1), children, strict=True):
            release.set()
            process.join(30)
            assert process.exitcode == 0
            assert cache.references(job) == count
        cache.release_job(job)
        assert cache.references(job) == 0
    assert gets(server_thread) == 1


def test_a_holder_killed_with_sigkill_does_not_pin_its_job(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    job = new_job_id()
    uploader.put(b"model", job=job, name="model.bin")
    ready, never = CONTEXT.Event(), CONTEXT.Event()
    holder = start(hold_job, server_thread.address, tmp_path / "cache", job, "model.bin", ready, never)
    assert ready.wait(30)
    with BlobCache(server_thread.address, tmp_path / "cache", cleanup_interval=0.5) as cache:
        assert cache.references(job) == 1
        assert holder.pid is not None
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        assert cache.references(job) == 0
        job_dir = cache.root / "jobs" / job
        cache.collect()  # what any process's janitor does at least once per interval
        assert job_dir.exists()
        assert wait_until(lambda: not job_dir.exists(), timeout=10)
        assert cache.check() == []


def test_a_waiter_resumes_the_download_of_a_process_killed_midway(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    data = os.urandom(16 * MiB)
    key = uploader.put(data)
    directory = tmp_path / "cache"
    with (
        running(FaultyProxy(server_thread.server.address, throttle=0.02), server_thread) as proxy,
        BlobCache(proxy.address, directory, retries=1, backoff=0.01) as cache,
    ):
        downloader = start(fetch, proxy.address, directory, key)
        partial = directory / "partial" / f"{key}.{len(data)}"
        assert wait_until(lambda: partial.exists() and partial.stat().st_size >= 2 * MiB, timeout=20)
        found: list[Path] = []
        waiter = threading.Thread(target=lambda: found.append(cache.path(key)))
        waiter.start()  # blocks on the key's lock, which the downloader holds
        time.sleep(0.2)
        assert not found
        assert downloader.pid is not None
        os.kill(downloader.pid, signal.SIGKILL)
        downloader.join(10)
        held = partial.stat().st_size
        proxy.throttle = 0.0
        waiter.join(30)
        assert found and hex_digest(found[0]) == key
    offsets = proxy.get_offsets(key)
    assert offsets[0] == 0 and offsets[1:] == [held]
    assert gets(server_thread) == 2


def test_processes_and_threads_at_random_leave_a_sound_cache_under_its_limit(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    contents = [os.urandom(STRESS_BLOB) for _ in range(32)]
    keys = [uploader.put(c) for c in contents]
    jobs: dict[str, dict[str, str]] = {}
    for j in range(4):
        job = new_job_id()
        jobs[job] = {}
        for n in range(3):
            i = (j * 3 + n) % 8  # the jobs share 8 blobs between them
            uploader.put(contents[i], job=job, name=f"lib/{n}.jar")
            jobs[job][f"lib/{n}.jar"] = keys[i]
    results = CONTEXT.Queue()
    cache_dir = tmp_path / "cache"
    processes = [start(stress, server_thread.address, cache_dir, keys, jobs, seed, results) for seed in range(4)]
    errors = [results.get(timeout=60) for _ in processes]
    for process in processes:
        process.join(30)
    assert errors == [[]] * 4
    assert gets(server_thread) * STRESS_BLOB > STRESS_LIMIT  # more came than fits: eviction ran
    with BlobCache(server_thread.address, tmp_path / "cache", max_bytes=STRESS_LIMIT) as cache:
        assert cache.check() == []
        stats = cache.store.stats()
        assert stats.bytes <= STRESS_LIMIT and stats.references == 0 and stats.partials == 0
