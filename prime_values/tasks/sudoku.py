"""4x4 Sudoku move by move: a multi-turn puzzle whose every move the environment judges, the task where a critic
that sees the solution knows at once whether a move was right and the policy has to find out by reasoning.

A puzzle is a 4x4 grid (digits 1-4; each row, column and 2x2 box holds each digit once) with ``blanks`` cells
blank (``blanks_min..blanks_max`` per puzzle, so a batch mixes difficulties) and exactly one solution. The policy
sees the grid, rows separated by ``/`` and blanks as ``.``: ``"1.34/3.12/2143/.321:"``. Each turn it writes one move
``RC=D`` (row R and column C in 1..4, digit D in 1..4: ``"12=2"`` writes 2 in row 1, column 2) and its eos; the
environment replies with tokens the policy never trains on (``policy_mask`` 0):

- ``"+"``: the move is legal (the cell was blank and D is not yet in its row, column or box) and is written;
- ``"-"``: the move is illegal (the cell is not blank, or D breaks a rule) and the grid is unchanged;
- ``"?"``: the turn is not a move (or was cut at ``max_new_tokens`` without its eos); the grid is unchanged.

Legality is judged against the current grid only, never against the solution, as a player on paper experiences it:
a legal move may still be wrong, and the dead end it leads to shows only later. With ``feedback="grid"`` the verdict
is followed by the grid as it now stands (``"+1234/3.12/2143/.321:"``: the game is Markov in the last reply, at
about 20 more tokens a turn); ``feedback="verdict"`` (the default) keeps the context short and the policy keeps
track of its moves itself.

The game ends when the grid is full (no reply follows), after ``max_illegal`` illegal or unreadable moves, or after
``max_turns`` turns. The reward is 1 iff the final grid is the solution (a full grid of legal moves always is: the
solution is unique), else 0. Sampled text is parsed, never evaluated; a move is read only up to 8 characters.

The critic's privileged context is the solution grid (``"1234/3412/2143/4321"``): with it the value of a state is
the chance that *this* policy completes the grid from here, which a mistaken but legal move drops to 0 at once.

Puzzles are generated offline and deterministically: a solved grid drawn from all 288 4x4 Sudokus, then clues
removed in a seeded order while the solution stays unique (a bitmask of the solved grids each clue allows: exactly
one grid must fit). The supervised warm start demonstrates a solver (``demonstration``): each move fills the first
cell, in reading order, that has a single candidate left (a naked single), else the first cell where a digit has a
single place left in its row, column or box (a hidden single), else the first blank, always with the solution's
digit. The held-out set is ``heldout_size`` distinct puzzles drawn with ``seed``; the training stream never repeats
one of them.
"""

from __future__ import annotations

import copy
import hashlib
import random
from dataclasses import dataclass, field
from functools import lru_cache

from .arith import Problem
from .turns import TurnTask

FEEDBACKS = ("verdict", "grid")
DIGITS = "1234"
BLANK = "."
LEGAL, ILLEGAL, UNREADABLE = "+", "-", "?"
MAX_BLANKS = 12  # a 4x4 Sudoku needs at least 4 clues for a unique solution
_MAX_MOVE_CHARS = 8  # a move longer than this is not read (a hostile reply costs O(1))
_MOVE_CHARS = 4  # 'RC=D'
_GRID_CHARS = 20  # '1.34/3.12/2143/.321:'


def check_settings(blanks_min: int, blanks_max: int, max_turns: int, max_illegal: int, feedback: str) -> None:
    """The task's rules in one place (the constructor and prime_values/config/task.py call this before any job
    starts). Raises ValueError, one sentence naming the `task.*` key and the fix."""
    if not 1 <= blanks_max <= MAX_BLANKS:
        raise ValueError(f"task.blanks_max={blanks_max} must be in 1..{MAX_BLANKS} (a 4x4 Sudoku with more blanks has "
                         "more than one solution); set task.blanks_max to 1..12")
    if not 1 <= blanks_min <= blanks_max:
        raise ValueError(f"task.blanks_min={blanks_min} must be in 1..task.blanks_max ({blanks_max}); set "
                         "task.blanks_min (the fewest blank cells of a puzzle)")
    if not blanks_max <= max_turns <= 64:
        raise ValueError(f"task.max_turns={max_turns} must be in task.blanks_max ({blanks_max})..64: a puzzle of "
                         f"{blanks_max} blanks takes that many moves; raise task.max_turns")
    if not 1 <= max_illegal <= max_turns:
        raise ValueError(f"task.max_illegal={max_illegal} must be in 1..task.max_turns ({max_turns}) (illegal or "
                         "unreadable moves that end a game)")
    if feedback not in FEEDBACKS:
        raise ValueError(f"task.feedback={feedback!r}: choose one of {', '.join(FEEDBACKS)}")


