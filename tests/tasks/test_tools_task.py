"""task=tools: a multi-turn task whose policy calls a calculator and a lookup table (prime_values/tasks/tools.py) --
the tools and their errors worked by hand, each call read no further than its bound, the warm start's
demonstrations, rollouts whose environment replies are what the tools give for the policy's calls (policy_mask 0) and
replay exactly, the calls in the row's `task` JSON and in `prime_values.tools.show`, and a short run of
+experiment=tools that passes check."""

from __future__ import annotations

import json
import random
import subprocess
import sys

import pytest
import torch

from prime_values.__main__ import precheck
from prime_values.models.build import build_tiny_policy
from prime_values.models.sampling import Completion
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.roles.inference import env_rows
from prime_values.rollout import sample_and_score
from prime_values.supervised import sft_batch
from prime_values.tasks import ToolsTask
from prime_values.tasks.tools import (
    BAD_ARGUMENTS,
    NOT_A_CALL,
    OUT_OF_TURNS,
    TOO_LONG,
    UNKNOWN_KEY,
    UNKNOWN_TOOL,
    Session,
    check_settings,
)
from tests.e2e_helpers import REPO, env_for_runs, stream_table

TASK = ToolsTask(num_keys=50, seed=7)
BOOK = TASK.toolbox.book


def test_the_tools_by_hand():
    call = TASK.toolbox.call
    assert call("calc(37*48)") == ("calc", "37*48", "1776")
    assert call(" calc(0*9999) \n") == ("calc", "0*9999", "0")
    assert call("calc(9999*9999)") == ("calc", "9999*9999", str(9999 * 9999))
    assert call("look(k7)") == ("look", "k7", str(BOOK[7]))
    assert call("look(k49)") == ("look", "k49", str(BOOK[49]))
    assert call("ans(1776)") == ("ans", "1776", "1776")
    assert all(10 <= v <= 99 for v in BOOK.values()) and len(BOOK) == 50
    assert ToolsTask(num_keys=50, seed=7).toolbox.book == BOOK != ToolsTask(num_keys=50, seed=8).toolbox.book


HOSTILE = [
    (None, TOO_LONG),  # a turn cut at max_new_tokens without its eos
    ("calc(" + "9" * 30 + ")", TOO_LONG),  # over task.max_call_chars (24): never parsed
    ("x" * 10_000_000, TOO_LONG),
    ("calc(1*2" + ")" * 10_000_000, TOO_LONG),
    ("1776", NOT_A_CALL),
    ("", NOT_A_CALL),
    ("calc 37*48", NOT_A_CALL),
    ("(37*48)", NOT_A_CALL),
    ("__import__('os')", NOT_A_CALL),  # 'os')' is no tool name and nothing runs
    ("c@lc(1*2)", NOT_A_CALL),
    ("cälc(1*2)", NOT_A_CALL),
    ("eval(1*2)", UNKNOWN_TOOL),
    ("exec(1)", UNKNOWN_TOOL),
    ("Calc(1*2)", UNKNOWN_TOOL),
    ("calc(37+48)", BAD_ARGUMENTS),
    ("calc(3*)", BAD_ARGUMENTS),
    ("calc(*4)", BAD_ARGUMENTS),
    ("calc(1*2*3)", BAD_ARGUMENTS),
    ("calc(9**9999)", BAD_ARGUMENTS),  # an exponent would run long: not in the grammar
    ("calc(12345*2)", BAD_ARGUMENTS),  # more than task.max_arg_digits (4) digits
    ("calc(-3*4)", BAD_ARGUMENTS),
    ("calc(1e9*2)", BAD_ARGUMENTS),
    ("calc(٣*4)", BAD_ARGUMENTS),  # a non-ASCII digit
    ("calc(calc(2*3)*4)", BAD_ARGUMENTS),  # a nested call: no recursion
    ("look(look(k1))", BAD_ARGUMENTS),
    ("look(7)", BAD_ARGUMENTS),
    ("look(k)", BAD_ARGUMENTS),
    ("look(k07)", BAD_ARGUMENTS),
    ("look(k50)", UNKNOWN_KEY),
    ("look(k99999)", UNKNOWN_KEY),
    ("ans(x)", BAD_ARGUMENTS),
    ("ans(123456789)", BAD_ARGUMENTS),
]


