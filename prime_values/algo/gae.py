"""Advantages and value targets over policy tokens (docs/design.md §3).

Shapes: ``B`` rollouts, right-padded to ``T`` tokens. ``policy_mask[b, t]`` is True where the policy
sampled token ``t``; prompt, environment and padding tokens are False. ``values[b, t]`` is the critic's
value of the causal state ``x_{<t}`` of policy token ``t`` (already aligned by the caller, see
``algo.privileged``) and is ignored where the mask is False. The reward is terminal: ``rewards[b]`` sits
on the last policy token of rollout ``b``, even when environment tokens follow it, unless the caller flags
the rollout as cut by the critic's context (``cut[b]``), in which case ``bootstrap[b]`` = V(s_cut) stands in.

The formulas of the estimators (``prime_values.algo.estimators`` registers them by name): ``gae`` (value
baseline), ``grpo_advantages`` (group-mean baseline), ``tether_advantages`` (a blend of the two weighted by the
critic's accuracy), ``linear_mix_advantages`` (a fixed blend of the two advantages) and ``batch_mean_advantages``
(the batch's mean reward as the baseline).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _per_rollout(x: float | Tensor, batch: int, like: Tensor, name: str) -> Tensor:
    """A float or a [B] tensor as a [B] tensor with ``like``'s dtype and device."""
    x = torch.as_tensor(x, dtype=like.dtype, device=like.device)
    if x.dim() == 0:
        return x.expand(batch)
    assert x.shape == (batch,), f"{name} must be a float or a [B={batch}] tensor, got shape {tuple(x.shape)}"
    return x


def _terminal(
    rewards: Tensor, bootstrap: Tensor | None, cut: Tensor | None, batch: int, like: Tensor
) -> tuple[Tensor, Tensor]:
    """(r_n, V(p_{n+1})) per rollout: (R, 0) for a terminal rollout, (0, bootstrap) for one the critic cut."""
    rewards = _per_rollout(rewards, batch, like, "rewards")
    if cut is None:
        if bootstrap is not None:
            raise ValueError("bootstrap is used only where the per-rollout `cut` flag says so: pass cut=[B] bool")
        return rewards, torch.zeros_like(rewards)
    cut = torch.as_tensor(cut, device=like.device).bool()
    assert cut.shape == (batch,), f"cut must be a [B={batch}] bool tensor, got shape {tuple(cut.shape)}"
    if bootstrap is None:
        if cut.any():
            raise ValueError("a rollout is marked cut but no bootstrap value V(s_cut) was given")
        return rewards, torch.zeros_like(rewards)
    bootstrap = _per_rollout(bootstrap, batch, like, "bootstrap")
    zero = torch.zeros_like(rewards)
    return torch.where(cut, zero, rewards), torch.where(cut, bootstrap, zero)


_CHUNK = 256  # positions per block of the scan in ``gae``: a block's [B, 256] buffers stay in cache


