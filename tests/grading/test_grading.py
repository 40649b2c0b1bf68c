"""Tests of the grading machinery: checks, the exercise builder, the grader and the CLI.

The grader tests run real kernels (about 1-2 s each to start), so each adversarial notebook is
graded once and everything about it is asserted on that one report.
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from mlsys_lab.cli import main
from mlsys_lab.grading.core import grader
from mlsys_lab.grading.core.check import check, run_cases
from mlsys_lab.grading.core.exercise import (
    UnknownExerciseError,
    check_cell_name_error,
    compact,
    get_exercise,
)
from mlsys_lab.grading.core.grader import ExerciseGrade, GradeReport, grade
from mlsys_lab.grading.course import builder
from mlsys_lab.grading.course.commands import ungradable

from ..processes import alive, descendants

ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
EXERCISES = ROOT / "exercises"
DEMO = SOLUTIONS / "ch00_demo.ipynb"
FULL = 12  # 3 + 5 + 4 points in mlsys_lab/grading/exercises/ch00_demo/
SLACK = 20  # kernel start-up and shutdown on a busy 2-core machine


# ----------------------------------------------------------------------------- helpers


@pytest.fixture
def no_leftover_processes():
    """Fail if a test leaves a process (kernel or anything it started) behind."""
    before = set(descendants(os.getpid()))
    yield
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = set(descendants(os.getpid())) - before
        if not left:
            return
        time.sleep(0.2)
    pytest.fail(f"processes left behind: {sorted(left)}")


def _demo_with(answer_id: str | None, source: str, path: Path) -> Path:
    """Write the demo solution notebook with one answer cell replaced by ``source`` (none for
    ``answer_id=None``), creating ``path``'s folder."""
    nb = nbformat.read(DEMO, as_version=4)
    if answer_id is not None:
        [cell] = [c for c in nb.cells if f"answer:{answer_id}" in c.metadata.get("tags", [])]
        cell.source = source
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _points(report) -> dict[str, float]:
    return {row.exercise: row.points for row in report.rows}


def _timed_grade(path, **kwargs):
    start = time.monotonic()
    report = grade(path, **kwargs)
    return report, time.monotonic() - start


# ----------------------------------------------------------------------------- checks


def test_check_reports_each_case_and_returns_a_result(capsys):
    result = check("0.1", lambda x: x * x)
    out = capsys.readouterr().out
    assert "Exercise 0.1" in out and "✓ square(3) == 9" in out and "Score: 3/3" in out
    assert (result.score, result.max, result.passed) == (3, 3, True)


def test_check_names_the_failing_case_and_what_was_expected(capsys):
    result = check("0.2", lambda n: n)  # right for 0 and 1 only
    out = capsys.readouterr().out
    assert (result.score, result.max) == (1, 5)
    assert "✗ fib(n) for n < 20" in out and "fib(2) returned 2, expected 1" in out
    assert "_fib" not in out  # never shows the reference code


def test_student_exceptions_are_reported_as_type_and_message(capsys):
    def mean(xs):
        return sum(xs) / len(xs)  # ZeroDivisionError on []

    result = check("0.3", mean)
    row = next(r for r in result.rows if not r.passed)
    assert row.name == "mean([]) raises ValueError"
    assert "ZeroDivisionError" in row.feedback and "Traceback" not in capsys.readouterr().out

    result = run_cases("0.1", lambda x: 1 / 0)
    assert result.score == 0
    assert result.rows[0].feedback.startswith("raised ZeroDivisionError: division by zero (line")


def test_an_object_that_equals_everything_does_not_pass():
    class Liar:
        def __eq__(self, other):
            return True

    assert run_cases("0.1", lambda x: Liar()).score == 0


