"""Every bad input a new user tried gets one clear line, never a traceback: exit 2 for a bad
argument, 1 for an operation that failed; in the Python API, a BlobError subclass."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from blobsvc import (
    AsyncBlobClient,
    BlobClient,
    BlobError,
    ClientClosed,
    ConnectError,
    InvalidArgument,
    Settings,
    new_job_id,
)
from blobsvc.cli import main

from .conftest import ServerThread

KEY = "0" * 64


def refused_address() -> str:
    """A 127.0.0.1 port nobody listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    return result.exit_code, result.output


def error_line(output: str) -> str:
    """The one ``Error: …`` line; usage errors come after click's two usage lines."""
    errors = [line for line in output.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1, output
    return errors[0]


@pytest.fixture
def toml_with_syntax_error(tmp_path: Path) -> Path:
    path = tmp_path / "blobsvc.toml"
    path.write_text('server = "unterminated\n')
    return path


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        pytest.param(["get", KEY, "-o", "missing-dir/x.bin"], 2, "directory 'missing-dir' does not exist", id="get-o"),
        pytest.param(["put", "setup.cfg", "--secret-file", "nosuch"], 2, "'nosuch' does not exist", id="secret"),
        pytest.param(["stat", KEY, "-s", "localhost:notaport"], 2, "not a server address: 'localhost:no", id="port"),
        pytest.param(["stat", KEY, "--timeout", "abc"], 2, "'--timeout': not a number of seconds: 'abc'", id="timeout"),
        pytest.param(["stat", KEY, "--retries", "many"], 2, "'--retries': not a whole number: 'many'", id="retries"),
        pytest.param(["serve", "--max-connections", "x"], 2, "not a whole number: 'x'", id="serve-number"),
        pytest.param(["stat", KEY, "--config", "nosuch.toml"], 2, "'nosuch.toml' does not exist", id="config-after"),
        pytest.param(["stat", "--job", "abc", "--name", "x"], 2, "a job id is 32 hex characters", id="job"),
        pytest.param(["stat", "zz"], 2, "a key is 64 hex characters", id="key"),
        pytest.param(["stat", "--job", "0" * 32, "--name", ""], 2, "a name is 1 to 255 bytes", id="empty-name"),
        pytest.param(["delete", "--job", "0" * 32, "--name", "a\0b"], 2, "a name may not contain NUL", id="nul-name"),
    ],
)
def test_a_bad_argument_is_a_one_line_usage_error(
    args: list[str], code: int, says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "setup.cfg").write_text("x")
    got, output = run(*args)
    assert got == code, output
    assert says in error_line(output)


@pytest.mark.parametrize("command", [["stat", KEY], ["status"], ["put", "setup.cfg"]])
def test_a_refused_connection_is_an_answer_said_once_without_retries(
    command: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A one-shot command does not retry a refused connection (``--retries 3``, the
    default, would take seconds of back-off to say the same)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "setup.cfg").write_text("x")
    address = refused_address()
    code, output = run(*command, "-s", address, "--retries", "3")
    assert code == 1
    assert error_line(output) == f"Error: cannot connect to {address}: Connection refused (1 attempt)"


def test_a_name_that_does_not_resolve_is_an_answer_said_once_without_retries() -> None:
    code, output = run("status", "-s", "no-such-host.invalid:6130", "--retries", "3")
    assert code == 1
    line = error_line(output)
    assert line.startswith("Error: cannot resolve no-such-host.invalid: ") and line.endswith(", 1 attempt)")


def test_a_long_lived_client_retries_a_refused_connection() -> None:
    """A cache's or a driver's server may be restarting: BlobClient keeps its retries."""
    address = refused_address()
    with BlobClient(address, retries=2, backoff=0.01) as client, pytest.raises(ConnectError) as refused:
        client.status()
    assert refused.value.nobody_there
    assert str(refused.value) == f"cannot connect to {address}: Connection refused (3 attempts)"


def test_an_empty_host_means_this_host() -> None:
    port = refused_address().rpartition(":")[2]
    code, output = run("stat", KEY, "-s", f":{port}", "--retries", "0")
    assert code == 1
    assert error_line(output) == f"Error: cannot connect to 127.0.0.1:{port}: Connection refused (1 attempt)"


@pytest.mark.parametrize("where", ["before", "after"])
def test_config_goes_before_or_after_the_subcommand(where: str, tmp_path: Path) -> None:
    config = tmp_path / "blobsvc.toml"
    address = refused_address()
    config.write_text(f'server = "{address}"\nretries = 0\n')
    args = ["--config", str(config), "stat", KEY] if where == "before" else ["stat", KEY, "--config", str(config)]
    code, output = run(*args)
    assert code == 1
    assert address in error_line(output)


