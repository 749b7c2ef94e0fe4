"""task=reverse_text (procedural, partial credit) and task=verifiers (a `verifiers` environment rolled out
in-process, single- and multi-turn, through the inference role's own `generate_rows`)."""

from __future__ import annotations

import importlib.util
import random
import sys
import textwrap

import pytest
import torch

from prime_values.__main__ import precheck
from prime_values.tasks import ReverseTextTask, make_task
from prime_values.tasks.reverse_text import levenshtein, similarity
from tests.tasks.shared import mask_runs, verifiers_cfg


# ---------------------------------------------------------------------------------------------- reverse_text
def test_levenshtein_hand_worked():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == levenshtein("abc", "") == 3
    assert levenshtein("flaw", "lawn") == 2
    assert levenshtein("abc", "abc") == 0
    assert similarity("abc", "abc") == 1.0 and similarity("", "") == 1.0
    assert similarity("xyz", "abc") == 0.0
    assert similarity("abd", "abc") == pytest.approx(2 / 3)
    assert similarity("abcd", "abc") == pytest.approx(3 / 4)  # one extra character of four


def test_reverse_text_problems_scores_and_heldout():
    task = make_task("reverse_text", digits=2, min_chars=3, max_chars=6, heldout_size=50, seed=3)  # digits: ignored
    assert isinstance(task, ReverseTextTask)
    for p in task.sample(random.Random(0), 300) + task.heldout():
        text = p.prompt[:-1]
        assert p.prompt.endswith("|") and 3 <= len(text) <= 6 and set(text) <= set("abcdefghijklmnopqrstuvwxyz")
        assert p.answer == text[::-1] == p.privileged == task.solution(p)
        assert task.score(p, p.answer) == 1.0 and task.score(p, f" {p.answer}<eos>\n") == 1.0
    p = task.make_problem("hello")
    assert (p.prompt, p.answer) == ("hello|", "olleh")
    assert task.score(p, "olleh") == 1.0
    assert task.score(p, "olle") == pytest.approx(0.8)
    assert task.score(p, "hello") == pytest.approx(1 - 4 / 5)  # h<->o and e<->l swapped: 4 substitutions
    assert task.score(p, "") == 0.0 and task.score(p, None) == 0.0
    # a hostile response costs what a short one does: the edit distance (quadratic) only ever sees a bounded prefix
    import prime_values.tasks.reverse_text as reverse_text

    seen = []

    def recording(text, answer):
        seen.append(len(text))
        return similarity(text, answer)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(reverse_text, "similarity", recording)
        for hostile in ["o" * 10_000_000, "x" * 100_000, "\x00" * 1000]:
            assert 0.0 <= task.score(p, hostile) < 0.5
    assert len(seen) == 3 and max(seen) <= 2 * task.max_chars + 8, seen
    held = {q.prompt for q in task.heldout()}
    assert len(held) == 50 and not held & {q.prompt for q in task.sample(random.Random(1), 5000)}
    assert [q.prompt for q in ReverseTextTask(3, 6, heldout_size=50, seed=3).heldout()] == \
        [q.prompt for q in task.heldout()]
    for bad in [dict(min_chars=0), dict(min_chars=5, max_chars=4), dict(alphabet=""), dict(alphabet="ab|"),
                dict(alphabet="a b"), dict(min_chars=1, max_chars=1, alphabet="ab", heldout_size=2)]:
        with pytest.raises(ValueError):
            ReverseTextTask(**bad)


def test_reverse_text_configs():
    assert precheck(["+experiment=reverse_text"]) is None
    assert precheck(["task=reverse_text"]) is None
    err = precheck(["+experiment=reverse_text", "task.max_chars=12"])
    assert "inference.max_new_tokens" in err and "\n" not in err
    err = precheck(["task=reverse_text", "task.alphabet=a|b"])
    assert "reverse_text" in err and "\n" not in err


# ---------------------------------------------------------------------------------------------- verifiers
# verifiers is a test extra (setup.cfg): without it these tests fail rather than skip

SINGLE_TURN_ENV = '''
import verifiers.v1 as vf

WORDS = ["ab", "cab", "dog", "feed", "bead", "gag", "hi", "jig", "kid", "lab", "mad", "nab"]


class EchoData(vf.TaskData):
    answer: str


class EchoConfig(vf.TasksetConfig):
    n: int = 6


class EchoTask(vf.Task[EchoData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def overlap(self, task, trace) -> float:
        """share of the answer's distinct letters that the reply contains (partial credit)"""
        return len(set(trace.last_reply) & set(task.answer)) / len(set(task.answer))

    @vf.metric
    async def reply_chars(self, trace) -> float:
        return float(len(trace.last_reply))


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self):
        for word in WORDS[: self.config.n]:
            yield EchoTask(EchoData(prompt=word + "|", answer=word[::-1]), self.config.task)


__all__ = ["EchoTaskset"]
'''

