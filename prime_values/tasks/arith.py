"""Procedurally generated integer arithmetic: ``"12+34="`` -> ``"46"``.

Difficulty knobs:
- ``digits``: every operand is drawn uniformly from ``[0, 10**digits)`` (so fewer digits occur too);
- ``min_digits`` (0 = off): each operand first draws its digit count uniformly from ``min_digits..digits``, then a
  number of exactly that many digits (``0..9`` for one digit), so problems of several difficulties come in equal
  shares (``min_digits=1, digits=3``: one third each of 1-, 2- and 3-digit operands);
- ``operands``: how many numbers per expression (>= 2);
- ``min_operands`` (0 = off): each problem first draws its operand count uniformly from ``min_operands..operands``,
  so a batch mixes problems of several lengths, and the chance of solving one depends on the prompt (a
  per-prompt baseline, a critic's, can tell them apart where a batch mean cannot);
- ``ops``: the operators to draw from, any non-empty subset of ``"+-*"``, one drawn per gap.

Expressions are evaluated with the usual precedence (``*`` before ``+``/``-``, then left to right),
exactly as Python would; subtraction may give negative answers (``"3-15="`` -> ``"-12"``).

With ``show_work`` (``+``/``-`` only) the answer is the worked solution: every running result left to
right, comma-separated, the last one being the value: ``"12+34+56="`` -> ``"46,102"``. The privileged
context is then that worked solution, so a privileged critic can check each intermediate result as the
policy writes it (credit assignment inside a response).

Prompts carry no spaces; the answer is the plain decimal integer. ``score`` is exact string match of
the response (surrounding whitespace and a trailing ``<eos>`` text are ignored), never evaluates the
response, and rejects over-long strings before looking at them, so it is O(answer length).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field

from .procedural import ProceduralTask

EOS_TEXT = "<eos>"


def strip_eos(text: str) -> str:
    """A response without surrounding whitespace and one trailing ``<eos>`` (what the verifiers compare)."""
    text = text.strip()
    return text[: -len(EOS_TEXT)].rstrip() if text.endswith(EOS_TEXT) else text
_MAX_RESPONSE_CHARS = 64


@dataclass(frozen=True)
class Problem:
    prompt_id: str  # stable across processes: task tag + prompt text hash
    prompt: str  # "12+34="
    answer: str  # "46"
    privileged: str  # what the critic may see (the reference answer)
    meta: dict = field(default_factory=dict, compare=False, hash=False)


def _evaluate(nums: list[int], ops: list[str]) -> int:
    """Standard precedence: fold ``*`` runs into terms, then sum terms left to right with signs."""
    total, term, sign = 0, nums[0], 1
    for op, n in zip(ops, nums[1:]):
        if op == "*":
            term *= n
        else:
            total += sign * term
            sign, term = (1 if op == "+" else -1), n
    return total + sign * term


def check_settings(digits: int, operands: int, ops: str, show_work: bool = False, min_digits: int = 0,
                   min_operands: int = 0) -> None:
    """The task's rules, in one place: the constructor and the config check (prime_values/config/task.py) call this
    before any job starts. Raises ValueError, one sentence naming the `task.*` key and the fix."""
    if not 1 <= digits <= 9:
        raise ValueError(f"task.digits={digits} must be in 1..9; set task.digits (digits per operand) to 1..9")
    if not 0 <= min_digits <= digits:
        raise ValueError(f"task.min_digits={min_digits} must be in 0..task.digits ({digits}); 0 draws operands "
                         "uniformly from [0, 10**digits)")
    if operands < 2:
        raise ValueError(f"task.operands={operands} must be >= 2 (a problem joins its operands with operators); "
                         "set task.operands=2 or more")
    if min_operands and not 2 <= min_operands <= operands:
        raise ValueError(f"task.min_operands={min_operands} must be 0 (off) or in 2..task.operands ({operands}); "
                         "set task.min_operands to the fewest operands a problem has")
    if not ops:
        raise ValueError("task.ops='' is empty; give the operators to draw from, any of '+-*' (e.g. task.ops=+)")
    for bad in sorted(set(ops) - set("+-*")):
        raise ValueError(f"task.ops={ops!r} contains {bad!r}; use characters from '+-*'")
    if show_work and "*" in ops:
        raise ValueError(f"task.show_work=true needs task.ops from '+-' (got {ops!r}): running results are left to "
                         "right")


class ArithTask(ProceduralTask):
    name = "arith"

    def __init__(self, digits: int = 2, operands: int = 2, ops: str = "+", heldout_size: int = 200,
                 seed: int = 1234, show_work: bool = False, min_digits: int = 0, min_operands: int = 0):
        check_settings(digits, operands, ops, show_work, min_digits, min_operands)
        self.min_operands = min_operands
        self.digits, self.operands, self.seed, self.show_work = digits, operands, seed, show_work
        self.min_digits = min_digits
        self.ops = "".join(dict.fromkeys(ops))  # dedupe, keep order
        self.heldout_size = heldout_size
        numbers = 10 ** digits - (10 ** (min_digits - 1) if min_digits > 1 else 0)  # operand values that can occur
        self.space_size = numbers ** operands * len(self.ops) ** (operands - 1)
        if heldout_size > self.space_size // 2:
            raise ValueError(f"heldout_size {heldout_size} exceeds half of the {self.space_size} possible problems")
        self._tag = f"arith-d{digits}-n{operands}-{self.ops}" + ("-work" if show_work else "") \
            + (f"-min{min_digits}" if min_digits else "") + (f"-from{min_operands}" if min_operands else "")
        self._build_heldout(heldout_size, seed)

    # ------------------------------------------------------------------ problems
    def _operand(self, rng: random.Random) -> int:
        if not self.min_digits:
            return rng.randint(0, 10 ** self.digits - 1)
        d = rng.randint(self.min_digits, self.digits)
        return rng.randint(0 if d == 1 else 10 ** (d - 1), 10 ** d - 1)

    def _draw(self, rng: random.Random) -> Problem:
        count = rng.randint(self.min_operands, self.operands) if self.min_operands else self.operands
        nums = [self._operand(rng) for _ in range(count)]
        ops = [rng.choice(self.ops) for _ in range(count - 1)]
        return self.make_problem(nums, ops)

    def make_problem(self, nums: list[int], ops: list[str]) -> Problem:
        prompt = str(nums[0]) + "".join(op + str(n) for op, n in zip(ops, nums[1:])) + "="
        if self.show_work:  # running results, left to right: 12+34+56 -> 46,102
            answer = ",".join(str(_evaluate(nums[: k + 2], ops[: k + 1])) for k in range(len(ops)))
        else:
            answer = str(_evaluate(nums, ops))
        pid = f"{self._tag}:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=prompt, answer=answer, privileged=answer)

    # ------------------------------------------------------------------ verifier
    def score(self, problem: Problem, response_text: str) -> float:
        """1.0 iff the response is exactly the answer (modulo whitespace / a trailing ``<eos>``)."""
        if not isinstance(response_text, str) or len(response_text) > _MAX_RESPONSE_CHARS:
            return 0.0
        return 1.0 if strip_eos(response_text) == problem.answer else 0.0

    def max_prompt_chars(self) -> int:
        """Longest possible prompt in characters: every operand at `digits` digits, the operators, '='."""
        return self.operands * self.digits + self.operands

    def max_answer_chars(self) -> int:
        """Longest possible answer in characters (sign included): a safe ``max_new_tokens - 1``."""
        hi = 10 ** self.digits - 1
        biggest = hi ** self.operands if "*" in self.ops else hi * self.operands
        one = len(str(biggest)) + (1 if "-" in self.ops else 0)
        if self.show_work:  # operands - 1 running results and the commas between them
            return sum(len(str(hi * (k + 2))) + (1 if "-" in self.ops else 0) for k in range(self.operands - 1)) \
                + self.operands - 2
        return one

    def describe(self) -> dict:
        return {
            "name": self.name,
            "digits": self.digits,
            "min_digits": self.min_digits,
            "operands": self.operands,
            "min_operands": self.min_operands,
            "ops": self.ops,
            "show_work": self.show_work,
            "precedence": "standard (* before +/-, left to right)",
            "heldout_size": self.heldout_size,
            "seed": self.seed,
            "space_size": self.space_size,
            "max_answer_chars": self.max_answer_chars(),
            "prompt_example": self._heldout[0].prompt if self._heldout else None,
        }
