"""GETs of hot small blobs, answered by the connection's reader callback rather than its task
(blobsvc/_hotgets.py), keep every rule the task keeps: order of pipelined replies, the
idle timeout and the header and body deadlines, request counts and observers, AUTH.
Over raw sockets on 127.0.0.1, as in test_server_faults.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any

import pytest
import uvloop

from blobsvc import AsyncBlobClient, BlobServer, Settings
from blobsvc._protocol import ContentKey, GetRequest, ServerConnection, encode_request

from .test_server_faults import (
    AUTH_REQUIRED,
    BAD_OFFSET,
    BAD_REQUEST,
    GET,
    HELLO,
    MISSING_KEY,
    NOT_FOUND,
    Raw,
    StartServer,
    assert_healthy,
    auth_server,
    content,
    digest,
    get_request,
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


def test_a_get_by_key_parses_the_same_from_its_cache() -> None:
    wire = HELLO + encode_request(GetRequest(ContentKey(MISSING_KEY), 7)) * 2
    parser = ServerConnection()
    parser.receive_data(wire)
    parser.next_event()
    first, second = parser.next_event(), parser.next_event()
    assert first == second == GetRequest(ContentKey(MISSING_KEY), 7)


@pytest.mark.parametrize(
    "test",
    [
        test_pipelined_hot_gets_and_other_requests_are_answered_in_order,
        test_a_client_that_pipelines_hot_gets_and_reads_nothing_is_dropped_within_io_timeout,
        test_idle_after_hot_gets_is_closed_after_idle_timeout_and_busy_use_is_not,
        test_a_header_begun_after_a_hot_get_must_be_whole_within_io_timeout,
    ],
    ids=["pipelined", "stalled-reader", "idle", "header-deadline"],
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
