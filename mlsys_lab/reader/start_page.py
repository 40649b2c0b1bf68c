"""The start page ``index.ipynb``: the chapters with the book's names, their exercises and
solutions, and how to use them. It is generated from :func:`~.catalogue.chapters`, so a new
chapter notebook appears on it when the page is rebuilt (``mlsys-lab index``)."""

from __future__ import annotations

from pathlib import Path

import nbformat

from .catalogue import PART_PAGES, chapters, project_root

__all__ = ["start_page", "write_start_page"]

BOOK = "https://openmlsys.github.io/"


#: The book's last chapter on its website; notebooks numbered above it are the English edition's
#: extra material.
LAST_BOOK_CHAPTER = 17


def _link(path: str | None, text: str) -> str:
    return f"[{text}]({path})" if path else "—"


def start_page(root: Path | None = None) -> nbformat.NotebookNode:
    """The start page notebook for the project at ``root`` (markdown only, nothing to run)."""
    found = chapters(root)
    rows = ["| chapter | 中文 | notebook | exercises | solutions |", "|---|---|---|---|---|"]
    for c in found:
        rows.append(f"| {c.number} · {c.english} | {c.chinese} | {_link(c.notebook, 'open')} | "
                    f"{_link(c.exercises, 'exercises')} | {_link(c.solutions, 'solutions')} |")
    numbers = {c.number for c in found}
    skipped = [f"{n} is {what}" for n, what in sorted(PART_PAGES.items())
               if n not in numbers and n < max(numbers | {0})]
    intro = (
        "# mlsys-lab · start here\n\n"
        "The hands-on companion to *Machine Learning Systems: Design and Implementation* "
        f"([openMLsys]({BOOK}), 《机器学习系统：设计和实现》). Each chapter notebook runs the "
        "book's ideas on `mlsys_lab`, a small but real ML framework in Python, numpy and Numba.\n\n"
        "**How to read.** The chapters are committed already run: open one and every picture is "
        "there. To change something, or to use the interactive views (sliders, planner pickers, "
        "the graph and memory explorers), run it: *Run ▸ Run All Cells*. "
        "`mlsys-lab doctor` in a terminal says what is installed and how to fix what is not."
    )
    table = "## Chapters\n\n" + "\n".join(rows)
    if skipped:
        table += ("\n\nThe numbers follow the book's website, where " + "; ".join(skipped) +
                  ": those pages have no content to run, so no notebook carries their numbers.")
    later = [str(c.number) for c in found if c.number > LAST_BOOK_CHAPTER]
    if later:
        table += (f" {' and '.join(later)} come{'s' if len(later) == 1 else ''} after the book's "
                  f"last chapter ({LAST_BOOK_CHAPTER}): the English edition's LLM material, "
                  "numbered to follow on.")
    work = (
        "## Exercises and solutions\n\n"
        "Each chapter has graded exercises. Open the student version in `exercises/`, replace "
        "each `raise NotImplementedError(...)` with your code and run the `check(...)` cell below "
        "it for immediate feedback. For the score of a whole notebook, in a terminal:\n\n"
        "```bash\nmlsys-lab grade exercises/ch04_computational_graph.ipynb\n```\n\n"
        "`solutions/` holds the reference answers (and is where the exercises are written: "
        "`mlsys-lab exercises build` regenerates `exercises/` from it). The "
        f"{_link('solutions/ch00_demo.ipynb', 'demo exercise set')} shows the format.\n\n"
        "## Offline copy\n\n"
        "`mlsys-lab export --out site/` writes every chapter as an HTML page (pictures and widget "
        "views included, nothing fetched from the network) with a start page like this one."
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell(text) for text in (intro, table, work)]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"start-{i}"
    return nb


def write_start_page(root: Path | None = None) -> Path:
    """Write ``index.ipynb`` at the project root (in the notebook normal form); returns its path."""
    from ..notebook_format import normal_text

    root = project_root(root)
    path = root / "index.ipynb"
    path.write_text(normal_text(start_page(root)), encoding="utf-8")
    return path


if __name__ == "__main__":  # python -m mlsys_lab.reader.start_page: rebuild index.ipynb
    print(f"wrote {write_start_page()}")
