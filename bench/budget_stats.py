"""The critic study's statistics (docs/benchmarks.md, "The critic study protocol"): paired by seed, read off
interpolated curves that charge every warm start, with t-intervals, an equivalence margin and the seeds a margin
needs. bench/equal_budget.py and bench/smollm_grid.py report with them from the committed records; every formula
below is worked by hand in tests/bench/test_budget_stats.py (the test named after it).

A run's curve is its held-out evaluations [(step, accuracy, tokens)], tokens = generated policy tokens behind the
evaluation, the critic's warm start included (bench/equal_budget.py records it so). Between two evaluations the
curve is read as the straight line joining them.

**The endpoint** (``endpoint``; test_endpoint_is_the_mean_of_the_last_five_evaluations): the mean of a run's last
k = 5 held-out evaluations, ``(1/k) · Σ_{i=m−k+1..m} a_i``. One evaluation of 500 problems has a standard error of
~0.02, so a run's last evaluation alone is as noisy as the effects the study looks for; the last five (the last 40
of 200 steps at one evaluation every 10) average that away, and a plateau's tail is what a method ends at. A run
with fewer than k evaluations after its first (step 0 is the start, not an outcome) has no endpoint (None).

**Paired differences** (``t_interval``; test_t_interval_by_hand): cells share their RL seeds, so a seed's own luck
cancels in d_s = metric(cell, s) − metric(reference, s). Over n pairs, mean d̄, ``sd = √(Σ(d_s − d̄)² / (n − 1))``,
and the 95% interval ``d̄ ± t_{0.975, n−1} · sd / √n`` (Student t, n − 1 degrees of freedom). t quantiles come from
scipy.stats where it is installed, else from the table T_TABLE (df 1..30 at p = 0.975, 0.9 and 0.8, to 4
decimals; test_t_table_matches_the_t_distribution integrates the t density to check it); beyond 30 degrees of
freedom without scipy ``t_quantile`` refuses, naming the way out. With one pair there is no interval.

**The bootstrap** (``paired_bootstrap``; test_paired_bootstrap_refuses_fewer_than_eight_pairs): the 95% percentile
interval of the means of 10,000 resamples of the pairs with replacement (a fixed resampling seed, so a report
reproduces). Only from 8 pairs (BOOTSTRAP_MIN_PAIRS): over 2 or 3 pairs the resampled means take a handful of
values and the "interval" is about the pairs' min-max, which covers the true mean 50-75% of the time, not 95%; so
with fewer pairs it raises and the t-interval is the interval.

**The verdict** (``verdict``; test_verdict_against_the_margin): against a margin m (MARGIN = 0.02 held-out
accuracy, the smallest difference the study calls real), with the 95% interval [lo, hi] of cell − reference:
"equivalent" when the whole interval lies inside (−m, +m) (an interval that excludes 0 but stays inside is a real
difference smaller than any that matters: still equivalent); else "better" when lo > 0, "worse" when hi < 0 (for a
cost such as tokens, lower is better and the two swap); else "inconclusive". Equivalence by a 95% interval inside
±m is two one-sided tests at 2.5% each (conservative against the usual 5%).

**The A/A noise floor** (``compare`` on two cells that are the same configuration under two names, e.g.
tether_g1 and gae_g1: tether's blend at G = 1 is gae; test_the_aa_floor_is_reported_like_any_other_difference): its
paired difference is reported like any other. Its true value is 0; what it measures is how far two runs of one
configuration drift apart: from one seed (tether_g1 and gae_g1: the asynchronous roles' timing picks other
samples), or from other seeds (a cell and its copy at `@seed_offset=N`, bench/equal_budget.py: needed where no
critic runs, since a critic-free run at one seed repeats exactly), the smallest difference a grid of this many
seeds can resolve, and a sanity check of the intervals (a verdict other than "equivalent" or "inconclusive" on it
is a false positive).

**The seeds a margin needs** (``seeds_needed``; test_seeds_needed_by_hand): the smallest n with
``n ≥ ((t_{0.975, n−1} + t_{0.8, n−1}) · sd / m)²``, sd the measured SD of the paired differences: the pairs with
which a true difference of m is found (the 95% interval excludes 0) with 80% power. (To show equivalence, the whole
interval inside ±m when the true difference is 0, with 80% probability, takes t_{0.9} in place of t_{0.8}:
``power=0.9``.) Beyond 30 degrees of freedom without scipy the t quantile is the Cornish-Fisher expansion in z
(Abramowitz and Stegun 26.7.5, within 1e-4 of the table at df 30).

**Warm starts charged** (``charged_curve``, ``auc_mean``; test_warm_start_is_charged_in_the_curve_and_the_auc):
the critic's warm-start tokens are in the recorded curve (its first point stands at x = W, the warm start's
tokens), and where a cell samples for a policy warm start of its own, its record's ``policy_pretrain_generated_tokens``
is added to every x. (The policy's SFT trains on reference solutions, generates nothing, and is shared by every
cell of a checkpoint.) The charged curve then starts at x = 0 at the start accuracy: ``[(0, a_0)] + [(x_i + W_p,
a_i)]``. The area under it is taken over one range [0, X] for every cell of a table, X the smallest last x of its
runs, and reported per token, ``AUC/X = (1/X) · ∫_0^X a(x) dx`` (trapezoids). The warm-start stretch [0, W] counts
at the start accuracy because that is what the policy was while those tokens were spent (the critic's pretraining
does not change it): a measured value, not a filler. Excluding it instead for every cell would drop the critic-free
cells' learning over the same tokens, the thing the warm start cost, and un-charge it. Tokens, CPU seconds and wall
seconds to a threshold are read off the same charged curves, so the warm start is in every metric: CPU seconds
(``eval_costs``) include the critic warm start's CPU seconds.

**Crossings** (``crossing``; test_crossing_interpolates_on_the_first_segment_that_reaches_the_threshold): the x at
which a piecewise-linear curve first reaches y, ``x = x0 + (y − y0) / (y1 − y0) · (x1 − x0)`` on the first segment
from below y to at or above it (the first point itself when it is already there; None when the curve never reaches
y). So the resolution is not one evaluation interval: two runs that cross between the same evaluations still differ.
``value_at`` reads y at x (linear between the points around it); ``mean_over`` is the mean from the curve's own
first x to x_end (the AUC above starts at 0 instead).

Intervals are per comparison and not adjusted for the number of comparisons: over ten cells against one reference,
one 95% interval in twenty excludes a true 0 by chance, which the A/A cell makes visible.
"""

