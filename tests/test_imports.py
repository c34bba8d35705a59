"""What importing a part of blobsvc loads (issue 27): each part only what it needs.

Each case runs in a fresh interpreter, since this one has loaded everything, and names the
modules it must not have in ``sys.modules``: a PySpark worker that imports ``blobsvc.spark``
or a ``blobsvc stat`` in a shell loop pays for what it loads, every time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest

import blobsvc
from blobsvc.cli import main

SERVER_SIDE = ("blobsvc.server", "blobsvc.storage", "blobsvc.ha.coordinator")
EXTRAS = ("kazoo", "fsspec", "pyspark")
# What a command imports when it runs, never before (blobsvc/cli/__init__.py).
COMMANDS_OWN = (
    *("blobsvc.client", "blobsvc.cache", "blobsvc.agent", "blobsvc.bench", "blobsvc.spark", "blobsvc.http"),
    *("blobsvc.driver._spark_conf", "aiofiles", "blake3", "h11", "uvloop"),
)

# All of blobsvc that --help and --version may load besides blobsvc.cli and its modules: the
# settings the options show. A command group added later (its module in blobsvc/cli/, as
# _cache_cli) imports its part of blobsvc when one of its commands runs.
HELP_NEEDS = {"blobsvc", "blobsvc._exceptions", "blobsvc._lazy", "blobsvc._numbers", "blobsvc.config", "blobsvc.driver"}
HELP_NEEDS |= {"blobsvc.driver._conf_defaults"}


def loaded_by(code: str) -> set[str]:
    """The modules a fresh interpreter holds after running ``code``."""
    report = "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code + report], capture_output=True, text=True, timeout=60, check=True)
    return set(json.loads(done.stdout.splitlines()[-1]))


def command_line(*args: str) -> str:
    """Code that runs ``blobsvc ARGS`` as the console script does, and carries on."""
    return f"""
import sys
from blobsvc.cli import main
sys.argv = ["blobsvc", *{list(args)!r}]
try:
    main()
except SystemExit:
    pass
"""


def under(modules: set[str], parts: tuple[str, ...]) -> list[str]:
    """The modules that are one of ``parts`` or inside one."""
    return sorted(name for name in modules if name in parts or name.startswith(tuple(part + "." for part in parts)))


def test_importing_the_package_loads_only_its_exceptions() -> None:
    assert under(loaded_by("import blobsvc"), (*SERVER_SIDE, *EXTRAS, "blobsvc.cache", "blobsvc.client")) == []


def test_importing_the_client_loads_no_server_side_no_cache_no_extra() -> None:
    modules = loaded_by("import blobsvc.client")
    assert "blobsvc.client" in modules
    assert under(modules, (*SERVER_SIDE, *EXTRAS, "blobsvc.cache", "blobsvc.ha.store")) == []


def test_importing_spark_loads_the_cache_and_no_server_side() -> None:
    pytest.importorskip("pyspark")
    modules = loaded_by("import blobsvc.spark")
    assert {"blobsvc.cache", "pyspark"} <= modules
    assert under(modules, (*SERVER_SIDE, "kazoo", "fsspec")) == []


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["put", "--help"], ["cache", "--help"]])
def test_the_command_line_loads_a_command_s_parts_only_when_it_runs(args: list[str]) -> None:
    modules = loaded_by(command_line(*args))
    assert "click" in modules
    assert under(modules, (*EXTRAS, *COMMANDS_OWN)) == []
    assert set(under(modules, ("blobsvc",))) - HELP_NEEDS - set(under(modules, ("blobsvc.cli",))) == set()


def test_a_client_command_loads_the_client_and_no_server_side() -> None:
    modules = loaded_by(command_line("stat", "-s", "127.0.0.1:1", "--connect-timeout", "1", "--retries", "0", "0" * 64))
    assert "blobsvc.client" in modules
    assert under(modules, (*SERVER_SIDE, *EXTRAS, "blobsvc.cache", "blobsvc.agent", "blobsvc.http")) == []


def test_help_lists_every_command_with_its_short_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "blobsvc", "--help"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    assert isinstance(main, click.Group)
    for name, command in main.commands.items():
        line = next(line for line in out.splitlines() if line.strip().startswith(name + " "))
        assert command.get_short_help_str(limit=45)[:20] in line


def test_lazy_names_are_the_objects_of_their_modules() -> None:
    from blobsvc.client import BlobClient
    from blobsvc.server import BlobServer

    assert blobsvc.BlobClient is BlobClient and blobsvc.BlobServer is BlobServer
    assert set(blobsvc.__all__) <= set(dir(blobsvc))
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        blobsvc.Nothing  # noqa: B018
