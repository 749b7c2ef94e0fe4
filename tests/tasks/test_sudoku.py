"""task=sudoku: 4x4 Sudoku move by move (prime_values/tasks/sudoku.py) -- the generator's unique solutions, the
verdicts worked by hand on a fixed grid, hostile turns answered in bounded time, the solver's demonstrations,
rollouts whose environment replies are policy_mask 0 and replay exactly, games played on from mid-episode states
(the oracle), and a short run of +experiment=sudoku that learns."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.__main__ import precheck
from prime_values.models.build import build_tiny_policy
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.roles.evaluator import OracleValues
from prime_values.rollout import sample_and_score
from prime_values.supervised import sft_batch
from prime_values.tasks import SudokuTask, make_task
from prime_values.tasks.sudoku import (
    ILLEGAL,
    LEGAL,
    UNREADABLE,
    Board,
    check_settings,
    make_puzzle,
    parse_move,
    solutions,
    solved_grids,
)
from tests.e2e_helpers import REPO, assert_learned, env_for_runs

#  1 2 | . 4        solution  1 2 | 3 4
#  3 . | . 2                  3 4 | 1 2
#  ----+----                  ----+----
#  2 1 | 4 .                  2 1 | 4 3
#  . 3 | 2 1                  4 3 | 2 1
PUZZLE, SOLUTION = "12.43..2214..321", "1234341221434321"


def test_the_fixed_grid_is_a_puzzle_with_one_solution():
    assert PUZZLE == "12.43..2214..321" and solutions(PUZZLE) == [SOLUTION]


def test_there_are_288_solved_grids_and_each_is_a_sudoku():
    grids = solved_grids()
    assert len(grids) == 288 == len(set(grids))
    for g in grids:
        rows = [g[4 * r:4 * r + 4] for r in range(4)]
        cols = [g[c::4] for c in range(4)]
        boxes = [g[r:r + 2] + g[r + 4:r + 6] for r in (0, 2, 8, 10)]
        assert all(sorted(unit) == list("1234") for unit in rows + cols + boxes)


def test_the_generator_is_deterministic_and_every_puzzle_has_one_solution():
    rng = random.Random(5)
    for blanks in range(1, 13):
        for _ in range(20):
            puzzle, solution = make_puzzle(rng, blanks)
            assert puzzle.count(".") == blanks and solutions(puzzle) == [solution]
            assert all(p in (".", s) for p, s in zip(puzzle, solution))
    assert make_puzzle(random.Random(3), 8) == make_puzzle(random.Random(3), 8)
    task = SudokuTask(blanks_min=3, blanks_max=9, heldout_size=50, seed=11)
    again = SudokuTask(blanks_min=3, blanks_max=9, heldout_size=50, seed=11)
    assert [p.prompt for p in task.heldout()] == [p.prompt for p in again.heldout()]
    assert len({p.prompt for p in task.heldout()}) == 50
    assert {p.meta["blanks"] for p in task.heldout()} <= set(range(3, 10))
    assert not any(task.is_heldout(p) for p in task.sample(random.Random(0), 500))
    assert task.is_heldout(task.heldout()[0])


def test_the_verdicts_by_hand():
    board = Board(list(PUZZLE), SOLUTION)
    assert board.play("13=4") == ILLEGAL  # 4 is already in row 1
    assert board.play("22=3") == ILLEGAL  # 3 is already in row 2 (and in its box)
    assert board.play("11=3") == ILLEGAL  # row 1 column 1 holds a clue
    assert board.play("44=3") == ILLEGAL  # a clue again, whatever the digit
    assert board.cells == list(PUZZLE) and board.illegal == 4 and board.turns == 4
    assert board.play("23=1") == LEGAL and board.cells[6] == "1"  # row 2 lacks 1 and 4; column 3 and box hold no 1
    assert board.play("23=4") == ILLEGAL  # now filled
    assert board.play("22=4") == LEGAL  # the only digit row 2, column 2 and box 1 leave
    assert board.play("13=3") == LEGAL and board.play("34=3") == LEGAL
    assert board.play(" 41=4\n") == "" and board.done and board.reward == 1.0  # the last blank: no reply follows


def test_a_legal_but_wrong_move_is_accepted_and_leads_nowhere():
    empty = Board(["."] * 16, SOLUTION)
    assert empty.play("11=4") == LEGAL and empty.cells[0] == "4"  # legal on an empty grid, and not the solution's 1
    puzzle, solution = make_puzzle(random.Random(0), 10)
    board = Board(list(puzzle), solution, max_turns=20, max_illegal=3)
    cell, digit = next((c, d) for c in range(16) for d in "1234" if puzzle[c] == "." and d != solution[c]
                       and Board(list(puzzle), solution).play(f"{c // 4 + 1}{c % 4 + 1}={d}") == LEGAL)
    assert board.play(f"{cell // 4 + 1}{cell % 4 + 1}={digit}") == LEGAL and not board.done
    # the solver's moves from here: each is either legal or not, but the grid can never become the solution
    for c in range(16):
        if board.cells[c] == "." and not board.done:
            board.play(f"{c // 4 + 1}{c % 4 + 1}={solution[c]}")
    assert board.reward == 0.0


def test_the_grid_feedback_shows_the_grid_after_each_move():
    board = Board(list(PUZZLE), SOLUTION, feedback="grid")
    assert board.play("23=1") == "+12.4/3.12/214./.321:"
    assert board.play("23=2") == "-12.4/3.12/214./.321:"
    assert board.play("zz") == "?12.4/3.12/214./.321:"


def test_the_game_ends_after_max_illegal_or_max_turns_unrewarded():
    board = Board(list(PUZZLE), SOLUTION, max_turns=10, max_illegal=2)
    assert board.play("11=1") == ILLEGAL and not board.done
    board.play(None)
    assert board.done and board.reward == 0.0
    board = Board(list(PUZZLE), SOLUTION, max_turns=2, max_illegal=2)
    board.play("23=1")
    board.play("22=4")
    assert board.done and board.reward == 0.0 and board.illegal == 0


HOSTILE = ["", "abc", "23=5", "03=1", "53=1", "2 3=1", "23 = 1", "23=1=1", "r2c3=1", "23=١", "２３=1", "-1=1",
           "23=1" + "\n" * 100, "x" * 10_000_000, "23=" + "1" * 10_000_000, "\x00\x00\x00\x00", None]


@pytest.mark.parametrize("text", HOSTILE)
def test_a_hostile_turn_gets_a_clear_bounded_reply_and_changes_nothing(text):
    board = Board(list(PUZZLE), SOLUTION, max_turns=10, max_illegal=5)
    reply = board.play(text)
    assert reply == UNREADABLE and board.cells == list(PUZZLE) and board.illegal == 1 and board.turns == 1


def test_an_over_long_turn_is_never_read_past_its_length():
    """The bound on a hostile turn's cost, checked without a clock: only len() is asked of a 10 MB reply."""

    class Untouchable(str):
        def __getattribute__(self, name):
            raise AssertionError(f"play read the over-long reply ({name})")

    board = Board(list(PUZZLE), SOLUTION, max_turns=10, max_illegal=5)
    assert board.play(Untouchable("23=1" + " " * 10_000_000)) == UNREADABLE and board.cells == list(PUZZLE)