from __future__ import annotations

import math
import random
import statistics

Points = list[tuple[float, float]]  # (x, y), x increasing

ENDPOINT_EVALS = 5
MARGIN = 0.02
BOOTSTRAP_MIN_PAIRS = 8

# Student t quantiles t_{p, df}, df = 1..30 (checked against the t density in tests/bench/test_budget_stats.py)
T_TABLE = {
    0.975: (12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281, 2.2010, 2.1788, 2.1604,
            2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860, 2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555,
            2.0518, 2.0484, 2.0452, 2.0423),
    0.9: (3.0777, 1.8856, 1.6377, 1.5332, 1.4759, 1.4398, 1.4149, 1.3968, 1.3830, 1.3722, 1.3634, 1.3562, 1.3502,
          1.3450, 1.3406, 1.3368, 1.3334, 1.3304, 1.3277, 1.3253, 1.3232, 1.3212, 1.3195, 1.3178, 1.3163, 1.3150,
          1.3137, 1.3125, 1.3114, 1.3104),
    0.8: (1.3764, 1.0607, 0.9785, 0.9410, 0.9195, 0.9057, 0.8960, 0.8889, 0.8834, 0.8791, 0.8755, 0.8726, 0.8702,
          0.8681, 0.8662, 0.8647, 0.8633, 0.8620, 0.8610, 0.8600, 0.8591, 0.8583, 0.8575, 0.8569, 0.8562, 0.8557,
          0.8551, 0.8546, 0.8542, 0.8538),
}
Z = {0.975: 1.959964, 0.9: 1.281552, 0.8: 0.841621}  # the normal quantiles, for the large-df expansion

try:  # pragma: no cover - depends on the environment
    from scipy import stats as _scipy_stats
except ImportError:  # the project does not depend on scipy
    _scipy_stats = None


