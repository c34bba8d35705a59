"""The blobsvc command line: exit codes, messages, and the settings it reads."""

from __future__ import annotations

import contextlib
import os
import pty
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import blake3
import pytest
from click.testing import CliRunner

from blobsvc import BlobClient, new_job_id
from blobsvc.cli import main

from .conftest import ServerProcess, ServerThread


def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def test_put_prints_the_key_and_get_writes_the_bytes(server_thread: ServerThread, tmp_path: Path) -> None:
    source = tmp_path / "app.jar"
    source.write_bytes(b"PK\x03\x04 jar bytes")
    code, out, _ = run("put", str(source), "-s", server_thread.address)
    assert code == 0 and out.strip() == blake3.blake3(source.read_bytes()).hexdigest()
    code, _, _ = run("get", out.strip(), "-o", str(tmp_path / "copy.jar"), "-s", server_thread.address)
    assert code == 0 and (tmp_path / "copy.jar").read_bytes() == source.read_bytes()


def test_get_fsync_writes_a_file_and_needs_one(server_thread: ServerThread, tmp_path: Path) -> None:
    with BlobClient(server_thread.address) as client:
        key = client.put(b"durable")
    code, _, _ = run("get", key, "-o", str(tmp_path / "copy"), "--fsync", "-s", server_thread.address)
    assert code == 0 and (tmp_path / "copy").read_bytes() == b"durable"
    code, _, err = run("get", key, "--fsync", "-s", server_thread.address)
    assert code == 2 and "--fsync needs -o FILE" in err


def test_job_blobs_through_put_ls_stat_and_delete(server_thread: ServerThread, tmp_path: Path) -> None:
    job, source = new_job_id(), tmp_path / "f"
    source.write_bytes(b"abc")
    server = ("--server", server_thread.address)
    assert run("put", str(source), "--job", job, "--name", "deps/f.py", *server)[0] == 0
    code, out, _ = run("ls", "--job", job, *server)
    assert code == 0 and out.split("\t") == [blake3.blake3(b"abc").hexdigest(), "3", "deps/f.py\n"]
    code, out, _ = run("stat", "--job", job, "--name", "deps/f.py", "--json", *server)
    assert code == 0 and '"size": 3' in out
    code, out, _ = run("get", "--job", job, "--name", "deps/f.py", *server)
    assert code == 0 and out == "abc"
    assert run("delete", "--job", job, *server)[0] == 0
    assert run("ls", "--job", job, *server)[1] == ""


def test_a_missing_blob_exits_1_with_one_line_on_stderr(server_thread: ServerThread) -> None:
    code, out, err = run("stat", "0" * 64, "-s", server_thread.address)
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and err.startswith("Error: no blob with key")


def test_an_unreachable_server_exits_1_naming_it() -> None:
    code, _, err = run("stat", "0" * 64, "-s", "127.0.0.1:1", "--retries", "0")
    assert code == 1 and "127.0.0.1:1" in err


@pytest.mark.parametrize(
    "args",
    [
        ["get"],
        ["get", "0" * 64, "--job", "0" * 32],
        ["put", "--job", "0" * 32, "pyproject.toml"],
        ["stat", "--retries", "many", "0" * 64],
        ["serve", "--port", "not-a-port"],
        ["ls"],
    ],
)
def test_usage_errors_exit_2(args: list[str]) -> None:
    assert run(*args)[0] == 2


def test_settings_come_from_the_environment_and_a_toml_file(server_thread: ServerThread, tmp_path: Path) -> None:
    config = tmp_path / "blobsvc.toml"
    config.write_text(f'server = "{server_thread.address}"\nretries = 0\n')
    assert run("--config", str(config), "stat", "0" * 64)[2].startswith("Error: no blob")
    env = {"BLOBSVC_SERVER": server_thread.address}
    assert run("stat", "0" * 64, env=env)[2].startswith("Error: no blob")
    env = {"BLOBSVC_SERVER": "127.0.0.1:1"}  # the command line beats the environment
    assert run("stat", "0" * 64, "-s", server_thread.address, env=env)[2].startswith("Error: no blob")


