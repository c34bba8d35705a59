"""The docs' reference tables, rendered from the code so that they cannot drift.

* docs/configuration.md: every setting, its options (and Spark conf key), its environment
  variable and its default, from :class:`blobsvc.config.Settings` and the CLI's options.
* docs/operating.md: every ``blobsvc_*`` metric, its type and its labels, from what a server's
  :class:`~blobsvc.server.metrics.ServerMetrics` exposes; the ``op`` label's values from
  :func:`blobsvc.http._observe.op_names`.
* docs/cli.md: the exit statuses, 0 and those of the click errors the commands raise.

The columns the code knows are rendered; the prose columns (meaning, what, when) are kept as
written, and a new row starts from the code's help text. The tables stay plain Markdown,
readable on GitHub. ``python docs_tables.py`` rewrites them in place (after adding a setting,
a metric or an exit status); ``python docs_tables.py --check`` prints what is out of step and
exits 1, as tests/test_docs_tables.py does.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import difflib
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

ROOT = Path(__file__).parent
DOCS = ROOT / "docs"

Row = list[str]


@dataclass(frozen=True)
class Table:
    """A Markdown table found by its header line, whose rows ``render`` makes from the rows
    written now (to keep their prose)."""

    path: Path
    header: Row
    render: Callable[[list[Row]], list[Row]]

    def rows(self, text: str) -> list[Row]:
        """The rows written in ``text``, header left out."""
        lines = text.splitlines(keepends=True)
        start, end = self._find(lines)
        return [_cells(line) for line in lines[start + 2 : end]]

    def rewrite(self, text: str) -> str:
        lines = text.splitlines(keepends=True)
        start, end = self._find(lines)
        table = [_line(self.header), _line(["---"] * len(self.header))]
        return "".join(lines[:start] + table + [_line(row) for row in self.render(self.rows(text))] + lines[end:])

    def _find(self, lines: list[str]) -> tuple[int, int]:
        for start, line in enumerate(lines):
            if line.startswith("|") and _cells(line) == self.header:
                end = start + 2
                while end < len(lines) and lines[end].startswith("|"):
                    end += 1
                return start, end
        raise LookupError(f"{self.path.relative_to(ROOT)} has no table headed {_line(self.header).strip()}")


def _cells(line: str) -> Row:
    """A table line's cells; ``\\|`` (a pipe inside code) does not split."""
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]


def _line(cells: Row) -> str:
    if cells[0] == "---":
        return "|" + "|".join(cells) + "|\n"
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|\n"


def _code(text: str) -> str:
    return f"`{text}`"


def _keep_order(existing: list[str], wanted: list[str]) -> list[str]:
    """``wanted`` in the order of ``existing``, each new one after its predecessor in ``wanted``."""
    order = [name for name in existing if name in wanted]
    for index, name in enumerate(wanted):
        if name not in order:
            before = [n for n in wanted[:index] if n in order]
            order.insert(order.index(before[-1]) + 1 if before else 0, name)
    return order


# --- settings ----------------------------------------------------------------------------------


def setting_options_by_command() -> list[tuple[str, click.Option]]:
    """Every option that is a setting, with its command's path (``""``: the group itself,
    before any command)."""
    from blobsvc.cli import main
    from blobsvc.config import Settings

    settings = {field.name for field in dataclasses.fields(Settings)}
    found: list[tuple[str, click.Option]] = []

    def walk(command: click.Command, path: str) -> None:
        found.extend((path, p) for p in command.params if isinstance(p, click.Option) and p.name in settings)
        if isinstance(command, click.Group):
            for name, sub in command.commands.items():
                walk(sub, f"{path} {name}".strip())

    walk(main, "")
    return found


def _setting_options() -> dict[str, dict[str, list[str]]]:
    """For each setting, each spelling of its options and the commands that take it."""
    found: dict[str, dict[str, list[str]]] = {}
    for path, option in setting_options_by_command():
        if option.secondary_opts:  # --verify-on-start/--no-verify-on-start
            spelling = _code(option.opts[0].replace("--", "--[no-]", 1))
        else:  # long options first: `-s, --server` and `--server, -s` are one spelling
            spelling = ", ".join(_code(opt) for opt in sorted(option.opts, key=lambda opt: opt[1] != "-"))
        found.setdefault(str(option.name), {}).setdefault(spelling, []).append(path)
    return found