def test_an_over_long_call_is_read_no_further_than_its_length_and_logged_prefix():
    """A call's cost is O(task.max_call_chars) whatever the text, checked without a clock: of a 10 MB call only
    len() and the logged prefix are taken; no method of the text is called."""

    class Untouchable(str):
        def __getattribute__(self, name):
            raise AssertionError(f"the toolbox read the over-long call ({name})")

    assert TASK.toolbox.call(Untouchable("calc(1*2" + ")" * 10_000_000))[2] == TOO_LONG


@pytest.mark.parametrize("text, error", HOSTILE, ids=[repr(t)[:24] for t, _ in HOSTILE])
def test_a_hostile_call_gets_a_bounded_clear_error(text, error):
    tool, args, result = TASK.toolbox.call(text)
    assert result == error
    assert len(args) <= 32 and len(tool) <= 8
    session = TASK.session(TASK.make_problem("calc", 37, 48))
    assert session.play(text) == f"={error}" and not session.done and session.turns == 1


def test_an_episode_by_hand_ends_at_the_answer():
    problem = TASK.make_problem("both", 7, 13)
    assert problem.prompt == "k7*13?" and problem.answer == str(BOOK[7] * 13) == problem.privileged
    session = TASK.session(problem)
    assert session.play("look(k7)") == f"={BOOK[7]}"
    assert session.play("calc(7*13)") == "=91"  # a wrong step is the policy's own: the tool answers what it is asked
    assert session.play(f"calc({BOOK[7]}*13)") == f"={BOOK[7] * 13}"
    assert session.play(f"ans({BOOK[7] * 13})") == "" and session.done and session.correct and session.turns == 4
    assert [c["tool"] for c in session.calls] == ["look", "calc", "calc", "ans"]
    assert session.calls[0] == {"turn": 1, "tool": "look", "args": "k7", "result": str(BOOK[7])}
    wrong = TASK.session(problem)
    assert wrong.play("ans(1)") == "" and wrong.done and not wrong.correct and wrong.turns == 1


def test_too_many_calls_end_the_episode_without_a_reply_and_unrewarded():
    """A policy that repeats a call (a loop) gets its replies until max_turns; the last turn's call is not run
    on and no reply follows it."""
    session = Session(TASK.toolbox, "1776", max_turns=4)
    replies = [session.play("calc(37*48)") for _ in range(4)]
    assert replies == ["=1776"] * 3 + [""]
    assert session.done and not session.correct and session.turns == 4
    assert session.calls[-1]["result"] == OUT_OF_TURNS
    bad = Session(TASK.toolbox, "1776", max_turns=2)
    assert bad.play("ans(x)") == f"={BAD_ARGUMENTS}"  # a malformed answer costs its turn, no more
    assert bad.play("nope") == "" and bad.done and bad.calls[-1]["result"] == NOT_A_CALL


def test_demonstrations_use_the_right_tools_and_win():
    task = ToolsTask(num_keys=50, seed=7, heldout_size=400)
    assert task.demonstration(task.make_problem("calc", 37, 48)) == [("calc(37*48)", True), ("=1776", False),
                                                                     ("ans(1776)", True)]
    assert task.demonstration(task.make_problem("look", 7)) == [("look(k7)", True), (f"={BOOK[7]}", False),
                                                                (f"ans({BOOK[7]})", True)]
    assert task.demonstration(task.make_problem("both", 7, 13)) == [
        ("look(k7)", True), (f"={BOOK[7]}", False), (f"calc({BOOK[7]}*13)", True), (f"={BOOK[7] * 13}", False),
        (f"ans({BOOK[7] * 13})", True)]
    assert task.demonstration(task.make_problem("none", 7, 8)) == [("ans(56)", True)]
    kinds = {}
    for p in task.heldout():
        kinds[p.meta["kind"]] = kinds.get(p.meta["kind"], 0) + 1
        session = task.session(p)
        for text, policy in task.demonstration(p):
            if policy:
                assert len(text) <= task.max_answer_chars()
                reply = session.play(text)
            else:
                assert text == reply  # the demonstration's replies are the environment's own
        assert session.correct and session.turns <= task.max_turns
    assert kinds == {"calc": 100, "look": 50, "both": 100, "none": 64}  # as even as the kinds allow
    assert task.max_answer_chars() == len("calc(99*99)")