def gae(
    rewards: Tensor,
    values: Tensor,
    policy_mask: Tensor,
    gamma: float,
    lam: float | Tensor,
    bootstrap: Tensor | None = None,
    cut: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over policy tokens only.

    Environment, prompt and padding tokens are skipped entirely: one γλ step per policy token, not per
    position, and their values are never read. For the k-th of a rollout's n policy tokens p_1 … p_n:

        δ_k = r_k + γ·V(p_{k+1}) − V(p_k),   r_k = 0 for k < n
        A_k = Σ_i (γλ)^i δ_{k+i}  =  δ_k + γλ·A_{k+1}            (A_{n+1} = 0)
        returns_k = A_k + V(p_k)

    and the end of the trace is either
        terminal (the default, a rollout that hit the generation cap included):  r_n = R,  V(p_{n+1}) = 0
        cut by the critic's context (``cut[b]`` True):                           r_n = 0,  V(p_{n+1}) = bootstrap[b]
    On a cut rollout the verifier reward lies beyond the cut and V(s_cut) stands in for it. Whether a rollout
    was cut is the caller's explicit flag (``algo.privileged.truncate_for_critic``), never inferred here from
    padding or from the number of policy tokens.

    Computation: returns obey the λ-return recursion  G_k = r_k + γ·((1 − λ)·V(p_{k+1}) + λ·G_{k+1}),
    G_n = r_n + γ·V(p_{n+1}), which carries ONE number per rollout backwards over raw positions t:

        Z_t = u_t + f_t·Z_{t+1},   u_t = γ(1 − λ)·V_t, f_t = γλ   at a policy token
                                   u_t = 0,            f_t = 1    elsewhere (the skip: Z passes through)
        Z_T = r_n + γ·V(p_{n+1}),  returns_t = Z_{t+1},  A_t = Z_{t+1} − V_t   at policy tokens

    The scan runs right to left over blocks of ``_CHUNK`` positions, vectorised over rollouts. A block's
    values and mask are first copied out of the [B, T] inputs into [B, w] buffers (a copy streams the rows;
    ops reading T-float-apart rows in place thrash the cache), V is selected there (``where``: nan or garbage
    off-mask never enters), u and f are formed with whole-block ops, and then each of the w steps updates one
    column of the block in place: a strided [B] vector, one ``addcmul_`` (no division anywhere; a product of
    γλ's that underflows to 0 is harmless, λ = 0 gives f = 0). Returns and advantages go straight into the
    block's columns of the outputs. Measured on one CPU thread (``bench/bench_gae.py``, docs/benchmarks.md)
    this beats transposing each block so that a step reads a contiguous row (the three transposes, in and
    out, cost more than the strided steps lose) and a two-level blocked scan (fewer, wider steps, but about
    three times the arithmetic); the largest remaining costs are the scan itself and first-touching the two
    new [B, T] outputs. tests/reference_gae.py checks it. No gradient flows through it (values are data here), so
    the scratch work runs in inference mode, which trims the per-op dispatch of the T small steps.

    Args:
        rewards: [B] terminal reward R of each rollout.
        values: [B, T] V(x_{<t}) at policy tokens; any value (nan included) where the mask is False.
        policy_mask: [B, T] bool (or 0/1).
        gamma: discount γ per policy token.
        lam: λ, a float or a [B] tensor (one λ per rollout, e.g. ``adaptive_lambda``).
        bootstrap: [B] V(s_cut) of the cut rollouts (read only where ``cut``; anything elsewhere).
        cut: [B] bool, True where the critic's context cut the rollout; None = no rollout was cut.

    Returns:
        (advantages [B, T], returns [B, T]); both exactly 0 where the mask is False (given finite values at
        the policy tokens).
    """
    assert values.dim() == 2, f"values must be [B, T], got shape {tuple(values.shape)}"
    assert policy_mask.shape == values.shape, (
        f"policy_mask {tuple(policy_mask.shape)} and values {tuple(values.shape)} must have the same [B, T] shape"
    )
    batch, length = values.shape
    values = values.detach()
    mask = policy_mask.bool()
    last_reward, next_value = _terminal(rewards, bootstrap, cut, batch, values)
    lam = _per_rollout(lam, batch, values, "lam")
    decay_minus_one = (gamma * lam - 1.0)[:, None]  # f_t − 1 at policy tokens, per rollout
    weight = (gamma * (1.0 - lam))[:, None]  # u_t / V_t at policy tokens
    carry = last_reward + gamma * next_value  # Z_T
    advantages, returns = torch.empty_like(values), torch.empty_like(values)  # outside: ordinary tensors
    width = min(_CHUNK, length)
    with torch.inference_mode():
        zero, one = values.new_zeros(()), values.new_ones(())
        # One block's buffers, allocated once. Column i is position start + i; z's column w holds Z_end, the carry.
        v = values.new_empty(batch, width)  # V where masked, 0 elsewhere
        m = mask.new_empty(batch, width)
        m_float = values.new_empty(batch, width)  # the mask as 0./1.
        z = values.new_empty(batch, width + 1)  # u, then Z
        f = values.new_empty(batch, width)
        z_cols, f_cols = z.unbind(1), f.unbind(1)  # the per-step views, made once
        for end in range(length, 0, -_CHUNK):
            start = max(end - _CHUNK, 0)
            w = end - start
            z_cols[w].copy_(carry)  # before u overwrites column 0, which holds the previous block's Z_start
            m_w, v_w, m_float_w = m[:, :w], v[:, :w], m_float[:, :w]
            m_w.copy_(mask[:, start:end])
            v_w.copy_(values[:, start:end])
            torch.where(m_w, v_w, zero, out=v_w)  # select: garbage off-mask never enters
            m_float_w.copy_(m_w.view(torch.uint8))  # (a uint8 -> float cast is vectorised, bool -> float is not)
            torch.mul(v_w, weight, out=z[:, :w])  # u
            # f = 1 + (γλ − 1)·m: exactly 1 off-mask, and exactly γλ at policy tokens when γλ >= 0.5 (else within
            # an ulp of 1, where the product of such factors decays fast anyway); λ = 0 gives exactly 0.
            torch.addcmul(one, m_float_w, decay_minus_one, out=f[:, :w])
            for i in reversed(range(w)):
                z_cols[i].addcmul_(f_cols[i], z_cols[i + 1])  # Z_t = u_t + f_t·Z_{t+1}
            carry = z_cols[0]
            block_returns = returns[:, start:end]
            # Z_{t+1} at policy tokens; 0 + Z·0 is +0.0 off-mask where Z·0 alone would give −0.0 for a negative Z.
            torch.addcmul(zero, z[:, 1 : w + 1], m_float_w, out=block_returns)
            torch.sub(block_returns, v_w, out=advantages[:, start:end])  # A = returns − V; both 0 off-mask
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
    cut: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Decoupled λ: advantages = GAE(λ_policy).advantages, value_targets = GAE(λ_value).returns.

    With γ = λ_value = 1 the value targets of a terminal rollout are the Monte-Carlo return R at every policy
    token, which does not go stale while a rollout waits in the critic's replay buffer (a cut rollout's are
    V(s_cut), its bootstrap). With λ_policy ≠ λ_value the targets are not advantages + values. ``bootstrap``
    and ``cut`` as in ``gae``.

    Returns:
        (advantages [B, T], value_targets [B, T]); 0 where the mask is False.
    """
    advantages, _ = gae(rewards, values, policy_mask, gamma, lambda_policy, bootstrap, cut)
    _, value_targets = gae(rewards, values, policy_mask, gamma, lambda_value, bootstrap, cut)
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
    return per_token(advantage, policy_mask)


def batch_mean_advantages(rewards: Tensor, policy_mask: Tensor, leave_one_out: bool = False) -> Tensor:
    """Advantages of one policy batch with the batch's mean reward as the baseline and no critic, broadcast over each
    rollout's policy tokens.  rewards [B], policy_mask [B, T] -> [B, T].  The batch is every rollout of one policy
    step, of any group size (the controls for a critic at G = 1):

        plain:          A_i = R_i − (1/B) · Σ_j R_j
        leave-one-out:  A_i = R_i − (1/(B−1)) · Σ_{j≠i} R_j  = B/(B−1) · (R_i − mean R)

    A batch of one has no other rollout: its leave-one-out baseline is its own reward (advantage 0), as in
    `group_mean_baseline`. (Without a baseline, REINFORCE, the advantage is `per_token(rewards, policy_mask)`.)
    """
    one_group = torch.zeros(rewards.shape, dtype=torch.long, device=rewards.device)
    return per_token(rewards - group_mean_baseline(rewards, one_group, leave_one_out), policy_mask)


def per_token(advantage: Tensor, policy_mask: Tensor) -> Tensor:
    """One advantage per rollout on each of its policy tokens, exactly 0 elsewhere.  [B], [B, T] -> [B, T]."""
    mask = policy_mask.bool()
    expanded = advantage[:, None].expand(mask.shape)
    return torch.where(mask, expanded, torch.zeros_like(expanded))


TETHER_MODES = ("group", "running")


def _group_r2(
    returns: Tensor, values: Tensor, mask: Tensor, index: Tensor, n_groups: int, min_group_var: float, fallback: float
) -> Tensor:
    """Per group g, over its policy tokens: clamp(1 − Σ(G − V)² / Σ(G − mean_g G)², 0, 1), or ``fallback`` where
    the population variance of G is ≤ ``min_group_var`` (no policy token included).  -> [n_groups]."""
    tokens = index[:, None].expand_as(mask)[mask]  # the group of every policy token
    g, v = returns[mask].double(), values[mask].double()
    zeros = torch.zeros(n_groups, dtype=torch.float64, device=returns.device)
    count = zeros.index_add(0, tokens, torch.ones_like(g))
    mean = zeros.index_add(0, tokens, g) / count.clamp(min=1)
    ss_total = zeros.index_add(0, tokens, (g - mean[tokens]) ** 2)
    ss_residual = zeros.index_add(0, tokens, (g - v) ** 2)
    informative = ss_total > min_group_var * count
    r2 = 1.0 - ss_residual / torch.where(informative, ss_total, torch.ones_like(ss_total))
    weight = torch.where(informative, r2.clamp(0.0, 1.0), torch.full_like(r2, fallback))
    return weight.to(returns.dtype)


def tether_advantages(
    rewards: Tensor,
    values: Tensor,
    group_ids: list | Tensor,
    policy_mask: Tensor,
    *,
    mode: str = "group",
    critic_ev: float | None = None,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    bootstrap: Tensor | None = None,
    cut: Tensor | None = None,
    leave_one_out: bool = False,
    min_group_var: float = 1e-6,
) -> tuple[Tensor, Tensor]:
    """TETHER: a baseline blended between the group mean and the critic by how accurate the critic is.

        b_i = group-mean baseline of rollout i (``group_mean_baseline``, optionally leave-one-out)
        Ṽ_t = w_i·V(s_t) + (1 − w_i)·b_i     at i's policy tokens, and likewise for V(s_cut) of a cut rollout
        A   = gae(R, Ṽ, γ, λ).advantages      (with λ < 1 the blend replaces V in the TD errors)
        γ = λ = 1, not cut:   A_t = R_i − (w_i·V(s_t) + (1 − w_i)·b_i)

    The weight w ∈ [0, 1] is the share of the return variance the critic explains:
      mode="running"  w = clamp(critic_ev, 0, 1) for every rollout, ``critic_ev`` being the caller's running
                      explained variance of the critic on fresh rollouts (nan, i.e. undefined, gives 0).
      mode="group"    per group g, over the policy tokens of its rollouts, G_t the λ = 1 returns (R when γ = 1):
                          R²_g = 1 − Σ_t (G_t − V(s_t))² / Σ_t (G_t − mean_g G)²,    w_g = clamp(R²_g, 0, 1)
                      R² is explained variance that also charges bias: a critic off by a constant c has EV 1
                      but would shift every advantage by −c. A group whose returns do not vary (population
                      variance ≤ ``min_group_var``: all rewards equal) says nothing about the critic and takes
                      clamp(critic_ev, 0, 1) when given, else 0 (the group-mean advantage: 0 for such a group).
      A group of one (either mode) has no group mean to blend with (its mean is its own reward, which would
      leave w·(R − V)): w = 1, the value baseline, so G = 1 is plain ``gae`` with the critic.
    (Inverse-variance weighting of the two baselines, docs/design.md §3, gives a useless critic — MSE = Var(R) —
    the weight 1/(n + 1) rather than 0, so it does not reduce to the group mean; hence this rule.)

    Limits, with γ = λ = 1, no cut and leave_one_out=False: w = 0 (R² or EV ≤ 0) is exactly
    ``grpo_advantages`` (R − mean_g R); w = 1 (a perfect critic) is exactly the value-baseline advantage
    R − V(s_t), ``gae`` with λ = 1. Value targets do not depend on the estimator: compute them from the
    critic's own values with ``advantages_and_targets``.

    Args:
        rewards [B], values [B, T] (any value off-mask), group_ids [B], policy_mask [B, T]; gamma, lam,
        bootstrap and cut as in ``gae``.

    Returns:
        (advantages [B, T], 0 off-mask;  weight [B]: the w of each rollout, to log)
    """
    if mode not in TETHER_MODES:
        raise ValueError(f"tether mode {mode!r} is unknown; choose one of {', '.join(TETHER_MODES)}")
    if mode == "running" and critic_ev is None:
        raise ValueError("tether mode 'running' needs the critic's running explained variance (critic_ev)")
    mask = policy_mask.bool()
    batch = values.shape[0]
    values = torch.where(mask, values.detach(), torch.zeros_like(values))
    rewards = _per_rollout(rewards, batch, values, "rewards")
    index, n_groups = _group_index(group_ids, rewards)
    baseline = group_mean_baseline(rewards, index, leave_one_out)
    trust = 0.0 if critic_ev is None or math.isnan(critic_ev) else min(max(float(critic_ev), 0.0), 1.0)
    if mode == "running":
        weight = torch.full_like(rewards, trust)
    else:
        _, returns = gae(rewards, values, mask, gamma, 1.0, bootstrap, cut)
        weight = _group_r2(returns, values, mask, index, n_groups, min_group_var, trust)[index]
    sizes = torch.zeros(n_groups, dtype=rewards.dtype, device=rewards.device).index_add_(
        0, index, torch.ones_like(rewards))[index]
    weight = torch.where(sizes == 1, torch.ones_like(weight), weight)  # a group of one: the value baseline
    blended = weight[:, None] * values + (1.0 - weight[:, None]) * baseline[:, None]
    if bootstrap is not None:
        bootstrap = weight * _per_rollout(bootstrap, batch, values, "bootstrap") + (1.0 - weight) * baseline
    advantages, _ = gae(rewards, blended, mask, gamma, lam, bootstrap, cut)
    return advantages, weight


def linear_mix_advantages(
    rewards: Tensor,
    values: Tensor,
    group_ids: list | Tensor,
    policy_mask: Tensor,
    *,
    alpha: float,
    gamma: float = 1.0,
    lam: float | Tensor = 1.0,
    bootstrap: Tensor | None = None,
    cut: Tensor | None = None,
    leave_one_out: bool = False,
) -> Tensor:
    """A convex blend of the group advantage and the value advantage, on every policy token.

        b_i  = group-mean baseline of rollout i (``group_mean_baseline``, optionally leave-one-out)
        A_t  = α·(R_i − b_i) + (1 − α)·GAE_t      GAE_t = gae(R, V, γ, λ).advantages at i's policy tokens

    α = 1 is the group advantage alone (``grpo_advantages`` without std, or its leave-one-out form), α = 0 the value
    advantage alone (``gae``). Unlike tether's, the weight is fixed: it does not follow the critic's accuracy. A
    rollout the critic's context cut keeps its reward in the group term (the verifier scored the whole reply) while
    GAE bootstraps with V(s_cut); the tokens after the cut are off ``policy_mask`` and get 0. A group of one has
    b_i = R_i, so only (1 − α)·GAE_t is left.

    Args:
        rewards [B], values [B, T] (any value off-mask), group_ids [B], policy_mask [B, T]; alpha in [0, 1];
        gamma, lam, bootstrap and cut as in ``gae``.

    Returns:
        advantages [B, T], 0 off-mask.
    """
    assert 0.0 <= alpha <= 1.0, f"alpha must be in [0, 1], got {alpha}"
    rewards = _per_rollout(rewards, values.shape[0], values, "rewards")
    index, _ = _group_index(group_ids, rewards)
    group_advantage = per_token(rewards - group_mean_baseline(rewards, index, leave_one_out), policy_mask)
    value_advantage, _ = gae(rewards, values, policy_mask, gamma, lam, bootstrap, cut)
    return alpha * group_advantage + (1.0 - alpha) * value_advantage

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
