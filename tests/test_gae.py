"""GAE over policy tokens, decoupled λ, group baselines, whitening, explained variance: hand-worked numbers."""

import math

import pytest
import torch

from prime_values.algo.gae import (
    adaptive_lambda,
    advantages_and_targets,
    explained_variance,
    gae,
    gae_reference,
    group_mean_baseline,
    grpo_advantages,
    whiten,
)

NAN = float("nan")

# One rollout: [prompt, prompt, pol, pol, env, pol, pad]; policy tokens p1, p2, p3 at t = 2, 3, 5.
MASK = torch.tensor([[0, 0, 1, 1, 0, 1, 0]], dtype=torch.bool)
# V(p1) = 0.5, V(p2) = 0.25, V(p3) = 0.75; garbage (nan, huge) wherever the mask is 0.
VALUES = torch.tensor([[NAN, 1e9, 0.5, 0.25, -7.0, 0.75, NAN]], dtype=torch.float64)
REWARD = torch.tensor([1.0], dtype=torch.float64)


def test_gae_hand_worked_skips_environment_tokens():
    # γ = 1, λ = 0.5, R = 1 on p3, terminal:
    # δ3 = 1 + 0 − 0.75 = 0.25              A3 = 0.25
    # δ2 = 0 + 0.75 − 0.25 = 0.5            A2 = 0.5 + 0.5·0.25 = 0.625
    # δ1 = 0 + 0.25 − 0.5 = −0.25           A1 = −0.25 + 0.5·0.625 = 0.0625
    # (the env token at t = 4 costs no γλ step: A2 uses A3 directly)
    # returns = A + V: 0.5625, 0.875, 1.0
    advantages, returns = gae(REWARD, VALUES, MASK, gamma=1.0, lam=0.5)
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.0625, 0.625, 0, 0.25, 0]], dtype=torch.float64))
    torch.testing.assert_close(returns, torch.tensor([[0, 0, 0.5625, 0.875, 0, 1.0, 0]], dtype=torch.float64))


def test_gae_hand_worked_discount_and_bootstrap():
    # γ = 0.5, λ = 1, R = 1, bootstrap V(p4) = 2:
    # δ3 = 1 + 0.5·2 − 0.75 = 1.25          A3 = 1.25
    # δ2 = 0 + 0.5·0.75 − 0.25 = 0.125      A2 = 0.125 + 0.5·1.25 = 0.75
    # δ1 = 0 + 0.5·0.25 − 0.5 = −0.375      A1 = −0.375 + 0.5·0.75 = 0.0
    # returns (λ = 1: discounted return):   G3 = 1 + 0.5·2 = 2, G2 = 0.5·2 = 1, G1 = 0.5·1 = 0.5
    bootstrap = torch.tensor([2.0], dtype=torch.float64)
    advantages, returns = gae(REWARD, VALUES, MASK, gamma=0.5, lam=1.0, bootstrap=bootstrap)
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.0, 0.75, 0, 1.25, 0]], dtype=torch.float64))
    torch.testing.assert_close(returns, torch.tensor([[0, 0, 0.5, 1.0, 0, 2.0, 0]], dtype=torch.float64))


def test_gae_per_rollout_lambda_and_reward_on_last_policy_token_before_env():
    # Two rollouts sharing V = (0.5, 0.25, 0.75); row 1 ends with environment tokens after its last policy token.
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0]], dtype=torch.bool)
    values = torch.tensor([[9.0, 0.5, 0.25, 0.75, 9.0, 9.0]] * 2)
    rewards = torch.tensor([1.0, 1.0])
    # γ = 1. Row 0, λ = 0: A = δ = (0.25 − 0.5, 0.75 − 0.25, 1 − 0.75) = (−0.25, 0.5, 0.25).
    # Row 1, λ = 1: A = R − V = (0.5, 0.75, 0.25)  (the reward sits on t = 3, not on the trailing env tokens).
    advantages, returns = gae(rewards, values, mask, gamma=1.0, lam=torch.tensor([0.0, 1.0]))
    torch.testing.assert_close(advantages[0], torch.tensor([0, -0.25, 0.5, 0.25, 0, 0]))
    torch.testing.assert_close(advantages[1], torch.tensor([0, 0.5, 0.75, 0.25, 0, 0]))
    # Row 0 returns = A + V = (0.25, 0.75, 1.0); row 1 = R = 1 at every policy token.
    torch.testing.assert_close(returns[0], torch.tensor([0, 0.25, 0.75, 1.0, 0, 0]))
    torch.testing.assert_close(returns[1], torch.tensor([0, 1.0, 1.0, 1.0, 0, 0]))


def test_gae_values_off_mask_have_no_effect_and_outputs_are_zero_there():
    clean = torch.where(MASK, VALUES, torch.zeros_like(VALUES))
    bootstrap = torch.tensor([0.3], dtype=torch.float64)
    a_garbage, r_garbage = gae(REWARD, VALUES, MASK, gamma=0.9, lam=0.7, bootstrap=bootstrap)
    a_clean, r_clean = gae(REWARD, clean, MASK, gamma=0.9, lam=0.7, bootstrap=bootstrap)
    torch.testing.assert_close(a_garbage, a_clean)
    torch.testing.assert_close(r_garbage, r_clean)
    assert (a_garbage[~MASK] == 0).all() and (r_garbage[~MASK] == 0).all()


def test_gae_rollout_without_policy_tokens_is_all_zero():
    no_policy = torch.zeros(1, 4, dtype=torch.bool)
    advantages, returns = gae(torch.tensor([5.0]), torch.ones(1, 4), no_policy, gamma=1.0, lam=1.0)
    assert (advantages == 0).all() and (returns == 0).all()


