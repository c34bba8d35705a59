"""Every number and list a request carries is bounded: a number of too many digits is a 416
(HTTP) or BAD_REQUEST (binary), never a 500 or INTERNAL; a host's record on the server costs a
bounded few KiB whatever its heartbeat lists (docs/security.md, "Request bounds")."""

from __future__ import annotations

import asyncio
import json
import struct
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from benchmarks.harness.agent import run_agent
from blobsvc import AsyncBlobClient, BlobClient, BlobServer, Settings, new_job_id
from blobsvc._numbers import MAX_DIGITS, TooManyDigits, json_int, parse_decimal
from blobsvc.config import parse_address, parse_port_range, parse_size
from blobsvc.http import blob_url
from blobsvc.server.hosts import COUNTERS, MAX_BYTES_PER_HOST, MAX_HOSTS
from blobsvc.wire._protocol import MAX_HEARTBEAT_BYTES

from .conftest import ServerProcess, ServerThread, with_secret
from .test_hosts import exchange
from .test_http import fetch

# --- numbers --------------------------------------------------------------------------------


def test_the_parser_takes_up_to_max_digits_ascii_digits_and_nothing_else() -> None:
    assert parse_decimal("9" * MAX_DIGITS) == 10**MAX_DIGITS - 1
    assert parse_decimal("0" * MAX_DIGITS) == 0
    assert json_int("-" + "9" * MAX_DIGITS) == -(10**MAX_DIGITS - 1)
    for long in ("0" * (MAX_DIGITS + 1), "1" * 5000):
        with pytest.raises(TooManyDigits, match="more than the 20"):
            parse_decimal(long)
        with pytest.raises(TooManyDigits):
            json_int("-" + long)
    for bad in ("", "-1", "+1", " 1", "1_000", "\u0661", "1.0"):
        with pytest.raises(ValueError, match="not a decimal number"):
            parse_decimal(bad)


@pytest.mark.parametrize(
    "parse",
    [parse_size, parse_port_range, lambda digits: parse_address(f"h:{digits}")],
    ids=["size", "port range", "address"],
)
def test_settings_of_too_many_digits_are_a_value_error(parse: Callable[[str], object]) -> None:
    with pytest.raises(ValueError):
        parse("1" * 5000)


# Each number too long for any blob, on both ends of a range, even as leading zeros.
LONG_RANGES = [
    "bytes=0-" + "9" * 34,
    "bytes=0-" + "9" * 5000,
    "bytes=" + "1" * 5000 + "-",
    "bytes=-" + "9" * 5000,
    "bytes=" + "0" * 5000 + "1-2",
]


def test_a_range_or_expiry_of_too_many_digits_is_a_416_or_403_on_the_server_and_the_agent(
    settings: Settings, tmp_path: Path
) -> None:
    secret = b"bounds test secret"
    thread = ServerThread(replace(with_secret(settings, tmp_path, secret), http_port="0")).start()
    try:
        with BlobClient(thread.address, secret=secret, timeout=10) as client:
            key = client.put(bytes(100))
        host, port = thread.server.http_address or ("", 0)
        secret_file = tmp_path / "secret"
        with run_agent(thread.address, tmp_path / "cache", "--secret-file", str(secret_file)) as agent:
            for base in (f"http://{host}:{port}", agent.url):
                url = blob_url(base, key=key, secret=secret)
                for header in LONG_RANGES:
                    status, headers, body = fetch(url, headers={"Range": header})
                    assert (status, headers.get("Content-Range")) == (416, "bytes */100"), (base, header[:40], body)
                    assert b"digits, more than the 20" in body and body.count(b"\n") == 1
                path, query = url.split("?")
                long_expiry = f"{path}?expires={'9' * 5000}&{query.split('&')[1]}"
                status, _, body = fetch(long_expiry)
                assert status == 403 and b"malformed signed URL" in body
                assert fetch(url)[::2] == (200, bytes(100)), "and it serves on"
    finally:
        thread.stop()


