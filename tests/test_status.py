"""The STATUS request and ``blobsvc status``, against live servers and a dead one."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from blobsvc import AsyncBlobClient, AuthRequired, BlobServer, Settings, new_job_id
from blobsvc.cli import main

from .conftest import ServerThread


async def test_status_tells_what_the_server_stores_and_serves(server: BlobServer, client: AsyncBlobClient) -> None:
    await client.put(b"a" * 10)
    await client.put(b"a" * 10, job=new_job_id(), name="same bytes")  # one blob, two names
    await client.put(b"b" * 5)
    status = await client.status()
    assert status["version"] and status["role"] == "standalone"
    assert status["address"] == "{}:{}".format(*server.address)
    assert status["blobs"] == 2 and status["bytes"] == 15
    assert status["disk_free_bytes"] > 0 and status["disk_total_bytes"] >= status["disk_free_bytes"]
    assert status["connections"] == 1
    assert status["requests"] == {"PUT": 3, "STATUS": 1} and status["requests_total"] == 4
    assert status["uptime_seconds"] >= 0
    assert status["busy_refusals"] == status["uploads_in_flight"] == status["staging_files"] == 0
    assert status["journal_checkpoints"] == status["replayed_at_start"] == 0


async def test_stored_counts_follow_deletes(server: BlobServer, client: AsyncBlobClient) -> None:
    job = new_job_id()
    key = await client.put(b"x" * 100, job=job, name="a")
    await client.put(b"y" * 7)
    await client.delete_job(job)
    status = await client.status()
    assert (status["blobs"], status["bytes"]) == (1, 7)
    assert status["journal_checkpoints"] == 1  # the job's names were journaled: deleting them waited for one
    await client.put(b"x" * 100)
    await client.delete(key)
    assert (await client.status())["blobs"] == 1


async def test_status_sources_add_their_fields(settings: Settings) -> None:
    server = BlobServer(settings)
    server.status_sources.append(lambda: {"mode": "ha", "role": "standby", "leader": "10.0.0.1:6130"})
    async with server, AsyncBlobClient(server.address) as client:
        status = await client.status()
    assert (status["mode"], status["role"], status["leader"]) == ("ha", "standby", "10.0.0.1:6130")


async def test_status_needs_auth_when_the_server_has_a_secret(settings: Settings, tmp_path: Path) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(b"s3cret")
    async with BlobServer(replace(settings, secret_file=secret_file)) as server:
        async with AsyncBlobClient(server.address, retries=0) as anonymous:
            with pytest.raises(AuthRequired):
                await anonymous.status()
        async with AsyncBlobClient(server.address, secret=b"s3cret") as member:
            assert (await member.status())["requests"] == {"AUTH": 1, "STATUS": 1}


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_blobsvc_status_prints_one_field_per_line(server_thread: ServerThread) -> None:
    code, out, _ = run("status", "-s", server_thread.address)
    assert code == 0
    fields = dict(line.split(": ", 1) for line in out.splitlines())
    assert fields["role"] == "standalone" and fields["blobs"] == "0"
    assert {"version", "uptime seconds", "disk free bytes", "connections", "requests total"} <= fields.keys()
    # Read by a person: no "None", no Unix time.
    assert fields["metrics address"] == fields["http address"] == "off"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ \(up \d+ (s|min \d+ s)\)", fields["started"])
    assert "None" not in out


def test_blobsvc_status_json_is_one_object(server_thread: ServerThread) -> None:
    code, out, _ = run("status", "--json", "-s", server_thread.address)
    assert code == 0 and out.count("\n") == 1
    assert json.loads(out)["requests"] == {"STATUS": 1}


def test_blobsvc_status_of_a_dead_server_exits_1_with_one_line() -> None:
    code, out, err = run("status", "-s", "127.0.0.1:1", "--retries", "0")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: cannot connect to 127.0.0.1:1")
