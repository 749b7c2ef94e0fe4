"""Arithmetic task: generation, held-out split, verifier; registry; evaluation helpers and SFT."""

import random

import pytest
import torch

from prime_values.tasks import ArithTask, make_task


def test_registry():
    assert isinstance(make_task("arith", digits=1, heldout_size=10), ArithTask)
    with pytest.raises(ValueError, match="arith"):
        make_task("nope")


@pytest.mark.parametrize("kw", [dict(), dict(digits=3, operands=3, ops="+-*"), dict(digits=1, operands=4, ops="-")])
def test_answers_are_correct(kw):
    task = ArithTask(**kw)
    for p in task.sample(random.Random(0), 300) + task.heldout():
        expr = p.prompt[:-1]
        assert p.prompt.endswith("=") and set(expr) <= set("0123456789+-*")
        # reference check only: these are our own generated expressions, never model output
        assert int(p.answer) == eval(expr)  # noqa: S307 - python precedence is the documented rule
        assert p.privileged == p.answer == task.solution(p)
        assert p.prompt_id.startswith("arith-")
        assert task.score(p, p.answer) == 1.0


def test_score_right_wrong_garbage_and_hostile():
    task = ArithTask()
    p = task.make_problem([12, 34], ["+"])
    assert (p.prompt, p.answer) == ("12+34=", "46")
    assert task.score(p, "46") == 1.0
    assert task.score(p, " 46\n") == 1.0
    assert task.score(p, "46<eos>") == 1.0
    for bad in ["", "45", "460", "046", "4 6", "46 46", "+46", "46.0", "forty-six", "\x00", "<eos>", "46=46"]:
        assert task.score(p, bad) == 0.0, bad
    assert task.score(p, None) == 0.0
    hostile = ["9" * 10_000_000, "(" * 1_000_000, "1" + "0" * 5000, "__import__('os').system('true')",
               "9**9**9**9", "46" + " " * 1_000_000]
    for h in hostile:
        assert task.score(p, h) == 0.0
    # that an over-long response is never looked at is checked without a clock

    class Untouchable(str):  # a 10 MB response whose content must not be read: only len() may be asked
        def __getattribute__(self, name):
            raise AssertionError(f"score read the over-long response ({name})")

    assert task.score(p, Untouchable("9" * 10_000_000)) == 0.0
    neg = task.make_problem([3, 15], ["-"])
    assert neg.answer == "-12" and task.score(neg, "-12") == 1.0 and task.score(neg, "12") == 0.0
    prec = task.make_problem([2, 3, 4], ["+", "*"])
    assert prec.answer == "14"


def test_heldout_fixed_and_disjoint():
    a, b = ArithTask(seed=7), ArithTask(seed=7)
    assert [p.prompt for p in a.heldout()] == [p.prompt for p in b.heldout()]
    assert len({p.prompt for p in a.heldout()}) == 200
    assert [p.prompt for p in ArithTask(seed=8).heldout()] != [p.prompt for p in a.heldout()]
    held = {p.prompt for p in a.heldout()}
    train = a.sample(random.Random(0), 20_000)
    assert not held & {p.prompt for p in train}
    assert all(not a.is_heldout(p) for p in train[:100]) and all(a.is_heldout(p) for p in a.heldout()[:100])
    with pytest.raises(ValueError):
        ArithTask(digits=1, operands=2, heldout_size=100)  # only 100 problems exist


def test_sample_deterministic_given_rng():
    task = ArithTask(digits=2, operands=3, ops="+-")
    x = task.sample(random.Random(3), 50)
    y = task.sample(random.Random(3), 50)
    z = task.sample(random.Random(4), 50)
    assert x == y and x != z
    assert len(x) == 50
    d = task.describe()
    assert d["name"] == "arith" and d["digits"] == 2 and d["operands"] == 3 and d["ops"] == "+-"
    assert d["max_answer_chars"] >= max(len(p.answer) for p in task.sample(random.Random(0), 2000))


def test_min_digits_gives_each_operand_length_an_equal_share():
    task = ArithTask(digits=3, min_digits=1)
    lengths = [len(s) for p in task.sample(random.Random(0), 3000) for s in p.prompt[:-1].split("+")]
    shares = [lengths.count(d) / len(lengths) for d in (1, 2, 3)]
    # uniform values would give 0.01 / 0.09 / 0.90; an equal share has sd sqrt(p(1-p)/n) = 0.006 over the 6,000
    # operands of 3,000 prompts, so 0.03 is 5 sd (and the sample is seeded: Python's random is the same everywhere)
    assert all(abs(s - 1 / 3) < 0.03 for s in shares), shares
    assert task.space_size == 1000 ** 2 and ArithTask(digits=3, min_digits=2).space_size == 990 ** 2
    two_three = ArithTask(digits=3, min_digits=2).sample(random.Random(1), 500)
    assert all(len(s) in (2, 3) for p in two_three for s in p.prompt[:-1].split("+"))
    assert ArithTask(digits=3, min_digits=1).heldout()[0].prompt_id.split(":")[0] != ArithTask(digits=3).heldout()[
        0].prompt_id.split(":")[0]  # a different problem distribution is a different problem space


