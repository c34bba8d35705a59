"""The HA store on ``s3://`` for real, and caches reading blobs straight from it.

Real parts only: ZooKeeper (scripts/zookeeper), ``blobsvc serve --recovery-mode zookeeper``
children, moto's standalone S3 server (``moto[server]``, the endpoint s3fs's own tests use)
on 127.0.0.1, s3fs reaching it through the standard ``AWS_ENDPOINT_URL`` and ``AWS_*`` keys,
and cache processes. Every process started here is stopped by its PID. The eight-host tests
are the issue's figures: eight cache directories (eight hosts) fill one 64 MiB blob, and the
server's own ``blobsvc_sent_bytes`` says how much of it came from the server.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import blake3
import pytest
import s3fs

from benchmarks.harness.s3 import MotoServer, free_port, s3
from benchmarks.harness.zk import HaServer, ZooKeeper, running_zookeeper, started_servers, wait_for_leader
from blobsvc import BlobCache, BlobClient, InternalError, new_job_id
from blobsvc.checkpoints import CheckpointStore
from blobsvc.files import _stamps
from blobsvc.ha.store import object_path, open_blob_store
from blobsvc.ha.writes import StateChanged, StoreWriter
from blobsvc.wire._protocol import JobBlob

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20
CONTEXT = multiprocessing.get_context("spawn")  # children that share no client, lock or thread

zookeeper = pytest.fixture(scope="module")(running_zookeeper)


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """One S3 endpoint for the module; this process and its children point at it."""
    running = MotoServer().start()
    try:
        with running.export():
            yield running
    finally:
        running.stop()


@pytest.fixture
def bucket(moto: MotoServer, request: pytest.FixtureRequest) -> str:
    """A fresh bucket for the test, as ``s3://<bucket>``."""
    name = "blobsvc-" + re.sub("[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-") + secrets.token_hex(3)
    s3().mkdir(name)
    return f"s3://{name}"


servers = pytest.fixture(started_servers)


def _client(server: str, **options: Any) -> BlobClient:
    return BlobClient(server, **{"timeout": 20.0, "connect_timeout": 20.0, "retries": 4, "backoff": 0.05, **options})


def _serve(
    servers: list[HaServer], zookeeper: ZooKeeper, ha_dir: str | Path, data_dir: Path, cluster: str, **options: Any
) -> HaServer:
    server = HaServer(zookeeper.hosts, ha_dir, data_dir, cluster_id=cluster, **options)
    servers.append(server)
    return server


def _leader(
    servers: list[HaServer], zookeeper: ZooKeeper, ha_dir: str | Path, data_dir: Path, cluster: str, **options: Any
) -> HaServer:
    """The first server of ``cluster``, once it leads."""
    server = _serve(servers, zookeeper, ha_dir, data_dir, cluster, **options)
    assert wait_for_leader(f"zk://{zookeeper.hosts}/{cluster}") == server.address
    return server


def _sent_bytes(server: str, way: str = "sent") -> float:
    """The body bytes a server has sent (GET), or ``received`` (PUT), from its own /metrics."""
    with _client(server) as client:
        address = client.status()["metrics_address"]
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    match = re.search(rf"^blobsvc_{way}_bytes_total (\S+)$", text, re.M)
    assert match, f"no blobsvc_{way}_bytes_total in the server's metrics"
    return float(match.group(1))


def _s3_object(url: str, key: str) -> bytes:
    return bytes(s3().cat_file(f"{url.removeprefix('s3://')}/{object_path(key)}"))


def test_a_put_is_acknowledged_only_once_its_s3_copy_is_complete(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path
) -> None:
    leader = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "put")
    store_url = f"{bucket}/ha/put"
    store = open_blob_store(store_url)
    job = new_job_id()
    with _client(leader.address) as client:
        assert client.status()["store"] == store_url
        for size in (0, 1, 300_000, 9 * MiB):
            data = secrets.token_bytes(size)
            key = client.put(data)
            # Acknowledged: the whole object is in the bucket, with the bytes of its key.
            assert _s3_object(store_url, key) == data
            named = client.put(data, job=job, name=f"part-{size}")
            assert store.key_of(JobBlob(bytes.fromhex(job), f"part-{size}")) == bytes.fromhex(named)


