"""The docs' reference tables say what the code does: each is compared with the table
docs_tables.py renders from the code (settings and defaults, metrics and labels, exit
statuses), and the exit statuses' examples run and exit as the table says."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner

import docs_tables
from blobsvc.cli import main


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
