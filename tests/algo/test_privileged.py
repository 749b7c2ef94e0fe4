"""Privileged critic layout: prefix before the trace, same policy tokens, values mapped back exactly."""

import pytest
import torch

from prime_values.algo.gae import gae
from prime_values.algo.privileged import (
    batch_values_to_policy_layout,
    critic_layout,
    kept_policy_mask,
    truncate_for_critic,
    values_to_policy_layout,
)

PREFIX = [901, 902]  # e.g. "<ref>42</ref>"
# Single turn: prompt [11, 12, 13], response [21, 22, 23].
SINGLE_IDS, SINGLE_MASK = [11, 12, 13, 21, 22, 23], [0, 0, 0, 1, 1, 1]
# Multi-turn: prompt [11, 12], turn 1 [21, 22], environment [31, 32, 33], turn 2 [24, 25].
MULTI_IDS, MULTI_MASK = [11, 12, 21, 22, 31, 32, 33, 24, 25], [0, 0, 1, 1, 0, 0, 0, 1, 1]


def fake_critic(ids: list[int]) -> torch.Tensor:
    """A causal 'critic': output i depends only on ids[: i + 1] (a distinct number per prefix)."""
    return torch.tensor([float(sum(ids[: i + 1]) + 1000 * (i + 1)) for i in range(len(ids))], dtype=torch.float64)


def test_critic_layout_single_and_multi_turn():
    ids, mask = critic_layout(SINGLE_IDS, SINGLE_MASK, PREFIX)
    assert ids == [901, 902, 11, 12, 13, 21, 22, 23]
    assert mask == [0, 0, 0, 0, 0, 1, 1, 1]
    ids, mask = critic_layout(MULTI_IDS, MULTI_MASK, PREFIX)
    assert ids == [901, 902, 11, 12, 21, 22, 31, 32, 33, 24, 25]
    assert mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert sum(mask) == sum(MULTI_MASK)  # response ids appended verbatim: same policy tokens


