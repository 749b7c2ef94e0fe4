"""Pure math on tensors: advantages, losses, privileged critic layout. Imports only torch."""

from prime_values.algo.gae import (
    TETHER_MODES,
    adaptive_lambda,
    advantages_and_targets,
    explained_variance,
    gae,
    group_mean_baseline,
    grpo_advantages,
    tether_advantages,
    whiten,
)
from prime_values.algo.losses import (
    VALUE_LOSS_KINDS,
    ppo_clip_loss,
    prob_diff_mask_loss,
    token_logprobs,
    value_loss,
    values_from_head,
)
from prime_values.algo.privileged import (
    batch_values_to_policy_layout,
    critic_layout,
    kept_policy_mask,
    truncate_for_critic,
    values_to_policy_layout,
)

__all__ = [
    "TETHER_MODES",
    "VALUE_LOSS_KINDS",
    "adaptive_lambda",
    "advantages_and_targets",
    "batch_values_to_policy_layout",
    "critic_layout",
    "explained_variance",
    "gae",
    "group_mean_baseline",
    "grpo_advantages",
    "kept_policy_mask",
    "ppo_clip_loss",
    "prob_diff_mask_loss",
    "tether_advantages",
    "token_logprobs",
    "truncate_for_critic",
    "value_loss",
    "values_from_head",
    "values_to_policy_layout",
    "whiten",
]
