"""Advantages and value targets over policy tokens (DESIGN.md §3).

Shapes: ``B`` rollouts, right-padded to ``T`` tokens. ``policy_mask[b, t]`` is True where the policy
sampled token ``t``; prompt, environment and padding tokens are False. ``values[b, t]`` is the critic's
value of the causal state ``x_{<t}`` of policy token ``t`` (already aligned by the caller, see
``algo.privileged``) and is ignored where the mask is False. The reward is terminal: ``rewards[b]`` sits
on the last policy token of rollout ``b``, even when environment tokens follow it.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _per_rollout(x: float | Tensor, batch: int, like: Tensor, name: str) -> Tensor:
    """A float or a [B] tensor as a [B] tensor with ``like``'s dtype and device."""
    x = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    if x.dim() == 0:
        return x.expand(batch)
    assert x.shape == (batch,), f"{name} must be a float or a [B={batch}] tensor, got shape {tuple(x.shape)}"
    return x


def gae(
    rewards: Tensor,
    values: Tensor,
    policy_mask: Tensor,
    gamma: float,
    lam: float | Tensor,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over policy tokens only.

    Environment, prompt and padding tokens are skipped entirely: one γλ step per policy token, not per
    position. For the k-th of a rollout's n policy tokens p_1 … p_n:

        δ_k = r_k + γ·V(p_{k+1}) − V(p_k),   r_k = 0 for k < n,  r_n = R,  V(p_{n+1}) = bootstrap (0 if None)
        A_k = Σ_i (γλ)^i δ_{k+i}  =  δ_k + γλ·A_{k+1}
        returns_k = A_k + V(p_k)

    ``bootstrap`` is for a rollout the critic's context cut short (``algo.privileged``): it is added as
    given, next to ``R``, so a caller that bootstraps a truncated trace passes the reward it wants on the
    last kept policy token (normally 0, the verifier reward lying beyond the cut).

    Args:
        rewards: [B] terminal reward R of each rollout.
        values: [B, T] V(x_{<t}) at policy tokens; any value (nan included) where the mask is False.
        policy_mask: [B, T] bool (or 0/1).
        gamma: discount γ per policy token.
        lam: λ, a float or a [B] tensor (one λ per rollout, e.g. ``adaptive_lambda``).
        bootstrap: [B] V(p_{n+1}), or None for terminal rollouts.

    Returns:
        (advantages [B, T], returns [B, T]); both exactly 0 where the mask is False.
    """
    assert values.dim() == 2, f"values must be [B, T], got shape {tuple(values.shape)}"
    assert policy_mask.shape == values.shape, (
        f"policy_mask {tuple(policy_mask.shape)} and values {tuple(values.shape)} must have the same [B, T] shape"
    )
    batch, length = values.shape
    mask = policy_mask.bool()
    rewards = _per_rollout(rewards, batch, values, "rewards")
    lam = _per_rollout(lam, batch, values, "lam")
    next_value = (
        torch.zeros(batch, dtype=values.dtype, device=values.device)
        if bootstrap is None
        else _per_rollout(bootstrap, batch, values, "bootstrap").clone()
    )
    # Garbage (even nan) off-mask must not reach the arithmetic: select, never multiply by the mask.
    values = torch.where(mask, values, torch.zeros_like(values))
    next_advantage = torch.zeros_like(next_value)  # A_{k+1}; 0 past the last policy token
    seen_last = torch.zeros(batch, dtype=torch.bool, device=values.device)
    advantages = torch.zeros_like(values)
    for t in reversed(range(length)):
        m = mask[:, t]
        r = torch.where(m & ~seen_last, rewards, torch.zeros_like(rewards))  # R on the last policy token
        delta = r + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(m, advantage, torch.zeros_like(advantage))
        # Off-mask positions carry V(p_{k+1}) and A_{k+1} through unchanged: that is the skip.
        next_value = torch.where(m, values[:, t], next_value)
        next_advantage = torch.where(m, advantage, next_advantage)
        seen_last |= m
    returns = torch.where(mask, advantages + values, torch.zeros_like(values))
    return advantages, returns


def gae_reference(
    rewards: Tensor,
    values: Tensor,
    policy_mask: Tensor,
    gamma: float,
    lam: float | Tensor,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Slow, obviously-correct ``gae``: per rollout, list its policy tokens, then sum the δ's directly.

    A_k = Σ_{i=0}^{n−k} (γλ)^i δ_{k+i} is evaluated as written (O(n²)), in Python floats. For tests only.
    """
    batch, length = values.shape
    lams = _per_rollout(lam, batch, values, "lam").tolist()
    boots = [0.0] * batch if bootstrap is None else _per_rollout(bootstrap, batch, values, "bootstrap").tolist()
    advantages = torch.zeros_like(values)
    returns = torch.zeros_like(values)
    for b in range(batch):
        positions = [t for t in range(length) if bool(policy_mask[b, t])]
        n = len(positions)
        v = [float(values[b, t]) for t in positions] + [boots[b]]
        r = [0.0] * n
        if n:
            r[-1] = float(rewards[b])
        deltas = [r[k] + gamma * v[k + 1] - v[k] for k in range(n)]
        for k, t in enumerate(positions):
            a = sum((gamma * lams[b]) ** i * deltas[k + i] for i in range(n - k))
            advantages[b, t] = a
            returns[b, t] = a + v[k]
    return advantages, returns


def adaptive_lambda(n_policy_tokens: Tensor, alpha: float) -> Tensor:
    """Length-adaptive λ (VAPO): λ = 1 − 1/(α·n), clamped to [0, 1].  [B] -> [B] (float)."""
    assert alpha > 0, f"alpha must be > 0, got {alpha}"
    n = n_policy_tokens if n_policy_tokens.is_floating_point() else n_policy_tokens.float()
    lam = 1.0 - 1.0 / (alpha * n)  # n = 0 gives −inf, clamped to 0
    return lam.clamp(0.0, 1.0)


def advantages_and_targets(
    rewards: Tensor,
    values: Tensor,
    policy_mask: Tensor,
    gamma: float,
    lambda_policy: float | Tensor,
    lambda_value: float | Tensor,
    bootstrap: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Decoupled λ: advantages = GAE(λ_policy).advantages, value_targets = GAE(λ_value).returns.

    With γ = λ_value = 1 and no bootstrap the value targets are the Monte-Carlo return R at every policy
    token, which does not go stale while a rollout waits in the critic's replay buffer.

    Returns:
        (advantages [B, T], value_targets [B, T]); 0 where the mask is False.
    """
    advantages, _ = gae(rewards, values, policy_mask, gamma, lambda_policy, bootstrap)
    _, value_targets = gae(rewards, values, policy_mask, gamma, lambda_value, bootstrap)
    return advantages, value_targets


def _group_index(group_ids: list | Tensor, rewards: Tensor) -> tuple[Tensor, int]:
    """Dense group index [B] in 0..G−1 and G, from arbitrary group ids."""
    ids = torch.as_tensor(group_ids, device=rewards.device)
    assert ids.shape == rewards.shape, f"group_ids {tuple(ids.shape)} must match rewards {tuple(rewards.shape)}"
    _, index = torch.unique(ids, return_inverse=True)
    return index, int(index.max()) + 1 if index.numel() else 0


def group_mean_baseline(rewards: Tensor, group_ids: list | Tensor, leave_one_out: bool = False) -> Tensor:
    """Group-mean baseline b_i for each rollout.  rewards [B], group_ids [B] -> [B].

        plain:          b_i = (1/|g|)     · Σ_{j∈g} R_j
        leave-one-out:  b_i = (1/(|g|−1)) · Σ_{j∈g, j≠i} R_j      (a rollout never baselines itself)

    A group of one has no other member; its leave-one-out baseline falls back to its own reward (as the
    plain mean does), so a lone rollout gets advantage 0 rather than an unbaselined one.
    """
    index, n_groups = _group_index(group_ids, rewards)
    sums = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(0, index, rewards)
    counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, index, torch.ones_like(rewards)
    )
    group_sum, group_count = sums[index], counts[index]
    if not leave_one_out:
        return group_sum / group_count
    others = group_count - 1
    return torch.where(others > 0, (group_sum - rewards) / others.clamp(min=1), rewards)


def grpo_advantages(
    rewards: Tensor,
    group_ids: list | Tensor,
    policy_mask: Tensor,
    normalize_std: bool = False,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantage, broadcast over the rollout's policy tokens.  [B], [B], [B, T] -> [B, T].

        A_i = R_i − mean_g(R)                        (normalize_std=False, Dr. GRPO)
        A_i = (R_i − mean_g(R)) / (std_g(R) + eps)   (normalize_std=True, DeepSeekMath GRPO)

    std_g is the sample standard deviation (Bessel-corrected, as DeepSeekMath and TRL compute it); a group
    whose rewards are all equal (a group of one included) has std 0 and advantage 0.
    """
    index, n_groups = _group_index(group_ids, rewards)
    advantage = rewards - group_mean_baseline(rewards, index)
    if normalize_std:
        squares = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
            0, index, advantage**2
        )
        counts = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
            0, index, torch.ones_like(rewards)
        )
        std = (squares / (counts - 1).clamp(min=1)).sqrt()[index]
        # std = 0 means every member equals the mean: advantage 0, whatever eps is.
        advantage = torch.where(std > 0, advantage / (std + eps), torch.zeros_like(advantage))
    mask = policy_mask.bool()
    per_token = advantage[:, None].expand(mask.shape)
    return torch.where(mask, per_token, torch.zeros_like(per_token))


