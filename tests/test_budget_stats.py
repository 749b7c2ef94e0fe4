"""bench/budget_stats.py: interpolated crossings, the curve's value and mean over a budget, the paired bootstrap,
and the paired table, on hand-worked numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import budget_stats as bs  # noqa: E402

CURVE = [(0.0, 0.5), (10.0, 0.6), (20.0, 0.8), (30.0, 0.7)]


def test_crossing_interpolates_on_the_first_segment_that_reaches_the_threshold():
    assert bs.crossing(CURVE, 0.5) == 0.0                  # already there at the first point
    assert bs.crossing(CURVE, 0.55) == pytest.approx(5.0)  # halfway from 0.5 to 0.6
    assert bs.crossing(CURVE, 0.75) == pytest.approx(17.5)  # 10 + (0.75 - 0.6) / 0.2 * 10
    assert bs.crossing(CURVE, 0.7) == pytest.approx(15.0)  # the first crossing, not the later fall to 0.7
    assert bs.crossing(CURVE, 0.81) is None


def test_value_at_and_mean_over_the_budget():
    assert bs.value_at(CURVE, 25.0) == pytest.approx(0.75)
    assert bs.value_at(CURVE, 31.0) is None
    # area 0..20: (10 * (0.5 + 0.6) / 2) + (10 * (0.6 + 0.8) / 2) = 5.5 + 7 = 12.5, over 20 tokens: 0.625
    assert bs.mean_over(CURVE, 20.0) == pytest.approx(0.625)
    # to 15: 5.5 + 5 * (0.6 + 0.7) / 2 = 8.75, over 15: 0.58333
    assert bs.mean_over(CURVE, 15.0) == pytest.approx(8.75 / 15)
    assert bs.mean_over(CURVE, 40.0) is None


def test_paired_bootstrap_is_the_mean_with_an_interval_inside_the_pairs_range():
    mean, lo, hi = bs.paired_bootstrap([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and 1.0 <= lo < 2.5 < hi <= 4.0
    assert bs.paired_bootstrap([2.0, 2.0]) == (2.0, 2.0, 2.0)
    assert bs.paired_bootstrap([1.0, 5.0]) == bs.paired_bootstrap([1.0, 5.0])  # deterministic


def run(cell: str, seed: int, accs: list[float], tokens: list[int], costs=None) -> dict:
    return {"cell": cell, "ckpt": "0-abc", "seed": seed, "start_accuracy": accs[0], "final_accuracy": accs[-1],
            "curve": [[10 * i, a, t] for i, (a, t) in enumerate(zip(accs, tokens))],
            "eval_costs": costs}


def test_the_paired_table_pairs_by_seed_and_reads_thresholds_off_the_reference():
    runs = [run("ref", 0, [0.5, 0.7], [0, 100], [[0, 0, 0], [10, 50, 80]]),
            run("ref", 1, [0.5, 0.9], [0, 100], [[0, 0, 0], [10, 60, 90]]),
            run("new", 0, [0.5, 0.9], [0, 100], [[0, 0, 0], [10, 40, 100]]),
            run("new", 1, [0.5, 0.9], [0, 100], [[0, 0, 0], [10, 40, 100]]),
            run("new", 7, [0.5, 0.1], [0, 100])]  # no reference run at seed 7: not paired
    # reference: start 0.5, final mean 0.8; thresholds 0.55, 0.6, 0.65, 0.7 + ... = 0.5 + (.25, .5, .75, 1) * 0.3
    assert bs.thresholds(runs, "ref") == [0.575, 0.65, 0.725, 0.8]
    [head, _, row] = bs.paired_table(runs, "ref")
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert head.count("tokens to") == 4 and cells[:2] == ["new", "2"]
    assert cells[2].startswith("+0.100 ")  # final: (0.9 - 0.7) and (0.9 - 0.9)
    # tokens to 0.8: new reaches it at 75 (seed 0 and 1); ref seed 0 never (unpaired), seed 1 at 75: one pair, 0
    assert cells[7] == "+0 (one pair) (1 unpaired)"
    # wall to 0.8: new 40 * 0.75 = 30, ref seed 1 at 60 * 0.75 = 45: -15
    assert cells[8] == "-15 (one pair) (1 unpaired)"
