"""The collective stepper: where each chunk of a ring all-reduce is, on every rank, step by step.

:func:`ring_allreduce_steps` replays the ring all-reduce of
:mod:`mlsys_lab.distributed.collectives` chunk by chunk — the same blocks (``block_bounds``), the
same sends and the same order of additions, so its last state equals the simulator's result bit
for bit — and records after every step what each rank holds of each chunk: the value and the
ranks whose inputs it combines. :func:`plot_ring_step` draws one state, :func:`static` every state
side by side (the picture nbconvert and GitHub show), and :func:`collective_stepper` is a slider
over the steps in a live notebook.

:class:`WidgetWithStatic` is shared by the chapter-11 widgets: a live ipywidgets widget whose output
also carries a PNG, so a page without a widget manager still shows the picture.
"""

from __future__ import annotations

from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from ..distributed.collectives import OPS, block_bounds
from ..errors import ArgumentError, ShapeError
from .picture import WidgetWithStatic, in_notebook, png_bytes

__all__ = ["SCREEN_DPI", "SHARPNESS", "Chunk", "RingStep", "WidgetWithStatic",
           "collective_stepper", "describe_step", "image_widget", "in_notebook", "plot_ring_step",
           "png_bytes", "png_size", "ring_allreduce_steps", "static"]


# --------------------------------------------------------------------------- shared widget plumbing
SCREEN_DPI = 90     # CSS pixels per inch of figure: a figure is shown at figsize x SCREEN_DPI
SHARPNESS = 2       # live images are drawn with this many device pixels per CSS pixel


def png_size(png: bytes) -> tuple[int, int]:
    """``(width, height)`` in pixels of a PNG image (read from its header)."""
    if bytes(png[:8]) != b"\x89PNG\r\n\x1a\n" or bytes(png[12:16]) != b"IHDR":
        raise ArgumentError("png_size: not the bytes of a PNG image")
    return int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")


def image_widget(controls, render, caption=None, sharpness=SHARPNESS):
    """``VBox(controls, [caption], Image)``: ``render(**values) -> PNG bytes`` redraws the image
    whenever a control changes. ``controls`` maps keyword names to ipywidgets controls.

    ``render`` draws at ``sharpness`` times :data:`SCREEN_DPI`, and the image is shown at its
    drawn size divided by ``sharpness`` (sharp on a high-density screen, never stretched to the
    output's width; narrower outputs scale it down)."""
    import ipywidgets

    image = ipywidgets.Image(format="png", layout=ipywidgets.Layout(max_width="100%",
                                                                   height="auto"))
    label = ipywidgets.Label() if caption else None

    def update(_change=None):
        values = {name: control.value for name, control in controls.items()}
        image.value = render(**values)
        image.layout.width = f"{png_size(image.value)[0] / sharpness:g}px"
        if label is not None:
            label.value = caption(**values)

    for control in controls.values():
        control.observe(update, names="value")
    update()
    children = [ipywidgets.HBox(list(controls.values()))]
    children += [label] if label is not None else []
    return ipywidgets.VBox(children + [image])


def want_live(live) -> bool:
    """Whether to build the live widget: ``live=None`` asks :func:`in_notebook`."""
    if live is None:
        live = in_notebook()
    if not live:
        return False
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return False
    return True


# --------------------------------------------------------------------------- the ring, step by step
@dataclass(frozen=True)
class Chunk:
    """What one rank holds of one chunk: ``value`` and the ranks whose inputs it combines."""

    value: np.ndarray
    sources: frozenset


@dataclass(frozen=True)
class RingStep:
    """The cluster after one step of a ring all-reduce.

    Attributes:
        index: 0 before any message, then 1 .. 2(p - 1).
        phase: ``"start"``, ``"reduce-scatter"`` or ``"all-gather"``.
        moves: ``(src, dst, chunk)`` of every message of this step.
        chunks: ``chunks[rank][c]`` is that rank's :class:`Chunk` ``c``.
    """

    index: int
    phase: str
    moves: tuple
    chunks: tuple

    @property
    def p(self):
        return len(self.chunks)

    def result(self, rank):
        """Rank ``rank``'s whole buffer (its chunks concatenated)."""
        return np.concatenate([c.value for c in self.chunks[rank]])


