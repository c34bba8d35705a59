"""Checkpoints in recovery mode zookeeper, against a real ZooKeeper and ``blobsvc serve``
children: records written by the fenced leader, failover during completion, an id counter
that never goes back, and a replaced coordinator (a separate process, SIGSTOPped) refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from benchmarks.harness.zk import HaServer, ZooKeeper, running_zookeeper, started_servers, wait_for_leader
from blobsvc import BlobClient
from blobsvc._exceptions import NotFound, NotLeader
from blobsvc.checkpoints import CheckpointStore, Fenced, _snapshot
from blobsvc.files import _stamps
from blobsvc.ha.checkpoints import ZooKeeperCheckpointRecords
from blobsvc.ha.discovery import ZkPaths
from blobsvc.wire._ids import hash_file

from .test_checkpoints_authority import complete, put_metadata, request

pytestmark = pytest.mark.timeout(180)

zookeeper = pytest.fixture(scope="module")(running_zookeeper)
servers = pytest.fixture(started_servers)


def _client(url: str) -> BlobClient:
    return BlobClient(url, timeout=10.0, connect_timeout=20.0, retries=6, backoff=0.1)


@pytest.fixture
def kazoo(zookeeper: ZooKeeper) -> Iterator[KazooClient]:
    client = KazooClient(hosts=zookeeper.hosts, timeout=10)
    client.start(timeout=30)
    yield client
    client.stop()
    client.close()


def test_records_are_written_only_under_the_leaders_epoch_and_fence_a_replaced_writer(
    kazoo: KazooClient,
) -> None:
    paths = ZkPaths("records")
    kazoo.ensure_path(paths.epoch)
    token = kazoo.exists(paths.epoch).version
    current: list[int | None] = [token]
    records = ZooKeeperCheckpointRecords(kazoo, paths, lambda: current[0])
    old = records.register("p")
    first = records.next_id("p")
    record = {"id": first, "timestamp": 1.0, "savepoint": False, "metadata": "0" * 64}
    records.add("p", old, record)
    records.add("p", old, record)  # again: a retried complete is a no-op
    records.add_pending("p", old, 7, 123.5)
    assert records.pending("p") == {7: {"epoch": old, "deadline": 123.5, "savepoint": False}}
    new = records.register("p")
    with pytest.raises(Fenced):
        records.add("p", old, {**record, "id": records.next_id("p")})
    with pytest.raises(Fenced):
        records.add_pending("p", old, 8, 123.5)  # a replaced coordinator triggers nothing
    records.remove_pending("p", [7, 8])  # what is not there is skipped
    assert records.pending("p") == {}
    with pytest.raises(Fenced):
        records.remove("p", old, first)
    kazoo.set(paths.epoch, b"another leader")  # a newer leader's bump
    with pytest.raises(NotLeader):
        records.add("p", new, {**record, "id": 99})
    with pytest.raises(NotLeader):
        records.next_id("p")
    current[0] = token + 1
    assert records.next_id("p") > first + 1  # the counter never goes back
    assert [r["id"] for r in records.records("p")] == [first]


def test_failover_during_completion_leaves_it_completed_or_absent_and_the_ids_going_up(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/ckfail"
    ha_dir = tmp_path / "ha"
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "a", cluster_id="ckfail"))
    first = servers[0]
    assert wait_for_leader(url) == first.address
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "b", cluster_id="ckfail"))
    store = CheckpointStore(_client(url), "pipe", retain=2, timeout=60)
    states = {}
    for batch in range(2):
        with store.begin(tasks=["0"], properties={"batch": batch}) as pending:
            pending.acknowledge("0", store.snapshot("0", b"state %d" % batch))
        states[pending.id] = b"state %d" % batch
    before = max(states)

    outcome: list[object] = []
    pending = store.begin(tasks=["0"], properties={"batch": 2})
    pending.acknowledge("0", store.snapshot("0", b"state 2"))

    def complete() -> None:
        try:
            outcome.append(pending.complete())
        except Exception as exc:
            outcome.append(exc)

    completing = threading.Thread(target=complete)
    completing.start()
    first.kill()  # SIGKILL while the completion is in flight
    completing.join(60)
    assert outcome, "the completion never returned"
    assert wait_for_leader(url, avoid=first.address) == servers[1].address
    completed = {c.id: c for c in store.list()}
    if pending.id in completed:
        states[pending.id] = b"state 2"
    assert set(completed) == set(sorted(states)[-2:]) or set(completed) == set(states)
    for checkpoint_id, checkpoint in completed.items():
        assert checkpoint.restore("0", tmp_path / f"r{checkpoint_id}").read_bytes() == states[checkpoint_id]
    with store.begin(tasks=["0"]) as after:
        after.acknowledge("0", store.snapshot("0", b"after"))
    assert after.id > max(before, pending.id)  # the counter survived the failover
    latest = store.latest()
    assert latest is not None and latest.id == after.id
    store.close()


COORDINATOR = """
import sys, time
from blobsvc import BlobClient
from blobsvc.checkpoints import CheckpointStore, Fenced
store = CheckpointStore(BlobClient(sys.argv[1], timeout=10.0, connect_timeout=20.0), "pipe", timeout=120)
pending = store.begin(tasks=["0"])
pending.acknowledge("0", store.snapshot("0", b"zombie state"))
print("acknowledged", pending.id, flush=True)
time.sleep(1.0)  # SIGSTOPped here
try:
    pending.complete()