MULTI_TURN_ENV = '''
import verifiers.v1 as vf


class GuessData(vf.TaskData):
    answer: str


class GuessTask(vf.Task[GuessData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def solved(self, task, trace) -> float:
        return float(any(task.answer in (m.content or "") for m in trace.assistant_messages))


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        for letter in "abcdefgh":
            yield GuessTask(GuessData(prompt=f"guess {letter}?", system_prompt="play", answer=letter),
                            self.config.task)


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    """The environment answers every wrong reply with 'no:<try>' and gives up after three tries."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as game:
            segment, tries = await game.turn(), 1
            while not segment.terminated and task.data.answer not in segment.last_reply and tries < 3:
                segment = await game.turn(f"no:{tries}")
                tries += 1

    async def finalize(self, task, episode):
        (trace,) = episode.traces
        trace.record_reward("turn_cost", -0.1 * (trace.num_turns - 1))


__all__ = ["GuessTaskset", "GuessEnv"]
'''


@pytest.fixture
def vf_envs(tmp_path, monkeypatch):
    """Two environment packages as `verifiers` finds them (importable modules exporting a Taskset via __all__)."""
    (tmp_path / "pv_vf_echo.py").write_text(textwrap.dedent(SINGLE_TURN_ENV))
    (tmp_path / "pv_vf_guess.py").write_text(textwrap.dedent(MULTI_TURN_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in ("pv_vf_echo", "pv_vf_guess"):
        sys.modules.pop(name, None)





@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_verifiers_single_turn_rollouts_masks_and_rubric(vf_envs, tiny):
    from prime_values.roles.inference import generate_rows

    tokenizer, model = tiny
    cfg = verifiers_cfg(env_id="pv_vf_echo", env_args={"n": 8}, heldout_size=2, privileged_field="answer")
    task = make_task(**cfg.task)
    assert len(task.heldout()) == 2 and task.describe()["train_tasks"] == 6  # env_args reached the taskset
    problems = task.sample(random.Random(0), 3)
    rows = generate_rows(task, model, tokenizer, problems, cfg, seed=5, policy_version=0, shard="w0", chunk=0)
    assert len(rows) == 3 * 4
    assert [r["group_id"] for r in rows] == [f"w0-000000-{i:04d}" for i in range(3) for _ in range(4)]
    for row in rows:
        problem = problems[int(row["group_id"][-4:])]
        prompt = tokenizer.encode(problem.prompt, add_special_tokens=False)
        n = len(prompt)
        assert row["token_ids"][:n] == prompt and row["policy_mask"][:n] == [0] * n
        assert row["policy_mask"][n:] == [1] * (len(row["token_ids"]) - n) and 1 <= len(row["token_ids"]) - n <= 6
        assert all(lp == 0.0 for lp in row["sampling_logprobs"][:n])
        assert all(lp <= 0.0 for lp in row["sampling_logprobs"][n:]) and any(lp < 0 for lp in row["sampling_logprobs"])
        assert row["stop_reason"] in ("eos", "length") and row["privileged"] == problem.answer
        reply = tokenizer.decode(row["token_ids"][n:], skip_special_tokens=True).strip()
        expected = len(set(reply) & set(problem.answer)) / len(set(problem.answer))
        assert row["reward"] == pytest.approx(expected)
    # the sampled logprobs are the policy's: teacher forcing the same tokens gives the same numbers
    from prime_values.models.sampling import teacher_forced_logprobs

    row = rows[0]
    n = row["policy_mask"].index(1)
    again = teacher_forced_logprobs(model, [row["token_ids"][:n]], [row["token_ids"][n:]], 1.0, tokenizer.pad_token_id)
    # KV-cached sampling vs one forward of a 2-block model with inner dimensions <= 128: at most 2 * 128 eps32 = 3e-5
    # of O(1) logits apart (tests/models/test_models.py's sampling test has the argument); a wrong token or
    # position > 1e-2
    assert again[0] == pytest.approx(row["sampling_logprobs"][n:], abs=1e-4)
    # single-reply scoring (task.score; no sampler uses it: they run episodes) runs the same rubric
    p = problems[0]
    assert task.score(p, p.answer) == 1.0 and task.score(p, "") == 0.0


def test_verifiers_multi_turn_env_tokens_are_masked(vf_envs, tiny):
    from prime_values.algo.gae import gae
    from prime_values.critic_io import padded
    from prime_values.roles.inference import generate_rows

    tokenizer, model = tiny
    cfg = verifiers_cfg(group_size=4, max_new_tokens=5, env_id="pv_vf_guess", heldout_size=2)
    task = make_task(**cfg.task)
    problems = task.sample(random.Random(1), 4)
    rows = generate_rows(task, model, tokenizer, problems, cfg, seed=11, policy_version=3, shard="w1", chunk=7)
    assert len(rows) == 16
    saw_multi = False
    for row in rows:
        problem = problems[int(row["group_id"][-4:])]
        ids, mask, lps = row["token_ids"], row["policy_mask"], row["sampling_logprobs"]
        assert len(ids) == len(mask) == len(lps) and row["policy_version"] == 3
        prompt = tokenizer.encode("play\n" + problem.prompt, add_special_tokens=False)  # plain rendering
        assert ids[: len(prompt)] == prompt and not any(mask[: len(prompt)])
        runs = mask_runs(mask)
        info = __import__("json").loads(row["task"])
        assert len(runs) == info["turns"] and 1 <= len(runs) <= 3
        replies = [tokenizer.decode(ids[a:b], skip_special_tokens=True) for a, b in runs]
        # between policy turns: exactly the environment's message, with mask 0 and logprob 0
        for k, ((_, end), (start, _)) in enumerate(zip(runs, runs[1:]), 1):
            assert ids[end:start] == tokenizer.encode(f"no:{k}", add_special_tokens=False)
            assert lps[end:start] == [0.0] * (start - end)
        assert all(lps[i] < 0 or lps[i] == 0.0 and not mask[i] for i in range(len(ids)) if mask[i])
        solved = any(problem.answer in r.strip() for r in replies)
        assert row["reward"] == pytest.approx(float(solved) - 0.1 * (len(runs) - 1))
        # the environment stopped after a correct reply or the third try
        assert solved or len(runs) == 3 or row["stop_reason"] == "length"
        if len(runs) > 1:
            saw_multi = True
            assert row["stop_reason"] in ("env_done", "length")
    assert saw_multi
    # GAE over these traces: environment tokens carry no advantage (one gamma*lambda step per policy token)
    mask = padded(rows, "policy_mask", torch.bool)
    rewards = torch.tensor([r["reward"] for r in rows])
    advantages, targets = gae(rewards, torch.zeros(mask.shape), mask, 1.0, 1.0)
    assert torch.all(advantages[~mask] == 0) and torch.allclose(advantages[mask], rewards.repeat_interleave(
        mask.sum(1)))


def test_verifiers_config_checks(vf_envs, monkeypatch):
    err = precheck(["task=verifiers", "task.env_id=pv_vf_nowhere"])
    assert "task.env_id='pv_vf_nowhere'" in err and "\n" not in err
    assert precheck(["task=verifiers", "task.env_id=pv_vf_echo", "task.max_turns=0"]).startswith("task.max_turns=0")
    assert precheck(["task=verifiers", "task.env_id=pv_vf_echo", "policy.warm_start.steps=0"]) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "verifiers" else real(name, *a))
    err = precheck(["task=verifiers", "task.env_id=pv_vf_echo"])
    assert err.startswith("task.name=verifiers needs the verifiers package: pip install 'prime_values[verifiers]'")
    assert "\n" not in err


def test_verifiers_failing_episode_keeps_its_group_complete(vf_envs, tiny, monkeypatch):
    """An environment that raises before any policy turn still gives one row (prompt only, mask 0, reward 0,
    stop_reason 'error'), so the orchestrator's group of group_size rollouts is complete."""
    from prime_values.roles.inference import generate_rows

    tokenizer, model = tiny
    cfg = verifiers_cfg(group_size=2, env_id="pv_vf_guess", heldout_size=2)
    task = make_task(**cfg.task)

    async def broken(task_, agents):
        raise RuntimeError("engine down")

    monkeypatch.setattr(task.env, "run", broken)
    problems = task.sample(random.Random(2), 2)
    rows = generate_rows(task, model, tokenizer, problems, cfg, seed=1, policy_version=0, shard="w0", chunk=0)
    assert len(rows) == 4 and all(r["stop_reason"] == "error" and r["reward"] == 0.0 for r in rows)
    for r in rows:
        problem = problems[int(r["group_id"][-4:])]
        assert r["token_ids"] == tokenizer.encode("play\n" + problem.prompt, add_special_tokens=False)
        assert not any(r["policy_mask"]) and "engine down" in r["task"]
