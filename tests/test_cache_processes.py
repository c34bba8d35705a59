"""BlobCache shared by real processes: one download per host, reference counts that survive
SIGKILL, a download taken over from a killed process, a fork that keeps no lock, a download
waiting for the room of one in flight, and a stress run that leaves the directory sound.

Children come from the "forkserver" context (never forked from this process, whose server
runs in a thread) and are killed by PID at teardown if they are still running, as is any
grandchild a child forks.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import queue
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
def grandchildren() -> Iterator[list[int]]:
    """PIDs of processes our children forked; killed by PID at teardown."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def uploader(server_thread: ServerThread) -> Iterator[BlobClient]:
    with BlobClient(server_thread.address, timeout=20) as client:
        yield client


def _partials(cache_dir: Path) -> list[str]:
    try:
        return os.listdir(cache_dir / "partial")
    except FileNotFoundError:
        return []


# --- what the children run -------------------------------------------------------------------


def open_close_many(address: str, cache_dir: Path, key: str, out: Any) -> None:
    """Open a cache, fetch through it, close it; a program that keeps the closed objects."""
    closed = []

    def fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    cache = BlobCache(address, cache_dir, timeout=10)
    cache.path(key)
    cache.close()
    closed.append(cache)
    before = fds()
    for _ in range(10):
        cache = BlobCache(address, cache_dir, timeout=10, verify_on_start=False)
        cache._client.stat(key)  # the client's loop starts on first use, as in any miss
        cache.close()
        closed.append(cache)
    time.sleep(0.2)
    out.put((before, fds()))


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


def download_and_fork(address: str, cache_dir: Path, key: str, out: Any) -> None:
    """A worker whose one thread downloads while another thread forks (multiprocessing's
    "fork" start method, a Pool in a UDF): the forked process lives on, doing other work, and
    never touches the cache."""
    with BlobCache(address, cache_dir, timeout=30, retries=0) as cache:
        thread = threading.Thread(target=cache.path, args=(key,))
        thread.start()
        deadline = time.monotonic() + 20
        while not _partials(cache_dir) and time.monotonic() < deadline:
            time.sleep(0.002)
        pid = os.fork()
        if pid == 0:  # the forked worker: busy with something else for a while
            time.sleep(30)
            os._exit(0)
        out.put(("forked", pid))
        thread.join(30)
        out.put(("downloaded", str(cache.root / "content" / key)))


def path_in_job(address: str, cache_dir: Path, job: str, name: str, out: Any) -> None:
    with BlobCache(address, cache_dir, timeout=10, retries=0) as cache, cache.job(job) as blobs:
        out.put(str(blobs.path(name)))


def fetch_reporting(address: str, cache_dir: Path, key: str, max_bytes: int, out: Any) -> None:
    try:
        with BlobCache(address, cache_dir, max_bytes=max_bytes, timeout=30, retries=0) as cache:
            out.put(("ok", hex_digest(cache.path(key))))
    except Exception as exc:
        out.put(("error", repr(exc)))


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


def test_a_process_forked_during_a_download_does_not_hold_the_key_lock(
    server_thread: ServerThread,
    uploader: BlobClient,
    tmp_path: Path,
    start: Start,
    grandchildren: list[int],
) -> None:
    """docs/cache.md, caveats, "A fork keeps no lock": a child forked while another thread
    holds a key's lock closes its copy of the descriptor, so once the downloading thread of the
    parent releases the lock, another executor asking for the same bytes as a job blob gets
    them at once, not when the forked worker exits."""
    data = os.urandom(4 * MiB)
    key = uploader.put(data)
    job = new_job_id()
    assert uploader.put(data, job=job, name="lib/model.bin") == key
    cache_dir = tmp_path / "cache"
    out = CONTEXT.Queue()
    with running(FaultyProxy(server_thread.server.address, throttle=0.01), server_thread) as proxy:
        start(download_and_fork, proxy.address, cache_dir, key, out)
        kind, pid = out.get(timeout=20)
        assert kind == "forked"
        grandchildren.append(pid)
        kind, path = out.get(timeout=30)
        assert kind == "downloaded" and hex_digest(Path(path)) == key
    answers = CONTEXT.Queue()
    start(path_in_job, server_thread.address, cache_dir, job, "lib/model.bin", answers)
    try:
        found = answers.get(timeout=8)
    except queue.Empty:
        os.kill(pid, signal.SIGKILL)  # the forked worker ends: its inherited descriptor closes
        found = answers.get(timeout=10)
        assert hex_digest(Path(found)) == key
        pytest.fail("a process asking for a cached blob hung until a forked worker, that holds its key lock, died")
    assert hex_digest(Path(found)) == key


def test_a_download_waits_for_the_room_a_download_in_flight_holds(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    """Invariant 9: only blobs in use by registered jobs make a download fail with CacheFull.
    No job is registered here; one process is downloading another blob whose room, with this
    one's, is over the limit: the second download waits for the first to end, then evicts it."""
    limit = 10 * MiB
    first, second = os.urandom(6 * MiB), os.urandom(6 * MiB)
    key_a, key_b = uploader.put(first), uploader.put(second)
    cache_dir = tmp_path / "cache"
    slow, fast = CONTEXT.Queue(), CONTEXT.Queue()
    with running(FaultyProxy(server_thread.server.address, throttle=0.02), server_thread) as proxy:
        start(fetch_reporting, proxy.address, cache_dir, key_a, limit, slow)
        assert wait_until(lambda: any(p.startswith(key_a) for p in _partials(cache_dir)), 20)
        start(fetch_reporting, server_thread.address, cache_dir, key_b, limit, fast)
        second_result = fast.get(timeout=30)
        first_result = slow.get(timeout=30)
    assert first_result == ("ok", key_a)
    assert second_result == ("ok", key_b), second_result


def test_close_frees_the_descriptors_of_the_client(
    server_thread: ServerThread, uploader: BlobClient, tmp_path: Path, start: Start
) -> None:
    """Invariant 11, "a closed cache holds nothing": not even its client's event loop (an
    epoll descriptor and a socket pair), which would otherwise wait for the garbage collector."""
    key = uploader.put(os.urandom(64 << 10))
    out = CONTEXT.Queue()
    start(open_close_many, server_thread.address, tmp_path / "cache", key, out)
    before, after = out.get(timeout=30)
    assert after <= before, f"{after - before} descriptors leaked by 10 closed caches"
