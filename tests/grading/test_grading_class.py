"""Teaching a course: class folders, parallel grading, the cache, gradebook, feedback, statistics,
the release pack and its stamp.

Kernels are expensive, so one class folder (good, stub, wrong, hostile and malformed notebooks of
the chapter 0 demo) is graded once in parallel (module fixture) and most tests assert on that
run; the serial run grades three of its notebooks again, the re-grade one, the Ctrl-C test two.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import nbformat
import pytest

from mlsys_lab.cli import main
from mlsys_lab.errors import ArgumentError
from mlsys_lab.grading.core.check import check
from mlsys_lab.grading.core.grader import ExerciseGrade, GradeReport
from mlsys_lab.grading.course import builder, commands, release
from mlsys_lab.grading.course.classroom import (
    ClassResult,
    GradeCache,
    GradingOptions,
    cache_key,
    grade_class,
)
from mlsys_lab.grading.course.feedback import exercise_report, feedback_html, write_feedback
from mlsys_lab.grading.course.gradebook import build_gradebook, read_csv, write_csv
from mlsys_lab.grading.course.statistics import class_statistics, format_statistics, plot_statistics
from mlsys_lab.grading.course.submissions import Submission, find_submissions

from ..processes import alive, descendants, processes
from .test_grading import _demo_with, _points

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "solutions" / "ch00_demo.ipynb"
FULL = {"0.1": 3, "0.2": 5, "0.3": 4}
OPTIONS = GradingOptions(cell_timeout=4, timeout=60)
CLI_TIMEOUTS = ["--cell-timeout", "4", "--timeout", "60"]


# ----------------------------------------------------------------------------- helpers


FIB = ("def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
       "    return a\n")
WRONG_FIB = "def fib(n):\n    return n\n"
ONE_THREAD_SQUARE = (
    "import numba\nimport numpy\nfrom threadpoolctl import threadpool_info\n"
    "ONE = numba.config.NUMBA_NUM_THREADS == 1 and threadpool_info() != [] and all(\n"
    "    pool['num_threads'] == 1 for pool in threadpool_info())\n"
    "def square(x):\n    return x * x if ONE else -1\n"
)


# ----------------------------------------------------------------------------- the class


def _released_stub(tmp: Path, path: Path, tamper: bool) -> Path:
    """The chapter 0 exercise as the release pack hands it out (optionally with a stale stamp)."""
    src = tmp / "src"
    src.mkdir(exist_ok=True)
    (src / DEMO.name).write_bytes(DEMO.read_bytes())
    release.release(src, None, tmp / "pack")
    nb = nbformat.read(tmp / "pack" / "exercises" / DEMO.name, as_version=4)
    if tamper:
        nb.metadata["mlsys_lab"]["release"]["checks"] = "sha256:0000000000000000"
    nbformat.write(nb, path)
    return path


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """A mixed class folder graded with 2 workers: (folder, {student: ClassResult}, processes
    left behind, cache)."""
    tmp = tmp_path_factory.mktemp("class")
    folder = tmp / "submissions"
    _demo_with(None, "", folder / "alice_12345_ch00.ipynb")  # LMS name, full marks
    # folder per student; and right only in a kernel with one BLAS and one Numba thread
    _demo_with("0.1", ONE_THREAD_SQUARE, folder / "frank" / "ch00_demo.ipynb")
    _released_stub(tmp, folder / "bob_ch00.ipynb", tamper=True)  # stub, stale release stamp
    _demo_with("0.2", WRONG_FIB, folder / "carol_ch00.ipynb")  # partly wrong
    _demo_with("0.2", FIB + "while True:\n    pass\n", folder / "henry_ch00.ipynb")
    _demo_with("0.2", FIB + "import os\nos._exit(1)\n", folder / "ivan_ch00.ipynb")
    _demo_with("0.1", "for _ in range(20):\n    print('x' * 100_000)\n\n"
               "def square(x):\n    return x * x\n", folder / "judy_ch00.ipynb")
    (folder / "erin_ch00.ipynb").write_text("{not json")
    _demo_with(None, "", folder / "dave_ch04.ipynb")  # chapter 0's notebook, handed in for ch04

    subs, skipped = find_submissions(folder)
    assert skipped == []
    cache = GradeCache(tmp / "cache.json")
    before = set(descendants(os.getpid(), zombies=False))
    seen = []
    results = grade_class(subs, jobs=2, options=OPTIONS, cache=cache, on_result=seen.append)
    time.sleep(0.5)
    # multiprocessing's resource tracker (started with the first spawned worker) lives as long
    # as this process, by design; anything else still running is a leak.
    left = {p: c for p, c in descendants(os.getpid(), zombies=False).items()
            if p not in before and "resource_tracker" not in c}
    assert len(seen) == len(results) == len(subs)
    return folder, {r.submission.student: r for r in results}, left, cache


def test_every_submission_is_recognised(graded_class):
    _, results, _, _ = graded_class
    found = {s: (r.submission.assignment, r.submission.student_id) for s, r in results.items()}
    assert found == {
        "alice": ("ch00", "12345"), "frank": ("ch00", ""), "bob": ("ch00", ""),
        "carol": ("ch00", ""), "henry": ("ch00", ""), "ivan": ("ch00", ""),
        "judy": ("ch00", ""), "erin": ("ch00", ""), "dave": ("ch04", ""),
    }


def test_good_notebooks_grade_correctly_and_bad_ones_say_why(graded_class):
    _, results, _, _ = graded_class

    def report(student):
        return results[student].report

    for student in ("alice", "frank", "judy"):
        assert _points(report(student)) == FULL, report(student).to_table()
    assert _points(report("bob")) == {"0.1": 0, "0.2": 0, "0.3": 0}
    assert all("NotImplementedError" in row.feedback for row in report("bob").rows)
    assert _points(report("carol")) == {"0.1": 3, "0.2": 1, "0.3": 4}
    for student, words in [("henry", "timed out after 4 s"), ("ivan", "kernel died"),
                           ("judy", "output too long"), ("erin", "could not read the notebook"),
                           ("dave", "wrong chapter")]:
        text = report(student).to_table()
        assert words in text, text
    assert _points(report("henry")) == {"0.1": 3, "0.2": 0, "0.3": 4}
    assert _points(report("ivan")) == {"0.1": 3, "0.2": 0, "0.3": 4}
    assert (report("erin").total, report("erin").max) == (0, 12)
    dave = report("dave")  # graded on chapter 4's exercises, which the notebook does not hold
    assert dave.total == 0 and dave.max > 0
    assert {row.exercise.split(".")[0] for row in dave.rows} == {"4"}
    assert "released with mlsys-lab" in results["bob"].warning
    assert "sha256:0000000000000000" in results["bob"].warning


def test_no_worker_or_kernel_survives_the_run(graded_class):
    _, _, left, _ = graded_class
    assert left == {}, f"processes left behind: {left}"


def test_parallel_and_serial_grading_give_identical_scores(graded_class):
    folder, parallel, _, _ = graded_class
    subs = [s for s in find_submissions(folder)[0] if s.student in ("alice", "bob", "carol")]
    serial = grade_class(subs, jobs=1, options=OPTIONS, cache=None)
    assert len(serial) == 3 and not any(r.cached for r in serial)
    for result in serial:
        assert _points(result.report) == _points(parallel[result.submission.student].report)


def test_regrading_touches_only_the_changed_submission(graded_class, tmp_path):
    folder, first, _, cache = graded_class
    copy = GradeCache(tmp_path / "cache.json")
    copy.entries = json.loads(json.dumps(cache.entries))
    _demo_with("0.2", FIB, folder / "carol_ch00.ipynb")  # carol hands in a fix
    subs, _ = find_submissions(folder)
    again = grade_class(subs, jobs=2, options=OPTIONS, cache=copy)
    fresh = [r.submission.student for r in again if not r.cached]
    assert fresh == ["carol"]
    by_student = {r.submission.student: r for r in again}
    assert _points(by_student["carol"].report) == FULL
    for student, result in by_student.items():
        if student != "carol":
            assert result.report.to_dict()["rows"] == first[student].report.to_dict()["rows"]
    # other grading options are another key: nothing is reused
    other = GradingOptions(cell_timeout=5, timeout=60)
    content = subs[0].path.read_bytes()
    assert cache_key(content, subs[0], other, "x") != cache_key(content, subs[0], OPTIONS, "x")
    assert cache_key(content + b" ", subs[0], OPTIONS, "x") != cache_key(
        content, subs[0], OPTIONS, "x")
    _demo_with("0.2", WRONG_FIB, folder / "carol_ch00.ipynb")  # put it back for other tests


def test_cli_writes_gradebook_feedback_and_report_from_the_cache(graded_class, tmp_path, capsys):
    folder, results, _, cache = graded_class
    mine = GradeCache(tmp_path / "cache.json")
    mine.entries = dict(cache.entries)
    mine.put("gone_ch00.ipynb", "a key", results["carol"].report)  # no longer in the folder
    mine.save()
    out = tmp_path / "out"
    code = main(["grade", "--all", str(folder), *CLI_TIMEOUTS, "--cache", str(mine.path),
                 "--csv", str(out / "gradebook.csv"), "--feedback", str(out / "feedback"),
                 "--report", str(out / "stats.png"), "--json"])
    assert code == 0
    captured = capsys.readouterr()
    data = json.loads(captured.out)
    assert all(item["cached"] for item in data)  # nothing re-graded: no kernel started
    assert {item["student"]: item["total"] for item in data}["carol"] == 8
    assert "bob_ch00.ipynb was released with" in captured.err  # the stamp warning
    assert "Class statistics" in captured.err and (out / "stats.png").stat().st_size > 1000
    assert sorted(GradeCache(mine.path).entries) == sorted(cache.entries)  # "gone" is pruned

    # the CSV: one row per student, one column per exercise, and it reads back the same
    with (out / "gradebook.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(results)
    header = list(rows[0])
    assert header[3:3 + 3] == ["0.1", "0.2", "0.3"] and header[-3:] == ["total", "max", "notes"]
    carol = next(r for r in rows if r["student"] == "carol")
    assert (carol["0.1"], carol["0.2"], carol["0.3"], carol["total"]) == ("3", "1", "4", "8")
    dave = next(r for r in rows if r["student"] == "dave")
    assert dave["0.1"] == "" and "wrong chapter" in dave["notes"]
    assert read_csv(out / "gradebook.csv").to_dict() == build_gradebook(
        list(results.values())).to_dict()

    # feedback: one file per submission, and carol's says what check() would have said
    files = sorted(p.name for p in (out / "feedback").iterdir())
    assert len(files) == len(results) and "carol_ch00.html" in files
    text = (out / "feedback" / "carol_ch00.html").read_text()
    row = next(r for r in results["carol"].report.rows if r.exercise == "0.2")
    ns: dict = {}
    exec(WRONG_FIB, ns)
    printed = check("0.2", ns["fib"], seed=row.seed).report()
    assert exercise_report(row) == printed
    import html

    assert html.escape(printed) in text


def test_feedback_escapes_what_the_notebook_wrote(tmp_path):
    row = ExerciseGrade("0.1", "Square", 0, 3, "x", [
        {"name": "square(3) == 9", "points": 0, "max": 3, "passed": False,
         "feedback": "raised ValueError: <script>alert(1)</script>", "trusted": True}], None)
    report = GradeReport("x.ipynb", [row], ["<b>note</b>"])
    page = feedback_html(report, "<img src=x>")
    assert "<script>" not in page and "<img" not in page and "<b>note" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    sub = Submission(tmp_path / "x.ipynb", "a/../b", "ch00", "", "x.ipynb")
    [md] = write_feedback([ClassResult(sub, report)], tmp_path / "fb", "md")
    assert md.parent == tmp_path / "fb" and md.suffix == ".md"
    assert "square(3) == 9" in md.read_text()
    with pytest.raises(ValueError, match="html.*md"):
        write_feedback([], tmp_path, "pdf")


def test_class_statistics_match_a_brute_force_count(graded_class, tmp_path):
    _, results, _, _ = graded_class
    stats = {s.exercise: s for s in class_statistics(list(results.values()))}
    for ex_id in ("0.1", "0.2", "0.3"):
        scores = [row.points for r in results.values() for row in r.report.rows
                  if row.exercise == ex_id]
        assert stats[ex_id].n == len(scores) == 8  # dave's notebook was graded on chapter 4
        assert stats[ex_id].mean == pytest.approx(sum(scores) / len(scores))
        assert stats[ex_id].distribution == {p: scores.count(p) for p in sorted(set(scores))}
    # 0.2 fails for bob (stub), carol (wrong), henry (loop), ivan (died), erin (not JSON)
    assert stats["0.2"].distribution == {0: 4, 1: 1, 5: 3}
    counts: dict[str, int] = {}
    for r in results.values():
        for row in r.report.rows:
            if row.exercise == "0.2":
                for case in row.cases:
                    if not case["passed"]:
                        counts[case["name"]] = counts.get(case["name"], 0) + 1
    best = max(counts.values())
    assert stats["0.2"].no_result == 3  # henry (timed out), ivan (died), erin (not JSON)
    assert stats["0.2"].failing_count == best
    assert counts[stats["0.2"].failing_case] == best
    text = format_statistics(list(stats.values()))
    assert "0.2 Fibonacci numbers: mean" in text and "most failed" in text
    png = plot_statistics(list(stats.values()), tmp_path / "s.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_statistics_show_the_most_common_message_with_short_numbers():
    from mlsys_lab.grading.course.statistics import ExerciseStats

    stats = ExerciseStats("9.1", "Parallel map", 4, [0, 4], failing_case="order",
                          failing_count=1,
                          failing_message="returned 0.30000000000000004, expected 0.4")
    text = format_statistics([stats])
    assert "most failed: 'order' (1 of 2): returned 0.3, expected 0.4" in text


# ----------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_stops_the_cli_and_leaves_no_kernel(tmp_path):
    folder = tmp_path / "hung"
    for name in ("amy_ch00.ipynb", "ben_ch00.ipynb"):
        _demo_with("0.1", "import time\nwhile True:\n    time.sleep(0.1)\n", folder / name)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    # A terminal's Ctrl-C finds SIGINT at its default; a pytest started in the background of a
    # script inherits it ignored, and so would the CLI (Python keeps an inherited SIG_IGN), so
    # the CLI starts with the default restored.
    cli = subprocess.Popen(
        [sys.executable, "-m", "mlsys_lab.cli", "grade", "--all", str(folder), "--jobs", "2",
         "--cell-timeout", "120", "--timeout", "300", "--no-cache"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    kernels: set[int] = set()
    deadline = time.monotonic() + 90
    try:
        while time.monotonic() < deadline and len(kernels) < 2:
            kernels |= {p for p, cmd in descendants(cli.pid, zombies=False).items()
                        if "ipykernel" in cmd}
            time.sleep(0.2)
        assert len(kernels) == 2, "the kernels never started"
        time.sleep(1.0)  # let them get into the notebooks' loops
        cli.send_signal(signal.SIGINT)
        out, err = cli.communicate(timeout=60)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    assert cli.returncode == 130, err
    assert "interrupted after 0 of 2" in err
    time.sleep(0.5)
    assert [p for p in kernels if alive(p)] == [], "a kernel survived Ctrl-C"


def test_a_worker_that_dies_costs_only_its_own_submission(tmp_path):
    folder = tmp_path / "class"
    _demo_with("0.1", "import time\nwhile True:\n    time.sleep(0.1)\n", folder / "amy_ch00.ipynb")
    _demo_with(None, "", folder / "ben_ch00.ipynb")
    killed: dict[str, int] = {}

    def kill_the_worker():  # SIGKILL the worker (not its kernel) while amy's notebook hangs
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            for pid, cmd in descendants(os.getpid(), zombies=False).items():
                # the table read after the kernel was seen: one read before could miss it
                # (a KeyError here once left the worker alive and the test waiting)
                parent = processes().get(pid)
                if "ipykernel" in cmd and parent is not None:
                    killed.update(kernel=pid, worker=parent[0])
                    time.sleep(1.0)
                    os.kill(killed["worker"], signal.SIGKILL)
                    return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_the_worker)
    killer.start()
    subs, _ = find_submissions(folder)
    results = {r.submission.student: r.report for r in grade_class(
        subs, jobs=1, options=GradingOptions(cell_timeout=120, timeout=300))}
    killer.join()
    assert "kernel" in killed, "no kernel was seen"
    assert results["amy"].notes == ["the grading worker died (exit code -9)"]
    assert (results["amy"].total, results["amy"].max) == (0, 12)
    assert _points(results["ben"]) == FULL  # a fresh worker graded the next notebook
    time.sleep(0.5)
    assert not alive(killed["kernel"]), "the dead worker's kernel was left running"


# ----------------------------------------------------------------------------- callers' scripts


_SCRIPT = """
import json, sys
from mlsys_lab.grading.course.classroom import GradingOptions, grade_class
from mlsys_lab.grading.course.submissions import find_submissions
subs, _ = find_submissions(sys.argv[1] if len(sys.argv) > 1 else {folder!r})
print(json.dumps([[r.report.total, r.report.notes] for r in grade_class(
    subs, jobs=1, options=GradingOptions(cell_timeout=30, timeout=120))]))
