"""Policy and value losses (docs/design.md §3). Token-level aggregation: sums over masked tokens of the whole
batch divided by the number of masked tokens, so every policy token weighs the same whatever its rollout's
length. An empty mask gives a zero loss (divide by max(N, 1)): a micro-batch may hold no policy token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

VALUE_LOSS_KINDS = ("mse", "huber", "bce")


def token_logprobs(logits: Tensor, token_ids: Tensor, temperature: float = 1.0) -> Tensor:
    """log π(token_t | x_{<t}) read from the logits of position t − 1.  [B, T, V], [B, T] -> [B, T] float32.

        out[:, t] = logits_{t−1}[token_t] / τ − logsumexp(logits_{t−1} / τ),   out[:, 0] = 0

    Memory: computed as gather − logsumexp (the same number as log_softmax then gather) on a float32 copy of
    ``logits[:, :-1] / τ``, so the peak is about two [B, T−1, V] float32 tensors, never a third for a full
    log_softmax output. For long sequences × large vocabularies, call it per micro-batch.
    """
    assert logits.dim() == 3 and token_ids.shape == logits.shape[:2], (
        f"logits must be [B, T, V] and token_ids [B, T]; got {tuple(logits.shape)} and {tuple(token_ids.shape)}"
    )
    assert temperature > 0, f"temperature must be > 0, got {temperature}"
    scaled = logits[:, :-1].float() / temperature  # position t−1 predicts token t
    chosen = scaled.gather(-1, token_ids[:, 1:, None].long()).squeeze(-1)
    logprobs = chosen - torch.logsumexp(scaled, dim=-1)
    return F.pad(logprobs, (1, 0), value=0.0)


def _policy_inputs(
    logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor, mask: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(mask, log ρ = l − s, A) with off-mask entries 0 and gradients only through ``logprobs``."""
    mask = mask.bool()
    assert logprobs.shape == sampling_logprobs.shape == advantages.shape == mask.shape, (
        "logprobs, sampling_logprobs, advantages and mask must share one [B, T] shape, got "
        f"{tuple(logprobs.shape)}, {tuple(sampling_logprobs.shape)}, {tuple(advantages.shape)}, {tuple(mask.shape)}"
    )
    # Select before exp: garbage off-mask would otherwise give inf forward and nan gradients.
    log_ratio = torch.where(mask, logprobs - sampling_logprobs.detach(), torch.zeros_like(logprobs))
    advantages = torch.where(mask, advantages.detach(), torch.zeros_like(advantages)).to(log_ratio.dtype)
    return mask, log_ratio, advantages


def _k3(log_ratio: Tensor) -> Tensor:
    """k3_t = exp(s_t − l_t) − (s_t − l_t) − 1 ≥ 0, the KL estimator to the sampling policy (0 at ρ = 1)."""
    return torch.exp(-log_ratio) + log_ratio - 1.0


def _masked_mean(x: Tensor, mask: Tensor, n_tokens: Tensor) -> float:
    """Σ_masked x / n_tokens as a Python float."""
    return float(torch.where(mask, x, torch.zeros_like(x)).sum() / n_tokens)


