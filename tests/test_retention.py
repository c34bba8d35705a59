"""Retention (blobsvc.server._retention): content_ttl and max_store_bytes delete unreferenced
content, never what a job names, never within the grace period, least recently read first.

Time is a fake clock handed to the storage (reads, uploads and unlinks are recorded in its
time), so nothing waits minutes; everything else is real: storage on a temporary directory,
servers on 127.0.0.1, ZooKeeper from scripts/zookeeper."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import random
import secrets
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from benchmarks.harness.zk import running_zookeeper
from blobsvc import BlobClient, BlobServer, NotFound, Settings
from blobsvc.ha.coordinator import Standalone, ZooKeeperHA
from blobsvc.server._retention import READ_GRANULARITY, Retention
from blobsvc.storage import BlobStorage
from blobsvc.wire._protocol import ContentKey, JobBlob, WholeJob

from .conftest import ServerThread, put_streamed, read_blob

GRACE = 600.0
TTL = 3600.0


class FakeClock:
    """Wall time that moves only when told. It starts days ahead of the real clock, so that
    the kernel's own atime updates (relatime: real time, and only over an atime older than
    the ctime) never reach the atimes written in its time, and runs repeat exactly."""

    def __init__(self) -> None:
        self.now = time.time() + 10 * 86400

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> Iterator[BlobStorage]:
    storage = BlobStorage(tmp_path / "data", clock=clock)
    storage.recover()
    yield storage
    storage.close()


def _retention(storage: BlobStorage, **options: Any) -> Retention:
    return Retention(storage, Standalone(), grace=GRACE, **options)


def _sweep(retention: Retention) -> list[bytes]:
    return [candidate.key for candidate in asyncio.run(retention.sweep())]


def _put_small(storage: BlobStorage, data: bytes, target: JobBlob | None = None) -> bytes:
    """Publish ``data`` as a small PUT is: held in memory, made durable by the journal."""
    with storage.stage(len(data)) as upload:
        upload.write(data)
        return storage.publish(upload, target, blake3.blake3(data).digest())


def _exists(storage: BlobStorage, key: bytes) -> bool:
    try:
        read_blob(storage, ContentKey(key))
    except NotFound:
        return False
    return True


JOB = bytes.fromhex("11" * 16)


def test_ttl_deletes_content_nobody_named_or_read_and_keeps_the_rest(store: BlobStorage, clock: FakeClock) -> None:
    unread = put_streamed(store, b"u" * 1000)
    read = _put_small(store, b"r" * 1000)
    named = put_streamed(store, b"n" * 1000)
    store.link(named, JobBlob(JOB, "lib.jar"))
    clock.advance(3000)
    read_blob(store, ContentKey(read))
    clock.advance(1000)

    retention = _retention(store, content_ttl=TTL)
    assert _sweep(retention) == [unread]
    assert not _exists(store, unread)
    assert read_blob(store, ContentKey(read)) == b"r" * 1000
    assert read_blob(store, JobBlob(JOB, "lib.jar")) == b"n" * 1000
    assert read_blob(store, ContentKey(named)) == b"n" * 1000
    assert retention.status()["retention"]["deleted"] == {"ttl": 1, "limit": 0}
    assert retention.status()["retention"]["deleted_bytes"] == {"ttl": 1000, "limit": 0}
    assert store.usage() == (2, 2000)


def test_limit_deletes_the_least_recently_read_first_until_under_it(store: BlobStorage, clock: FakeClock) -> None:
    first, second, third = (put_streamed(store, bytes([i]) * 1000) for i in range(3))
    named = put_streamed(store, b"n" * 1000)  # read least recently of all, but a job names it
    store.link(named, JobBlob(JOB, "model.bin"))
    for key in (third, first, second):  # read in this order, each a granularity apart
        clock.advance(READ_GRANULARITY * 2)
        read_blob(store, ContentKey(key))
    clock.advance(GRACE + READ_GRANULARITY)

    retention = _retention(store, max_store_bytes=3500)
    deleted = asyncio.run(retention.sweep())
    assert [(c.key, c.reason) for c in deleted] == [(third, "limit")]
    retention.max_store_bytes = 1000
    assert _sweep(retention) == [first, second]
    assert store.usage() == (1, 1000)
    assert read_blob(store, JobBlob(JOB, "model.bin")) == b"n" * 1000
    assert _sweep(retention) == []  # over the limit, but all that is left a job names


def test_ttl_and_limit_together_count_expired_content_towards_the_limit(store: BlobStorage, clock: FakeClock) -> None:
    old = put_streamed(store, b"o" * 1000)
    clock.advance(TTL)
    newer = put_streamed(store, b"w" * 1000)
    newest = put_streamed(store, b"x" * 1000)
    clock.advance(GRACE + READ_GRANULARITY)
    read_blob(store, ContentKey(newest))
    clock.advance(GRACE + READ_GRANULARITY)
    deleted = asyncio.run(_retention(store, content_ttl=TTL, max_store_bytes=1500).sweep())
    assert [(c.key, c.reason) for c in deleted] == [(old, "ttl"), (newer, "limit")]
    assert _exists(store, newest)


def test_content_is_kept_for_the_grace_period_after_its_upload(store: BlobStorage, clock: FakeClock) -> None:
    key = put_streamed(store, b"just uploaded, its LINK is on the way")
    retention = _retention(store, content_ttl=1.0, max_store_bytes=1)
    clock.advance(GRACE + READ_GRANULARITY - 1)  # its last use may be a granularity late
    assert _sweep(retention) == []
    clock.advance(2)
    assert _sweep(retention) == [key]


def test_uploading_stored_content_again_restarts_its_grace(store: BlobStorage, clock: FakeClock) -> None:
    key = put_streamed(store, b"uploaded twice")
    clock.advance(TTL)
    assert _put_small(store, b"uploaded twice") == key
    assert _sweep(_retention(store, content_ttl=1.0)) == []


def test_content_left_by_its_last_job_name_is_kept_for_the_grace_period(store: BlobStorage, clock: FakeClock) -> None:
    key = put_streamed(store, b"shared by two jobs")
    other = bytes.fromhex("22" * 16)
    store.link(key, JobBlob(JOB, "a"))
    store.link(key, JobBlob(other, "b"))
    retention = _retention(store, content_ttl=1.0)
    clock.advance(TTL * 24)
    assert _sweep(retention) == []
    store.delete(WholeJob(JOB))
    store.delete(JobBlob(other, "b"))
    clock.advance(GRACE + READ_GRANULARITY - 1)  # its last use may be a granularity late
    assert _sweep(retention) == []
    clock.advance(2)
    assert _sweep(retention) == [key]


def test_a_hot_read_served_from_memory_counts_as_a_read(store: BlobStorage, clock: FakeClock) -> None:
    key = _put_small(store, b"hot" * 100)
    target = ContentKey(key)
    generation = store.hot.generation
    with store.open_blob(target) as blob:
        store.remember_hot(target, generation, blob, os.pread(blob.fd, blob.size, 0))
    clock.advance(TTL)
    assert store.hot.get(target) is not None  # a GET answered from memory, no open
    clock.advance(GRACE)
    assert _sweep(_retention(store, content_ttl=TTL)) == []
    clock.advance(TTL)
    assert _sweep(_retention(store, content_ttl=TTL)) == [key]
    assert store.hot.get(target) is None


def test_reads_survive_a_restart(tmp_path: Path, clock: FakeClock) -> None:
    """The last read is in the inode, so a new storage on the same directory sees it."""
    storage = BlobStorage(tmp_path / "data", clock=clock)
    storage.recover()
    kept, expired = put_streamed(storage, b"k" * 100), put_streamed(storage, b"e" * 100)
    clock.advance(TTL)
    read_blob(storage, ContentKey(kept))
    storage.close()
    clock.advance(GRACE + READ_GRANULARITY)
    again = BlobStorage(tmp_path / "data", clock=clock)
    again.recover()
    try:
        assert _sweep(_retention(again, content_ttl=TTL)) == [expired]
    finally:
        again.close()


def test_a_deletion_keeps_content_read_after_it_was_chosen(store: BlobStorage, clock: FakeClock) -> None:
    key = put_streamed(store, b"chosen, then read")
    clock.advance(TTL * 2)
    retention = _retention(store, content_ttl=TTL)
    (chosen,) = retention.plan()
    read_blob(store, ContentKey(key))
    assert store.evict(key, chosen.unchanged) is None
    assert _exists(store, key)


def test_an_eviction_never_deletes_content_a_job_names_whatever_it_is_told(store: BlobStorage) -> None:
    """The check under the key's lock, on its own: even told the content is unchanged."""
    key = put_streamed(store, b"named since it was chosen")
    store.link(key, JobBlob(JOB, "lib.jar"))
    assert store.evict(key, lambda info: True) is None
    assert read_blob(store, ContentKey(key)) == read_blob(store, JobBlob(JOB, "lib.jar"))
    store.delete(WholeJob(JOB))
    assert store.evict(key, lambda info: True) == len(b"named since it was chosen")
    assert store.usage() == (0, 0)


