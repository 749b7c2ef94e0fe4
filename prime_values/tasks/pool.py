"""A fixed pool of training prompts for RL (``task.train_pool``), as a dataset of N problems would give.

Procedural tasks draw every RL prompt fresh (``task.sample``), so a prompt is almost never seen twice and a critic
can only learn what the prompt's text reveals about the policy's success. Real RL data is a finite set visited for
several epochs; with a pool the critic meets each prompt again and can learn its value for the current policy.
The pool is drawn once from the task's training stream (never a held-out prompt) with a seed, so every process
builds the same one; the supervised warm start keeps the full stream."""

from __future__ import annotations

import random


class PromptPool:
    """``sample(rng, n)`` draws uniformly (with repeats) from ``size`` distinct training problems of ``task``."""

    def __init__(self, task, size: int, seed: int):
        if size < 1:
            raise ValueError(f"a prompt pool needs size >= 1, got {size}")
        rng, chosen = random.Random(f"train-pool-{seed}"), {}
        for _ in range(20 * size):  # a stream with fewer distinct prompts than `size` stops here
            problem = task.sample(rng, 1)[0]
            chosen.setdefault(problem.prompt, problem)
            if len(chosen) == size:
                break
        else:
            raise ValueError(f"task.train_pool={size}: the training stream gave only {len(chosen)} distinct prompts "
                             f"in {20 * size} draws; use a smaller pool (or 0 for the stream)")
        self.problems = list(chosen.values())

    def sample(self, rng: random.Random, n: int) -> list:
        return [rng.choice(self.problems) for _ in range(n)]


def training_prompts(task, train_pool: int, seed: int):
    """What RL prompts are drawn from: the task's own stream (``train_pool=0``) or a fixed pool of that many."""
    return PromptPool(task, train_pool, seed) if train_pool > 0 else task
