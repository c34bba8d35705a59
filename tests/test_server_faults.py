"""Bad input, stalls and limits against a real server, over raw sockets on 127.0.0.1.

Every request here is built by hand from the wire contract (docs/protocol.md), byte by byte,
and every reply is decoded the same way, so the server is checked against the spec rather
than against the client's or the protocol module's reading of it. After each bad input a
test checks what the spec's error table says about the connection (open or closed), that no
staging file is left in ``incoming/``, and that the server goes on serving other clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import os
import socket
import struct
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import blake3
import pytest

from blobsvc import AsyncBlobClient, AuthFailed, AuthRequired, BlobServer, Settings

from .conftest import assert_no_staging, staging_files

# --- the wire, from the spec --------------------------------------------------------------

HELLO = b"BLOB\x01\x00"
PUT, GET, DELETE, STAT, LIST, AUTH = 0x00, 0x01, 0x02, 0x03, 0x04, 0x7F
CONTENT, JOB, JOB_ALL = 0x00, 0x01, 0x02
BAD_REQUEST = 1
NOT_FOUND = 2
DIGEST_MISMATCH = 3
TOO_LARGE = 4
AUTH_REQUIRED = 5
AUTH_FAILED = 6
BUSY = 8
UNSUPPORTED_VERSION = 10
BAD_OFFSET = 12

STEP = 5.0  # the longest any single read in these tests may wait
JOB_ID = bytes.fromhex("00112233445566778899aabbccddeeff")
MISSING_KEY = blake3.blake3(b"never stored anywhere").digest()
MiB = 1 << 20


def u16(n: int) -> bytes:
    return struct.pack("<H", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def digest(data: bytes) -> bytes:
    return blake3.blake3(data).digest()


def content(key: bytes) -> bytes:
    """CONTENT addressing of an existing key (GET, DELETE, STAT)."""
    return bytes([CONTENT]) + key


def job_name(name: bytes, job: bytes = JOB_ID) -> bytes:
    """JOB addressing; ``name`` is raw bytes so that tests can send invalid ones."""
    return bytes([JOB]) + job + u16(len(name)) + name


def put_header(length: int, target: bytes = bytes([CONTENT])) -> bytes:
    return bytes([PUT]) + target + u64(length)


def put_request(body: bytes, target: bytes = bytes([CONTENT]), trailer: bytes | None = None) -> bytes:
    return put_header(len(body), target) + body + (digest(body) if trailer is None else trailer)


def get_request(target: bytes, offset: int = 0) -> bytes:
    return bytes([GET]) + target + u64(offset)


def stat_request(target: bytes) -> bytes:
    return bytes([STAT]) + target


def delete_request(target: bytes) -> bytes:
    return bytes([DELETE]) + target


def list_request(job: bytes = JOB_ID) -> bytes:
    return bytes([LIST, JOB_ALL]) + job


class Raw:
    """One TCP connection driven byte by byte: no blobsvc code between the test and the wire."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def connect(cls, address: tuple[str, int], *, rcvbuf: int | None = None) -> Raw:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # before connecting, so the window never grows past it
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        try:
            await asyncio.get_running_loop().sock_connect(sock, address)
            reader, writer = await asyncio.open_connection(sock=sock, limit=1 << 16)
        except BaseException:
            sock.close()
            raise
        return cls(reader, writer)

    async def handshake(self) -> bytes | None:
        """Send the preamble; returns the nonce when the server requires AUTH."""
        await self.send(HELLO)
        hello = await self.read(6)
        assert hello[:5] == HELLO[:5], hello
        assert hello[5] in (0, 1), hello
        return await self.read(32) if hello[5] & 1 else None

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        async with asyncio.timeout(STEP):
            await self.writer.drain()

    async def read(self, n: int) -> bytes:
        async with asyncio.timeout(STEP):
            return await self.reader.readexactly(n)

    async def error(self) -> tuple[int, str]:
        """An error frame: u8 0x01, u16 code, u32 length, that many bytes of UTF-8."""
        status, code, length = struct.unpack("<BHI", await self.read(7))
        assert status == 0x01, f"expected an error frame, got status 0x{status:02x}"
        assert length <= 64 * 1024
        return code, (await self.read(length)).decode("utf-8")

    async def ok(self) -> None:
        assert await self.read(1) == b"\x00"

    async def put_ok(self) -> bytes:
        await self.ok()
        return await self.read(32)

    async def get_ok(self) -> tuple[int, bytes]:
        """The OK header of a GET or STAT: size and digest."""
        await self.ok()
        size, key = struct.unpack("<Q32s", await self.read(40))
        return size, key

    async def until_closed(self, timeout: float = STEP) -> bytes:
        """Everything the server still sends until it closes (a reset counts as closing)."""
        out = bytearray()
        async with asyncio.timeout(timeout):
            while True:
                try:
                    chunk = await self.reader.read(1 << 16)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                out += chunk
        return bytes(out)

    def half_close(self) -> None:
        """Send FIN: the server reads end-of-stream, and can still answer."""
        self.writer.write_eof()

    def reset(self) -> None:
        """Vanish with a TCP reset, as a killed or crashed client does."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    def close(self) -> None:
        self.writer.transport.abort()


@contextlib.asynccontextmanager
async def raw_connection(server: BlobServer, *, handshake: bool = True) -> AsyncIterator[Raw]:
    raw = await Raw.connect(server.address)
    try:
        if handshake:
            assert await raw.handshake() is None
        yield raw
    finally:
        raw.close()


async def wait_for_staging(data_dir: Path, *, size: int = 0) -> None:
    """Wait until an upload's staging file exists (and holds ``size`` bytes)."""
    async with asyncio.timeout(STEP):
        while True:
            files = staging_files(data_dir)
            if files and (data_dir / "incoming" / files[0]).stat().st_size >= size:
                return
            await asyncio.sleep(0.01)


