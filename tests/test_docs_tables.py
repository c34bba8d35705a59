"""The docs' reference tables say what the code does: each is compared with the table
docs_tables.py renders from the code (settings and defaults, metrics and labels, exit
statuses), and the exit statuses' examples run and exit as the table says."""

from __future__ import annotations

import re
import shlex

import pytest
from click.testing import CliRunner

import docs_tables
from blobsvc.cli import main
from blobsvc.config import Settings


@pytest.mark.parametrize("table", docs_tables.TABLES, ids=lambda table: table.path.name)
def test_the_reference_table_is_the_one_the_code_renders(table: docs_tables.Table) -> None:
    diff = docs_tables.out_of_step(table)
    assert not diff, f"the table is out of step with the code; `python docs_tables.py` rewrites it:\n{diff}"


def exit_status_rows() -> list[docs_tables.Row]:
    (table,) = [table for table in docs_tables.TABLES if table.header[0] == "exit status"]
    return table.rows(table.path.read_text())


@pytest.mark.parametrize("row", exit_status_rows(), ids=lambda row: row[0])
def test_each_exit_status_example_exits_with_it(row: list[str]) -> None:
    status, _, example = row
    command = shlex.split(example.strip("`"))
    assert command[0] == "blobsvc"
    result = CliRunner().invoke(main, command[1:], catch_exceptions=False)
    assert result.exit_code == int(status), result.output
    if result.exit_code:
        errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
        assert len(errors) == 1, result.stderr


def test_every_option_that_is_a_setting_shows_a_default_in_help() -> None:
    """As the settings table gives it (or the command's own, said in words): never ``[default: ]``."""
    found = docs_tables.setting_options_by_command()
    assert found
    for command, option in found:
        defaults = re.findall(r"\[default: ([^\]]*)\]", option.help or "")
        assert len(defaults) == 1, (command, option.name, option.help)
        shown = defaults[0]
        assert shown == Settings.default_text(str(option.name)) or " " in shown, (command, option.name, shown)
