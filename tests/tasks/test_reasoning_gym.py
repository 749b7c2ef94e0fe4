"""task=reasoning_gym: problems generated offline by reasoning-gym, a held-out split by content, chat-formatted
prompts, the final-answer reward through the sandboxed math-verify pool, privileged reference context, and the
one-line errors before any job starts. No model: the chat template is a small saved tokenizer's."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("reasoning_gym")
pytest.importorskip("math_verify")

from prime_values.__main__ import precheck
from prime_values.tasks import make_task
from prime_values.tasks.reasoning_gym import ReasoningGymError, extract_answer

CHAIN = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2}


def chain_task(**kw):
    args = dict(dataset="chain_sum", dataset_args=CHAIN, dataset_size=600, heldout_size=100, chat=False)
    args.update(kw)
    return make_task("reasoning_gym", **args)


@pytest.fixture(scope="module")
def task():
    t = chain_task()
    yield t
    t.close()


def test_heldout_split_is_fixed_by_content_and_never_trained_on(task):
    held = task.heldout()
    assert len(held) == 100
    again = chain_task()
    assert [p.prompt for p in again.heldout()] == [p.prompt for p in held]  # the same in every process
    held_q = {p.meta["question"] for p in held}
    train = task.sample(random.Random(0), 2000)
    assert not held_q & {p.meta["question"] for p in train}
    assert all(task.is_heldout(p) for p in held) and not any(task.is_heldout(p) for p in train)
    # 600 draws of 2-term 1-2 digit sums repeat questions: duplicates are dropped, none straddles the split
    assert task.duplicates > 0 and task.train_size() + len(held) == 600 - task.duplicates
    # another held-out seed selects another held-out set from the same content
    other = chain_task(seed=99)
    assert {p.meta["question"] for p in other.heldout()} != held_q


def test_final_answer_is_extracted_before_it_is_checked(task):
    p = next(q for q in task.heldout() if q.answer.lstrip("-").isdigit() and len(q.answer) >= 2)
    a = p.answer
    wrong = str(int(a) + 1)
    texts = [
        task.solution(p),                                  # steps, then \boxed{answer}
        f"So the sum is \\boxed{{{a}.0}}",                 # equivalent, not equal: math-verify
        f"The answer is {a}.",                             # right number, no final answer in the format: 0
        f"\\boxed{{{a}}} ... no wait, \\boxed{{{wrong}}}",  # the last box counts
        f"{a} {a} {a} \\boxed{{{wrong}}}",                 # the answer anywhere else earns nothing
        "",
    ]
    assert task.score_many([p] * len(texts), texts) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [task.parsable(t) for t in texts] == [True, True, False, True, True, False]
    assert task.verifier_stats()["calls"] >= 1  # the pool was used for what string equality could not settle


def test_answer_line_format():
    assert extract_answer("work\nAnswer: 42", "answer_line") == "42"
    assert extract_answer("Answer: 1\nmore\n**Answer:** $-7$.", "answer_line") == "-7"
    assert extract_answer("the answer: 42 is in the middle of a line", "answer_line") is None
    assert extract_answer("\\boxed{3} then \\boxed{ 4 }", "boxed") == "4"
    assert extract_answer("\\boxed{unbalanced", "boxed") is None
    t = chain_task(answer_format="answer_line", prompt_template="{question}\nEnd with 'Answer: <n>'.")
    p = t.heldout()[0]
    assert t.solution(p).splitlines()[-1] == f"Answer: {p.answer}"
    assert t.score_many([p, p], [t.solution(p), f"\\boxed{{{p.answer}}}"]) == [1.0, 0.0]
    t.close()


def test_privileged_context_has_the_reference_and_the_generators_steps():
    t = make_task("reasoning_gym", dataset="gsm_symbolic", dataset_size=60, heldout_size=10, chat=False)
    p = t.heldout()[0]
    assert p.privileged.startswith(f"Reference answer: {p.answer}\nReference solution:\n")
    assert p.meta["solution"] and p.meta["solution"] in p.privileged
    assert p.answer not in p.prompt.split("\n")[-1]  # the policy's prompt ends in the format instruction
    bare = make_task("reasoning_gym", dataset="gsm_symbolic", dataset_size=60, heldout_size=10, chat=False,
                     privileged_solution=False)
    assert bare.heldout()[0].privileged == f"Reference answer: {p.answer}"


def test_prompt_is_rendered_with_the_chat_template(tmp_path):
    from prime_values.models.tokenizer import build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    tok.save_pretrained(tmp_path / "chat")
    t = chain_task(chat=True, chat_tokenizer=str(tmp_path / "chat"))
    p = t.heldout()[0]
    assert p.prompt == f"<|user|>{p.meta['question']}\nPut your final answer within \\boxed{{}}.\n<|assistant|>"
    assert [q.meta["question"] for q in t.heldout()] == [q.meta["question"] for q in chain_task().heldout()]

    build_char_tokenizer().save_pretrained(tmp_path / "plain")
    with pytest.raises(ReasoningGymError, match="has no chat template.*task.chat=false"):
        chain_task(chat=True, chat_tokenizer=str(tmp_path / "plain"))


@pytest.mark.parametrize("overrides, fragment", [
    (["task.dataset=chainsum"], "close matches: chain_sum"),
    (["task.dataset=basic_arithmatic"], "close matches: basic_arithmetic"),
    (["task.answer_format=latex"], "task.answer_format='latex' is not allowed"),
    (["task.heldout_size=5000"], "task.dataset_size=5000 must exceed task.heldout_size=5000"),
])
def test_bad_reasoning_gym_configs_fail_in_one_line(overrides, fragment):
    error = precheck(["task=reasoning_gym", "task.dataset=chain_sum", "task.chat=false", *overrides])
    assert error is not None and fragment in error and "\n" not in error, error


def test_a_good_config_passes_the_precheck():
    assert precheck(["task=reasoning_gym", "task.dataset=chain_sum", "task.chat=false"]) is None


def test_a_tokenizer_without_a_chat_template_fails_before_launch(tmp_path):
    from prime_values.models.tokenizer import build_char_tokenizer

    # the default policy is the embedded tiny model: its character tokenizer has no chat template
    error = precheck(["task=reasoning_gym", "task.dataset=chain_sum"])
    assert error is not None and "no chat template" in error and "task.chat=false" in error, error
    build_char_tokenizer().save_pretrained(tmp_path / "plain")
    error = precheck(["task=reasoning_gym", "task.dataset=chain_sum", f"task.chat_tokenizer={tmp_path / 'plain'}"])
    assert error is not None and "no chat template" in error and "\n" not in error, error


def test_paired_heldout_interval_and_format_split(tmp_path):
    """bench/paired_heldout.py on two hand-made evaluations: the paired gain, its interval and the exact split
    of the gain into format and correctness among parsable replies."""
    import json

    from bench import paired_heldout

    def write(step, rows):
        d = tmp_path / "metrics" / "heldout"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    n = 200  # before: 100 parsable, 50 of them right; after: 180 parsable, 120 right
    before = [{"prompt_id": f"p{i}", "reward": float(i < 50), "parsable": i < 100} for i in range(n)]
    after = [{"prompt_id": f"p{i}", "reward": float(i < 120), "parsable": i < 180, "response_tokens": 40,
              "stop_reason": "eos"} for i in range(n)]
    write(0, before)
    write(30, after)
    out = paired_heldout.main([str(tmp_path)])
    assert (out["before"], out["after"], out["wins"], out["losses"]) == (0.25, 0.6, 70, 0)
    assert abs(out["gain"] - 0.35) < 1e-12 and out["ci95"][0] > 0.28 and out["mcnemar_p"] < 1e-9
    assert abs(out["gain_format"] + out["gain_correctness"] - out["gain"]) < 1e-12
    # parsable 0.5 -> 0.9, correct among parsable 0.5 -> 2/3: format (p1 - p0) (c0 + c1) / 2
    assert abs(out["gain_format"] - 0.4 * (0.5 + 2 / 3) / 2) < 1e-12
    assert "sft" not in out  # no evaluation before SFT in this run

    # with the model as loaded evaluated before SFT: SFT's gain (before SFT -> step 0) and the whole run's apart
    base = [{"prompt_id": f"p{i}", "reward": float(i < 10), "parsable": i < 20} for i in range(n)]
    (tmp_path / "metrics" / "heldout" / "before_sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in base))
    out = paired_heldout.main([str(tmp_path)])
    assert abs(out["gain"] - 0.35) < 1e-12  # the top level stays RL's own
    assert (out["sft"]["before"], out["sft"]["after"], out["sft"]["wins"]) == (0.05, 0.25, 40)
    assert (out["total"]["before"], out["total"]["after"], out["total"]["wins"]) == (0.05, 0.6, 110)
    assert abs(out["sft"]["gain"] + out["gain"] - out["total"]["gain"]) < 1e-12
    # before SFT: 20 parsable, 10 right (c0 = 0.5); at step 0: 100 parsable, 50 right (c1 = 0.5): all format
    assert abs(out["sft"]["gain_format"] - 0.2) < 1e-12 and abs(out["sft"]["gain_correctness"]) < 1e-12
