"""token_logprobs, PPO clip and probability-difference masking losses with k3 KL, value losses (mse, huber,
clipped, bce): hand-worked numbers and gradients, and per-token reference loops on random inputs.

Tolerances: the defaults throughout (pytest.approx: 1e-6 relative; torch.testing.assert_close: 1.3e-6 relative +
1e-5 absolute for float32, 1e-7 for float64). Each value here is a handful (<= 8) of float32 operations on inputs
of order 1, so it is within 8 eps32 / 2 = 4.8e-7 relative of the exact number whatever order or vector width a
CPU sums in; a wrong clip, mask or coefficient is off by far more."""

import math

import pytest
import torch
import torch.nn.functional as F

from prime_values.algo.losses import (
    direction_gap,
    logprob_shift_sums,
    ppo_clip_loss,
    prob_diff_mask_loss,
    token_logprobs,
    value_loss,
    values_from_head,
)

LN3 = math.log(3.0)


def test_token_logprobs_hand_worked_with_temperature_and_shift():
    # Vocabulary of 2, sequence of 3 tokens [0, 1, 0].
    # position 0 logits [0, 2·ln3], τ = 2 → [0, ln3] → p = (1/4, 3/4); token 1 is read here: log(3/4)
    # position 1 logits [0, 0] → p = (1/2, 1/2); token 2 (id 0): log(1/2)
    # position 2 logits predict nothing (no token 3); position 0 gets 0.
    logits = torch.tensor([[[0.0, 2 * LN3], [0.0, 0.0], [100.0, -100.0]]], requires_grad=True)
    token_ids = torch.tensor([[0, 1, 0]])
    got = token_logprobs(logits, token_ids, temperature=2.0)
    torch.testing.assert_close(got, torch.tensor([[0.0, math.log(0.75), math.log(0.5)]]))
    got.sum().backward()  # gradients reach the logits; the last position's logits get none
    assert logits.grad[0, 0].abs().sum() > 0 and (logits.grad[0, 2] == 0).all()


def test_token_logprobs_matches_log_softmax_gather_in_float32_for_bf16_logits():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 7, generator=g).to(torch.bfloat16)
    token_ids = torch.randint(0, 7, (2, 5), generator=g)
    want = F.log_softmax(logits[:, :-1].float() / 0.7, -1).gather(-1, token_ids[:, 1:, None]).squeeze(-1)
    got = token_logprobs(logits, token_ids, temperature=0.7)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got[:, 1:], want)
    assert (got[:, 0] == 0).all()


# Three policy tokens with ratios ρ = 1.5, 0.5, 1.0 and A = 1, −1, 2; a fourth token off-mask with garbage.
SAMPLING = torch.tensor([[-1.0, -1.0, -1.0, -50.0]])
ADVANTAGES = torch.tensor([[1.0, -1.0, 2.0, 1e6]])
MASK = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)


def current_logprobs():
    log_ratio = torch.tensor([[math.log(1.5), math.log(0.5), 0.0, 0.0]])
    logprobs = SAMPLING + log_ratio
    logprobs[0, 3] = 50.0  # exp(100) off-mask must not matter
    return logprobs.requires_grad_(True)


def test_ppo_clip_loss_hand_worked():
    # ε = 0.2 both sides:
    # t0: min(1.5·1, 1.2·1) = 1.2       → −1.2
    # t1: min(0.5·−1, 0.8·−1) = −0.8    → 0.8
    # t2: min(1·2, 1·2) = 2             → −2
    # loss = (−1.2 + 0.8 − 2)/3 = −0.8; clipped ratios: t0, t1 → clip_fraction 2/3; ratio_mean = 3/3 = 1
    logprobs = current_logprobs()
    loss, stats = ppo_clip_loss(logprobs, SAMPLING, ADVANTAGES, MASK)
    assert loss.item() == pytest.approx(-0.8)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)
    assert stats["ratio_mean"] == pytest.approx(1.0)
    # Gradient: clipped tokens (t0 with A > 0 above 1 + ε, t1 with A < 0 below 1 − ε) get none;
    # t2: d/dl [−ρ·A/3] = −ρ·A/3 = −2/3. Off-mask: none, and no nan from exp(100).
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -2 / 3, 0.0]]))


def test_ppo_clip_loss_asymmetric_clip():
    # ε_high = 0.28: t0 becomes min(1.5, 1.28) = 1.28 → loss = (−1.28 + 0.8 − 2)/3 = −2.48/3
    loss, _ = ppo_clip_loss(current_logprobs(), SAMPLING, ADVANTAGES, MASK, clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-2.48 / 3)


