"""Small requests answered by the connection's reader callback rather than its task
(blobsvc/server/_fastpath.py): GETs of hot small blobs, and small PUTs that arrived whole. They
keep every rule the task keeps: order of pipelined replies, the idle timeout and the header
and body deadlines, request counts and observers, AUTH, max_blob_size, and for PUTs
durability (nothing acknowledged before it is stored, shutdown lets a publication finish)
and clean-up (no staging file left by a client that hangs up). Over raw sockets on
127.0.0.1, as in test_server_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
import uvloop

from blobsvc import AsyncBlobClient, BlobServer, NotFound, Settings
from blobsvc import server as server_module
from blobsvc.ha import Standalone
from blobsvc.storage import BlobStorage, Publication
from blobsvc.wire._protocol import (
    ContentKey,
    Data,
    GetRequest,
    PutRequest,
    PutTrailer,
    ServerConnection,
    encode_request,
)

from .conftest import assert_no_staging, staging_files
from .test_metrics import scrape, value
from .test_server_faults import (
    AUTH,
    AUTH_REQUIRED,
    BAD_OFFSET,
    BAD_REQUEST,
    DIGEST_MISMATCH,
    GET,
    HELLO,
    JOB_ID,
    MISSING_KEY,
    NOT_FOUND,
    STEP,
    TOO_LARGE,
    Raw,
    StartServer,
    assert_healthy,
    auth_server,
    content,
    digest,
    get_request,
    job_name,
    mac,
    put_request,
    raw_connection,
    start_server,
    stat_request,
)

__all__ = ["auth_server", "start_server"]  # the fixtures, imported for pytest


async def make_hot(raw: Raw, body: bytes) -> bytes:
    """Store ``body`` and GET it once, which keeps it in memory; its key."""
    key = digest(body)
    await raw.send(put_request(body) + get_request(content(key)))
    assert await raw.put_ok() == key
    assert await raw.get_ok() == (len(body), key)
    assert await raw.read(len(body)) == body
    return key


async def test_pipelined_hot_gets_and_other_requests_are_answered_in_order(start_server: StartServer) -> None:
    server = await start_server()
    hot, cold = os.urandom(3000), os.urandom(2000)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, hot)
        await raw.send(
            get_request(content(key))
            + stat_request(content(MISSING_KEY))
            + get_request(content(key), offset=1000)
            + put_request(cold)
            + get_request(content(key), offset=len(hot) + 1)  # past the end
            + get_request(content(digest(cold)))  # not in memory yet: the task reads it
            + get_request(content(key))
            + bytes([0x42])  # no such opcode
            + get_request(content(key))  # never answered
        )
        assert await raw.get_ok() == (len(hot), key)
        assert await raw.read(len(hot)) == hot
        assert (await raw.error())[0] == NOT_FOUND
        assert await raw.get_ok() == (len(hot), key)
        assert await raw.read(len(hot) - 1000) == hot[1000:]
        assert await raw.put_ok() == digest(cold)
        assert (await raw.error())[0] == BAD_OFFSET
        assert await raw.get_ok() == (len(cold), digest(cold))
        assert await raw.read(len(cold)) == cold
        assert await raw.get_ok() == (len(hot), key)
        assert await raw.read(len(hot)) == hot
        assert (await raw.error())[0] == BAD_REQUEST
        assert await raw.until_closed() == b""
    await assert_healthy(server)


async def test_hot_gets_split_across_reads_and_sent_byte_by_byte_are_answered(server: BlobServer) -> None:
    body = os.urandom(100)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, body)
        wire = get_request(content(key)) * 3
        for start in range(0, len(wire), 17):  # frames cut at every kind of place
            await raw.send(wire[start : start + 17])
            await asyncio.sleep(0.001)
        for _ in range(3):
            assert await raw.get_ok() == (len(body), key)
            assert await raw.read(len(body)) == body


async def test_hot_gets_are_counted_and_observed(server: BlobServer) -> None:
    seen: list[tuple[Any, int, int]] = []
    server.observers.append(lambda request, outcome, moved, seconds, stream: seen.append((request, outcome, moved)))
    body = os.urandom(500)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, body)
        before = server.requests["GET"]
        await raw.send(get_request(content(key)) + get_request(content(key), offset=200))
        for skip in (0, 200):
            assert await raw.get_ok() == (len(body), key)
            assert await raw.read(len(body) - skip) == body[skip:]
    assert server.requests["GET"] == before + 2
    target = ContentKey(key)
    assert seen[-2:] == [(GetRequest(target), 0, 500), (GetRequest(target, 200), 0, 300)]


async def test_a_hot_get_before_auth_is_refused(auth_server: BlobServer) -> None:
    body = os.urandom(100)
    async with AsyncBlobClient(auth_server.address, secret=b"correct horse battery staple", retries=0) as client:
        key = await client.put(body)
        assert await client.get(key) == body
        assert await client.get(key) == body  # from memory
    async with raw_connection(auth_server, handshake=False) as raw:
        await raw.send(HELLO)
        await raw.read(6 + 32)
        await raw.send(get_request(content(bytes.fromhex(key))))
        assert (await raw.error())[0] == AUTH_REQUIRED
        assert await raw.until_closed() == b""


async def test_a_client_that_pipelines_hot_gets_and_reads_nothing_is_dropped_within_io_timeout(
    start_server: StartServer,
) -> None:
    io_timeout = 0.5
    server = await start_server(io_timeout=io_timeout, idle_timeout=30.0)
    body = os.urandom(60 << 10)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, body)
    raw = await Raw.connect(server.address, rcvbuf=64 << 10)
    try:
        assert await raw.handshake() is None
        # 300 replies of 60 KiB: far more than the socket buffers hold, so a send stalls.
        raw.writer.write(get_request(content(key)) * 300)
        started = time.monotonic()
        while not any(connection.busy for connection in server.slots.connections.values()):
            assert time.monotonic() - started < 5.0, "no send ever stalled"
            await asyncio.sleep(0.01)
        stalled = time.monotonic()
        while server.slots.connections:  # the task finishes the reply: io_timeout per wait
            assert time.monotonic() - stalled < io_timeout + 2.0, "the stalled client was not dropped"
            await asyncio.sleep(0.05)
    finally:
        raw.close()
    await assert_healthy(server)


async def test_idle_after_hot_gets_is_closed_after_idle_timeout_and_busy_use_is_not(
    start_server: StartServer,
) -> None:
    idle_timeout = 0.5
    server = await start_server(idle_timeout=idle_timeout, io_timeout=30.0)
    body = os.urandom(100)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, body)
        for _ in range(4):  # 1.2 s in all, never 0.5 s idle
            await asyncio.sleep(0.3)
            await raw.send(get_request(content(key)))
            assert await raw.get_ok() == (len(body), key)
            assert await raw.read(len(body)) == body
        started = time.monotonic()
        assert await raw.until_closed() == b""
        assert idle_timeout * 0.8 <= time.monotonic() - started <= idle_timeout + 2.0


async def test_a_header_begun_after_a_hot_get_must_be_whole_within_io_timeout(start_server: StartServer) -> None:
    io_timeout = 0.5
    server = await start_server(io_timeout=io_timeout, idle_timeout=30.0)
    body = os.urandom(100)
    async with raw_connection(server) as raw:
        key = await make_hot(raw, body)
        await raw.send(get_request(content(key)) + bytes([GET]) + content(key)[:9])
        assert await raw.get_ok() == (len(body), key)
        assert await raw.read(len(body)) == body
        started = time.monotonic()
        assert await raw.until_closed() == b""
        assert io_timeout * 0.8 <= time.monotonic() - started <= io_timeout + 2.0
    await assert_healthy(server)


async def test_shutdown_closes_connections_waiting_between_hot_gets_at_once(start_server: StartServer) -> None:
    server = await start_server(shutdown_timeout=30.0)
    body = os.urandom(100)
    async with raw_connection(server) as raw:
        await make_hot(raw, body)
        started = time.monotonic()
        await server.shutdown()
        assert time.monotonic() - started < 5.0
        assert await raw.until_closed() == b""


# --- small PUTs ---------------------------------------------------------------------------


class TaskPuts:
    """Counts the PUTs the connection's task takes (``_Connection._put``): a spy that tells
    which path answered, not a stand-in; the PUT itself runs as ever."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = server_module._Connection._put

        async def put(connection: server_module._Connection, request: PutRequest) -> None:
            self.count += 1
            await original(connection, request)

        monkeypatch.setattr(server_module._Connection, "_put", put)