async def wait_for_busy(server: BlobServer, count: int) -> None:
    """Wait until ``count`` connections have a request under way."""
    for _ in range(1000):
        if sum(connection.busy for connection in server.slots.connections.values()) >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"fewer than {count} requests under way")


async def assert_round_trip(raw: Raw) -> None:
    """A PUT and a GET of fresh bytes work on ``raw``."""
    data = os.urandom(3000)
    await raw.send(put_request(data) + get_request(content(digest(data))))
    assert await raw.put_ok() == digest(data)
    assert await raw.get_ok() == (len(data), digest(data))
    assert await raw.read(len(data)) == data


async def assert_healthy(server: BlobServer) -> None:
    """No staging file is left, and a new client can still store and fetch a blob."""
    await assert_no_staging(server.settings.data_dir)
    async with raw_connection(server) as raw:
        await assert_round_trip(raw)


async def expect_refusal(server: BlobServer, wire: bytes, code: int, *, handshake: bool = True) -> str:
    """Send ``wire`` (after the preamble unless told otherwise); the server must answer one
    error frame with ``code`` and then close. Returns the frame's message."""
    async with raw_connection(server, handshake=handshake) as raw:
        await raw.send(wire)
        got, message = await raw.error()
        assert got == code, message
        assert await raw.until_closed() == b"", "bytes after a closing error frame"
    await assert_healthy(server)
    return message


StartServer = Callable[..., Awaitable[BlobServer]]


@pytest.fixture
async def start_server(settings: Settings) -> AsyncIterator[StartServer]:
    """Start servers with some settings changed; all are shut down at teardown."""
    async with contextlib.AsyncExitStack() as stack:

        async def start(**changes: Any) -> BlobServer:
            return await stack.enter_async_context(BlobServer(replace(settings, **changes)))

        yield start


# --- preamble ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "wire",
    [
        # (An HTTP request gets an HTTP 400 instead: test_http.py, the binary port.)
        pytest.param(bytes.fromhex("160301020001000200"), id="tls-client-hello"),
        pytest.param(b"BLOX\x01\x00", id="last-magic-byte"),
        pytest.param(b"blob\x01\x00", id="lowercase"),
        pytest.param(b"\x00\x00", id="request-without-preamble"),
    ],
)
async def test_wrong_magic_gets_bad_request_naming_the_magic_and_close(server: BlobServer, wire: bytes) -> None:
    message = await expect_refusal(server, wire, BAD_REQUEST, handshake=False)
    assert "BLOB" in message


@pytest.mark.parametrize("version", [0, 2, 255])
async def test_unsupported_version_gets_unsupported_version_and_close(server: BlobServer, version: int) -> None:
    message = await expect_refusal(server, b"BLOB" + bytes([version, 0]), UNSUPPORTED_VERSION, handshake=False)
    assert str(version) in message


