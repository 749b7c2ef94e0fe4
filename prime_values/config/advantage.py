"""`advantage.*`: how the policy's advantages are estimated (critic, group mean, or the tether between them)."""

from __future__ import annotations

from dataclasses import dataclass

from prime_values.config.base import choice, ranged

CRITIC_ESTIMATORS = ("gae", "tether")
"""the estimators that read the critic's values (the others start no critic roles)"""

BATCH_MEANS = ("batch_mean", "batch_loo")
"""the batch baselines that subtract a mean of the policy batch's rewards (prime_values.algo.gae.BATCH_BASELINES less
'reinforce'): a batch of one rollout is its own baseline, every advantage 0, so they need prompts_per_step x
group_size >= 2 (InferenceConfig.check)"""


@dataclass
class AdvantageConfig:
    estimator: str = choice("gae", "gae", "grpo", "tether", "batch_mean", "batch_loo", "reinforce")
    """'gae' (pure value advantage from the critic), 'grpo' (group-mean baseline, no critic), 'tether'
    (baseline w·V + (1−w)·group mean, w = how accurate the critic is), or a control without a critic at any group
    size: 'batch_mean' (R − the policy batch's mean reward), 'batch_loo' (R − the mean reward of the batch's other
    rollouts) or 'reinforce' (R, no baseline); formulas in docs/value_functions.md"""
    tether_mode: str = choice("group", "group", "running")
    """tether's weight w: 'group' = clamp(R², 0, 1) of the critic on each group's returns (a group whose returns
    do not vary: the running explained variance below); 'running' = clamp(explained variance on the last
    prompts_per_step scored groups, 0, 1); a group of one gets w = 1 (the value baseline) in both"""
    grpo_std: bool = False
    """grpo: divide the group-centred reward by the group's reward std (+1e-6)"""
    adaptive_alpha: float = ranged(0.0, ">= 0")
    """length-adaptive λ for the policy: λ_policy = clamp(1 − 1/(α·n), 0, 1) per rollout with n policy tokens
    (VAPO); 0 = use lambda_policy for every rollout"""
    gamma: float = ranged(1.0, ("in (0, 1]", " (1 = undiscounted, the default)"))
    """discount per policy token"""
    lambda_policy: float = ranged(1.0, "in [0, 1]")
    """GAE lambda for the policy's advantages"""
    lambda_value: float = ranged(1.0, "in [0, 1]")
    """GAE lambda for the critic's value targets (1 = Monte-Carlo returns, which never go stale in replay)"""
    whiten: bool = False
    """normalise advantages to zero mean, unit std per batch (value targets stay unwhitened)"""

