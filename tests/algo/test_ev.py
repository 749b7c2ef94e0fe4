"""Pooled explained variance (algo.ev) and the run summary's use of it, with hand-worked numbers."""

import json
import math

import torch

from prime_values.algo.ev import ev_from_sums, ev_sums
from prime_values.algo.gae import explained_variance
from prime_values.tools.summary import final_explained_variance


def test_hand_worked_pooled_ev_one_batch_or_two():
    # y = [0, 1], pred = [0, 0.5]: r = [0, 0.5], Var r = 1/16, Var y = 1/4 -> EV = 0.75
    y, pred, mask = torch.tensor([[0.0, 1.0]]), torch.tensor([[0.0, 0.5]]), torch.ones(1, 2, dtype=torch.bool)
    assert ev_from_sums([ev_sums(pred, y, mask)]) == 0.75
    one = ev_sums(pred[:, :1], y[:, :1], mask[:, :1])
    two = ev_sums(pred[:, 1:], y[:, 1:], mask[:, 1:])
    assert one == [1.0, 0.0, 0.0, 0.0, 0.0] and two == [1.0, 0.5, 0.25, 1.0, 1.0]
    assert ev_from_sums([one, two]) == 0.75
    # each single-token batch alone has Var y = 0: undefined, so a mean of per-batch EVs has nothing to average
    assert math.isnan(ev_from_sums([one]))


def test_pooled_equals_explained_variance_on_the_concatenation_and_ignores_masked_entries():
    g = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):
        y = torch.randint(0, 2, (8, 5), generator=g).float()
        pred = torch.rand(8, 5, generator=g)
        mask = torch.rand(8, 5, generator=g) > 0.3
        pred_garbage = torch.where(mask, pred, torch.full_like(pred, 1e6))  # off-mask values never count
        batches.append((pred_garbage, y, mask))
    pooled = ev_from_sums([ev_sums(*b) for b in batches])
    cat = [torch.cat([b[i] for b in batches]) for i in range(3)]
    # both in float64 over 120 entries: rounding ~120 * 1.1e-16 of sums of order 10, far under 1e-9; the two
    # estimators below differ by > 1e-6 on these batches
    assert abs(pooled - explained_variance(*cat)) < 1e-9
    per_batch_mean = sum(explained_variance(*b) for b in batches) / 3
    assert abs(pooled - per_batch_mean) > 1e-6  # a different estimator, not a relabelled mean


def test_summary_pools_when_sums_are_logged_and_falls_back_to_the_mean():
    with_sums = [{"step": 1, "critic_explained_variance": 0.1, "critic_ev_sums": [1.0, 0.0, 0.0, 0.0, 0.0]},
                 {"step": 2, "critic_explained_variance": 0.2, "critic_ev_sums": [1.0, 0.5, 0.25, 1.0, 1.0]}]
    assert final_explained_variance(json.loads(json.dumps(with_sums))) == 0.75
    old = [{"step": 1, "critic_explained_variance": 0.1}, {"step": 2, "critic_explained_variance": 0.3}]
    assert abs(final_explained_variance(old) - 0.2) < 1e-12  # (0.1 + 0.3) / 2 in float64: within an ulp of 0.2
    assert final_explained_variance([{"step": 1}]) is None  # grpo: no critic