def whiten(advantages: Tensor, mask: Tensor, eps: float = 1e-8) -> Tensor:
    """Zero mean, unit std over masked tokens; exactly 0 off-mask.  [B, T] -> [B, T].

        Â = (A − μ) / (σ + eps),   μ, σ² = mean and population variance of A over masked tokens
    """
    mask = mask.bool()
    if not mask.any():
        return torch.zeros_like(advantages)
    selected = advantages[mask]
    mean = selected.mean()
    std = selected.var(unbiased=False).sqrt()
    return torch.where(mask, (advantages - mean) / (std + eps), torch.zeros_like(advantages))


def explained_variance(pred: Tensor, target: Tensor, mask: Tensor) -> float:
    """EV = 1 − Var(target − pred) / Var(target) over masked entries; nan if Var(target) ~ 0 (or no entries).

    1 is a perfect critic, 0 is no better than the mean, < 0 is worse. [B, T] x2 + mask -> float.
    """
    mask = mask.bool()
    target_sel = target[mask].double()
    if target_sel.numel() == 0:
        return float("nan")
    var_target = target_sel.var(unbiased=False)
    if var_target <= 1e-12:  # constant targets (up to float error of the GAE sums): EV is undefined
        return float("nan")
    residual = target_sel - pred[mask].double()
    return float(1.0 - residual.var(unbiased=False) / var_target)
