"""Class grading throughput: notebooks per minute with 1 and 2 worker processes.

    python benchmarks/grading.py [--copies 40] [--rounds 1] [--jobs 1 2] [--notebook ch04]

Grades ``--copies`` copies of the chapter 4 solutions (``solutions/ch04_computational_graph
.ipynb``, named like an LMS download, ``student007_12345_ch04.ipynb``; ``--notebook ch09`` takes
another chapter's) the way ``mlsys-lab grade --all FOLDER --jobs N --no-cache`` does
(``classroom.grade_class``): each notebook in a fresh kernel, kernels with one BLAS/OpenMP/Numba
thread, worker start-up included. The job counts run interleaved (1, 2, 1, 2, ... for
``--rounds``) and the best round of each is kept; every run must give every copy full marks.
Prints notebooks per minute for each job count, the ratio against 1 job (target on 2 cores:
>= 1.7x) and the load average next to each run (the machine may be shared: the ratio, measured
in the same run, is the result; absolute rates are noisy). First it times ``import mlsys_lab``
in a fresh interpreter, the part of every notebook's cost that each kernel pays again.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlsys_lab.grading.course.classroom import GradingOptions, grade_class
from mlsys_lab.grading.course.submissions import find_submissions

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "solutions" / "ch04_computational_graph.ipynb"


def make_class(folder: Path, copies: int, source: Path = SOURCE) -> None:
    """``copies`` copies of the solutions notebook ``source``, one per (made-up) student."""
    folder.mkdir(parents=True, exist_ok=True)
    chapter = source.name.split("_")[0]
    for i in range(copies):
        shutil.copyfile(source, folder / f"student{i:03d}_{10000 + i}_{chapter}.ipynb")


def import_seconds(repeat: int = 3) -> float:
    """The best of ``repeat`` wall times of ``python -c "import mlsys_lab"`` (a fresh
    interpreter, as each grading kernel starts) minus that of ``python -c pass``."""
    def best(code):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True)
            times.append(time.perf_counter() - start)
        return min(times)
    return best("import mlsys_lab") - best("pass")


def run(folder: Path, jobs: int) -> tuple[float, float]:
    """Grade the folder with ``jobs`` workers; return (seconds, load average at the end)."""
    subs, _ = find_submissions(folder)
    start = time.perf_counter()
    results = grade_class(subs, jobs=jobs, options=GradingOptions(60, 600), cache=None)
    elapsed = time.perf_counter() - start
    wrong = [r for r in results if r.report.total != r.report.max or r.report.max == 0]
    if wrong:
        raise SystemExit(f"jobs={jobs}: not full marks for {len(wrong)} notebook(s):\n"
                         + "\n".join(r.report.to_table() for r in wrong[:3]))
    return elapsed, os.getloadavg()[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=40, help="notebooks graded per run")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds (best kept)")
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2], help="job counts")
    parser.add_argument("--notebook", default="ch04", metavar="CHNN",
                        help="the solutions notebook to copy (default ch04)")
    args = parser.parse_args()
    matches = sorted((ROOT / "solutions").glob(f"{args.notebook}_*.ipynb"))
    if len(matches) != 1:
        raise SystemExit(f"--notebook {args.notebook}: no single solutions/{args.notebook}_*.ipynb")
    source = matches[0]
    print(f"grading {args.copies} copies of {source.relative_to(ROOT)}; "
          f"cores: {os.cpu_count()}, load average before: "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"import mlsys_lab in a fresh interpreter: {import_seconds():.2f} s "
          f"(paid again by every kernel)", flush=True)
    best: dict[int, float] = {}
    with tempfile.TemporaryDirectory(prefix="mlsys-grading-bench-") as tmp:
        folder = Path(tmp) / "submissions"
        make_class(folder, args.copies, source)
        for round_ in range(args.rounds):
            for jobs in args.jobs:
                seconds, load = run(folder, jobs)
                rate = 60 * args.copies / seconds
                print(f"  round {round_ + 1}  jobs={jobs}: {seconds:7.1f} s  {rate:6.1f} "
                      f"notebooks/min  (load average {load:.2f})", flush=True)
                best[jobs] = min(best.get(jobs, float("inf")), seconds)
    base = best[args.jobs[0]]
    print(f"\n{'jobs':>6} {'best s':>8} {'nb/min':>8} {'vs ' + str(args.jobs[0]) + ' job':>9}")
    for jobs in args.jobs:
        print(f"{jobs:>6} {best[jobs]:8.1f} {60 * args.copies / best[jobs]:8.1f} "
              f"{base / best[jobs]:8.2f}x")
    print(f"targets: 2 jobs >= 1.7x of 1 job, >= 30 notebooks/min with 2 jobs; "
          f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