@pytest.mark.parametrize("seed", range(5))
def test_gae_matches_slow_reference_on_random_batches(seed):
    g = torch.Generator().manual_seed(seed)
    batch, length = 6, 17
    mask = torch.rand(batch, length, generator=g) < 0.6
    mask[0] = False  # one rollout with no policy token at all
    values = torch.randn(batch, length, generator=g, dtype=torch.float64)
    values[~mask] = NAN
    rewards = torch.randn(batch, generator=g, dtype=torch.float64)
    lam = torch.rand(batch, generator=g, dtype=torch.float64)
    gamma = float(torch.rand((), generator=g)) * 0.5 + 0.5
    bootstrap = torch.randn(batch, generator=g, dtype=torch.float64) if seed % 2 else None
    fast = gae(rewards, values, mask, gamma, lam, bootstrap)
    slow = gae_reference(rewards, values, mask, gamma, lam, bootstrap)
    for got, want in zip(fast, slow):
        torch.testing.assert_close(got, want)


def test_adaptive_lambda_hand_worked():
    # λ = 1 − 1/(α·n), α = 0.5: n = 0 → −inf → 0; n = 1 → 1 − 2 = −1 → 0; n = 2 → 0; n = 10 → 1 − 1/5 = 0.8
    lam = adaptive_lambda(torch.tensor([0, 1, 2, 10]), alpha=0.5)
    torch.testing.assert_close(lam, torch.tensor([0.0, 0.0, 0.0, 0.8]))
    # α = 2, n = 4: 1 − 1/8 = 0.875; never above 1
    torch.testing.assert_close(adaptive_lambda(torch.tensor([4.0, 1e12]), alpha=2.0), torch.tensor([0.875, 1.0]))


def test_decoupled_lambdas_monte_carlo_targets_and_telescoping():
    # λ_value = γ = 1, no bootstrap: targets = R = 1 at every policy token.
    # λ_policy = 1 as well: A_t telescopes to R − V_t = (1 − 0.5, 1 − 0.25, 1 − 0.75) = (0.5, 0.75, 0.25).
    advantages, targets = advantages_and_targets(REWARD, VALUES, MASK, 1.0, lambda_policy=1.0, lambda_value=1.0)
    torch.testing.assert_close(targets, MASK.double())
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.5, 0.75, 0, 0.25, 0]], dtype=torch.float64))
    # λ_policy = 0.5 gives the hand-worked A = (0.0625, 0.625, 0.25) while targets stay Monte-Carlo.
    advantages, targets = advantages_and_targets(REWARD, VALUES, MASK, 1.0, lambda_policy=0.5, lambda_value=1.0)
    torch.testing.assert_close(advantages, torch.tensor([[0, 0, 0.0625, 0.625, 0, 0.25, 0]], dtype=torch.float64))
    torch.testing.assert_close(targets, MASK.double())


REWARDS = torch.tensor([1.0, 0.0, 0.5, 2.0, 3.0])
GROUPS = [7, 7, 7, 4, 9]


def test_group_mean_baseline_hand_worked():
    # group 7 = {1, 0, 0.5}: mean 0.5; group 4 = {2}; group 9 = {3}
    torch.testing.assert_close(group_mean_baseline(REWARDS, GROUPS), torch.tensor([0.5, 0.5, 0.5, 2.0, 3.0]))
    # leave-one-out: (0 + 0.5)/2 = 0.25, (1 + 0.5)/2 = 0.75, (1 + 0)/2 = 0.5; singletons fall back to own reward
    torch.testing.assert_close(
        group_mean_baseline(REWARDS, torch.tensor(GROUPS), leave_one_out=True),
        torch.tensor([0.25, 0.75, 0.5, 2.0, 3.0]),
    )


def test_grpo_advantages_hand_worked():
    mask = torch.tensor([[1, 1, 0], [0, 1, 1], [1, 0, 0], [1, 1, 1], [0, 0, 1]], dtype=torch.bool)
    # R − mean: (0.5, −0.5, 0, 0, 0), broadcast over each rollout's policy tokens
    want = torch.tensor([[0.5, 0.5, 0], [0, -0.5, -0.5], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    torch.testing.assert_close(grpo_advantages(REWARDS, GROUPS, mask), want)
    # group 7 sample std = sqrt((0.25 + 0.25 + 0)/2) = 0.5 → (1, −1, 0); singletons: 0/(0 + eps) = 0
    normalized = grpo_advantages(REWARDS, GROUPS, mask, normalize_std=True, eps=0.0)
    torch.testing.assert_close(normalized, want * 2)


def test_whiten_hand_worked():
    advantages = torch.tensor([[1.0, 3.0, 99.0], [1.0, 3.0, NAN]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    # masked {1, 3, 1, 3}: mean 2, population std 1 → (−1, 1, −1, 1); off-mask exactly 0
    torch.testing.assert_close(whiten(advantages, mask, eps=0.0), torch.tensor([[-1.0, 1.0, 0.0], [-1.0, 1.0, 0.0]]))


def test_explained_variance_hand_worked():
    target = torch.tensor([[1.0, 2.0, 3.0, 4.0, 50.0]])
    pred = torch.tensor([[1.0, 2.0, 3.0, 5.0, -50.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]], dtype=torch.bool)
    # residual (0, 0, 0, −1): mean −0.25, Var = (3·0.0625 + 0.5625)/4 = 0.1875; Var(target) = 1.25
    # EV = 1 − 0.1875/1.25 = 0.85
    assert explained_variance(pred, target, mask) == pytest.approx(0.85)
    assert explained_variance(target, target, mask) == pytest.approx(1.0)
    assert math.isnan(explained_variance(pred, torch.full_like(target, 2.0), mask))