def _where(commands: list[str], groups: dict[str, list[str]]) -> str:
    if "" in commands:
        return ""  # the group's: before the command, or after any that talks to a server
    names = []
    for command in commands:
        group = command.split()[0]
        if len(command.split()) > 1 and all(c in commands for c in groups[group]):
            if f"`{group}` commands" not in names:
                names.append(f"`{group}` commands")
        else:
            names.append(_code(command))
    return f" ({', '.join(names)})"


def _option_cell(name: str, options: dict[str, dict[str, list[str]]], groups: dict[str, list[str]]) -> str:
    from blobsvc.spark._publish import CONF_KEYS

    spellings = [f"{spelling}{_where(commands, groups)}" for spelling, commands in options.get(name, {}).items()]
    if name in CONF_KEYS:
        spellings.append(f"{_code(CONF_KEYS[name])} (Spark conf)")
    return "; ".join(spellings) or "(TOML file and environment only)"


def _default_cell(name: str) -> str:
    """The default as ``--help`` shows it; one that depends on the environment (a directory
    under ``$XDG_DATA_HOME``) as a rule and as it is without the variable."""
    from blobsvc.config import Settings

    field = next(f for f in dataclasses.fields(Settings) if f.name == name)
    if field.default_factory is dataclasses.MISSING:
        return Settings.default_text(name)
    with _environment(XDG_DATA_HOME="$XDG_DATA_HOME", XDG_CACHE_HOME="$XDG_CACHE_HOME"):
        rule = Settings.default_text(name)
    with _environment(XDG_DATA_HOME=None, XDG_CACHE_HOME=None, HOME="/home/you"):
        plain = Settings.default_text(name).replace("/home/you", "~", 1)
    return f"{_code(rule)} ({_code(plain)})"


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            _set_env(name, value)
        yield
    finally:
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def render_settings(rows: list[Row]) -> list[Row]:
    from blobsvc.cli import main
    from blobsvc.config import ENV_PREFIX, Settings

    meanings = {row[0].strip("`"): row[4] for row in rows}
    options = _setting_options()
    groups = {name: [f"{name} {sub}" for sub in cmd.commands] for name, cmd in main.commands.items()
              if isinstance(cmd, click.Group)}  # fmt: skip
    names = _keep_order(list(meanings), [f.name for f in dataclasses.fields(Settings)])
    return [
        [
            _code(name),
            _option_cell(name, options, groups),
            _code(ENV_PREFIX + name.upper()),
            _default_cell(name),
            meanings.get(name) or Settings.help(name),
        ]
        for name in names
    ]


# --- metrics -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metric:
    name: str  # as scraped: a counter's with _total
    type: str
    labels: tuple[str, ...]
    help: str


def server_metrics() -> list[Metric]:
    """The ``blobsvc_*`` metrics a server in recovery mode zookeeper exposes (HA's and
    retention's included), read from a scrape of an unstarted one: no port, no ZooKeeper."""
    from blobsvc.config import Settings
    from blobsvc.ha.coordinator import ZooKeeperHA
    from blobsvc.server import BlobServer
    from blobsvc.server.metrics import ServerMetrics

    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp, "data"),
            recovery_mode="zookeeper",
            zookeeper="127.0.0.1:2181",
            ha_dir=str(Path(tmp, "ha")),
            content_ttl=3600.0,
        )
        server = BlobServer(settings, ha=ZooKeeperHA(settings))
        server.storage.recover()  # lays out the data directory, as a start does
        try:
            families = list(ServerMetrics(server).collect())
        finally:
            server.storage.close()
    found = []
    for family in families:
        name = family.name + "_total" if family.type == "counter" else family.name
        # The label names a family was made with: its samples (none for an op not yet seen) cannot tell.
        labels = tuple(getattr(family, "_labelnames", ()))
        found.append(Metric(name, family.type, labels, family.documentation))
    return found