def test_sft_batch_labels_the_policy_turns_and_their_eos_only():
    tok = build_char_tokenizer()
    ids, mask, labels = sft_batch(tok, TASK, [TASK.make_problem("calc", 37, 48)])
    text = "37*48?" + "calc(37*48)E" + "=1776" + "ans(1776)E"
    learned = "......" + "calc(37*48)E" + "....." + "ans(1776)E"
    assert int(mask.sum()) == len(text)
    for i, (ch, want) in enumerate(zip(text, learned)):
        if want == ".":
            assert labels[0, i] == -100, (i, ch)
        else:
            assert labels[0, i] == ids[0, i] and (ch == "E") == (int(ids[0, i]) == tok.eos_token_id), (i, ch)


def test_a_warm_start_with_room_for_tool_use_answers_some_problems_at_once():
    """task.demo_tool_rate: the share of tool problems demonstrated with their tools, the rest answered at once (the
    right answer, from memory); the same problems in every process and at every rate below a problem's draw."""
    problems = [p for p in ToolsTask(num_keys=50, seed=7, heldout_size=400).heldout() if p.meta["kind"] != "none"]
    never, half, always = (ToolsTask(num_keys=50, seed=7, demo_tool_rate=r) for r in (0.0, 0.5, 1.0))
    p = TASK.make_problem("both", 7, 13)
    assert never.demonstration(p) == [(f"ans({BOOK[7] * 13})", True)]
    assert always.demonstration(p) == TASK.demonstration(p) and len(always.demonstration(p)) == 5
    assert never.demonstration(TASK.make_problem("none", 7, 8)) == [("ans(56)", True)]  # needs no tool either way
    shown = [half.demonstrates_tools(q) for q in problems]
    assert 0.4 < sum(shown) / len(shown) < 0.6 and len(problems) == 250
    again = ToolsTask(num_keys=50, seed=7, demo_tool_rate=0.5)
    assert [again.demonstrates_tools(q) for q in problems] == shown  # a hash of the prompt, not a random stream
    low = ToolsTask(num_keys=50, seed=7, demo_tool_rate=0.25)
    assert all(h for q, h in zip(problems, shown) if low.demonstrates_tools(q))  # nested: lower rates show fewer
    assert not any(never.demonstrates_tools(q) for q in problems) and all(map(always.demonstrates_tools, problems))
    assert [len(half.demonstration(q)) > 1 for q in problems] == shown


def test_settings_are_checked_in_one_line_naming_the_key():
    for args, key in [(("calc,cook", 5, 2, 4, 24, 4), "task.kinds"), (("calc,calc", 5, 2, 4, 24, 4), "task.kinds"),
                      (("calc", 0, 2, 4, 24, 4), "task.num_keys"), (("calc", 5, 5, 4, 24, 4), "task.calc_digits"),
                      (("calc", 5, 2, 10, 40, 4), "task.max_arg_digits"),
                      (("calc", 5, 2, 4, 10, 4), "task.max_call_chars"), (("both", 5, 2, 4, 24, 2), "task.max_turns"),
                      (("calc", 5, 2, 4, 24, 4, 1.5), "task.demo_tool_rate"),
                      (("calc", 5, 2, 4, 24, 4, -0.1), "task.demo_tool_rate")]:
        with pytest.raises(ValueError, match=key.replace(".", r"\.")):
            check_settings(*args)


def _segments(rollout):
    """The rollout's tokens split where policy_mask changes: [(token ids, is_policy)]."""
    out = []
    for token, m in zip(rollout.token_ids, rollout.policy_mask):
        if out and out[-1][1] == bool(m):
            out[-1][0].append(token)
        else:
            out.append(([token], bool(m)))
    return out


