"""task=guess: a multi-turn game against a hidden secret (prime_values/tasks/guess.py) -- its rules worked by hand,
its warm-start demonstrations, and rollouts whose environment replies are policy_mask 0 and replay exactly."""

from __future__ import annotations

import random

import pytest
import torch

from prime_values.models.build import build_tiny_policy
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.rollout import sample_and_score
from prime_values.supervised import sft_batch
from prime_values.tasks import GuessTask
from prime_values.tasks.guess import Game, parse_guess


def test_a_game_by_hand_with_direction_replies():
    game = Game(n=10, secret=7, feedback="direction")
    assert game.play("5") == ">"  # 7 > 5
    assert game.play("8") == "<"  # 7 < 8
    assert (game.lo, game.hi, game.found) == (6, 7, False)
    assert game.play(" 7 ") == "" and game.found and game.turns == 3


def test_a_game_by_hand_with_interval_replies():
    game = Game(n=15, secret=3, feedback="interval")
    assert game.play("8") == "1-7?"
    assert game.play("2") == "3-7?"
    assert game.play("12") == "3-7?"  # a guess outside the range left teaches nothing new, and costs the turn
    assert game.play("3") == "" and game.found and game.turns == 4


@pytest.mark.parametrize("reply", ["", "abc", "-3", "0", "11", "1e1", "7.0", "٣", "9" * 10_000_000, None])
def test_a_reply_that_is_not_a_number_in_range_costs_its_turn(reply):
    game = Game(n=10, secret=3, feedback="direction")
    assert game.play(reply) == "!"
    assert game.turns == 1 and not game.found and (game.lo, game.hi) == (1, 10)


def test_parse_guess_reads_a_bounded_prefix_and_evaluates_nothing():
    assert parse_guess("12") == 12 and parse_guess(" 12\n") == 12
    assert parse_guess("1+1") is None and parse_guess("__import__('os')") is None
    assert parse_guess("1234") is None  # more than 3 digits


def test_demonstration_is_binary_search():
    task = GuessTask(min_number=8, max_number=40, max_turns=5, feedback="direction")
    # 1..10, secret 7: mid(1,10)=5 '>' -> 6..10, mid=8 '<' -> 6..7, mid=6 '>' -> 7..7, mid=7 found
    assert task.demonstration(task.make_problem(10, 7)) == [("5", True), (">", False), ("8", True), ("<", False),
                                                            ("6", True), (">", False), ("7", True)]
    # 1..40, secret 40: 20 21..40 -> 30 31..40 -> 35 36..40 -> 38 39..40 -> 39: 5 turns used, not found, and
    # no reply after the last turn
    segments = task.demonstration(task.make_problem(40, 40))
    assert [t for t, policy in segments if policy] == ["20", "30", "35", "38", "39"]
    assert segments[-1] == ("39", True)


def test_the_ceiling_is_binary_search_on_every_game():
    task = GuessTask(min_number=8, max_number=40, max_turns=5, heldout_size=1000)
    # every game once: sum of N for N=8..40 = 792; binary search in 5 turns finds min(N, 31) secrets of 1..N:
    # sum_{8..31} N = 468, plus 9 ranges (32..40) x 31 = 279, so 747 / 792
    assert len(task.heldout()) == 792
    assert task.ceiling() == pytest.approx(747 / 792)
    won = 0
    for p in task.heldout():
        game = Game(p.meta["n"], p.meta["secret"], "direction")
        for text, policy in task.demonstration(p):
            if policy:
                game.play(text)
        won += game.found
    assert won == 747
    assert len(GuessTask(heldout_size=50).heldout()) == 50  # fewer asked: a seeded sample of distinct games
    assert not task.is_heldout(task.heldout()[0])


def test_sft_batch_labels_the_policy_turns_and_their_eos_only():
    tok = build_char_tokenizer()
    task = GuessTask(feedback="direction")
    ids, mask, labels = sft_batch(tok, task, [task.make_problem(10, 7)])
    text = "1-10?" + "5" + "E" + ">" + "8" + "E" + "<" + "6" + "E" + ">" + "7" + "E"
    learned = "....." + "5E" + "." + "8E" + "." + "6E" + "." + "7E"
    assert int(mask.sum()) == len(text)
    for i, (ch, want) in enumerate(zip(text, learned)):
        if want == ".":
            assert labels[0, i] == -100, (i, ch)
        else:
            assert labels[0, i] == ids[0, i] and (ch == "E") == (int(ids[0, i]) == tok.eos_token_id), (i, ch)


def _segments(rollout):
    """The rollout's tokens split where policy_mask changes: [(token ids, is_policy)]."""
    out = []
    for token, m in zip(rollout.token_ids, rollout.policy_mask):
        if out and out[-1][1] == bool(m):
            out[-1][0].append(token)
        else:
            out.append(([token], bool(m)))
    return out