def test_train_pool_is_fixed_distinct_and_never_held_out():
    from prime_values.tasks.pool import PromptPool, training_prompts

    task = ArithTask()
    assert training_prompts(task, 0, 1) is task  # 0: the stream itself
    pool = training_prompts(task, 64, 1)
    assert len({p.prompt for p in pool.problems}) == 64 and not any(task.is_heldout(p) for p in pool.problems)
    assert [p.prompt for p in PromptPool(task, 64, 1).problems] == [p.prompt for p in pool.problems]  # every process
    assert [p.prompt for p in PromptPool(task, 64, 2).problems] != [p.prompt for p in pool.problems]
    drawn = pool.sample(random.Random(0), 2000)
    assert {p.prompt for p in drawn} == {p.prompt for p in pool.problems}  # uniform with repeats: all 64 met
    with pytest.raises(ValueError, match="task.train_pool=500: .* only 90 distinct"):
        PromptPool(ArithTask(digits=1, heldout_size=10), 500, 0)  # 100 problems exist, 10 held out


def test_bad_knobs():
    for kw in [dict(ops="/"), dict(ops=""), dict(operands=1), dict(digits=0), dict(digits=2, min_digits=3),
               dict(min_digits=-1)]:
        with pytest.raises(ValueError):
            ArithTask(**kw)


def test_short_sft_reduces_loss_and_heldout_accuracy_runs():
    from prime_values.models import build_char_tokenizer, build_tiny_policy
    from prime_values.rollout import greedy_accuracy
    from prime_values.supervised import sft_batch, sft_loss, supervised_train, validation_accuracy

    torch.manual_seed(0)
    tok = build_char_tokenizer()
    task = ArithTask(digits=2, heldout_size=50)
    model = build_tiny_policy(tok, seed=0, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                              head_dim=32, intermediate_size=128)
    probe = task.sample(random.Random(123), 64)
    ids, mask, labels = sft_batch(tok, task, probe)
    # labels only on the answer digits and the eos
    assert int((labels != -100).sum()) == sum(len(p.answer) + 1 for p in probe)
    assert int((labels == tok.eos_token_id).sum()) == len(probe)
    with torch.no_grad():
        before = float(sft_loss(model, ids, mask, labels)[0])
    logs, rng = [], random.Random("sft-0")  # the stream the warm start of seed 0 draws
    out = supervised_train(model, lambda step: sft_batch(tok, task, task.sample(rng, 16)), 20, lr=3e-3,
                           on_step=lambda s, m, log: log and logs.append((s, m)), log_every=10)
    with torch.no_grad():
        after = float(sft_loss(model, ids, mask, labels)[0])
    assert after < before - 0.5, (before, after)
    assert [s for s, _ in logs] == [10, 20] and out["step"] == 20
    acc = greedy_accuracy(model, tok, task, task.heldout(), max_new_tokens=4)
    assert 0.0 <= acc <= 1.0
    # an accuracy target ends SFT at the first check that meets it
    rng = random.Random("sft-1")
    out = supervised_train(model, lambda step: sft_batch(tok, task, task.sample(rng, 8)), 50, lr=2e-3,
                           accuracy=validation_accuracy(model, tok, task, seed=1, size=10), target_accuracy=0.0,
                           check_every=3)
    assert out["step"] == 3 and out["stopped_early"] and 0.0 <= out["val_acc"] <= 1.0


def test_show_work_answers_are_running_results_and_the_critic_sees_them():
    task = ArithTask(digits=2, operands=3, ops="+-", show_work=True, heldout_size=20)
    p = task.make_problem([12, 34, 56], ["+", "-"])
    assert (p.prompt, p.answer, p.privileged) == ("12+34-56=", "46,-10", "46,-10")
    assert task.score(p, "46,-10") == 1.0 and task.score(p, "-10") == 0.0 and task.score(p, "45,-10") == 0.0
    assert task.solution(p) == "46,-10"
    # 99+99 = 198 (3 chars), 99+99+99 = 297 or down to -198 (4 chars with sign), a comma between: 9 >= len of any
    assert task.max_answer_chars() == 4 + 4 + 1
    assert all(len(q.answer) <= task.max_answer_chars() for q in task.heldout())
    with pytest.raises(ValueError, match="show_work"):
        ArithTask(ops="+*", operands=3, show_work=True)


def test_min_operands_mixes_problem_lengths_in_equal_shares():
    import collections

    task = ArithTask(digits=2, operands=5, min_operands=2, heldout_size=100, seed=0)
    counts = collections.Counter(p.prompt.count("+") + 1 for p in task.sample(random.Random(0), 4000))
    assert set(counts) == {2, 3, 4, 5}
    assert all(abs(n / 4000 - 0.25) < 0.03 for n in counts.values()), counts  # 1000 each, SD ~27
    for p in task.sample(random.Random(1), 50):
        assert p.answer == str(sum(int(x) for x in p.prompt[:-1].split("+")))
    assert task.describe()["min_operands"] == 2
    fixed = ArithTask(digits=2, operands=5, heldout_size=100, seed=0)
    assert {p.prompt.count("+") + 1 for p in fixed.sample(random.Random(0), 200)} == {5}
    assert {p.prompt for p in fixed.heldout()} != {p.prompt for p in task.heldout()}  # its own held-out set
    with pytest.raises(ValueError, match="task.min_operands=6"):
        ArithTask(operands=5, min_operands=6)