def test_ppo_clip_loss_k3_kl_term():
    # k3 = exp(s − l) − (s − l) − 1, s − l = −ln ρ:
    # t0: 1/1.5 + ln 1.5 − 1 = ln 1.5 − 1/3 ≈ 0.0721318
    # t1: 2 − ln 2 − 1 = 1 − ln 2          ≈ 0.3068528
    # t2: 0
    # approx_kl = (0.0721318 + 0.3068528)/3 ≈ 0.1263282; loss = −0.8 + 0.5·approx_kl
    k3_mean = (math.log(1.5) - 1 / 3 + 1 - math.log(2.0)) / 3
    loss, stats = ppo_clip_loss(current_logprobs(), SAMPLING, ADVANTAGES, MASK, kl_coef=0.5)
    assert stats["approx_kl"] == pytest.approx(k3_mean)
    assert loss.item() == pytest.approx(-0.8 + 0.5 * k3_mean)


def test_ppo_clip_loss_empty_mask_is_zero_not_nan():
    loss, stats = ppo_clip_loss(current_logprobs(), SAMPLING, ADVANTAGES, torch.zeros_like(MASK))
    assert loss.item() == 0.0 and stats["clip_fraction"] == 0.0


PRED = torch.tensor([[1.0, 2.0, 5.0, float("nan")]])
TARGETS = torch.tensor([[0.0, 2.0, 2.0, 1e9]])


def test_value_loss_mse_hand_worked():
    # e = (1, 0, 3); ½·(1 + 0 + 9)/3 = 5/3
    pred = PRED.clone().requires_grad_(True)
    loss = value_loss(pred, TARGETS, MASK, kind="mse")
    assert loss.item() == pytest.approx(5 / 3)
    loss.backward()  # d/dpred = e/3
    torch.testing.assert_close(pred.grad, torch.tensor([[1 / 3, 0.0, 1.0, 0.0]]))


def test_value_loss_huber_hand_worked():
    # δ = 1: |1| ≤ 1 → ½; 0 → 0; |3| > 1 → 1·(3 − ½) = 2.5; mean = 3/3 = 1
    assert value_loss(PRED, TARGETS, MASK, kind="huber", huber_delta=1.0).item() == pytest.approx(1.0)
    # δ = 4: all quadratic → equals mse 5/3 (and torch's huber_loss)
    assert value_loss(PRED, TARGETS, MASK, kind="huber", huber_delta=4.0).item() == pytest.approx(5 / 3)
    want = F.huber_loss(PRED[MASK], TARGETS[MASK], delta=1.0)
    assert value_loss(PRED, TARGETS, MASK, kind="huber").item() == pytest.approx(want.item())


def test_value_loss_unknown_kind_names_the_choices():
    with pytest.raises(ValueError, match="mse, huber"):
        value_loss(PRED, TARGETS, MASK, kind="l1")


# Probability-difference masking: five policy tokens and one off-mask token with garbage.
#   t   π_s    π      d = π − π_s   ρ = π/π_s   A     δ = 0.2
#   0   0.5    0.8    +0.3          1.6         +1    A > 0 and d > δ_high    → dropped (masked high)
#   1   0.5    0.2    −0.3          0.4         −1    A < 0 and d < −δ_low    → dropped (masked low)
#   2   0.5    0.6    +0.1          1.2         +2    inside                  → L = −1.2·2 = −2.4
#   3   0.5    0.8    +0.3          1.6         −1    outside, but A pulls it back → kept, L = −1.6·(−1) = +1.6
#   4   0.01   0.05   +0.04         5           +1    rare token, small move  → kept, L = −5 (PPO would clip at 1.2)
PD_SAMPLING_PROBS = torch.tensor([[0.5, 0.5, 0.5, 0.5, 0.01, 1.0]], dtype=torch.float64)
PD_PROBS = torch.tensor([[0.8, 0.2, 0.6, 0.8, 0.05, 1.0]], dtype=torch.float64)
PD_ADVANTAGES = torch.tensor([[1.0, -1.0, 2.0, -1.0, 1.0, 1e6]], dtype=torch.float64)
PD_MASK = torch.tensor([[1, 1, 1, 1, 1, 0]], dtype=torch.bool)