def test_failover_with_the_store_on_s3_serves_every_acknowledged_blob_from_the_new_leader(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/failover-s3"
    first = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "failover-s3")
    _serve(servers, zookeeper, f"{bucket}/ha", tmp_path / "b", "failover-s3")
    job = new_job_id()
    with _client(url) as client:
        blobs = {client.put(data): data for data in (secrets.token_bytes(1000 + 97 * i) for i in range(30))}
        names = {f"lib/{i}.jar": secrets.token_bytes(20_000 + i) for i in range(5)}
        for name, data in names.items():
            client.put(data, job=job, name=name)
        first.kill()
        new = wait_for_leader(url, avoid=first.address)
        assert new != first.address
        for key, data in blobs.items():  # the new leader's disk has none: each comes from S3
            assert bytes(client.get(key)) == data
        for name, data in names.items():
            assert bytes(client.get(job=job, name=name)) == data
        assert sorted(str(info.name) for info in client.list(job)) == sorted(names)


def test_caches_fill_from_s3_and_the_leader_sends_no_body(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path
) -> None:
    leader = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "fill", extra=("--metrics-port", "0"))
    job = new_job_id()
    data = secrets.token_bytes(5 * MiB)
    with _client(leader.address) as client:
        key = client.put(data)
        client.put(b"a small jar", job=job, name="app.jar")
    with BlobCache(leader.address, tmp_path / "cache") as cache:
        assert cache.path(key).read_bytes() == data
        with cache.job(job) as blobs:
            assert blobs.path("app.jar").read_bytes() == b"a small jar"
        stats = cache.stats()
    assert (stats.bytes_from_store, stats.bytes_fetched, stats.store_refused) == (len(data) + 11, 0, 0)
    assert _sent_bytes(leader.address) == 0


def test_a_damaged_object_in_the_bucket_is_never_served_and_is_counted(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/damaged"
    first = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "damaged")
    data = secrets.token_bytes(2 * MiB)
    with _client(url) as client:
        key = client.put(data)
    rotten = bytearray(data)
    rotten[MiB] ^= 0xFF
    s3().pipe_file(f"{bucket.removeprefix('s3://')}/ha/damaged/{object_path(key)}", bytes(rotten))
    # A cache refuses the bucket's copy and gets the leader's own.
    with BlobCache(url, tmp_path / "cache") as cache:
        assert cache.path(key).read_bytes() == data
        stats = cache.stats()
    assert (stats.store_refused, stats.bytes_from_store, stats.bytes_fetched) == (1, 2 * MiB, 2 * MiB)
    # A new leader, whose disk lacks it, refuses it too rather than serve it.
    _serve(servers, zookeeper, f"{bucket}/ha", tmp_path / "b", "damaged")
    first.kill()
    wait_for_leader(url, avoid=first.address)
    with _client(url) as client, pytest.raises(Exception, match="damaged"):
        client.get(key)