"""


@pytest.mark.parametrize("how", ["stdin", "no main guard"])
def test_a_script_without_a_rerunnable_main_can_grade(tmp_path, how):
    # spawn re-runs the caller's main script in each worker: fed on stdin there is no file to
    # run (the worker died: 0 points, "the grading worker died"), and a script that grades at
    # top level would grade again inside every worker
    folder = tmp_path / "class"
    _demo_with(None, "", folder / "amy_ch00.ipynb")
    script = _SCRIPT.format(folder=str(folder))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get(
        "PYTHONPATH", "")])}
    if how == "stdin":
        run = subprocess.run([sys.executable, "-"], input=script, cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=240)
    else:
        (tmp_path / "grade_all.py").write_text(script, encoding="utf-8")
        run = subprocess.run([sys.executable, "grade_all.py", str(folder)], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == [[12, []]], run.stderr


# ----------------------------------------------------------------------------- layouts


@pytest.mark.parametrize("rel, student, assignment, student_id", [
    ("alice.ipynb", "alice", "", ""),
    ("alice_ch04.ipynb", "alice", "ch04", ""),
    ("alice/ch04_computational_graph.ipynb", "alice", "ch04", ""),
    ("alice/04_computational_graph.ipynb", "alice", "ch04", ""),
    ("alice_12345_ch04.ipynb", "alice", "ch04", "12345"),
    ("smithjo_late_12345_67890_ch06_compiler.ipynb", "smithjo", "ch06", "12345"),
    ("Ann Lee_12345_assignsubmission_file_chapter4.ipynb", "Ann Lee", "ch04", "12345"),
    ("march04_notes.ipynb", "march04_notes", "", ""),
])
def test_layouts_name_the_student_and_assignment(tmp_path, rel, student, assignment, student_id):
    (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / rel).write_text("{}")
    [sub], skipped = find_submissions(tmp_path)
    assert (sub.student, sub.assignment, sub.student_id, sub.name) == (
        student, assignment, student_id, rel)
    assert sub.path == tmp_path / rel and skipped == []


def test_pattern_overrides_the_rules_and_skips_what_does_not_match(tmp_path):
    for rel in ("2024/alice/hw4.ipynb", "2024/bob/hw6.ipynb", "notes.ipynb",
                ".ipynb_checkpoints/x.ipynb", "2024/bob/.ipynb_checkpoints/hw6.ipynb"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("{}")
    subs, skipped = find_submissions(
        tmp_path, r"\d+/(?P<student>[^/]+)/hw(?P<assignment>\d+)\.ipynb")
    assert [(s.student, s.assignment) for s in subs] == [("alice", "ch04"), ("bob", "ch06")]
    assert skipped == [Path("notes.ipynb")]
    with pytest.raises(ArgumentError, match="no .*student"):
        find_submissions(tmp_path, r"(?P<name>.*)")
    with pytest.raises(ArgumentError, match="not a regular expression"):
        find_submissions(tmp_path, r"(")
    with pytest.raises(ArgumentError, match="no such folder"):
        find_submissions(tmp_path / "missing")


# ----------------------------------------------------------------------------- gradebook


def _result(student: str, points: dict[str, float], name: str, path: Path, notes=()):
    rows = [ExerciseGrade(ex, f"Title {ex}", p, 5, "") for ex, p in points.items()]
    sub = Submission(path, student, f"ch{name}", "", path.name)
    path.write_text("{}")
    return ClassResult(sub, GradeReport(str(path), rows, list(notes)))


def test_gradebook_csv_round_trips_hostile_names_and_merges_assignments(tmp_path):
    results = [
        _result("=HYPERLINK(\"x\")", {"4.1": 5, "4.10": 2.5}, "04", tmp_path / "a.ipynb"),
        _result("bo,b \"quoted\"", {"4.1": 0, "4.2": 1}, "04", tmp_path / "b.ipynb",
                ["-1 kernel died, \"again\""]),
        _result("bo,b \"quoted\"", {"6.1": 4}, "06", tmp_path / "c.ipynb"),
    ]
    book = build_gradebook(results)
    assert book.exercises == ["4.1", "4.2", "4.10", "6.1"]  # id order, not string order
    bob = book.row("bo,b \"quoted\"")
    assert (bob["4.1"], bob["4.2"], bob["4.10"], bob["6.1"], bob["total"], bob["max"]) == (
        0, 1, None, 4, 5, 15)
    path = write_csv(book, tmp_path / "gb.csv")
    raw = path.read_text()
    assert "\n=HYPERLINK" not in raw and "'=HYPERLINK" in raw  # no formula for a spreadsheet
    assert read_csv(path).to_dict() == book.to_dict()
    with pytest.raises(KeyError):
        book.row("nobody")
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not a gradebook"):
        read_csv(tmp_path / "bad.csv")


def test_of_two_submissions_for_one_assignment_the_newer_counts(tmp_path):
    old = _result("amy", {"4.1": 1}, "04", tmp_path / "amy_ch04.ipynb")
    new = _result("amy", {"4.1": 5}, "04", tmp_path / "amy_ch04_v2.ipynb")
    os.utime(old.submission.path, (1_000_000, 1_000_000))
    book = build_gradebook([new, old])
    assert book.row("amy")["4.1"] == 5 and "the newer amy_ch04_v2.ipynb counts" in (
        book.row("amy")["notes"])


# ----------------------------------------------------------------------------- release


def test_release_pack_has_no_solutions_and_is_stamped(tmp_path):
    out = tmp_path / "pack"
    assert main(["exercises", "release", "--out", str(out)]) == 0
    exercises = sorted(p.name for p in (out / "exercises").glob("*.ipynb"))
    assert exercises == sorted(p.name for p in (ROOT / "solutions").glob("ch*.ipynb"))
    chapters = sorted(p.name for p in (out / "chapters").glob("*.ipynb"))
    assert chapters == sorted(p.name for p in (ROOT / "chapters").glob("*.ipynb"))
    assert not (out / "solutions").exists()
    for path in (out / "exercises").glob("*.ipynb"):
        nb = nbformat.read(path, as_version=4)
        code = [line.strip() for c in nb.cells if c.cell_type == "code"
                for line in c.source.splitlines()]
        assert builder.BEGIN not in code and builder.END not in code
        assert "generated_from" not in nb.metadata["mlsys_lab"]  # names the solutions file
        chapter = nb.metadata["mlsys_lab"]["chapter"]
        assert nb.metadata["mlsys_lab"]["release"] == release.release_stamp(chapter)
        assert release.stamp_problem(nb.metadata, chapter, path.name) == ""
        # the pack's notebook is the repository's exercise notebook plus the stamp
        repo = nbformat.read(ROOT / "exercises" / path.name, as_version=4)
        assert [c.source for c in nb.cells] == [c.source for c in repo.cells]
    solution = (ROOT / "solutions" / "ch00_demo.ipynb").read_text()
    assert "a, b = b, a + b" in solution
    assert "a, b = b, a + b" not in (out / "exercises" / "ch00_demo.ipynb").read_text()


def test_checks_stamp_follows_the_check_sources(tmp_path, monkeypatch):
    stamp = release.checks_stamp(0)
    assert stamp.startswith("sha256:") and stamp == release.checks_stamp(0)
    assert stamp != release.checks_stamp(4)
    copy = tmp_path / "mlsys_lab" / "grading"
    shutil.copytree(ROOT / "mlsys_lab" / "grading", copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    real = release.module_file
    monkeypatch.setattr(release, "module_file",
                        lambda name: tmp_path / real(name).relative_to(ROOT))
    assert release.checks_stamp(0) == stamp and release.checks_stamp(4) != stamp
    before = release.checks_stamp(4)
    ex4_1 = copy / "exercises" / "ch04_computational_graph" / "ex4_1_toposort.py"
    ex4_1.write_text(ex4_1.read_text() + "\n# changed\n")
    assert release.checks_stamp(4) != before  # one exercise's module is part of its chapter's
    assert release.checks_stamp(0) == stamp  # chapter 4's checks are not chapter 0's
    judge = copy / "core" / "judge.py"
    judge.write_text(judge.read_text() + "\n# changed\n")
    changed = release.checks_stamp(0)
    assert changed != stamp  # the judges are part of every chapter's checks
    meta = {"mlsys_lab": {"chapter": 0, "release": {"version": "0.0.9", "checks": stamp}}}
    problem = release.stamp_problem(meta, None, "amy.ipynb")
    assert stamp in problem and changed in problem and "0.0.9" in problem
    assert release.stamp_problem({"mlsys_lab": {"chapter": 0}}, None, "x") == ""
    assert "x carries no release stamp" in release.stamp_problem({"mlsys_lab": {"chapter": 0}},
                                                                 None, "x", require=True)
    with pytest.raises(ArgumentError, match="chapter 99 has no exercises"):
        release.checks_stamp(99)


def test_strict_refuses_a_stale_stamp_before_grading_anything(tmp_path, capsys):
    folder = tmp_path / "class"
    folder.mkdir()
    _released_stub(tmp_path, folder / "bob_ch00.ipynb", tamper=True)
    assert main(["grade", "--all", str(folder), "--strict", "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert "refusing: bob_ch00.ipynb was released with" in err and "nothing was graded" in err
    assert "sha256:0000000000000000" in err and release.checks_stamp(0) in err
    assert main(["grade", str(folder / "bob_ch00.ipynb"), "--strict"]) == 1
    assert "refusing" in capsys.readouterr().err
    # a notebook that was never released has no stamp: --strict cannot vouch for it either
    unstamped = tmp_path / "unstamped"
    _demo_with(None, "", unstamped / "amy_ch00.ipynb")
    assert main(["grade", "--all", str(unstamped), "--strict", "--no-cache"]) == 1
    err = capsys.readouterr().err
    assert "refusing: amy_ch00.ipynb carries no release stamp" in err, err
    assert main(["grade", str(unstamped / "amy_ch00.ipynb"), "--strict"]) == 1
    assert "carries no release stamp" in capsys.readouterr().err


# ----------------------------------------------------------------------------- outside a checkout


def test_exercises_commands_outside_a_checkout_fail_saying_where_they_looked(
        tmp_path, monkeypatch, capsys):
    site = tmp_path / "site-packages"
    site.mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(commands, "_package_parent", lambda: site)
    for args in (["exercises", "build", "--check"], ["exercises", "build"],
                 ["exercises", "release", "--out", str(tmp_path / "pack")]):
        assert main(args) == 1, args
        err = capsys.readouterr().err
        assert f"looked in {tmp_path / 'solutions'} and {site / 'solutions'}" in err, err
    assert not (tmp_path / "pack").exists() and not (site / "exercises").exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ArgumentError, match="no ch.*ipynb solution notebooks"):
        builder.check_up_to_date(empty, tmp_path / "exercises")
    assert main(["exercises", "build", "--check", "--src", str(empty)]) == 1
    assert "cannot find the solution notebooks" in capsys.readouterr().err
