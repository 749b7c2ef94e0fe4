"""Answer with tools: a multi-turn task where the policy calls a calculator and an encyclopedia before it answers,
the task where the environment's replies carry what the policy cannot know or compute itself.

The format, in plain characters (one token each for the embedded model); every policy turn ends with its eos, every
environment reply is tokens the policy never trains on (``policy_mask`` 0):

- the prompt is a question ending in ``?``: ``37*48?`` (a product), ``k7?`` (the value of key ``k7``),
  ``k7*13?`` (that value times 13) or ``7*8?`` (a one-digit product, known by heart);
- a policy turn is one call ``name(arguments)``:

  - ``calc(37*48)``: the calculator, two decimal numbers of at most ``max_arg_digits`` digits and a ``*``;
  - ``look(k7)``: the encyclopedia, ``num_keys`` keys ``k0``, ``k1``, ... with two-digit values drawn from
    ``seed`` (keys no model can know without calling);
  - ``ans(1776)``: the final answer, a decimal number; it ends the episode (reward 1 iff it is right);

- the environment replies ``=`` and the result, ``=1776``, or a tool error: ``=error: too long`` (a call over
  ``max_call_chars`` characters, or a turn cut at ``max_new_tokens`` without its eos), ``=error: not a call``
  (text that is not ``name(...)``), ``=error: unknown tool``, ``=error: bad arguments`` (anything but the grammar
  above: no expression is evaluated, a nested or repeated operation is refused) or ``=error: unknown key``.

The episode ends at the answer or after ``max_turns`` policy turns (reward 0); no reply follows the last turn, and
a call on it is logged with ``error: out of turns``. Every call is parsed by a fixed grammar from a text of at most
``max_call_chars`` characters, never evaluated, so it costs O(``max_call_chars``) whatever the policy writes.

A demonstration (the supervised warm start) calls what the problem needs and answers: ``37*48?`` -> ``calc(37*48)``
``=1776`` ``ans(1776)``; ``k7*13?`` -> ``look(k7)`` ``=53`` ``calc(53*13)`` ``=689`` ``ans(689)``; ``7*8?`` ->
``ans(56)``. Each rollout records its calls, one per policy turn, ``{"turn", "tool", "args", "result"}``
(``ToolRollout.calls``; the inference role writes them into the row's ``task`` JSON as ``calls``).
``continuations`` plays episodes on from any state of a rollout (mid-turn too) and ``problem_from`` rebuilds a
logged rollout's problem: what a Monte-Carlo oracle of the policy's value needs.

The critic's privileged context is the answer (with ``privileged_fact``: also the fact the problem looks up,
``689;k7=53``). The held-out set is a seeded sample of distinct problems, as many of each kind as the kinds allow;
problems are few per kind (``num_keys`` lookups, 64 one-digit products), so, as in a game, every problem is also a
training problem (``is_heldout`` is False); the encyclopedia is large enough (``num_keys``) that answering a lookup
from memory instead of calling pays little.

``heldout_breakdown`` reads a held-out evaluation's records (``metrics/heldout/step_<n>.jsonl``: each problem's
reward and the policy's turns joined by newlines) back into accuracy per kind and the tool-use rate: the share of
episodes of a kind that called every tool the kind needs (``NEEDS``; bench/tools_run.py records it per run).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field, replace

from prime_values.rollout import EnvRollout

from .arith import Problem
from .turns import Episode, TurnTask

KINDS = ("calc", "look", "both", "none")
"""the problem kinds: a product for the calculator, a lookup, a lookup times a number, a one-digit product"""
TOOLS = ("calc", "look")
ANSWER = "ans"

TOO_LONG = "error: too long"
NOT_A_CALL = "error: not a call"
UNKNOWN_TOOL = "error: unknown tool"
BAD_ARGUMENTS = "error: bad arguments"
UNKNOWN_KEY = "error: unknown key"
OUT_OF_TURNS = "error: out of turns"  # logged for a call on the last turn; no reply follows it
ERRORS = (TOO_LONG, NOT_A_CALL, UNKNOWN_TOOL, BAD_ARGUMENTS, UNKNOWN_KEY)

_MAX_NAME_CHARS = 8  # a tool name longer than this is not read
_LOGGED_CHARS = 32  # the arguments a call's record keeps (the tokens hold the whole turn)
_VALUES = (10, 99)  # the encyclopedia's values: two digits each


def check_settings(kinds: str, num_keys: int, calc_digits: int, max_arg_digits: int, max_call_chars: int,
                   max_turns: int, demo_tool_rate: float = 1.0) -> None:
    """The task's rules in one place (the constructor and prime_values/config/task.py call this before any job
    starts). Raises ValueError, one sentence naming the `task.*` key and the fix."""
    chosen = [k.strip() for k in kinds.split(",")] if isinstance(kinds, str) else []
    if not chosen or any(k not in KINDS for k in chosen) or len(set(chosen)) != len(chosen):
        raise ValueError(f"task.kinds={kinds!r} must be distinct kinds, comma-separated, from {','.join(KINDS)}")
    if not 1 <= num_keys <= 10_000:
        raise ValueError(f"task.num_keys={num_keys} must be in 1..10000 (keys k0..k<num_keys-1> of the lookup table)")
    if not 2 <= max_arg_digits <= 9:
        raise ValueError(f"task.max_arg_digits={max_arg_digits} must be in 2..9 (digits per calculator operand)")
    if not 2 <= calc_digits <= max_arg_digits:
        raise ValueError(f"task.calc_digits={calc_digits} must be in 2..task.max_arg_digits ({max_arg_digits}); "
                         "set task.calc_digits (digits per operand of a calculator problem)")
    longest = 7 + 2 * max_arg_digits  # calc(<digits>*<digits>)
    if not longest <= max_call_chars <= 256:
        raise ValueError(f"task.max_call_chars={max_call_chars} must be in {longest}..256 (a calculator call of two "
                         f"{max_arg_digits}-digit operands takes {longest})")
    if not 0.0 <= demo_tool_rate <= 1.0:
        raise ValueError(f"task.demo_tool_rate={demo_tool_rate} must be in [0, 1] (the share of the warm start's "
                         "demonstrations that call the tools a problem needs)")
    needed = max(_TURNS_NEEDED[k] for k in chosen)
    if not needed <= max_turns <= 32:
        raise ValueError(f"task.max_turns={max_turns} must be in {needed}..32: the demonstrations of "
                         f"task.kinds={kinds} take up to {needed} turns")


_TURNS_NEEDED = {"calc": 2, "look": 2, "both": 3, "none": 1}
NEEDS = {"calc": ("calc",), "look": ("look",), "both": ("look", "calc"), "none": ()}
"""the tools each kind's demonstration calls: an episode of a kind "used the right tools" when it called each of them
(``ToolsTask.heldout_breakdown``)"""


def _digits(text: str, most: int) -> int | None:
    """A decimal number of 1..``most`` ASCII digits, else None."""
    if not 1 <= len(text) <= most or not text.isascii() or not text.isdigit():
        return None
    return int(text)


@dataclass(frozen=True)
class Toolbox:
    """The tools of one task: the calculator and the encyclopedia, and the grammar of a call."""

    book: dict
    max_arg_digits: int
    max_call_chars: int

    def call(self, text: str | None) -> tuple[str, str, str]:
        """One policy turn (its text without eos, or None for a turn cut without eos) as ``(tool, args, result)``:
        the name written ('' when the text is not a call), its arguments (at most 32 characters kept) and the
        result or a tool error (module doc). Reads at most ``max_call_chars`` characters; evaluates nothing."""
        if text is None or not isinstance(text, str):
            return "", "", TOO_LONG
        if len(text) > self.max_call_chars:
            return "", text[:_LOGGED_CHARS], TOO_LONG
        text = text.strip()
        opened = text.find("(")
        if opened < 1 or not text.endswith(")"):
            return "", text[:_LOGGED_CHARS], NOT_A_CALL
        name, args = text[:opened], text[opened + 1:-1]
        if len(name) > _MAX_NAME_CHARS or not name.isascii() or not name.isalpha():
            return "", text[:_LOGGED_CHARS], NOT_A_CALL
        logged = args[:_LOGGED_CHARS]
        if name == "calc":
            a, star, b = args.partition("*")
            x, y = _digits(a, self.max_arg_digits), _digits(b, self.max_arg_digits)
            return name, logged, BAD_ARGUMENTS if not star or x is None or y is None else str(x * y)
        if name == "look":
            number = _digits(args[1:], 5) if args.startswith("k") else None
            if number is None or (args[1] == "0" and len(args) > 2):
                return name, logged, BAD_ARGUMENTS
            return name, logged, str(self.book[number]) if number in self.book else UNKNOWN_KEY
        if name == ANSWER:
            value = _digits(args, 2 * self.max_arg_digits)
            return name, logged, BAD_ARGUMENTS if value is None else str(value)
        return name, logged, UNKNOWN_TOOL


@dataclass
class Session:
    """The environment's state of one episode: the calls made, whether and how it was answered."""

    toolbox: Toolbox
    answer: str
    max_turns: int
    turns: int = 0
    answered: bool = False
    correct: bool = False
    calls: list = field(default_factory=list)

    def copy(self) -> Session:
        """The same state, with its own list of calls (an episode played on from here)."""
        return replace(self, calls=[dict(c) for c in self.calls])

    @property
    def done(self) -> bool:
        return self.answered or self.turns >= self.max_turns

    @property
    def reward(self) -> float:
        return 1.0 if self.correct else 0.0

    def play(self, text: str | None) -> str:
        """One policy turn (its text, or None for a turn cut without eos); returns the environment's reply text
        ('' once the episode is over: after the answer, and after the last turn)."""
        self.turns += 1
        tool, args, result = self.toolbox.call(text)
        if tool == ANSWER and result not in ERRORS:
            self.answered, self.correct = True, result == self.answer
        elif self.turns >= self.max_turns:
            result = OUT_OF_TURNS if tool in TOOLS and result not in ERRORS else result
        self.calls.append({"turn": self.turns, "tool": tool, "args": args, "result": result})
        return "" if self.done else f"={result}"