def _race(
    store: BlobStorage, key: bytes, target: JobBlob, still: Callable[[os.stat_result], bool]
) -> tuple[bool, int | None]:
    """LINK ``key`` as ``target`` in one thread while another evicts it; either may start a
    little later. Whether LINK found the content, and what the eviction returned."""
    start = threading.Barrier(2)
    delays = random.choice([(0.0, random.random() / 500), (random.random() / 500, 0.0)])
    linked: list[bool] = []
    evicted: list[int | None] = []

    def link() -> None:
        start.wait()
        time.sleep(delays[0])
        try:
            store.link(key, target)
            linked.append(True)
        except NotFound:
            linked.append(False)

    def evict() -> None:
        start.wait()
        time.sleep(delays[1])
        evicted.append(store.evict(key, still))

    threads = [threading.Thread(target=link), threading.Thread(target=evict)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    return linked[0], evicted[0]


def test_a_link_racing_an_eviction_either_links_or_finds_nothing(store: BlobStorage, clock: FakeClock) -> None:
    """Two threads, many rounds: LINK either wins (its name reads right, the content stays)
    or gets NOT_FOUND (no name, nothing dangling); never both a link and a deletion."""
    retention = _retention(store, content_ttl=TTL)
    outcomes = {"linked": 0, "evicted": 0}
    for round_ in range(150):
        data = secrets.token_bytes(200)
        key = put_streamed(store, data)
        clock.advance(TTL + GRACE)
        (chosen,) = retention.plan()
        target = JobBlob(JOB, f"n{round_}")
        linked, evicted = _race(store, key, target, chosen.unchanged)
        assert linked != (evicted is not None), (linked, evicted)
        if linked:
            outcomes["linked"] += 1
            assert read_blob(store, target) == data
            assert read_blob(store, ContentKey(key)) == data
            store.delete(WholeJob(JOB))
        else:
            outcomes["evicted"] += 1
            assert not _exists(store, key)
            with pytest.raises(NotFound):
                read_blob(store, target)
            assert target.name not in {entry.name for entry in store.list_job(JOB)}
        store.delete(ContentKey(key))
    assert store.usage() == (0, 0)
    assert outcomes["evicted"] > 0 and outcomes["linked"] > 0, outcomes


def test_a_get_in_progress_finishes_after_its_blob_is_deleted(tmp_path: Path, clock: FakeClock) -> None:
    """A GET that has begun keeps its descriptor: deleting the blob under it changes
    nothing it sends (no retry: a resumed read would find it gone)."""
    settings = Settings(host="127.0.0.1", port="0", data_dir=tmp_path / "data", io_timeout=10.0, content_ttl=TTL)
    running = ServerThread(settings)
    running.server = BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock))
    running.start()
    try:
        data = secrets.token_bytes(32 << 20)
        paused, resume = threading.Event(), threading.Event()

        class SlowSink(io.BytesIO):
            def write(self, chunk: Any) -> int:
                if not paused.is_set():
                    paused.set()
                    resume.wait(20)
                return super().write(chunk)

        with BlobClient(running.address, retries=0, timeout=20) as client:
            key = client.put(data)
            sink = SlowSink()
            reading = threading.Thread(target=lambda: client.get_into(sink, key))
            reading.start()
            assert paused.wait(20)
            clock.advance(TTL + GRACE + READ_GRANULARITY)  # the GET's own read long past
            sweep = asyncio.run_coroutine_threadsafe(running.server.retention.sweep(), running.loop)
            assert [c.key.hex() for c in sweep.result(20)] == [key]
            resume.set()
            reading.join(30)
            assert sink.getvalue() == data
        with BlobClient(running.address, retries=0) as client, pytest.raises(NotFound):
            client.get(key)
    finally:
        resume.set()
        running.stop()


