"""Static checks on the committed notebooks: links resolve, no unformatted placeholders, and the
chapter notebooks do not hand out the answers to their own graded exercises."""

import ast
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))
NOTEBOOKS = CHAPTERS + sorted((ROOT / "solutions").glob("*.ipynb")) + sorted(
    (ROOT / "exercises").glob("*.ipynb")) + sorted(ROOT.glob("*.ipynb"))
GRADING = sorted((ROOT / "mlsys_lab" / "grading").glob("ch[0-9][0-9].py"))

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


def exercise_targets(grading_module):
    """Names the exercises of one grading module ask the student to define (``target=``)."""
    names = set()
    for node in ast.walk(ast.parse(grading_module.read_text())):
        if not isinstance(node, ast.Call):
            continue
        for kw in node.keywords:
            if kw.arg != "target":
                continue
            values = kw.value.elts if isinstance(kw.value, (ast.Tuple, ast.List)) else [kw.value]
            for v in values:
                if isinstance(v, ast.Constant) and isinstance(v.value, str):
                    names.add(v.value.split(".")[0])
    return names


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


def _chapter_for(grading_module):
    number = grading_module.stem[2:]
    return next(iter(sorted((ROOT / "chapters").glob(f"{number}_*.ipynb"))), None)


PAIRS = [(g, _chapter_for(g)) for g in GRADING if _chapter_for(g) is not None]


def test_every_chapter_with_exercises_is_paired_with_its_grading_module():
    assert {c.name[:2] for _, c in PAIRS} >= {"02", "03", "04", "06", "07", "08", "09", "10", "11",
                                              "13"}
    assert sum(len(exercise_targets(g)) for g, _ in PAIRS) >= 27


def test_target_extraction_reads_single_and_tuple_targets(tmp_path):
    module = tmp_path / "ch99.py"
    module.write_text("EX = [Exercise(id='9.1', target='solve'), "
                      "Exercise(id='9.2', target=('load', 'Model.fit')), f(target=3)]\n")
    assert exercise_targets(module) == {"solve", "load", "Model"}


@pytest.mark.parametrize("grading, chapter", PAIRS, ids=[c.name for _, c in PAIRS])
def test_chapter_does_not_define_its_exercise_answers(grading, chapter):
    targets = exercise_targets(grading)
    assert targets, f"no exercise targets found in {grading.name}"
    clashes = {name: cell for name, cell in defined_names(_read(chapter)).items()
               if name in targets}
    assert not clashes, (
        f"{chapter.name} defines {sorted(clashes)} (cells {sorted(clashes.values())}), the names "
        f"the exercises in {grading.name} ask students to write: the chapter must run the "
        "library's version and explain the idea instead of handing out a working answer")
