"""What the procedurally generated tasks (arith, reverse_text) share: a fixed held-out set drawn once from a seed,
a training stream that never repeats a held-out prompt, and the batch scoring and warm-start target the roles use.

A subclass sets `_tag` (what makes its problem space distinct) and implements `_draw(rng)` and `score`, then
calls `_build_heldout(heldout_size, seed)` at the end of its constructor."""

from __future__ import annotations

import random


class ProceduralTask:
    _tag: str

    def _draw(self, rng: random.Random):
        raise NotImplementedError

    def score(self, problem, response_text: str) -> float:
        raise NotImplementedError

    def _build_heldout(self, heldout_size: int, seed: int) -> None:
        """The fixed evaluation set: the same in every process given the constructor arguments."""
        rng = random.Random(f"{self._tag}-heldout-{seed}")
        held: dict = {}
        while len(held) < heldout_size:
            p = self._draw(rng)
            held.setdefault(p.prompt, p)
        self._heldout = list(held.values())
        self._heldout_prompts = frozenset(held)

    def sample(self, rng: random.Random, n: int) -> list:
        """``n`` training problems (repeats possible), never one of the held-out prompts."""
        out = []
        while len(out) < n:
            p = self._draw(rng)
            if p.prompt not in self._heldout_prompts:
                out.append(p)
        return out

    def heldout(self) -> list:
        return list(self._heldout)

    def is_heldout(self, problem) -> bool:
        return problem.prompt in self._heldout_prompts

    def score_many(self, problems: list, texts: list[str]) -> list[float]:
        """``score`` for a batch (the task interface the roles call; math verifies a batch in a worker pool)."""
        return [self.score(p, t) for p, t in zip(problems, texts)]

    def solution(self, problem) -> str:
        """Target response text for the supervised warm start (the caller appends eos)."""
        return problem.answer