@pytest.mark.parametrize("flags", [0x01, 0x02, 0x80, 0xFF])
async def test_nonzero_preamble_flags_get_bad_request_and_close(server: BlobServer, flags: int) -> None:
    await expect_refusal(server, b"BLOB\x01" + bytes([flags]), BAD_REQUEST, handshake=False)


async def test_server_preamble_without_auth_is_exactly_magic_version_and_zero_flags(server: BlobServer) -> None:
    async with raw_connection(server, handshake=False) as raw:
        await raw.send(HELLO)
        assert await raw.read(6) == HELLO
        await raw.send(stat_request(content(MISSING_KEY)))  # and nothing else came before this
        assert (await raw.error())[0] == NOT_FOUND


# --- malformed requests -----------------------------------------------------------------


@pytest.mark.parametrize("opcode", [0x0A, 0x10, 0x7E, 0x80, 0xFF])  # 0x05 is LINK, 0x06 STATUS, 0x09 CHECKPOINTS
async def test_unknown_opcode_gets_bad_request_and_close(server: BlobServer, opcode: int) -> None:
    message = await expect_refusal(server, bytes([opcode, CONTENT]) + MISSING_KEY, BAD_REQUEST)
    assert f"{opcode:02x}" in message


@pytest.mark.parametrize("addressing", [0x03, 0x7F, 0xFF])
@pytest.mark.parametrize("op", [PUT, GET, DELETE, STAT, LIST])
async def test_unknown_addressing_byte_gets_bad_request_and_close(server: BlobServer, op: int, addressing: int) -> None:
    wire = bytes([op, addressing]) + JOB_ID + u16(1) + b"x" + u64(0)
    message = await expect_refusal(server, wire, BAD_REQUEST)
    assert f"{addressing:02x}" in message


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(bytes([PUT, JOB_ALL]) + JOB_ID + u64(5) + b"hello" + digest(b"hello"), id="PUT"),
        pytest.param(bytes([GET, JOB_ALL]) + JOB_ID + u64(0), id="GET"),
        pytest.param(bytes([STAT, JOB_ALL]) + JOB_ID, id="STAT"),
    ],
)
async def test_job_all_addressing_with_get_put_or_stat_gets_bad_request_and_close(
    server: BlobServer, wire: bytes
) -> None:
    message = await expect_refusal(server, wire, BAD_REQUEST)
    assert "JOB_ALL" in message


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(bytes([LIST]) + content(MISSING_KEY), id="CONTENT"),
        pytest.param(bytes([LIST]) + job_name(b"x"), id="JOB"),
    ],
)
async def test_list_with_other_than_job_all_addressing_gets_bad_request_and_close(
    server: BlobServer, wire: bytes
) -> None:
    await expect_refusal(server, wire, BAD_REQUEST)


BAD_NAMES = [
    pytest.param(b"", id="empty"),
    pytest.param(b"n" * 256, id="256-bytes"),
    pytest.param("😀".encode() * 64, id="256-bytes-in-64-chars"),
    pytest.param(b"a\x00b", id="nul-inside"),
    pytest.param(b"\x00", id="only-nul"),
    pytest.param(b"abc\x00", id="nul-at-end"),
    pytest.param(b"\xff\xfe", id="not-utf8"),
    pytest.param(b"\xc0\xaf", id="overlong-slash"),
    pytest.param(b"\xed\xa0\x80", id="surrogate"),
    pytest.param(b"abc\xe2\x82", id="truncated-sequence"),
]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("op", ["PUT", "GET", "STAT", "DELETE"])
async def test_bad_name_gets_bad_request_and_close(server: BlobServer, op: str, name: bytes) -> None:
    target = job_name(name)
    wire = {
        "PUT": put_request(b"body", target),
        "GET": get_request(target),
        "STAT": stat_request(target),
        "DELETE": delete_request(target),
    }[op]
    message = await expect_refusal(server, wire, BAD_REQUEST)
    assert "name" in message
    assert not server.storage.layout.job_dir(JOB_ID).exists()