async def test_a_server_logs_counts_and_reports_each_deletion(
    tmp_path: Path, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("prometheus_client")
    from prometheus_client import generate_latest

    settings = Settings(
        host="127.0.0.1", port="0", data_dir=tmp_path / "data", metrics_port="0", content_ttl=TTL, max_store_bytes=10
    )
    async with BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock)) as server:
        key = put_streamed(server.storage, b"x" * 500)
        clock.advance(TTL + GRACE)
        with caplog.at_level(logging.INFO, logger="blobsvc.retention"):
            await server.retention.sweep()
        assert [r.getMessage() for r in caplog.records if r.name == "blobsvc.retention"] == [
            f"retention deleted {key.hex()}, 500 bytes (ttl)"
        ]
        status = server.status()["retention"]
        assert status["deleted"] == {"ttl": 1, "limit": 0}
        assert status["deleted_bytes"] == {"ttl": 500, "limit": 0}
        assert status["content_ttl"] == TTL and status["max_store_bytes"] == 10 and status["sweeps"] == 1
        assert server.metrics is not None
        scraped = generate_latest(server.metrics.registry).decode()
        assert 'blobsvc_retention_deleted_total{reason="ttl"} 1.0' in scraped
        assert 'blobsvc_retention_deleted_bytes_total{reason="ttl"} 500.0' in scraped
        assert 'blobsvc_retention_deleted_total{reason="limit"} 0.0' in scraped


