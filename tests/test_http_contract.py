"""The HTTP contract of docs/protocol.md ("The HTTP face") over raw sockets, where clients such
as curl find its edges: a HEAD with a body, the 16 KiB header limit however TCP splits the
bytes, closing after a refusal, and errors that say what was wrong without echoing it whole.
The server's face and the agent's keep the same contract, and each test runs on both."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.harness.agent import run_agent
from blobsvc import BlobClient, Settings

from .conftest import ServerThread


class Face:
    """A port speaking the HTTP face, and the key of a blob it serves."""

    def __init__(self, port: int, key: str) -> None:
        self.port = port
        self.key = key


@pytest.fixture(params=["server", "agent"])
def face(request: pytest.FixtureRequest, settings: Settings, tmp_path: Path) -> Iterator[Face]:
    """The server's HTTP face, or an agent's in front of the server: one contract for both."""
    thread = ServerThread(replace(settings, http_port="0")).start()
    try:
        with BlobClient(thread.address, timeout=10) as client:
            key = client.put(b"hello")
        if request.param == "agent":
            with run_agent(thread.address, tmp_path / "cache") as agent:
                yield Face(agent.port, key)
            return
        address = thread.server.http_address
        assert address is not None
        yield Face(address[1], key)
    finally:
        thread.stop()


def exchange(port: int, pieces: list[bytes]) -> bytes:
    """Send ``pieces`` one write each, then read until the server closes; a server that keeps
    the connection open fails the test through the socket's timeout."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for piece in pieces:
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):  # refused mid-send: the answer is read below
                break
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
        return received


def status_of(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer[9:12])


def request_of(size: int, path: str = "/") -> bytes:
    """A GET of ``path`` whose request line and headers come to exactly ``size`` bytes."""
    start = f"GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\nX-Pad: ".encode()
    return start + b"a" * (size - len(start) - 4) + b"\r\n\r\n"


@pytest.mark.parametrize("path", ["/blobs/{key}", "/nothing/here"])
def test_a_head_with_a_body_is_answered_then_closed(face: Face, path: str) -> None:
    request = f"HEAD {path.format(key=face.key)} HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello"
    answer = exchange(face.port, [request.encode()])
    head, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) in (200, 404) and b"connection: close" in head.lower()
    assert body == b"", "a HEAD answer has no body"


@pytest.mark.parametrize("kib", [16.5, 17.5, 24.6, 41, 61.5])
@pytest.mark.parametrize("split", ["whole", "1 KiB writes"])
def test_a_header_over_16_kib_gets_431_however_it_arrives(face: Face, kib: float, split: str) -> None:
    request = request_of(int(kib * 1024))
    pieces = [request] if split == "whole" else [request[i : i + 1024] for i in range(0, len(request), 1024)]
    answer = exchange(face.port, pieces)
    assert status_of(answer) == 431 and b"too large" in answer


def test_220_headers_of_100_bytes_get_431(face: Face) -> None:
    lines = b"".join(b"X-H%03d: " % i + b"v" * 90 + b"\r\n" for i in range(220))
    answer = exchange(face.port, [f"GET /blobs/{face.key} HTTP/1.1\r\nHost: h\r\n".encode() + lines + b"\r\n"])
    assert status_of(answer) == 431


def test_a_header_of_16_kib_is_served(face: Face) -> None:
    answer = exchange(face.port, [request_of(16 << 10, f"/blobs/{face.key}")])
    assert status_of(answer) == 200 and answer.endswith(b"hello")


@pytest.mark.parametrize("method", ["DELETE", "OPTIONS"])
def test_a_refused_method_closes_the_connection(face: Face, method: str) -> None:
    answer = exchange(face.port, [f"{method} /blobs/{face.key} HTTP/1.1\r\nHost: h\r\n\r\n".encode()])
    assert status_of(answer) == 405 and b"connection: close" in answer.lower()


def test_an_over_long_path_is_refused_without_echoing_it(face: Face) -> None:
    path = "/blobs/" + "a" * 15000
    answer = exchange(face.port, [f"GET {path} HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n".encode()])
    _, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == 400 and b"64 hex characters" in body
    assert len(body) < 300 and b"15000 characters" in body