def test_critic_layout_with_the_block_before_the_response():
    # at="response": the block goes after the prompt, before the first policy token; later turns are untouched
    ids, mask = critic_layout(SINGLE_IDS, SINGLE_MASK, PREFIX, at="response")
    assert (ids, mask) == ([11, 12, 13, 901, 902, 21, 22, 23], [0, 0, 0, 0, 0, 1, 1, 1])
    ids, mask = critic_layout(MULTI_IDS, MULTI_MASK, PREFIX, at="response")
    assert ids == [11, 12, 901, 902, 21, 22, 31, 32, 33, 24, 25]
    assert mask == [0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    # the same read-back (prefix_len + j - 1) now gives the value of prompt + block + response so far
    for token_ids, policy_mask in ((SINGLE_IDS, SINGLE_MASK), (MULTI_IDS, MULTI_MASK)):
        critic_ids, _ = critic_layout(token_ids, policy_mask, PREFIX, at="response")
        values = values_to_policy_layout(fake_critic(critic_ids), len(PREFIX), torch.tensor(policy_mask))
        first = policy_mask.index(1)
        for j, m in enumerate(policy_mask):
            want = fake_critic(token_ids[:first] + PREFIX + token_ids[first:j])[-1].item() if m else 0.0
            assert values[j].item() == want
    with pytest.raises(AssertionError, match="'start' or 'response'"):
        critic_layout(SINGLE_IDS, SINGLE_MASK, PREFIX, at="end")


def test_values_map_back_by_hand():
    # Multi-turn, prefix 2: policy tokens j = 2, 3, 7, 8 read critic positions 2 + j − 1 = 3, 4, 8, 9.
    critic_values = torch.arange(11, dtype=torch.float64) * 10  # value at position i is 10·i
    values = values_to_policy_layout(critic_values, len(PREFIX), torch.tensor(MULTI_MASK, dtype=torch.bool))
    torch.testing.assert_close(values, torch.tensor([0, 0, 30, 40, 0, 0, 0, 80, 90], dtype=torch.float64))


def test_values_are_the_values_of_the_policy_states_plus_prefix():
    # For each policy token j the mapped value must be the critic's value of state prefix + x_{<j}.
    for token_ids, policy_mask in ((SINGLE_IDS, SINGLE_MASK), (MULTI_IDS, MULTI_MASK)):
        critic_ids, _ = critic_layout(token_ids, policy_mask, PREFIX)
        values = values_to_policy_layout(fake_critic(critic_ids), len(PREFIX), torch.tensor(policy_mask))
        for j, m in enumerate(policy_mask):
            want = fake_critic(PREFIX + token_ids[:j])[-1].item() if m else 0.0
            assert values[j].item() == want, (token_ids, j)


def test_batch_mapping_with_different_prefixes_and_padding():
    # Row 0: single-turn, prefix of 2; row 1: multi-turn, no prefix. Critic batch right-padded to L = 11,
    # policy batch right-padded to T = 9.
    rows = [(SINGLE_IDS, SINGLE_MASK, PREFIX), (MULTI_IDS, MULTI_MASK, [])]
    critic_values = torch.full((2, 11), float("nan"), dtype=torch.float64)
    policy_mask = torch.zeros(2, 9, dtype=torch.bool)
    for b, (ids, mask, prefix) in enumerate(rows):
        critic_ids, _ = critic_layout(ids, mask, prefix)
        critic_values[b, : len(critic_ids)] = fake_critic(critic_ids)
        policy_mask[b, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    values = batch_values_to_policy_layout(critic_values, torch.tensor([2, 0]), policy_mask)
    for b, (_ids, _mask, prefix) in enumerate(rows):
        single = values_to_policy_layout(critic_values[b], len(prefix), policy_mask[b])
        torch.testing.assert_close(values[b], single)
    # row 1, token j = 2 (first policy token): state [11, 12] read at position 1: 11 + 12 + 2000 = 2023
    assert values[1, 2].item() == 2023.0
    assert not values.isnan().any()  # nan padding is never read


def test_truncate_for_critic_and_bootstrap_value():
    critic_ids, _ = critic_layout(MULTI_IDS, MULTI_MASK, PREFIX)  # 11 critic tokens
    kept, cut = truncate_for_critic(critic_ids, 20)
    assert kept == critic_ids and not cut
    kept, cut = truncate_for_critic(critic_ids, 9)
    assert kept == critic_ids[:9] and cut  # [901, 902, 11, 12, 21, 22, 31, 32, 33]
    # Policy token j sits at critic position 2 + j; kept while 2 + j < 9: j = 2, 3 kept; j = 7 (token 24,
    # position 9) is the first policy token that did not fit, j = 8 neither.
    mask = torch.tensor(MULTI_MASK, dtype=torch.bool)
    kept_mask = kept_policy_mask(mask, len(PREFIX), len(kept))
    assert kept_mask.tolist() == [False, False, True, True, False, False, False, False, False]
    critic_values = fake_critic(kept)
    values = values_to_policy_layout(critic_values, len(PREFIX), kept_mask)
    # Bootstrap = value at the last kept position 8 (token 33) = V(prefix + x_{<7}): exactly the state of
    # the first policy token that did not fit.
    bootstrap = critic_values[-1:]
    assert bootstrap.item() == fake_critic(PREFIX + MULTI_IDS[:7])[-1].item()
    # GAE over kept tokens with the cut flag from truncate_for_critic, γ = λ = 1: the reward (R = 1 here) lies
    # beyond the cut and is not used; A_j = bootstrap − V_j and the targets are the bootstrap.
    reward = torch.ones(1, dtype=torch.float64)
    advantages, returns = gae(reward, values[None], kept_mask[None], 1.0, 1.0, bootstrap, cut=torch.tensor([cut]))
    torch.testing.assert_close(advantages[0][kept_mask], bootstrap - values[kept_mask])
    torch.testing.assert_close(returns[0][kept_mask], bootstrap.expand(2))


def test_mapping_refuses_policy_tokens_beyond_the_critic_context():
    critic_ids, _ = critic_layout(MULTI_IDS, MULTI_MASK, PREFIX)
    kept, _ = truncate_for_critic(critic_ids, 9)
    with pytest.raises(AssertionError, match="kept_policy_mask"):
        values_to_policy_layout(fake_critic(kept), len(PREFIX), torch.tensor(MULTI_MASK, dtype=torch.bool))


def test_kept_policy_mask_batched():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    # row 0: prefix 1, context 3 → positions 1 + j < 3 → j < 2 → only j = 1
    # row 1: prefix 0, context 9 → everything kept
    got = kept_policy_mask(mask, torch.tensor([1, 0]), torch.tensor([3, 9]))
    assert got.tolist() == [[False, True, False, False], [True, True, True, False]]
