"""The benchmarks run with the ``bench`` extra, without the tests: what they share with the
tests comes from the package or benchmarks/ (benchmarks/harness), never from tests/, which
imports pytest."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent
BENCHMARKS = sorted((ROOT / "benchmarks").rglob("*.py"))


def imported(path: Path) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.add(node.module)
    return modules


def test_no_benchmark_imports_the_tests() -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(m for m in imported(path) if m.split(".")[0] == "tests")
        for path in BENCHMARKS
    }
    assert {path: found for path, found in offenders.items() if found} == {}


def test_every_benchmark_imports_where_pytest_cannot_be() -> None:
    modules = [".".join(path.relative_to(ROOT).with_suffix("").parts) for path in BENCHMARKS]
    script = (
        "import sys\n"
        "class NoPytest:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('pytest', '_pytest'):\n"
        "            raise ImportError(f'{name} is not installed here')\n"
        "sys.meta_path.insert(0, NoPytest())\n"
        "import importlib\n"
        f"for module in {modules!r}:\n"
        "    importlib.import_module(module)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
