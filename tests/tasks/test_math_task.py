"""The ``math`` task: GSM8K/MATH rows through HF datasets, a fixed held-out split, privileged context, and
math-verify scoring in a sandboxed worker pool (hard time limits, hostile inputs, crashes, deadlines)."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from pathlib import Path

import datasets  # noqa: F401  (test extras: missing, the module fails rather than skips)
import math_verify  # noqa: F401
import pytest

from prime_values.tasks.math import MathDataError, MathTask, last_boxed, parse_row, resolve_source
from prime_values.tasks.verify import VerifierPool

DATA = Path(__file__).parents[1] / "data" / "math_tiny.jsonl"


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("hf_datasets"))


@pytest.fixture(scope="module")
def task(cache_dir):
    t = MathTask(data=str(DATA), heldout_size=4, data_cache_dir=cache_dir, verifier_workers=2,
                 verifier_timeout_s=1.0)
    yield t
    t.close()


@pytest.fixture(scope="module")
def pool():
    p = VerifierPool(workers=2, call_timeout_s=5.0, kill_grace_s=1.0, batch_timeout_s=60.0).wait_ready()
    yield p
    p.close()


def _rows() -> list[dict]:
    return [json.loads(line) for line in DATA.read_text().splitlines() if line.strip()]


# ---------------------------------------------------------------------------------------------- rows
def test_last_boxed_matches_braces():
    assert last_boxed(r"so $x = \boxed{\frac{1}{2}}$.") == r"\frac{1}{2}"
    assert last_boxed(r"\boxed{1} then \boxed{x^{2}+\{1\}}") == r"x^{2}+\{1\}"
    assert last_boxed(r"\fbox{7}") == "7"
    assert last_boxed(r"\boxed 5$") == "5"
    assert last_boxed(r"\boxed{unbalanced") is None
    assert last_boxed("no box") is None


def test_parse_row_formats():
    gsm = parse_row({"question": "Q?", "answer": "2*3=<<2*3=6>>6 eggs.\n#### 6"})
    assert gsm == {"question": "Q?", "answer": "6", "solution": "2*3=6 eggs.", "source": "gsm8k"}
    m = parse_row({"problem": "P?", "solution": r"so $\boxed{\frac{2}{3}}$"})
    assert m["answer"] == r"\frac{2}{3}" and m["source"] == "math"
    m500 = parse_row({"problem": "P?", "solution": r"$\boxed{7}$", "answer": "7"})
    assert m500["answer"] == "7" and m500["solution"] == r"$\boxed{7}$"
    assert parse_row({"problem": "P?", "solution": "no final answer"}) is None
    assert parse_row({"answer": "#### 3"}) is None
    assert parse_row({"question": "Q?", "answer": 12})["answer"] == "12"


def test_tiny_file_shape():
    rows = _rows()
    assert len(rows) >= 20
    assert sum("question" in r for r in rows) >= 10 and sum("problem" in r for r in rows) >= 10
    assert all(parse_row(r) is not None for r in rows)


# ---------------------------------------------------------------------------------------------- the task
def test_task_loads_both_styles_with_fixed_heldout(task):
    d = task.describe()
    assert d["train_sources"]["gsm8k"] > 0 and d["train_sources"]["math"] > 0
    assert d["skipped_rows"] == 0 and d["heldout_size"] == 4
    assert d["train_rows"] + d["heldout_size"] == len(_rows())
    held = task.heldout()
    assert len({p.prompt_id for p in held}) == 4
    for p in held:
        assert p.prompt.endswith(r"put your final answer within \boxed{}.")
        assert p.privileged.startswith(f"Reference answer: {p.answer}")
        assert task.is_heldout(p)
    drawn = task.sample(random.Random(0), 500)
    assert not any(task.is_heldout(p) for p in drawn)
    assert len({p.prompt_id for p in drawn}) == task.train_size()


def test_heldout_is_independent_of_row_order_and_source_format(task, cache_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = _rows()
    random.Random(3).shuffle(rows)
    shuffled = tmp_path / "shuffled.jsonl"
    shuffled.write_text("".join(json.dumps(r) + "\n" for r in rows))
    parquet = tmp_path / "twin.parquet"
    keys = sorted({k for r in rows for k in r})  # from_pylist takes its columns from the first row only
    pq.write_table(pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows]), parquet)
    ids = [p.prompt_id for p in task.heldout()]
    for path in (shuffled, parquet):
        other = MathTask(data=str(path), heldout_size=4, data_cache_dir=cache_dir)
        assert [p.prompt_id for p in other.heldout()] == ids
        assert other.train_size() == task.train_size()
    # another seed, another held-out set
    assert [p.prompt_id for p in MathTask(data=str(DATA), heldout_size=4, seed=7,
                                           data_cache_dir=cache_dir).heldout()] != ids


def test_privileged_context_and_sft_solution(task, cache_dir):
    by_source = {}
    for p in task.heldout() + task.sample(random.Random(1), 200):
        by_source.setdefault(p.meta["source"], p)
    gsm, mth = by_source["gsm8k"], by_source["math"]
    assert "Reference solution:" in gsm.privileged and "<<" not in gsm.privileged
    assert "Reference solution:" in mth.privileged and r"\boxed" in mth.privileged
    assert task.solution(gsm).endswith(f"$\\boxed{{{gsm.answer}}}$.")
    assert task.solution(mth) == mth.meta["solution"]
    bare = MathTask(data=str(DATA), heldout_size=4, privileged_solution=False, data_cache_dir=cache_dir)
    assert all(p.privileged == f"Reference answer: {p.answer}" for p in bare.heldout())


def test_separate_heldout_data(cache_dir, tmp_path):
    rows = _rows()
    test_file = tmp_path / "test.jsonl"
    test_file.write_text("".join(json.dumps(r) + "\n" for r in rows[:5]))
    t = MathTask(data=str(DATA), heldout_data=str(test_file), heldout_size=0, data_cache_dir=cache_dir)
    assert len(t.heldout()) == 5
    assert t.train_size() == len(rows) - 5  # held-out prompts never trained on
    t3 = MathTask(data=str(DATA), heldout_data=str(test_file), heldout_size=3, data_cache_dir=cache_dir)
    assert len(t3.heldout()) == 3


def test_prompt_template_keeps_other_braces_literal(cache_dir):
    t = MathTask(data=str(DATA), heldout_size=2, prompt_template="Problem: {question}\nAnswer in \\boxed{}:",
                 data_cache_dir=cache_dir)
    assert all(p.prompt.startswith("Problem: ") and p.prompt.endswith("\\boxed{}:") for p in t.heldout())


def test_config_errors_are_one_line(cache_dir):
    with pytest.raises(MathDataError, match="heldout_size=50 leaves no training prompts"):
        MathTask(data=str(DATA), heldout_size=50, data_cache_dir=cache_dir)
    with pytest.raises(MathDataError, match="must contain"):
        MathTask(data=str(DATA), prompt_template="no placeholder")
    with pytest.raises(TypeError, match="bogus"):
        MathTask(data=str(DATA), bogus=1)
    # make_task hands each task only its own keys (a run saved before each task had its own config class holds
    # every task's keys)
    from omegaconf import OmegaConf

    from prime_values.config import TASK_CONFIGS
    from prime_values.tasks import make_task

    keys = {}
    for cls in TASK_CONFIGS.values():
        keys.update(OmegaConf.to_container(OmegaConf.structured(cls)))
    keys.update(name="math", data=str(DATA), heldout_size=2, data_cache_dir=str(cache_dir))
    assert isinstance(make_task(**keys), MathTask)


@pytest.mark.parametrize("data", ["/nonexistent/gsm8k.jsonl", "data/missing.parquet", "nobody/no-such-dataset",
                                  "gsm8k", ""])
def test_missing_data_fails_fast_offline(data, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # nothing cached
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    started = time.perf_counter()
    with pytest.raises(MathDataError) as err:
        MathTask(data=data)
    elapsed = time.perf_counter() - started
    msg = str(err.value)
    # fast means no network retries (without HF_HUB_OFFLINE they take ~24 s); 5 s leaves room for a loaded machine
    assert elapsed < 5, elapsed
    assert "\n" not in msg and msg.startswith("task.data")
    assert "local .jsonl/.parquet path" in msg


def test_resolve_source_kinds(monkeypatch, tmp_path):
    assert resolve_source(str(DATA)) == ("local", str(DATA))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    assert resolve_source("openai/gsm8k") == ("hub", "openai/gsm8k")  # no network touched
    bad = tmp_path / "rows.txt"
    bad.write_text("x")
    with pytest.raises(MathDataError, match="unsupported extension"):
        resolve_source(str(bad))


# ---------------------------------------------------------------------------------------------- verifier
CORRECT = [
    (r"\frac{1}{2}", "0.5"),
    ("0.5", r"so the answer is $\boxed{\frac12}$"),
    ("42", r"\boxed{42}"),
    ("42", "42"),
    ("42", "Adding them up, the final answer is 42."),
    ("3,750", r"He saves $\boxed{3750}$ dollars."),
    ("-7", "It is -7 degrees."),
    (r"x^2+2x+1", r"$\boxed{(x+1)^2}$"),
    (r"5\sqrt{2}", r"\boxed{\sqrt{50}}"),
    ("-3, 3", r"\boxed{3, -3}"),
    (r"(-\infty, 2)", r"$x \in \boxed{(-\infty,2)}$"),
    ("15", r"\boxed{\dbinom{6}{2}}"),
]
WRONG = [
    (r"\frac{1}{2}", "0.6"),
    ("42", r"\boxed{43}"),
    ("42", r"I first thought \boxed{42} but the answer is \boxed{41}"),
    ("-3, 3", r"\boxed{3}"),
    ("12", ""),
    ("12", "no number here"),
]


def test_correct_and_wrong_answers(pool):
    golds, texts = zip(*(CORRECT + WRONG))
    got = pool.score_many(list(golds), list(texts))
    expected = [1.0] * len(CORRECT) + [0.0] * len(WRONG)
    assert got == expected, [(g, t, s) for g, t, s, e in zip(golds, texts, got, expected) if s != e]
    assert pool.stats["timeouts"] == 0  # a loaded machine must not turn a right answer into a timeout


def test_reference_solutions_score_one_through_the_task(task):
    problems = task.heldout() + sorted(set(task.sample(random.Random(2), 300)), key=lambda p: p.prompt_id)
    assert task.score_many(problems, [task.solution(p) for p in problems]) == [1.0] * len(problems)
    assert task.score(problems[0], task.solution(problems[0])) == 1.0
    assert task.score(problems[0], "I give up") == 0.0
    assert task.verifier_stats().get("gold_unparsed", 0) == 0


HOSTILE = {
    "power_tower": r"\boxed{9^{9^{9^{9}}}}",
    "python_tower": "The answer is 9**9**9**9",
    "big_power": r"$\boxed{10^{10^{10}}}$",
    "huge_factorial": r"\boxed{(10^{10})!}",
    "nested_braces": r"\boxed{" + "{" * 10000 + "1" + "}" * 10000 + "}",
    "nested_frac": r"\boxed{" + r"\frac{1}{" * 500 + "2" + "}" * 500 + "}",
    "nested_sqrt": r"\boxed{" + r"\sqrt{" * 300 + "2" + "}" * 300 + "}",
    "nested_parens": "$" + "(" * 5000 + "1" + ")" * 5000 + "$",
    "one_megabyte": "x" * 1_000_000 + r" \boxed{",
    "one_megabyte_digits": "9" * 1_000_000,
    "unbalanced_boxed": r"\boxed{" * 2000,
    "unicode_junk": "\u202e\x00\ud800 \U0001F600 \\boxed{\u00bd\u2212\u221e} \ufffd" * 200,
    "many_boxes": r"\boxed{41}" * 3000,
    "integral": r"\boxed{\int_0^\infty e^{-x^{x^x}} dx}",
    "not_a_string": None,
}


@pytest.mark.parametrize("max_chars", [4096, 2_000_000])
def test_hostile_inputs_score_zero_in_bounded_time(max_chars, capfd):
    with VerifierPool(workers=2, call_timeout_s=1.0, kill_grace_s=0.5, max_chars=max_chars) as hostile_pool:
        hostile_pool.wait_ready()
        started = time.perf_counter()
        got = hostile_pool.score_many(["42"] * len(HOSTILE), list(HOSTILE.values()))
        elapsed = time.perf_counter() - started
        stats = dict(hostile_pool.stats)
        # one soft or hard limit per input at most, two workers in parallel
        assert elapsed < len(HOSTILE) * 1.5 / 2 + 5, (elapsed, stats)
        assert got == [0.0] * len(HOSTILE), dict(zip(HOSTILE, got))
        assert stats["timeouts"] >= 1
        # the pool still works afterwards
        assert hostile_pool.score_many(["42", "42"], [r"\boxed{42}", "42"]) == [1.0, 1.0]
    out, err = capfd.readouterr()
    assert "Timeout" not in out + err and "9**9" not in out + err  # workers are quiet


def _stop_all(pool: VerifierPool) -> list[int]:
    pids = [w.proc.pid for w in pool._workers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    return pids


@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_hung_worker_is_killed_and_replaced(pool):
    stopped = _stop_all(pool)  # a hang no in-process timer can break: only the pool's hard limit helps
    before = dict(pool.stats)
    started = time.perf_counter()
    got = pool.score_many(["1", "2", "3", "4"], ["1", "2", "3", "4"])
    elapsed = time.perf_counter() - started
    assert got[:2] == [0.0, 0.0] and got[2:] == [1.0, 1.0]  # the two stuck calls lose, the rest are served
    assert pool.stats["killed"] - before.get("killed", 0) == 2
    assert elapsed < 1.0 + 0.5 + 30, elapsed  # hard limit, then replacement workers start
    assert not set(stopped) & {w.proc.pid for w in pool._workers}


def test_batch_deadline_bounds_the_call(pool):
    slow = VerifierPool(workers=1, call_timeout_s=30.0, batch_timeout_s=60.0).wait_ready()
    try:
        _stop_all(slow)
        started = time.perf_counter()
        got = slow.score_many(["1"] * 5, ["1"] * 5, deadline_s=0.5)
        elapsed = time.perf_counter() - started
        # the deadline (0.5 s), not the 30 s call timeout, ended the call; 10 s leaves room for a loaded machine
        assert got == [0.0] * 5 and elapsed < 10, elapsed
        assert slow.stats["deadline"] == 5
    finally:
        slow.close()


def test_dead_worker_is_replaced(pool):
    victim = pool._workers[0].proc.pid
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 10  # wait until it is dead, not a fixed sleep that a loaded machine can outrun
    while pool._workers[0].proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert pool.score_many(["7"] * 6, [r"\boxed{7}"] * 6) == [1.0] * 6
    assert victim not in {w.proc.pid for w in pool._workers}


def test_closed_pool_leaves_no_workers():
    p = VerifierPool(workers=2).wait_ready()
    procs = [w.proc for w in p._workers]
    p.close()
    assert all(proc.poll() is not None for proc in procs)


def test_rows_without_answers_are_skipped_loudly(cache_dir, tmp_path, caplog):
    f = tmp_path / "partial.jsonl"
    f.write_text(json.dumps({"problem": "P?", "solution": "no box"}) + "\n"
                 + "".join(json.dumps(r) + "\n" for r in _rows()))
    with caplog.at_level("WARNING", logger="prime_values.tasks.math"):
        t = MathTask(data=str(f), heldout_size=2, data_cache_dir=cache_dir)
    assert t.describe()["skipped_rows"] == 1 and "skipped 1 of" in caplog.text
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"problem": "P?", "solution": "no box"}) + "\n")
    with pytest.raises(MathDataError, match="none of its 1 rows"):
        MathTask(data=str(empty), data_cache_dir=cache_dir)
    nocol = tmp_path / "nocol.jsonl"
    nocol.write_text(json.dumps({"text": "hi", "answer": "1"}) + "\n")
    with pytest.raises(MathDataError, match="no 'question' or 'problem' column"):
        MathTask(data=str(nocol), data_cache_dir=cache_dir)


def test_math_task_is_a_config_choice():
    from prime_values.__main__ import precheck
    from prime_values.tasks import make_task

    data = str(Path(__file__).parents[1] / "data" / "math_tiny.jsonl")
    assert precheck(["+experiment=embedded", "task=math", f"task.data={data}", "task.heldout_size=4"]) is None
    problem = precheck(["+experiment=embedded", "task=math", "task.data=/nonexistent/gsm8k.jsonl"])
    assert "task.data" in problem and "\n" not in problem
    # the task group holds every task's keys; each task takes its own (arith ignores data, math ignores digits)
    task = make_task("math", data=data, heldout_size=4, digits=3, verifier_workers=1)
    try:
        assert len(task.heldout()) == 4
    finally:
        task.close()
    assert make_task("arith", digits=3, data="ignored").digits == 3


def test_inference_rows_are_scored_as_one_batch_by_the_verifier_pool(task):
    from prime_values.models import build_char_tokenizer
    from prime_values.models.sampling import Completion
    from prime_values.roles.inference import build_rows

    tok = build_char_tokenizer()
    problems = task.sample(random.Random(0), 2)
    texts = [f"so the answer is \\boxed{{{problems[0].answer}}}", "\\boxed{definitely wrong}"]
    completions = [Completion(prompt_index=i, response_ids=tok.encode(t, add_special_tokens=False),
                              logprobs=[-0.1] * len(tok.encode(t, add_special_tokens=False))) for i, t in
                   enumerate(texts)]
    prompt_ids = [tok.encode("q", add_special_tokens=False)] * 2
    before = task.verifier_stats().get("calls", 0)
    rows = build_rows(problems, completions, prompt_ids, task, 0, "w0", 0, tok)
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    assert task.verifier_stats()["calls"] == before + 2
