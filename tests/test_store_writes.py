"""Store writes: a task's new state files go straight into the HA store, the server gets names.

Real parts: ZooKeeper (scripts/zookeeper), ``blobsvc serve --recovery-mode zookeeper`` children
on a directory store (a shared mount, as every host would see it), caches and clients in this
process. The server's own metrics say how many bytes it received; its data directory says
what it kept. ``tests/test_ha_s3.py`` does the same on ``s3://`` (moto), with a task that
cannot reach the store.
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import blake3
import pytest

from benchmarks.harness.zk import HaServer, ZooKeeper, running_zookeeper, started_servers, wait_for_leader
from blobsvc import BlobCache, BlobClient, new_job_id
from blobsvc._exceptions import DigestMismatch, NotFound
from blobsvc.checkpoints import CheckpointStore, FileEntry, TaskHandle
from blobsvc.ha.store import object_path, open_blob_store
from blobsvc.ha.writes import StateChanged, StoreWriter
from blobsvc.wire._checkpoints import pipeline_job, state_name
from blobsvc.wire._protocol import JobBlob

pytestmark = pytest.mark.timeout(180)
MiB = 1 << 20

zookeeper = pytest.fixture(scope="module")(running_zookeeper)
servers = pytest.fixture(started_servers)


@pytest.fixture
def mount(tmp_path: Path) -> Path:
    return tmp_path / "mount"


@pytest.fixture
def leader(zookeeper: ZooKeeper, servers: list[HaServer], mount: Path, tmp_path: Path) -> HaServer:
    cluster = f"writes-{os.getpid()}-{time.monotonic_ns()}"
    server = HaServer(zookeeper.hosts, mount, tmp_path / "data", cluster_id=cluster, extra=("--metrics-port", "0"))
    servers.append(server)
    assert wait_for_leader(f"zk://{zookeeper.hosts}/{cluster}") == server.address
    server.store = mount / cluster  # type: ignore[attr-defined]
    return server


@pytest.fixture
def client(leader: HaServer) -> Iterator[BlobClient]:
    with BlobClient(leader.address, timeout=20.0, connect_timeout=20.0) as made:
        yield made


def received(client: BlobClient) -> float:
    """The body bytes the server has received (PUT), from its own /metrics."""
    with urllib.request.urlopen(f"http://{client.status()['metrics_address']}/metrics", timeout=10) as reply:
        match = re.search(r"^blobsvc_received_bytes_total (\S+)$", reply.read().decode(), re.M)
    assert match, "no blobsvc_received_bytes_total in the server's metrics"
    return float(match.group(1))


def make_state(root: Path, files: int, size: int) -> dict[str, bytes]:
    root.mkdir(parents=True)
    contents = {f"{i:03d}.sst": os.urandom(size) for i in range(files)}
    for name, data in contents.items():
        (root / name).write_bytes(data)
    return contents


def local_objects(data_dir: Path) -> list[Path]:
    return [path for path in (data_dir / "objects").rglob("*") if path.is_file()]


def test_new_state_goes_to_the_store_and_the_server_receives_only_names_and_metadata(
    leader: HaServer, client: BlobClient, tmp_path: Path
) -> None:
    state = make_state(tmp_path / "state", 8, MiB)
    before = received(client)
    with CheckpointStore(client, "pipe", timeout=60) as store:
        with store.begin(["0"]) as pending:
            handle = store.snapshot("0", tmp_path / "state")
            pending.acknowledge("0", handle)
        assert handle.bytes_sent == 8 * MiB
        got = received(client) - before
        assert got < 64 << 10, f"the server received {got} bytes: the state crossed it"
        # Not received, and not copied into the leader's own data directory either.
        assert all(path.stat().st_size < MiB for path in local_objects(leader.data_dir))
        for data in state.values():
            key = blake3.blake3(data).hexdigest()
            assert (leader.store / object_path(key)).read_bytes() == data  # type: ignore[attr-defined]
        # A second checkpoint of the same state sends nothing, to either.
        with store.begin(["0"]) as pending:
            again = store.snapshot("0", tmp_path / "state", stamps=False)
            pending.acknowledge("0", again)
        assert again.bytes_sent == 0
        with BlobCache(leader.address, tmp_path / "cache") as cache:
            restored = CheckpointStore(client, "pipe", cache=cache).restore(pending.id, again, tmp_path / "restored")
            assert cache.stats().bytes_from_store == 8 * MiB
        assert {path.name: path.read_bytes() for path in restored.iterdir()} == state
        # The caches' STATs were answered from the store's records: the leader read no state.
        assert all(path.stat().st_size < MiB for path in local_objects(leader.data_dir))
        # Through the server (no cache): it reads the store, verified, on demand.
        served = store.restore(pending.id, again, tmp_path / "served")
        assert {path.name: path.read_bytes() for path in served.iterdir()} == state


def test_a_completion_checks_each_stored_files_name_and_size_and_refuses_what_is_missing(
    leader: HaServer, client: BlobClient, tmp_path: Path
) -> None:
    data = os.urandom(10_000)
    key = blake3.blake3(data).digest()
    cut_short = leader.store / object_path(key.hex())  # type: ignore[attr-defined]
    cut_short.parent.mkdir(parents=True)
    cut_short.write_bytes(data[:-1])  # what a task's write cut short left (a store without atomic writes)
    assert client.link(key, job=pipeline_job("pipe"), name=state_name(key)).size == 9_999
    never_stored = blake3.blake3(b"never stored").digest()
    with CheckpointStore(client, "pipe", timeout=60) as store:
        pending = store.begin(["0"])
        pending.acknowledge("0", TaskHandle("0", "bytes", (FileEntry("", 10_000, key.hex(), True),)))
        with pytest.raises(DigestMismatch, match="does not hold what its handle says"):
            pending.complete()
        pending = store.begin(["0"])
        pending.acknowledge("0", TaskHandle("0", "bytes", (FileEntry("", 12, never_stored.hex(), True),)))
        with pytest.raises(NotFound, match="is not on the server"):
            pending.complete()
        assert store.list() == []


def test_state_a_checkpoint_no_longer_references_is_never_vouched_for_again(
    leader: HaServer, client: BlobClient, tmp_path: Path
) -> None:
    """The leader remembers the names it recorded (a name linked again costs the store no
    request), and forgets what it discards: a completion naming discarded state is refused."""
    first, second = tmp_path / "first", tmp_path / "second"
    first.write_bytes(os.urandom(50_000))
    second.write_bytes(os.urandom(50_000))
    with CheckpointStore(client, "pipe", retain=1, timeout=60) as store:
        with store.begin(["0"]) as pending:
            old = store.snapshot("0", first)
            pending.acknowledge("0", old)
        with store.begin(["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", second))
        store.records()  # a list waits for the discarding the completion started
        assert not (leader.store / object_path(old.files[0].key)).exists()  # type: ignore[attr-defined]
        pending = store.begin(["0"])
        pending.acknowledge("0", old)
        with pytest.raises(NotFound, match="is not on the server"):
            pending.complete()


def test_bytes_a_task_put_in_the_store_are_verified_by_every_reader(
    leader: HaServer, client: BlobClient, tmp_path: Path
) -> None:
    """The trust model (docs/ha.md): a task that can write to the store can put any bytes
    there; a restore refuses them, from the store and from the server alike, and writes
    nothing at its destination."""
    state = make_state(tmp_path / "state", 1, 100_000)
    key = blake3.blake3(state["000.sst"]).hexdigest()
    with CheckpointStore(client, "pipe", timeout=60) as store:
        with store.begin(["0"]) as pending:
            handle = store.snapshot("0", tmp_path / "state")
            pending.acknowledge("0", handle)
        stored = leader.store / object_path(key)  # type: ignore[attr-defined]
        stored.write_bytes(os.urandom(100_000))  # same size, other bytes
        with BlobCache(leader.address, tmp_path / "cache") as cache:
            with pytest.raises(DigestMismatch):
                CheckpointStore(client, "pipe", cache=cache).restore(pending.id, handle, tmp_path / "restored")
            assert cache.stats().store_refused == 1
        assert not (tmp_path / "restored").exists()


def test_a_link_of_content_only_the_store_holds_names_it_there_and_replaces_an_older_local_blob(
    leader: HaServer, client: BlobClient, tmp_path: Path
) -> None:
    job, old, new = new_job_id(), b"old bytes" * 1000, b"new bytes" * 1000
    client.put(old, job=job, name="model")
    assert client.get(job=job, name="model") == old  # held on the leader's disk
    (tmp_path / "new").write_bytes(new)
    key = blake3.blake3(new).digest()
    with pytest.raises(NotFound):
        client.link(key, job=job, name="model")  # nobody holds it yet
    StoreWriter(str(leader.store)).write(key, tmp_path / "new")  # type: ignore[attr-defined]
    info = client.link(key, job=job, name="model")
    assert (info.size, info.key) == (len(new), key.hex())
    assert not any(path.read_bytes() == new for path in local_objects(leader.data_dir))
    assert client.get(job=job, name="model") == new, "the older local blob of the name is never served"


def test_a_writer_never_leaves_bytes_that_do_not_hash_to_their_key(tmp_path: Path) -> None:
    (tmp_path / "state").write_bytes(b"what was hashed")
    key = blake3.blake3(b"what is there now").digest()  # the file changed after it was hashed
    with pytest.raises(StateChanged, match="changed while it was written"):
        StoreWriter(str(tmp_path / "store")).write(key, tmp_path / "state")
    assert [path for path in (tmp_path / "store").rglob("*") if path.is_file()] == []


def test_a_sweep_removes_only_objects_no_name_holds_that_are_older_than_its_grace(tmp_path: Path) -> None:
    store = open_blob_store(tmp_path / "store")
    writer = StoreWriter(str(tmp_path / "store"))
    files = {}
    for label in ("orphan", "young orphan", "linked"):
        (tmp_path / label).write_bytes(label.encode() * 100)
        files[label] = blake3.blake3(label.encode() * 100).digest()
        writer.write(files[label], tmp_path / label)
    name = JobBlob(bytes.fromhex(new_job_id()), state_name(files["linked"]))
    assert store.adopt(files["linked"], name) == len(b"linked") * 100
    an_hour_ago = time.time() - 3600
    for label in ("orphan", "linked"):
        data = tmp_path / "store" / object_path(files[label].hex())
        os.utime(data, (an_hour_ago, an_hour_ago))
    assert store.sweep(time.time() - 60) == 1
    assert store.size_of(files["orphan"]) is None
    assert store.size_of(files["young orphan"]) == len(b"young orphan") * 100
    assert store.size_of(files["linked"]) == len(b"linked") * 100
    assert not (tmp_path / "store" / object_path(files["orphan"].hex())).parent.exists()


def test_a_writer_leaves_the_temporary_files_of_other_writers_be(tmp_path: Path) -> None:
    """A task holds none of the leader's locks: a temporary file beside the object it writes
    may be the leader's own write in progress."""
    data = b"state" * 1000
    (tmp_path / "state").write_bytes(data)
    key = blake3.blake3(data).digest()
    others = tmp_path / "store" / object_path(key.hex())
    others.parent.mkdir(parents=True)
    (others.parent / ".tmp-the-leaders").write_bytes(b"being written")
    StoreWriter(str(tmp_path / "store")).write(key, tmp_path / "state")
    assert others.read_bytes() == data
    assert (others.parent / ".tmp-the-leaders").read_bytes() == b"being written"


def test_the_leaders_memory_of_names_holds_only_under_its_epoch_and_forgets_a_damaged_copy(tmp_path: Path) -> None:
    store = open_blob_store(tmp_path / "store")
    data = b"state" * 1000
    (tmp_path / "state").write_bytes(data)
    key = blake3.blake3(data).digest()
    StoreWriter(str(tmp_path / "store")).write(key, tmp_path / "state")
    name = JobBlob(bytes.fromhex(new_job_id()), state_name(key))
    assert store.adopt(key, name, epoch=3) == len(data)
    stored = tmp_path / "store" / object_path(key.hex())
    stored.unlink()  # gone behind the leader's back (another leader, a hand in the store)
    assert store.stat_name(name, epoch=3) == (len(data), key), "answered from memory under its epoch"
    assert store.stat_name(name, epoch=4) is None, "under another epoch, the store is asked"
    stored.write_bytes(b"x" * len(data))  # same size, other bytes
    with pytest.raises(DigestMismatch):
        store.fetch(name, lambda chunk: None)  # moved to corrupt/
    assert store.stat_name(name, epoch=3) is None, "a damaged copy's names are forgotten"