def ppo_clip_loss(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """PPO clipped surrogate against the sampling policy, token-mean over masked tokens.  [B, T] x3 + mask.

        ρ_t   = exp(l_t − s_t)                         l = current logprob, s = sampling logprob
        L_t   = −min(ρ_t·A_t, clip(ρ_t, 1 − ε_low, 1 + ε_high)·A_t)
        k3_t  = exp(s_t − l_t) − (s_t − l_t) − 1       (≥ 0, = 0 at ρ = 1; DeepSeekMath's KL estimator form)
        loss  = Σ_masked (L_t + β·k3_t) / N_masked     β = kl_coef

    Stats (Python floats over masked tokens): ``clip_fraction`` = share of tokens with ρ outside
    [1 − ε_low, 1 + ε_high] (CleanRL's definition), ``ratio_mean`` = mean ρ, ``approx_kl`` = mean k3 (the
    quantity β multiplies).
    """
    mask, log_ratio, advantages = _policy_inputs(logprobs, sampling_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    k3 = _k3(log_ratio)
    n_tokens = mask.sum().clamp(min=1)
    per_token = torch.where(mask, pg_loss + kl_coef * k3, torch.zeros_like(pg_loss))
    loss = per_token.sum() / n_tokens
    with torch.no_grad():
        outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        stats = {
            "clip_fraction": float((outside & mask).sum() / n_tokens),
            "ratio_mean": _masked_mean(ratio, mask, n_tokens),
            "approx_kl": _masked_mean(k3, mask, n_tokens),
        }
    return loss, stats


def prob_diff_mask_loss(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    delta_low: float = 0.2,
    delta_high: float = 0.2,
    kl_coef: float = 0.0,
) -> tuple[Tensor, dict[str, float]]:
    """Importance-weighted policy gradient with a probability-difference trust region (PRIME-RL's DPPO-style
    masking), token-mean over masked tokens.  [B, T] x3 + mask.

        ρ_t   = exp(l_t − s_t),   d_t = exp(l_t) − exp(s_t)        (a difference of probabilities, not a ratio)
        out_t = (A_t > 0 and d_t > δ_high)  or  (A_t < 0 and d_t < −δ_low)
        L_t   = −ρ_t·A_t  where not out_t,  0 where out_t          (∇L_t = −ρ_t·A_t·∇l_t)
        loss  = Σ_masked (L_t + β·k3_t) / N_masked                 (k3 and β as in ``ppo_clip_loss``)

    A token is dropped only when its advantage would push it further out of the region: a token whose
    probability already rose by more than δ_high gets no more push up from A > 0, but A < 0 still pulls it
    back, and symmetrically below. Unlike ratio clipping, a rare token that moved little in probability
    (π_s = 0.01 → π = 0.05, ρ = 5) keeps its gradient. Dropped tokens still count in N_masked.

    Stats (Python floats over masked tokens): ``masked_fraction`` (share of tokens dropped),
    ``masked_high_fraction`` (dropped with A > 0), ``masked_low_fraction`` (dropped with A < 0),
    ``ratio_mean``, ``approx_kl`` (mean k3).
    """
    mask, log_ratio, advantages = _policy_inputs(logprobs, sampling_logprobs, advantages, mask)
    ratio = torch.exp(log_ratio)
    with torch.no_grad():
        # d = exp(l) − exp(s) = exp(s)·(ρ − 1), with s read where the mask is True only (garbage elsewhere)
        sampling_probs = torch.exp(torch.where(mask, sampling_logprobs, torch.zeros_like(log_ratio)))
        prob_diff = sampling_probs * (ratio - 1.0)
        out_high = (advantages > 0) & (prob_diff > delta_high) & mask
        out_low = (advantages < 0) & (prob_diff < -delta_low) & mask
        keep = mask & ~(out_high | out_low)
    pg_loss = torch.where(keep, -ratio * advantages, torch.zeros_like(ratio))
    k3 = _k3(log_ratio)
    n_tokens = mask.sum().clamp(min=1)
    loss = torch.where(mask, pg_loss + kl_coef * k3, torch.zeros_like(pg_loss)).sum() / n_tokens
    with torch.no_grad():
        stats = {
            "masked_fraction": float((out_high | out_low).sum() / n_tokens),
            "masked_high_fraction": float(out_high.sum() / n_tokens),
            "masked_low_fraction": float(out_low.sum() / n_tokens),
            "ratio_mean": _masked_mean(ratio, mask, n_tokens),
            "approx_kl": _masked_mean(k3, mask, n_tokens),
        }
    return loss, stats


def logprob_shift_sums(before: Tensor, after: Tensor, advantages: Tensor, mask: Tensor) -> dict[str, float]:
    """The sums behind `direction_gap` for one micro-batch.  [B, T] x3 + mask.

        Δl_t = after_t − before_t            (a token's logprob after the step minus before it, same batch)
        shift_pos_sum = Σ_{masked, A_t > 0} Δl_t,   pos_tokens = #{masked, A_t > 0}
        shift_neg_sum = Σ_{masked, A_t < 0} Δl_t,   neg_tokens = #{masked, A_t < 0}

    Sums, not means, so micro-batches and ranks add up (`prime_values.dist.all_reduce_sum`)."""
    mask = mask.bool()
    delta = (after.float() - before.float()).detach()
    pos, neg = mask & (advantages > 0), mask & (advantages < 0)
    return {"shift_pos_sum": float(delta[pos].sum()), "pos_tokens": float(pos.sum()),
            "shift_neg_sum": float(delta[neg].sum()), "neg_tokens": float(neg.sum())}


def direction_gap(sums: dict[str, float]) -> dict[str, float]:
    """The direction diagnostic of one policy step from `logprob_shift_sums` summed over the batch:

        logprob_shift_pos = mean Δl over tokens with A > 0,  logprob_shift_neg = mean Δl over tokens with A < 0
        direction_gap     = logprob_shift_pos − logprob_shift_neg

    A policy-gradient step on −Σ A_t·l_t raises the logprob of positive-advantage tokens and lowers that of
    negative-advantage ones, so a correct step has direction_gap > 0; a flipped sign gives < 0. Hand-worked: Δl
    = [0.2, 0.4] on two A > 0 tokens and [−0.1] on one A < 0 token: shift_pos 0.3, shift_neg −0.1, gap 0.4.
    With no token on one side the gap is undefined and only the defined shift is returned."""
    out = {}
    if sums["pos_tokens"]:
        out["logprob_shift_pos"] = sums["shift_pos_sum"] / sums["pos_tokens"]
    if sums["neg_tokens"]:
        out["logprob_shift_neg"] = sums["shift_neg_sum"] / sums["neg_tokens"]
    if len(out) == 2:
        out["direction_gap"] = out["logprob_shift_pos"] - out["logprob_shift_neg"]
    return out


def values_from_head(pred: Tensor, kind: str = "mse") -> Tensor:
    """The value a critic head's output stands for: sigmoid(logit) for ``kind="bce"``, the output itself else."""
    return torch.sigmoid(pred) if kind == "bce" else pred


def value_loss(
    pred: Tensor,
    targets: Tensor,
    mask: Tensor,
    kind: str = "mse",
    huber_delta: float = 1.0,
    old_values: Tensor | None = None,
    clip_range: float | None = None,
    with_stats: bool = False,
) -> Tensor | tuple[Tensor, dict[str, float]]:
    """Regression of values on value targets, token-mean over masked tokens.  [B, T] x2 + mask -> scalar.

        e_t = pred_t − target_t
        mse:    ℓ(e) = ½·e²                                   (gradient e)
        huber:  ℓ(e) = ½·e²  if |e| ≤ δ  else  δ·(|e| − ½δ)
        bce:    pred are logits x of a sigmoid head, value = σ(x) (``values_from_head``), targets y ∈ [0, 1]
                (as for {0, 1} rewards with γ = 1):  ℓ_t = −y·log σ(x) − (1 − y)·log(1 − σ(x))  (gradient σ(x) − y)
        loss  = Σ_masked ℓ_t / N_masked

    The ½ makes "mse" identical to "huber" inside |e| ≤ δ, so switching kind changes only the outliers.

    Value clipping (mse and huber; ``old_values`` = the prediction recorded at scoring time, ``clip_range`` = ε):
        v^clip_t = old_t + clip(pred_t − old_t, −ε, ε),   ℓ_t = max(ℓ(pred_t − target_t), ℓ(v^clip_t − target_t))
    (PPO's value clipping: a token whose prediction already moved more than ε from the scored one, in the
    direction that lowers its error, gets no further gradient; one that moved the other way is pulled back.)

    ``with_stats=True`` returns (loss, stats) with ``clip_fraction`` = share of masked tokens where the
    clipped error is the strictly larger one (0 without clipping).
    """
    if kind not in VALUE_LOSS_KINDS:
        raise ValueError(f"value loss kind {kind!r} is unknown; choose one of {', '.join(VALUE_LOSS_KINDS)}")
    if (old_values is None) != (clip_range is None):
        raise ValueError("value clipping needs both old_values and clip_range (or neither)")
    if clip_range is not None and kind == "bce":
        raise ValueError("value clipping is defined for kind 'mse' and 'huber', not 'bce'")
    if clip_range is not None and clip_range <= 0:
        raise ValueError(f"clip_range must be > 0 (None turns clipping off), got {clip_range}")
    mask = mask.bool()
    assert pred.shape == targets.shape == mask.shape, (
        f"pred {tuple(pred.shape)}, targets {tuple(targets.shape)} and mask {tuple(mask.shape)} must match"
    )
    zeros = torch.zeros_like(pred)
    pred = torch.where(mask, pred, zeros)
    targets = torch.where(mask, targets.detach(), zeros)
    n_tokens = mask.sum().clamp(min=1)
    clipped_larger = torch.zeros_like(mask)
    if kind == "bce":
        if ((targets < 0) | (targets > 1)).any():
            raise ValueError("value loss 'bce' needs targets in [0, 1] (a sigmoid head predicts a probability)")
        per_token = F.binary_cross_entropy_with_logits(pred, targets, reduction="none")
    else:
        per_token = _regression(pred - targets, kind, huber_delta)
        if clip_range is not None:
            old = torch.where(mask, old_values.detach(), zeros)
            clipped = old + (pred - old).clamp(-clip_range, clip_range)
            clipped_loss = _regression(clipped - targets, kind, huber_delta)
            clipped_larger = clipped_loss > per_token
            per_token = torch.maximum(per_token, clipped_loss)
    loss = torch.where(mask, per_token, zeros).sum() / n_tokens
    if not with_stats:
        return loss
    return loss, {"clip_fraction": float((clipped_larger & mask).sum() / n_tokens)}


def _regression(error: Tensor, kind: str, huber_delta: float) -> Tensor:
    """ℓ(e) per token for kind "mse" or "huber" (see ``value_loss``)."""
    if kind == "mse":
        return 0.5 * error**2
    abs_error = error.abs()
    return torch.where(abs_error <= huber_delta, 0.5 * error**2, huber_delta * (abs_error - 0.5 * huber_delta))
