"""Reverse a string (PRIME-RL's classic ``reverse_text``): ``"hello|"`` -> ``"olleh"``.

Strings are generated procedurally, so the task runs offline:
- ``min_chars`` / ``max_chars``: the length is drawn uniformly from ``[min_chars, max_chars]``;
- ``alphabet``: the characters each position is drawn from (uniformly, independently).

The prompt is the string followed by ``|`` (the separator never occurs in the alphabet); the answer is the
reversed string, which is also the privileged context (the critic sees the target while the policy writes it,
so it can value every character as it appears).

Reward (partial credit): ``1 - levenshtein(response, answer) / max(len(response), len(answer))`` in ``[0, 1]``;
1.0 only for the exact reversal, 0.0 for an empty or entirely wrong response. Whitespace around the response
and a trailing ``<eos>`` text are ignored. Bounded time: the response is cut to ``2 * max_chars + 8``
characters before comparing (an over-long response still loses credit through its length), so one score is
O(max_chars^2) with a two-row dynamic programme; nothing is evaluated.
"""

from __future__ import annotations

import hashlib
import random
import string

from .arith import EOS_TEXT, Problem, strip_eos
from .procedural import ProceduralTask

SEPARATOR = "|"
DEFAULT_ALPHABET = string.ascii_lowercase


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions all cost 1); O(len(a) * len(b)) time, O(len(b)) space."""
    if len(a) < len(b):
        a, b = b, a
    if not b:
        return len(a)
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


def similarity(response: str, answer: str) -> float:
    """``1 - levenshtein / max(len)``: 1.0 for equal strings, 0.0 when nothing lines up (both empty: 1.0)."""
    longest = max(len(response), len(answer))
    return 1.0 if longest == 0 else 1.0 - levenshtein(response, answer) / longest


class ReverseTextTask(ProceduralTask):
    name = "reverse_text"

    def __init__(self, min_chars: int = 3, max_chars: int = 6, alphabet: str = DEFAULT_ALPHABET,
                 heldout_size: int = 200, seed: int = 1234):
        if not 1 <= min_chars <= max_chars:
            raise ValueError(f"need 1 <= min_chars <= max_chars, got min_chars={min_chars} max_chars={max_chars}")
        alphabet = "".join(dict.fromkeys(alphabet))  # dedupe, keep order
        if not alphabet:
            raise ValueError("alphabet must not be empty")
        if SEPARATOR in alphabet or any(not c.isprintable() or c.isspace() for c in alphabet):
            raise ValueError(f"alphabet must hold printable, non-space characters other than {SEPARATOR!r}; "
                             f"got {alphabet!r}")
        self.min_chars, self.max_chars, self.alphabet = min_chars, max_chars, alphabet
        self.heldout_size, self.seed = heldout_size, seed
        self.space_size = sum(len(alphabet) ** n for n in range(min_chars, max_chars + 1))
        if heldout_size > self.space_size // 2:
            raise ValueError(f"heldout_size {heldout_size} exceeds half of the {self.space_size} possible strings")
        digest = hashlib.sha1(alphabet.encode()).hexdigest()[:8]
        self._tag = f"reverse-{min_chars}-{max_chars}-{digest}"
        self._build_heldout(heldout_size, seed)

    # ------------------------------------------------------------------ problems
    def _draw(self, rng: random.Random) -> Problem:
        n = rng.randint(self.min_chars, self.max_chars)
        return self.make_problem("".join(rng.choice(self.alphabet) for _ in range(n)))

    def make_problem(self, text: str) -> Problem:
        prompt = text + SEPARATOR
        answer = text[::-1]
        pid = f"{self._tag}:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=prompt, answer=answer, privileged=answer)

    # ------------------------------------------------------------------ verifier
    def score(self, problem: Problem, response_text: str) -> float:
        """Partial credit in [0, 1]: normalised edit similarity of the response to the reversed string."""
        if not isinstance(response_text, str):
            return 0.0
        text = strip_eos(response_text[: 2 * self.max_chars + 8 + len(EOS_TEXT) + 2])
        return similarity(text[: 2 * self.max_chars + 8], problem.answer)

    def max_prompt_chars(self) -> int:
        """Longest possible prompt in characters: the longest string and the separator."""
        return self.max_chars + 1

    def max_answer_chars(self) -> int:
        return self.max_chars

    def describe(self) -> dict:
        return {
            "name": self.name,
            "min_chars": self.min_chars,
            "max_chars": self.max_chars,
            "alphabet": self.alphabet,
            "reward": "1 - levenshtein / max(len(response), len(answer))",
            "heldout_size": self.heldout_size,
            "seed": self.seed,
            "space_size": self.space_size,
            "max_answer_chars": self.max_answer_chars(),
            "prompt_example": self._heldout[0].prompt if self._heldout else None,
        }
