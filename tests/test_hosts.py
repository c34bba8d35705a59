"""Executor hosts' agents: HEARTBEAT against live servers, the registry's rules on a fake
clock, and ``blobsvc status --hosts``."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from blobsvc import AsyncBlobClient, AuthRequired, BadRequest, BlobClient, BlobServer, Settings, new_job_id
from blobsvc.cli import main
from blobsvc.server.hosts import COUNTERS, FORGET_AFTER, MAX_HOSTS, HostRegistry, HostReport
from blobsvc.wire._protocol import MAX_HEARTBEAT_BYTES, MAX_HOSTS_BYTES

from .conftest import ServerThread

LOST_AFTER = 0.5


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """Agents lost after half a second without a heartbeat, so that tests can wait for it."""
    return replace(settings, agent_heartbeat_interval=0.1, agent_lost_after=LOST_AFTER)


def report(agent: str = "exec-1.example.org:7070", **fields: Any) -> dict[str, Any]:
    """A heartbeat document as an agent sends it."""
    return {
        "agent": agent,
        "host": agent.split(":")[0],
        "version": "1.2.3",
        "cache_bytes": 3 << 30,
        "cache_max_bytes": 10 << 30,
        "hits": 120,
        "misses": 4,
        "bytes_fetched": 1 << 30,
        "bytes_served": 5 << 30,
        "downloads_in_flight": 1,
        "jobs": [],
        **fields,
    }


# --- against a live server ------------------------------------------------------------------


async def test_a_heartbeat_registers_its_host_live_in_status(client: AsyncBlobClient) -> None:
    job = new_job_id()
    await client.put(b"x", job=job, name="a.jar")
    reply = await client.heartbeat(report(jobs=[job], future_field={"ignored": True}))
    assert reply == {"interval": 0.1, "lost_after": LOST_AFTER, "gone_jobs": []}
    listing, status = await client.hosts(), await client.status()
    (host,) = listing["hosts"]
    assert host == {
        "agent": "exec-1.example.org:7070",
        "host": "exec-1.example.org",
        "version": "1.2.3",
        "cache_bytes": 3 << 30,
        "cache_max_bytes": 10 << 30,
        "hits": 120,
        "misses": 4,
        "bytes_fetched": 1 << 30,
        "bytes_served": 5 << 30,
        "downloads_in_flight": 1,
        "jobs": 1,
        "last_seen": host["last_seen"],
        "state": "live",
    }
    assert abs(host["last_seen"] - listing["now"]) < 5
    assert status["heartbeats"] == 1 and status["requests"]["HEARTBEAT"] == 1
    assert (status["hosts_live"], status["hosts_lost"]) == (1, 0)
    assert "hosts" not in status, "STATUS stays small: every cache asks for it"


async def test_a_host_silent_for_agent_lost_after_is_listed_lost_and_live_again_on_its_next_heartbeat(
    client: AsyncBlobClient,
) -> None:
    await client.heartbeat(report("quiet:1"))
    await client.heartbeat(report("chatty:1"))
    await asyncio.sleep(LOST_AFTER * 0.6)
    await client.heartbeat(report("chatty:1"))
    await asyncio.sleep(LOST_AFTER * 0.6)
    states = [(host["agent"], host["state"]) for host in (await client.hosts())["hosts"]]
    assert states == [("chatty:1", "live"), ("quiet:1", "lost")]  # live first
    await client.heartbeat(report("quiet:1"))
    assert {host["state"] for host in (await client.hosts())["hosts"]} == {"live"}


async def test_gone_jobs_name_deleted_jobs_and_not_live_ones(client: AsyncBlobClient) -> None:
    live, deleted, emptied, unknown = (new_job_id() for _ in range(4))
    for job in (live, deleted, emptied):
        await client.put(b"bytes of " + job.encode(), job=job, name="lib/udfs.jar")
    await client.delete_job(deleted)  # the end of a publish block
    await client.delete(job=emptied, name="lib/udfs.jar")  # its last blob
    upper = deleted.upper()  # answered as the agent wrote it
    reply = await client.heartbeat(report(jobs=[live, upper, emptied, unknown, live]))
    assert reply["gone_jobs"] == [upper, emptied, unknown]
    assert (await client.hosts())["hosts"][0]["jobs"] == 4  # each job once


async def test_a_heartbeat_at_the_limit_listing_only_gone_jobs_is_answered_with_as_many_as_fit(
    settings: Settings,
) -> None:
    # Durations of many digits make the answer's fixed fields longer than the heartbeat's.
    long_winded = replace(settings, agent_heartbeat_interval=0.1234567890123, agent_lost_after=0.5123456789012)
    jobs: list[str] = []
    while len(json.dumps({"agent": "h:1", "jobs": [*jobs, "0" * 32]}, separators=(",", ":"))) <= MAX_HEARTBEAT_BYTES:
        jobs.append(new_job_id())
    async with BlobServer(long_winded) as server, AsyncBlobClient(server.address) as client:
        gone = (await client.heartbeat({"agent": "h:1", "jobs": jobs}))["gone_jobs"]
        assert len(jobs) - 5 < len(gone) < len(jobs) and gone == jobs[: len(gone)]
        rest = (await client.heartbeat({"agent": "h:1", "jobs": jobs[len(gone) :]}))["gone_jobs"]
        assert rest == jobs[len(gone) :]  # the next answer names the others


BAD_DOCUMENTS = [
    ({"host": "h"}, "needs 'agent'"),
    ({"agent": 7}, "'agent' must be host:port"),
    ({"agent": "no-port"}, "'agent' must be host:port"),
    ({"agent": "h:99999"}, "'agent' must be host:port"),
    ({"agent": "h:1", "jobs": "abc"}, "'jobs' must be a list"),
    ({"agent": "h:1", "jobs": ["0" * 31]}, "not a job id"),
    ({"agent": "h:1", "jobs": ["g" * 32]}, "not a job id"),
    ({"agent": "h:1", "jobs": [new_job_id() + "\n"]}, "not a job id"),
    ({"agent": "h:1", "jobs": [None]}, "not a job id"),
    ({"agent": "h:1", "hits": -1}, "'hits' must be a whole number"),
    ({"agent": "h:1", "cache_bytes": "12"}, "'cache_bytes' must be a whole number"),
    ({"agent": "h:1", "misses": True}, "'misses' must be a whole number"),
    ({"agent": "h:1", "hits": 1 << 64}, "'hits' must be a whole number"),
    ({"agent": "h:1", "version": 1}, "'version' must be printable ASCII"),
    ({"agent": "h:1", "host": "h" * 256}, "'host' must be printable ASCII"),
    ({"agent": "h:1", "host": "h\x00st"}, "'host' must be printable ASCII"),
    ({"agent": "h:1", "host": "hôst"}, "'host' must be printable ASCII"),
    ({"agent": "a b:1"}, "'agent' must be host:port"),
    ({"agent": "h" * 300 + ":1"}, "'agent' must be host:port"),
    ({"agent": "h:1", "stopping": 1}, "'stopping' must be true or false"),
]


@pytest.mark.parametrize(("document", "words"), BAD_DOCUMENTS)
async def test_a_malformed_report_is_a_bad_request_naming_the_field(
    server: BlobServer, client: AsyncBlobClient, document: dict[str, Any], words: str
) -> None:
    with pytest.raises(BadRequest, match=words) as caught:
        await client.heartbeat(document)
    assert "\n" not in str(caught.value)
    assert (await client.hosts())["hosts"] == []  # nothing recorded, and the server still answers


async def test_hosts_holds_as_many_hosts_as_the_registry_does_with_the_longest_fields(
    server: BlobServer, client: AsyncBlobClient
) -> None:
    longest = {name: (1 << 64) - 1 for name in COUNTERS} | {"host": "h" * 255, "version": "v" * 64}
    many = [new_job_id() for _ in range(100)]
    for number in range(server.hosts.max_hosts):
        agent = f"{number:0>255}:65535"
        server.hosts.record(HostReport.parse({"agent": agent, **longest, "jobs": many}))
    listing = await client.hosts()
    assert len(listing["hosts"]) == MAX_HOSTS
    assert len(json.dumps(listing, separators=(",", ":"))) < MAX_HOSTS_BYTES
    assert len(json.dumps(await client.status(), separators=(",", ":"))) < 2000


def exchange(server: BlobServer, request: bytes) -> bytes:
    """Send the preamble and ``request`` over a raw socket; what the server answers until it closes."""
    with socket.create_connection(server.address, timeout=5) as sock:
        sock.sendall(b"BLOB\x01\x00" + request)
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
    return received


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (b"\x07" + struct.pack("<I", 5) + b"{nope", b"the heartbeat document is not UTF-8 JSON"),
        (b"\x07" + struct.pack("<I", 6) + b"[1, 2]", b"the heartbeat document is not a JSON object"),
        (b"\x07" + struct.pack("<I", 5000) + b"[" * 5000, b"the heartbeat document is not UTF-8 JSON"),
        (b"\x07" + struct.pack("<I", MAX_HEARTBEAT_BYTES + 1), b"over the limit of 65536"),
        (b"\x07" + struct.pack("<I", 0xFFFFFFFF) + b"{}" * 1000, b"over the limit of 65536"),
    ],
)
async def test_a_heartbeat_that_is_no_json_object_or_too_large_is_a_bad_request_and_the_server_serves_on(
    server: BlobServer, client: AsyncBlobClient, request_: bytes, words: bytes
) -> None:
    answer = await asyncio.to_thread(exchange, server, request_)
    assert answer[:6] == b"BLOB\x01\x00"
    code, length = struct.unpack_from("<HI", answer, 7)
    assert answer[6] == 1 and code == 1  # an error frame: BAD_REQUEST
    assert words in answer[13 : 13 + length]
    assert (await client.hosts())["hosts"] == []


async def test_heartbeats_need_auth_when_the_server_has_a_secret(settings: Settings, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"s3cret")
    async with BlobServer(replace(settings, secret_file=secret_file)) as server:
        async with AsyncBlobClient(server.address, retries=0) as anonymous:
            with pytest.raises(AuthRequired):
                await anonymous.heartbeat(report())
        async with AsyncBlobClient(server.address, secret=b"s3cret") as member:
            assert (await member.heartbeat(report()))["gone_jobs"] == []
            assert len((await member.hosts())["hosts"]) == 1


def test_the_blocking_client_sends_heartbeats(server_thread: ServerThread) -> None:
    job = new_job_id()
    with BlobClient(server_thread.address) as client:
        assert client.heartbeat(report(jobs=[job]), timeout=5) == {
            "interval": 0.1,
            "lost_after": LOST_AFTER,
            "gone_jobs": [job],
        }
        assert client.hosts()["hosts"][0]["agent"] == "exec-1.example.org:7070"


# --- the registry's rules, on a fake clock --------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def registry(clock: Clock, *, lost_after: float = 30.0, max_hosts: int = 10_000) -> HostRegistry:
    return HostRegistry(lost_after, max_hosts=max_hosts, clock=clock, wall_clock=lambda: clock.now + 1e9)


def states(hosts: HostRegistry) -> dict[str, str]:
    return {host["agent"]: host["state"] for host in hosts.listing()}


def test_a_host_is_lost_once_silent_for_longer_than_lost_after() -> None:
    clock = Clock()
    hosts = registry(clock)
    hosts.record(HostReport.parse(report("a:1")))
    clock.now += 30.0
    assert states(hosts) == {"a:1": "live"}
    clock.now += 0.001
    assert states(hosts) == {"a:1": "lost"}
    assert hosts.listing()[0]["last_seen"] == 1000.0 + 1e9  # the wall clock of the heartbeat


def test_a_host_whose_agent_said_it_stops_is_stopped_not_lost_and_live_on_its_next_heartbeat() -> None:
    clock = Clock()
    hosts = registry(clock)
    hosts.record(HostReport.parse({**report("a:1"), "stopping": True}))
    assert states(hosts) == {"a:1": "stopped"}
    clock.now += 3600.0
    assert states(hosts) == {"a:1": "stopped"} and hosts.states() == {"live": 0, "lost": 0, "stopped": 1}
    hosts.record(HostReport.parse(report("a:1")))
    assert states(hosts) == {"a:1": "live"}


def test_a_host_silent_for_a_day_is_forgotten_and_for_100_times_lost_after_when_that_is_longer() -> None:
    clock = Clock()
    hosts = registry(clock)
    hosts.record(HostReport.parse(report("a:1")))
    clock.now += FORGET_AFTER
    assert states(hosts) == {"a:1": "lost"}
    clock.now += 1
    assert states(hosts) == {}
    slow = registry(clock, lost_after=3600.0)
    slow.record(HostReport.parse(report("b:1")))
    clock.now += FORGET_AFTER + 1
    assert states(slow) == {"b:1": "lost"}
    clock.now += 100 * 3600.0 - FORGET_AFTER
    assert states(slow) == {}


def test_the_registry_is_bounded_a_newcomer_displaces_a_lost_host_never_a_live_one() -> None:
    clock = Clock()
    hosts = registry(clock, max_hosts=3)
    for agent in ("a:1", "b:1", "c:1"):
        hosts.record(HostReport.parse(report(agent)))
        clock.now += 10
    hosts.record(HostReport.parse(report("d:1")))  # every host is live: answered, not listed
    assert sorted(states(hosts)) == ["a:1", "b:1", "c:1"] and hosts.unlisted == 1
    hosts.record(HostReport.parse(report("a:1")))  # a listed host is always recorded
    clock.now += 25  # b was heard from 45 s ago, c 35 s ago, a 25 s ago
    hosts.record(HostReport.parse(report("d:1")))  # takes the place of b, the host heard from longest ago
    assert states(hosts) == {"a:1": "live", "c:1": "lost", "d:1": "live"}
    assert hosts.heartbeats == 6 and hosts.unlisted == 1


def test_a_restarted_agent_takes_over_its_entry() -> None:
    clock = Clock()
    hosts = registry(clock)
    hosts.record(HostReport.parse(report("a:1", version="1.0", jobs=[new_job_id()])))
    hosts.record(HostReport.parse(report("a:1", version="1.1", jobs=[])))
    (host,) = hosts.listing()
    assert (host["version"], host["jobs"]) == ("1.1", 0)


def test_fields_an_agent_leaves_out_are_listed_as_null() -> None:
    hosts = registry(Clock())
    hosts.record(HostReport.parse({"agent": "[::1]:7070"}))
    (host,) = hosts.listing()
    assert host["agent"] == "[::1]:7070" and host["jobs"] == 0
    assert host["host"] is host["version"] is host["cache_bytes"] is host["hits"] is None


# --- settings --------------------------------------------------------------------------------


def test_agent_lost_after_must_be_longer_than_the_heartbeat_interval() -> None:
    with pytest.raises(ValueError, match="agent_lost_after"):
        Settings.load({"agent_heartbeat_interval": "10", "agent_lost_after": "10"}, environ={})
    settings = Settings.load(environ={"BLOBSVC_AGENT_HEARTBEAT_INTERVAL": "2", "BLOBSVC_AGENT_LOST_AFTER": "5"})
    assert (settings.agent_heartbeat_interval, settings.agent_lost_after) == (2.0, 5.0)
    assert (Settings().agent_heartbeat_interval, Settings().agent_lost_after) == (10.0, 30.0)


def test_serve_refuses_a_lost_after_no_longer_than_the_interval_as_a_usage_error(tmp_path: Path) -> None:
    # An address no host has: were the settings taken, serve would fail (exit 1), not run on.
    args = ["serve", "--host", "256.0.0.0", "--data-dir", str(tmp_path)]
    args += ["--agent-heartbeat-interval", "5", "--agent-lost-after", "5"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "agent_lost_after (5 s) must be longer" in result.stderr
    result = CliRunner().invoke(main, ["serve", "--data-dir", str(tmp_path), "--agent-lost-after", "soon"])
    assert result.exit_code == 2 and "--agent-lost-after" in result.stderr


# --- blobsvc status --hosts ----------------------------------------------------------------


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_status_hosts_says_when_no_agent_has_reported(server_thread: ServerThread) -> None:
    code, out, _ = run("status", "--hosts", "-s", server_thread.address)
    assert code == 0 and out == "no agent has reported to this server since it started (or became leader)\n"
    code, out, _ = run("status", "--hosts", "--json", "-s", server_thread.address)
    assert code == 0 and json.loads(out) == []


def test_status_hosts_prints_one_line_per_host_lost_ones_marked(server_thread: ServerThread) -> None:
    with BlobClient(server_thread.address) as client:
        client.heartbeat(report("exec-2.example.org:7070", jobs=[new_job_id()]))
        time.sleep(LOST_AFTER + 0.1)
        client.heartbeat(report("exec-1.example.org:7070", cache_bytes=1536 << 20))
    code, out, _ = run("status", "--hosts", "-s", server_thread.address)
    assert code == 0
    live, lost = out.splitlines()
    assert live.split() == [
        "exec-1.example.org:7070", "exec-1.example.org", "live", "1.2.3", "cache", "1.5GiB/10GiB",
        "hits", "120", "misses", "4", "jobs", "0", "seen", "0", "s", "ago",
    ]  # fmt: skip
    assert lost.split()[:4] == ["exec-2.example.org:7070", "exec-2.example.org", "LOST", "1.2.3"]
    assert re.search(r"  jobs 1  seen [01] s ago$", lost)
    code, out, _ = run("status", "--hosts", "--json", "-s", server_thread.address)
    assert [(host["agent"], host["state"]) for host in json.loads(out)] == [
        ("exec-1.example.org:7070", "live"),
        ("exec-2.example.org:7070", "lost"),
    ]
    code, out, _ = run("status", "-s", server_thread.address)
    assert "hosts live: 1\nhosts lost: 1\n" in out and "heartbeats: 2\n" in out


def test_status_hosts_of_a_dead_server_exits_1_with_one_line() -> None:
    code, out, err = run("status", "--hosts", "-s", "127.0.0.1:1", "--retries", "0")
    assert code == 1 and out == "" and err.count("\n") == 1
