"""High availability against a real ZooKeeper (Debian's jars, started by scripts/zookeeper):
failover after SIGKILL, session expiry, fencing, ZooKeeper restarts and an ensemble losing a
node. Servers are ``blobsvc serve`` children, or in-process when a test needs to reach into
a server's ZooKeeper session (to expire it the way kazoo's test harness does: a second
client opens the same session id and password, then closes it)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import secrets
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from kazoo.client import KazooClient

from benchmarks.harness.zk import HaServer, ZooKeeper, running_zookeeper, started_servers, wait_for_leader
from blobsvc import BlobCache, BlobClient, DigestMismatch, NotFound, NotLeader, Settings, new_job_id
from blobsvc.cli import main
from blobsvc.ha import discovery
from blobsvc.ha.discovery import ZkPaths
from blobsvc.wire._protocol import ContentKey, JobBlob, WholeJob

from .conftest import ServerThread
from .test_cache_faults import FaultyProxy

pytestmark = pytest.mark.timeout(180)


zookeeper = pytest.fixture(scope="module")(running_zookeeper)
servers = pytest.fixture(started_servers)


def _client(server: str, **options: Any) -> BlobClient:
    defaults: dict[str, Any] = {"timeout": 10.0, "connect_timeout": 20.0, "retries": 4, "backoff": 0.05}
    return BlobClient(server, **{**defaults, **options})


def _wait(condition: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout}s")
        time.sleep(0.05)


class _SlowSource(io.BytesIO):
    """An upload that takes its time, so a kill lands while it is in flight."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reads = 0

    def read(self, size: int | None = -1) -> bytes:
        self.reads += 1
        time.sleep(0.05)
        return super().read(size)


def test_failover_serves_every_acknowledged_blob_through_the_new_leader(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/failover"
    ha_dir = tmp_path / "ha"
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "a", cluster_id="failover"))
    first = servers[0]
    assert wait_for_leader(url) == first.address
    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "b", cluster_id="failover"))
    standby = servers[1]

    with _client(url) as client:
        blobs = {client.put(secrets.token_bytes(1000 + i)): None for i in range(90)}
        contents = {key: bytes(client.get(key)) for key in blobs}
        job = new_job_id()
        named = {f"part-{i}": secrets.token_bytes(5000) for i in range(10)}
        for name, data in named.items():
            client.put(data, job=job, name=name)
        victim = client.put(b"this copy will rot in the HA store")
        victim_copy = ha_dir / "failover" / "objects" / victim[:2] / victim / "data"
        victim_copy.write_bytes(b"this copy has rotted in the HA store")

        with _client(standby.address, retries=0) as direct, pytest.raises(NotLeader, match=first.address):
            direct.stat(victim)

        in_flight = _SlowSource(secrets.token_bytes(8 << 20))
        outcome: list[Any] = []

        def upload() -> None:
            with _client(first.address, retries=0) as direct:
                try:
                    outcome.append(direct.put(in_flight))
                except Exception as exc:
                    outcome.append(exc)

        uploader = threading.Thread(target=upload)
        uploader.start()
        _wait(lambda: in_flight.reads >= 3, "the upload started")
        first.kill()
        uploader.join(30)
        assert outcome, "the in-flight upload never returned"

        assert wait_for_leader(url, avoid=first.address) == standby.address
        for key, data in contents.items():
            assert client.get(key) == data  # verified against its digest by the client
        for name, data in named.items():
            assert client.get(job=job, name=name) == data
        assert sorted(info.name or "" for info in client.list(job)) == sorted(named)
        with pytest.raises(DigestMismatch, match="damaged"):
            client.get(victim)

        in_flight_key = blake3_hex(in_flight.getvalue())
        if isinstance(outcome[0], str):
            assert client.get(in_flight_key) == in_flight.getvalue()
        else:
            with contextlib.suppress(NotFound):  # absent, or complete though unacknowledged: never partial
                assert client.get(in_flight_key) == in_flight.getvalue()
        assert client.put(b"written after the failover")

    cli = CliRunner().invoke(main, ["stat", next(iter(contents)), "-s", url])
    assert cli.exit_code == 0, cli.output
    cache = BlobCache(url, tmp_path / "cache")
    try:
        assert cache.path(job, "part-0").read_bytes() == named["part-0"]
    finally:
        cache.close()

    servers.append(HaServer(zookeeper.hosts, ha_dir, tmp_path / "a", cluster_id="failover"))
    with _client(servers[2].address, retries=0) as direct, pytest.raises(NotLeader, match=standby.address):
        direct.stat(victim)