def _replay(task, tok, problem, rollout):
    """The episode a rollout's tokens play, replayed from its policy turns: every reply between them is what the
    tools give for the turn before it, and the calls recorded are the replay's."""
    parts = _segments(rollout)
    assert tok.decode(parts[0][0]) == problem.prompt and not parts[0][1]
    assert len(rollout.token_ids) == len(rollout.policy_mask) == len(rollout.logprobs)
    assert all(lp == 0.0 for lp, m in zip(rollout.logprobs, rollout.policy_mask) if not m)
    assert all(lp <= 0.0 for lp, m in zip(rollout.logprobs, rollout.policy_mask) if m)
    session = task.session(problem)
    turns = [ids for ids, policy in parts[1:] if policy]
    replies = [tok.decode(ids) for ids, policy in parts[1:] if not policy]
    assert len(turns) == rollout.turns <= task.max_turns and len(replies) in (len(turns), len(turns) - 1)
    for k, ids in enumerate(turns):
        ended = ids[-1] == tok.eos_token_id
        reply = session.play(tok.decode(ids[:-1], skip_special_tokens=True) if ended else None)
        if k < len(replies):
            assert replies[k] == reply and reply.startswith("=")
    assert rollout.reward == float(session.correct)
    assert rollout.calls == session.calls
    return session


def test_rollouts_of_an_untrained_model_replay_exactly():
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    task = ToolsTask(num_keys=50, seed=7, max_turns=3)
    model = build_tiny_policy(tok, seed=0).eval()
    problems = task.sample(random.Random(0), 6)
    for max_new in (4, 12):  # 4: no call fits, every turn an error (cut: '=error: too long'); 12: any reply
        rollouts = sample_and_score(model, tok, task, problems, num_samples=3, max_new_tokens=max_new,
                                    temperature=1.0, seed=1)
        assert [r.prompt_index for r in rollouts] == [i for i in range(6) for _ in range(3)]
        for r in rollouts:
            _replay(task, tok, problems[r.prompt_index], r)
        if max_new == 4:
            assert all(r.turns == 3 and r.reward == 0.0 for r in rollouts)
            results = [c["result"] for r in rollouts for c in r.calls]
            assert set(results) <= {TOO_LONG, NOT_A_CALL, UNKNOWN_TOOL} and TOO_LONG in results


def _scripted(monkeypatch, tok, turns_by_prompt: dict[str, list[str]]):
    """models.sampling.sample replaced by a policy that plays the given turns (each + eos) for each prompt."""
    played = {prompt: 0 for prompt in turns_by_prompt}

    def sample(model, prompts, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size=None):
        out = []
        for i, ids in enumerate(prompts):
            text = tok.decode(ids, skip_special_tokens=True)
            prompt = text[:text.index("?") + 1]
            reply = tok.encode(turns_by_prompt[prompt][played[prompt]], add_special_tokens=False)[:max_new_tokens]
            played[prompt] += 1
            if len(reply) < max_new_tokens:
                reply.append(eos_id)
            out.append(Completion(i, reply, [-0.5] * len(reply), "eos" if reply[-1] == eos_id else "length"))
        return out

    monkeypatch.setattr("prime_values.models.sampling.sample", sample)