def test_with_the_s3_endpoint_down_puts_fail_in_one_line_and_nothing_unstored_is_acknowledged(
    zookeeper: ZooKeeper, servers: list[HaServer], moto: MotoServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = MotoServer().start()  # this test's alone, stopped midway (the module's keys serve for it)
    try:
        s3(endpoint_url=own.endpoint).mkdir("down")
        # One attempt per call (botocore's standard setting): its retries, and s3fs's around
        # them, would stretch each failure to seconds, not change it.
        env = {"AWS_ENDPOINT_URL": own.endpoint, "AWS_MAX_ATTEMPTS": "1"}
        leader = _leader(servers, zookeeper, "s3://down/ha", tmp_path / "a", "down", env=env)
        with _client(leader.address, retries=0, timeout=60) as client:
            stored = client.put(b"stored before the endpoint went")
            own.stop()
            with pytest.raises(InternalError) as failed:
                client.put(b"never acknowledged")
            message = str(failed.value)
            assert "\n" not in message
            assert "s3://down/ha/down could not store" in message and "not acknowledged" in message
            assert "EndpointConnectionError" in str(client.status()["ha_store_error"])  # status says it too
            assert bytes(client.get(stored)) == b"stored before the endpoint went"  # its own disk has it
            # Not on its disk: the leader asks the store, and says in one line that it cannot.
            with pytest.raises(InternalError, match=r"^the HA store s3://down/ha/down could not be read: [^\n]+$"):
                client.stat(blake3.blake3(b"never acknowledged").hexdigest())
        # This process's caches too look for the bucket at the dead endpoint (fsspec keeps
        # one filesystem per set of options, made from the environment as it was then),
        # with botocore's own retries this time: the cache tries the store once.
        monkeypatch.setenv("AWS_ENDPOINT_URL", own.endpoint)
        s3fs.S3FileSystem.clear_instance_cache()
        began = time.monotonic()
        with BlobCache(leader.address, tmp_path / "cache", retries=0, connect_timeout=2) as cache:
            assert cache.path(stored).read_bytes() == b"stored before the endpoint went"
            stats = cache.stats()
        # A refused connection, tried once: far below botocore's five tries with back-off (16 s).
        assert time.monotonic() - began < 5
        assert (stats.store_fallbacks, stats.bytes_fetched) == (1, 31)
    finally:
        own.stop()
        s3fs.S3FileSystem.clear_instance_cache()  # the next test's filesystems see its endpoint


def _serve_fails(zookeeper: ZooKeeper, ha_dir: str, data_dir: Path, *extra: str, **env: str) -> str:
    """``blobsvc serve`` in zookeeper mode that must exit 1 at start: its stderr."""
    command = [
        sys.executable, "-m", "blobsvc", "serve", "--port", "0", "--data-dir", str(data_dir),
        "--recovery-mode", "zookeeper", "--zookeeper", zookeeper.hosts, "--ha-dir", ha_dir,
        "--connect-timeout", "2", "--log-level", "warning", *extra,
    ]  # fmt: skip
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 1 and not done.stdout, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), done.stderr
    return lines[0]


def test_a_missing_bucket_is_an_error_naming_it_unless_the_server_is_asked_to_create_it(
    zookeeper: ZooKeeper, servers: list[HaServer], moto: MotoServer, tmp_path: Path
) -> None:
    bucket = "blobsvc-absent-" + secrets.token_hex(4)
    error = _serve_fails(zookeeper, f"s3://{bucket}/ha", tmp_path / "a")
    assert f"bucket {bucket!r} does not exist" in error and "--ha-create-bucket" in error
    assert not s3().exists(bucket), "nothing was created"
    leader = _leader(servers, zookeeper, f"s3://{bucket}/ha", tmp_path / "b", "made", extra=("--ha-create-bucket",))
    assert s3().exists(bucket)
    with _client(leader.address) as client:
        key = client.put(b"in a bucket made on request")
        assert _s3_object(f"s3://{bucket}/ha/made", key) == b"in a bucket made on request"
        s3().rm(bucket, recursive=True)  # gone while the server runs: no write makes it again
        with pytest.raises(InternalError, match=r"could not store .*not acknowledged"):
            client.put(b"never acknowledged")
    assert not s3().exists(bucket)


def test_a_server_whose_store_cannot_be_reached_exits_at_start_in_one_line(
    zookeeper: ZooKeeper, moto: MotoServer, tmp_path: Path
) -> None:
    with socket.socket() as placeholder:
        placeholder.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        endpoint = f"http://127.0.0.1:{placeholder.getsockname()[1]}"
        error = _serve_fails(zookeeper, "s3://anywhere/ha", tmp_path / "a", AWS_ENDPOINT_URL=endpoint)
    assert "the HA store s3://anywhere/ha/default cannot be reached" in error and endpoint in error