def test_unknown_exercises_raise_a_clear_key_error():
    with pytest.raises(UnknownExerciseError, match="chapter 99 has no exercise checks"):
        get_exercise("99.1")
    with pytest.raises(KeyError, match=r"no exercise '0\.9' in chapter 0 \(known: 0.1, 0.2, 0.3\)"):
        get_exercise("0.9")


def test_wrong_number_of_answers_fails_every_case(capsys):
    result = check("0.1")
    assert result.score == 0 and "expects 1 answer(s): square" in capsys.readouterr().out


def test_check_prints_a_message_shared_by_several_cases_once(capsys):
    def fib(n):
        raise NotImplementedError("Exercise 0.2: write fib")

    check("0.2", fib)
    out = capsys.readouterr().out
    assert out.count("NotImplementedError") == 1, out
    assert "3 of 3 cases failed: raised NotImplementedError: Exercise 0.2: write fib" in out

    def mean(xs):  # two cases share the stub's message, the third says more
        raise NotImplementedError("Exercise 0.3: write mean")

    check("0.3", mean)
    out = capsys.readouterr().out
    assert out.count("(line") == 1 and "  [1] raised NotImplementedError" in out, out
    assert out.count("  [1]") == 3 and "mean([]) raised NotImplementedError" in out, out


def test_check_shows_numbers_compactly(capsys):
    check("0.1", lambda x: x * x * (1 + 1e-7), seed=5)
    out = capsys.readouterr().out
    assert re.search(r"\d\.\d{8,}", out) is None, out  # no float printed to 16 digits
    assert "returned 9.000001, expected 9" in out, out  # a difference is never rounded away
    assert len(max(out.splitlines(), key=len)) < 100, out


def test_compact_shortens_floats_and_long_lists_but_keeps_differences():
    assert compact("costs {'a': 0.0012345678901234567, 'b': 1.5}") == \
        "costs {'a': 0.00123457, 'b': 1.5}"
    assert compact("got 0.30000000000000004, expected 0.3") == \
        "got 0.30000000000000004, expected 0.3"
    assert compact("got 3.00000000001, expected 9") == "got 3.0, expected 9"
    assert compact(f"got {list(range(100))}") == "got [0, 1, 2, 3, 4, …, 98, 99] (100 items)"
    assert compact("['a b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']") == \
        "['a b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j']"  # only numbers are summarised
    assert compact("exercise 9.1, mlsys-lab 1.2.3, 1e-12") == "exercise 9.1, mlsys-lab 1.2.3, 1e-12"


def test_grade_table_collapses_each_repeated_message():
    stub = "raised NotImplementedError: Exercise 9.2: start at epoch 0 (line 6, in __init__)"
    rows = [{"name": f"case {k}", "passed": False, "feedback": stub} for k in range(5)]
    rows.append({"name": "errors", "passed": False, "feedback": "ShardSampler(10, 4, 4) gave x"})
    rows.append({"name": "fine", "passed": True, "feedback": ""})
    assert grader._summary(rows) == (
        f"5 of 7 cases failed: {stub}; errors: ShardSampler(10, 4, 4) gave x")
    rows = [{"name": "a", "passed": False, "feedback": "returned 0.30000000000000004, expected 1"}]
    assert grader._summary(rows) == "a: returned 0.3, expected 1"


def test_a_check_cell_run_before_its_answer_says_so(no_leftover_processes):
    cells = ["from mlsys_lab.grading import check", 'check("0.1", square)',
             "undefined_thing + 1", "def square(x):\n    return x * x", 'check("0.1", square)']
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, allow_errors=True, kernel_name="python3", timeout=60).execute()
    [early] = nb.cells[1].outputs
    assert early.output_type == "error" and early.ename == "NameError"
    assert early.evalue == "run the answer cell of 0.1 above first (name 'square' is not defined)"
    assert early.traceback == [f"NameError: {early.evalue}"]  # no bare traceback
    [other] = nb.cells[2].outputs  # any other NameError keeps IPython's usual traceback
    assert other.evalue == "name 'undefined_thing' is not defined" and len(other.traceback) > 1
    assert "Score: 3/3" in nb.cells[4].outputs[0].text