@pytest.mark.parametrize("feedback", ["direction", "interval"])
def test_rollouts_replay_exactly_and_mask_the_environment(feedback):
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    task = GuessTask(min_number=8, max_number=12, max_turns=3, feedback=feedback)
    model = build_tiny_policy(tok, seed=0).eval()
    problems = task.sample(random.Random(0), 6)
    # a model that knows nothing: replies of any kind, cut turns included (2 new tokens: no room for 2 digits + eos)
    for max_new in (2, 3):
        rollouts = sample_and_score(model, tok, task, problems, num_samples=3, max_new_tokens=max_new,
                                    temperature=1.0, seed=1)
        assert [r.prompt_index for r in rollouts] == [i for i in range(6) for _ in range(3)]
        for r in rollouts:
            p = problems[r.prompt_index]
            assert len(r.token_ids) == len(r.policy_mask) == len(r.logprobs)
            parts = _segments(r)
            assert tok.decode(parts[0][0]) == p.prompt and not parts[0][1]
            game = Game(p.meta["n"], p.meta["secret"], feedback)
            policy_turns = [ids for ids, policy in parts[1:] if policy]
            replies = [tok.decode(ids) for ids, policy in parts[1:] if not policy]
            assert len(policy_turns) == r.turns <= 3
            for k, ids in enumerate(policy_turns):
                ended = ids[-1] == tok.eos_token_id
                reply = game.play(tok.decode(ids[:-1]) if ended else None)
                if k < len(replies):
                    assert replies[k] == reply
            assert r.reward == float(game.found)
            assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.policy_mask) if not m)
            assert all(lp <= 0.0 for lp, m in zip(r.logprobs, r.policy_mask) if m)


def _replay(task, tok, problem, rollout):
    """The game a rollout's tokens play, replayed from its policy turns; asserts the replies in between match."""
    parts = _segments(rollout)
    game = Game(problem.meta["n"], problem.meta["secret"], task.feedback)
    policy_turns = [ids for ids, policy in parts if policy]
    replies = [tok.decode(ids) for ids, policy in parts[1:] if not policy]
    for k, ids in enumerate(policy_turns):
        ended = ids[-1] == tok.eos_token_id
        reply = game.play(tok.decode(ids[:-1]) if ended else None)
        if k < len(replies):
            assert replies[k] == reply
    assert rollout.reward == float(game.found)
    return game


def test_continuations_play_on_from_a_state_mid_game_and_mid_turn():
    tok = build_char_tokenizer()
    task = GuessTask(min_number=8, max_number=12, max_turns=3, feedback="direction")
    model = build_tiny_policy(tok, seed=0).eval()
    problem = task.make_problem(10, 7)
    eos = tok.eos_token_id
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    after_one_turn = (enc("1-10?") + enc("5") + [eos] + enc(">"), [0] * 5 + [1, 1] + [0])
    mid_turn = (enc("1-10?") + enc("7"), [0] * 5 + [1])
    out = task.continuations(model, tok, [(problem, *after_one_turn), (problem, *mid_turn)], num_samples=4,
                             max_new_tokens=3, temperature=1.0, seed=0)
    assert [len(o) for o in out] == [4, 4]
    for (ids, mask), games in zip([after_one_turn, mid_turn], out):
        for r in games:
            assert r.token_ids[:len(ids)] == ids and r.policy_mask[:len(mask)] == mask
            assert len(r.token_ids) == len(r.policy_mask) == len(r.logprobs)
            game = _replay(task, tok, problem, r)
            assert game.turns == r.turns <= 3
    # mid-turn: the first turn goes on from '7' with at most 2 more tokens: '7' + eos wins at once
    for r in out[1]:
        first = r.token_ids[5:r.policy_mask.index(0, 5) if 0 in r.policy_mask[5:] else len(r.token_ids)]
        assert first[0] == enc("7")[0] and len(first) <= 3
    with pytest.raises(ValueError, match="not before a policy token"):
        task.continuations(model, tok, [(problem, enc("1-10?") + enc("7") + [eos], [0] * 5 + [1, 1])], 1, 3, 1.0, 0)


def test_continuations_of_states_of_different_lengths_keep_each_sample_with_its_own_state():
    """States of one round decoded shortest first (by_length) get back the samples drawn from their own prefix: each
    game's first new token has the logprob the policy gives it after that game's own state."""
    from prime_values.models.sampling import teacher_forced_logprobs

    tok = build_char_tokenizer()
    task = GuessTask(min_number=8, max_number=12, max_turns=3, feedback="direction")
    model = build_tiny_policy(tok, seed=0).eval()
    problem = task.make_problem(10, 7)
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    longer = (enc("1-10?") + enc("5") + [tok.eos_token_id] + enc(">"), [0] * 5 + [1, 1] + [0])
    shorter = (enc("1-10?"), [0] * 5)
    out = task.continuations(model, tok, [(problem, *longer), (problem, *shorter)], num_samples=3,
                             max_new_tokens=3, temperature=1.0, seed=0)
    for (ids, _), games in zip([longer, shorter], out):
        for r in games:
            (want,) = teacher_forced_logprobs(model, [ids], [r.token_ids[len(ids):len(ids) + 1]], 1.0,
                                              tok.pad_token_id)
            assert r.logprobs[len(ids)] == pytest.approx(want[0], abs=1e-4)