def blake3_hex(data: bytes) -> str:
    import blake3

    return str(blake3.blake3(data).hexdigest())


def _in_process(zookeeper: ZooKeeper, tmp_path: Path, cluster_id: str, *, through: str | None = None) -> ServerThread:
    """A leader in this process; ``through`` a proxy's address in front of ZooKeeper."""
    settings = Settings(
        host="127.0.0.1",
        port="0",
        data_dir=tmp_path / "in-process",
        io_timeout=5.0,
        shutdown_timeout=2.0,
        recovery_mode="zookeeper",
        zookeeper=through or zookeeper.hosts,
        cluster_id=cluster_id,
        ha_dir=str(tmp_path / "ha"),
        zookeeper_session_timeout=1.0,
        http_port="0",
    )
    server = ServerThread(settings).start()
    _wait(lambda: server.server.ha.status()["role"] == "leader", "the in-process server leads")
    return server


def _expire_session(zookeeper: ZooKeeper, server: ServerThread) -> None:
    """kazoo's harness trick: open the server's session from a second client, then close it."""
    session = server.server.ha._client.client_id  # type: ignore[union-attr]
    intruder = KazooClient(hosts=zookeeper.hosts, client_id=session)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


def test_a_leader_whose_session_expires_refuses_puts_before_another_is_elected(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    url = f"zk://{zookeeper.hosts}/expiry"
    leader = _in_process(zookeeper, tmp_path, "expiry")
    try:
        servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "b", cluster_id="expiry"))
        standby = servers[0]
        with _client(leader.address, retries=0) as direct:
            direct.put(b"before the expiry")
            assert direct.get(blake3_hex(b"before the expiry")) == b"before the expiry"  # now in memory
            _expire_session(zookeeper, leader)
            # No other server can have been elected yet unless our session is gone, and with
            # it our ability to confirm the epoch: either way this PUT is refused.
            with pytest.raises(NotLeader):
                direct.put(b"after the expiry")
        assert wait_for_leader(url, avoid=leader.address) == standby.address
        with _client(url) as client:
            assert client.get(client.put(b"through the new leader")) == b"through the new leader"

        def names_standby() -> bool:
            with _client(leader.address, retries=0) as direct:
                try:
                    direct.stat(blake3_hex(b"before the expiry"))
                except NotLeader as exc:
                    return standby.address in str(exc)
            return False

        _wait(names_standby, "the old leader, back with a new session, names the new one")
        with _client(leader.address, retries=0) as direct, pytest.raises(NotLeader, match=standby.address):
            direct.get(blake3_hex(b"before the expiry"))  # a standby serves nothing, not even from memory
        assert leader.server._http_listener is not None
        http_port = leader.server._http_listener.getsockname()[1]
        key = blake3_hex(b"before the expiry")
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{http_port}/blobs/{key}", timeout=10)
        assert refused.value.code == 503 and standby.address in refused.value.read().decode()
    finally:
        leader.stop()


def test_a_leader_that_misses_a_newer_epoch_never_acknowledges(zookeeper: ZooKeeper, tmp_path: Path) -> None:
    """Another leader's epoch bump, as a server whose session has not yet noticed anything
    would miss it: the fencing check refuses the PUT."""
    leader = _in_process(zookeeper, tmp_path, "fencing")
    zk = KazooClient(hosts=zookeeper.hosts)
    zk.start(timeout=10)
    try:
        with _client(leader.address, retries=0) as direct:
            direct.put(b"acknowledged under our epoch")
            status = direct.status()  # STATUS carries the HA fields; ha_blobs is counted now and then
            assert {k: status[k] for k in ("mode", "role", "leader", "leader_changes", "cluster_id")} == {
                "mode": "zookeeper",
                "role": "leader",
                "leader": leader.address,
                "leader_changes": 1,
                "cluster_id": "fencing",
            }
            assert (status["zookeeper"], status["ha_store"]) == (zookeeper.hosts, f"{tmp_path / 'ha'}/fencing")
            assert status["ha_blobs"] in (None, 0, 1)
            zk.set(ZkPaths("fencing").epoch, b"another server")
            with pytest.raises(NotLeader, match="confirm"):
                direct.put(b"never acknowledged")
    finally:
        zk.stop()
        zk.close()
        leader.stop()


