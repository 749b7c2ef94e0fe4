"""The policy trainer's step (roles/policy_trainer.py train_step) on a tiny real model: which two logprobs the
importance ratio compares, the sampling temperature in the trainer's logprobs, and the direction diagnostic
(`direction_gap`: positive for a correct update, negative for a flipped one).

Each batch here is on-policy by construction: its sampling logprobs are the model's own teacher-forced logprobs
at the configured temperature, so the ratio is 1 up to float32 rounding (~1e-6 for these O(1) logits) unless the
wiring reads a different pair of logprobs or a different temperature."""

from __future__ import annotations

import math

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.algo.losses import token_logprobs
from prime_values.config import Config
from prime_values.roles import policy_trainer
from tests.policy_batches import ARCH, policy_rows


def setup(temperature: float = 1.0, lr: float = 1e-3, **policy):
    from prime_values.models import build_char_tokenizer, build_tiny_policy

    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, **ARCH).train()
    cfg = OmegaConf.structured(Config)
    cfg.inference.temperature = temperature
    cfg.policy.lr = lr
    for key, value in policy.items():
        cfg.policy[key] = value
    return tok, model, cfg


def batch(model, tok, temperature: float, n: int = 8, shift: float = 0.0) -> list[dict]:
    """`n` rollouts (tests/models/test_mixed_precision.py's: prompt, then response = policy tokens) with the model's own
    logprobs at `temperature` plus `shift` as their sampling logprobs; rollout i has advantage +1 (even i) or -1
    (odd i) on every policy token."""
    rows = policy_rows(model, tok, n)
    for i, row in enumerate(rows):
        ids, mask = torch.tensor(row["token_ids"]), row["policy_mask"]
        with torch.no_grad():
            own = token_logprobs(model(input_ids=ids[None]).logits.float(), ids[None], temperature)[0]
        row["sampling_logprobs"] = [(x + shift) * m for x, m in zip(own.tolist(), mask)]
        row["advantages"] = [(1.0 if i % 2 == 0 else -1.0) * m for m in mask]
    return rows


def step(model, tok, cfg, rows) -> dict:
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.policy.lr, weight_decay=0.0)
    return policy_trainer.train_step(model, optimizer, rows, cfg, tok.pad_token_id, "cpu")


def test_ratio_compares_the_trainers_logprobs_with_the_sampling_ones():
    # sampling logprobs = the trainer's + 0.25 on every policy token: rho = exp(l - s) = exp(-0.25) exactly. Reading
    # the trainer's logprobs twice gives 1, swapping the two gives exp(+0.25), the prompt's zeros give far off.
    tok, model, cfg = setup()
    stats = step(model, tok, cfg, batch(model, tok, 1.0, shift=0.25))
    assert stats["ratio_mean"] == pytest.approx(math.exp(-0.25), abs=1e-5)


@pytest.mark.parametrize("temperature", [0.7, 1.6])
def test_trainer_logprobs_use_the_sampling_temperature(temperature):
    # sampled at T: the trainer's logprobs at T give ratio 1 and k3 = 0 up to rounding (k3 ~ (l - s)^2 / 2 ~ 1e-12);
    # the trainer's logprobs at T = 1 instead differ from them by |1/T - 1| x the (small, untrained) logits, a
    # k3 of ~1e-3 (measured 2.8e-3 and 2.1e-3 at T = 0.7 / 1.6), far above 1e-6
    tok, model, cfg = setup(temperature)
    stats = step(model, tok, cfg, batch(model, tok, temperature))
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["approx_kl"] < 1e-7
    _, model1, cfg1 = setup(1.0)
    off = step(model1, tok, cfg1, batch(model1, tok, temperature))
    assert off["approx_kl"] > 1e-6, "the check above cannot tell the temperatures apart"


@pytest.mark.parametrize("pack", [True, False])
def test_packed_and_padded_trainer_logprobs_both_use_the_sampling_temperature(pack):
    # the temperature test above on 40 rollouts of 7-14 tokens, which policy.pack_sequences packs (Packing.gainful:
    # 7 lines of 64 positions against 40 x 14 padded); sampled at T = 0.7, the recipes/smollm.md temperature
    from prime_values.critic_io import Packing

    tok, model, cfg = setup(0.7, pack_sequences=pack)
    rows = batch(model, tok, 0.7, n=40)
    assert Packing.gainful([len(r["token_ids"]) for r in rows]) is not None, "these rows would not be packed"
    stats = step(model, tok, cfg, rows)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and stats["approx_kl"] < 1e-7, stats


@pytest.mark.parametrize("trust_region", ["clip", "prob_diff"])
def test_direction_gap_is_positive_after_a_correct_step_and_negative_after_a_flipped_one(trust_region,
                                                                                         monkeypatch):
    # one AdamW step (lr 1e-3) on half +1, half -1 advantages: a descent step on -sum A l raises the logprobs of
    # the A > 0 tokens relative to the A < 0 ones (measured: a gap of 0.57 on this tiny model); a loss whose
    # sign is flipped does the opposite
    tok, model, cfg = setup(trust_region=trust_region)
    good = step(model, tok, cfg, batch(model, tok, 1.0))
    assert good["direction_gap"] > 0 and good["logprob_shift_pos"] > good["logprob_shift_neg"], good
    name = "ppo_clip_loss" if trust_region == "clip" else "prob_diff_mask_loss"
    loss_fn = getattr(policy_trainer, name)

    def negated(*args, **kwargs):
        loss, stats = loss_fn(*args, **kwargs)
        return -loss, stats
    monkeypatch.setattr(policy_trainer, name, negated)
    _, model, cfg = setup(trust_region=trust_region)
    flipped = step(model, tok, cfg, batch(model, tok, 1.0))
    assert flipped["direction_gap"] < 0, flipped
    assert flipped["direction_gap"] == pytest.approx(-good["direction_gap"], rel=0.5)


def test_direction_gap_counts_micro_batches_as_one_batch():
    # policy.micro_batch_rollouts=3 (micro-batches of 3, 3, 2): the same step as one micro-batch, so the same gap
    tok, model, cfg = setup()
    whole = step(model, tok, cfg, batch(model, tok, 1.0))
    _, model, cfg = setup(micro_batch_rollouts=3)
    split = step(model, tok, cfg, batch(model, tok, 1.0))
    assert split["direction_gap"] == pytest.approx(whole["direction_gap"], rel=1e-3)


def test_the_step_asks_for_cores_before_each_micro_batch_and_its_backward_and_gives_them_back_once():
    # topology.lend_idle_cores (launch/cores.py): a core freed mid-step is taken at the next micro-batch; the step's
    # statistics say the most threads it ran with (what give_back returns)
    calls = []

    class Cores:
        def borrow(self):
            calls.append("borrow")
            return 1

        def give_back(self, work):
            calls.append(("give_back", work))
            return 2

    tok, model, cfg = setup(micro_batch_rollouts=4)
    rows = batch(model, tok, 1.0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.policy.lr, weight_decay=0.0)
    stats = policy_trainer.train_step(model, optimizer, rows, cfg, tok.pad_token_id, "cpu", cores=Cores())
    tokens = sum(sum(r["policy_mask"]) for r in rows)
    assert calls == ["borrow"] * 4 + [("give_back", tokens)], "2 micro-batches: before each forward and backward"
    assert stats["backward_threads"] == 2