# --- eight hosts -----------------------------------------------------------------------------


def fill(server: str, cache_dir: Path, key: str, barrier: Any, results: Any) -> None:
    """A host's cache process: open its own cache, wait for the others, fetch, report."""
    with BlobCache(server, cache_dir, timeout=60) as cache:
        barrier.wait(60)
        path = cache.path(key)
        stats = cache.stats()
        results.put((str(blake3.blake3(path.read_bytes()).hexdigest()), stats.bytes_from_store, stats.bytes_fetched))


def _eight_hosts_fill(server: str, key: str, tmp_path: Path) -> list[tuple[str, int, int]]:
    barrier, results = CONTEXT.Barrier(8), CONTEXT.Queue()
    hosts = [
        CONTEXT.Process(target=fill, args=(server, tmp_path / f"host-{i}", key, barrier, results)) for i in range(8)
    ]
    for host in hosts:
        host.start()
    try:
        answers = [results.get(timeout=120) for _ in hosts]
    finally:
        for host in hosts:
            host.join(30)
            if host.exitcode is None:
                host.kill()
    assert [host.exitcode for host in hosts] == [0] * 8
    return answers


@pytest.mark.slow
@pytest.mark.parametrize("where", ["s3", "shared-directory"])
def test_eight_hosts_fill_a_64_mib_blob_from_the_store_and_the_server_sends_under_1_mib(
    zookeeper: ZooKeeper, servers: list[HaServer], moto: MotoServer, tmp_path: Path, where: str
) -> None:
    if where == "s3":
        s3().mkdir(bucket := f"eight-{secrets.token_hex(4)}")
        ha_dir: str | Path = f"s3://{bucket}/ha"
    else:
        ha_dir = tmp_path / "mount"  # a shared mount, as every host would see it
    leader = _leader(servers, zookeeper, ha_dir, tmp_path / "data", f"eight-{where}", extra=("--metrics-port", "0"))
    data = os.urandom(64 * MiB)
    with _client(leader.address, timeout=60) as client:
        key = client.put(data)
    del data
    before = _sent_bytes(leader.address)
    answers = _eight_hosts_fill(leader.address, key, tmp_path)
    sent = _sent_bytes(leader.address) - before
    print(f"eight hosts from {where}: server sent {sent:.0f} body bytes; store sent {sum(a[1] for a in answers)}")
    assert {digest for digest, _, _ in answers} == {key}  # every copy verified, the same
    assert [(from_store, from_server) for _, from_store, from_server in answers] == [(64 * MiB, 0)] * 8
    assert sent < MiB
    with _client(leader.address) as client:
        assert client.status()["requests"].get("GET", 0) == 0  # names and sizes only: STATUS, STAT


def test_an_incremental_checkpoint_on_s3_stores_only_what_changed_and_restores_from_the_bucket(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Unchanged state files are neither read (their stamps) nor written into the bucket
    again; a restore through the host's cache reads the bucket, verified, not the leader."""
    monkeypatch.setattr(_stamps, "RACY_SECONDS", 0.2)
    leader = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "ck-s3", extra=("--metrics-port", "0"))
    names = f"{bucket.removeprefix('s3://')}/ha/ck-s3/names"
    state = tmp_path / "state"
    state.mkdir()
    for i in range(4):
        (state / f"{i:06d}.sst").write_bytes(os.urandom(100_000))
    time.sleep(0.3)  # older than the racy window
    with BlobCache(leader.address, tmp_path / "cache") as cache:
        with CheckpointStore(_client(leader.address), "pipe", retain=2, timeout=60, cache=cache) as store:
            with store.begin(["0"]) as pending:
                pending.acknowledge("0", store.snapshot("0", state))
            assert _sent_bytes(leader.address, "received") < 64 << 10, "the state went straight to the bucket"
            records = set(s3().find(names))
            (state / "000001.sst").write_bytes(os.urandom(100_000))
            with store.begin(["0"]) as pending:
                handle = store.snapshot("0", state)
                pending.acknowledge("0", handle)
            assert handle.bytes_sent == 100_000
            after = set(s3().find(names, refresh=True))
            assert records < after and len(after - records) == 2, "one record for the new file, one for the metadata"
            restored = store.restore(pending.id, handle, tmp_path / "restored")
        assert {p.name: p.read_bytes() for p in restored.iterdir()} == {p.name: p.read_bytes() for p in state.iterdir()}
        assert cache.stats().bytes_from_store >= 400_000
    assert _sent_bytes(leader.address) < 400_000, "the state came from the bucket"