def test_a_leader_cut_off_from_zookeeper_is_suspended_and_accepts_no_put(zookeeper: ZooKeeper, tmp_path: Path) -> None:
    """ha/leader.py, SUSPENDED: a leader whose connection to ZooKeeper drops (a real proxy
    in front of ZooKeeper stops relaying and accepting) says "suspended", not "leader", and
    refuses a PUT at once, rather than accept it and fail its fencing later."""
    loop = asyncio.new_event_loop()
    relay = threading.Thread(target=loop.run_forever, daemon=True)
    relay.start()
    host, port = zookeeper.hosts.rsplit(":", 1)
    proxy = FaultyProxy((host, int(port)))
    asyncio.run_coroutine_threadsafe(proxy.start(), loop).result(10)
    leader = _in_process(zookeeper, tmp_path, "suspended", through=proxy.address)
    try:
        with _client(leader.address, retries=0) as direct:
            direct.put(b"while connected")
            asyncio.run_coroutine_threadsafe(proxy.stop(), loop).result(10)
            _wait(lambda: leader.server.ha.status()["role"] != "leader", "the leader notices", timeout=10)
            assert leader.server.ha.status()["role"] == "suspended"
            started = time.monotonic()
            with pytest.raises(NotLeader, match="suspended"):
                direct.put(b"while cut off")
            assert time.monotonic() - started < 2
    finally:
        leader.stop()
        loop.call_soon_threadsafe(loop.stop)
        relay.join(10)
        loop.close()


