"""Explained variance pooled over batches (the critic-health figure of a run's end, docs/design.md §3)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the run summary uses ev_from_sums alone, without importing torch
    from torch import Tensor


def ev_sums(pred: Tensor, target: Tensor, mask: Tensor) -> list[float]:
    """Sufficient statistics of explained variance over masked entries, [n, Σr, Σr², Σy, Σy²] with residual
    r = target − pred: sums over several batches pool into one EV (``ev_from_sums``) over all their entries,
    unlike a mean of per-batch EVs, which is biased low on small batches (E[1/Var y] > 1/E[Var y])."""
    mask = mask.bool()
    y = target[mask].double()
    r = y - pred[mask].double()
    return [float(y.numel()), float(r.sum()), float((r * r).sum()), float(y.sum()), float((y * y).sum())]


def ev_from_sums(sums: list[list[float]]) -> float:
    """EV pooled over batches from their ``ev_sums``: 1 − Var(r)/Var(y) with population variances; nan if
    Var(y) ~ 0 or no entries.  Hand-worked: y = [0, 1], pred = [0, 0.5] -> r = [0, 0.5], Var r = 1/16,
    Var y = 1/4, EV = 0.75 (whether given as one batch or as two batches of one)."""
    n, sr, srr, sy, syy = (sum(s[i] for s in sums) for i in range(5))
    if n == 0:
        return float("nan")
    var_y = syy / n - (sy / n) ** 2
    if var_y <= 1e-12:
        return float("nan")
    return 1.0 - (srr / n - (sr / n) ** 2) / var_y
