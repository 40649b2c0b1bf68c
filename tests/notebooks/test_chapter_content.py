"""Static checks on the committed notebooks: links resolve, no unformatted placeholders, and the
chapter notebooks do not hand out the answers to their own graded exercises."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

from mlsys_lab.grading.core.exercise import exercises_for_chapter
from mlsys_lab.grading.exercises import CHAPTERS as CHAPTER_PACKAGES

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted(
    (ROOT / "exercises").glob("*.ipynb")) + sorted(ROOT.glob("*.ipynb"))
EXERCISE_CHAPTERS = sorted(CHAPTER_PACKAGES)

FENCE = re.compile(r"```.*?```", re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
MATH = re.compile(r"\$\$.*?\$\$|\$[^$\n]*\$", re.S)
MD_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HTML_LINK = re.compile(r"""(?:href|src)\s*=\s*["']([^"']+)["']""")
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
PLACEHOLDER = re.compile(r"\{[A-Z][A-Z0-9_]{2,}\}")


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def _read(path):
    return nbformat.read(path, as_version=4)


def _prose(markdown):
    """Markdown with code blocks, code spans and math removed (they may contain `](`)."""
    return MATH.sub("", CODE_SPAN.sub("", FENCE.sub("", markdown)))


def relative_links(markdown):
    """The link targets in markdown that point into the repository (no scheme, no bare anchor)."""
    text = _prose(markdown)
    targets = MD_LINK.findall(text) + HTML_LINK.findall(text)
    return [t for t in targets if not SCHEME.match(t) and not t.startswith("#")]


def output_texts(cell):
    for out in cell.get("outputs", []):
        if "text" in out:
            yield out["text"]
        for mime, data in out.get("data", {}).items():
            if mime.startswith("text/"):
                yield data if isinstance(data, str) else "".join(data)


def test_the_repository_has_chapter_notebooks():
    assert len(CHAPTERS) >= 6


def test_link_extraction_ignores_code_and_sees_real_links():
    md = ("see [ch. 4](04_computational_graph.ipynb), `kernel[grid](...)`, "
          "[book](https://openmlsys.github.io/x.html), [top](#summary), <img src=\"fig.png\">")
    assert relative_links(md) == ["04_computational_graph.ipynb", "fig.png"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_relative_links_resolve_to_files(path):
    dead = []
    for i, cell in enumerate(_read(path).cells):
        sources = [cell.source] if cell.cell_type == "markdown" else []
        sources += list(output_texts(cell)) if cell.cell_type == "code" else []
        for text in sources:
            for target in relative_links(text):
                if not (path.parent / target.split("#")[0]).exists():
                    dead.append(f"cell {i}: {target}")
    assert not dead, (f"{path.name} links to files that do not exist (mark a notebook that is not "
                      f"written yet as planned, without a link): {dead}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_no_unformatted_placeholders(path):
    found = []
    for i, cell in enumerate(_read(path).cells):
        texts = [cell.source] if cell.cell_type == "markdown" else list(output_texts(cell))
        for text in texts:
            shown = _prose(text) if cell.cell_type == "markdown" else text
            found += [f"cell {i}: {m}" for m in PLACEHOLDER.findall(shown)]
    assert not found, f"{path.name} shows placeholders that were never filled in: {found}"


def exercise_targets(chapter: int) -> set[str]:
    """Names the exercises of a chapter ask the student to define (``target``; ``A.b`` -> ``A``)."""
    return {t.split(".")[0] for e in exercises_for_chapter(chapter) for t in e.targets}


def defined_names(notebook):
    """Functions and classes defined anywhere in the notebook's code, and names bound to lambdas."""
    names = {}
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        source = "\n".join(line for line in cell.source.splitlines()
                           if not line.lstrip().startswith(("%", "!")))
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.setdefault(node.name, i)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Lambda):
                for t in node.targets:
                    if isinstance(t, ast.Name):
                        names.setdefault(t.id, i)
    return names


def _chapter_for(number: int):
    return next(iter(sorted((ROOT / "chapters").glob(f"{number:02d}_*.ipynb"))), None)


PAIRS = [(n, _chapter_for(n)) for n in EXERCISE_CHAPTERS if _chapter_for(n) is not None]


def test_every_chapter_with_exercises_is_paired_with_its_exercises():
    assert {c.name[:2] for _, c in PAIRS} >= {"02", "03", "04", "06", "07", "08", "09", "10", "11",
                                              "13"}
    assert sum(len(exercise_targets(n)) for n, _ in PAIRS) >= 27


@pytest.mark.parametrize("number, chapter", PAIRS, ids=[c.name for _, c in PAIRS])
def test_chapter_does_not_define_its_exercise_answers(number, chapter):
    targets = exercise_targets(number)
    assert targets, f"no exercise targets found for chapter {number}"
    clashes = {name: cell for name, cell in defined_names(_read(chapter)).items()
               if name in targets}
    assert not clashes, (
        f"{chapter.name} defines {sorted(clashes)} (cells {sorted(clashes.values())}), the names "
        f"the exercises of chapter {number} ask students to write: the chapter must run the "
        "library's version and explain the idea instead of handing out a working answer")
