"""Class statistics: which exercise, and which idea in it, did not land.

``class_statistics(results)`` gives, per exercise, the number of submissions, the mean score,
the distribution of scores (how many got each number of points) and the case that failed most
often with its most common message. ``format_statistics`` prints them; ``plot_statistics`` draws
one histogram per exercise into a PNG.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from mlsys_lab.grading.core.exercise import compact, fmt_points
from mlsys_lab.grading.course.classroom import ClassResult
from mlsys_lab.grading.course.gradebook import _id_key, counted

__all__ = ["ExerciseStats", "class_statistics", "format_statistics", "plot_statistics"]


@dataclass
class ExerciseStats:
    """One exercise across the class."""

    exercise: str
    title: str
    max: float
    scores: list[float] = field(default_factory=list)
    failing_case: str = ""  # the case that failed most often
    failing_count: int = 0
    failing_message: str = ""  # its most common message
    no_result: int = 0  # submissions where no case ran (timed out, kernel died, unreadable)

    @property
    def n(self) -> int:
        """Submissions graded on this exercise."""
        return len(self.scores)

    @property
    def mean(self) -> float:
        """Mean points (0 for no submissions)."""
        return sum(self.scores) / len(self.scores) if self.scores else 0.0

    @property
    def distribution(self) -> dict[float, int]:
        """Points -> how many submissions got them, in increasing points."""
        return dict(sorted(Counter(self.scores).items()))


def class_statistics(results: list[ClassResult]) -> list[ExerciseStats]:
    """Per-exercise statistics of the submissions that count (see ``gradebook.counted``)."""
    kept, _ = counted(results)
    stats: dict[str, ExerciseStats] = {}
    failures: dict[str, Counter] = {}
    messages: dict[tuple[str, str], Counter] = {}
    for result in kept:
        for row in result.report.rows:
            entry = stats.setdefault(row.exercise, ExerciseStats(row.exercise, row.title, row.max))
            entry.scores.append(float(row.points))
            failed = [(c["name"], c.get("feedback", "")) for c in row.cases if not c["passed"]]
            if not row.cases:
                entry.no_result += 1
            for name, message in failed:
                failures.setdefault(row.exercise, Counter())[name] += 1
                messages.setdefault((row.exercise, name), Counter())[message] += 1
    for ex_id, counter in failures.items():
        name, count = counter.most_common(1)[0]
        entry = stats[ex_id]
        entry.failing_case, entry.failing_count = name, count
        entry.failing_message = messages[(ex_id, name)].most_common(1)[0][0]
    return [stats[k] for k in sorted(stats, key=_id_key)]


def format_statistics(stats: list[ExerciseStats]) -> str:
    """The statistics as text, one block per exercise."""
    lines = ["Class statistics"]
    for s in stats:
        dist = ", ".join(f"{fmt_points(p)}: {c}" for p, c in s.distribution.items())
        lines.append(f"  {s.exercise} {s.title}: mean {s.mean:.2f}/{fmt_points(s.max)} "
                     f"({100 * s.mean / s.max if s.max else 0:.0f}%) over {s.n}; "
                     f"points -> students: {dist}")
        if s.failing_count:
            message = compact(s.failing_message)
            message = message if len(message) <= 120 else message[:117] + "..."
            lines.append(f"      most failed: {s.failing_case!r} ({s.failing_count} of {s.n})"
                         + (f": {message}" if message else ""))
        if s.no_result:
            lines.append(f"      no case ran for {s.no_result} of {s.n} (timed out, kernel died, "
                         "or not readable: see their notes)")
    return "\n".join(lines)


def plot_statistics(stats: list[ExerciseStats], path: str | Path) -> Path:
    """Draw one score histogram per exercise (mean marked) into a PNG; return its path."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = max(len(stats), 1)
    cols = min(n, 4)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), squeeze=False)
    for ax in axes.flat[len(stats):]:
        ax.axis("off")
    for ax, s in zip(axes.flat, stats):
        dist = s.distribution
        ax.bar([float(p) for p in dist], list(dist.values()), width=max(s.max, 1) / 12,
               color="#4c72b0")
        ax.axvline(s.mean, color="#dd8452", linestyle="--", label=f"mean {s.mean:.2f}")
        ax.set_xlim(-0.1 * max(s.max, 1), 1.1 * max(s.max, 1))
        ax.set_title(f"{s.exercise} {s.title}"[:40], fontsize=9)
        ax.set_xlabel(f"points (of {fmt_points(s.max)})", fontsize=8)
        ax.set_ylabel("students", fontsize=8)
        ax.legend(fontsize=7)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
