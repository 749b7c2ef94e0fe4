"""Every place that samples and scores runs a multi-turn `verifiers` environment's whole episodes
(`rollout.sample_and_score`): the held-out evaluation (greedy), the critic warm start's samples and the
eval stage's avg@k / pass@k. The environment below rewards only a reply to its follow-up question, so scoring the
first reply alone (what these places did before) gives 0 where the episodes give the right reward."""

from __future__ import annotations

import json
import random
import sys
import textwrap
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from prime_values.tasks import make_task
from tests.tasks.shared import mask_runs, verifiers_cfg

FOLLOW_UP_ENV = '''
import verifiers.v1 as vf


class AskData(vf.TaskData):
    answer: str


class AskTask(vf.Task[AskData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def answered_follow_up(self, task, trace) -> float:
        """1 for a 'yes' task once the policy has answered the follow-up too: only the second turn earns it"""
        return float(len(trace.assistant_messages) >= 2 and task.answer == "yes")


class AskTaskset(vf.Taskset[AskTask, vf.TasksetConfig]):
    def load(self):
        for i in range(12):
            yield AskTask(AskData(prompt=f"q{i}?", system_prompt="play", answer="yes" if i % 2 else "no"),
                          self.config.task)


class AskEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class AskEnv(vf.Env[AskEnvConfig]):
    """One reply, then one follow-up question ('more') and its reply."""

    async def run(self, task, agents):
        async with agents.player.interaction(task) as chat:
            if not (await chat.turn()).terminated:
                await chat.turn("more")


__all__ = ["AskTaskset", "AskEnv"]
'''


@pytest.fixture
def follow_up(tmp_path, monkeypatch):
    """The environment's task (4 held-out prompts, some 'yes', some 'no') and each held-out prompt's reward."""
    (tmp_path / "pv_vf_follow_up.py").write_text(textwrap.dedent(FOLLOW_UP_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = verifiers_cfg(group_size=2, max_new_tokens=4, env_id="pv_vf_follow_up", heldout_size=4)
    task = make_task(**cfg.task)
    expected = [float(p.answer == "yes") for p in task.heldout()]
    assert 0 < sum(expected) < len(expected)  # both kinds held out: a wrong grouping shows
    # scoring the first reply alone cannot earn the reward
    assert task.score_many(task.heldout(), ["yes"] * 4) == [0.0] * 4
    yield cfg, task, expected
    sys.modules.pop("pv_vf_follow_up", None)


def _assert_two_turns(tokenizer, token_ids, mask, logprobs):
    """Two policy replies with the environment's follow-up between them: mask 0, logprob 0."""
    (_, end), (start, _) = mask_runs(mask)
    assert token_ids[end:start] == tokenizer.encode("more", add_special_tokens=False)
    assert logprobs[end:start] == [0.0] * (start - end) and mask[0] == 0


def test_heldout_accuracy_is_greedy_over_whole_episodes(follow_up, tiny, monkeypatch):
    from prime_values.rollout import greedy_accuracy, sample_and_score

    tokenizer, model = tiny
    cfg, task, expected = follow_up
    asked, rollout = [], task.rollout
    monkeypatch.setattr(task, "rollout", lambda *a, **k: asked.append(k) or rollout(*a, **k))
    assert greedy_accuracy(model, tokenizer, task, task.heldout(), max_new_tokens=4) == pytest.approx(sum(expected) / 4)
    assert asked[0]["temperature"] == 0.0 and asked[0]["num_samples"] == 1
    # temperature 0 is greedy decoding in an episode too: a group's episodes are the same
    episodes = sample_and_score(model, tokenizer, task, task.heldout(), num_samples=2, max_new_tokens=4,
                                temperature=0.0, seed=3)
    assert [e.reward for e in episodes] == [r for r in expected for _ in range(2)]
    for a, b in zip(episodes[::2], episodes[1::2]):
        assert a.token_ids == b.token_ids and a.turns == 2
        _assert_two_turns(tokenizer, a.token_ids, a.policy_mask, a.logprobs)


def test_critic_warm_start_samples_episodes(follow_up, tiny, tmp_path):
    from prime_values.roles.warm_start import sample_for_critic
    from prime_values.rundir import RunDir

    tokenizer, model = tiny
    cfg, task, _ = follow_up
    cfg.critic.warm_start.rollouts, cfg.advantage.gamma = 8, 1.0
    ctx = SimpleNamespace(cfg=cfg, seed=lambda *salt: 17 + sum(salt), run=RunDir(tmp_path))  # a role's parts it uses
    rows = sample_for_critic(ctx, model, tokenizer, task)
    assert len(rows) == 8 and {r["group_id"] for r in rows} == {f"pretrain-000000-{i:04d}" for i in range(4)}
    by_id = {p.prompt_id: p for p in task.sample(random.Random(0), 200)}
    for row in rows:
        _assert_two_turns(tokenizer, row["token_ids"], row["policy_mask"], row["sampling_logprobs"])
        assert row["reward"] == float(by_id[row["prompt_id"]].answer == "yes")  # the episode's reward
        assert json.loads(row["task"])["turns"] == 2
        # Monte-Carlo returns: the reward at every policy token
        assert {t for t, m in zip(row["value_targets"], row["policy_mask"]) if m} == {row["reward"]}


def test_eval_stage_reports_avg_and_pass_at_k_of_episodes(follow_up, tiny, tmp_path):
    from prime_values.config import prepare
    from prime_values.models import save_model
    from prime_values.stages import evaluate

    tokenizer, model = tiny
    cfg, _, expected = follow_up
    save_model(model, tokenizer, tmp_path / "model")
    cfg.policy.model, cfg.eval.samples, cfg.eval.k, cfg.eval.temperature = str(tmp_path / "model"), 3, [1, 3], 1.0
    cfg.eval.max_new_tokens = 4
    (tmp_path / "run" / "stages" / "eval").mkdir(parents=True)
    (tmp_path / "run" / "stages" / "eval" / "config.yaml").write_text(OmegaConf.to_yaml(prepare(cfg)))
    evaluate.main(str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "stages" / "eval" / "results.json").read_text())
    assert [p["correct"] for p in results["per_prompt"]] == [3 * r for r in expected]
    share = sum(expected) / 4
    assert results["metrics"] == pytest.approx({"avg@3": share, "pass@1": share, "pass@3": share})