def _inputs(inputs):
    arrays = [np.asarray(x) for x in inputs]
    if not arrays:
        raise ArgumentError("ring_allreduce_steps: need one input array per rank, got none")
    shapes = {a.shape for a in arrays}
    dtypes = {a.dtype for a in arrays}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise ShapeError(f"ring_allreduce_steps: every rank must pass the same shape and dtype, "
                         f"got shapes {[a.shape for a in arrays]} and dtypes "
                         f"{sorted(str(d) for d in dtypes)}")
    return [a.reshape(-1) for a in arrays]


def ring_allreduce_steps(inputs, op="sum"):
    """Every state of the ring all-reduce of ``inputs`` (one array per rank).

    Rank ``r`` sends to ``r + 1``. Reduce-scatter step ``s`` (0-based): rank ``r`` sends chunk
    ``(r - s - 1) mod p`` and combines the chunk it receives with its own copy; afterwards rank
    ``r`` holds the whole reduction of chunk ``r``. All-gather step ``s``: rank ``r`` passes on
    chunk ``(r - s) mod p`` and the receiver overwrites its copy. The library's ring moves the same
    chunks.

    Args:
        inputs: ``p`` arrays of the same shape and dtype (flattened into ``p`` chunks of
            ``np.array_split`` sizes).
        op: ``sum``, ``prod``, ``max`` or ``min``.

    Returns:
        ``2(p - 1) + 1`` :class:`RingStep` records, the start first.
    """
    if op not in OPS:
        raise ArgumentError(f"ring_allreduce_steps: op={op!r} is not one of {sorted(OPS)}")
    flats, fn = _inputs(inputs), OPS[op]
    p = len(flats)
    bounds = block_bounds(flats[0].shape[0], p)
    state = [[Chunk(x[a:b].copy(), frozenset([r])) for a, b in bounds] for r, x in enumerate(flats)]
    steps = [RingStep(0, "start", (), tuple(tuple(row) for row in state))]
    for s in range(p - 1):
        moves = tuple((r, (r + 1) % p, (r - s - 1) % p) for r in range(p))
        state = _apply(state, moves, lambda got, own: Chunk(fn(got.value, own.value),
                                                              got.sources | own.sources))
        steps.append(RingStep(len(steps), "reduce-scatter", moves, tuple(map(tuple, state))))
    for s in range(p - 1):
        moves = tuple((r, (r + 1) % p, (r - s) % p) for r in range(p))
        state = _apply(state, moves, lambda got, own: Chunk(got.value.copy(), got.sources))
        steps.append(RingStep(len(steps), "all-gather", moves, tuple(map(tuple, state))))
    return steps


def _apply(state, moves, combine):
    """All messages of a step leave from the state before it."""
    new = [list(row) for row in state]
    for src, dst, c in moves:
        new[dst][c] = combine(state[src][c], state[dst][c])
    return new


def _value_text(value, limit=3):
    if value.size == 0:
        return "-"
    if value.size > limit:
        return f"{value.size} values"
    items = [f"{v:g}" if np.issubdtype(value.dtype, np.floating) else str(v) for v in value]
    return items[0] if len(items) == 1 else "[" + " ".join(items) + "]"


def describe_step(step):
    """One line per rank: each chunk's value and the ranks it sums, ``{0,1}``."""
    head = f"step {step.index} ({step.phase})"
    if step.moves:
        head += ": " + ", ".join(f"r{a}->r{b} c{c}" for a, b, c in step.moves)
    lines = [head]
    for r, row in enumerate(step.chunks):
        cells = [f"c{c}={_value_text(ch.value)} {{{','.join(map(str, sorted(ch.sources)))}}}"
                 for c, ch in enumerate(row)]
        lines.append(f"  rank {r}: " + "  ".join(cells))
    return "\n".join(lines)


