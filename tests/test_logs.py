"""Server logs: one line per request at debug level, JSON for collectors, never a secret, and a
start-up report that names what it removed and why."""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blobsvc import BlobClient, NotFound, new_job_id
from blobsvc.http import blob_url
from blobsvc.server._logs import configure

from .conftest import ServerProcess

Spawn = Callable[..., ServerProcess]
SECRET = b"correct horse battery staple"


def stderr_of(server: ServerProcess) -> str:
    assert server.terminate() == 0
    assert server.process.stderr is not None
    return server.process.stderr.read()


def test_json_lines_parse_carry_each_request_and_no_secret(spawn_server: Spawn, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    server = spawn_server("--secret-file", str(secret_file), "--log-level", "debug", "--log-format", "json")
    job = new_job_id()
    with BlobClient(server.address, secret=SECRET) as client:
        key = client.put(b"p" * 300)
        client.put(b"q", job=job, name="lib/a b.jar")
        assert client.get(key) == b"p" * 300
        with pytest.raises(NotFound):
            client.stat("0" * 64)
        client.status()
    err = stderr_of(server)
    for secret_form in (SECRET, SECRET.hex().encode(), SECRET.decode().encode("unicode_escape")):
        assert secret_form not in err.encode()
    lines: list[dict[str, Any]] = [json.loads(line) for line in err.splitlines()]  # every line is one object
    requests = [line for line in lines if line["logger"] == "blobsvc.requests"]
    assert [(r["op"], r["outcome"]) for r in requests] == [
        ("AUTH", "ok"),
        ("PUT", "ok"),
        ("PUT", "ok"),
        ("GET", "ok"),
        ("STAT", "NOT_FOUND"),
        ("STATUS", "ok"),
    ]
    put, job_put, get, stat = requests[1:5]
    assert put["bytes"] == 300 and put["level"] == "debug" and put["peer"].startswith("127.0.0.1:")
    assert job_put["target"] == f"{job}/lib/a b.jar"
    assert get["target"] == key and get["bytes"] == 300 and get["seconds"] >= 0
    assert stat["target"] == "0" * 64
    assert {"time", "level", "logger", "message"} <= lines[0].keys()


def test_text_lines_by_default_and_no_request_lines_above_debug(spawn_server: Spawn) -> None:
    server = spawn_server()
    with BlobClient(server.address) as client:
        client.put(b"quiet")
    err = stderr_of(server)
    assert " INFO blobsvc.server: serving 0 blobs (0 bytes) from " in err
    assert "PUT" not in err


def test_the_start_up_report_names_each_removed_file_and_why(spawn_server: Spawn) -> None:
    first = spawn_server()
    with BlobClient(first.address) as client:
        key = client.put(os.urandom(4096))
        client.put(b"sound")
    assert first.terminate() == 0
    obj = first.data_dir / "objects" / key
    obj.chmod(0o644)
    obj.write_bytes(b"rotten")
    (first.data_dir / "incoming" / "upload-left-behind").write_bytes(b"half")
    second = spawn_server("--log-format", "json")
    lines = [json.loads(line) for line in stderr_of(second).splitlines()]
    removed = {(line["removed"], line.get("path")) for line in lines if "removed" in line}
    assert removed == {
        ("staging", None),
        ("corrupt", str(obj)),
        ("corrupt", str(first.data_dir / "cache" / key)),
    }
    corrupt = next(line for line in lines if line.get("removed") == "corrupt")
    assert corrupt["level"] == "warning" and "no longer hash to its key" in corrupt["message"]
    assert lines[0]["message"].startswith("serving 1 blobs (5 bytes)")


def test_http_requests_are_logged_by_path_without_their_signature(spawn_server: Spawn, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET)
    server = spawn_server(
        "--secret-file", str(secret_file), "--http-port", "0", "--log-level", "debug", "--log-format", "json"
    )
    assert server.process.stdout is not None
    http_port = int(server.process.stdout.readline().rsplit(":", 1)[1])
    with BlobClient(server.address, secret=SECRET) as client:
        key = client.put(b"over http")
    url = blob_url(f"http://127.0.0.1:{http_port}", key=key, secret=SECRET)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=10) as response:
        assert response.read() == b"over http"
    err = stderr_of(server)
    assert url.rsplit("signature=", 1)[1] not in err and SECRET not in err.encode()
    lines = [json.loads(line) for line in err.splitlines()]
    (http,) = [line for line in lines if line.get("op") == "HTTP_GET"]
    assert (http["target"], http["outcome"], http["bytes"]) == (f"/blobs/{key}", "ok", len(b"over http"))


@pytest.mark.parametrize(("level", "library_says"), [("info", False), ("warning", False), ("debug", True)])
def test_libraries_info_lines_stay_out_of_the_log_but_at_debug_level(
    level: str, library_says: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    """botocore's "Found credentials" and kazoo's "Connecting to" are not an operator's news."""
    root, ours = logging.getLogger(), logging.getLogger("blobsvc")
    handlers, root_level, our_level = root.handlers[:], root.level, ours.level
    try:
        configure(level, "text")
        logging.getLogger("botocore.credentials").info("Found credentials in environment variables.")
        logging.getLogger("blobsvc.server").info("serving 0 blobs")
        logging.getLogger("kazoo.client").warning("Connection dropped")
        said = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        ours.setLevel(our_level)
    assert ("Found credentials" in said) is library_says
    assert ("serving 0 blobs" in said) is (level != "warning")
    assert "Connection dropped" in said


def test_at_error_level_libraries_say_errors_only(capsys: pytest.CaptureFixture[str]) -> None:
    """``--log-level error``: blobsvc and the libraries alike say errors only (docs/operating.md)."""
    root, ours = logging.getLogger(), logging.getLogger("blobsvc")
    handlers, root_level, our_level = root.handlers[:], root.level, ours.level
    try:
        configure("error", "text")
        logging.getLogger("kazoo.client").warning("Connection dropped")
        logging.getLogger("botocore.endpoint").error("endpoint unreachable")
        logging.getLogger("blobsvc.server").warning("a warning of ours")
        said = capsys.readouterr().err
    finally:
        root.handlers[:] = handlers
        root.setLevel(root_level)
        ours.setLevel(our_level)
    assert "endpoint unreachable" in said
    assert "Connection dropped" not in said and "a warning of ours" not in said