async def test_a_name_of_255_bytes_and_odd_names_are_accepted_and_round_trip(server: BlobServer) -> None:
    names = ["😀" * 63 + "abc", "n" * 255, ".", "..", "a/b", "/x", "é"]
    assert len(names[0].encode()) == 255
    async with raw_connection(server) as raw:
        for index, name in enumerate(names):
            body = f"blob {index}".encode()
            await raw.send(put_request(body, job_name(name.encode())))
            assert await raw.put_ok() == digest(body)
        for index, name in enumerate(names):
            body = f"blob {index}".encode()
            await raw.send(get_request(job_name(name.encode())))
            assert await raw.get_ok() == (len(body), digest(body))
            assert await raw.read(len(body)) == body
        await raw.send(list_request())
        await raw.ok()
        (count,) = struct.unpack("<I", await raw.read(4))
        listed = set()
        for _ in range(count):
            (length,) = struct.unpack("<H", await raw.read(2))
            listed.add((await raw.read(length)).decode())
            await raw.read(40)
        assert listed == set(names)


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b"BL", id="preamble"),
        pytest.param(HELLO + bytes([GET]), id="opcode-only"),
        pytest.param(HELLO + bytes([GET, CONTENT]) + MISSING_KEY[:10], id="half-key"),
        pytest.param(HELLO + get_request(content(MISSING_KEY))[:-3], id="half-offset"),
        pytest.param(HELLO + bytes([STAT, JOB]) + JOB_ID + u16(10) + b"abc", id="half-name"),
        pytest.param(HELLO + put_header(10)[:-4], id="half-put-length"),
    ],
)
async def test_truncated_header_then_close_gets_bad_request(server: BlobServer, wire: bytes) -> None:
    async with raw_connection(server, handshake=False) as raw:
        await raw.send(wire)
        if wire.startswith(HELLO):
            assert await raw.read(6) == HELLO
        raw.half_close()
        code, message = await raw.error()
        assert code == BAD_REQUEST
        assert "closed" in message
        assert await raw.until_closed() == b""
    await assert_healthy(server)


@pytest.mark.parametrize("how", ["fin", "reset"])
@pytest.mark.parametrize("sent", [0, 1, 256 << 10, MiB - 1], ids=["no-body", "1-byte", "256KiB", "all-but-one"])
async def test_short_put_body_then_close_leaves_no_staging_file(server: BlobServer, sent: int, how: str) -> None:
    body = os.urandom(MiB)
    data_dir = server.settings.data_dir
    async with raw_connection(server) as raw:
        await raw.send(put_header(len(body), job_name(b"short")) + body[:sent])
        if sent:
            await wait_for_staging(data_dir, size=sent)
        if how == "fin":
            raw.half_close()
            code, _ = await raw.error()
            assert code == BAD_REQUEST
            assert await raw.until_closed() == b""
        else:
            raw.reset()
    await assert_healthy(server)
    async with raw_connection(server) as raw:
        await raw.send(stat_request(job_name(b"short")) + stat_request(content(digest(body))))
        assert (await raw.error())[0] == NOT_FOUND
        assert (await raw.error())[0] == NOT_FOUND


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(b"", id="before-preamble"),
        pytest.param(b"BLO", id="mid-preamble"),
        pytest.param(HELLO, id="after-preamble"),
        pytest.param(HELLO + bytes([GET, CONTENT]) + MISSING_KEY[:7], id="mid-header"),
        pytest.param(HELLO + put_header(600_000) + bytes(300_000), id="mid-body"),
        pytest.param(HELLO + put_header(600_000) + bytes(600_000), id="before-trailer"),
        pytest.param(HELLO + put_header(600_000) + bytes(600_000) + bytes(20), id="mid-trailer"),
    ],
)
async def test_a_client_reset_at_any_point_leaves_the_server_healthy(server: BlobServer, wire: bytes) -> None:
    raw = await Raw.connect(server.address)
    await raw.send(wire)
    if len(wire) > 100_000:
        await wait_for_staging(server.settings.data_dir, size=300_000)
    raw.reset()
    await assert_healthy(server)


