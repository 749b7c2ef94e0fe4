"""An exponential moving average of a model's trainable weights (Polyak averaging).

After every optimizer step: avg <- decay * avg + (1 - decay) * w. The value trainer publishes the average and
keeps training the raw weights: a critic trained with a high learning rate on a moving target fluctuates from
step to step, and the average of its recent weights predicts better than any one of them (docs/benchmarks.md).
Hand-worked: w = 0 at the start, decay 0.5, then w = 4, 4: avg 2, 3.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch


class WeightAverage:
    """The running average of `params` (a model's trainable parameters, sharded or not: it is kept per tensor,
    like the parameter itself). decay = 0 keeps no copy and does nothing."""

    def __init__(self, params, decay: float):
        assert 0.0 <= decay < 1.0, f"weight-average decay must be in [0, 1), got {decay}"
        self.params, self.decay = list(params), decay
        self.average = [p.detach().clone() for p in self.params] if decay > 0 else []

    @torch.no_grad()
    def update(self) -> None:
        """Fold the current weights in: call after every optimizer step."""
        for avg, p in zip(self.average, self.params):
            avg.lerp_(p.detach(), 1.0 - self.decay)

    @torch.no_grad()
    def assign(self) -> None:
        """Put the average in the model for good (the end of training)."""
        for p, avg in zip(self.params, self.average):
            p.copy_(avg)

    @contextmanager
    def swapped(self):
        """Inside the block the model holds the average (to publish or score with it); the trained weights come
        back after it, also on an error."""
        if not self.average:
            yield
            return
        trained = [p.detach().clone() for p in self.params]
        self.assign()
        try:
            yield
        finally:
            with torch.no_grad():
                for p, w in zip(self.params, trained):
                    p.copy_(w)
