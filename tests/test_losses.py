"""token_logprobs, PPO clip loss with k3 KL, value loss: hand-worked numbers and gradients."""

import math

import pytest
import torch
import torch.nn.functional as F

from prime_values.algo.losses import ppo_clip_loss, token_logprobs, value_loss

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
