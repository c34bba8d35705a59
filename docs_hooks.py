"""MkDocs hook: publish benchmarks/RESULTS.md and its figures as the site's results/ pages.

RESULTS.md lives beside the benchmarks that produce it; this adds it (and the PNG figures it
links to, so its relative links keep working) to the site as results/RESULTS.md, where the
pages link to it and `mkdocs build --strict` checks those links like any other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).parent
RESULTS = ROOT / "benchmarks"


def on_files(files: Files, config: Any) -> Files:
    for path in [RESULTS / "RESULTS.md", *sorted(RESULTS.glob("*.png"))]:
        files.append(File.generated(config, f"results/{path.name}", abs_src_path=str(path)))
    return files
