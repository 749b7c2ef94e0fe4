"""Policy and value losses (DESIGN.md §3). Token-level aggregation: sums over masked tokens of the whole
batch divided by the number of masked tokens, so every policy token weighs the same whatever its rollout's
length. An empty mask gives a zero loss (divide by max(N, 1)): a micro-batch may hold no policy token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

VALUE_LOSS_KINDS = ("mse", "huber")


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
    mask = mask.bool()
    assert logprobs.shape == sampling_logprobs.shape == advantages.shape == mask.shape, (
        "logprobs, sampling_logprobs, advantages and mask must share one [B, T] shape, got "
        f"{tuple(logprobs.shape)}, {tuple(sampling_logprobs.shape)}, {tuple(advantages.shape)}, {tuple(mask.shape)}"
    )
    # Select before exp: garbage off-mask would otherwise give inf forward and nan gradients.
    log_ratio = torch.where(mask, logprobs - sampling_logprobs.detach(), torch.zeros_like(logprobs))
    advantages = torch.where(mask, advantages.detach(), torch.zeros_like(advantages)).to(log_ratio.dtype)
    ratio = torch.exp(log_ratio)
    clipped_ratio = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    pg_loss = -torch.min(ratio * advantages, clipped_ratio * advantages)
    k3 = torch.exp(-log_ratio) + log_ratio - 1.0  # s − l = −log_ratio
    n_tokens = mask.sum().clamp(min=1)
    per_token = torch.where(mask, pg_loss + kl_coef * k3, torch.zeros_like(pg_loss))
    loss = per_token.sum() / n_tokens
    with torch.no_grad():
        outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        stats = {
            "clip_fraction": float((outside & mask).sum() / n_tokens),
            "ratio_mean": float(torch.where(mask, ratio, torch.zeros_like(ratio)).sum() / n_tokens),
            "approx_kl": float(torch.where(mask, k3, torch.zeros_like(k3)).sum() / n_tokens),
        }
    return loss, stats


def value_loss(
    pred: Tensor,
    targets: Tensor,
    mask: Tensor,
    kind: str = "mse",
    huber_delta: float = 1.0,
) -> Tensor:
    """Regression of values on value targets, token-mean over masked tokens.  [B, T] x2 + mask -> scalar.

        e_t = pred_t − target_t
        mse:    ℓ_t = ½·e_t²                                   (gradient e_t)
        huber:  ℓ_t = ½·e_t²  if |e_t| ≤ δ  else  δ·(|e_t| − ½δ)
        loss  = Σ_masked ℓ_t / N_masked

    The ½ makes "mse" identical to "huber" inside |e| ≤ δ, so switching kind changes only the outliers.
    """
    if kind not in VALUE_LOSS_KINDS:
        raise ValueError(f"value loss kind {kind!r} is unknown; choose one of {', '.join(VALUE_LOSS_KINDS)}")
    mask = mask.bool()
    assert pred.shape == targets.shape == mask.shape, (
        f"pred {tuple(pred.shape)}, targets {tuple(targets.shape)} and mask {tuple(mask.shape)} must match"
    )
    error = torch.where(mask, pred - targets.detach(), torch.zeros_like(pred))
    if kind == "mse":
        per_token = 0.5 * error**2
    else:
        abs_error = error.abs()
        per_token = torch.where(
            abs_error <= huber_delta, 0.5 * error**2, huber_delta * (abs_error - 0.5 * huber_delta)
        )
    return per_token.sum() / mask.sum().clamp(min=1)
