"""The read-only HTTP face: real servers on 127.0.0.1, stdlib http.client / urllib, curl and pip."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import blake3
import pytest
from click.testing import CliRunner

from blobsvc import BlobClient, InvalidArgument, RemoteProtocolError, Settings, new_job_id
from blobsvc.cli import main
from blobsvc.http import blob_path, blob_url, parse_range, url_signature

from .conftest import ServerProcess, ServerThread

SECRET = b"http face test secret"
DOCS = Path(__file__).parent.parent / "docs"


@dataclass
class Http:
    """A running server with its HTTP face on, and a binary client to put blobs with."""

    thread: ServerThread
    client: BlobClient
    secret: bytes | None

    @property
    def base(self) -> str:
        address = self.thread.server.http_address
        assert address is not None
        return f"http://{address[0]}:{address[1]}"

    @property
    def port(self) -> int:
        address = self.thread.server.http_address
        assert address is not None
        return address[1]

    def url(self, *, key: str | None = None, job: str | None = None, name: str | None = None) -> str:
        return blob_url(self.base, key=key, job=job, name=name, secret=self.secret)

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)


def _start(settings: Settings, secret: bytes | None) -> Iterator[Http]:
    thread = ServerThread(replace(settings, http_port="0")).start()
    try:
        with BlobClient(thread.address, secret=secret, timeout=10) as client:
            yield Http(thread, client, secret)
    finally:
        thread.stop()


@pytest.fixture
def face(settings: Settings) -> Iterator[Http]:
    yield from _start(settings, None)


@pytest.fixture
def signed_face(settings: Settings, tmp_path: Path) -> Iterator[Http]:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    yield from _start(replace(settings, secret_file=secret_file), SECRET)


def fetch(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and body of one request; error statuses are answers too."""
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def raw_exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh socket and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        received = b""
        while chunk := sock.recv(1 << 16):
            received += chunk
        return received


# --- URLs and ranges on their own --------------------------------------------------------


def test_job_blob_paths_keep_slashes_and_encode_the_rest() -> None:
    job = "0" * 32
    assert blob_path(job=job, name="lib/udfs.jar") == f"/jobs/{job}/lib/udfs.jar"
    assert blob_path(job=job, name="a b/ü%?.bin") == f"/jobs/{job}/a%20b/%C3%BC%25%3F.bin"
    assert blob_path(job=job, name="../x/./y") == f"/jobs/{job}/%2E%2E/x/%2E/y"
    assert blob_path(key="AB" * 32, name="app.jar") == f"/blobs/{'ab' * 32}/app.jar"


@pytest.mark.parametrize(
    "blob",
    [
        {},
        {"job": "0" * 32},
        {"key": "ab" * 32, "job": "0" * 32, "name": "x"},
        {"key": "abc"},
        {"job": "0" * 32, "name": ""},
        {"job": "0" * 32, "name": "x" * 256},
    ],
)
def test_blob_urls_need_a_key_or_a_job_and_a_valid_name(blob: dict[str, str]) -> None:
    with pytest.raises(InvalidArgument):
        blob_url("http://h:1", key=blob.get("key"), job=blob.get("job"), name=blob.get("name"))


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-9", range(0, 10)),
        ("bytes=90-", range(90, 100)),
        ("bytes=-5", range(95, 100)),
        ("bytes=-500", range(0, 100)),
        ("bytes=95-1000", range(95, 100)),
        ("bytes=100-", range(100, 100)),  # unsatisfiable
        ("bytes=-0", range(100, 0)),  # unsatisfiable
        ("bytes=5-1", None),  # invalid: ignored
        ("bytes=0-1,5-6", None),  # several ranges: answered whole
        ("items=0-1", None),
        ("bytes=-", None),
    ],
)
def test_range_headers(header: str, expected: range | None) -> None:
    span = parse_range(header, 100)
    assert span == expected if expected is None or expected else span is not None and not span


# --- reads ----------------------------------------------------------------------------------


def test_get_and_head_of_a_content_blob(face: Http) -> None:
    data = os.urandom(1000)
    key = face.client.put(data)
    status, headers, body = fetch(face.url(key=key))
    assert (status, body) == (200, data)
    assert headers["Content-Length"] == "1000"
    assert headers["ETag"] == f'"{key}"'
    assert headers["Accept-Ranges"] == "bytes"
    assert headers["Content-Type"] == "application/octet-stream"
    status, head_headers, body = fetch(face.url(key=key), "HEAD")
    assert (status, body, head_headers["Content-Length"], head_headers["ETag"]) == (200, b"", "1000", f'"{key}"')
    # The same content under a file name of the caller's choice, for fetchers that name files by URL.
    assert fetch(face.url(key=key, name="app.jar"))[2] == data