def test_rollouts_that_call_tools_record_each_call_and_reach_the_row(monkeypatch):
    tok = build_char_tokenizer()
    task = ToolsTask(num_keys=50, seed=7, max_turns=4)
    problems = [task.make_problem("both", 7, 13), task.make_problem("calc", 37, 48), task.make_problem("none", 7, 8),
                task.make_problem("look", 3)]
    right = BOOK[7] * 13
    _scripted(monkeypatch, tok, {
        "k7*13?": ["look(k7)", f"calc({BOOK[7]}*13)", f"ans({right})"],
        "37*48?": ["eval(37*48)", "calc(37*48", "calc(37*48)*" + "9" * 20, "ans(1776)"],
        "7*8?": ["calc(7*8)", "ans(57)"],
        "k3?": ["look(k3)"] * 4,
    })
    model = build_tiny_policy(tok, seed=0).eval()
    rollouts = task.rollout(model, tok, problems, num_samples=1, max_new_tokens=12, temperature=1.0, seed=0)
    for r in rollouts:
        _replay(task, tok, problems[r.prompt_index], r)
    both, hostile, wrong, looping = rollouts
    assert both.reward == 1.0 and both.turns == 3 and both.stop_reason == "env_done"
    assert [(c["tool"], c["args"], c["result"]) for c in both.calls] == [
        ("look", "k7", str(BOOK[7])), ("calc", f"{BOOK[7]}*13", str(right)), ("ans", str(right), str(right))]
    assert tok.decode(both.token_ids, skip_special_tokens=True) == \
        f"k7*13?look(k7)={BOOK[7]}calc({BOOK[7]}*13)={right}ans({right})"
    assert [c["result"] for c in hostile.calls] == [UNKNOWN_TOOL, NOT_A_CALL, TOO_LONG, "1776"]
    assert hostile.reward == 1.0 and hostile.turns == 4
    assert wrong.reward == 0.0 and [c["result"] for c in wrong.calls] == ["56", "57"]
    assert looping.reward == 0.0 and looping.turns == 4 and looping.calls[-1]["result"] == OUT_OF_TURNS
    assert tok.decode(looping.token_ids, skip_special_tokens=True).endswith(f"={BOOK[3]}look(k3)")  # no last reply
    rows = env_rows(problems, rollouts, policy_version=0, shard="w0", chunk=0)
    for row, r in zip(rows, rollouts):
        assert json.loads(row["task"])["calls"] == r.calls


def test_continuations_play_on_from_a_state_mid_episode_and_mid_turn():
    tok = build_char_tokenizer()
    task = ToolsTask(num_keys=50, seed=7, max_turns=3)
    model = build_tiny_policy(tok, seed=0).eval()
    problem = task.make_problem("look", 7)
    eos = tok.eos_token_id
    enc = lambda text: tok.encode(text, add_special_tokens=False)
    reply = enc(f"={BOOK[7]}")
    after_one_call = (enc("k7?") + enc("look(k7)") + [eos] + reply, [0] * 3 + [1] * 9 + [0] * len(reply))
    mid_turn = (enc("k7?") + enc("ans("), [0] * 3 + [1] * 4)
    out = task.continuations(model, tok, [(problem, *after_one_call), (problem, *mid_turn)], num_samples=4,
                             max_new_tokens=12, temperature=1.0, seed=0)
    assert [len(o) for o in out] == [4, 4]
    for (ids, mask), episodes in zip([after_one_call, mid_turn], out):
        for r in episodes:
            assert r.token_ids[:len(ids)] == ids and r.policy_mask[:len(mask)] == mask
            _replay(task, tok, problem, r)
    assert all(r.calls[0] == {"turn": 1, "tool": "look", "args": "k7", "result": str(BOOK[7])} for r in out[0])
    for r in out[1]:  # mid-turn: the first turn goes on from 'ans(' with at most 8 more tokens
        first = r.token_ids[3:r.policy_mask.index(0, 3) if 0 in r.policy_mask[3:] else len(r.token_ids)]
        assert first[:4] == enc("ans(") and len(first) <= 12
    with pytest.raises(ValueError, match="not before a policy token"):
        task.continuations(model, tok, [(problem, enc("k7?") + enc("ans(1)") + [eos], [0] * 3 + [1] * 7)], 1, 12,
                           1.0, 0)


def test_problem_from_a_logged_prompt():
    task = ToolsTask(num_keys=50, seed=7, privileged_fact=True)
    for problem in task.heldout():
        assert task.problem_from(problem.prompt, problem.privileged) == problem
    for prompt, privileged in [("k50?", "1"), ("k07?", str(BOOK[7])), ("37*48?", "1"), ("37*48", "1776"),
                               ("x" * 100, "1"), ("k7*1234?", "1")]:
        with pytest.raises(ValueError, match="not a problem of task=tools"):
            task.problem_from(prompt, privileged)


def test_show_lists_the_calls_escaped():
    from prime_values.tools.show import call_lines

    lines = call_lines([{"turn": 1, "tool": "look", "args": "k7", "result": "53"},
                        {"turn": 2, "tool": "", "args": "\x1b[31mhi", "result": NOT_A_CALL}])
    assert lines == ["call 1      look(k7) -> 53", "call 2      '\\x1b[31mhi' -> error: not a call"]
    assert call_lines(None) == [] and call_lines("x") == []