@dataclass
class ToolRollout(EnvRollout):
    """An episode of task=tools: an ``EnvRollout`` with its calls, one ``{"turn", "tool", "args", "result"}`` per
    policy turn (the row's ``task`` JSON keeps them as ``calls``)."""

    calls: list = field(default_factory=list)


class ToolsTask(TurnTask):
    name = "tools"
    multi_turn_capable = True

    def __init__(self, kinds: str = "calc,look,both,none", num_keys: int = 500, calc_digits: int = 2,
                 max_arg_digits: int = 4, max_call_chars: int = 24, max_turns: int = 4, privileged_fact: bool = False,
                 demo_tool_rate: float = 1.0, heldout_size: int = 200, seed: int = 1234):
        check_settings(kinds, num_keys, calc_digits, max_arg_digits, max_call_chars, max_turns, demo_tool_rate)
        self.demo_tool_rate = demo_tool_rate
        self.kinds = tuple(k.strip() for k in kinds.split(","))
        self.num_keys, self.calc_digits, self.max_arg_digits = num_keys, calc_digits, max_arg_digits
        self.max_call_chars, self.max_turns, self.privileged_fact = max_call_chars, max_turns, privileged_fact
        self.seed = seed
        self._tag = f"tools-{'-'.join(self.kinds)}-k{num_keys}-d{calc_digits}-s{seed}"
        values = random.Random(f"tools-book-{seed}")
        self.toolbox = Toolbox({k: values.randint(*_VALUES) for k in range(num_keys)}, max_arg_digits, max_call_chars)
        self._heldout = self._build_heldout(heldout_size, random.Random(f"{self._tag}-heldout"))

    # ------------------------------------------------------------------ problems
    def make_problem(self, kind: str, x: int, y: int = 0) -> Problem:
        """A problem of ``kind``: ``calc``/``none``: the product ``x*y``; ``look``: key ``kx``; ``both``: key ``kx``
        times ``y``."""
        if kind in ("calc", "none"):
            prompt, answer, fact = f"{x}*{y}?", x * y, ""
        elif kind == "look":
            prompt, answer, fact = f"k{x}?", self.toolbox.book[x], f"k{x}={self.toolbox.book[x]}"
        else:
            prompt, answer, fact = f"k{x}*{y}?", self.toolbox.book[x] * y, f"k{x}={self.toolbox.book[x]}"
        privileged = f"{answer};{fact}" if self.privileged_fact and fact else str(answer)
        pid = f"{self._tag}:{hashlib.sha1(prompt.encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=prompt, answer=str(answer), privileged=privileged,
                       meta={"kind": kind, "x": x, "y": y})

    def _draw(self, rng: random.Random, kind: str) -> Problem:
        low, high = 10 ** (self.calc_digits - 1), 10 ** self.calc_digits - 1
        if kind == "calc":
            return self.make_problem(kind, rng.randint(low, high), rng.randint(low, high))
        if kind == "look":
            return self.make_problem(kind, rng.randrange(self.num_keys))
        if kind == "both":
            return self.make_problem(kind, rng.randrange(self.num_keys), rng.randint(low, high))
        return self.make_problem(kind, rng.randint(2, 9), rng.randint(2, 9))

    def _build_heldout(self, size: int, rng: random.Random) -> list[Problem]:
        """As even a share of distinct problems per kind as the kinds allow (a kind with fewer distinct problems
        than its share gives what it has, drawn for at most 50 tries per problem)."""
        out: list[Problem] = []
        for i, kind in enumerate(self.kinds):
            share = size // len(self.kinds) + (1 if i < size % len(self.kinds) else 0)
            seen: dict[str, Problem] = {}
            for _ in range(50 * share):
                if len(seen) >= share:
                    break
                p = self._draw(rng, kind)
                seen.setdefault(p.prompt, p)
            out += seen.values()
        return out

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        return [self._draw(rng, rng.choice(self.kinds)) for _ in range(n)]

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return False

    def session(self, problem: Problem) -> Session:
        """The environment of one episode of ``problem``."""
        return Session(self.toolbox, problem.answer, self.max_turns)

    # ------------------------------------------------------------------ the warm start's demonstrations
    def demonstration(self, problem: Problem) -> list[tuple[str, bool]]:
        """The right tool use played out: (text, is_policy) segments after the prompt, each reply the toolbox's
        own; the caller appends eos to each policy segment and trains on those only. A problem that needs a tool
        is demonstrated without it, the answer at once, unless its draw (a hash of the prompt and task.seed, the
        same in every process) falls below ``demo_tool_rate``: a warm start that leaves RL room to raise tool use."""
        kind, x, y = problem.meta["kind"], problem.meta["x"], problem.meta["y"]
        if NEEDS[kind] and not self.demonstrates_tools(problem):
            return [(f"{ANSWER}({problem.answer})", True)]
        if kind == "calc":
            turns = [f"calc({x}*{y})"]
        elif kind == "look":
            turns = [f"look(k{x})"]
        elif kind == "both":
            turns = [f"look(k{x})", f"calc({self.toolbox.book[x]}*{y})"]
        else:
            turns = []
        segments: list[tuple[str, bool]] = []
        for call in turns:
            segments += [(call, True), (f"={self.toolbox.call(call)[2]}", False)]
        return segments + [(f"{ANSWER}({problem.answer})", True)]

    def demonstrates_tools(self, problem: Problem) -> bool:
        """Whether the warm start shows ``problem`` solved with its tools: a uniform draw in [0, 1) from a hash of
        the prompt and task.seed below ``demo_tool_rate`` (1.0: always, 0.0: never)."""
        digest = hashlib.sha256(f"tools-demo-{self.seed}-{problem.prompt}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2 ** 64 < self.demo_tool_rate

    def solution(self, problem: Problem) -> str:
        raise NotImplementedError("task=tools is multi-turn: its warm start trains on whole episodes "
                                  "(policy.warm_start); the sft stage takes single replies")

    # ------------------------------------------------------------------ scoring
    def score(self, problem: Problem, response_text: str) -> float:
        """A one-turn episode: 1.0 iff the reply is the right answer, ``ans(...)``."""
        tool, _, result = self.toolbox.call(response_text)
        return 1.0 if tool == ANSWER and result == problem.answer else 0.0

    def score_many(self, problems: list[Problem], texts: list[str]) -> list[float]:
        return [self.score(p, t) for p, t in zip(problems, texts)]

    # ------------------------------------------------------------------ rollouts (prime_values/tasks/turns.py)
    def start(self, problem: Problem) -> Session:
        return self.session(problem)

    def finished(self, episode: Episode) -> ToolRollout:
        rollout = super().finished(episode)
        return ToolRollout(**vars(rollout), calls=list(episode.state.calls))

    def problem_from(self, prompt: str, privileged: str) -> Problem:
        """The problem a logged rollout answered, from its prompt text and its privileged context (which starts
        with the answer): what the oracle critic plays on from."""
        left, star, right = prompt[:-1].partition("*") if prompt.endswith("?") else ("", "", "")
        problem = None
        if left.startswith("k") and _digits(left[1:], 5) in self.toolbox.book:
            y = _digits(right, self.calc_digits) if star else 0
            if y is not None:
                problem = self.make_problem("both" if star else "look", int(left[1:]), y)
        elif star and _digits(left, self.calc_digits) is not None and _digits(right, self.calc_digits) is not None:
            x, y = int(left), int(right)
            problem = self.make_problem("none" if x < 10 and y < 10 else "calc", x, y)
        if problem is None or problem.prompt != prompt or problem.privileged != privileged:
            raise ValueError(f"not a problem of task=tools: prompt {prompt[:16]!r}, privileged {privileged[:16]!r}")
        return problem

    # ------------------------------------------------------------------ the held-out evaluation, by kind
    def replay_text(self, problem: Problem, text: str, max_new_tokens: int | None = None) -> Session | None:
        """The episode a logged reply text plays again: ``text`` is the policy's turns joined by newlines (the
        ``response`` of a held-out record, ``EnvRollout.text``), each turn played as the environment played it.
        A turn of ``max_new_tokens`` characters or more was cut without its eos (one character is one token of
        the embedded model; an eos-ended turn has at most ``max_new_tokens - 1``), so it is played as the cut
        turn it was (``error: too long``; a cut turn holding a special token, which decodes to nothing, reads as
        ended). None when the text does not replay to the end of an episode: turns
        left after the episode ended, or too few to end it (a turn that held a newline of its own)."""
        session = self.session(problem)
        for turn in text.split("\n"):
            if session.done:
                return None
            session.play(None if max_new_tokens is not None and len(turn) >= max_new_tokens else turn)
        return session if session.done else None

    def heldout_breakdown(self, records: list[dict], max_new_tokens: int | None = None) -> dict:
        """Accuracy per kind and the tool-use rate of one held-out evaluation, from its records (one dict per
        problem with ``prompt_id``, ``reward`` and ``response``, as ``rollout.greedy_accuracy`` writes them to
        ``metrics/heldout/step_<n>.jsonl``; ``calls``, where a record has them, are taken as they are instead of
        replayed). ``max_new_tokens``: the run's ``inference.max_new_tokens`` (``replay_text``).

        A turn *calls* a tool when the toolbox reads it as a well-formed call of that tool (a value came back, or
        ``error: out of turns`` on the last turn); an episode *used the right tools* when it called each tool its
        kind needs (``NEEDS``; arguments not checked: the accuracy judges them). Per kind: ``problems``,
        ``accuracy`` (mean reward), ``right_tools`` (the share of replayed episodes that used the right tools;
        None for ``none``, which needs no tool), ``any_tool`` (the share that called any tool), ``tool_errors``
        (the share with a tool error, ``ERRORS``) and ``turns`` (mean policy turns). Overall: ``accuracy``,
        ``right_tools`` pooled over the episodes of the kinds that need a tool, ``replayed`` (episodes whose calls
        were read), ``unreplayed`` (records whose text did not replay, or replayed to another reward: left out
        of the tool rates, kept in the accuracy) and ``unmatched`` (records of no held-out problem, left out)."""
        by_id = {p.prompt_id: p for p in self._heldout}
        tally: dict[str, dict] = {k: {"problems": 0, "reward": 0.0, "replayed": 0, "right": 0, "any": 0,
                                      "errors": 0, "turns": 0} for k in self.kinds}
        unmatched = unreplayed = 0
        for record in records:
            problem = by_id.get(record.get("prompt_id"))
            if problem is None:
                unmatched += 1
                continue
            t = tally[problem.meta["kind"]]
            reward = float(record.get("reward", 0.0))
            t["problems"] += 1
            t["reward"] += reward
            calls = record.get("calls")
            if calls is None:
                session = self.replay_text(problem, str(record.get("response", "")), max_new_tokens)
                calls = session.calls if session is not None and session.reward == reward else None
            if calls is None:
                unreplayed += 1
                continue
            called = {c["tool"] for c in calls if c["tool"] in TOOLS and c["result"] not in ERRORS}
            t["replayed"] += 1
            t["right"] += all(tool in called for tool in NEEDS[problem.meta["kind"]])
            t["any"] += bool(called)
            t["errors"] += any(c["result"] in ERRORS for c in calls)
            t["turns"] += len(calls)

        def share(count: float, total: int) -> float | None:
            return count / total if total else None

        kinds = {k: {"problems": t["problems"], "accuracy": share(t["reward"], t["problems"]),
                     "right_tools": share(t["right"], t["replayed"]) if NEEDS[k] else None,
                     "any_tool": share(t["any"], t["replayed"]), "tool_errors": share(t["errors"], t["replayed"]),
                     "turns": share(t["turns"], t["replayed"])} for k, t in tally.items()}
        needing = [t for k, t in tally.items() if NEEDS[k]]
        return {"accuracy": share(sum(t["reward"] for t in tally.values()), sum(t["problems"] for t in tally.values())),
                "right_tools": share(sum(t["right"] for t in needing), sum(t["replayed"] for t in needing)),
                "replayed": sum(t["replayed"] for t in tally.values()), "unreplayed": unreplayed,
                "unmatched": unmatched, "kinds": kinds}

    # ------------------------------------------------------------------ sizes
    def _longest(self, kind: str) -> Problem:
        top = 10 ** self.calc_digits - 1
        return self.make_problem(kind, *{"calc": (top, top), "look": (self.num_keys - 1, 0),
                                         "both": (self.num_keys - 1, top), "none": (9, 9)}[kind])

    def max_answer_chars(self) -> int:
        """Longest policy turn of a demonstration in characters (a safe ``max_new_tokens - 1`` per turn)."""
        return max(len(text) for kind in self.kinds for text, policy in self.demonstration(self._longest(kind))
                   if policy)

    def longest_prompt_chars(self) -> int:
        return max(len(self._longest(kind).prompt) for kind in self.kinds)

    def max_privileged_chars(self) -> int:
        """Longest privileged context: an answer of up to ``2 * calc_digits`` digits, with ``privileged_fact`` and a
        lookup among the kinds also ``;k<key>=<value>``."""
        fact = len(f";k{self.num_keys - 1}={_VALUES[1]}") if self.privileged_fact and {"look", "both"} & set(
            self.kinds) else 0
        return 2 * self.calc_digits + fact

    def max_reply_chars(self) -> int:
        """Longest environment reply: ``=`` and a result (a product of two ``max_arg_digits``-digit numbers) or
        an error."""
        return 1 + max(2 * self.max_arg_digits, *(len(e) for e in ERRORS))

    def max_trace_chars(self, max_new_tokens: int) -> int:
        """Longest episode in characters (each one token of the embedded model): the prompt, ``max_turns`` turns of
        at most ``max_new_tokens`` tokens each, and a reply between turns."""
        replies = (self.max_turns - 1) * self.max_reply_chars()
        return self.longest_prompt_chars() + self.max_turns * max_new_tokens + replies

    def describe(self) -> dict:
        kinds = {k: sum(p.meta["kind"] == k for p in self._heldout) for k in self.kinds}
        return {"name": self.name, "kinds": ",".join(self.kinds), "num_keys": self.num_keys,
                "calc_digits": self.calc_digits, "max_arg_digits": self.max_arg_digits,
                "max_call_chars": self.max_call_chars, "max_turns": self.max_turns,
                "privileged_fact": self.privileged_fact, "heldout_size": len(self._heldout),
                "heldout_kinds": kinds, "seed": self.seed,
                "prompt_example": self._heldout[0].prompt if self._heldout else None}