@pytest.mark.parametrize("name", ["lib/udfs.jar", "modèle/données ü.bin", "a b/%41?#&=+.whl", "../up/./x", "日本"])
def test_job_blobs_by_name(face: Http, name: str) -> None:
    job, data = new_job_id(), f"bytes of {name}".encode()
    face.client.put(data, job=job, name=name)
    status, _, body = fetch(face.url(job=job, name=name))
    assert (status, body) == (200, data)


def test_the_last_url_segment_is_the_basename(face: Http) -> None:
    job = new_job_id()
    face.client.put(b"jar", job=job, name="lib/udfs.jar")
    url = face.url(job=job, name="lib/udfs.jar")
    assert url.endswith(f"/jobs/{job}/lib/udfs.jar")
    # %2F for "/" names the same blob.
    assert fetch(url.replace("lib/udfs.jar", "lib%2Fudfs.jar"))[2] == b"jar"


def test_keep_alive_serves_several_requests_on_one_connection(face: Http) -> None:
    keys = [face.client.put(bytes([i]) * 100) for i in range(3)]
    connection = face.connection()
    try:
        for i, key in enumerate(keys * 2):
            connection.request("GET" if i % 2 else "HEAD", blob_path(key=key))
            response = connection.getresponse()
            body = response.read()
            assert response.status == 200 and body == (bytes([i % 3]) * 100 if i % 2 else b"")
    finally:
        connection.close()
    assert face.thread.server.requests["HTTP_GET"] == 3 and face.thread.server.requests["HTTP_HEAD"] == 3


@pytest.mark.parametrize(
    ("header", "status", "part", "content_range"),
    [
        ("bytes=0-9", 206, slice(0, 10), "bytes 0-9/1000"),
        ("bytes=990-", 206, slice(990, 1000), "bytes 990-999/1000"),
        ("bytes=-1", 206, slice(999, 1000), "bytes 999-999/1000"),
        ("bytes=500-5000", 206, slice(500, 1000), "bytes 500-999/1000"),
        ("bytes=0-1, 5-9", 200, slice(0, 1000), None),
        ("bytes=1000-", 416, None, "bytes */1000"),
        ("bytes=-0", 416, None, "bytes */1000"),
    ],
)
def test_range_requests(face: Http, header: str, status: int, part: slice | None, content_range: str | None) -> None:
    data = os.urandom(1000)
    key = face.client.put(data)
    got_status, headers, body = fetch(face.url(key=key), headers={"Range": header})
    assert got_status == status
    assert headers.get("Content-Range") == content_range
    if part is not None:
        assert body == data[part] and headers["Content-Length"] == str(len(body))


def test_if_range_with_another_etag_sends_the_whole_blob(face: Http) -> None:
    data = os.urandom(100)
    key = face.client.put(data)
    assert fetch(face.url(key=key), headers={"Range": "bytes=0-9", "If-Range": f'"{key}"'})[2] == data[:10]
    assert fetch(face.url(key=key), headers={"Range": "bytes=0-9", "If-Range": '"stale"'})[:3:2] == (200, data)


@pytest.mark.parametrize(
    ("if_none_match", "status"), [("{etag}", 304), ('W/{etag}, "x"', 304), ("*", 304), ('"other"', 200)]
)
def test_if_none_match(face: Http, if_none_match: str, status: int) -> None:
    job = new_job_id()
    key = face.client.put(b"cached", job=job, name="f")
    got, headers, body = fetch(
        face.url(job=job, name="f"), headers={"If-None-Match": if_none_match.format(etag=f'"{key}"')}
    )
    assert got == status and headers["ETag"] == f'"{key}"'
    assert body == (b"" if status == 304 else b"cached")


def test_a_large_blob_goes_out_whole_and_in_ranges(face: Http, tmp_path: Path) -> None:
    source = tmp_path / "big"
    source.write_bytes(os.urandom(24 << 20))
    key = face.client.put(source)
    connection = face.connection()
    try:
        connection.request("GET", blob_path(key=key))
        response = connection.getresponse()
        hasher = blake3.blake3()
        while chunk := response.read(1 << 20):
            hasher.update(chunk)
        assert hasher.hexdigest() == key
        connection.request("GET", blob_path(key=key), headers={"Range": "bytes=1000000-9999999"})
        assert connection.getresponse().read() == source.read_bytes()[1000000:10000000]
    finally:
        connection.close()


