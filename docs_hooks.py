"""MkDocs hook: publish files kept outside docs/ as pages of the site.

SECURITY.md stays at the repository's root, where GitHub looks for it, and
benchmarks/RESULTS.md beside the benchmarks that produce it (with the PNG figures it links
to). The pages under docs/ link to them by their repository paths (`../SECURITY.md`,
`../benchmarks/RESULTS.md#...`), which work on GitHub; this hook adds them to the site as
SECURITY.md and results/RESULTS.md and points those links there, so that `mkdocs build
--strict` checks them, anchors included, like any other link.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = Path(__file__).parent
BENCHMARKS = ROOT / "benchmarks"

# repository path (relative to the root) -> path in the site
PUBLISHED = {
    "SECURITY.md": "SECURITY.md",
    "benchmarks/RESULTS.md": "results/RESULTS.md",
    **{f"benchmarks/{png.name}": f"results/{png.name}" for png in sorted(BENCHMARKS.glob("*.png"))},
}
LINK = re.compile(r"\]\((?P<target>[^)#\s]+)(?P<rest>[^)]*)\)")
TABLE_CELL = re.compile(r"<td>.*?</td>", re.DOTALL)


def on_files(files: Files, config: Any) -> Files:
    for source, uri in PUBLISHED.items():
        files.append(File.generated(config, uri, abs_src_path=str(ROOT / source)))
    return files


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    if page.file.abs_src_path is None or not Path(page.file.abs_src_path).is_relative_to(ROOT / "docs"):
        return markdown  # a published file: its own links are relative to where it lives
    here = posixpath.dirname(page.file.src_uri)

    def relink(match: re.Match[str]) -> str:
        target = posixpath.normpath(posixpath.join("docs", here, match["target"]))
        if target not in PUBLISHED:
            return match[0]
        return f"]({posixpath.relpath(PUBLISHED[target], here or '.')}{match['rest']})"

    return LINK.sub(relink, markdown)


def on_page_content(html: str, page: Page, config: Any, files: Files) -> str:
    """A `|` inside code in a table cell is written `\\|` (as GitHub wants it); Python-Markdown
    keeps the backslash there, so drop it."""
    return TABLE_CELL.sub(lambda cell: cell[0].replace("\\|", "|"), html)