@pytest.mark.parametrize("size", [0, 5, 300 << 10, 2 * MiB])
@pytest.mark.parametrize("addressing", ["content", "job"])
async def test_wrong_trailer_digest_gets_digest_mismatch_and_the_connection_stays_usable(
    server: BlobServer, size: int, addressing: str
) -> None:
    body = os.urandom(size)
    wrong = bytearray(digest(body))
    wrong[7] ^= 0x01
    old = b"the blob this name held before"
    target = job_name(b"model.bin") if addressing == "job" else bytes([CONTENT])
    async with raw_connection(server) as raw:
        if addressing == "job":
            await raw.send(put_request(old, target))
            assert await raw.put_ok() == digest(old)
        await raw.send(put_request(body, target, trailer=bytes(wrong)))
        code, message = await raw.error()
        assert code == DIGEST_MISMATCH
        assert digest(body).hex() in message
        # Nothing was stored, and the same connection goes on: STAT, then a good PUT.
        await raw.send(stat_request(content(digest(body))))
        assert (await raw.error())[0] == NOT_FOUND
        if addressing == "job":
            await raw.send(stat_request(target))
            assert await raw.get_ok() == (len(old), digest(old))
        await raw.send(put_request(body, target))
        assert await raw.put_ok() == digest(body)
        await raw.send(get_request(content(digest(body)) if addressing == "content" else target))
        assert await raw.get_ok() == (size, digest(body))
        assert await raw.read(size) == body
    await assert_healthy(server)


# --- limits -----------------------------------------------------------------------------


@pytest.mark.parametrize("addressing", ["content", "job"])
async def test_put_of_exactly_max_blob_size_is_accepted(start_server: StartServer, addressing: str) -> None:
    server = await start_server(max_blob_size=MiB)
    body = os.urandom(MiB)
    target = job_name(b"max") if addressing == "job" else bytes([CONTENT])
    async with raw_connection(server) as raw:
        await raw.send(put_request(body, target))
        assert await raw.put_ok() == digest(body)
    await assert_healthy(server)


@pytest.mark.parametrize("length", [MiB + 1, 8 * MiB, (1 << 64) - 1], ids=["max+1", "8x", "u64-max"])
@pytest.mark.parametrize("addressing", ["content", "job"])
async def test_oversize_put_gets_too_large_before_the_body_is_sent(
    start_server: StartServer, length: int, addressing: str
) -> None:
    server = await start_server(max_blob_size=MiB)
    target = job_name(b"big") if addressing == "job" else bytes([CONTENT])
    async with raw_connection(server) as raw:
        await raw.send(put_header(length, target))  # and not one byte of the body
        code, message = await raw.error()
        assert code == TOO_LARGE
        assert str(MiB) in message
        assert await raw.until_closed() == b""
    await assert_healthy(server)


async def test_busy_third_connection_gets_busy_at_its_preamble_and_is_closed(start_server: StartServer) -> None:
    """BUSY when every slot holds a request under way (here: two PUT bodies half sent)."""
    server = await start_server(max_connections=2)
    first, second = await Raw.connect(server.address), await Raw.connect(server.address)
    body = b"under way" * 10
    try:
        for raw in (first, second):
            assert await raw.handshake() is None
            await raw.send(put_header(len(body)) + body[:10])
        await wait_for_busy(server, 2)
        third = await Raw.connect(server.address)
        try:
            await third.send(HELLO)
            code, message = await third.error()
            assert code == BUSY
            assert "2" in message
            assert await third.until_closed() == b""
        finally:
            third.close()
        for raw in (first, second):  # the two served connections are unaffected
            await raw.send(body[10:] + digest(body))
            assert await raw.put_ok() == digest(body)
            await raw.send(stat_request(content(MISSING_KEY)))
            assert (await raw.error())[0] == NOT_FOUND
    finally:
        first.close()
    # Once a slot frees up (as the closed connection's task ends), a new client is served.
    for _ in range(100):
        fourth = await Raw.connect(server.address)
        await fourth.send(HELLO)
        if (reply := await fourth.read(6)) == HELLO:
            break
        fourth.close()
        await asyncio.sleep(0.02)
    assert reply == HELLO, "no connection was served after one of two closed"
    try:
        await assert_round_trip(fourth)
    finally:
        fourth.close()
        second.close()
    await assert_no_staging(server.settings.data_dir)