# --- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "status", "words"),
    [
        (f"/blobs/{'ab' * 32}", 404, "no blob with key"),
        (f"/jobs/{'0' * 32}/missing.jar", 404, "no blob named 'missing.jar'"),
        ("/", 404, "/blobs/<key>"),
        ("/favicon.ico", 404, "/blobs/<key>"),
        ("/blobs/xyz", 400, "key"),
        ("/jobs/xyz/name", 400, "job id"),
        (f"/jobs/{'0' * 32}/%FF", 400, "UTF-8"),
    ],
)
def test_missing_and_malformed_paths(face: Http, path: str, status: int, words: str) -> None:
    got, headers, body = fetch(face.base + path)
    assert got == status and words.lower() in body.decode().lower()
    assert headers["Content-Type"].startswith("text/plain")


@pytest.mark.parametrize("method", ["PUT", "POST", "DELETE"])
def test_writes_are_refused_with_405(face: Http, method: str) -> None:
    key = face.client.put(b"x")
    status, headers, body = fetch(
        face.url(key=key), method, headers={"Content-Length": "3"} if method != "DELETE" else {}
    )
    assert status == 405 and headers["Allow"] == "GET, HEAD" and b"read-only" in body


def test_a_request_body_is_not_read_and_the_connection_closes(face: Http) -> None:
    answer = raw_exchange(
        face.port, b"POST /blobs/x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n" + b"x" * 1000
    )
    assert answer.startswith(b"HTTP/1.1 405 ") and b"connection: close" in answer.lower()