@pytest.fixture
def task_puts(monkeypatch: pytest.MonkeyPatch) -> TaskPuts:
    return TaskPuts(monkeypatch)


class HeldFlushes:
    """Holds every group-commit flush until :meth:`release`. A stand-in for a slow disk (as
    ``SlowDisk`` in test_crash_safety.py): a real one flushes a 4 KiB blob too fast for a test
    to act while it publishes. The flush itself then runs as ever."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.entered = threading.Event()
        self._gate = threading.Event()
        original = BlobStorage.publish_batch

        def publish_batch(storage: BlobStorage, batch: Sequence[Publication]) -> list[bytes | Exception]:
            self.entered.set()
            self._gate.wait(4 * STEP)  # never a hang, whatever a test does
            return original(storage, batch)

        monkeypatch.setattr(BlobStorage, "publish_batch", publish_batch)

    async def wait_entered(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, STEP), "no flush began"

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
def held_flushes(monkeypatch: pytest.MonkeyPatch) -> Iterator[HeldFlushes]:
    held = HeldFlushes(monkeypatch)
    try:
        yield held
    finally:
        held.release()


async def test_pipelined_whole_puts_gets_and_other_requests_are_answered_in_order(start_server: StartServer) -> None:
    server = await start_server()
    first, named, empty = os.urandom(4096), os.urandom(100), b""
    async with raw_connection(server) as raw:
        hot = await make_hot(raw, os.urandom(300))
        await raw.send(
            put_request(first)
            + get_request(content(digest(first)))  # not in memory: the task reads it from disk
            + put_request(named, job_name(b"named"))
            + get_request(content(hot))
            + put_request(empty)
            + stat_request(job_name(b"named"))
            + put_request(first)  # stored already
        )
        assert await raw.put_ok() == digest(first)
        assert await raw.get_ok() == (len(first), digest(first))
        assert await raw.read(len(first)) == first
        assert await raw.put_ok() == digest(named)
        assert await raw.get_ok() == (300, hot)
        await raw.read(300)
        assert await raw.put_ok() == digest(empty)
        assert await raw.get_ok() == (len(named), digest(named))
        assert await raw.put_ok() == digest(first)
    await assert_healthy(server)


async def test_whole_small_puts_never_wake_the_task_and_split_ones_are_the_tasks(
    server: BlobServer, task_puts: TaskPuts
) -> None:
    whole, split = os.urandom(4096), os.urandom(5000)
    async with raw_connection(server) as raw:
        await raw.send(put_request(whole) + put_request(whole, job_name(b"whole")))
        assert await raw.put_ok() == digest(whole)
        assert await raw.put_ok() == digest(whole)
        assert task_puts.count == 0
        wire = put_request(split) + put_request(whole)
        for start in range(0, len(wire), 1500):  # the first body comes in pieces, the second whole
            await raw.send(wire[start : start + 1500])
            await asyncio.sleep(0.01)
        assert await raw.put_ok() == digest(split)
        assert await raw.put_ok() == digest(whole)
    assert 1 <= task_puts.count <= 2  # the split one; the other is whole only if it came in one read
    async with AsyncBlobClient(server.address, retries=0) as client:
        assert await client.get(digest(split).hex()) == split
        assert await client.get(job=JOB_ID, name="whole") == whole
    await assert_healthy(server)


async def test_a_whole_put_with_a_wrong_digest_is_refused_and_the_connection_kept(
    server: BlobServer, task_puts: TaskPuts
) -> None:
    body, other = os.urandom(4096), os.urandom(4096)
    async with raw_connection(server) as raw:
        await raw.send(put_request(body, trailer=digest(other)) + put_request(other))
        code, message = await raw.error()
        assert code == DIGEST_MISMATCH
        assert "nothing stored" in message
        assert await raw.put_ok() == digest(other)
    assert task_puts.count == 0
    with pytest.raises(NotFound):
        server.storage.stat(ContentKey(digest(body)))
    await assert_healthy(server)


async def test_a_whole_put_before_auth_is_refused_and_after_auth_answered_by_the_callback(
    auth_server: BlobServer, task_puts: TaskPuts
) -> None:
    body = os.urandom(4096)
    async with raw_connection(auth_server, handshake=False) as raw:
        assert await raw.handshake() is not None
        await raw.send(put_request(body))
        assert (await raw.error())[0] == AUTH_REQUIRED
        assert await raw.until_closed() == b""
    with pytest.raises(NotFound):
        auth_server.storage.stat(ContentKey(digest(body)))
    puts_before_auth = task_puts.count
    async with raw_connection(auth_server, handshake=False) as raw:
        nonce = await raw.handshake()
        assert nonce is not None
        await raw.send(bytes([AUTH]) + mac(nonce) + put_request(body))
        await raw.ok()
        assert await raw.put_ok() == digest(body)
    assert task_puts.count == puts_before_auth


async def test_callback_puts_are_counted_and_observed_as_the_tasks_are(server: BlobServer, task_puts: TaskPuts) -> None:
    seen: list[tuple[Any, int, int]] = []
    server.observers.append(lambda request, outcome, moved, seconds, stream: seen.append((request, outcome, moved)))
    good, bad = os.urandom(4096), os.urandom(10)
    wire = put_request(good) + put_request(bad, trailer=MISSING_KEY)
    before = server.requests["PUT"]
    async with raw_connection(server) as raw:
        await raw.send(wire)  # whole: the callback answers both
        assert await raw.put_ok() == digest(good)
        assert (await raw.error())[0] == DIGEST_MISMATCH
        assert task_puts.count == 0
        await send_in_two_reads(raw, put_request(good))  # now the task answers both
        assert await raw.put_ok() == digest(good)
        await send_in_two_reads(raw, put_request(bad, trailer=MISSING_KEY))
        assert (await raw.error())[0] == DIGEST_MISMATCH
        assert task_puts.count == 2
    assert server.requests["PUT"] == before + 4
    expected = [(PutRequest(len(good)), 0, len(good)), (PutRequest(len(bad)), DIGEST_MISMATCH, len(bad))]
    assert seen == expected * 2


async def test_callback_puts_move_the_metrics(settings: Settings) -> None:
    async with BlobServer(replace(settings, metrics_port="0")) as server:
        assert server.metrics is not None and server.metrics.address is not None
        before = await asyncio.to_thread(scrape, server.metrics.address)
        body = os.urandom(4096)
        async with raw_connection(server) as raw:
            await raw.send(put_request(body) + put_request(body, trailer=MISSING_KEY))
            assert await raw.put_ok() == digest(body)
            assert (await raw.error())[0] == DIGEST_MISMATCH
        after = await asyncio.to_thread(scrape, server.metrics.address)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("blobsvc_requests_total", op="PUT", outcome="ok") == 1
    assert moved("blobsvc_requests_total", op="PUT", outcome="DIGEST_MISMATCH") == 1
    assert moved("blobsvc_received_bytes_total") == 2 * len(body)
    assert moved("blobsvc_request_duration_seconds_count", op="PUT") == 2


async def test_a_whole_put_over_max_blob_size_is_refused_by_the_task_and_one_at_it_stored(
    start_server: StartServer, task_puts: TaskPuts
) -> None:
    server = await start_server(max_blob_size=1000)
    at, over = os.urandom(1000), os.urandom(1001)
    async with raw_connection(server) as raw:
        await raw.send(put_request(at) + put_request(over))
        assert await raw.put_ok() == digest(at)
        code, message = await raw.error()
        assert code == TOO_LARGE
        assert "1000" in message
        assert await raw.until_closed() == b""
    assert task_puts.count == 1
    with pytest.raises(NotFound):
        server.storage.stat(ContentKey(digest(over)))
    await assert_no_staging(server.settings.data_dir)


@pytest.mark.parametrize("how", ["reset", "close"])
async def test_a_client_gone_while_its_put_publishes_leaves_no_staging_file_and_no_error(
    server: BlobServer, held_flushes: HeldFlushes, caplog: pytest.LogCaptureFixture, how: str
) -> None:
    body = os.urandom(4096)
    raw = await Raw.connect(server.address)
    try:
        assert await raw.handshake() is None
        await raw.send(put_request(body) + get_request(content(digest(body))))
        await held_flushes.wait_entered()
        raw.reset() if how == "reset" else raw.close()
        await asyncio.sleep(0.1)  # the hang-up reaches the server's socket meanwhile
    finally:
        raw.close()
    held_flushes.release()
    await wait_until_no_connections(server)
    await assert_no_staging(server.settings.data_dir)
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert server.storage.stat(ContentKey(digest(body)))[0] == len(body)  # it came whole: stored
    await assert_healthy(server)


async def test_shutdown_lets_a_callback_put_publish_and_answers_it_before_closing(
    start_server: StartServer, held_flushes: HeldFlushes, task_puts: TaskPuts
) -> None:
    server = await start_server(shutdown_timeout=30.0)
    body, later = os.urandom(4096), os.urandom(4096)
    async with raw_connection(server) as raw:
        await raw.send(put_request(body) + put_request(later))
        await held_flushes.wait_entered()
        assert [connection.busy for connection in server.slots.connections.values()] == [True]
        shutdown = asyncio.create_task(server.shutdown())
        await asyncio.sleep(0.2)
        assert not shutdown.done(), "shutdown did not wait for a PUT publishing"
        held_flushes.release()
        assert await raw.put_ok() == digest(body)
        assert await raw.until_closed() == b""  # the next PUT is not taken: the server shuts down
        async with asyncio.timeout(STEP):
            await shutdown
    assert task_puts.count == 0
    async with BlobServer(server.settings) as again:  # acknowledged, so stored
        assert again.storage.stat(ContentKey(digest(body)))[0] == len(body)
        with pytest.raises(NotFound):
            again.storage.stat(ContentKey(digest(later)))
        assert staging_files(server.settings.data_dir) == []


async def test_a_shutdown_past_its_timeout_waits_for_a_publishing_put_and_acknowledges_nothing(
    start_server: StartServer, held_flushes: HeldFlushes
) -> None:
    server = await start_server(shutdown_timeout=0.05)
    body = os.urandom(4096)
    async with raw_connection(server) as raw:
        await raw.send(put_request(body))
        await held_flushes.wait_entered()
        shutdown = asyncio.create_task(server.shutdown())
        await asyncio.sleep(0.3)  # the connection's task is cancelled meanwhile
        assert not shutdown.done(), "shutdown went on with a publication in flight"
        held_flushes.release()
        async with asyncio.timeout(STEP):
            await shutdown
        assert await raw.until_closed() == b""  # cancelled: no answer, as for the task's own PUTs
    assert staging_files(server.settings.data_dir) == []


class ConfirmingHA(Standalone):
    """Standalone, but confirming each acknowledgement as ZooKeeper mode does (whose own PUTs
    test_ha_zookeeper.py runs against a real ZooKeeper): the flag alone decides the path."""

    confirms_acknowledgements = True

    def __init__(self) -> None:
        self.acknowledged = 0

    async def acknowledge(self) -> None:
        self.acknowledged += 1


async def test_a_server_whose_ha_confirms_acknowledgements_puts_on_the_task(
    settings: Settings, task_puts: TaskPuts
) -> None:
    ha = ConfirmingHA()
    body = os.urandom(4096)
    async with BlobServer(settings, ha=ha) as server, raw_connection(server) as raw:
        await raw.send(put_request(body))
        assert await raw.put_ok() == digest(body)
    assert (task_puts.count, ha.acknowledged) == (1, 1)


async def send_in_two_reads(raw: Raw, request: bytes) -> None:
    """A PUT whose body is not whole when its header arrives."""
    await raw.send(request[:15])
    await asyncio.sleep(0.05)
    await raw.send(request[15:])


async def wait_until_no_connections(server: BlobServer) -> None:
    async with asyncio.timeout(STEP):
        await asyncio.gather(*server.slots.connections, return_exceptions=True)


def test_a_get_by_key_parses_the_same_from_its_cache() -> None:
    wire = HELLO + encode_request(GetRequest(ContentKey(MISSING_KEY), 7)) * 2
    parser = ServerConnection()
    parser.receive_data(wire)
    parser.next_event()
    first, second = parser.next_event(), parser.next_event()
    assert first == second == GetRequest(ContentKey(MISSING_KEY), 7)


def test_a_content_put_header_parses_the_same_from_its_cache() -> None:
    body = b"abc"
    wire = HELLO + (encode_request(PutRequest(len(body))) + body + digest(body)) * 2
    parser = ServerConnection()
    parser.receive_data(wire)
    parser.next_event()
    events = [parser.next_event() for _ in range(6)]
    assert events == [PutRequest(len(body)), Data(body), PutTrailer(digest(body))] * 2


@pytest.mark.parametrize(
    "test",
    [
        test_pipelined_hot_gets_and_other_requests_are_answered_in_order,
        test_pipelined_whole_puts_gets_and_other_requests_are_answered_in_order,
        test_a_client_that_pipelines_hot_gets_and_reads_nothing_is_dropped_within_io_timeout,
        test_idle_after_hot_gets_is_closed_after_idle_timeout_and_busy_use_is_not,
        test_a_header_begun_after_a_hot_get_must_be_whole_within_io_timeout,
    ],
    ids=["pipelined", "pipelined-puts", "stalled-reader", "idle", "header-deadline"],
)
def test_the_same_on_uvloop_which_blobsvc_serve_runs(
    settings: Settings, test: Callable[[StartServer], Awaitable[None]]
) -> None:
    """The other tests run on asyncio's own loop; the reader callback must behave alike on uvloop."""

    async def run() -> None:
        async with contextlib.AsyncExitStack() as stack:

            async def start(**changes: Any) -> BlobServer:
                return await stack.enter_async_context(BlobServer(replace(settings, **changes)))

            await test(start)

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run())