def snapshot_unable_to_reach_the_store(server: str, state: Path, endpoint: str, results: Any) -> None:
    """A task whose host cannot reach the store (its endpoint is down for it alone): two
    snapshots, then the levels its fall-backs were logged at."""
    import logging

    os.environ["AWS_ENDPOINT_URL"] = endpoint
    logged: list[int] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.levelno)  # type: ignore[method-assign]
    logging.getLogger("blobsvc.checkpoints").addHandler(handler)
    logging.getLogger("blobsvc.checkpoints").setLevel(logging.INFO)
    with CheckpointStore(_client(server, connect_timeout=2.0), "pipe") as store:
        handles = [store.snapshot(str(task), state, stamps=False).to_json() for task in range(2)]
    results.put((handles, logged))


def test_a_task_that_cannot_write_the_store_sends_its_state_to_the_server_logging_it_once(
    zookeeper: ZooKeeper, servers: list[HaServer], bucket: str, tmp_path: Path
) -> None:
    leader = _leader(servers, zookeeper, f"{bucket}/ha", tmp_path / "a", "fallback", extra=("--metrics-port", "0"))
    state = tmp_path / "state"
    state.mkdir()
    contents = {f"{i}.sst": os.urandom(100_000) for i in range(3)}
    for name, data in contents.items():
        (state / name).write_bytes(data)
    results = CONTEXT.Queue()
    down = f"http://127.0.0.1:{free_port()}"
    task = CONTEXT.Process(target=snapshot_unable_to_reach_the_store, args=(leader.address, state, down, results))
    task.start()
    try:
        handles, logged = results.get(timeout=120)
    finally:
        task.join(30)
        if task.exitcode is None:
            task.kill()
    assert task.exitcode == 0
    assert logged.count(logging.WARNING) == 1 and logging.INFO in logged, "warned once, then told at info"
    assert _sent_bytes(leader.address, "received") >= 300_000, "the state went to the server"
    with CheckpointStore(_client(leader.address), "pipe", timeout=60) as store:
        with store.begin(["0", "1"]) as pending:
            for task_id, handle in enumerate(handles):
                pending.acknowledge(str(task_id), handle)
        restored = store.restore(pending.id, handles[0], tmp_path / "restored")
    assert {p.name: p.read_bytes() for p in restored.iterdir()} == contents


@pytest.mark.parametrize("size", [1 << 20, 40 << 20], ids=["sent-whole", "multipart"])
def test_a_task_never_leaves_bytes_in_the_bucket_that_do_not_hash_to_their_key(
    bucket: str, tmp_path: Path, size: int
) -> None:
    """A file that changed after it was hashed: refused before it is sent (small), or removed
    at once after its multipart upload (large): the bucket holds nothing under the key."""
    (tmp_path / "state").write_bytes(os.urandom(size))
    key = blake3.blake3(b"what the file held when it was hashed").digest()
    with pytest.raises(StateChanged, match="changed while it was written"):
        StoreWriter(f"{bucket}/ha").write(key, tmp_path / "state")
    assert s3().find(bucket.removeprefix("s3://"), refresh=True) == []