def test_a_bad_request_line_gets_400(face: Http) -> None:
    answer = raw_exchange(face.port, b"GARBAGE\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"bad request" in answer


def test_an_oversized_header_gets_431(face: Http) -> None:
    answer = raw_exchange(face.port, b"GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + b"a" * (64 << 10) + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 ") and b"too large" in answer


def test_an_http_client_at_the_binary_port_gets_a_400_naming_it(face: Http) -> None:
    """curl at the binary port reads an HTTP answer at once (it could not show an error frame)."""
    _, port = face.thread.server.address
    status, _, body = fetch(f"http://127.0.0.1:{port}/blobs/{'0' * 64}")
    assert status == 400
    assert body.startswith(b"this is blobsvc's binary protocol port: HTTP (curl, pip, Spark's fetcher) goes to")


def test_a_binary_client_at_the_http_port_is_told_so_in_one_line(face: Http) -> None:
    """The HTTP face answers a binary preamble at once; the client recognises HTTP, does not retry."""
    wrong = f"127.0.0.1:{face.port}"
    expected = f"{wrong} is a blobsvc HTTP face (a server's --http-port, or an agent), not the binary protocol port"
    with BlobClient(wrong, timeout=60, retries=3) as client, pytest.raises(RemoteProtocolError) as raised:
        client.stat("0" * 64)
    assert str(raised.value) == expected
    result = CliRunner().invoke(main, ["get", "0" * 64, "-s", wrong])
    assert result.exit_code == 1
    assert result.output == f"Error: {expected}\n"
    answer = raw_exchange(face.port, b"BLOB\x01\x00")
    assert answer.startswith(b"HTTP/1.1 400 ") and b"binary protocol port" in answer
    for page in ("http.md", "protocol.md"):  # quoted as it is
        assert expected.replace(wrong, "`HOST:PORT") + "`" in " ".join((DOCS / page).read_text().split())


def test_connections_over_the_shared_limit_get_503(settings: Settings) -> None:
    """503 when the one slot holds a transfer under way (an idle connection would make room)."""
    for face in _start(replace(settings, max_connections=1), None):
        key = face.client.put(bytes(32 << 20))
        held = face.connection()
        try:
            held.request("GET", f"/blobs/{key}")
            assert held.getresponse().status == 200  # its body, unread, keeps the server sending
            assert fetch(face.base + "/")[0] == 503
        finally:
            held.close()


def test_a_refused_connection_draining_out_does_not_hold_a_slot(settings: Settings) -> None:
    """The server lingers on a 503'd connection whose client keeps it open; once the transfer
    that filled the one slot is gone, a newcomer is served, not refused again."""
    for face in _start(replace(settings, max_connections=1), None):
        key = face.client.put(bytes(32 << 20))
        held = face.connection()
        with socket.create_connection(("127.0.0.1", face.port), timeout=10) as refused:
            try:
                held.request("GET", f"/blobs/{key}")
                assert held.getresponse().status == 200  # its body, unread, keeps the server sending
                refused.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                assert refused.recv(1 << 16).startswith(b"HTTP/1.1 503")
            finally:
                held.close()
            for _ in range(100):  # until only the refused connection, lingering for 1 s, is left
                if len(face.thread.server.slots.connections) <= 1:
                    break
                time.sleep(0.01)
            assert fetch(face.base + "/")[0] == 404  # served: the refused one holds no slot


def test_shutdown_closes_the_http_listener(settings: Settings) -> None:
    for face in _start(settings, None):
        port = face.port
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


# --- signed URLs ----------------------------------------------------------------------------


def test_a_signed_url_reads_the_blob(signed_face: Http) -> None:
    job = new_job_id()
    signed_face.client.put(b"secret jar", job=job, name="lib/app.jar")
    url = signed_face.url(job=job, name="lib/app.jar")
    assert "expires=" in url and "signature=" in url
    assert fetch(url)[::2] == (200, b"secret jar")
    assert fetch(url, "HEAD")[0] == 200


def _forbidden(url: str) -> str:
    status, _, body = fetch(url)
    assert status == 403
    return body.decode()


def test_unsigned_tampered_and_expired_urls_are_refused(signed_face: Http) -> None:
    job = new_job_id()
    signed_face.client.put(b"a", job=job, name="a.jar")
    signed_face.client.put(b"b", job=job, name="b.jar")
    good = signed_face.url(job=job, name="a.jar")
    assert "requires a signed URL" in _forbidden(good.split("?")[0])
    assert "bad signature" in _forbidden(good.replace("a.jar", "b.jar"))
    path, query = good.split("?")
    expires = int(query.split("&")[0].removeprefix("expires="))
    assert "bad signature" in _forbidden(good.replace(f"expires={expires}", f"expires={expires + 1000}"))
    assert "bad signature" in _forbidden(blob_url(signed_face.base, job=job, name="a.jar", secret=b"wrong"))
    assert "malformed" in _forbidden(f"{path}?expires=soon&signature=00")
    expired = blob_url(signed_face.base, job=job, name="a.jar", secret=SECRET, expires_in=-10)
    assert "expired" in _forbidden(expired)


def test_a_secret_file_read_as_is_signs_as_the_server_reads_it(signed_face: Http) -> None:
    job = new_job_id()
    signed_face.client.put(b"a", job=job, name="a.jar")
    for secret in (SECRET + b"\n", SECRET.decode() + "\n", b" " + SECRET + b"\r\n"):
        assert fetch(blob_url(signed_face.base, job=job, name="a.jar", secret=secret))[::2] == (200, b"a")


def test_a_signature_covers_the_blob_not_the_spelling_of_its_url(signed_face: Http) -> None:
    job = new_job_id()
    signed_face.client.put(b"a", job=job, name="lib/a.jar")
    expires = int(time.time()) + 60
    signature = url_signature(SECRET, blob_path(job=job, name="lib/a.jar"), expires)
    url = f"{signed_face.base}/jobs/{job.upper()}/lib%2Fa.jar?signature={signature}&expires={expires}"
    assert fetch(url)[::2] == (200, b"a")


# --- other clients --------------------------------------------------------------------------


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_curl_downloads_and_resumes(face: Http, tmp_path: Path) -> None:
    data = os.urandom(300_000)
    job = new_job_id()
    face.client.put(data, job=job, name="model.bin")
    url = face.url(job=job, name="model.bin")
    out = tmp_path / "model.bin"
    out.write_bytes(data[:1000])  # a broken earlier download
    subprocess.run(["curl", "-sSf", "-C", "-", "-o", str(out), url], check=True, timeout=30)
    assert out.read_bytes() == data
    head = subprocess.run(["curl", "-sSfI", url], check=True, timeout=30, capture_output=True, text=True).stdout
    assert "content-length: 300000" in head.lower()


def _tiny_wheel(path: Path) -> None:
    """A pure-Python wheel with one module, RECORD and all, built by hand (no build tools)."""
    files = {
        "blobsvc_demo.py": b"ANSWER = 42\n",
        "blobsvc_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: blobsvc-demo\nVersion: 1.0\n",
        "blobsvc_demo-1.0.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = ""
    for name, content in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
        record += f"{name},sha256={digest},{len(content)}\n"
    record += "blobsvc_demo-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, content in files.items():
            wheel.writestr(name, content)
        wheel.writestr("blobsvc_demo-1.0.dist-info/RECORD", record)


def test_pip_installs_a_wheel_from_a_signed_url(signed_face: Http, tmp_path: Path) -> None:
    wheel = tmp_path / "blobsvc_demo-1.0-py3-none-any.whl"
    _tiny_wheel(wheel)
    job = new_job_id()
    signed_face.client.put(wheel, job=job, name=f"wheels/{wheel.name}")
    url = signed_face.url(job=job, name=f"wheels/{wheel.name}")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target), url],
        check=True,
        timeout=120,
        capture_output=True,
    )
    assert (target / "blobsvc_demo.py").read_text() == "ANSWER = 42\n"