async def test_refused_connections_draining_out_do_not_hold_a_slot(start_server: StartServer) -> None:
    server = await start_server(max_connections=1)
    first = await Raw.connect(server.address)
    assert await first.handshake() is None
    await first.send(put_header(100))  # a request under way: not closed to make room
    await wait_for_busy(server, 1)
    refused = await Raw.connect(server.address)
    try:
        await refused.send(HELLO)
        assert (await refused.error())[0] == BUSY
        # ``refused`` keeps its socket open, so the server lingers on it for a while; that
        # must not count against the limit once the one served connection is gone.
        first.close()
        for _ in range(50):
            if server.slots.live == 1:
                break
            await asyncio.sleep(0.01)
        newcomer = await Raw.connect(server.address)
        try:
            await newcomer.send(HELLO)
            assert await newcomer.read(6) == HELLO
        finally:
            newcomer.close()
    finally:
        first.close()
        refused.close()


# --- timeouts ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param(b"", b"", id="silent"),
        pytest.param(b"BL", b"", id="half-preamble"),
        pytest.param(HELLO, bytes([GET, CONTENT]) + MISSING_KEY[:9], id="half-header"),
        pytest.param(HELLO + bytes([STAT, CONTENT]) + MISSING_KEY[:9], b"", id="half-header-with-preamble"),
        pytest.param(HELLO, put_header(600_000) + bytes(300_000), id="mid-body"),
        pytest.param(HELLO, put_header(600_000) + bytes(600_000), id="before-trailer"),
        pytest.param(HELLO, put_header(600_000) + bytes(600_000) + bytes(31), id="mid-trailer"),
    ],
)
async def test_stalled_client_is_closed_within_io_timeout(start_server: StartServer, first: bytes, then: bytes) -> None:
    io_timeout = 0.5
    server = await start_server(io_timeout=io_timeout, idle_timeout=30.0)
    async with raw_connection(server, handshake=False) as raw:
        await raw.send(first)
        if first.startswith(HELLO):
            assert await raw.read(6) == HELLO
        await raw.send(then)
        stalled_at = time.monotonic()
        if len(then) > 100_000:
            await wait_for_staging(server.settings.data_dir, size=300_000)
        rest = await raw.until_closed()
        elapsed = time.monotonic() - stalled_at
        if rest:  # an error frame is allowed before the close, nothing else
            _, length = struct.unpack_from("<xHI", rest)
            assert rest[0] == 0x01 and len(rest) == 7 + length, rest
        assert io_timeout * 0.8 <= elapsed <= io_timeout + 2.0, elapsed
    await assert_healthy(server)


async def test_idle_connection_is_closed_after_idle_timeout(start_server: StartServer) -> None:
    idle_timeout = 0.5
    server = await start_server(idle_timeout=idle_timeout, io_timeout=30.0)
    async with raw_connection(server) as raw:  # idle right after the preamble
        started = time.monotonic()
        assert await raw.until_closed() == b""
        assert idle_timeout * 0.8 <= time.monotonic() - started <= idle_timeout + 2.0
    async with raw_connection(server) as raw:  # idle after a request
        await raw.send(stat_request(content(MISSING_KEY)))
        assert (await raw.error())[0] == NOT_FOUND
        started = time.monotonic()
        assert await raw.until_closed() == b""
        assert idle_timeout * 0.8 <= time.monotonic() - started <= idle_timeout + 2.0
    await assert_healthy(server)


async def test_a_connection_used_more_often_than_idle_timeout_stays_open(start_server: StartServer) -> None:
    server = await start_server(idle_timeout=0.5, io_timeout=30.0)
    async with raw_connection(server) as raw:
        for _ in range(4):  # 1.2 s in all, never 0.5 s idle
            await asyncio.sleep(0.3)
            await raw.send(stat_request(content(MISSING_KEY)))
            assert (await raw.error())[0] == NOT_FOUND


async def test_a_client_that_stops_reading_a_get_is_dropped_within_io_timeout(start_server: StartServer) -> None:
    server = await start_server(io_timeout=0.3)
    body = os.urandom(32 * MiB)
    async with raw_connection(server) as raw:
        await raw.send(put_request(body))
        assert await raw.put_ok() == digest(body)
    raw = await Raw.connect(server.address, rcvbuf=64 << 10)
    try:
        assert await raw.handshake() is None
        await raw.send(get_request(content(digest(body))))
        assert await raw.get_ok() == (len(body), digest(body))
        await asyncio.sleep(1.2)  # read nothing: the server's sends stall and it gives up
        received = await raw.until_closed()
        assert len(received) < len(body)
    finally:
        raw.close()
    await assert_healthy(server)


