"""Statistics of an equal-budget grid that a reviewer accepts: paired by seed, read off interpolated curves,
with bootstrap intervals (bench/equal_budget.py reports them from the committed records).

A run's curve is its held-out evaluations [(step, accuracy, tokens)], tokens = generated policy tokens behind the
evaluation (the critic's warm start included). Between two evaluations the curve is read as the straight line
joining them:

- ``crossing(points, y)``: the x at which a piecewise-linear curve first reaches y,
  ``x = x0 + (y − y0) / (y1 − y0) · (x1 − x0)`` on the first segment from below y to at or above it (the first point
  itself when it is already there; None when the curve never reaches y). So the resolution is not one evaluation
  interval: two runs that cross between the same evaluations still differ.
- ``value_at(points, x)``: the curve's y at x (linear between the points around it; None outside the curve).
- ``mean_over(points, x_end)``: the curve's mean from its first x to x_end, ``(1 / (x_end − x_first)) · ∫ y dx``
  by the trapezoid rule (the area under accuracy-vs-tokens, per token: one number for "better throughout the
  budget", not only at its end).
- ``paired_bootstrap(diffs)``: the mean of paired differences (one per RL seed that both cells ran: cells share
  their seeds, so the seed's own luck cancels) and its 95% percentile interval from resampling the pairs with
  replacement. Deterministic (a fixed resampling seed) so the report reproduces.
"""

from __future__ import annotations

import random
import statistics

Points = list[tuple[float, float]]  # (x, y), x increasing


def crossing(points: Points, y: float) -> float | None:
    """The first x where the piecewise-linear curve through `points` reaches `y` (None: never)."""
    for i, (x1, y1) in enumerate(points):
        if y1 >= y - 1e-12:
            if i == 0:
                return x1
            x0, y0 = points[i - 1]
            return x0 + (y - y0) / (y1 - y0) * (x1 - x0)  # y0 < y <= y1: y1 > y0
    return None


def value_at(points: Points, x: float) -> float | None:
    """The curve's y at `x`, linear between the points around it (None outside [first x, last x])."""
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (x - x0) / (x1 - x0) * (y1 - y0)
    return points[0][1] if len(points) == 1 and points[0][0] == x else None


def mean_over(points: Points, x_end: float) -> float | None:
    """Mean of the curve from its first x to `x_end` (trapezoid rule; None when the curve ends before x_end)."""
    end = value_at(points, x_end)
    if end is None or x_end <= points[0][0]:
        return None
    inside = [p for p in points if p[0] < x_end] + [(x_end, end)]
    area = sum((x1 - x0) * (y0 + y1) / 2 for (x0, y0), (x1, y1) in zip(inside, inside[1:]))
    return area / (x_end - points[0][0])


def paired_bootstrap(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the paired differences and its 95% bootstrap percentile interval (lo, hi)."""
    assert diffs, "paired_bootstrap needs at least one pair"
    rng, n = random.Random(seed), len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def tokens_curve(run: dict) -> Points:
    """(tokens, held-out accuracy) of a run's evaluations."""
    return [(t, a) for _, a, t in run["curve"]]


def resource_curve(run: dict, column: int) -> Points | None:
    """(wall seconds or CPU seconds, held-out accuracy) of a run's evaluations, from its `eval_costs`
    [(step, wall s, cpu s)] (records written before they were kept have none)."""
    costs = {step: cost for step, *cost in run.get("eval_costs") or []}
    points = [(costs[s][column], a) for s, a, _ in run["curve"] if s in costs]
    return points if len(points) == len(run["curve"]) else None


def pairs(runs: list[dict], cell: str, reference: str) -> list[tuple[dict, dict]]:
    """(run of `cell`, run of `reference`) for each (checkpoint, RL seed) both ran."""
    ref = {(r["ckpt"], r["seed"]): r for r in runs if r["cell"] == reference}
    return [(r, ref[(r["ckpt"], r["seed"])]) for r in runs if r["cell"] == cell and (r["ckpt"], r["seed"]) in ref]


def _interval(diffs: list[float | None], spec: str) -> str:
    known = [d for d in diffs if d is not None]
    if not known:
        return "-"
    missing = f" ({len(diffs) - len(known)} unpaired)" if len(known) < len(diffs) else ""
    if len(known) == 1:
        return f"{known[0]:{spec}} (one pair){missing}"
    mean, lo, hi = paired_bootstrap(known)
    return f"{mean:{spec}} [{lo:{spec}}, {hi:{spec}}]{missing}"


def thresholds(runs: list[dict], reference: str) -> list[float]:
    """Accuracy thresholds from below the reference's plateau to it: its mean start accuracy plus 25%, 50%, 75% and
    100% of its mean gain (the last is the reference's mean final accuracy)."""
    mine = [r for r in runs if r["cell"] == reference]
    if not mine:
        return []
    start = statistics.fmean(r["start_accuracy"] for r in mine)
    final = statistics.fmean(r["final_accuracy"] for r in mine)
    return [round(start + share * (final - start), 3) for share in (0.25, 0.5, 0.75, 1.0)]


def paired_table(runs: list[dict], reference: str) -> list[str]:
    """Markdown: every cell against `reference`, paired by (checkpoint, seed), differences with 95% bootstrap
    intervals: final accuracy, mean accuracy over the shared token budget, and tokens / wall seconds / CPU seconds
    to each threshold (a run that never reaches one is unpaired there)."""
    marks = thresholds(runs, reference)
    if not marks:
        return [f"(no run of the reference cell {reference})"]
    cells = sorted({r["cell"] for r in runs} - {reference})
    head = ["cell", "pairs", "final acc", "mean acc over budget"] + \
        [f"tokens to {m:.3f}" for m in marks] + [f"wall s to {marks[-1]:.3f}", f"CPU s to {marks[-1]:.3f}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for cell in cells:
        paired = pairs(runs, cell, reference)
        if not paired:
            continue
        budget = [min(tokens_curve(a)[-1][0], tokens_curve(b)[-1][0]) for a, b in paired]
        row = [cell, str(len(paired)), _interval([a["final_accuracy"] - b["final_accuracy"] for a, b in paired],
                                                  "+.3f"),
               _interval([_minus(mean_over(tokens_curve(a), x), mean_over(tokens_curve(b), x))
                          for (a, b), x in zip(paired, budget)], "+.3f")]
        for m in marks:
            row.append(_interval([_minus(crossing(tokens_curve(a), m), crossing(tokens_curve(b), m))
                                  for a, b in paired], "+.0f"))
        for column in (0, 1):
            row.append(_interval([_minus(_cross(resource_curve(a, column), marks[-1]),
                                         _cross(resource_curve(b, column), marks[-1])) for a, b in paired], "+.0f"))
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _cross(points: Points | None, y: float) -> float | None:
    return crossing(points, y) if points else None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