async def test_a_server_without_retention_settings_never_sweeps(tmp_path: Path, clock: FakeClock) -> None:
    settings = Settings(host="127.0.0.1", port="0", data_dir=tmp_path / "data")
    async with BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock)) as server:
        assert not server.retention.enabled and server._sweeping is None
        assert server.status()["retention"]["content_ttl"] is None


# --- never what a job names: random operations -----------------------------------------------

PAYLOADS = [bytes([i]) * size for i, size in enumerate((300, 500, 700, 900, 1100))]
JOBS = [bytes([i]) * 16 for i in range(1, 4)]
NAMES = ["a", "b", "lib/c.jar"]
DELETIONS = {"ttl": 0, "limit": 0}  # what the sweeps of the random runs deleted, by reason


class NeverWhatAJobNames(RuleBasedStateMachine):
    """PUT content, PUT under a job's name, LINK, DELETE a name or a job or content, GET,
    the clock moving, and sweeps with both content_ttl and max_store_bytes on. After every
    step: each job name still reads its bytes, and no content used (stored, read, or left
    by its last name) less than the grace period ago is gone, unless a client deleted it."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="retention-")
        self.clock = FakeClock()
        self.storage = BlobStorage(self.directory, clock=self.clock)
        self.storage.recover()
        self.retention = Retention(self.storage, Standalone(), content_ttl=2 * GRACE, max_store_bytes=2000, grace=GRACE)
        self.names: dict[JobBlob, bytes] = {}  # what each job name must read
        self.contents: dict[bytes, float] = {}  # content name -> when it was last used
        self.key_of = {blake3.blake3(data).digest(): data for data in PAYLOADS}

    def teardown(self) -> None:
        self.storage.close()
        shutil.rmtree(self.directory, ignore_errors=True)

    def _used(self, key: bytes) -> None:
        if key in self.contents:
            self.contents[key] = self.clock.now

    def _unnamed(self, data: bytes | None) -> None:
        if data is not None:
            self._used(blake3.blake3(data).digest())

    @rule(payload=st.integers(0, len(PAYLOADS) - 1), small=st.booleans())
    def put_content(self, payload: int, small: bool) -> None:
        data = PAYLOADS[payload]
        key = (_put_small if small else put_streamed)(self.storage, data)
        self.contents[key] = self.clock.now

    @rule(job=st.sampled_from(JOBS), name=st.sampled_from(NAMES), payload=st.integers(0, len(PAYLOADS) - 1))
    def put_job(self, job: bytes, name: str, payload: int) -> None:
        data = PAYLOADS[payload]
        target = JobBlob(job, name)
        put_streamed(self.storage, data, target)
        self._unnamed(self.names.get(target))
        self.names[target] = data

    @rule(job=st.sampled_from(JOBS), name=st.sampled_from(NAMES), payload=st.integers(0, len(PAYLOADS) - 1))
    def link(self, job: bytes, name: str, payload: int) -> None:
        data = PAYLOADS[payload]
        target = JobBlob(job, name)
        key = blake3.blake3(data).digest()
        try:
            self.storage.link(key, target)
        except NotFound:
            assert key not in self.contents, "content the model still has was not found"
            return
        self._unnamed(self.names.get(target))
        self.names[target] = data

    @rule(job=st.sampled_from(JOBS), name=st.sampled_from(NAMES))
    def delete_name(self, job: bytes, name: str) -> None:
        target = JobBlob(job, name)
        self.storage.delete(target)
        self._unnamed(self.names.pop(target, None))

    @rule(job=st.sampled_from(JOBS))
    def delete_job(self, job: bytes) -> None:
        self.storage.delete(WholeJob(job))
        for target in [t for t in self.names if t.job == job]:
            self._unnamed(self.names.pop(target))

    @rule(payload=st.integers(0, len(PAYLOADS) - 1))
    def delete_content(self, payload: int) -> None:
        data = PAYLOADS[payload]
        key = blake3.blake3(data).digest()
        self.storage.delete(ContentKey(key))
        self.contents.pop(key, None)

    @rule(payload=st.integers(0, len(PAYLOADS) - 1))
    def get_content(self, payload: int) -> None:
        data = PAYLOADS[payload]
        key = blake3.blake3(data).digest()
        try:
            assert read_blob(self.storage, ContentKey(key)) == data
        except NotFound:
            assert key not in self.contents
            return
        self._used(key)

    @precondition(lambda self: bool(self.names))
    @rule(data=st.data())
    def get_name(self, data: st.DataObject) -> None:
        target = data.draw(st.sampled_from(sorted(self.names, key=repr)))
        assert read_blob(self.storage, target) == self.names[target]

    @rule(seconds=st.sampled_from([1.0, READ_GRANULARITY - 1, READ_GRANULARITY + 1, GRACE / 2, GRACE, TTL]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self.sweep()  # as the server's own sweeps follow the clock

    @rule()
    def sweep(self) -> None:
        named = {blake3.blake3(data).digest() for data in self.names.values()}
        for candidate in asyncio.run(self.retention.sweep()):
            DELETIONS[candidate.reason] += 1
            assert candidate.key not in named, "deleted content a job names"
            used = self.contents.pop(candidate.key)
            assert self.clock.now - used >= GRACE, "deleted content within its grace period"

    # The invariants look at the files themselves: a read through storage would count as one.

    @invariant()
    def every_name_reads_its_bytes(self) -> None:
        for target, data in self.names.items():
            assert self.storage.layout.job_blob(target.job, target.name).read_bytes() == data

    @invariant()
    def content_in_its_grace_period_is_there(self) -> None:
        for key, used in self.contents.items():
            if self.clock.now - used < GRACE:
                assert self.storage.layout.content(key).read_bytes() == self.key_of[key]


def test_never_what_a_job_names() -> None:
    """The random runs, then a check that they deleted content for both reasons: a rule no
    sweep ever tested would pass for nothing. Derandomized, so that every run draws the same
    operations (the same that delete for both reasons), and a failure is met again on rerun."""
    DELETIONS.update(ttl=0, limit=0)
    run_state_machine_as_test(
        NeverWhatAJobNames,
        settings=settings(
            max_examples=80,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    assert DELETIONS["ttl"] > 0 and DELETIONS["limit"] > 0, DELETIONS


# --- recovery mode zookeeper -----------------------------------------------------------------


zookeeper = pytest.fixture(scope="module")(running_zookeeper)


async def _ha_server(zookeeper: Any, tmp_path: Path, name: str, clock: FakeClock) -> BlobServer:
    settings = Settings(
        host="127.0.0.1",
        port="0",
        data_dir=tmp_path / name,
        recovery_mode="zookeeper",
        zookeeper=zookeeper.hosts,
        ha_dir=str(tmp_path / "ha"),
        cluster_id="retention",
        zookeeper_session_timeout=4.0,
        content_ttl=TTL,
    )
    server = BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock))
    await server.start()
    return server


async def _until(condition: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(what)


@pytest.mark.timeout(180)
async def test_in_zookeeper_mode_only_the_leader_deletes_and_the_ha_copy_goes_with_it(
    zookeeper: Any, tmp_path: Path, clock: FakeClock
) -> None:
    from blobsvc import AsyncBlobClient

    leader = await _ha_server(zookeeper, tmp_path, "a", clock)
    try:
        await _until(lambda: leader.ha.status()["role"] == "leader", "the first server leads")
        standby = await _ha_server(zookeeper, tmp_path, "b", clock)
        try:
            await _until(lambda: standby.ha.status()["role"] == "standby", "the second server stands by")
            async with AsyncBlobClient(f"127.0.0.1:{leader.address[1]}", retries=0, timeout=20) as client:
                expired = bytes.fromhex(await client.put(b"e" * 1000))
                reread = bytes.fromhex(await client.put(b"r" * 1000))
                named = bytes.fromhex(await client.put(b"n" * 1000))
                await client.link(named.hex(), job=JOB.hex(), name="lib.jar")
            on_standby = put_streamed(standby.storage, b"s" * 1000)  # its own disk's content
            ha_root = tmp_path / "ha" / "retention" / "objects"

            def in_ha(key: bytes) -> bool:
                return (ha_root / key.hex()[:2] / key.hex() / "content").exists()

            clock.advance(TTL + GRACE + READ_GRANULARITY)
            assert await standby.retention.sweep() == []
            assert standby.retention.status()["retention"]["sweeps"] == 0  # not even planned
            assert _exists(standby.storage, on_standby)

            # Read after it was chosen: the local check keeps it and puts its HA name back.
            (candidate,) = [c for c in await asyncio.to_thread(leader.retention.plan) if c.key == reread]
            read_blob(leader.storage, ContentKey(reread))
            assert not await leader.retention._delete(candidate)
            assert in_ha(reread) and _exists(leader.storage, reread)

            assert [c.key for c in await leader.retention.sweep()] == [expired]
            assert not _exists(leader.storage, expired)
            assert not in_ha(expired)
            assert not (ha_root / expired.hex()[:2] / expired.hex()).exists()  # its bytes too: no ref left
            assert in_ha(named) and _exists(leader.storage, named)
            async with AsyncBlobClient(f"127.0.0.1:{leader.address[1]}", retries=0, timeout=20) as client:
                assert bytes(await client.get(job=JOB.hex(), name="lib.jar")) == b"n" * 1000
                with pytest.raises(NotFound):
                    await client.get(expired.hex())  # not fetched back from the HA store
        finally:
            await standby.shutdown()
    finally:
        await leader.shutdown()


def test_retention_settings_are_off_by_default_and_take_off_sizes_and_seconds() -> None:
    defaults = Settings()
    assert (defaults.content_ttl, defaults.max_store_bytes) == (None, None)
    assert (defaults.retention_grace, defaults.retention_interval) == (600.0, 300.0)
    loaded = Settings.load({"content_ttl": "86400", "max_store_bytes": "50GiB"}, environ={})
    assert (loaded.content_ttl, loaded.max_store_bytes) == (86400.0, 50 << 30)
    assert Settings.load({"content_ttl": "off", "max_store_bytes": "0"}, environ={}).max_store_bytes is None
    assert Settings.default_text("content_ttl") == "off"
    with pytest.raises(ValueError, match="content_ttl"):
        Settings.load({"content_ttl": "-5"}, environ={})


def test_serve_takes_the_retention_options() -> None:
    from click.testing import CliRunner

    from blobsvc.cli import main

    result = CliRunner().invoke(main, ["serve", "--help"])
    for option in ("--content-ttl", "--max-store-bytes", "--retention-grace", "--retention-interval"):
        assert option in result.output
    bad = CliRunner().invoke(main, ["serve", "--max-store-bytes", "lots"])
    assert bad.exit_code == 2 and "--max-store-bytes" in bad.output


@pytest.mark.timeout(180)
async def test_a_leader_that_loses_its_session_mid_sweep_deletes_nothing_more(
    zookeeper: Any, tmp_path: Path, clock: FakeClock
) -> None:
    """The session is expired for real (kazoo's harness trick: a second client opens it,
    then closes it) between the sweep's plan and its deletions: none of them happens, on
    the local disk or in the HA store, and the sweep stops."""
    from kazoo.client import KazooClient

    from blobsvc import AsyncBlobClient

    leader = await _ha_server(zookeeper, tmp_path, "a", clock)
    try:
        await _until(lambda: leader.ha.status()["role"] == "leader", "the server leads")
        async with AsyncBlobClient(f"127.0.0.1:{leader.address[1]}", retries=0, timeout=20) as client:
            keys = [bytes.fromhex(await client.put(bytes([i]) * 100)) for i in range(40)]
        clock.advance(TTL + GRACE + READ_GRANULARITY)
        planned = leader.retention.plan

        def plan_then_lose_the_session() -> list[Any]:
            chosen = planned()
            assert isinstance(leader.ha, ZooKeeperHA)
            intruder = KazooClient(hosts=zookeeper.hosts, client_id=leader.ha._client.client_id)
            intruder.start(timeout=10)
            intruder.stop()
            intruder.close()
            deadline = time.monotonic() + 20
            while leader.ha.status()["role"] == "leader" and time.monotonic() < deadline:
                time.sleep(0.02)
            return chosen

        leader.retention.plan = plan_then_lose_the_session  # type: ignore[method-assign]
        assert await leader.retention.sweep() == []
        ha_root = tmp_path / "ha" / "retention" / "objects"
        for key in keys:
            assert _exists(leader.storage, key)
            assert (ha_root / key.hex()[:2] / key.hex() / "content").exists()
    finally:
        await leader.shutdown()


async def test_a_server_sweeps_every_interval_and_soon_after_passing_its_limit(
    tmp_path: Path, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings(host="127.0.0.1", port="0", data_dir=tmp_path / "a", content_ttl=TTL, retention_interval=0.2)
    async with BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock)) as server:
        key = put_streamed(server.storage, b"t" * 100)
        clock.advance(TTL + GRACE + READ_GRANULARITY)
        # Looked for without reading it: a read would count.
        await _until(lambda: not server.storage.layout.content(key).exists(), "a sweep on its interval")

    monkeypatch.setattr("blobsvc.server._retention.LIMIT_CHECK", 0.2)
    settings = replace(settings, data_dir=tmp_path / "b", content_ttl=None, max_store_bytes=150, retention_interval=1e6)
    async with BlobServer(settings, storage=BlobStorage(settings.data_dir, clock=clock)) as server:
        old = put_streamed(server.storage, b"o" * 100)
        clock.advance(GRACE + READ_GRANULARITY)
        await _until(lambda: server.retention.sweeps == 1, "the sweep soon after the start")
        await asyncio.sleep(0.5)
        assert server.retention.sweeps == 1  # under the limit: nothing more until the interval
        assert server.storage.layout.content(old).exists()
        put_streamed(server.storage, b"n" * 100)
        await _until(lambda: server.retention.deleted["limit"] == 1, "a sweep soon after passing the limit")
        assert not server.storage.layout.content(old).exists()
        put_streamed(server.storage, b"m" * 100)  # over again, but all of it in its grace period
        await _until(lambda: server.retention.sweeps == 3, "a sweep soon after passing the limit again")
        await asyncio.sleep(0.5)
        assert server.retention.sweeps == 3  # it could not help: no sweep again until the interval


def test_a_clock_gone_backwards_never_writes_a_use_older(store: BlobStorage, clock: FakeClock) -> None:
    key = put_streamed(store, b"read while the clock is behind")
    stored = os.stat(store.layout.object(key)).st_atime_ns
    clock.advance(-86400)
    read_blob(store, ContentKey(key))
    assert os.stat(store.layout.object(key)).st_atime_ns == stored
    clock.advance(86400 + GRACE)
    assert _sweep(_retention(store, content_ttl=TTL)) == []


def test_an_upload_under_way_when_its_content_is_deleted_stores_it_anew(store: BlobStorage, clock: FakeClock) -> None:
    data = b"uploaded again while retention deletes it"
    key = put_streamed(store, data)
    clock.advance(TTL + GRACE)
    (chosen,) = _retention(store, content_ttl=TTL).plan()
    with store.stage() as upload:
        upload.write(data)
        assert store.evict(key, chosen.unchanged) == len(data)
        assert store.publish(upload, None, key) == key
    assert read_blob(store, ContentKey(key)) == data
    assert store.usage() == (1, len(data))