def test_parse_move_reads_a_bounded_prefix_and_evaluates_nothing():
    assert parse_move("23=1") == (6, "1") and parse_move(" 44=4 \n") == (15, "4") and parse_move("11=1") == (0, "1")
    assert parse_move("__import__('os')") is None and parse_move("2*3=1") is None
    assert parse_move("123=1") is None and parse_move("23=12") is None


def test_settings_are_checked_in_one_line_naming_the_key():
    for args, key in [((1, 13, 13, 2, "verdict"), "task.blanks_max"), ((0, 8, 10, 2, "verdict"), "task.blanks_min"),
                      ((9, 8, 10, 2, "verdict"), "task.blanks_min"), ((4, 8, 7, 2, "verdict"), "task.max_turns"),
                      ((4, 8, 10, 0, "verdict"), "task.max_illegal"), ((4, 8, 10, 2, "board"), "task.feedback")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            check_settings(*args)
    line = precheck(["+experiment=sudoku", "task.max_turns=5"])
    assert line is not None and "task.max_turns" in line and "\n" not in line
    line = precheck(["+experiment=sudoku", "task.feedback=grid"])
    assert line is not None and "policy.arch.max_position_embeddings" in line


def test_the_experiment_and_the_oracle_on_it_are_valid():
    assert precheck(["+experiment=sudoku"]) is None
    assert precheck(["+experiment=sudoku", "critic=oracle", "critic.oracle_samples=4"]) is None
    assert make_task("sudoku", blanks_min=2, blanks_max=3, max_turns=4).max_turns == 4


def test_demonstrations_solve_every_puzzle():
    task = SudokuTask(blanks_min=1, blanks_max=12, max_turns=12, heldout_size=300)
    for p in task.heldout():
        segments = task.demonstration(p)
        moves = [t for t, policy in segments if policy]
        assert len(moves) == p.meta["blanks"]  # one legal move per blank, never a wasted turn
        assert [t for t, policy in segments if not policy] == [LEGAL] * (len(moves) - 1)
        board = task.start(p)
        for m in moves:
            board.play(m)
        assert board.done and board.reward == 1.0
    # the fixed grid: 13=3 is the first naked single in reading order (row 1 lacks only 3)
    p = task.make_problem(PUZZLE, SOLUTION)
    assert task.demonstration(p)[0] == ("13=3", True)


def test_sft_batch_labels_the_moves_and_their_eos_only():
    tok = build_char_tokenizer()
    task = SudokuTask()
    p = task.make_problem(PUZZLE, SOLUTION)
    ids, mask, labels = sft_batch(tok, task, [p])
    segments = task.demonstration(p)
    text = p.prompt + "".join(t + ("E" if policy else "") for t, policy in segments)
    learned = "." * len(p.prompt) + "".join(t + "E" if policy else "." * len(t) for t, policy in segments)
    assert int(mask.sum()) == len(text)
    for i, (ch, want) in enumerate(zip(text, learned)):
        if want == ".":
            assert labels[0, i] == -100, (i, ch)
        else:
            assert labels[0, i] == ids[0, i] and (ch == "E") == (int(ids[0, i]) == tok.eos_token_id), (i, ch)


def _replay(task, tok, problem, rollout):
    """The game a rollout's tokens play, replayed from its policy turns; asserts the replies in between match and
    are policy_mask 0 with logprob 0."""
    parts = []
    for token, m in zip(rollout.token_ids, rollout.policy_mask):
        if parts and parts[-1][1] == bool(m):
            parts[-1][0].append(token)
        else:
            parts.append(([token], bool(m)))
    board = task.start(problem)
    turns = [ids for ids, policy in parts if policy]
    replies = [tok.decode(ids) for ids, policy in parts[1:] if not policy]
    for k, ids in enumerate(turns):
        ended = ids[-1] == tok.eos_token_id
        reply = board.play(tok.decode(ids[:-1]) if ended else None)
        if k < len(replies):
            assert replies[k] == reply
    assert rollout.reward == board.reward and board.turns == rollout.turns
    assert all(lp == 0.0 for lp, m in zip(rollout.logprobs, rollout.policy_mask) if not m)
    return board


@pytest.mark.parametrize("feedback", ["verdict", "grid"])
def test_rollouts_replay_exactly_and_mask_the_environment(feedback):
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    task = SudokuTask(blanks_min=1, blanks_max=3, max_turns=4, feedback=feedback)
    model = build_tiny_policy(tok, seed=0).eval()
    problems = task.sample(random.Random(0), 4)
    for max_new in (3, 5):  # 3: no room for a move and its eos
        rollouts = sample_and_score(model, tok, task, problems, num_samples=3, max_new_tokens=max_new,
                                    temperature=1.0, seed=1)
        assert [r.prompt_index for r in rollouts] == [i for i in range(4) for _ in range(3)]
        for r in rollouts:
            p = problems[r.prompt_index]
            assert len(r.token_ids) == len(r.policy_mask) == len(r.logprobs)
            assert tok.decode(r.token_ids[:len(p.prompt)]) == p.prompt and not any(r.policy_mask[:len(p.prompt)])
            _replay(task, tok, p, r)


def test_continuations_play_on_from_a_state_mid_game_and_mid_turn():
    tok = build_char_tokenizer()
    task = SudokuTask(blanks_min=4, blanks_max=6, max_turns=6)
    model = build_tiny_policy(tok, seed=0).eval()
    problem = task.make_problem(PUZZLE, SOLUTION)
    eos = tok.eos_token_id
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    n = len(problem.prompt)
    after_one_move = (enc(problem.prompt) + enc("13=3") + [eos] + enc("+"), [0] * n + [1] * 5 + [0])
    mid_turn = (enc(problem.prompt) + enc("13=3") + [eos] + enc("+") + enc("41"), [0] * n + [1] * 5 + [0, 1, 1])
    out = task.continuations(model, tok, [(problem, *after_one_move), (problem, *mid_turn)], num_samples=4,
                             max_new_tokens=5, temperature=1.0, seed=0)
    assert [len(o) for o in out] == [4, 4]
    for (ids, mask), games in zip([after_one_move, mid_turn], out):
        for r in games:
            assert r.token_ids[:len(ids)] == ids and r.policy_mask[:len(mask)] == mask
            board = _replay(task, tok, problem, r)
            assert board.cells[2] == "3" and 2 <= board.turns <= 6
    # mid-turn: the second move goes on from '41' with at most 3 more tokens
    for r in out[1]:
        end = r.policy_mask.index(0, len(mid_turn[1])) if 0 in r.policy_mask[len(mid_turn[1]):] else len(r.token_ids)
        assert end - (n + 6) <= 5
    # the state the evaluator rebuilds from a logged row: the prompt text and the solution
    assert task.problem_from(problem.prompt, problem.privileged) == problem
    for prompt, privileged in [(problem.prompt, "1234/3412/2143/4312"), ("12.4/3..2:", problem.privileged),
                               ("..../..../..../....:", problem.privileged), (problem.prompt, "x" * 10_000)]:
        with pytest.raises(ValueError, match="not a puzzle of task=sudoku"):
            task.problem_from(prompt, privileged)
    with pytest.raises(ValueError, match="not before a policy token"):
        task.continuations(model, tok, [(problem, enc(problem.prompt) + enc("13=3") + [eos], [0] * n + [1] * 5)],
                           1, 5, 1.0, 0)


def test_the_oracle_values_sudoku_rollouts_at_policy_tokens_only():
    tok = build_char_tokenizer()
    task = SudokuTask(blanks_min=1, blanks_max=3, max_turns=4)
    model = build_tiny_policy(tok, seed=0).eval()
    problems = task.sample(random.Random(1), 2)
    rollouts = task.rollout(model, tok, problems, num_samples=2, max_new_tokens=5, temperature=1.0, seed=0)
    rows = [{"token_ids": r.token_ids, "policy_mask": r.policy_mask, "privileged": problems[r.prompt_index].privileged}
            for r in rollouts]
    cfg = OmegaConf.create({"critic": {"oracle_samples": 4}, "inference": {"max_new_tokens": 5, "temperature": 1.0}})
    values = OracleValues(cfg, task, tok, seed=0)(model, rows)
    for row, v in zip(rows, values):
        assert len(v) == len(row["token_ids"])
        for value, m in zip(v, row["policy_mask"]):
            assert (value * 4 == int(value * 4) and 0.0 <= value <= 1.0) if m else value == 0.0


TINY = ["+experiment=sudoku", "steps=4", "eval_every=4", "task.blanks_min=1", "task.blanks_max=2", "task.max_turns=4",
        "task.heldout_size=16", "policy.warm_start.steps=60", "policy.warm_start.target_accuracy=0",
        "policy.warm_start.batch_size=64", "inference.prompts_per_step=16", "inference.group_size=4",
        "critic.warm_start.steps=4", "critic.warm_start.rollouts=32", "policy.arch.hidden_size=64",
        "policy.arch.num_heads=2", "policy.arch.num_kv_heads=1", "policy.arch.intermediate_size=128",
        "policy.warm_start.cache=false", "log.plots=false", "launcher.poll_s=0.2", "launcher.stop_grace_s=20"]


@pytest.mark.slow
def test_a_short_run_of_the_experiment_learns_and_passes_check(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "prime_values", *TINY, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, env=env_for_runs(), capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    # four steps of a tiny model: rewards vary, advantages and gradients are nonzero, policy and critic move; too
    # few steps to give every step's direction gap a sign
    assert_learned(run_dir, critic=True, direction=False)
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