# ---------------------------------------------------------------------------------------------------------------
# quantiles, intervals, verdicts


def t_quantile(p: float, df: int) -> float:
    """Student t quantile t_{p, df}: scipy.stats where installed, else T_TABLE (p in 0.975, 0.9, 0.8; df 1..30)."""
    if df < 1:
        raise ValueError(f"a t quantile needs df >= 1 (got {df}): an interval needs at least 2 pairs")
    if _scipy_stats is not None:
        return float(_scipy_stats.t.ppf(p, df))
    if p not in T_TABLE:
        raise ValueError(f"t_quantile: p = {p} is not in the table (p in {sorted(T_TABLE)}); install scipy")
    if df > len(T_TABLE[p]):
        raise ValueError(f"t_quantile: df = {df} is beyond the table (df 1..{len(T_TABLE[p])}); install scipy, or "
                         f"with >= {BOOTSTRAP_MIN_PAIRS} pairs use paired_bootstrap")
    return T_TABLE[p][df - 1]


def _t_large_df(p: float, df: int) -> float:
    """t_{p, df} from the normal quantile z (Cornish-Fisher, Abramowitz and Stegun 26.7.5): for df > 30 only."""
    z = Z[p]
    g1 = (z ** 3 + z) / 4
    g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
    g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
    return z + g1 / df + g2 / df ** 2 + g3 / df ** 3


def _t_any_df(p: float, df: int) -> float:
    return t_quantile(p, df) if _scipy_stats is not None or df <= len(T_TABLE[p]) else _t_large_df(p, df)


def sd(diffs: list[float]) -> float | None:
    """Sample standard deviation (n − 1); None with fewer than 2 values."""
    return statistics.stdev(diffs) if len(diffs) >= 2 else None


