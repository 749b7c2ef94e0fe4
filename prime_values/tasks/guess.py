"""Guess the secret number: a multi-turn game against hidden state, the task where a privileged critic has
information that no baseline of the batch has.

A game is a range ``1..N`` (``N`` drawn from ``min_number..max_number``) and a secret ``s`` in it. The policy sees
only the range, ``"1-15?"``; each turn it answers a number and its eos; the environment replies with tokens the
policy never trains on (``policy_mask`` 0):

- ``feedback="interval"``: the range the secret is still known to lie in, ``"9-15?"`` (the game is Markov in the
  last reply: a policy plays from it alone);
- ``feedback="direction"``: ``"<"`` (the secret is lower) or ``">"`` (higher); the policy keeps track itself.

A reply that is not a decimal number in ``1..N`` (or a turn cut at ``max_new_tokens`` without its eos) gets ``"!"``
and costs its turn. The game ends at the secret (reward 1) or after ``max_turns`` policy turns (reward 0); no reply
follows the last turn. Sampled text is parsed, never evaluated; a reply is read only up to 8 characters.

The critic's privileged context is the secret: with it the value of a state is the chance that *this* policy hits
``s`` from here, which the range alone (all a plain critic or a batch mean can use) does not tell apart.

Known ceiling: binary search (guess ``(lo + hi) // 2`` of the range left) finds every secret of ``1..N`` within
``ceil(log2(N + 1))`` turns; with ``max_turns = M`` it finds ``min(1, (2**M - 1) / N)`` of them, and no policy finds
more (``ceiling()``). The supervised warm start demonstrates binary search (``demonstration``).

The held-out set is every game ``(N, s)`` once when ``heldout_size`` is at least their number, else a seeded sample
of that many distinct games. The prompt names only the range, so the policy cannot tell held-out games from
training games: every game is also a training game, as in any game environment (``is_heldout`` is False).
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass

from .arith import Problem
from .turns import TurnTask

FEEDBACKS = ("interval", "direction")
_MAX_REPLY_CHARS = 8  # a guess longer than this is not read (a hostile reply costs O(1))


def check_settings(min_number: int, max_number: int, max_turns: int, feedback: str) -> None:
    """The task's rules in one place (the constructor and prime_values/config/task.py call this before any job
    starts). Raises ValueError, one sentence naming the `task.*` key and the fix."""
    if not 2 <= max_number <= 999:
        raise ValueError(f"task.max_number={max_number} must be in 2..999; set task.max_number (the largest range "
                         "1..N) to 2..999")
    if not 2 <= min_number <= max_number:
        raise ValueError(f"task.min_number={min_number} must be in 2..task.max_number ({max_number}); set "
                         "task.min_number (the smallest range 1..N)")
    if not 1 <= max_turns <= 32:
        raise ValueError(f"task.max_turns={max_turns} must be in 1..32 (policy turns per game)")
    if feedback not in FEEDBACKS:
        raise ValueError(f"task.feedback={feedback!r}: choose one of {', '.join(FEEDBACKS)}")


def parse_guess(text: str) -> int | None:
    """The number a reply names: decimal digits only (surrounding whitespace ignored), at most 3 of them; None for
    anything else, read only up to ``_MAX_REPLY_CHARS`` characters."""
    if not isinstance(text, str) or len(text) > _MAX_REPLY_CHARS:
        return None
    text = text.strip()
    if not text or len(text) > 3 or not text.isascii() or not text.isdigit():
        return None
    return int(text)


@dataclass
class Game:
    """The environment's state of one game: the range left and the turns played."""

    n: int
    secret: int
    feedback: str
    max_turns: int = 0  # 0: no limit (the demonstrations and hand-worked tests play on)
    lo: int = 1
    hi: int = 0
    turns: int = 0
    found: bool = False

    def __post_init__(self):
        self.hi = self.hi or self.n

    @property
    def done(self) -> bool:
        return self.found or bool(self.max_turns and self.turns >= self.max_turns)

    @property
    def reward(self) -> float:
        return 1.0 if self.found else 0.0

    def copy(self) -> Game:
        return copy.copy(self)

    def play(self, reply_text: str | None) -> str:
        """One policy turn (its text, or None for a turn cut without eos); returns the environment's reply text
        ('' once the secret is found)."""
        self.turns += 1
        guess = parse_guess(reply_text) if reply_text is not None else None
        if guess is None or not 1 <= guess <= self.n:
            return "!"
        if guess == self.secret:
            self.found = True
            return ""
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        if self.feedback == "direction":
            return ">" if self.secret > guess else "<"
        return f"{self.lo}-{self.hi}?"