@pytest.mark.parametrize("where", ["before", "after"])
def test_a_toml_syntax_error_names_the_file(where: str, toml_with_syntax_error: Path) -> None:
    path = str(toml_with_syntax_error)
    args = ["--config", path, "stat", KEY] if where == "before" else ["stat", KEY, "--config", path]
    code, output = run(*args)
    assert code == 2
    assert f"config file {path}: " in error_line(output)
    assert "line 1" in error_line(output)


def test_a_bad_environment_variable_names_its_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BLOBSVC_TIMEOUT", "abc")
    code, output = run("stat", KEY)
    assert code == 2
    assert error_line(output) == "Error: setting timeout: not a number of seconds: 'abc'"


def test_an_invalid_name_exits_2_like_a_bad_key_or_job(server_thread: ServerThread) -> None:
    job = new_job_id()
    for name in ("", "x" * 256, "a\0b"):
        code, output = run("stat", "--job", job, "--name", name, "-s", server_thread.address)
        assert code == 2, output
    code, output = run("stat", "--job", job, "--name", "fine", "-s", server_thread.address)
    assert code == 1  # not found: an operation that failed
    assert "no blob named 'fine'" in error_line(output)


def test_help_shows_what_each_value_looks_like_and_its_default() -> None:
    code, output = run("serve", "--help")
    assert code == 0
    flat = " ".join(output.split())
    assert "--io-timeout SECONDS" in flat
    assert "--max-blob-size SIZE" in flat
    assert "--max-connections N" in flat
    assert "[default: 30]" in flat
    assert "[default: 8GiB]" in flat
    assert "[default: 256]" in flat
    client_help = " ".join(run("get", "--help")[1].split())
    assert "-s, --server HOST:PORT" in client_help
    assert "--timeout SECONDS" in client_help
    assert "[default: 127.0.0.1:6130]" in client_help


def test_serve_on_a_directory_it_cannot_create_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    code, output = run("serve", "--port", "0", "--data-dir", str(blocker / "data"))
    assert code == 1
    assert "Not a directory" in error_line(output)


# --- the Python API ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: AsyncBlobClient("localhost:notaport"), id="address"),
        pytest.param(lambda: Settings.load({"server": "h:x"}), id="settings-address"),
    ],
)
def test_bad_arguments_raise_invalid_argument_which_is_a_value_error(call: object) -> None:
    assert callable(call)
    with pytest.raises(InvalidArgument) as caught:
        call()
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, BlobError)


def test_client_calls_with_bad_arguments_raise_invalid_argument(server_thread: ServerThread) -> None:
    with BlobClient(server_thread.address) as client:
        for bad in (
            lambda: client.get("zz"),
            lambda: client.stat(job="abc", name="x"),
            lambda: client.put(b"x", job=new_job_id()),
            lambda: client.put(b"x", job=new_job_id(), name=""),
            lambda: client.get(KEY, job=new_job_id(), name="x"),
        ):
            with pytest.raises(InvalidArgument):
                bad()


async def test_a_closed_client_raises_client_closed_which_is_a_runtime_error() -> None:
    client = AsyncBlobClient(refused_address())
    await client.aclose()
    with pytest.raises(ClientClosed) as caught:
        await client.stat(KEY)
    assert isinstance(caught.value, RuntimeError)
    blocking = BlobClient(refused_address())
    blocking.close()
    with pytest.raises(ClientClosed):
        blocking.stat(KEY)


async def test_a_refused_connection_is_a_connect_error_naming_the_address_once() -> None:
    address = refused_address()
    async with AsyncBlobClient(address, retries=0) as client:
        with pytest.raises(ConnectError) as caught:
            await client.stat(KEY)
    assert str(caught.value).count(address) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        pytest.param(["--tls-key", "setup.cfg"], "tls_key and tls_client_ca need tls_cert", id="key-without-cert"),
        pytest.param(["--tls-cert", "setup.cfg"], "cannot load TLS certificate setup.cfg", id="not-a-cert"),
        pytest.param(["--tls-min-version", "1.1"], "'1.1' is not one of '1.2', '1.3'", id="old-version"),
    ],
)
def test_serve_with_unusable_tls_settings_is_a_one_line_usage_error(
    args: list[str], says: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "setup.cfg").write_text("x")
    code, output = run("serve", "--port", "0", "--data-dir", str(tmp_path / "data"), *args)
    assert code == 2
    assert says in error_line(output)