# --- errors that keep the connection ----------------------------------------------------


@pytest.mark.parametrize("size", [0, 5, 100 << 10])
async def test_get_at_offset_equal_to_size_is_ok_with_no_bytes(server: BlobServer, size: int) -> None:
    body = os.urandom(size)
    target = job_name(b"resumable")
    async with raw_connection(server) as raw:
        await raw.send(put_request(body, target))
        assert await raw.put_ok() == digest(body)
        await raw.send(get_request(target, offset=size) + stat_request(content(MISSING_KEY)))
        assert await raw.get_ok() == (size, digest(body))
        assert (await raw.error())[0] == NOT_FOUND  # the very next bytes: no body came
        if size:
            await raw.send(get_request(target, offset=size - 1))
            assert await raw.get_ok() == (size, digest(body))
            assert await raw.read(1) == body[-1:]


@pytest.mark.parametrize("past", [1, 1000, None], ids=["size+1", "size+1000", "u64-max"])
async def test_get_past_the_end_gets_bad_offset_and_the_connection_stays_open(
    server: BlobServer, past: int | None
) -> None:
    body = os.urandom(100 << 10)
    key = digest(body)
    offset = (1 << 64) - 1 if past is None else len(body) + past
    async with raw_connection(server) as raw:
        await raw.send(put_request(body))
        assert await raw.put_ok() == key
        await raw.send(get_request(content(key), offset=offset))
        code, message = await raw.error()
        assert code == BAD_OFFSET
        assert str(offset) in message
        await raw.send(get_request(content(key), offset=len(body) - 10))
        assert await raw.get_ok() == (len(body), key)
        assert await raw.read(10) == body[-10:]
    await assert_healthy(server)


async def test_not_found_keeps_the_connection_open(server: BlobServer) -> None:
    other_job = bytes(range(16))
    async with raw_connection(server) as raw:
        await raw.send(get_request(content(MISSING_KEY)))
        assert (await raw.error())[0] == NOT_FOUND
        await raw.send(stat_request(content(MISSING_KEY)))
        assert (await raw.error())[0] == NOT_FOUND
        await raw.send(get_request(job_name(b"nothing", other_job), offset=5))
        assert (await raw.error())[0] == NOT_FOUND
        await raw.send(stat_request(job_name(b"nothing", other_job)))
        assert (await raw.error())[0] == NOT_FOUND
        # Deleting what is not there is OK, and listing an unknown job gives 0 entries.
        await raw.send(delete_request(content(MISSING_KEY)) + delete_request(bytes([JOB_ALL]) + other_job))
        await raw.ok()
        await raw.ok()
        await raw.send(list_request(other_job))
        await raw.ok()
        assert await raw.read(4) == b"\x00\x00\x00\x00"
        await raw.send(put_request(b"after all that"))
        assert await raw.put_ok() == digest(b"after all that")


async def test_pipelined_requests_are_answered_in_order_up_to_a_bad_one(server: BlobServer) -> None:
    good = b"pipelined"
    async with raw_connection(server, handshake=False) as raw:
        await raw.send(
            HELLO
            + put_request(good)
            + stat_request(content(MISSING_KEY))
            + stat_request(content(digest(good)))
            + bytes([0x42])  # no such opcode
            + stat_request(content(digest(good)))  # never answered
        )
        assert await raw.read(6) == HELLO
        assert await raw.put_ok() == digest(good)
        assert (await raw.error())[0] == NOT_FOUND
        assert await raw.get_ok() == (len(good), digest(good))
        assert (await raw.error())[0] == BAD_REQUEST
        assert await raw.until_closed() == b""
    await assert_healthy(server)


# --- authentication ---------------------------------------------------------------------

SECRET = b"correct horse battery staple"


@pytest.fixture
async def auth_server(start_server: StartServer, tmp_path: Path) -> BlobServer:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")  # surrounding whitespace is not part of it
    return await start_server(secret_file=secret_file)


def mac(nonce: bytes, secret: bytes = SECRET) -> bytes:
    return hmac.new(secret, nonce, hashlib.sha256).digest()


async def assert_healthy_with_auth(server: BlobServer) -> None:
    """No staging file is left, and a client that authenticates is still served."""
    await assert_no_staging(server.settings.data_dir)
    async with raw_connection(server, handshake=False) as raw:
        nonce = await raw.handshake()
        assert nonce is not None
        await raw.send(bytes([AUTH]) + mac(nonce))
        await raw.ok()
        await assert_round_trip(raw)