class GuessTask(TurnTask):
    name = "guess"
    multi_turn_capable = True

    def __init__(self, min_number: int = 8, max_number: int = 40, max_turns: int = 5, feedback: str = "direction",
                 heldout_size: int = 200, seed: int = 1234):
        check_settings(min_number, max_number, max_turns, feedback)
        self.min_number, self.max_number, self.max_turns, self.feedback = min_number, max_number, max_turns, feedback
        self.heldout_size, self.seed = heldout_size, seed
        self._tag = f"guess-{min_number}-{max_number}-t{max_turns}-{feedback}"
        games = [self.make_problem(n, s) for n in range(min_number, max_number + 1) for s in range(1, n + 1)]
        if heldout_size < len(games):
            games = random.Random(f"{self._tag}-heldout-{seed}").sample(games, heldout_size)
        self._heldout = games

    # ------------------------------------------------------------------ problems
    def make_problem(self, n: int, secret: int) -> Problem:
        prompt = f"1-{n}?"
        pid = f"{self._tag}:{hashlib.sha1(f'{n}:{secret}'.encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=prompt, answer=str(secret), privileged=str(secret),
                       meta={"n": n, "secret": secret})

    def problem_from(self, prompt: str, privileged: str) -> Problem:
        """The game a logged rollout played, from its prompt text ('1-N?') and its privileged context (the
        secret): what the oracle critic plays on from (roles/evaluator.py)."""
        n = parse_guess(prompt[2:-1]) if prompt.startswith("1-") and prompt.endswith("?") else None
        secret = parse_guess(privileged)
        if n is None or secret is None or not 1 <= secret <= n:
            raise ValueError(f"not a game of task=guess: prompt {prompt[:16]!r}, secret {privileged[:16]!r}")
        return self.make_problem(n, secret)

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        out = []
        for _ in range(n):
            size = rng.randint(self.min_number, self.max_number)
            out.append(self.make_problem(size, rng.randint(1, size)))
        return out

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return False

    def ceiling(self) -> float:
        """The best success rate any policy reaches on the held-out games: binary search's."""
        best = 2 ** self.max_turns - 1
        return sum(min(1.0, best / p.meta["n"]) for p in self._heldout) / len(self._heldout)

    # ------------------------------------------------------------------ the warm start's demonstrations
    def demonstration(self, problem: Problem) -> list[tuple[str, bool]]:
        """Binary search played out: (text, is_policy) segments after the prompt; the caller appends eos to each
        policy segment and trains on those only."""
        game = Game(problem.meta["n"], problem.meta["secret"], self.feedback)
        segments: list[tuple[str, bool]] = []
        while game.turns < self.max_turns and not game.found:
            guess = str((game.lo + game.hi) // 2)
            segments.append((guess, True))
            reply = game.play(guess)
            if reply and game.turns < self.max_turns:
                segments.append((reply, False))
        return segments

    def solution(self, problem: Problem) -> str:
        raise NotImplementedError("task=guess is a multi-turn game: its warm start trains on whole games "
                                  "(policy.warm_start); the sft stage takes single replies")

    # ------------------------------------------------------------------ scoring
    def score(self, problem: Problem, response_text: str) -> float:
        """A one-turn game: 1.0 iff the reply names the secret (what a first guess alone is worth)."""
        return 1.0 if parse_guess(response_text) == problem.meta["secret"] else 0.0

    def score_many(self, problems: list[Problem], texts: list[str]) -> list[float]:
        return [self.score(p, t) for p, t in zip(problems, texts)]

    # ------------------------------------------------------------------ rollouts (prime_values/tasks/turns.py)
    def start(self, problem: Problem) -> Game:
        """The environment of one game of ``problem``."""
        return Game(problem.meta["n"], problem.meta["secret"], self.feedback, self.max_turns)

    # ------------------------------------------------------------------ sizes
    def max_answer_chars(self) -> int:
        """Longest guess in characters (a safe ``max_new_tokens - 1`` per turn)."""
        return len(str(self.max_number))

    def max_trace_chars(self) -> int:
        """Longest game in characters (each character one token of the embedded model, eos counted): the prompt,
        then ``max_turns`` turns of a guess and its eos, with a reply between turns."""
        reply = 1 if self.feedback == "direction" else 2 * len(str(self.max_number)) + 2
        prompt = len(f"1-{self.max_number}?")
        return prompt + self.max_turns * (self.max_answer_chars() + 1) + (self.max_turns - 1) * reply

    def describe(self) -> dict:
        return {"name": self.name, "min_number": self.min_number, "max_number": self.max_number,
                "max_turns": self.max_turns, "feedback": self.feedback, "heldout_size": len(self._heldout),
                "ceiling": round(self.ceiling(), 4), "seed": self.seed,
                "prompt_example": self._heldout[0].prompt if self._heldout else None}