def t_interval(diffs: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """Mean of the paired differences and its Student-t interval, d̄ ± t_{(1+level)/2, n−1} · sd / √n."""
    if len(diffs) < 2:
        raise ValueError(f"a t-interval needs at least 2 pairs (got {len(diffs)})")
    mean = statistics.fmean(diffs)
    half = t_quantile(round((1 + level) / 2, 6), len(diffs) - 1) * statistics.stdev(diffs) / math.sqrt(len(diffs))
    return mean, mean - half, mean + half


def paired_bootstrap(diffs: list[float], resamples: int = 10_000, seed: int = 0) -> tuple[float, float, float]:
    """Mean of the paired differences and its 95% bootstrap percentile interval (lo, hi): from 8 pairs only."""
    if len(diffs) < BOOTSTRAP_MIN_PAIRS:
        raise ValueError(f"{len(diffs)} pairs: a percentile bootstrap needs at least {BOOTSTRAP_MIN_PAIRS} (over fewer "
                         "the resampled means take a handful of values and the interval is about the pairs' min-max, "
                         "covering far less than 95%); use t_interval")
    rng, n = random.Random(seed), len(diffs)
    means = sorted(statistics.fmean(rng.choices(diffs, k=n)) for _ in range(resamples))
    return statistics.fmean(diffs), means[int(0.025 * resamples)], means[int(0.975 * resamples) - 1]


def verdict(lo: float, hi: float, margin: float | None = MARGIN, higher_is_better: bool = True) -> str:
    """'equivalent' (the whole interval inside ±margin), else 'better' / 'worse' (it excludes 0 on that side),
    else 'inconclusive'. margin None: no equivalence (a measure in units the margin is not in)."""
    if margin is not None and -margin < lo and hi < margin:
        return "equivalent"
    if lo > 0:
        return "better" if higher_is_better else "worse"
    if hi < 0:
        return "worse" if higher_is_better else "better"
    return "inconclusive"


def seeds_needed(sd_: float | None, margin: float = MARGIN, power: float = 0.8) -> int | None:
    """Smallest n with n >= ((t_{0.975, n−1} + t_{power, n−1}) · sd / margin)² (None without an sd)."""
    if sd_ is None:
        return None
    n = 2
    while n < ((_t_any_df(0.975, n - 1) + _t_any_df(power, n - 1)) * sd_ / margin) ** 2:
        n += 1
    return n


def compare(diffs: list[float | None], margin: float | None = MARGIN, higher_is_better: bool = True) -> dict:
    """One paired comparison: the known differences, their mean, t-interval, SD, verdict and the seeds the margin
    needs at that SD (a missing difference, None, is counted as unpaired)."""
    known = [d for d in diffs if d is not None]
    out = {"pairs": len(known), "unpaired": len(diffs) - len(known), "diffs": known,
           "mean": statistics.fmean(known) if known else None, "lo": None, "hi": None, "sd": sd(known),
           "verdict": None, "seeds_needed": None}
    if len(known) >= 2:
        _, out["lo"], out["hi"] = t_interval(known)
        out["verdict"] = verdict(out["lo"], out["hi"], margin, higher_is_better)
        if margin is not None:
            out["seeds_needed"] = seeds_needed(out["sd"], margin)
    return out


def fmt(c: dict, spec: str) -> str:
    """'mean [lo, hi]' of a comparison (t-interval), '(one pair)' or '-', with the unpaired count."""
    if not c["pairs"]:
        return "-"
    missing = f" ({c['unpaired']} unpaired)" if c["unpaired"] else ""
    if c["lo"] is None:
        return f"{c['mean']:{spec}} (one pair){missing}"
    return f"{c['mean']:{spec}} [{c['lo']:{spec}}, {c['hi']:{spec}}]{missing}"


# ---------------------------------------------------------------------------------------------------------------
# curves


def endpoint(accuracies: list[float], k: int = ENDPOINT_EVALS) -> float | None:
    """Mean of the last k evaluations (None with fewer than k after the first, the start)."""
    return statistics.fmean(accuracies[-k:]) if len(accuracies) - 1 >= k else None


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


def charged_curve(points: Points, warm_start: float = 0.0) -> Points:
    """The curve with `warm_start` added to every x and, where it then starts after 0, the stretch from 0 to its
    first x at its first accuracy: [(0, a_0)] + [(x_i + warm_start, a_i)]."""
    shifted = [(x + warm_start, y) for x, y in points]
    return shifted if shifted[0][0] <= 0 else [(0.0, shifted[0][1])] + shifted


def auc_mean(points: Points, x_end: float) -> float | None:
    """(1 / x_end) · ∫_0^x_end of a charged curve (one that starts at x = 0): the AUC per token."""
    if points[0][0] != 0:
        raise ValueError("auc_mean takes a charged curve (charged_curve), which starts at x = 0")
    return mean_over(points, x_end)


# ---------------------------------------------------------------------------------------------------------------
# records (bench/equal_budget.py's and bench/smollm_grid.py's)

STAMPS = ("commit", "date", "cpu", "cpu_flags", "checkpoint_sha")  # what every record of the protocol carries


def unstamped(runs: list[dict]) -> dict[str, int]:
    """Per stamp of STAMPS, how many of `runs` lack it (records made before the protocol carry no commit, date or
    CPU): named in the report, never guessed."""
    return {k: n for k in STAMPS if (n := sum(not r.get(k) for r in runs))}


def warm_start_tokens(run: dict) -> float:
    """Generated tokens a run's warm starts cost: its critic's (already inside its curve's x) plus its policy's own."""
    return run.get("critic_pretrain_generated_tokens", 0) + run.get("policy_pretrain_generated_tokens", 0)


def tokens_curve(run: dict) -> Points:
    """(tokens, held-out accuracy) of a run's evaluations, charged: from x = 0, every warm start included."""
    return charged_curve([(t, a) for _, a, t in run["curve"]], run.get("policy_pretrain_generated_tokens", 0))


def resource_curve(run: dict, column: int) -> Points | None:
    """(wall seconds or CPU seconds, held-out accuracy) of a run's evaluations, from its `eval_costs`
    [(step, wall s, cpu s)], the critic's warm start included (records written before they were kept have none)."""
    costs = {step: cost for step, *cost in run.get("eval_costs") or []}
    points = [(costs[s][column], a) for s, a, _ in run["curve"] if s in costs]
    return charged_curve(points) if len(points) == len(run["curve"]) else None


def run_endpoint(run: dict) -> float | None:
    return endpoint([a for _, a, _ in run["curve"]])


def pairs(runs: list[dict], cell: str, reference: str) -> list[tuple[dict, dict]]:
    """(run of `cell`, run of `reference`) for each (checkpoint, RL seed) both ran."""
    ref = {(r["ckpt"], r["seed"]): r for r in runs if r["cell"] == reference}
    return [(r, ref[(r["ckpt"], r["seed"])]) for r in runs if r["cell"] == cell and (r["ckpt"], r["seed"]) in ref]


def thresholds(runs: list[dict], reference: str) -> list[float]:
    """Accuracy thresholds from below the reference's plateau to it: its mean start accuracy plus 25%, 50%, 75% and
    100% of its mean gain to its endpoint (the last is the reference's mean endpoint; its mean final accuracy where
    its runs have too few evaluations for an endpoint)."""
    mine = [r for r in runs if r["cell"] == reference]
    if not mine:
        return []
    start = statistics.fmean(r["start_accuracy"] for r in mine)
    ends = [run_endpoint(r) for r in mine]
    end = statistics.fmean(ends) if None not in ends else statistics.fmean(r["final_accuracy"] for r in mine)
    return [round(start + share * (end - start), 3) for share in (0.25, 0.5, 0.75, 1.0)]


def common_budget(runs: list[dict]) -> float:
    """The x range every run of a table covers: the smallest last x of their charged token curves."""
    return min(tokens_curve(r)[-1][0] for r in runs)


def thresholds_by_checkpoint(runs: list[dict], reference: str) -> dict[str, list[float]]:
    """`thresholds` per checkpoint (a pooled table reads every pair off its own checkpoint's thresholds)."""
    out = {c: thresholds([r for r in runs if r["ckpt"] == c], reference) for c in sorted({r["ckpt"] for r in runs})}
    return {c: m for c, m in out.items() if m}


SHARES = ("25%", "50%", "75%", "100%")  # of the reference's gain: the thresholds' names


def comparisons(runs: list[dict], cell: str, reference: str, budget: float, marks: dict[str, list[float]],
                margin: float = MARGIN) -> dict:
    """`cell` minus `reference` paired by (checkpoint, seed) on every metric of the protocol; `marks`: the
    thresholds per checkpoint (a pair whose checkpoint has none is unpaired on the tokens and CPU seconds)."""
    paired = pairs(runs, cell, reference)

    def to(curve_of, i):
        return [_minus(_cross(curve_of(a), marks[a["ckpt"]][i]), _cross(curve_of(b), marks[b["ckpt"]][i]))
                if a["ckpt"] in marks else None for a, b in paired]

    out = {
        "pairs": len(paired),
        "endpoint": compare([_minus(run_endpoint(a), run_endpoint(b)) for a, b in paired], margin),
        "final": compare([a["final_accuracy"] - b["final_accuracy"] for a, b in paired], margin),
        "auc": compare([_minus(auc_mean(tokens_curve(a), budget), auc_mean(tokens_curve(b), budget))
                        for a, b in paired], margin),
        "tokens": [compare(to(tokens_curve, i), None, higher_is_better=False) for i in range(len(SHARES))],
        "cpu_s": compare(to(lambda r: resource_curve(r, 1), len(SHARES) - 1), None, higher_is_better=False),
        "warm_start": (statistics.fmean(warm_start_tokens(a) for a, _ in paired) if paired else None,
                       statistics.fmean(warm_start_tokens(b) for _, b in paired) if paired else None),
    }
    return out


def pooled_sd(comps: list[dict]) -> tuple[float | None, int]:
    """SD of paired differences pooled over comparisons, ``√(Σ(n_i − 1)·sd_i² / Σ(n_i − 1))``, and its degrees of
    freedom Σ(n_i − 1) (comparisons against one reference share its runs, so the df overstate the information)."""
    known = [(c["pairs"] - 1, c["sd"]) for c in comps if c["sd"] is not None and c["pairs"] >= 2]
    df = sum(k for k, _ in known)
    return (math.sqrt(sum(k * s * s for k, s in known) / df) if df else None), df


def paired_comparisons(runs: list[dict], reference: str, extra: tuple = (), margin: float = MARGIN):
    """(thresholds, common budget, [(label, cell, ref, comparisons)]): every cell against `reference`, then the
    `extra` rows, (cell, ref, label) each, where both cells have runs."""
    marks = thresholds_by_checkpoint(runs, reference)
    if not marks:
        return {}, None, []
    budget = common_budget(runs)
    have = {r["cell"] for r in runs}
    rows = [(cell, cell, reference) for cell in sorted(have - {reference})]
    rows += [(label, a, b) for a, b, label in extra if a in have and b in have]
    out = []
    for label, a, b in rows:
        c = comparisons(runs, a, b, budget, marks, margin)
        if c["pairs"]:
            out.append((label, a, b, c))
    return marks, budget, out


def paired_table(runs: list[dict], reference: str, margin: float = MARGIN, extra: tuple = ()) -> list[str]:
    """Markdown: every cell against `reference`, paired by (checkpoint, seed), each difference with its 95%
    t-interval: the endpoint (mean of the last 5 evaluations) with its verdict at ±margin, the SD of its paired
    differences and the seeds that SD needs to resolve the margin; the final accuracy; the mean accuracy over tokens
    0..X (AUC / X, X common to the table, warm starts charged) with its verdict; tokens to four thresholds from
    below the reference's endpoint to it and CPU seconds to the last (a run that never reaches one is unpaired
    there). Then the `extra` rows, (cell, other, label) each: contrasts, and A/A pairs (two names of one
    configuration, labelled 'A/A ...'), cell minus other the same way. Below it: the SD of paired endpoint and
    final-accuracy differences pooled over the rows against the reference, the seeds the pooled SD needs, and the
    A/A pairs' per-seed differences."""
    marks, budget, rows = paired_comparisons(runs, reference, extra, margin)
    if not marks:
        return [f"(no run of the reference cell {reference})"]
    only = next(iter(marks.values())) if len(marks) == 1 else None
    names = [f"{m:.3f}" for m in only] if only else [f"{s} of the gain" for s in SHARES]
    head = ["cell minus " + reference, "pairs", "endpoint (last 5 evals)", f"verdict ±{margin}", "SD of pairs",
            f"seeds for ±{margin}", "final acc", f"mean acc over tokens 0..{budget:,.0f}", f"verdict ±{margin}",
            "warm-start tokens (cell / other)"] + [f"tokens to {n}" for n in names] + [f"CPU s to {names[-1]}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, _, c in rows:
        e, w = c["endpoint"], c["warm_start"]
        row = [label, str(c["pairs"]), fmt(e, "+.3f"), e["verdict"] or "-", _f(e["sd"], ".3f"),
               _f(e["seeds_needed"], "d"), fmt(c["final"], "+.3f"), fmt(c["auc"], "+.3f"), c["auc"]["verdict"] or "-",
               f"{w[0]:,.0f} / {w[1]:,.0f}", *[fmt(t, "+,.0f") for t in c["tokens"]], fmt(c["cpu_s"], "+,.0f")]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    if not only:
        lines.append("- Thresholds per checkpoint (its reference's start plus 25/50/75/100% of its gain to its "
                     "endpoint): " + "; ".join(f"{c}: " + ", ".join(f"{m:.3f}" for m in ms) for c, ms in marks.items())
                     + ".")
    for key, what in (("endpoint", "endpoint"), ("final", "final accuracy")):
        s, df = pooled_sd([c[key] for label, a, b, c in rows if b == reference and label == a])
        if s is not None:
            lines.append(f"- SD of the paired {what} differences, pooled over the cells against {reference}: "
                         f"{s:.3f} ({df} df); seeds to resolve ±{margin} at it: {seeds_needed(s, margin)}.")
    for label, _a, _b, c in rows:
        if label.startswith("A/A"):
            lines.append(f"- {label} per seed: endpoint " + ", ".join(f"{d:+.3f}" for d in c["endpoint"]["diffs"])
                         + "; final accuracy " + ", ".join(f"{d:+.3f}" for d in c["final"]["diffs"])
                         + f". Largest |difference| of one configuration with itself: "
                         f"{max(abs(d) for d in c['endpoint']['diffs'] + c['final']['diffs']):.3f}.")
    return lines


def _f(x, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def _cross(points: Points | None, y: float) -> float | None:
    return crossing(points, y) if points else None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b