except Fenced as exc:
    print("fenced:", exc, flush=True)
    sys.exit(3)
print("completed", flush=True)
"""


def test_a_sigstopped_coordinator_resumed_after_a_newer_one_completed_is_refused(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/ckstop"
    servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="ckstop"))
    wait_for_leader(url)
    zombie = subprocess.Popen(
        [sys.executable, "-c", COORDINATOR, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert zombie.stdout is not None
        line = zombie.stdout.readline()
        assert line.startswith("acknowledged"), line + (zombie.stderr.read() if zombie.stderr else "")
        zombie.send_signal(signal.SIGSTOP)
        with CheckpointStore(_client(url), "pipe") as store:
            with store.begin(tasks=["0"]) as pending:  # the restarted driver takes over at once
                pending.acknowledge("0", store.snapshot("0", b"new state"))
            zombie.send_signal(signal.SIGCONT)
            out, err = zombie.communicate(timeout=60)
            assert zombie.returncode == 3, out + err
            assert "fenced:" in out and "replaced" in out
            time.sleep(0.1)
            assert [c.id for c in store.list()] == [pending.id]
            latest = store.latest()
            assert latest is not None
            assert latest.restore("0", tmp_path / "r").read_bytes() == b"new state"
    finally:
        if zombie.poll() is None:
            zombie.send_signal(signal.SIGCONT)
            zombie.kill()
        zombie.wait(10)


@pytest.mark.parametrize("point", ["before-record", "after-record", "after-subsume"])
def test_a_leader_killed_at_each_point_of_a_completion_hands_it_to_the_next_leader(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path, point: str
) -> None:
    """The leader SIGKILLs itself at ``point`` of its second completion (the fault-injection
    variable: those windows last microseconds); the client's retry goes to the new leader,
    which completes it (again: adding an existing record is a no-op) from the HA store."""
    cluster = f"ckpoint{point.replace('-', '')}"
    url = f"zk://{zookeeper.hosts}/{cluster}"
    ha_dir = tmp_path / "ha"
    env = {"BLOBSVC_CHECKPOINTS_CRASH_AT": f"{point}:2"}
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "a", cluster_id=cluster, env=env))
    assert wait_for_leader(url) == servers[0].address
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "b", cluster_id=cluster))
    with CheckpointStore(_client(url), "pipe", retain=1) as store:
        with store.begin(tasks=["0"]) as first:
            first.acknowledge("0", store.snapshot("0", b"first"))
        with store.begin(tasks=["0"]) as second:  # the leader dies completing it
            second.acknowledge("0", store.snapshot("0", b"second"))
        assert servers[0].process.wait(30) == -signal.SIGKILL
        assert wait_for_leader(url) == servers[1].address
        assert [c.id for c in store.list()] == [second.id]
        latest = store.latest()
        assert latest is not None and latest.restore("0", tmp_path / "r").read_bytes() == b"second"
        with store.begin(tasks=["0"]) as third:
            third.acknowledge("0", store.snapshot("0", b"third"))
        assert third.id > second.id and [c.id for c in store.list()] == [third.id]


def test_an_incremental_checkpoint_reads_sends_and_stores_only_what_changed(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a directory HA store: unchanged files are neither read (their stamps), nor sent, nor
    written into the store again (the leader's own name records stand)."""
    monkeypatch.setattr(_stamps, "RACY_SECONDS", 0.2)
    url = f"zk://{zookeeper.hosts}/ckstamps"
    servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="ckstamps"))
    wait_for_leader(url)
    state = tmp_path / "state"
    state.mkdir()
    files = {f"{i:06d}.sst": os.urandom(50_000) for i in range(4)}
    for name, data in files.items():
        (state / name).write_bytes(data)
    time.sleep(0.3)  # older than the racy window
    read: list[str] = []

    def counted(path: Path) -> bytes:
        read.append(path.name)
        return hash_file(path)

    monkeypatch.setattr(_snapshot, "hash_file", counted)
    with CheckpointStore(_client(url), "pipe", retain=2, timeout=60) as store:
        with store.begin(["0"]) as pending:
            pending.acknowledge("0", store.snapshot("0", state))
        records = {p.relative_to(tmp_path) for p in (tmp_path / "ha").rglob("names/*/*/*")}
        sent = store.client.status()["checkpoints_state_bytes_sent"]
        read.clear()
        (state / "000002.sst").write_bytes(os.urandom(60_000))
        with store.begin(["0"]) as pending:
            handle = store.snapshot("0", state)
            pending.acknowledge("0", handle)
        assert read == ["000002.sst"] and handle.bytes_sent == 60_000
        assert store.client.status()["checkpoints_state_bytes_sent"] - sent == 60_000
        after = {p.relative_to(tmp_path) for p in (tmp_path / "ha").rglob("names/*/*/*")}
        assert records < after and len(after - records) == 2, "one record for the new file, one for the metadata"
        latest = store.latest()
        assert latest is not None and latest.id == pending.id
        restored = latest.restore("0", tmp_path / "restored")
        assert {p.name: p.read_bytes() for p in restored.iterdir()} == {p.name: p.read_bytes() for p in state.iterdir()}


