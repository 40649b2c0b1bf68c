"""The memory-lifetime chart: time on x, address on y, one rectangle per tensor.

``plot_lifetimes`` draws one plan; ``memory_widget`` adds a planner picker in a notebook;
``compare_table`` puts every planner side by side (arena, vs lower bound, saving, time).
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle

from mlsys_lab import timing
from mlsys_lab.engine import memory

from .picture import attach_static, figure_picture, in_notebook

__all__ = ["plot_lifetimes", "memory_widget", "compare_table", "format_table", "PlanRow"]

_MAX_LABELS = 40  # beyond this many tensors, labels only clutter the chart


def _label(tensor_id) -> str:
    return str(getattr(tensor_id, "name", tensor_id))


def plot_lifetimes(
    lifetimes: Sequence[memory.Lifetime], plan: memory.MemoryPlan, ax=None, title: str | None = None
):
    """Draw a plan as time × address rectangles.

    Each tensor of non-zero size is a rectangle spanning its steps (``start`` to ``end + 1``)
    and its bytes (``offset`` to ``offset + size``). Horizontal lines mark the plan's arena,
    the lower bound (most bytes live at once) and the no-reuse (naive) size.

    Args:
        lifetimes: The records the plan was made for.
        plan: The plan to draw.
        ax: A matplotlib Axes to draw on; a new figure is made if omitted.
        title: Figure title; defaults to the strategy and its arena size.

    Returns:
        The matplotlib Figure.
    """
    lifetimes = list(lifetimes)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(figsize=(8, 4.5))
    colours = plt.get_cmap("tab20")
    drawn = [r for r in lifetimes if r.size > 0]
    bound = memory.lower_bound(lifetimes, plan.alignment, inplace=plan.inplace)
    naive = memory.naive_size(lifetimes, plan.alignment)
    # The y axis fits the plan (its arena and the lower bound), not the no-reuse total, which can
    # be many times larger and would squeeze the plan into the bottom of the chart.
    top = max(plan.arena_size, bound, 1) * 1.12
    first = min((r.start for r in lifetimes), default=0)
    last = max((r.end for r in lifetimes), default=0)
    steps = max(last + 1 - first, 1)
    for i, r in enumerate(drawn):
        offset = plan.offsets[r.id]
        width = r.end - r.start + 1
        box = Rectangle(
            (r.start, offset),
            width,
            r.size,
            facecolor=colours(i % 20),
            edgecolor="black",
            linewidth=0.6,
            alpha=0.85,
        )
        ax.add_patch(box)
        # Label only the boxes a label fits in (tall and wide enough at this scale).
        label = _label(r.id)
        fits = r.size >= 0.045 * top and width >= steps * (0.012 * len(label) + 0.01)
        if len(drawn) <= _MAX_LABELS and fits:
            ax.text(r.start + width / 2, offset + r.size / 2, label, ha="center",
                    va="center", fontsize=8, clip_on=True)
    ax.axhline(plan.arena_size, color="tab:red", label=f"arena {plan.arena_size:,} B")
    ax.axhline(bound, color="tab:green", linestyle="--", label=f"lower bound {bound:,} B")
    # Above the chart when it is far larger: the legend says so instead of stretching the axis.
    above = "" if naive <= top else f" (x{naive / max(plan.arena_size, 1):.1f}, above)"
    ax.axhline(naive, color="tab:gray", linestyle=":", label=f"no reuse {naive:,} B{above}")
    ax.set_xlim(first, last + 1)
    ax.set_ylim(0, top)
    ax.set_xlabel("step")
    ax.set_ylabel("address (bytes)")
    ax.set_title(title or f"{plan.strategy}: arena {plan.arena_size:,} B")
    ax.legend(loc="upper right", fontsize=8, framealpha=0.9)
    return fig


class PlanRow(NamedTuple):
    """One line of ``compare_table``."""

    strategy: str
    arena: int
    vs_lower_bound: float  # arena / lower bound: 1.0 is optimal
    saving: float  # naive / arena: how many times smaller than no reuse
    ms: float  # planning time in milliseconds


def _ratio(a: int, b: int) -> float:
    return a / b if b else 1.0


def compare_table(
    lifetimes: Iterable[memory.Lifetime],
    strategies: Sequence[str] | None = None,
    alignment: int = 64,
) -> list[PlanRow]:
    """Plan with each strategy and report arena size, quality and planning time.

    Args:
        lifetimes: The records to plan.
        strategies: Names to compare; defaults to every registered strategy plus ``best``.
        alignment: Passed to ``plan``.

    Returns:
        A list of ``PlanRow(strategy, arena, vs_lower_bound, saving, ms)``.
    """
    lifetimes = list(lifetimes)
    names = list(strategies or [*memory.STRATEGIES, "best"])
    bound = memory.lower_bound(lifetimes, alignment)
    naive = memory.naive_size(lifetimes, alignment)
    rows = []
    for name in names:
        made, seconds = timing.timed(memory.plan, lifetimes, name, alignment)
        arena, ms = made.arena_size, seconds * 1e3
        rows.append(PlanRow(name, arena, _ratio(arena, bound), _ratio(naive, arena), ms))
    return rows


def format_table(rows: Sequence[PlanRow]) -> str:
    """``compare_table`` rows as aligned text, for printing."""
    lines = [f"{'strategy':<18} {'arena (B)':>14} {'/lower bd':>9} {'naive/':>7} {'ms':>8}"]
    for r in rows:
        lines.append(
            f"{r.strategy:<18} {r.arena:>14,} {r.vs_lower_bound:>9.3f} "
            f"{r.saving:>7.2f} {r.ms:>8.1f}"
        )
    return "\n".join(lines)


def _in_notebook() -> bool:
    return in_notebook()


def memory_widget(
    lifetimes: Iterable[memory.Lifetime],
    strategies: Sequence[str] | None = None,
    alignment: int = 64,
):
    """A planner picker: choose a strategy, see its chart and its peak vs the bounds.

    In a Jupyter kernel with ipywidgets this returns an ``ipywidgets.interactive`` (a
    Dropdown and the chart below it) whose display bundle also holds the first strategy's chart
    as PNG (what an untrusted notebook, nbconvert and GitHub show). Elsewhere, or without
    ipywidgets, it returns the static chart of the first strategy (``best`` by default) as a Figure.
    """
    lifetimes = list(lifetimes)
    names = list(strategies or ["best", *memory.STRATEGIES])
    bound = memory.lower_bound(lifetimes, alignment)
    naive = memory.naive_size(lifetimes, alignment)

    def figure(strategy):
        chosen = memory.plan(lifetimes, strategy, alignment)
        title = (
            f"{chosen.strategy}: peak {chosen.arena_size:,} B · lower bound {bound:,} B "
            f"· no reuse {naive:,} B"
        )
        return plot_lifetimes(lifetimes, chosen, title=title)

    try:
        import ipywidgets
    except ImportError:
        ipywidgets = None
    if ipywidgets is None or not _in_notebook():
        return figure(names[0])

    def draw(strategy):
        figure(strategy)
        plt.show()

    picker = ipywidgets.Dropdown(options=names, value=names[0], description="planner")
    widget = ipywidgets.interactive(draw, strategy=picker)
    alt = (f"memory plan picker over {len(names)} planners for {len(lifetimes)} tensors "
           f"(the picture shows {names[0]!r}; run the cell to pick another)")
    return attach_static(widget, figure_picture(figure(names[0]), alt))