def _heldout_by_kind(task):
    out = {}
    for p in task.heldout():
        out.setdefault(p.meta["kind"], []).append(p)
    return out


def test_the_heldout_breakdown_by_hand():
    """Accuracy per kind and the tool-use rate of hand-made held-out records (two problems of each kind), worked by
    hand: a turn of max_new_tokens characters was cut (no call), calls given with a record are read as they are,
    and a text that does not replay to its reward is left out of the tool rates, not of the accuracy."""
    task = ToolsTask(num_keys=50, seed=7, heldout_size=8)
    (c1, c2), (l1, l2), (b1, b2), (n1, n2) = (_heldout_by_kind(task)[k] for k in ("calc", "look", "both", "none"))
    assert int(c2.answer) >= 100  # so ans(1) is wrong
    v1, v2, vb1, vb2 = (BOOK[p.meta["x"]] for p in (l1, l2, b1, b2))

    def rec(problem, reward, response, **extra):
        return {"prompt_id": problem.prompt_id, "reward": reward, "response": response, **extra}

    records = [
        rec(c1, 1.0, f"calc({c1.meta['x']}*{c1.meta['y']})\nans({c1.answer})"),  # right tools, right
        rec(c2, 0.0, "calc(999*99)\nans(1)"),  # 12 characters: a turn cut at max_new_tokens=12, no call
        rec(l1, 1.0, f"look(k{l1.meta['x']})\nans({v1})"),
        rec(l2, 1.0, "not replayed", calls=[{"turn": 1, "tool": "look", "args": "k", "result": str(v2)},
                                            {"turn": 2, "tool": "ans", "args": str(v2), "result": str(v2)}]),
        rec(b1, 1.0, f"look(k{b1.meta['x']})\ncalc({vb1}*{b1.meta['y']})\nans({b1.answer})"),
        rec(b2, 0.0, f"look(k{b2.meta['x']})\nans({vb2})"),  # the lookup alone: not the right tools
        rec(n1, 1.0, f"ans({n1.answer})"),
        rec(n2, 1.0, f"calc({n2.meta['x']}*{n2.meta['y']})\nans({n2.answer})"),  # a tool where none is needed
        {"prompt_id": "tools-other:0", "reward": 1.0, "response": "ans(1)"},  # not a held-out problem
    ]
    out = task.heldout_breakdown(records, max_new_tokens=12)
    assert out["accuracy"] == 6 / 8 and out["right_tools"] == 4 / 6
    assert (out["replayed"], out["unreplayed"], out["unmatched"]) == (8, 0, 1)
    assert out["kinds"] == {
        "calc": {"problems": 2, "accuracy": 0.5, "right_tools": 0.5, "any_tool": 0.5, "tool_errors": 0.5,
                 "turns": 2.0},
        "look": {"problems": 2, "accuracy": 1.0, "right_tools": 1.0, "any_tool": 1.0, "tool_errors": 0.0,
                 "turns": 2.0},
        "both": {"problems": 2, "accuracy": 0.5, "right_tools": 0.5, "any_tool": 1.0, "tool_errors": 0.0,
                 "turns": 2.5},
        "none": {"problems": 2, "accuracy": 1.0, "right_tools": None, "any_tool": 0.5, "tool_errors": 0.0,
                 "turns": 1.5}}
    # without max_new_tokens the 12-character turn reads as the call it spells
    uncut = task.heldout_breakdown(records)["kinds"]["calc"]
    assert uncut["right_tools"] == 1.0 and uncut["tool_errors"] == 0.0
    # turns left after the answer (a turn that held a newline), or a replay to another reward: accuracy only
    odd = task.heldout_breakdown([rec(l1, 1.0, f"ans({v1})\nans({v1})"), rec(c1, 1.0, "ans(1)")], 12)
    assert (odd["accuracy"], odd["right_tools"], odd["replayed"], odd["unreplayed"]) == (1.0, None, 0, 2)
    assert odd["kinds"]["look"]["accuracy"] == 1.0 and odd["kinds"]["look"]["right_tools"] is None
    assert task.heldout_breakdown([])["accuracy"] is None