def test_a_put_is_not_answered_before_its_ha_copy_is_durable(
    zookeeper: ZooKeeper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The HA store's write is held (a fault hook: no real store can be paused on demand)
    while the PUT waits: however long it is held, the PUT has no answer; once the write is
    done, the PUT is answered."""
    leader = _in_process(zookeeper, tmp_path, "copy-first")
    store = leader.server.ha.blobs  # type: ignore[union-attr]
    entered, release = threading.Event(), threading.Event()
    put = store.put

    def held_put(*args: Any, **kwargs: Any) -> None:
        entered.set()
        assert release.wait(30)
        put(*args, **kwargs)

    monkeypatch.setattr(store, "put", held_put)
    answers: list[str | BaseException] = []

    def upload() -> None:
        with _client(leader.address, retries=0) as direct:
            try:
                answers.append(direct.put(b"durable in the HA store first"))
            except BaseException as exc:
                answers.append(exc)

    uploader = threading.Thread(target=upload)
    try:
        uploader.start()
        assert entered.wait(10), "the PUT never reached the HA store"
        time.sleep(0.5)  # the time an answer sent without waiting would take to arrive, many times over
        assert answers == [], "the PUT was answered before its HA copy was written"
        release.set()
        uploader.join(20)
        assert answers == [blake3_hex(b"durable in the HA store first")]
    finally:
        release.set()
        uploader.join(20)
        leader.stop()


def test_a_job_deleted_while_a_put_into_it_is_between_its_two_copies_keeps_both_copies_in_step(
    zookeeper: ZooKeeper, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A PUT is held after its HA copy and before its local one (a fault hook around the HA
    store's write: no real store can be paused on demand) while DELETE JOB arrives. The
    deletion waits for the PUT, so afterwards the name is in neither copy; without the job's
    gate the leader would keep an acknowledged name that the HA store no longer holds."""
    leader = _in_process(zookeeper, tmp_path, "gate")
    store = leader.server.ha.blobs  # type: ignore[union-attr]
    copied, release = threading.Event(), threading.Event()
    put = store.put

    def put_then_hold(*args: Any, **kwargs: Any) -> None:
        put(*args, **kwargs)
        copied.set()
        assert release.wait(30)

    monkeypatch.setattr(store, "put", put_then_hold)
    job = new_job_id()
    answers: list[object] = []

    def call(what: Callable[[BlobClient], object]) -> threading.Thread:
        def run() -> None:
            with _client(leader.address, retries=0) as direct:
                try:
                    answers.append(what(direct))
                except BaseException as exc:
                    answers.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    try:
        uploader = call(lambda c: c.put(b"into a job being deleted", job=job, name="a.jar"))
        assert copied.wait(10), "the PUT never wrote its HA copy"
        deleter = call(lambda c: c.delete_job(job))
        time.sleep(0.5)  # what a deletion that did not wait would need, many times over
        release.set()
        uploader.join(20)
        deleter.join(20)
        assert not any(isinstance(answer, BaseException) for answer in answers), answers
        assert store.names(uuid.UUID(job).bytes) == []
        assert leader.server.storage.list_job(uuid.UUID(job).bytes) == []
    finally:
        release.set()
        leader.stop()


def _keep_busy(url: str, stop: threading.Event, failures: list[BaseException], done: list[int]) -> None:
    """PUT and GET through the leader until told to stop, recording every failed request."""
    with _client(url, retries=8, connect_timeout=30.0) as client:
        while not stop.is_set():
            data = secrets.token_bytes(2000)
            try:
                assert client.get(client.put(data)) == data
                done.append(1)
            except BaseException as exc:
                failures.append(exc)
                return
            time.sleep(0.02)


def _ride_out(url: str, fault: Callable[[], None]) -> None:
    stop, failures, done = threading.Event(), [], []  # type: ignore[var-annotated]
    worker = threading.Thread(target=_keep_busy, args=(url, stop, failures, done))
    worker.start()
    try:
        _wait(lambda: len(done) >= 5, "requests flow")
        fault()
        before = len(done)
        _wait(lambda: len(done) >= before + 5 or bool(failures), "requests flow again", timeout=60)
    finally:
        stop.set()
        worker.join(60)
    assert failures == []


def test_a_zookeeper_restart_is_ridden_out(zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path) -> None:
    url = f"zk://{zookeeper.hosts}/restart"
    servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="restart"))
    wait_for_leader(url)

    def restart() -> None:
        zookeeper.stop()
        zookeeper.restart()

    _ride_out(url, restart)


def test_an_ensemble_losing_its_leading_node_is_ridden_out(servers: list[HaServer], tmp_path: Path) -> None:
    ensemble = ZooKeeper(tmp_path / "ensemble", nodes=3).start()
    try:
        url = f"zk://{ensemble.hosts}/ensemble"
        servers.append(HaServer(ensemble.hosts, tmp_path / "ha", tmp_path / "a", cluster_id="ensemble"))
        servers.append(HaServer(ensemble.hosts, tmp_path / "ha", tmp_path / "b", cluster_id="ensemble"))
        wait_for_leader(url)
        _ride_out(url, lambda: ensemble.stop(ensemble.leader_node()))
    finally:
        discovery._close_clients()
        ensemble.stop()


def test_zookeeper_mode_without_the_ha_extra_names_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(__import__("sys").modules, "kazoo", None)
    result = CliRunner().invoke(
        main,
        [
            *("serve", "--port", "0", "--data-dir", str(tmp_path), "--recovery-mode", "zookeeper"),
            *("--zookeeper", "127.0.0.1:1", "--ha-dir", str(tmp_path / "ha")),
        ],
    )
    assert result.exit_code == 1
    assert "pip install blobsvc[ha]" in result.output
    assert "Traceback" not in result.output