_LABEL = re.compile(r"`(?P<label>\w+)`(?: \((?P<about>[^()]*)\))?")


def render_metrics(rows: list[Row]) -> list[Row]:
    from blobsvc.http._observe import op_names

    metrics = {metric.name: metric for metric in server_metrics()}
    listed = {name for row in rows for name in re.findall(r"`(blobsvc_\w+)", row[0])}
    rows = rows + [[_code(name), "", "", ""] for name in metrics if name not in listed]
    rendered = []
    for row in rows:
        written = re.findall(r"`(blobsvc_\w+)", row[0])
        if not written:  # another collector's metrics (process_*), told of in prose
            rendered.append(row)
            continue
        members = [metrics[name] for name in written if name in metrics]
        if len({m.labels for m in members}) > 1:  # one row, one set of labels
            rows += [[_code(m.name), "", row[2], ""] for m in members]
            continue
        if not members:
            continue
        abouts = {m["label"]: m["about"] for m in _LABEL.finditer(row[2]) if m["about"]}
        if "op" in abouts:  # the first row with the label lists its values
            abouts["op"] = ", ".join(op_names())
        labels = list(dict.fromkeys(label for m in members for label in m.labels))
        rendered.append(
            [
                ", ".join(_code(m.name) for m in members),
                ", ".join(dict.fromkeys(m.type for m in members)),
                ", ".join(f"`{label}` ({abouts[label]})" if abouts.get(label) else _code(label) for label in labels),
                row[3] if len(members) == len(written) and row[3] else " ".join(m.help for m in members),
            ]
        )
    return rendered


# --- exit statuses -----------------------------------------------------------------------------


def exit_statuses() -> list[int]:
    """0, and the exit status of each click error the commands raise (``raise click.X(…)``,
    ``raise click.exceptions.Exit(N)``) or each literal ``….exit(N)`` they call."""
    statuses = {0}
    for path in sorted((ROOT / "blobsvc" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            call = node.exc if isinstance(node, ast.Raise) else node
            if not isinstance(call, ast.Call):
                continue
            literal = [
                arg.value for arg in call.args[:1] if isinstance(arg, ast.Constant) and isinstance(arg.value, int)
            ]
            dotted = ast.unparse(call.func)
            if isinstance(node, ast.Raise) and dotted.startswith("click."):
                error: Any = click
                for attr in dotted.split(".")[1:]:
                    error = getattr(error, attr)
                statuses.add(int(literal[0]) if error is click.exceptions.Exit else error.exit_code)
            elif dotted.endswith(".exit") and literal:
                statuses.add(int(literal[0]))
    return sorted(statuses)


def render_exit_statuses(rows: list[Row]) -> list[Row]:
    written = {row[0]: row for row in rows}
    return [written.get(str(status)) or [str(status), "(say when)", ""] for status in exit_statuses()]


TABLES = (
    Table(DOCS / "configuration.md", ["setting", "option", "environment", "default", "meaning"], render_settings),
    Table(DOCS / "operating.md", ["metric", "type", "labels", "what"], render_metrics),
    Table(DOCS / "cli.md", ["exit status", "when", "for example"], render_exit_statuses),
)


def out_of_step(table: Table) -> str:
    """A diff of ``table`` as written against as rendered; empty when they agree."""
    text = table.path.read_text()
    name = str(table.path.relative_to(ROOT))
    return "".join(difflib.unified_diff(text.splitlines(True), table.rewrite(text).splitlines(True), name, name))


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print("usage: python docs_tables.py [--check]", file=sys.stderr)
        return 2
    stale = 0
    for table in TABLES:
        diff = out_of_step(table)
        if diff and argv:
            print(diff, end="")
            stale += 1
        elif diff:
            table.path.write_text(table.rewrite(table.path.read_text()))
            print(f"rewrote the table of {table.path.relative_to(ROOT)}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
