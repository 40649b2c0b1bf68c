"""What the project holds for a reader: the chapter notebooks with the book's chapter names, and
the exercise and solution notebooks that go with each.

Chapters are numbered like the book's website: 1 is the preface and 5 and 12 are part pages
(no content of their own), so no notebook carries those numbers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Chapter", "PART_PAGES", "chapters", "project_root"]

PART_PAGES = {1: "the preface (前言)", 5: "the opening page of the advanced part (进阶篇)",
              12: "the opening page of the extensions part (拓展篇)"}
_TITLE = re.compile(r"^#\s*Chapter\s+(\d+)\s*·\s*(.+?)\s*·\s*(.+?)\s*$")


@dataclass(frozen=True)
class Chapter:
    """One chapter notebook: its number, English and Chinese names, and paths relative to the
    project root (``exercises``/``solutions`` are None when the chapter has none)."""

    number: int
    english: str
    chinese: str
    notebook: str
    exercises: str | None
    solutions: str | None


def project_root(start: Path | None = None) -> Path:
    """The folder holding ``chapters/``: ``start`` (default the current directory) when it has
    one, else the checkout this package was installed from (``pip install -e .``)."""
    here = Path.cwd() if start is None else Path(start)
    if (here / "chapters").is_dir():
        return here
    return Path(__file__).resolve().parents[2]


def _title(notebook: Path) -> tuple[int, str, str]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            first = "".join(cell["source"]).splitlines()[0]
            match = _TITLE.match(first)
            if match:
                return int(match.group(1)), match.group(2), match.group(3)
            break
    raise ValueError(f"{notebook}: the first markdown cell must start with "
                     "'# Chapter N · English name · 中文名'")


def chapters(root: Path | None = None) -> list[Chapter]:
    """Every ``chapters/NN_*.ipynb`` under ``root``, in chapter order, with its names (read from
    the notebook's first heading) and its exercise and solution notebooks."""
    root = project_root(root)
    found = []
    for path in sorted((root / "chapters").glob("[0-9][0-9]_*.ipynb")):
        number, english, chinese = _title(path)
        stem = f"ch{path.stem}"
        ex = root / "exercises" / f"{stem}.ipynb"
        sol = root / "solutions" / f"{stem}.ipynb"
        found.append(Chapter(number, english, chinese, path.relative_to(root).as_posix(),
                             ex.relative_to(root).as_posix() if ex.is_file() else None,
                             sol.relative_to(root).as_posix() if sol.is_file() else None))
    return sorted(found, key=lambda c: c.number)