def pd_logprobs():
    logprobs = PD_PROBS.log()
    logprobs[0, 5] = 80.0  # exp(80) off-mask must not matter
    return logprobs.requires_grad_(True)


def test_prob_diff_mask_loss_hand_worked():
    logprobs = pd_logprobs()
    loss, stats = prob_diff_mask_loss(logprobs, PD_SAMPLING_PROBS.log(), PD_ADVANTAGES, PD_MASK)
    # loss = (0 + 0 − 2.4 + 1.6 − 5)/5 = −5.8/5 = −1.16 (dropped tokens still count in N = 5)
    assert loss.item() == pytest.approx(-1.16)
    assert stats["masked_fraction"] == pytest.approx(2 / 5)
    assert stats["masked_high_fraction"] == pytest.approx(1 / 5)
    assert stats["masked_low_fraction"] == pytest.approx(1 / 5)
    assert stats["ratio_mean"] == pytest.approx((1.6 + 0.4 + 1.2 + 1.6 + 5.0) / 5)
    # ∂L_t/∂l_t = −ρ_t·A_t / N: t2 −2.4/5 = −0.48, t3 1.6/5 = 0.32, t4 −5/5 = −1; dropped and off-mask: 0
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([[0.0, 0.0, -0.48, 0.32, -1.0, 0.0]], dtype=torch.float64))


def test_prob_diff_mask_loss_thresholds_and_kl():
    # δ_high = 0.35 lets t0 (d = 0.3) back in: loss = (−1.6 − 2.4 + 1.6 − 5)/5 = −7.4/5; δ_low = 0.35 lets t1
    # (d = −0.3, ρ = 0.4, A = −1: L = +0.4) back in too: −7.0/5
    sampling = PD_SAMPLING_PROBS.log()
    loss, stats = prob_diff_mask_loss(pd_logprobs(), sampling, PD_ADVANTAGES, PD_MASK, delta_high=0.35)
    assert loss.item() == pytest.approx(-7.4 / 5) and stats["masked_fraction"] == pytest.approx(1 / 5)
    loss, stats = prob_diff_mask_loss(pd_logprobs(), sampling, PD_ADVANTAGES, PD_MASK, delta_low=0.35, delta_high=0.35)
    assert loss.item() == pytest.approx(-7.0 / 5) and stats["masked_fraction"] == 0.0
    # KL: k3 = 1/ρ + ln ρ − 1 over the five policy tokens, dropped ones included; β = 0.1
    k3 = [1 / r + math.log(r) - 1 for r in (1.6, 0.4, 1.2, 1.6, 5.0)]
    loss, stats = prob_diff_mask_loss(pd_logprobs(), sampling, PD_ADVANTAGES, PD_MASK, kl_coef=0.1)
    assert stats["approx_kl"] == pytest.approx(sum(k3) / 5)
    assert loss.item() == pytest.approx(-1.16 + 0.1 * sum(k3) / 5)


def test_prob_diff_mask_loss_empty_mask_is_zero_not_nan():
    loss, stats = prob_diff_mask_loss(pd_logprobs(), PD_SAMPLING_PROBS.log(), PD_ADVANTAGES, torch.zeros_like(PD_MASK))
    assert loss.item() == 0.0 and stats["masked_fraction"] == 0.0


def policy_loss_reference(logprobs, sampling, advantages, mask, trust_region, low, high, kl_coef):
    """Per-token loop in Python floats; returns (loss, d loss / d logprobs)."""
    n = int(mask.sum())
    grad = torch.zeros_like(logprobs)
    total = 0.0
    for b in range(logprobs.shape[0]):
        for t in range(logprobs.shape[1]):
            if not mask[b, t]:
                continue
            lp, s, a = float(logprobs[b, t]), float(sampling[b, t]), float(advantages[b, t])
            rho = math.exp(lp - s)
            if trust_region == "clip":
                clipped = min(max(rho, 1 - low), 1 + high)
                surrogate = min(rho * a, clipped * a)
                active = rho * a <= clipped * a  # the unclipped term is the min: gradient flows
            else:
                d = math.exp(lp) - math.exp(s)
                dropped = (a > 0 and d > high) or (a < 0 and d < -low)
                surrogate, active = (0.0, False) if dropped else (rho * a, True)
            k3 = math.exp(s - lp) - (s - lp) - 1
            total += -surrogate + kl_coef * k3
            grad[b, t] = (-rho * a if active else 0.0) + kl_coef * (1 - math.exp(s - lp))
    return total / max(n, 1), grad / max(n, 1)


