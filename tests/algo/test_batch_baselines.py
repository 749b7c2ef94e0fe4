"""The critic-free controls (advantage=batch_mean / batch_loo / reinforce): their formulas on hand-worked numbers,
the orchestrator's wiring (one baseline over the whole policy batch, not per group) and the config facts they
imply (no critic roles, any group size)."""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.algo.gae import batch_mean_advantages, per_token as broadcast
from prime_values.config import Config
from prime_values.config.advantage import make_estimator
from prime_values.config.derived import derive
from prime_values.roles.orchestrator import batch_metrics, batch_rows, finish_batch, score_group
from tests import log_rows
from tests.e2e_helpers import run_pipeline, stream_table

REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0])  # batch mean 0.5
MASK = torch.tensor([[0, 1, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)


def per_token(values: list[float]) -> torch.Tensor:
    return torch.where(MASK, torch.tensor(values)[:, None].expand(MASK.shape), torch.zeros(MASK.shape))


def test_batch_mean_subtracts_the_batch_mean_on_policy_tokens_only():
    # mean R = (1 + 0 + 0 + 1) / 4 = 0.5: A = R - 0.5 = +.5, -.5, -.5, +.5
    out = batch_mean_advantages(REWARDS, MASK)
    assert torch.equal(out, per_token([0.5, -0.5, -0.5, 0.5]))


def test_batch_loo_subtracts_the_mean_of_the_other_rollouts():
    # rollout 0: others 0, 0, 1 -> b = 1/3, A = 2/3; rollout 1: others 1, 0, 1 -> b = 2/3, A = -2/3;
    # = B/(B-1) (R - mean R) = 4/3 * (+-0.5)
    out = batch_mean_advantages(REWARDS, MASK, leave_one_out=True)
    assert torch.allclose(out, per_token([2 / 3, -2 / 3, -2 / 3, 2 / 3]))
    uneven = batch_mean_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.ones(3, 1, dtype=torch.bool),
                                   leave_one_out=True)
    # 3 - (1 + 2)/2 = 1.5; 1 - (3 + 2)/2 = -1.5; 2 - (3 + 1)/2 = 0
    assert torch.allclose(uneven[:, 0], torch.tensor([1.5, -1.5, 0.0]))


def test_a_batch_of_one_gets_no_leave_one_out_advantage():
    one = batch_mean_advantages(torch.tensor([1.0]), torch.ones(1, 2, dtype=torch.bool), leave_one_out=True)
    assert torch.equal(one, torch.zeros(1, 2))


def test_reinforce_is_the_reward_itself():
    assert torch.equal(broadcast(REWARDS, MASK), per_token([1.0, 0.0, 0.0, 1.0]))


def rollout(rid: str, group: str, reward: float, response=(7, 8, 2)) -> dict:
    return log_rows.row("rollouts", rollout_id=rid, group_id=group, reward=reward, token_ids=[5, 6, *response],
                        policy_mask=[0, 0] + [1] * len(response),
                        sampling_logprobs=[0.0, 0.0] + [-0.5] * len(response), privileged="42")


def groups_of_one(estimator):
    """Three groups of one (G = 1) with rewards 1, 0, 0 and responses of 3, 2, 3 tokens: batch mean 1/3."""
    rows = [rollout("a", "g1", 1.0), rollout("b", "g2", 0.0, response=(7, 2)), rollout("c", "g3", 0.0)]
    return [score_group([r], None, estimator) for r in rows]


@pytest.mark.parametrize("estimator, expected", [
    ("batch_mean", [2 / 3, -1 / 3, -1 / 3]),        # R - 1/3
    ("batch_loo", [1.0, -0.5, -0.5]),               # 1 - 0; 0 - (1 + 0)/2; 0 - (1 + 0)/2
    ("reinforce", [1.0, 0.0, 0.0]),
])
def test_the_orchestrator_baselines_the_whole_batch_at_group_size_one(estimator, expected):
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.inference.group_size = estimator, 1
    scorer = make_estimator(cfg.advantage)
    groups = finish_batch(groups_of_one(scorer), scorer)
    rows = batch_rows(1, groups, whiten_advantages=False)
    for row, a in zip(rows, expected):  # every policy token carries the rollout's advantage, prompt tokens 0
        assert row["advantages"] == pytest.approx([0.0 if m == 0 else a for m in row["policy_mask"]])
    metrics = batch_metrics(1, groups)  # the logged statistics describe the baselined advantages
    n_tokens = [3, 2, 3]
    mean = sum(a * n for a, n in zip(expected, n_tokens)) / sum(n_tokens)
    assert metrics["advantage_mean"] == pytest.approx(mean)


def test_other_estimators_pass_through_unchanged():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = "grpo"
    grpo = make_estimator(cfg.advantage)
    groups = [score_group([rollout("a", "g", 1.0), rollout("b", "g", 0.0, response=(7, 2))], None, grpo),
              score_group([rollout("c", "h", 0.0)], None, grpo)]  # of another width: padded and cut back
    finished = finish_batch(groups, grpo)
    assert all(torch.equal(f.advantages, g.advantages) for f, g in zip(finished, groups))


@pytest.mark.parametrize("estimator, uses_critic", [
    ("gae", True), ("tether", True), ("linear_mix", True), ("grpo", False), ("batch_mean", False),
    ("batch_loo", False), ("reinforce", False)])
def test_only_the_estimators_with_a_critic_start_one(estimator, uses_critic):
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = estimator
    assert derive(cfg)["uses_critic"] is uses_critic


@pytest.mark.slow
def test_a_leave_one_out_run_at_group_size_one_baselines_each_batch_by_its_other_rollouts(tmp_path):
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "advantage=batch_loo", "inference.group_size=1", "inference.prompts_per_step=8",
                          "schedule.mode=lockstep", "steps=3")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"}
    rows = stream_table(run_dir, "batches").to_pylist()
    assert sorted({r["step"] for r in rows}) == [1, 2, 3]
    for step in (1, 2, 3):
        batch = [r for r in rows if r["step"] == step]
        assert len(batch) == 8
        rewards = [r["reward"] for r in batch]
        for r in batch:
            first = r["policy_mask"].index(1)
            others = (sum(rewards) - r["reward"]) / (len(rewards) - 1)
            assert r["advantages"][first] == pytest.approx(r["reward"] - others, abs=1e-6)