# --- command line ---------------------------------------------------------------------------


def test_blobsvc_url_prints_a_working_signed_url(signed_face: Http, tmp_path: Path) -> None:
    job = new_job_id()
    signed_face.client.put(b"via cli", job=job, name="f.txt")
    secret_file = tmp_path / "secret"  # written by the fixture
    args = ["url", "--job", job, "--name", "f.txt", "--secret-file", str(secret_file), "--expires-in", "60"]
    result = CliRunner().invoke(main, [*args, "--http-url", signed_face.base])
    assert result.exit_code == 0, result.output
    assert fetch(result.stdout.strip())[::2] == (200, b"via cli")
    derived = CliRunner().invoke(main, [*args, "-s", signed_face.thread.address, "--http-port", str(signed_face.port)])
    assert derived.exit_code == 0 and derived.stdout.strip().startswith(f"http://127.0.0.1:{signed_face.port}/jobs/")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["url", "--job", "0" * 32, "--name", "f"], "--http-url"),
        (["url"], "name the blob"),
        (["url", "abc", "--http-url", "http://h:1"], "hex"),
        (["url", "ab" * 32, "--job", "0" * 32, "--name", "f", "--http-url", "http://h:1"], "not both"),
    ],
)
def test_blobsvc_url_usage_errors(args: list[str], words: str) -> None:
    result = CliRunner().invoke(main, args, env={"BLOBSVC_HTTP_PORT": None})
    assert result.exit_code == 2 and words in result.stderr


def test_serve_prints_the_http_address(spawn_server: Callable[..., ServerProcess]) -> None:
    process = spawn_server("--http-port", "0")
    assert process.process.stdout is not None
    line = process.process.stdout.readline()
    assert line.startswith("http listening on 127.0.0.1:")
    port = int(line.rsplit(":", 1)[1])
    assert fetch(f"http://127.0.0.1:{port}/")[0] == 404
    assert process.terminate() == 0


def test_an_idle_keep_alive_connection_is_closed_after_idle_timeout(settings: Settings) -> None:
    for face in _start(replace(settings, idle_timeout=0.3), None):
        with socket.create_connection(("127.0.0.1", face.port), timeout=10) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
            answer = b""
            while chunk := sock.recv(1 << 16):  # ends when the server closes the idle connection
                answer += chunk
            assert answer.startswith(b"HTTP/1.1 404 ") and b"connection: close" not in answer.lower()


def test_shutdown_lets_a_transfer_in_flight_finish(settings: Settings, tmp_path: Path) -> None:
    source = tmp_path / "big"
    source.write_bytes(os.urandom(32 << 20))
    for face in _start(settings, None):
        key = face.client.put(source)
        connection = face.connection()
        try:
            connection.request("GET", blob_path(key=key))
            response = connection.getresponse()
            hasher = blake3.blake3(response.read(1 << 20))
            server = face.thread.server
            stopping = asyncio.run_coroutine_threadsafe(server.shutdown(10.0), face.thread.loop)
            while not server.slots.closing:
                time.sleep(0.01)
            while chunk := response.read(1 << 20):
                hasher.update(chunk)
            assert hasher.hexdigest() == key
            stopping.result(10)
            with pytest.raises((OSError, http.client.HTTPException)):
                connection.request("GET", "/")
                connection.getresponse()
        finally:
            connection.close()