def test_the_heldout_breakdown_reads_the_records_the_evaluation_writes(monkeypatch):
    """The records of rollout.greedy_accuracy (what the policy trainer writes at each held-out evaluation) give the
    breakdown the episodes' own calls give, a cut turn, a tool error and a turn out of turns included."""
    from prime_values.rollout import greedy_accuracy

    tok = build_char_tokenizer()
    task = ToolsTask(num_keys=50, seed=7, heldout_size=8)
    (c1, c2), (l1, l2), (b1, b2), (n1, n2) = (_heldout_by_kind(task)[k] for k in ("calc", "look", "both", "none"))
    demo = {p.prompt: [t for t, policy in task.demonstration(p) if policy] for p in task.heldout()}
    scripts = {**demo,
               c2.prompt: ["calc(999*99)xx", "ans(1)"],  # cut at 12 tokens: error: too long, then a wrong answer
               l2.prompt: [f"look(k{l2.meta['x']})"] * 4,  # out of turns, the right tool called
               b2.prompt: ["eval(1*2)", *demo[b2.prompt]],  # a tool error, then the right tools and answer
               n2.prompt: [f"calc({n2.meta['x']}*{n2.meta['y']})", f"ans({n2.answer})"]}
    model = build_tiny_policy(tok, seed=0).eval()
    records: list[dict] = []
    _scripted(monkeypatch, tok, scripts)
    accuracy = greedy_accuracy(model, tok, task, task.heldout(), 12, per_problem=records)
    _scripted(monkeypatch, tok, scripts)
    rollouts = task.rollout(model, tok, task.heldout(), num_samples=1, max_new_tokens=12, temperature=0.0, seed=0)
    assert [r["prompt_id"] for r in records] == [p.prompt_id for p in task.heldout()]
    exact = [{**r, "calls": ro.calls} for r, ro in zip(records, rollouts)]
    out = task.heldout_breakdown(records, max_new_tokens=12)
    assert out == task.heldout_breakdown(exact) and out["unreplayed"] == 0
    assert out["accuracy"] == accuracy == 6 / 8 and out["right_tools"] == 5 / 6
    kinds = out["kinds"]
    assert [kinds[k]["accuracy"] for k in ("calc", "look", "both", "none")] == [0.5, 0.5, 1.0, 1.0]
    assert [kinds[k]["right_tools"] for k in ("calc", "look", "both", "none")] == [0.5, 1.0, 1.0, None]
    assert kinds["calc"]["tool_errors"] == kinds["both"]["tool_errors"] == 0.5 and kinds["none"]["any_tool"] == 0.5
    assert kinds["look"]["turns"] == (2 + 4) / 2


def test_the_experiment_is_valid_on_its_own():
    assert precheck(["+experiment=tools"]) is None


TINY = ["+experiment=tools", "steps=3", "eval_every=3", "task.num_keys=20", "task.heldout_size=8",
        "policy.warm_start.steps=20", "policy.warm_start.target_accuracy=0", "inference.prompts_per_step=4",
        "inference.group_size=2", "critic.warm_start.steps=2", "critic.warm_start.rollouts=8",
        "policy.arch.hidden_size=64", "policy.arch.num_heads=2", "policy.arch.num_kv_heads=1",
        "policy.arch.intermediate_size=128", "log.plots=false", "launcher.poll_s=0.2", "launcher.stop_grace_s=20"]


@pytest.mark.slow
def test_a_short_run_of_the_experiment_logs_its_calls_and_passes_check(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "prime_values", *TINY, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, env=env_for_runs(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = stream_table(run_dir, "rollouts").to_pylist()
    assert rows
    for row in rows:
        calls = json.loads(row["task"])["calls"]
        assert len(calls) == json.loads(row["task"])["turns"] == sum(
            1 for a, b in zip(row["policy_mask"], row["policy_mask"][1:] + [0]) if a and not b)
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    show = subprocess.run([sys.executable, "-m", "prime_values.tools.show", str(run_dir), "--color", "never"],
                          cwd=REPO, env=env_for_runs(), capture_output=True, text=True)
    assert show.returncode == 0 and "\ncall 1 " in show.stdout, show.stdout[-2000:] + show.stderr[-2000:]