@pytest.mark.parametrize("trust_region", ["clip", "prob_diff"])
@pytest.mark.parametrize("seed", range(3))
def test_policy_losses_match_per_token_reference(trust_region, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (4, 9)
    sampling = torch.log(torch.rand(shape, generator=g, dtype=torch.float64) * 0.98 + 0.01)
    logprobs = (sampling + torch.randn(shape, generator=g, dtype=torch.float64) * 0.5).clamp(max=0.0)
    advantages = torch.randn(shape, generator=g, dtype=torch.float64)
    mask = torch.rand(shape, generator=g) < 0.7
    low, high, kl_coef = 0.2, 0.28, 0.05
    fn = ppo_clip_loss if trust_region == "clip" else prob_diff_mask_loss
    bounds = dict(clip_low=low, clip_high=high) if trust_region == "clip" else dict(delta_low=low, delta_high=high)
    logprobs.requires_grad_(True)
    loss, _ = fn(logprobs, sampling, advantages, mask, kl_coef=kl_coef, **bounds)
    loss.backward()
    want_loss, want_grad = policy_loss_reference(logprobs.detach(), sampling, advantages, mask, trust_region, low,
                                                 high, kl_coef)
    assert loss.item() == pytest.approx(want_loss)
    torch.testing.assert_close(logprobs.grad, want_grad)


OLD = torch.tensor([[0.5, 2.5, 4.0, float("nan")]])


def test_value_loss_clipped_against_scored_prediction_hand_worked():
    # pred (1, 2, 5), old (0.5, 2.5, 4), target (0, 2, 2), ε = 0.2, mse:
    # t0: clip = 0.5 + clip(0.5) = 0.7;  ½·1² = 0.5  vs ½·0.7² = 0.245  → 0.5   (unclipped: gradient e = 1)
    # t1: clip = 2.5 + clip(−0.5) = 2.3; ½·0² = 0    vs ½·0.3² = 0.045  → 0.045 (clipped: no gradient)
    # t2: clip = 4 + clip(1) = 4.2;      ½·3² = 4.5  vs ½·2.2² = 2.42   → 4.5   (unclipped: gradient e = 3)
    # loss = (0.5 + 0.045 + 4.5)/3 = 5.045/3; clip_fraction = 1/3
    pred = PRED.clone().requires_grad_(True)
    loss, stats = value_loss(pred, TARGETS, MASK, old_values=OLD, clip_range=0.2, with_stats=True)
    assert loss.item() == pytest.approx(5.045 / 3)
    assert stats["clip_fraction"] == pytest.approx(1 / 3)
    loss.backward()
    torch.testing.assert_close(pred.grad, torch.tensor([[1 / 3, 0.0, 1.0, 0.0]]))
    # huber, δ = 1: t0 ½ vs ½·0.49 → 0.5; t1 0 vs 0.045 → 0.045; t2 1·(3 − ½) = 2.5 vs 1·(2.2 − ½) = 1.7 → 2.5
    loss = value_loss(PRED, TARGETS, MASK, kind="huber", old_values=OLD, clip_range=0.2)
    assert loss.item() == pytest.approx(3.045 / 3)
    # without clipping the stats say 0
    _, stats = value_loss(PRED, TARGETS, MASK, with_stats=True)
    assert stats["clip_fraction"] == 0.0


def test_value_loss_bce_head_hand_worked():
    # logits (0, ln 3, ln 3), targets (1, 1, 0): σ = (1/2, 3/4, 3/4)
    # ℓ = (−ln ½, −ln ¾, −ln ¼) = (ln 2, ln 4/3, ln 4); loss = ln(2·4/3·4)/3 = ln(32/3)/3
    logits = torch.tensor([[0.0, LN3, LN3, float("nan")]], requires_grad=True)
    targets = torch.tensor([[1.0, 1.0, 0.0, 7.0]])  # 7 off-mask is never checked nor read
    loss = value_loss(logits, targets, MASK, kind="bce")
    assert loss.item() == pytest.approx(math.log(32 / 3) / 3)
    loss.backward()  # (σ − y)/3 = (−1/2, −1/4, 3/4)/3
    torch.testing.assert_close(logits.grad, torch.tensor([[-0.5 / 3, -0.25 / 3, 0.75 / 3, 0.0]]))
    torch.testing.assert_close(values_from_head(logits.detach()[:, :3], "bce"), torch.tensor([[0.5, 0.75, 0.75]]))
    assert values_from_head(PRED, "mse") is PRED


def test_value_loss_rejects_inconsistent_options():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        value_loss(PRED, TARGETS, MASK, kind="bce")  # target 2 on a policy token
    with pytest.raises(ValueError, match="not 'bce'"):
        value_loss(PRED, TARGETS.clamp(0, 1), MASK, kind="bce", old_values=OLD, clip_range=0.2)
    with pytest.raises(ValueError, match="both"):
        value_loss(PRED, TARGETS, MASK, old_values=OLD)
    with pytest.raises(ValueError, match="> 0"):
        value_loss(PRED, TARGETS, MASK, old_values=OLD, clip_range=0.0)


def value_loss_reference(pred, targets, mask, kind, delta, old, clip_range):
    total, n = 0.0, int(mask.sum())
    for p, y, o, m in zip(pred.flatten().tolist(), targets.flatten().tolist(), old.flatten().tolist(),
                          mask.flatten().tolist()):
        if not m:
            continue
        if kind == "bce":
            s = 1 / (1 + math.exp(-p))
            total += -(y * math.log(s) + (1 - y) * math.log(1 - s))
            continue

        def loss(e):
            return 0.5 * e * e if kind == "mse" or abs(e) <= delta else delta * (abs(e) - 0.5 * delta)

        value = loss(p - y)
        if clip_range is not None:
            value = max(value, loss(o + min(max(p - o, -clip_range), clip_range) - y))
        total += value
    return total / max(n, 1)


@pytest.mark.parametrize("kind,clip_range", [("mse", None), ("mse", 0.1), ("huber", None), ("huber", 0.3),
                                             ("bce", None)])
def test_value_loss_matches_per_token_reference(kind, clip_range):
    g = torch.Generator().manual_seed(7)
    pred = torch.randn(3, 8, generator=g, dtype=torch.float64) * 2
    targets = torch.rand(3, 8, generator=g, dtype=torch.float64) * (1 if kind == "bce" else 3)
    old = pred + torch.randn(3, 8, generator=g, dtype=torch.float64) * 0.3
    mask = torch.rand(3, 8, generator=g) < 0.7
    loss = value_loss(pred, targets, mask, kind=kind, huber_delta=0.8,
                      old_values=old if clip_range else None, clip_range=clip_range)
    assert loss.item() == pytest.approx(value_loss_reference(pred, targets, mask, kind, 0.8, old, clip_range))


def test_direction_gap_hand_worked_and_sums_add_over_micro_batches():
    # Δl = after − before: [0.2, 0.4] on the A > 0 tokens, −0.1 on the A < 0 one; the A = 0 token, the unmasked
    # token (whose Δl is huge) and the zero-advantage token count on neither side.
    before = torch.zeros(1, 6)
    after = torch.tensor([[0.2, 0.4, -0.1, 5.0, 7.0, 0.3]])
    advantages = torch.tensor([[1.0, 0.5, -2.0, 0.0, 3.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0, 1]], dtype=torch.bool)
    sums = logprob_shift_sums(before, after, advantages, mask)
    assert sums == pytest.approx({"shift_pos_sum": 0.6, "pos_tokens": 2, "shift_neg_sum": -0.1, "neg_tokens": 1})
    assert direction_gap(sums) == pytest.approx({"logprob_shift_pos": 0.3, "logprob_shift_neg": -0.1,
                                                 "direction_gap": 0.4})
    # split into two micro-batches, the summed sums give the same figures (means over all tokens, not of means)
    halves = [logprob_shift_sums(before[:, s], after[:, s], advantages[:, s], mask[:, s])
              for s in (slice(0, 1), slice(1, 6))]
    summed = {k: halves[0][k] + halves[1][k] for k in sums}
    assert direction_gap(summed) == pytest.approx(direction_gap(sums))
    # a flipped update (every Δl negated) flips the gap's sign
    assert direction_gap(logprob_shift_sums(before, -after, advantages, mask))["direction_gap"] == pytest.approx(-0.4)


def test_direction_gap_is_undefined_without_tokens_on_both_sides():
    sums = logprob_shift_sums(torch.zeros(1, 3), torch.tensor([[0.1, 0.2, 0.3]]), torch.tensor([[1.0, 1.0, 0.0]]),
                              torch.ones(1, 3, dtype=torch.bool))
    assert direction_gap(sums) == pytest.approx({"logprob_shift_pos": 0.15})