async def test_auth_server_preamble_sets_bit_0_and_a_fresh_nonce_per_connection(auth_server: BlobServer) -> None:
    nonces = []
    for _ in range(3):
        raw = await Raw.connect(auth_server.address)
        try:
            await raw.send(HELLO)
            assert await raw.read(6) == b"BLOB\x01\x01"
            nonces.append(await raw.read(32))
        finally:
            raw.close()
    assert len(set(nonces)) == 3


@pytest.mark.parametrize(
    "wire",
    [
        pytest.param(stat_request(content(MISSING_KEY)), id="STAT"),
        pytest.param(get_request(content(MISSING_KEY)), id="GET"),
        pytest.param(put_header(5) + b"hello" + digest(b"hello"), id="PUT"),
        pytest.param(delete_request(bytes([JOB_ALL]) + JOB_ID), id="DELETE"),
        pytest.param(list_request(), id="LIST"),
    ],
)
async def test_request_before_auth_gets_auth_required_and_close(auth_server: BlobServer, wire: bytes) -> None:
    async with raw_connection(auth_server, handshake=False) as raw:
        nonce = await raw.handshake()
        assert nonce is not None
        await raw.send(wire)
        assert (await raw.error())[0] == AUTH_REQUIRED
        assert await raw.until_closed() == b""
    assert not list(auth_server.storage.layout.objects.iterdir())  # the PUT stored nothing
    await assert_healthy_with_auth(auth_server)


@pytest.mark.parametrize("wrong", ["other-secret", "other-nonce", "zeros", "sha1-length-padded"])
async def test_wrong_hmac_gets_auth_failed_and_close(auth_server: BlobServer, wrong: str) -> None:
    other = await Raw.connect(auth_server.address)
    try:
        other_nonce = await other.handshake()
        assert other_nonce is not None
        async with raw_connection(auth_server, handshake=False) as raw:
            nonce = await raw.handshake()
            assert nonce is not None
            answer = {
                "other-secret": mac(nonce, b"correct horse battery stapler"),
                "other-nonce": mac(other_nonce),  # a replay of another connection's answer
                "zeros": bytes(32),
                "sha1-length-padded": hmac.new(SECRET, nonce, hashlib.sha1).digest() + bytes(12),
            }[wrong]
            await raw.send(bytes([AUTH]) + answer)
            assert (await raw.error())[0] == AUTH_FAILED
            assert await raw.until_closed() == b""
    finally:
        other.close()
    await assert_healthy_with_auth(auth_server)


async def test_right_hmac_gets_ok_and_requests_work(auth_server: BlobServer) -> None:
    body = b"authenticated bytes"
    async with raw_connection(auth_server, handshake=False) as raw:
        nonce = await raw.handshake()
        assert nonce is not None
        await raw.send(bytes([AUTH]) + mac(nonce) + stat_request(content(MISSING_KEY)))
        assert await raw.read(1) == b"\x00"  # OK for AUTH is the status byte alone
        assert (await raw.error())[0] == NOT_FOUND
        await raw.send(put_request(body) + get_request(content(digest(body))))
        assert await raw.put_ok() == digest(body)
        assert await raw.get_ok() == (len(body), digest(body))
        assert await raw.read(len(body)) == body


async def test_async_client_with_the_secret_works_and_without_it_is_refused(auth_server: BlobServer) -> None:
    async with AsyncBlobClient(auth_server.address, secret=SECRET, timeout=STEP, retries=0) as client:
        key = await client.put(b"through the client")
        assert await client.get(key) == b"through the client"
        await client.put(b"a job blob", job=JOB_ID.hex(), name="a")
        assert await client.get(job=JOB_ID.hex(), name="a") == b"a job blob"
        assert [info.name for info in await client.list(JOB_ID.hex())] == ["a"]
    async with AsyncBlobClient(auth_server.address, timeout=STEP, retries=0) as client:
        with pytest.raises(AuthRequired):
            await client.get(key)
    async with AsyncBlobClient(auth_server.address, secret=b"not it", timeout=STEP, retries=0) as client:
        with pytest.raises(AuthFailed):
            await client.get(key)