def test_check_cell_name_error_names_the_missing_answer():
    def error(name):
        return NameError(f"name {name!r} is not defined", name=name)

    assert check_cell_name_error(error("ShardSampler"), 'check("9.2", ShardSampler)') == (
        "run the answer cell of 9.2 above first (name 'ShardSampler' is not defined)")
    assert "first code cell" in check_cell_name_error(error("check"), 'check("9.2", f)')
    assert check_cell_name_error(error("f"), "f(3)") == ""  # not a check cell
    assert check_cell_name_error(error("g"), 'check("9.2", f)') == ""  # g is not the answer


# ----------------------------------------------------------------------------- builder


def _solution_cell(source: str, ex_id: str = "9.1"):
    return nbformat.v4.new_code_cell(source, metadata={"tags": [f"answer:{ex_id}"]})


def test_builder_stubs_regions_and_keeps_the_code_around_them():
    source = (
        "import math\n"
        "def area(r):\n"
        "    '''Circle area.'''\n"
        "    ### BEGIN SOLUTION\n"
        "    # TODO: use math.pi\n"
        "    return math.pi * r * r\n"
        "    ### END SOLUTION\n"
        "\n"
        "### BEGIN SOLUTION\n"
        "RADIUS = 2\n"
        "### END SOLUTION\n"
        "print(area(RADIUS))"
    )
    answer = _solution_cell(source)
    answer.outputs = [nbformat.v4.new_output("stream", text="12.56\n")]
    answer.execution_count = 3
    checker = nbformat.v4.new_code_cell('check("9.1", area)', execution_count=4)
    other = nbformat.v4.new_code_cell("x = 1")
    nb = nbformat.v4.new_notebook(cells=[answer, checker, other])

    out = builder.build_exercise(nb)
    assert out.cells[0].source == (
        "import math\n"
        "def area(r):\n"
        "    '''Circle area.'''\n"
        "    # YOUR CODE HERE\n"
        '    raise NotImplementedError("Exercise 9.1: use math.pi")\n'
        "\n"
        "# YOUR CODE HERE\n"
        'raise NotImplementedError("Exercise 9.1: write your answer here")\n'
        "print(area(RADIUS))"
    )
    assert out.cells[0].outputs == [] and out.cells[0].execution_count is None
    assert out.cells[0].metadata.tags == ["answer:9.1", "raises-exception"]
    assert out.cells[1].metadata.tags == ["raises-exception"]
    assert "tags" not in out.cells[2].metadata
    assert nb.cells[0].source == source  # the input notebook is untouched
    assert builder.render(out) == builder.render(builder.build_exercise(nb))  # deterministic
    assert builder.render(out).endswith("}\n")


def test_builder_wraps_a_long_stub_message_into_short_lines():
    task = ("one input and one output queue per producer; item n goes to producer n % M; "
            "read outputs round-robin, and say \"why\" in a message this long")
    source = f"def f(x):\n    ### BEGIN SOLUTION\n    # TODO: {task}\n    return x\n" \
             "    ### END SOLUTION"
    out = builder.build_exercise(nbformat.v4.new_notebook(cells=[_solution_cell(source)]))
    lines = out.cells[0].source.split("\n")
    assert lines[:3] == ["def f(x):", "    # YOUR CODE HERE", "    raise NotImplementedError("]
    assert len(lines) > 4 and all(len(line) <= 99 for line in lines), lines
    namespace: dict = {}
    exec(out.cells[0].source, namespace)  # the pieces are one valid string literal
    with pytest.raises(NotImplementedError) as raised:
        namespace["f"](1)
    assert str(raised.value) == f"Exercise 9.1: {task}"


