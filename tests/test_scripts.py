"""What scripts/install shows a newcomer: its editable install of blobsvc, made as the script
makes it, prints nothing (setuptools' "Editable installation" banner is filtered out)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_the_editable_install_of_scripts_install_prints_no_banner(tmp_path: Path) -> None:
    (line,) = [line for line in (ROOT / "scripts" / "install").read_text().splitlines() if " -e " in line]
    words = shlex.split(line)
    environment = dict(word.split("=", 1) for word in words[: words.index(".venv/bin/python")])
    assert "PYTHONWARNINGS" in environment, line
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    # As the script does, less the dependencies: only blobsvc's own build says anything here.
    command = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--quiet"]
    done = subprocess.run(
        [*command, "--no-deps", "-e", str(ROOT)],
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Editable installation" not in done.stderr, done.stderr


def test_the_readme_and_the_overview_say_what_scripts_test_runs() -> None:
    steps = re.findall(r'^echo "== (.+)"$', (ROOT / "scripts" / "test").read_text(), re.MULTILINE)
    assert steps[0] == "ruff" and steps[-1] == "pytest"
    for page in (ROOT / "README.md", ROOT / "docs" / "index.md"):
        text = " ".join(page.read_text().split())
        (said,) = re.findall(r"run the whole suite \((.*?)\):", text)
        assert all(step in said for step in steps), (page.name, said, steps)
