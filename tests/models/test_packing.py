"""Sequence packing (critic_io.Packing): rows laid end to end in lines as wide as the longest give the same logits,
logprobs, values, losses and gradients as one right-padded row each, with fewer positions computed."""

import copy
import random

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.critic_io import CriticInputs, Packing, attention_mask, critic_step, first_fit_decreasing, padded

SMALL = dict(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=64)


def test_first_fit_decreasing_hand_worked():
    assert first_fit_decreasing([5, 3, 4, 2], 6) == [[0], [2, 3], [1]]
    assert first_fit_decreasing([3, 3, 3], 3) == [[0], [1], [2]]  # full lines: nothing to pack
    assert first_fit_decreasing([1, 1, 1, 1], 4) == [[0, 1, 2, 3]]


def test_packing_positions_and_counts():
    p = Packing([3, 1, 2], width=3)  # [row 0], [row 2, row 1]
    assert p.lines == 2 and (p.computed, p.counted) == (6, 6)
    assert p.position_ids.tolist() == [[0, 1, 2], [0, 1, 0]]
    x = torch.tensor([[1, 2, 3], [4, 0, 0], [5, 6, 0]])
    assert p.pack(x).tolist() == [[1, 2, 3], [5, 6, 4]]
    assert p.unpack(p.pack(x)).tolist() == x.tolist()
    q = Packing([2, 1], width=2)  # one line of 3 > width 2: two lines, the second padded with continuing positions
    assert q.position_ids.tolist() == [[0, 1], [0, 1]] and q.computed == 4
    assert Packing.gainful([2, 1]) is None  # one 64-token line computes more than 2 x 2 padded positions
    assert Packing.gainful([10] * 12) is None  # equal rows: 6 to a 64-token line is 10.7 positions each, not 10
    assert Packing.gainful([10] + [2] * 11).computed == 64 < 12 * 10


def rows_of(lengths, seed=0):
    rng = random.Random(seed)
    rows = []
    for n in lengths:
        prompt = rng.randint(1, n - 1)
        rows.append({"token_ids": [rng.randrange(3, 60) for _ in range(n)],
                     "policy_mask": [0] * prompt + [1] * (n - prompt),
                     "sampling_logprobs": [rng.uniform(-2, 0) for _ in range(n)],
                     "advantages": [rng.uniform(-1, 1) for _ in range(n)],
                     "value_targets": [rng.random() for _ in range(n)], "reward": 1.0, "privileged": "12"})
    return rows


@pytest.fixture(scope="module")
def tiny():
    from prime_values.models import build_char_tokenizer, build_critic, build_tiny_policy

    tokenizer = build_char_tokenizer()
    return tokenizer, build_tiny_policy(tokenizer, seed=0, **SMALL), build_critic(None, tokenizer, seed=1, **SMALL)


def test_packed_forward_equals_padded_and_isolates_rows(tiny):
    tokenizer, policy, _ = tiny
    rows = rows_of([7, 3, 12, 5, 4, 9, 2])
    ids, mask = padded(rows, "token_ids", torch.long, fill=tokenizer.pad_token_id), attention_mask(rows).bool()
    packing = Packing([len(r["token_ids"]) for r in rows])
    assert packing.computed < ids.numel()
    ref = policy(input_ids=ids, attention_mask=mask.long(), use_cache=False).logits
    got = packing.forward(policy, ids, tokenizer.pad_token_id)
    assert torch.allclose(got[mask], ref[mask], atol=1e-5)
    # without the position ids the packed rows would see each other: the check above could fail
    leaky = packing.unpack(policy(input_ids=packing.pack(ids, tokenizer.pad_token_id), use_cache=False).logits)
    assert not torch.allclose(leaky[mask], ref[mask], atol=1e-3)


def test_policy_step_packed_equals_padded(tiny):
    from prime_values.roles.policy_trainer import train_step

    tokenizer, policy, _ = tiny
    cfg = OmegaConf.structured(Config)
    rows = rows_of([6, 11, 4, 9, 5, 3, 8, 10], seed=1)
    results = {}
    for pack in (False, True):
        cfg.policy.pack_sequences = pack
        model = copy.deepcopy(policy).train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stats = train_step(model, optimizer, rows, cfg, tokenizer.pad_token_id, "cpu")
        results[pack] = (stats, [p.detach().clone() for p in model.parameters()])
    assert results[True][0]["loss"] == pytest.approx(results[False][0]["loss"], abs=1e-6)
    for a, b in zip(results[True][1], results[False][1]):
        assert torch.allclose(a, b, atol=1e-6)


def test_critic_values_and_step_packed_equal_padded(tiny):
    tokenizer, _, critic = tiny
    cfg = OmegaConf.structured(Config)
    cfg.critic.template = "{privileged}|"  # 3 tokens before each trace: 9, 14, 7, 12, 8, 6 share one 64-token line
    rows = rows_of([6, 11, 4, 9, 5, 3], seed=2)
    out = {}
    for pack in (False, True):
        cfg.critic.pack_sequences = pack
        inputs = CriticInputs.of(rows, tokenizer, cfg.critic)
        with torch.no_grad():
            values = inputs.values(critic.eval())
        model = copy.deepcopy(critic).train()
        stats = critic_step(model, torch.optim.SGD(model.parameters(), lr=0.1), rows, tokenizer, cfg, "cpu")
        out[pack] = values, inputs.tokens_computed, stats["value_loss"], next(model.parameters()).detach().clone()
    assert torch.allclose(out[True][0], out[False][0], atol=1e-5) and out[True][1] < out[False][1]
    assert out[True][2] == pytest.approx(out[False][2], abs=1e-6) and torch.allclose(out[True][3], out[False][3])


def test_sft_loss_packed_equals_padded(tiny):
    from prime_values.supervised import sft_loss

    tokenizer, policy, _ = tiny
    rows = rows_of([3, 4, 2, 5, 3, 4, 2, 6, 3, 4, 5, 2], seed=3)  # 43 tokens: one 64-token line against 12 x 6
    ids, mask = padded(rows, "token_ids", torch.long, fill=tokenizer.pad_token_id), attention_mask(rows)
    assert Packing.gainful(mask.sum(dim=1).tolist()).lines == 1
    labels = torch.where(padded(rows, "policy_mask", torch.bool), ids, torch.full_like(ids, -100))
    plain, _ = sft_loss(policy, ids, mask, labels)
    packed, _ = sft_loss(policy, ids, mask, labels, pack=True)
    assert packed.item() == pytest.approx(plain.item(), abs=1e-6)