def test_generated_stubs_fit_in_99_columns():
    for path in sorted(EXERCISES.glob("ch*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if builder.answer_id(cell):
                long = [line for line in cell.source.split("\n") if len(line) > 99
                        and ("NotImplementedError" in line or line.strip().startswith('"Exer'))]
                assert not long, f"{path.name}: {long}"


@pytest.mark.parametrize(
    "source, cell_tags, message",
    [
        ("### BEGIN SOLUTION\nx = 1", ["answer:9.1"], "without a matching"),
        ("x = 1\n### END SOLUTION", ["answer:9.1"], "without a '### BEGIN SOLUTION'"),
        ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", ["answer:9.1"], "nested"),
        ("### BEGIN SOLUTION\nx = 1\n### END SOLUTION", [], "without an 'answer:' tag"),
        ("x = 1", ["answer:9.1"], "has no '### BEGIN SOLUTION' region"),
    ],
)
def test_builder_rejects_malformed_sources(source, cell_tags, message):
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": cell_tags})
    with pytest.raises(ValueError, match=message):
        builder.build_exercise(nbformat.v4.new_notebook(cells=[cell]), name="bad.ipynb")


def test_exercises_folder_is_up_to_date_with_solutions():
    """Every solutions/ch*.ipynb has a byte-identical fresh build in exercises/."""
    sources = sorted(p.name for p in SOLUTIONS.glob("ch*.ipynb"))
    assert "ch00_demo.ipynb" in sources
    stale = builder.check_up_to_date(SOLUTIONS, EXERCISES)
    assert stale == [], f"run `mlsys-lab exercises build`; stale: {stale}"


def test_check_up_to_date_lists_stale_missing_and_orphaned_files(tmp_path):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    src.mkdir()
    (src / "ch00_demo.ipynb").write_bytes(DEMO.read_bytes())
    assert builder.check_up_to_date(src, dst) == [dst / "ch00_demo.ipynb"]  # missing
    assert builder.build_all(src, dst) == [dst / "ch00_demo.ipynb"]
    assert builder.build_all(src, dst) == []  # nothing changes the second time
    assert builder.check_up_to_date(src, dst) == []
    (dst / "ch00_demo.ipynb").write_text("{}")
    (dst / "ch01_orphan.ipynb").write_text("{}")
    stale = builder.check_up_to_date(src, dst)
    assert stale == [dst / "ch00_demo.ipynb", dst / "ch01_orphan.ipynb"]


# ----------------------------------------------------------------------------- grader


def test_solution_notebook_scores_full_marks(no_leftover_processes):
    report, elapsed = _timed_grade(DEMO, cell_timeout=30, timeout=120)
    assert (report.total, report.max) == (FULL, FULL), report.to_table()
    assert _points(report) == {"0.1": 3, "0.2": 5, "0.3": 4}
    assert report.notes == []
    assert elapsed < 120


def test_plans_made_aside_are_those_made_here_and_a_failed_helper_is_replaced(monkeypatch):
    """``mlsys-lab grade`` has another process make the guard plans while the kernel starts:
    the same plans and references as made in the grader's process; when that process fails,
    they are made here."""
    exercises = [get_exercise(ex_id) for ex_id in ("0.1", "0.2", "0.3")]
    here = grader._Preparation(exercises)
    aside = grader._Preparation(exercises, aside=True)
    assert aside.result() == here.result() and aside.references == here.references
    monkeypatch.setattr(grader, "_PLANS_ASIDE", "raise SystemExit(3)")
    broken = grader._Preparation(exercises, aside=True)
    assert broken.result() == here.result() and broken.references == here.references


def test_an_exercise_whose_checks_cannot_be_prepared_scores_zero_and_says_why(
        monkeypatch, no_leftover_processes):
    """A broken check module or forbidden spec (the teacher's bug) costs that exercise only:
    its check is skipped, the report says why, and the others are graded as usual."""
    real = grader.plan_text

    def plan_text(exercise):
        if exercise.id == "0.2":
            raise RuntimeError("a broken spec")
        return real(exercise)

    monkeypatch.setattr(grader, "plan_text", plan_text)
    report = grade(DEMO, cell_timeout=30, timeout=120)
    assert _points(report) == {"0.1": 3, "0.2": 0, "0.3": 4}, report.to_table()
    assert report.rows[1].feedback == "the checks of 0.2 could not be prepared: RuntimeError"
    assert report.notes == ["the checks of 0.2 could not be prepared: RuntimeError: a broken spec"]


def test_exercise_notebook_scores_zero_and_runs_to_the_end(no_leftover_processes):
    report = grade(EXERCISES / "ch00_demo.ipynb", cell_timeout=30, timeout=120)
    assert (report.total, report.max) == (0, FULL), report.to_table()
    for row in report.rows:  # each exercise was checked and hit its stub
        assert "NotImplementedError: Exercise" in row.feedback
    table = report.to_table()
    assert "Total" in table and "0/12" in table


FIB = (
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n"
)


ADVERSARIAL = {
    # name: (answer id, answer source, grade kwargs, expected points, words in feedback/notes)
    "infinite loop in the answer's function": (
        "0.2",
        "def fib(n):\n    while True:\n        pass\n",
        {"cell_timeout": 3, "timeout": 60},
        {"0.1": 3, "0.2": 0, "0.3": 4},
        "timed out after 3 s",
    ),
    "infinite loop at the top of the answer cell": (
        "0.2",
        FIB + "while True:\n    pass\n",
        {"cell_timeout": 3, "timeout": 60},
        {"0.1": 3, "0.2": 0, "0.3": 4},
        "answer cell timed out",
    ),
    "answer cell that swallows the interrupt": (
        "0.2",
        FIB + "import time\nwhile True:\n    try:\n        time.sleep(10)\n"
        "    except KeyboardInterrupt:\n        pass\n",
        {"cell_timeout": 2, "timeout": 60},
        {"0.1": 3, "0.2": 0, "0.3": 4},
        "ignored the interrupt",
    ),
    "exception": (
        "0.2",
        "def fib(n):\n    return n if n < 2 else 1 / 0\n\nraise RuntimeError('boom')\n",
        {"cell_timeout": 10, "timeout": 60},
        {"0.1": 3, "0.2": 1, "0.3": 4},
        "ZeroDivisionError",
    ),
    "sys.exit()": (
        "0.2",
        "import sys\nsys.exit(3)\n",
        {"cell_timeout": 10, "timeout": 60},
        {"0.1": 3, "0.2": 0, "0.3": 4},
        "`fib` is not defined",
    ),
    "os._exit(1)": (
        "0.2",
        FIB + "import os\nos._exit(1)\n",
        {"cell_timeout": 10, "timeout": 60},
        {"0.1": 3, "0.2": 0, "0.3": 4},
        "kernel died",
    ),
    "10 MB of printed output": (
        "0.1",
        "for _ in range(100):\n    print('x' * 100_000)\n\n"
        "def square(x):\n    print('y' * 1_000_000, end='')  # no newline before the marker\n"
        "    return x * x\n",
        {"cell_timeout": 30, "timeout": 90},
        {"0.1": 3, "0.2": 5, "0.3": 4},
        "output too long",
    ),
    "redefining check, json, print, mlsys_lab, exec, globals": (
        "0.1",
        "def square(x):\n    return x * x\n\n"
        "check = lambda *a: None\njson = None\nprint = None\nmlsys_lab = None\n"
        "np = None\nsys = None\n__mlsys_grading = None\n"
        "exec = compile = type = dict = vars = setattr = None\n"
        "globals = lambda: {'fib': lambda n: 0, 'mean': lambda xs: 0}\n",
        {"cell_timeout": 10, "timeout": 60},
        {"0.1": 3, "0.2": 5, "0.3": 4},
        None,
    ),
}


@pytest.mark.parametrize("case", list(ADVERSARIAL), ids=list(ADVERSARIAL))
def test_grader_survives_adversarial_answers(case, tmp_path, no_leftover_processes):
    answer, source, kwargs, expected, words = ADVERSARIAL[case]
    path = _demo_with(answer, source, tmp_path / "ch00_student.ipynb")
    report, elapsed = _timed_grade(path, **kwargs)
    text = report.to_table()
    assert _points(report) == expected, text
    assert report.max == FULL
    assert elapsed < kwargs["timeout"] + SLACK, text
    if words:
        assert words in text, text
    json.loads(report.to_json())  # always serialisable


def test_wall_clock_timeout_kills_the_kernel_and_its_children(tmp_path, no_leftover_processes):
    # 0.1 is right and also starts a child process; 0.2 hangs in C (sleep), past the timeout.
    spawn = (
        "import subprocess\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "open('child.pid', 'w').write(str(child.pid))\n"
        "def square(x):\n    return x * x\n"
    )
    nb = nbformat.read(_demo_with("0.1", spawn, tmp_path / "ch00_slow.ipynb"), as_version=4)
    [fib_cell] = [c for c in nb.cells if "answer:0.2" in c.metadata.get("tags", [])]
    fib_cell.source = "import time\ntime.sleep(300)\n" + FIB
    nbformat.write(nb, tmp_path / "ch00_slow.ipynb")

    report, elapsed = _timed_grade(tmp_path / "ch00_slow.ipynb", cell_timeout=100, timeout=6)
    text = report.to_table()
    assert _points(report) == {"0.1": 3, "0.2": 0, "0.3": 0}, text
    assert report.max == FULL
    assert "wall-clock timeout" in text
    assert 6 <= elapsed < 6 + SLACK
    child = int((tmp_path / "child.pid").read_text())
    assert not alive(child), "the student's child process survived"


def test_grading_an_unreadable_notebook_reports_instead_of_crashing(tmp_path):
    path = tmp_path / "ch00_broken.ipynb"
    path.write_text("{not json")
    report = grade(path)
    assert (report.total, report.max) == (0, FULL)
    assert "could not read the notebook" in report.notes[0]


# ----------------------------------------------------------------------------- CLI


def test_cli_grade_json(tmp_path, capsys, no_leftover_processes):
    # A student deleted exercise 0.3 and renamed the file: the maximum still counts 0.3 (the
    # chapter comes from the notebook's metadata), and it scores 0 of its 4 points: graded at
    # the end of the notebook, where nothing defines `mean`.
    nb = nbformat.read(DEMO, as_version=4)
    nb.cells = [c for c in nb.cells if "0.3" not in c.source and "0.3" not in str(c.metadata)]
    path = tmp_path / "my homework.ipynb"
    nbformat.write(nb, path)
    assert main(["grade", str(path), "--json", "--cell-timeout", "10", "--timeout", "60"]) == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)  # progress goes to stderr: stdout is one JSON document
    progress = captured.err.splitlines()
    assert "starting a kernel" in progress[1], captured.err
    for text in ("running cell ", "(the answer cell of 0.1)", "checking 0.1", "checking 0.2",
                 "checking 0.3", "judging the answers"):
        assert any(text in line for line in progress), (text, captured.err)
    assert (data["total"], data["max"]) == (FULL - 4, FULL)
    assert [row["exercise"] for row in data["rows"]] == ["0.1", "0.2", "0.3"]
    assert data["rows"][2]["feedback"] == (
        "3 of 3 cases failed: `mean` is not defined — did you run the cell with your answer?"
    )


def test_cli_grade_missing_notebook_exits_1(tmp_path, capsys):
    assert main(["grade", str(tmp_path / "nope.ipynb")]) == 1
    assert "no such notebook" in capsys.readouterr().err


def test_cli_grade_a_file_that_is_not_a_notebook_exits_1_and_says_why(tmp_path, capsys):
    path = tmp_path / "notes.txt"
    path.write_text("hello")
    assert main(["grade", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"could not grade {path}: could not read the notebook: NotJSONError" in err


def test_cli_grade_a_notebook_without_exercises_exits_1_and_says_why(tmp_path, capsys):
    path = tmp_path / "scratch.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), path)
    assert main(["grade", str(path), "--json", "--cell-timeout", "10", "--timeout", "60"]) == 1
    captured = capsys.readouterr()
    assert json.loads(captured.out)["max"] == 0
    assert f"could not grade {path}: it has no exercises to grade" in captured.err
    assert "starting a kernel" not in captured.err  # nothing to grade: nothing is run


def test_ungradable_is_empty_for_a_graded_notebook_even_at_zero_points():
    report = GradeReport("a.ipynb", [ExerciseGrade("0.1", "Square", 0, 3, "not checked")],
                         ["the kernel died in cell 3"])
    assert ungradable(report) == ""
    report.notes.append("could not start a kernel: RuntimeError: no kernel")
    assert ungradable(report) == "could not start a kernel: RuntimeError: no kernel"


def test_cli_exercises_build_check(tmp_path, capsys):
    src, dst = tmp_path / "solutions", tmp_path / "exercises"
    src.mkdir()
    (src / "ch00_demo.ipynb").write_bytes(DEMO.read_bytes())
    args = ["exercises", "build", "--src", str(src), "--dst", str(dst)]
    assert main(args + ["--check"]) == 1
    assert "ch00_demo.ipynb" in capsys.readouterr().out
    assert main(args) == 0
    assert (dst / "ch00_demo.ipynb").read_bytes() == (EXERCISES / "ch00_demo.ipynb").read_bytes()
    assert main(args + ["--check"]) == 0
    assert "up to date" in capsys.readouterr().out


def test_cli_open_launches_jupyter_lab_on_the_start_page(monkeypatch):
    calls = []
    monkeypatch.setattr("mlsys_lab.cli.subprocess.call",
                        lambda cmd, cwd=None: calls.append(cmd) or 0)
    assert main(["open"]) == 0
    assert calls[0][1:3] == ["-m", "jupyterlab"] and calls[0][-1] == "index.ipynb"


CHAPTER_SETS = sorted(p.name for p in SOLUTIONS.glob("ch*.ipynb") if p.name != "ch00_demo.ipynb")


def test_a_cell_that_raises_outside_the_answers_is_noted(tmp_path):
    """A notebook that grades with no notes ran every cell cleanly: what the full-marks test
    below relies on, since it is the suite's one run of the solution notebooks."""
    nb = nbformat.read(DEMO, as_version=4)
    nb.cells.insert(2, nbformat.v4.new_code_cell("raise ValueError('not an answer')"))
    path = tmp_path / "ch00_demo.ipynb"
    nbformat.write(nb, path)
    report = grade(path, cell_timeout=60, timeout=300)
    assert report.total == report.max > 0, report.to_table()  # the answers are unaffected
    assert report.notes == ["cell 3 raised ValueError: not an answer"], report.notes


@pytest.mark.parametrize("name", CHAPTER_SETS)
def test_chapter_solution_full_marks_and_exercise_zero(name, no_leftover_processes):
    """Every chapter's reference solutions score full marks with every cell run cleanly (no
    notes); its student version scores zero and still runs to the end. This is the suite's
    only run of the solution notebooks (nbval runs the chapters, not these)."""
    full = grade(SOLUTIONS / name, cell_timeout=120, timeout=600)
    assert full.total == full.max > 0 and full.notes == [], full.to_table()
    stub = grade(EXERCISES / name, cell_timeout=120, timeout=600)
    assert (stub.total, stub.max) == (0, full.max), stub.to_table()
