"""How a notebook marks its exercises: answer cells (tag ``answer:<id>``), check cells
(``check("4.1", ...)``) and the chapter a file name gives. Read by the grader and the builder."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["ANSWER_TAG", "answer_id", "chapter_from_filename", "check_ids"]

ANSWER_TAG = "answer:"
_CHAPTER_FILE = re.compile(r"^(?:ch)?(\d+)_")
_CHECK_CALL = re.compile(r"\bcheck\(\s*['\"](\d+\.\d+[a-z]?)['\"]")


def answer_id(cell) -> str | None:
    """The exercise id of an answer cell (its ``answer:<id>`` tag), else None."""
    for tag in cell.get("metadata", {}).get("tags", []):
        if tag.startswith(ANSWER_TAG):
            return tag[len(ANSWER_TAG) :].strip()
    return None


def chapter_from_filename(path: str | Path) -> int | None:
    """``ch04_graph.ipynb`` and ``04_computational_graph.ipynb`` both give 4; else None."""
    match = _CHAPTER_FILE.match(Path(path).name)
    return int(match.group(1)) if match else None


def check_ids(source: str) -> list[str]:
    """The exercise ids a cell's ``check("4.1", ...)`` calls name, in order (comments skipped)."""
    lines = [line.split("#", 1)[0] for line in source.splitlines()]
    return _CHECK_CALL.findall("\n".join(lines))