def plot_ring_step(step, ax=None, title=None):
    """Draw one :class:`RingStep`: a rank x chunk grid, shaded by how many ranks each chunk
    already combines (green: all of them); a thick orange frame marks what arrived this step."""
    p = step.p
    # on its own: chunks of up to 0.75 x 0.6 in, the whole at most 7 x 5 in (with a slider and
    # a caption it fits a laptop's notebook area at SCREEN_DPI)
    fig, ax = (ax.figure, ax) if ax is not None else plt.subplots(
        figsize=(2.2 + min(0.75 * p, 4.8), 1.4 + min(0.6 * p, 3.6)))
    arrived = {(dst, c) for _, dst, c in step.moves}
    shades = plt.get_cmap("Blues")
    for r, row in enumerate(step.chunks):
        for c, chunk in enumerate(row):
            share = len(chunk.sources) / p
            colour = "#7fc97f" if share == 1 else shades(0.15 + 0.6 * share)
            fresh = (r, c) in arrived
            ax.add_patch(Rectangle((c, r), 1, 1, facecolor=colour,
                                   edgecolor="tab:orange" if fresh else "white",
                                   linewidth=3 if fresh else 1))
            ax.text(c + 0.5, r + 0.42, _value_text(chunk.value), ha="center", va="center",
                    fontsize=11 if p <= 4 else 8)
            if p <= 6:
                ax.text(c + 0.5, r + 0.75, "+".join(f"r{s}" for s in sorted(chunk.sources)),
                        ha="center", va="center", fontsize=7, color="#333333")
    ax.set_xlim(0, p)
    ax.set_ylim(p, 0)
    ax.set_xticks([c + 0.5 for c in range(p)], [f"chunk {c}" for c in range(p)], fontsize=8)
    ax.set_yticks([r + 0.5 for r in range(p)], [f"rank {r}" for r in range(p)], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    ax.set_title(title or f"step {step.index} · {step.phase}", fontsize=10)
    return fig


def static(inputs, op="sum", columns=5):
    """Every step of the ring all-reduce of ``inputs`` side by side; returns the Figure."""
    steps = ring_allreduce_steps(inputs, op)
    cols = min(columns, len(steps))
    rows = -(-len(steps) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.1 * cols, 2.7 * rows), squeeze=False)
    for ax, step in zip(axes.flat, steps):
        plot_ring_step(step, ax)
    for ax in list(axes.flat)[len(steps):]:
        ax.set_visible(False)
    p = steps[0].p
    fig.suptitle(f"ring all-reduce on {p} ranks: {p - 1} reduce-scatter steps, then {p - 1} "
                 f"all-gather steps (orange: arrived in this step)", fontsize=10)
    fig.tight_layout()
    return fig


def collective_stepper(inputs, op="sum", live=None):
    """A slider over the steps of the ring all-reduce of ``inputs``.

    In a live notebook (or with ``live=True``) returns a :class:`WidgetWithStatic` whose static
    picture is :func:`static`; elsewhere returns that Figure.
    """
    steps = ring_allreduce_steps(inputs, op)
    if not want_live(live):
        return static(inputs, op)
    import ipywidgets

    cache = {}

    def render(step):
        if step not in cache:
            cache[step] = png_bytes(plot_ring_step(steps[step]), dpi=SCREEN_DPI * SHARPNESS)
        return cache[step]

    def caption(step):
        moves = ", ".join(f"r{a}→r{b}: chunk {c}" for a, b, c in steps[step].moves)
        return f"{steps[step].phase}" + (f" — {moves}" if moves else "")

    slider = ipywidgets.IntSlider(min=0, max=len(steps) - 1, value=0, description="step")
    return WidgetWithStatic(image_widget({"step": slider}, render, caption),
                            png_bytes(static(inputs, op)))
