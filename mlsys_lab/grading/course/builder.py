"""Build student exercise notebooks from the solution notebooks.

``solutions/chNN_topic.ipynb`` is the single source of an exercise set. In each answer cell
(tagged ``answer:<id>``) the reference answer sits between a ``### BEGIN SOLUTION`` line and a
``### END SOLUTION`` line. The builder replaces every such region by a stub, keeping the code
around it and its indentation::

    def square(x):                              def square(x):
        ### BEGIN SOLUTION                          # YOUR CODE HERE
        # TODO: return x times itself     ──▶       raise NotImplementedError(
        return x * x                                    "Exercise 0.1: return x times itself")
        ### END SOLUTION

(the ``raise`` is one line when it fits in 99 characters; a longer message is split into string
literals on lines of their own, so no line of a stub runs past 99 characters and Lab shows it
whole). Outputs and execution counts are cleared, and the stub cells and their check cells are
tagged ``raises-exception``, so the exercise notebook still runs top to bottom under nbclient and
nbval (both let a cell with that tag raise and carry on).

Output is deterministic — nbformat's JSON with sorted keys and a trailing newline — so CI can
compare ``exercises/`` byte for byte with a fresh build (``check_up_to_date``).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import nbformat

from mlsys_lab.errors import ArgumentError
from mlsys_lab.grading.core.cells import ANSWER_TAG, answer_id, chapter_from_filename, check_ids

__all__ = [
    "ANSWER_TAG",
    "BEGIN",
    "END",
    "RAISES_TAG",
    "answer_id",
    "build_all",
    "build_exercise",
    "chapter_from_filename",
    "check_ids",
    "check_up_to_date",
    "render",
    "stub_lines",
]

BEGIN = "### BEGIN SOLUTION"
END = "### END SOLUTION"
RAISES_TAG = "raises-exception"
_TODO = re.compile(r"^\s*#\s*TODO:?\s*(.*)$")
#: Longest line of a generated stub (the project's line length, and what Lab shows uncut).
STUB_WIDTH = 99


def _is_check_cell_for(cell, exercise_id: str) -> bool:
    return cell.cell_type == "code" and exercise_id in check_ids(cell.source)


def _literal(text: str) -> str:
    return f'"{text}"' if not set(text) & set('"\\') else repr(text)


def stub_lines(indent: str, message: str, width: int = STUB_WIDTH) -> list[str]:
    """The ``raise NotImplementedError(message)`` statement of a stub, as source lines.

    One line when it fits in ``width`` characters; else the message is split at spaces into
    string literals that Python joins, one per line, each line at most ``width`` characters
    (a single word longer than that stays whole)::

        raise NotImplementedError(
            "Exercise 9.1: one input and one output queue per producer; item n goes to "
            "producer n % M; read outputs round-robin")
    """
    one = f"{indent}raise NotImplementedError({_literal(message)})"
    if len(one) <= width:
        return [one]
    inner = indent + "    "
    room = width - len(inner) - 3  # the quotes, and the ")" after the last piece
    pieces: list[str] = []
    current = ""
    for word in re.split(r"(?<= )", message):  # words keep their trailing space
        if current and len(_literal(current + word)) - 2 > room:
            pieces.append(current)
            current = word
        else:
            current += word
    pieces.append(current)
    lines = [f"{indent}raise NotImplementedError("]
    lines += [f"{inner}{_literal(piece)}" for piece in pieces]
    lines[-1] += ")"
    return lines


def _stub_region(lines: list[str], exercise_id: str, where: str) -> tuple[list[str], int]:
    """Replace each BEGIN/END region in ``lines``; return the new lines and the region count."""
    out: list[str] = []
    regions = 0
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.strip() == END:
            raise ValueError(f"{where}: '{END}' without a '{BEGIN}' before it")
        if line.strip() != BEGIN:
            out.append(line)
            i += 1
            continue
        indent = line[: len(line) - len(line.lstrip())]
        try:
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() in (BEGIN, END))
        except StopIteration:
            raise ValueError(f"{where}: '{BEGIN}' without a matching '{END}'") from None
        if lines[end].strip() == BEGIN:
            raise ValueError(f"{where}: nested '{BEGIN}' (close the first region first)")
        todo = _TODO.match(lines[i + 1]) if i + 1 < end else None
        task = todo.group(1).strip() if todo and todo.group(1).strip() else "write your answer here"
        out.append(f"{indent}# YOUR CODE HERE")
        out += stub_lines(indent, f"Exercise {exercise_id}: {task}")
        regions += 1
        i = end + 1
    return out, regions


def build_exercise(nb, name: str = "notebook"):
    """Turn a solution notebook into the student's exercise notebook (a new notebook).

    Args:
        nb: the solution notebook (``nbformat.NotebookNode``); it is not modified.
        name: the notebook's name, used in error messages.

    Raises:
        ValueError: a malformed region, a region outside an answer cell, an answer cell
            without a region, or the same exercise id on two cells.
    """
    nb = copy.deepcopy(nb)
    nb.nbformat, nb.nbformat_minor = 4, max(nb.get("nbformat_minor", 0), 5)  # cell ids
    seen: set[str] = set()
    stubbed: list[str] = []
    for index, cell in enumerate(nb.cells):
        cell.setdefault("id", f"cell-{index}")  # nbformat would otherwise invent random ids
        if cell.cell_type != "code":
            continue
        cell.outputs = []
        cell.execution_count = None
        cell.metadata.pop("execution", None)
        where = f"{name}, cell {index}"
        ex_id = answer_id(cell)
        lines, regions = _stub_region(cell.source.split("\n"), ex_id or "?", where)
        if ex_id is None:
            if regions:
                raise ValueError(f"{where}: solution region in a cell without an 'answer:' tag")
            continue
        if ex_id in seen:
            raise ValueError(f"{where}: exercise {ex_id} is tagged on two answer cells")
        if not regions:
            raise ValueError(f"{where}: answer cell {ex_id} has no '{BEGIN}' region")
        seen.add(ex_id)
        cell.source = "\n".join(lines)
        _add_tag(cell, RAISES_TAG)
        stubbed.append(ex_id)
    for cell in nb.cells:
        if any(_is_check_cell_for(cell, ex_id) for ex_id in stubbed):
            _add_tag(cell, RAISES_TAG)
    return nb


def _add_tag(cell, tag: str) -> None:
    tags = list(cell.metadata.get("tags", []))
    if tag not in tags:
        tags.append(tag)
    cell.metadata["tags"] = tags


def render(nb) -> str:
    """The notebook as deterministic JSON text (what gets written to disk)."""
    text = nbformat.writes(nb, version=4)
    return text if text.endswith("\n") else text + "\n"


def _build_text(src_file: Path) -> str:
    nb = nbformat.read(src_file, as_version=4)
    exercise = build_exercise(nb, name=src_file.name)
    chapter = chapter_from_filename(src_file)
    meta = dict(exercise.metadata.get("mlsys_lab", {}))
    if chapter is not None:
        meta.setdefault("chapter", chapter)
    meta["generated_from"] = f"solutions/{src_file.name}"
    exercise.metadata["mlsys_lab"] = meta
    return render(exercise)


def _sources(src: Path) -> list[Path]:
    return sorted(p for p in src.glob("ch*.ipynb") if p.is_file())


def _required_sources(src: Path, who: str) -> list[Path]:
    """The solution notebooks in ``src``; a clear error when there are none (e.g. the package was
    installed from a wheel and ``solutions/`` is not next to it)."""
    found = _sources(src) if src.is_dir() else []
    if not found:
        what = "no such folder" if not src.is_dir() else "no ch*.ipynb solution notebooks in it"
        raise ArgumentError(
            f"{who}: cannot find the solution notebooks: looked in {src.resolve()} ({what}); "
            "run it from a checkout of mlsys-lab (the folder holding solutions/) or pass --src"
        )
    return found


def build_all(src: str | Path = "solutions", dst: str | Path = "exercises") -> list[Path]:
    """Regenerate every ``dst/chNN_*.ipynb`` from ``src/``; return the files written.

    Only files whose content changes are rewritten, so timestamps stay put for unchanged ones.

    Raises:
        ArgumentError: ``src`` holds no solution notebook.
    """
    src, dst = Path(src), Path(dst)
    sources = _required_sources(src, "exercises build")
    dst.mkdir(parents=True, exist_ok=True)
    written = []
    for src_file in sources:
        text = _build_text(src_file)
        out = dst / src_file.name
        if not out.exists() or out.read_text(encoding="utf-8") != text:
            out.write_text(text, encoding="utf-8", newline="\n")
            written.append(out)
    return written


def check_up_to_date(src: str | Path = "solutions", dst: str | Path = "exercises") -> list[Path]:
    """Files in ``dst`` that differ from a fresh build: stale, missing, or without a source.

    Raises:
        ArgumentError: ``src`` holds no solution notebook (a check that could not fail).
    """
    src, dst = Path(src), Path(dst)
    stale = []
    expected = {}
    for src_file in _required_sources(src, "exercises build --check"):
        expected[src_file.name] = _build_text(src_file)
    for name, text in expected.items():
        out = dst / name
        if not out.exists() or out.read_bytes() != text.encode("utf-8"):
            stale.append(out)
    for out in sorted(dst.glob("ch*.ipynb")) if dst.exists() else []:
        if out.name not in expected:
            stale.append(out)
    return stale