def test_an_unreachable_zookeeper_is_one_line_from_a_client_command(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    (tmp_path / "a").write_bytes(b"a")
    command = [sys.executable, "-m", "blobsvc", "put", str(tmp_path / "a"), "-s", f"zk://127.0.0.1:{port}/prod"]
    done = subprocess.run(
        [*command, "--connect-timeout", "2", "--retries", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("Error: cannot reach ZooKeeper at 127.0.0.1:")
    assert done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize("peer", ["refuses", "says nothing"])
def test_serve_with_an_unreachable_zookeeper_exits_1_within_connect_timeout(peer: str, tmp_path: Path) -> None:
    """A port that refuses, and one that accepts and never answers (a wedged or firewalled
    ZooKeeper): either way `serve` exits 1 with one line naming the address, within
    connect_timeout, even though the session timeout (which bounds each of kazoo's own
    handshakes) is far longer than the subprocess's deadline."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        if peer == "says nothing":
            listener.listen(8)
        port = listener.getsockname()[1]
        command = [
            sys.executable, "-m", "blobsvc", "serve", "--port", "0", "--data-dir", str(tmp_path / "data"),
            "--recovery-mode", "zookeeper", "--zookeeper", f"127.0.0.1:{port}", "--ha-dir", str(tmp_path / "ha"),
            "--connect-timeout", "1", "--zookeeper-session-timeout", "120", "--log-level", "error",
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr == f"Error: cannot reach ZooKeeper at 127.0.0.1:{port} within 1s (connect_timeout)\n"
    assert "listening on" not in done.stdout


def test_serve_with_a_malformed_zookeeper_address_names_it(tmp_path: Path) -> None:
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path), "--recovery-mode", "zookeeper"]
    result = CliRunner().invoke(main, [*args, "--zookeeper", "127.0.0.1:99999", "--ha-dir", str(tmp_path / "ha")])
    assert result.exit_code == 2
    assert "not a ZooKeeper address: '127.0.0.1:99999'" in result.output


def test_zookeeper_mode_without_an_ensemble_is_a_usage_error(tmp_path: Path) -> None:
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path), "--recovery-mode", "zookeeper"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    assert "--zookeeper" in result.output


def test_a_link_on_the_leader_is_durable_in_the_ha_store_and_recovers_content_only_it_holds(
    zookeeper: ZooKeeper, tmp_path: Path
) -> None:
    server = _in_process(zookeeper, tmp_path, "link")
    try:
        job = new_job_id()
        with _client(server.address) as client:
            key = client.put(b"model bytes")
            assert client.link(key, job=job, name="model.bin").size == len(b"model bytes")
        store = server.server.ha.blobs  # type: ignore[union-attr]
        assert store.names(bytes.fromhex(job)) == ["model.bin"]
        assert store.key_of(JobBlob(bytes.fromhex(job), "model.bin")) == bytes.fromhex(key)
        # The local disk loses the content (every local name of it); the HA store still has it.
        server.server.storage.delete(ContentKey(bytes.fromhex(key)))
        server.server.storage.delete(JobBlob(bytes.fromhex(job), "model.bin"))
        with _client(server.address) as client:
            client.link(key, job=job, name="again.bin")
            assert client.get(job=job, name="again.bin") == b"model bytes"
    finally:
        server.stop()


def test_heartbeats_go_to_the_leader_and_a_job_only_the_ha_store_holds_is_not_gone(
    zookeeper: ZooKeeper, servers: list[HaServer], tmp_path: Path
) -> None:
    leader = _in_process(zookeeper, tmp_path, "agents")
    try:
        servers.append(HaServer(zookeeper.hosts, tmp_path / "ha", tmp_path / "standby", cluster_id="agents"))
        report = {"agent": "exec-1:6140"}
        with _client(servers[0].address, retries=0) as direct, pytest.raises(NotLeader, match=leader.address):
            direct.heartbeat(report)
        kept, ended = new_job_id(), new_job_id()
        with _client(f"zk://{zookeeper.hosts}/agents") as client:
            for job in (kept, ended):
                client.put(b"udfs", job=job, name="udfs.jar")
            client.delete_job(ended)
            # The leader's disk loses the job (as a newly elected one may lack it); the HA store has it.
            leader.server.storage.delete(WholeJob(bytes.fromhex(kept)))
            assert client.heartbeat({**report, "jobs": [kept, ended]})["gone_jobs"] == [ended]
            assert [host["agent"] for host in client.hosts()["hosts"]] == ["exec-1:6140"]
    finally:
        leader.stop()
