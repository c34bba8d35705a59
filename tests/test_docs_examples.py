"""The examples of README.md and of the pages under docs/ still run as written.

* README's command-line and Python examples, and the Python client page's, run against a
  real local server (a ``blobsvc serve`` process on 127.0.0.1): the shell block in bash,
  from the repository's root, with ``BLOBSVC_SERVER`` naming the test's server (the block
  relies on the default server, which is that variable's); the Python blocks with the
  test's address in place of ``127.0.0.1:6130``. All write under the test's directory in
  place of ``/tmp/``.
* Every ``blobsvc ...`` command line in a shell block of README.md or of a docs page is
  parsed by blobsvc's own click commands: the command exists, and so does every option it
  is given, with a value of the right type. They are not run: most name hosts such as
  blobs.example.org, ZooKeeper ensembles or Spark clusters.
* Every Python block compiles. The Spark examples are not run here: they need a
  SparkSession, an agent on every host and a packed environment; tests/test_spark*.py run
  the same calls on ``local-cluster``, and examples/score_pipeline.py (the complete pipeline
  README points to) runs in tests/test_spark.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import blake3
import click
import pytest
import yaml

from blobsvc.cli import main

from .conftest import ServerProcess

ROOT = Path(__file__).parent.parent
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(path: Path, *languages: str) -> list[str]:
    return [body for language, body in FENCE.findall(path.read_text()) if language in languages]


def the_block(path: Path, language: str, containing: str) -> str:
    (found,) = [body for body in blocks(path, language) if containing in body]
    return found


def test_readme_command_line_example_runs(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = spawn_server()
    script = the_block(README, "sh", "blobsvc put README.md").replace("/tmp/", f"{tmp_path}/")
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "BLOBSVC_SERVER": server.address,
    }
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "README.copy").read_bytes() == README.read_bytes()
    pyproject = (ROOT / "pyproject.toml").read_bytes()
    key = blake3.blake3(pyproject).hexdigest()
    assert f"{key}\t{len(pyproject)}\tconf/pyproject.toml" in done.stdout  # blobsvc ls
    assert f'"key": "{key}"' in done.stdout  # blobsvc stat --json


def test_readme_python_example_runs(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    server = spawn_server()
    code = the_block(README, "python", "BlobClient(")
    assert "127.0.0.1:6130" in code and "/tmp/" in code
    code = code.replace("127.0.0.1:6130", server.address).replace("/tmp/", f"{tmp_path}/")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "model.bin").read_bytes() == b"weights"
    assert "BlobInfo(" in done.stdout and "name='model.bin'" in done.stdout


def test_python_client_page_example_runs(spawn_server: Callable[..., ServerProcess], tmp_path: Path) -> None:
    """docs/python.md's example, in a directory that has the target/app.jar it uploads."""
    server = spawn_server()
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "app.jar").write_bytes(b"PK\x05\x06" + bytes(18))
    code = the_block(ROOT / "docs" / "python.md", "python", "BlobClient(")
    code = code.replace("127.0.0.1:6130", server.address).replace("/tmp/", f"{tmp_path}/")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "model.bin").read_bytes() == b"..."
    assert "name='model.bin'" in done.stdout


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.name)
def test_python_examples_compile(path: Path) -> None:
    for body in blocks(path, "python"):
        compile(body, f"{path.name} example", "exec")


# Stand-ins for the shell variables and elided values of the examples, so that options
# typed by click (ports, counts, durations) parse as they would in a shell.
STAND_INS = {
    "$JOB": "0" * 32,
    "$KEY": "1" * 64,
    "$ZK": "127.0.0.1:2181",
    "$URL": "http://127.0.0.1:6180/blobs/x",
    "$ID": "7",
}
# Pages whose shell blocks must hold blobsvc command lines (so that a change to the
# extraction that finds none fails rather than passes).
EXPECT_COMMANDS = {"README.md", "cli.md", "spark.md", "agent.md", "http.md", "ha.md", "security.md", "benchmarks.md"}
COMMAND = re.compile(r"(?:^|\$\(|[;&|]\s*)(?:\S*/)?blobsvc\s+([^)#|;&<>]*)")


def command_lines(body: str) -> Iterator[str]:
    lines = body.replace("\\\n", " ").splitlines()
    prompted = [line[2:] for line in lines if line.startswith("$ ")]
    for line in prompted or lines:
        for match in COMMAND.finditer(line.strip()):
            yield match.group(1)


def parse(args: list[str]) -> None:
    """Parse one command line the way the blobsvc command does, without running it."""
    group: click.Command = main
    context = main.make_context("blobsvc", args)
    while isinstance(group, click.Group):
        # click 8.2 keeps the command's name and what follows in _protected_args; 8.1 in protected_args
        protected = context._protected_args if hasattr(context, "_protected_args") else context.protected_args
        rest = [*protected, *context.args]
        name, command, rest = group.resolve_command(context, rest)
        assert command is not None, name
        context = command.make_context(name, rest, parent=context)
        group = command


def files_need_not_exist(monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples name files of the reader's (app.jar, server.pem): accept them unmade."""
    convert = click.Path.convert

    def lenient(self: click.Path, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        exists, self.exists = self.exists, False
        try:
            return convert(self, value, param, ctx)
        finally:
            self.exists = exists

    monkeypatch.setattr(click.Path, "convert", lenient)


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.name)
def test_command_lines_parse(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files_need_not_exist(monkeypatch)
    checked = 0
    for body in blocks(path, "sh", "bash", "shell"):
        for line in command_lines(body):
            for variable, value in STAND_INS.items():
                line = line.replace(f'"{variable}"', value).replace(variable, value)
            args = shlex.split(line, comments=True)
            try:
                parse(args)
            except click.ClickException as error:
                pytest.fail(f"{path.name}: blobsvc {line.strip()}: {error.format_message()}")
            checked += 1
    assert checked or path.name not in EXPECT_COMMANDS, "no blobsvc command line found"


@pytest.mark.parametrize("path", [README, *PAGES], ids=lambda path: path.name)
def test_yaml_examples_parse(path: Path) -> None:
    """The Prometheus scrape and alert examples, and any other YAML block, are valid YAML."""
    for body in blocks(path, "yaml", "yml"):
        assert yaml.safe_load(body) is not None


def test_readme_is_short_and_its_links_resolve() -> None:
    """README stays an entry point (the rest is in docs/), and its relative links lead to files
    and headings that exist, as GitHub shows them (mkdocs build --strict checks docs/ itself)."""
    text = README.read_text()
    assert len(text.encode()) < 15_000
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        assert (ROOT / path).is_file(), target
        if anchor:
            headings = re.findall(r"^#+ (.+)$", (ROOT / path).read_text(), re.MULTILINE)
            slugs = {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}
            assert anchor in slugs, target


def test_the_checkpoints_pages_spark_recipe_is_the_example_its_spark_test_runs() -> None:
    recipe = the_block(ROOT / "docs" / "checkpoints.md", "python", "def batch_step(")
    assert recipe == (ROOT / "examples" / "checkpoint_pipeline.py").read_text()  # the whole file