@pytest.mark.parametrize("digits", ["9" * 5000, "1" + "0" * 20], ids=["5000 digits", "21 digits"])
async def test_a_heartbeat_number_of_too_many_digits_is_a_bad_request_naming_it(
    server: BlobServer, client: AsyncBlobClient, digits: str
) -> None:
    document = b'{"agent":"h:1","hits":' + digits.encode() + b"}"
    answer = await asyncio.to_thread(exchange, server, b"\x07" + struct.pack("<I", len(document)) + document)
    code, length = struct.unpack_from("<HI", answer, 7)
    assert answer[6] == 1 and code == 1  # an error frame: BAD_REQUEST
    message = answer[13 : 13 + length].decode()
    assert message.startswith("the heartbeat document: a number has") and "more than the 20" in message
    assert (await client.hosts())["hosts"] == []


# --- hosts ----------------------------------------------------------------------------------


def largest_heartbeat(agent: str, jobs: list[str]) -> dict[str, Any]:
    """A heartbeat with the longest texts, the largest counters and ``jobs``."""
    return {
        "agent": agent,
        "host": "h" * 255,
        "version": "v" * 64,
        **dict.fromkeys(COUNTERS, (1 << 64) - 1),
        "jobs": jobs,
    }


def forged_agent(number: int) -> str:
    return f"{number:0>255}:65535"  # the longest agent address


def rss(pid: int) -> int:
    """A process's resident set in bytes (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


FORGED = 1000  # hosts whose memory is measured; the bound is checked for MAX_HOSTS of them
WARM_UP = 200


@pytest.mark.slow  # some 15 s: each heartbeat costs the server a stat per job, 1,800 of them
def test_forged_hosts_with_the_largest_heartbeats_cost_the_server_a_bounded_few_bytes_each(
    spawn_server: Callable[..., ServerProcess],
) -> None:
    """Each forged host sends the largest heartbeat the server accepts (some 1,800 job ids);
    the server's resident memory grows by at most MAX_BYTES_PER_HOST a host, so MAX_HOSTS of
    them stay under MAX_HOSTS * MAX_BYTES_PER_HOST. Keeping every job id took ~200 KiB a host."""
    jobs: list[str] = []
    while (
        len(json.dumps(largest_heartbeat(forged_agent(0), [*jobs, "0" * 32]), separators=(",", ":")))
        <= MAX_HEARTBEAT_BYTES
    ):
        jobs.append(new_job_id())
    assert len(jobs) > 1800
    server = spawn_server()

    async def forge(numbers: range) -> None:
        async with AsyncBlobClient(server.address, timeout=30, retries=0) as client:
            for number in numbers:
                reply = await client.heartbeat(largest_heartbeat(forged_agent(number), jobs))
                assert reply["gone_jobs"], "the answer names the gone jobs the heartbeat listed"

    async def forge_on_four_connections(numbers: range) -> None:
        await asyncio.gather(*(forge(numbers[start::4]) for start in range(4)))

    async def measure() -> tuple[int, int]:
        await forge_on_four_connections(range(WARM_UP))  # the server's buffers and threads, warmed up
        before = rss(server.process.pid)
        await forge_on_four_connections(range(WARM_UP, WARM_UP + FORGED))
        grown = rss(server.process.pid) - before
        async with AsyncBlobClient(server.address, timeout=30) as client:
            listed = len((await client.hosts())["hosts"])
        return grown, listed

    began = time.monotonic()
    grown, listed = asyncio.run(measure())
    print(f"{FORGED} hosts in {time.monotonic() - began:.1f} s: {grown / FORGED:.0f} bytes a host")
    assert listed == WARM_UP + FORGED
    assert grown <= FORGED * MAX_BYTES_PER_HOST, f"{grown / FORGED:.0f} bytes a host"
    assert MAX_HOSTS * MAX_BYTES_PER_HOST <= 160 << 20  # the worst case docs/security.md states
