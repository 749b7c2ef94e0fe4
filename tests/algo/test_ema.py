"""The critic's weight average (algo.ema, critic.weight_average): hand-worked numbers, the swap in and out of a
model, and the no-op at decay 0."""

from __future__ import annotations

import pytest
import torch

from prime_values.algo.ema import WeightAverage


def model_with(value: float) -> torch.nn.Linear:
    layer = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        layer.weight.fill_(value)
    return layer


def test_weight_average_hand_worked():
    """w = 0 at the start, decay 0.75, then w = 4 twice: avg = 0.75 * 0 + 0.25 * 4 = 1, then 0.75 * 1 + 0.25 * 4 =
    1.75 (decay and 1 - decay swapped would give 3, then 3.75; all exact in binary floating point)."""
    layer = model_with(0.0)
    average = WeightAverage(layer.parameters(), 0.75)
    seen = []
    for _ in range(2):
        with torch.no_grad():
            layer.weight.fill_(4.0)
        average.update()
        seen.append(average.average[0].item())
    assert seen == [1.0, 1.75]


def test_swapped_holds_the_average_inside_and_the_trained_weights_after_also_on_error():
    layer = model_with(0.0)
    average = WeightAverage(layer.parameters(), 0.75)
    with torch.no_grad():
        layer.weight.fill_(8.0)
    average.update()  # 0.75 * 0 + 0.25 * 8 = 2
    with average.swapped():
        assert layer(torch.ones(1, 1)).item() == 2.0
    assert layer.weight.item() == 8.0
    with pytest.raises(RuntimeError), average.swapped():
        raise RuntimeError("publishing failed")
    assert layer.weight.item() == 8.0
    average.assign()  # for good, at the end of pretraining
    assert layer.weight.item() == 2.0


def test_decay_zero_keeps_no_copy_and_changes_nothing():
    layer = model_with(1.0)
    average = WeightAverage(layer.parameters(), 0.0)
    with torch.no_grad():
        layer.weight.fill_(5.0)
    average.update()
    with average.swapped():
        assert layer.weight.item() == 5.0
    average.assign()
    assert average.average == [] and layer.weight.item() == 5.0


def test_decay_out_of_range_is_refused():
    with pytest.raises(AssertionError, match=r"\[0, 1\)"):
        WeightAverage(model_with(0.0).parameters(), 1.0)