# ---------------------------------------------------------------------- grids

def box(cell: int) -> int:
    """The 2x2 box (0..3, reading order) of a cell (0..15, reading order)."""
    return 2 * (cell // 8) + (cell % 4) // 2


PEERS = tuple(tuple(o for o in range(16) if o != c and (o // 4 == c // 4 or o % 4 == c % 4 or box(o) == box(c)))
              for c in range(16))
"""the cells sharing a row, a column or a box with each cell"""
UNITS = tuple([tuple(range(4 * r, 4 * r + 4)) for r in range(4)] + [tuple(range(c, 16, 4)) for c in range(4)]
              + [tuple(o for o in range(16) if box(o) == b) for b in range(4)])
"""the 12 units: rows, columns, boxes"""


def legal(cells: str | list[str], cell: int, digit: str) -> bool:
    """Whether ``digit`` may be written in ``cell`` of ``cells`` (16 characters): the cell is blank and no peer
    holds the digit."""
    return cells[cell] == BLANK and all(cells[o] != digit for o in PEERS[cell])


@lru_cache(maxsize=None)
def solved_grids() -> tuple[str, ...]:
    """Every solved 4x4 Sudoku (288 of them), as 16 characters in reading order, sorted."""
    out: list[str] = []

    def fill(cells: list[str], at: int) -> None:
        if at == 16:
            out.append("".join(cells))
            return
        for d in DIGITS:
            if legal(cells, at, d):
                cells[at] = d
                fill(cells, at + 1)
                cells[at] = BLANK

    fill([BLANK] * 16, 0)
    return tuple(out)


@lru_cache(maxsize=None)
def _allows() -> tuple[tuple[int, ...], ...]:
    """``_allows()[cell][d]``: the bitmask of the solved grids with digit ``d + 1`` in ``cell``."""
    grids = solved_grids()
    return tuple(tuple(sum(1 << i for i, g in enumerate(grids) if g[c] == d) for d in DIGITS) for c in range(16))


def solutions(cells: str) -> list[str]:
    """The solved grids that agree with every clue of ``cells`` (16 characters, blanks as '.')."""
    fits = (1 << len(solved_grids())) - 1
    for c, ch in enumerate(cells):
        if ch != BLANK:
            fits &= _allows()[c][DIGITS.index(ch)]
    return [g for i, g in enumerate(solved_grids()) if fits >> i & 1]


def make_puzzle(rng: random.Random, blanks: int) -> tuple[str, str]:
    """(puzzle, solution): a solved grid drawn with ``rng``, then clues removed in a random order while exactly one
    solved grid fits, until ``blanks`` are blank (another order is tried when one gets stuck short of it)."""
    grids, allows = solved_grids(), _allows()
    everything = (1 << len(grids)) - 1
    while True:
        index = rng.randrange(len(grids))
        solution = grids[index]
        for _ in range(20):
            order = list(range(16))
            rng.shuffle(order)
            clues = set(range(16))
            for c in order:
                if len(clues) == 16 - blanks:
                    break
                fits = everything
                for o in clues - {c}:
                    fits &= allows[o][DIGITS.index(solution[o])]
                if fits == 1 << index:  # the solution stays the only grid that fits
                    clues.discard(c)
            if len(clues) == 16 - blanks:
                return "".join(solution[c] if c in clues else BLANK for c in range(16)), solution


def render(cells: str | list[str]) -> str:
    """Rows separated by '/': '1.34/3.12/2143/.321'."""
    text = "".join(cells)
    return "/".join(text[4 * r:4 * r + 4] for r in range(4))


def parse_grid(text: str) -> str | None:
    """The 16 cells of a rendered grid (``render``), None for anything else."""
    if not isinstance(text, str) or len(text) != 19 or text[4::5] != "///":
        return None
    cells = text.replace("/", "")
    return cells if len(cells) == 16 and all(ch in DIGITS + BLANK for ch in cells) else None


def parse_move(text: str) -> tuple[int, str] | None:
    """(cell 0..15, digit) of a move 'RC=D' (surrounding whitespace ignored); None for anything else, read only up
    to ``_MAX_MOVE_CHARS`` characters."""
    if not isinstance(text, str) or len(text) > _MAX_MOVE_CHARS:
        return None
    text = text.strip()
    if len(text) != _MOVE_CHARS or text[2] != "=" or any(ch not in DIGITS for ch in text[:2] + text[3]):
        return None
    return 4 * (int(text[0]) - 1) + int(text[1]) - 1, text[3]


def move_text(cell: int, digit: str) -> str:
    return f"{cell // 4 + 1}{cell % 4 + 1}={digit}"


def solver_move(cells: str | list[str], solution: str) -> int:
    """The cell a human solver fills next: the first naked single in reading order, else the first hidden single,
    else the first blank (-1 when the grid is full)."""
    blank = [c for c in range(16) if cells[c] == BLANK]
    for c in blank:
        if sum(legal(cells, c, d) for d in DIGITS) == 1:
            return c
    for c in blank:
        d = solution[c]
        if any(c in unit and [o for o in unit if legal(cells, o, d)] == [c] for unit in UNITS):
            return c
    return blank[0] if blank else -1


# ---------------------------------------------------------------------- the game

@dataclass
class Board:
    """The environment's state of one game: the grid as it stands and the turns played."""

    cells: list[str]
    solution: str
    feedback: str = "verdict"
    max_turns: int = 0  # 0: no limit (the demonstrations and hand-worked tests play on)
    max_illegal: int = 0  # 0: no limit
    turns: int = 0
    illegal: int = 0
    history: list[str] = field(default_factory=list)  # the verdicts

    @property
    def full(self) -> bool:
        return BLANK not in self.cells

    @property
    def done(self) -> bool:
        return self.full or bool(self.max_turns and self.turns >= self.max_turns) or \
            bool(self.max_illegal and self.illegal >= self.max_illegal)

    @property
    def reward(self) -> float:
        return 1.0 if "".join(self.cells) == self.solution else 0.0

    def copy(self) -> Board:
        out = copy.copy(self)
        out.cells, out.history = list(self.cells), list(self.history)
        return out

    def play(self, reply_text: str | None) -> str:
        """One policy turn (its text, or None for a turn cut without eos); returns the environment's reply text
        ('' once the grid is full)."""
        self.turns += 1
        move = parse_move(reply_text) if reply_text is not None else None
        if move is None:
            verdict = UNREADABLE
        elif legal(self.cells, *move):
            self.cells[move[0]] = move[1]
            verdict = LEGAL
        else:
            verdict = ILLEGAL
        if verdict != LEGAL:
            self.illegal += 1
        self.history.append(verdict)
        if self.full:
            return ""
        return verdict + (render(self.cells) + ":" if self.feedback == "grid" else "")


class SudokuTask(TurnTask):
    name = "sudoku"
    multi_turn_capable = True

    def __init__(self, blanks_min: int = 4, blanks_max: int = 8, max_turns: int = 10, max_illegal: int = 2,
                 feedback: str = "verdict", heldout_size: int = 200, seed: int = 1234):
        check_settings(blanks_min, blanks_max, max_turns, max_illegal, feedback)
        self.blanks_min, self.blanks_max, self.max_turns = blanks_min, blanks_max, max_turns
        self.max_illegal, self.feedback, self.heldout_size, self.seed = max_illegal, feedback, heldout_size, seed
        self._tag = f"sudoku-{blanks_min}-{blanks_max}-t{max_turns}-i{max_illegal}-{feedback}"
        rng = random.Random(f"{self._tag}-heldout-{seed}")
        held: dict[str, Problem] = {}
        for _ in range(50 * heldout_size):  # easy puzzles are few (288 with one blank): stop short if need be
            if len(held) >= heldout_size:
                break
            p = self._draw(rng)
            held.setdefault(p.prompt, p)
        self._heldout = list(held.values())
        self._heldout_prompts = frozenset(held)

    # ------------------------------------------------------------------ problems
    def make_problem(self, puzzle: str, solution: str) -> Problem:
        prompt = render(puzzle) + ":"
        pid = f"{self._tag}:{hashlib.sha1(puzzle.encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=prompt, answer=render(solution), privileged=render(solution),
                       meta={"puzzle": puzzle, "solution": solution, "blanks": puzzle.count(BLANK)})

    def _draw(self, rng: random.Random) -> Problem:
        return self.make_problem(*make_puzzle(rng, rng.randint(self.blanks_min, self.blanks_max)))

    def problem_from(self, prompt: str, privileged: str) -> Problem:
        """The puzzle a logged rollout played, from its prompt text (the grid and ':') and its privileged context
        (the solution): what the oracle critic plays on from (roles/evaluator.py)."""
        puzzle = parse_grid(prompt[:-1]) if prompt.endswith(":") else None
        solution = parse_grid(privileged)
        if puzzle is None or solution is None or solutions(puzzle) != [solution]:
            raise ValueError(f"not a puzzle of task=sudoku: prompt {prompt[:24]!r}, solution {privileged[:24]!r}")
        return self.make_problem(puzzle, solution)

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        """``n`` training puzzles, never one of the held-out puzzles."""
        out: list[Problem] = []
        while len(out) < n:
            p = self._draw(rng)
            if p.prompt not in self._heldout_prompts:
                out.append(p)
        return out

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return problem.prompt in self._heldout_prompts

    # ------------------------------------------------------------------ the warm start's demonstrations
    def demonstration(self, problem: Problem) -> list[tuple[str, bool]]:
        """The solver played out (``solver_move``): (text, is_policy) segments after the prompt; the caller appends
        eos to each policy segment and trains on those only."""
        board = self.start(problem)
        segments: list[tuple[str, bool]] = []
        while not board.done:
            cell = solver_move(board.cells, board.solution)
            move = move_text(cell, board.solution[cell])
            segments.append((move, True))
            reply = board.play(move)
            if reply and not board.done:
                segments.append((reply, False))
        return segments

    def solution(self, problem: Problem) -> str:
        raise NotImplementedError("task=sudoku is a multi-turn game: its warm start trains on whole games "
                                  "(policy.warm_start); the sft stage takes single replies")

    # ------------------------------------------------------------------ scoring
    def score(self, problem: Problem, response_text: str) -> float:
        """A one-turn game: 1.0 iff the one move completes the grid (a puzzle of one blank, solved)."""
        board = self.start(problem)
        board.play(response_text)
        return board.reward

    def score_many(self, problems: list[Problem], texts: list[str]) -> list[float]:
        return [self.score(p, t) for p, t in zip(problems, texts)]

    # ------------------------------------------------------------------ rollouts (prime_values/tasks/turns.py)
    def start(self, problem: Problem) -> Board:
        """The environment of one game of ``problem``."""
        return Board(list(problem.meta["puzzle"]), problem.meta["solution"], self.feedback, self.max_turns,
                     self.max_illegal)

    # ------------------------------------------------------------------ sizes
    def max_answer_chars(self) -> int:
        """A move in characters ('RC=D': a safe ``max_new_tokens - 1`` per turn)."""
        return _MOVE_CHARS

    def max_reply_chars(self) -> int:
        return 1 + (_GRID_CHARS if self.feedback == "grid" else 0)

    def max_trace_chars(self, max_new_tokens: int) -> int:
        """Longest game in characters (each character one token of the embedded model): the prompt, ``max_turns``
        turns of at most ``max_new_tokens`` tokens each, and a reply between turns."""
        return _GRID_CHARS + self.max_turns * max_new_tokens + (self.max_turns - 1) * self.max_reply_chars()

    def describe(self) -> dict:
        blanks = {b: sum(p.meta["blanks"] == b for p in self._heldout)
                  for b in range(self.blanks_min, self.blanks_max + 1)}
        return {"name": self.name, "blanks_min": self.blanks_min, "blanks_max": self.blanks_max,
                "max_turns": self.max_turns, "max_illegal": self.max_illegal, "feedback": self.feedback,
                "heldout_size": len(self._heldout), "heldout_blanks": blanks, "seed": self.seed,
                "prompt_example": self._heldout[0].prompt if self._heldout else None}