def test_the_leader_decides_each_checkpoints_life_from_its_zookeeper_records(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    """Raw CHECKPOINTS requests to a zookeeper-mode leader: a forged id is refused, completing a
    checkpoint aborts the older pending ones but savepoints (the savepoint flag is in the
    pending node), and a silent coordinator's checkpoint is aborted by the leader's clock."""
    url = f"zk://{zookeeper.hosts}/ckrules"
    servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="ckrules"))
    wait_for_leader(url)
    with _client(url) as client:
        epoch = request(client, "register")["epoch"]
        with pytest.raises(NotFound, match="no pending checkpoint"):
            complete(client, epoch, 1 << 62, put_metadata(client, 1 << 62))
        older = request(client, "trigger", epoch=epoch, timeout=60)["id"]
        savepoint = request(client, "trigger", epoch=epoch, timeout=60, savepoint=True)["id"]
        newer = request(client, "trigger", epoch=epoch, timeout=60)["id"]
        complete(client, epoch, newer, put_metadata(client, newer))
        assert request(client, "list")["pending"] == [savepoint]
        with pytest.raises(NotFound):
            complete(client, epoch, older, put_metadata(client, older))
        request(client, "abort", epoch=epoch, id=savepoint)
        aborted = client.status()["checkpoints_aborted"]
        request(client, "trigger", epoch=epoch, timeout=0.5)  # and its coordinator says no more
        deadline = time.monotonic() + 15
        while client.status()["checkpoints_aborted"] == aborted:
            assert time.monotonic() < deadline, "the leader never aborted the silent checkpoint"
            time.sleep(0.2)


def test_a_one_shot_command_gives_up_once_when_a_cluster_has_no_leader(zookeeper: ZooKeeper) -> None:
    from click.testing import CliRunner

    from blobsvc.cli import main

    url = f"zk://{zookeeper.hosts}/nosuchcluster"
    result = CliRunner().invoke(main, ["checkpoints", "list", "p", "-s", url, "--connect-timeout", "1"])
    assert result.exit_code == 1 and "no leader for cluster 'nosuchcluster'" in result.output
    assert "(server zk://" in result.output and "1 attempt)" in result.output  # not 4 attempts of the timeout each
    assert len(result.output.strip().splitlines()) == 1


def test_the_completed_history_and_retention_survive_a_failover(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/ckhistory"
    ha_dir = tmp_path / "ha"
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "a", cluster_id="ckhistory"))
    assert wait_for_leader(url) == servers[0].address
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "b", cluster_id="ckhistory"))
    store = CheckpointStore(_client(url), "pipe", retain=1, score="loss", score_order="min", timeout=60)
    for loss in (0.5, 0.9):
        with store.begin(tasks=["0"], properties={"loss": loss}) as pending:
            pending.acknowledge("0", store.snapshot("0", b"loss %g" % loss))
    store.keep(pending.id)  # in ZooKeeper too
    before = [entry for entry in store.history() if entry["status"] == "completed"]
    servers[0].kill()
    wait_for_leader(url, avoid=servers[0].address)
    after = store.history()
    assert [(e["id"], e["kind"], e["state_bytes"]) for e in after] == [
        (e["id"], e["kind"], e["state_bytes"]) for e in before
    ]
    assert [e["kind"] for e in after] == ["savepoint", "checkpoint"]
    assert [record.get("savepoint") for record in store.records()] == [False, True]
    store.close()
