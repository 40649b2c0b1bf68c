"""The multi-stage recommendation funnel: retrieval -> ranking -> re-ranking, each stage
with a latency budget. Latency is a cost model (fixed cost plus cost per candidate scored), so it is
deterministic; a stage whose candidates would overrun its budget scores only as many of the
previous stage's best as fit, and says so."""

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ArgumentError


@dataclass
class FunnelStage:
    """One stage of the funnel.

    Attributes:
        name: "retrieval", "ranking", "re-ranking", ...
        score: ``score(user, candidates) -> scores`` (higher is better) of a candidate array.
        keep: how many of the best-scored candidates go on to the next stage.
        cost_per_item: simulated seconds to score one candidate.
        fixed_cost: simulated seconds per request (model call, network hop).
        budget: the stage's latency budget in seconds.
    """

    name: str
    score: Callable
    keep: int
    cost_per_item: float
    budget: float
    fixed_cost: float = 0.0

    def capacity(self):
        """The most candidates that fit in the budget."""
        room = self.budget - self.fixed_cost
        return max(int(np.floor(room / self.cost_per_item + 1e-9)), 0) if room > 0 else 0


@dataclass
class StageReport:
    """What one stage did for one request: candidates in, scored (fewer when the budget
    cut them), kept, and the simulated latency against the budget."""

    name: str
    candidates: int
    scored: int
    kept: int
    latency: float
    budget: float

    @property
    def trimmed(self):
        return self.scored < self.candidates


class Funnel:
    """Stages applied in order to a candidate set that starts as every item.

    Raises:
        ArgumentError: no stages, or a stage keeps fewer than 1 item.
    """

    def __init__(self, stages):
        if not stages:
            raise ArgumentError("Funnel: needs at least one stage")
        for s in stages:
            if s.keep < 1:
                raise ArgumentError(f"Funnel: stage {s.name!r} keeps {s.keep} items")
        self.stages = list(stages)

    def run(self, user, candidates):
        """``(final item ids best first, [StageReport])`` for one request."""
        items = np.asarray(candidates)
        reports = []
        for stage in self.stages:
            n = items.size
            scored = items[:min(n, stage.capacity())]  # items arrive best first
            scores = np.asarray(stage.score(user, scored), np.float64)
            order = np.argsort(-scores, kind="stable")[:stage.keep]
            latency = stage.fixed_cost + scored.size * stage.cost_per_item
            reports.append(StageReport(stage.name, n, scored.size, order.size, latency,
                                       stage.budget))
            items = scored[order]
        return items, reports


def report_table(reports):
    """The stage reports as a text table, with the total latency."""
    lines = [f"{'stage':<12}{'in':>8}{'scored':>8}{'kept':>6}{'latency ms':>12}"
             f"{'budget ms':>11}"]
    for r in reports:
        flag = "  (cut to fit)" if r.trimmed else ""
        lines.append(f"{r.name:<12}{r.candidates:>8}{r.scored:>8}{r.kept:>6}"
                     f"{r.latency * 1e3:>12.2f}{r.budget * 1e3:>11.2f}{flag}")
    total = sum(r.latency for r in reports)
    lines.append(f"{'total':<34}{total * 1e3:>12.2f}{sum(r.budget for r in reports) * 1e3:>11.2f}")
    return "\n".join(lines)


__all__ = ["FunnelStage", "StageReport", "Funnel", "report_table"]