def test_every_command_has_help() -> None:
    for command in ["serve", "put", "get", "delete", "stat", "ls"]:
        code, out, _ = run(command, "--help")
        assert code == 0 and "Usage:" in out


def test_serve_prints_listening_on_and_stops_on_sigterm(spawn_server: Callable[..., ServerProcess]) -> None:
    server = spawn_server()
    assert server.port > 0
    assert server.terminate() == 0


def test_serve_binds_the_first_free_port_of_a_range(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    first = spawn_server(port="0")
    second = spawn_server(f"--port={first.port}-{first.port + 20}", data_dir=tmp_path / "second")
    assert second.port != first.port and first.port < second.port <= first.port + 20


def test_serve_on_the_embedded_default_needs_no_options(tmp_path: Path) -> None:
    """`blobsvc serve` with nothing set stores under $XDG_DATA_HOME/blobsvc."""
    env = {**os.environ, "XDG_DATA_HOME": str(tmp_path), "BLOBSVC_PORT": "0", "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "blobsvc", "serve"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().startswith("listening on 127.0.0.1:")
        assert (tmp_path / "blobsvc" / "objects").is_dir()
    finally:
        process.terminate()
        process.wait(15)


def run_on_a_terminal(args: list[str], tmp_path: Path) -> tuple[int, str]:
    """Run ``blobsvc`` with stderr on a pseudo-terminal, as a person at a shell would."""
    main_fd, child_fd = pty.openpty()
    with subprocess.Popen(
        [sys.executable, "-m", "blobsvc", *args], stdout=subprocess.PIPE, stderr=child_fd, cwd=tmp_path
    ) as process:
        os.close(child_fd)
        seen = b""
        with contextlib.suppress(OSError):  # EIO once the child has closed its end
            while chunk := os.read(main_fd, 4096):
                seen += chunk
        os.close(main_fd)
        return process.wait(30), seen.decode(errors="replace")


def test_large_transfers_show_a_progress_bar_on_a_terminal_only(server_thread: ServerThread, tmp_path: Path) -> None:
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(8 << 20))
    code, terminal = run_on_a_terminal(["put", str(big), "-s", server_thread.address], tmp_path)
    assert code == 0 and "uploading" in terminal and "100%" in terminal
    code, _, err = run("put", str(big), "-s", server_thread.address)  # stderr not a terminal
    assert code == 0 and err == ""
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 1000)
    code, terminal = run_on_a_terminal(["put", str(small), "-s", server_thread.address], tmp_path)
    assert code == 0 and "uploading" not in terminal


def test_client_options_work_before_the_command_as_after_it(server_thread: ServerThread, tmp_path: Path) -> None:
    """``blobsvc -s HOST:PORT put FILE``, as git and kubectl take options; after the command wins."""
    source = tmp_path / "f.txt"
    source.write_bytes(b"before the command")
    runner = CliRunner()
    put = runner.invoke(main, ["-s", server_thread.address, "--timeout", "5", "put", str(source)])
    assert put.exit_code == 0, put.output
    key = put.output.strip()
    overridden = runner.invoke(main, ["-s", "127.0.0.1:1", "stat", key, "-s", server_thread.address])
    assert overridden.exit_code == 0 and key in overridden.output
    unreachable = runner.invoke(main, ["-s", "127.0.0.1:1", "--retries", "0", "stat", key])
    assert unreachable.exit_code == 1 and "127.0.0.1:1" in unreachable.output
    bad = runner.invoke(main, ["-s", "host:port", "stat", key])
    assert bad.exit_code == 2 and "not a server address" in bad.output


def test_times_print_in_utc_whatever_the_hosts_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """status, cache ls and checkpoints list print one clock, so that hosts' lines compare."""
    from blobsvc.cli._text import when

    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert (when(0), when(1795729713.99), when(None)) == ("1970-01-01T00:00:00Z", "2026-11-26T21:48:33Z", "-")
    finally:
        monkeypatch.undo()
        time.tzset()
