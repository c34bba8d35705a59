"""Prometheus metrics: the real endpoint on 127.0.0.1, scraped over HTTP after real requests."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from blobsvc import AsyncBlobClient, BlobServer, Busy, NotFound, Settings
from blobsvc.cli import main
from blobsvc.storage import MEMORY_STAGING_LIMIT
from blobsvc.wire._protocol import ClientConnection, ContentKey, GetRequest, Hello, PutRequest

from .conftest import address_text

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]

_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def scrape(address: tuple[str, int], path: str = "/metrics") -> Samples:
    """Every sample of one scrape, by name and labels."""
    with _NO_PROXY.open(f"http://{address[0]}:{address[1]}{path}", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=")
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


async def scrape_async(server: BlobServer) -> Samples:
    assert server.metrics is not None and server.metrics.address is not None
    return await asyncio.to_thread(scrape, server.metrics.address)


@pytest.fixture
def metered(settings: Settings) -> Settings:
    return replace(settings, metrics_port="0")


async def test_counters_move_by_the_amounts_of_real_requests(metered: Settings) -> None:
    async with BlobServer(metered) as server, AsyncBlobClient(server.address, retries=0) as client:
        before = await scrape_async(server)
        key = await client.put(b"x" * 1000)
        assert await client.get(key) == b"x" * 1000
        assert await client.get(key) == b"x" * 1000
        with pytest.raises(NotFound):
            await client.get("0" * 64)
        await client.stat(key)
        after = await scrape_async(server)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("blobsvc_requests_total", op="PUT", outcome="ok") == 1
    assert moved("blobsvc_requests_total", op="GET", outcome="ok") == 2
    assert moved("blobsvc_requests_total", op="GET", outcome="NOT_FOUND") == 1
    assert moved("blobsvc_requests_total", op="STAT", outcome="ok") == 1
    assert moved("blobsvc_received_bytes_total") == 1000
    assert moved("blobsvc_sent_bytes_total") == 2000
    assert moved("blobsvc_request_duration_seconds_count", op="GET") == 3
    assert value(after, "blobsvc_request_duration_seconds_bucket", op="GET", le="+Inf") == 3
    assert value(after, "blobsvc_request_duration_seconds_sum", op="GET") > 0
    assert value(after, "blobsvc_stored_blobs") == 1
    assert value(after, "blobsvc_stored_bytes") == 1000
    assert value(after, "blobsvc_connections") == 1  # the client's pooled connection
    assert value(after, "blobsvc_disk_free_bytes") > 0
    assert value(after, "blobsvc_role", role="standalone") == 1
    assert value(after, "blobsvc_uploads_in_flight") == value(after, "blobsvc_staging_files") == 0


async def test_busy_refusals_are_counted(metered: Settings) -> None:
    async with BlobServer(replace(metered, max_connections=1)) as server:
        # A request under way holds its slot (an idle connection would be closed to make room).
        holder = await start_upload(server, 100, b"under way")
        try:
            async with AsyncBlobClient(server.address, retries=0) as refused:
                with pytest.raises(Busy):
                    await refused.put(b"no room")
            samples = await scrape_async(server)
        finally:
            holder.close()
    assert value(samples, "blobsvc_busy_refusals_total") == 1
    assert value(samples, "blobsvc_requests_total", op="PUT", outcome="ok") == 0


async def start_upload(server: BlobServer, length: int, sent: bytes) -> asyncio.StreamWriter:
    """A PUT of ``length`` bytes of which only ``sent`` have been sent, once the server has it in hand."""
    _, writer = await asyncio.open_connection(*server.address)
    protocol = ClientConnection()
    writer.write(bytes(protocol.send(Hello())) + bytes(protocol.send(PutRequest(length))) + sent)
    await writer.drain()
    await wait_until(lambda: server.status()["uploads_in_flight"] == 1)
    return writer


async def wait_until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never got there")


@pytest.mark.parametrize(("length", "files"), [(100, 0), (MEMORY_STAGING_LIMIT + 1, 1)])
async def test_an_upload_in_flight_shows_as_an_upload_and_a_large_one_as_a_staging_file(
    metered: Settings, length: int, files: int
) -> None:
    """A small upload is held in memory until it is published."""
    async with BlobServer(metered) as server:
        writer = await start_upload(server, length, b"half a body")
        await wait_until(lambda: server.status()["staging_files"] == files)
        samples = await scrape_async(server)
        writer.close()
    assert value(samples, "blobsvc_uploads_in_flight") == 1
    assert value(samples, "blobsvc_staging_files") == files


async def test_an_upload_cut_off_counts_as_a_bad_request_with_the_bytes_received(metered: Settings) -> None:
    async with BlobServer(metered) as server:
        writer = await start_upload(server, 100, b"x" * 40)
        writer.close()
        await wait_until(lambda: server.status()["connections"] == 0)
        samples = await scrape_async(server)
    assert value(samples, "blobsvc_requests_total", op="PUT", outcome="BAD_REQUEST") == 1  # closed mid-body
    assert value(samples, "blobsvc_received_bytes_total") == 40


def test_corrupt_blobs_found_at_start_are_a_metric(metered: Settings) -> None:
    async def run() -> Samples:
        async with BlobServer(metered) as server, AsyncBlobClient(server.address) as client:
            key = await client.put(os.urandom(4096))
        path = metered.data_dir / "objects" / key
        path.chmod(0o644)
        path.write_bytes(b"rotten")
        async with BlobServer(metered) as server:
            return await scrape_async(server)

    samples = asyncio.run(run())
    assert value(samples, "blobsvc_removed_at_start", reason="corrupt") == 2  # the object and its name
    assert value(samples, "blobsvc_stored_blobs") == 0


async def test_a_status_source_sets_the_role_and_leader_changes(metered: Settings) -> None:
    server = BlobServer(metered)
    server.status_sources.append(lambda: {"role": "leader", "leader_changes": 3})
    async with server:
        samples = await scrape_async(server)
    assert value(samples, "blobsvc_role", role="leader") == 1
    assert value(samples, "blobsvc_leader_changes_total") == 3


def test_metrics_without_prometheus_client_exit_1_naming_the_extra(tmp_path: Path) -> None:
    """prometheus-client is installed here, so the child blocks its import (the one way to
    show a missing extra without a second environment)."""
    blocked = "import sys; sys.modules['prometheus_client'] = None; from blobsvc.cli import main; main()"
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--metrics-port", "0"]
    result = subprocess.run(
        [sys.executable, "-c", blocked, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr == "Error: metrics need prometheus-client: pip install 'blobsvc[metrics]'\n"


def test_the_scrape_is_served_on_the_settings_host(metered: Settings) -> None:
    async def run() -> str:
        async with BlobServer(metered) as server:
            assert server.metrics is not None and server.metrics.address is not None
            return address_text(server.metrics.address)

    assert asyncio.run(run()).startswith("127.0.0.1:")


def http_get(address: tuple[str, int], path: str) -> int:
    try:
        with _NO_PROXY.open(f"http://{address[0]}:{address[1]}{path}", timeout=10) as response:
            response.read()
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_metrics_http_serves_them_on_the_http_face_only(settings: Settings) -> None:
    async with BlobServer(replace(settings, http_port="0", metrics_port="http")) as server:
        assert server.http_address is not None and server.metrics is not None
        async with AsyncBlobClient(server.address) as client:
            key = await client.put(b"seen over http")
            await client.get(key)
        assert await asyncio.to_thread(http_get, server.http_address, f"/blobs/{key}") == 200
        assert await asyncio.to_thread(http_get, server.http_address, f"/blobs/{'0' * 64}") == 404
        samples = await asyncio.to_thread(scrape, server.http_address)
        assert server.metrics.address is None  # no port of its own
    assert value(samples, "blobsvc_requests_total", op="GET", outcome="ok") == 1
    assert value(samples, "blobsvc_requests_total", op="HTTP_GET", outcome="ok") == 1
    assert value(samples, "blobsvc_requests_total", op="HTTP_GET", outcome="404") == 1
    assert value(samples, "blobsvc_sent_bytes_total") > 2 * len(b"seen over http")  # and the 404's text


def ask_http(address: tuple[str, int], method: str) -> bytes:
    with socket.create_connection(address, timeout=10) as sock:
        sock.sendall(f"{method} /blobs/{'0' * 64} HTTP/1.1\r\nHost: blobs\r\n\r\n".encode())
        return sock.recv(1 << 16).split(b"\r\n", 1)[0]


async def test_http_methods_other_than_get_and_head_count_as_one_op(metered: Settings) -> None:
    """A client making up methods cannot make up metric labels (or STATUS's counters)."""
    async with BlobServer(replace(metered, http_port="0")) as server:
        assert server.http_address is not None
        for method in ("DELETE", "MADEUP1", "MADEUP2"):
            assert await asyncio.to_thread(ask_http, server.http_address, method) == b"HTTP/1.1 405 Method Not Allowed"
        samples = await scrape_async(server)
        assert {op for op in server.requests if op.startswith("HTTP_")} == {"HTTP_OTHER"}
    assert value(samples, "blobsvc_requests_total", op="HTTP_OTHER", outcome="405") == 3
    assert not [labels for name, labels in samples if ("op", "HTTP_MADEUP1") in labels]


async def test_a_metrics_port_and_the_http_face_serve_the_same_metrics(metered: Settings) -> None:
    async with BlobServer(replace(metered, http_port="0")) as server:
        assert server.http_address is not None
        async with AsyncBlobClient(server.address) as client:
            await client.put(b"one")
            status = await client.status()
        on_port, on_face = await asyncio.gather(scrape_async(server), asyncio.to_thread(scrape, server.http_address))
        assert server.metrics is not None and server.metrics.address is not None
        assert status["http_address"] == address_text(server.http_address)
        assert status["metrics_address"] == address_text(server.metrics.address)
    for samples in (on_port, on_face):
        assert value(samples, "blobsvc_requests_total", op="PUT", outcome="ok") == 1


async def test_status_names_the_http_face_as_the_metrics_address_when_it_serves_them_alone(
    metered: Settings,
) -> None:
    async with BlobServer(replace(metered, http_port="0", metrics_port="http")) as server:
        assert server.http_address is not None
        http_address = address_text(server.http_address)
        async with AsyncBlobClient(server.address) as client:
            status = await client.status()
    assert status["metrics_address"] == status["http_address"] == http_address


def test_a_metrics_port_in_use_is_one_line_naming_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["serve", "--port", "0", "--data-dir", str(tmp_path / "d"), "--metrics-port", str(port)]
        result = subprocess.run(
            [sys.executable, "-m", "blobsvc", *args], capture_output=True, text=True, timeout=60, check=False
        )
    assert result.returncode == 1
    assert result.stderr == f"Error: cannot serve metrics on 127.0.0.1:{port}: Address already in use\n"


def test_metrics_http_without_the_http_face_is_a_usage_error(tmp_path: Path) -> None:
    args = ["serve", "--port", "0", "--data-dir", str(tmp_path), "--metrics-port", "http"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "set http_port too" in result.stderr


async def test_a_download_the_client_walks_away_from_counts_as_aborted(metered: Settings) -> None:
    async with BlobServer(metered) as server, AsyncBlobClient(server.address) as client:
        key = await client.put(os.urandom(32 << 20))
        reader, writer = await asyncio.open_connection(*server.address)
        protocol = ClientConnection()
        writer.write(bytes(protocol.send(Hello())) + bytes(protocol.send(GetRequest(ContentKey(bytes.fromhex(key))))))
        await reader.readexactly(6 + 1 + 8 + 32)  # the server's preamble and the GET's header
        writer.transport.abort()  # a reset, with 32 MiB still to send
        await wait_until(lambda: server.status()["connections"] == 1)  # the client's pooled one
        samples = await scrape_async(server)
    assert value(samples, "blobsvc_requests_total", op="GET", outcome="aborted") == 1
    assert value(samples, "blobsvc_sent_bytes_total") == 0  # only bodies sent whole count


async def test_agents_are_counted_live_and_lost_and_their_heartbeats_too(metered: Settings) -> None:
    agents = replace(metered, agent_heartbeat_interval=0.1, agent_lost_after=0.3)
    async with BlobServer(agents) as server, AsyncBlobClient(server.address, retries=0) as client:
        samples = await scrape_async(server)
        assert value(samples, "blobsvc_agents", state="live") == value(samples, "blobsvc_agents", state="lost") == 0
        await client.heartbeat({"agent": "exec-1:6140"})
        await asyncio.sleep(0.4)
        await client.heartbeat({"agent": "exec-2:6140"})
        await client.heartbeat({"agent": "exec-2:6140"})
        samples = await scrape_async(server)
    assert value(samples, "blobsvc_agents", state="live") == value(samples, "blobsvc_agents", state="lost") == 1
    assert value(samples, "blobsvc_agent_heartbeats_total") == 3
    assert value(samples, "blobsvc_requests_total", op="HEARTBEAT", outcome="ok") == 3
