"""docs/security.md's recipe for certificates runs as written: its OpenSSL commands make a CA,
a server's and a client's certificate, and a server started with them as the page says
serves a client started with them as the page says (and refuses one without its own)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from blobsvc.cli import main

from .conftest import ServerProcess

PAGE = Path(__file__).parent.parent / "docs" / "security.md"
FENCE = re.compile(r"^```sh\n(.*?)^```", re.MULTILINE | re.DOTALL)


def block(containing: str) -> str:
    (found,) = [body for body in FENCE.findall(PAGE.read_text()) if containing in body]
    return str(found)


def command_line(script: str, command: str) -> list[str]:
    """The arguments after ``blobsvc COMMAND`` on its line of ``script``."""
    (line,) = [line for line in script.splitlines() if line.startswith(f"blobsvc {command} ")]
    return shlex.split(line)[2:]


def without(args: list[str], option: str) -> list[str]:
    at = args.index(option)
    return args[:at] + args[at + 2 :]


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_the_certificate_recipe_makes_what_a_mutual_tls_server_and_client_need(
    tmp_path: Path, spawn_server: Callable[..., ServerProcess]
) -> None:
    made = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block("openssl req -x509")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    assert {"ca.pem", "server.pem", "server.key", "client.pem", "client.key"} <= {p.name for p in tmp_path.iterdir()}
    usage = block("--tls-client-ca ca.pem")
    # The page's server listens on every interface; this one on loopback only.
    serve = without(command_line(usage, "serve"), "--host")
    server = spawn_server(*[str(tmp_path / arg) if arg.endswith((".pem", ".key")) else arg for arg in serve])
    source = tmp_path / "app.jar"
    source.write_bytes(b"jar bytes" * 1000)
    put = command_line(usage, "put")
    assert put[0] == "app.jar"
    client = [str(tmp_path / arg) if arg.endswith((".pem", ".key")) else arg for arg in without(put[1:], "-s")]
    # 127.0.0.1 is in the server certificate's subjectAltName, as the recipe writes it.
    runner = CliRunner()
    done = runner.invoke(main, ["put", str(source), "-s", server.address, *client])
    assert done.exit_code == 0, done.output
    refused = runner.invoke(
        main, ["stat", done.output.strip(), "-s", server.address, *without(client, "--tls-client-cert")]
    )
    assert refused.exit_code == 1
    assert "certificate required" in refused.output
