"""Privileged critic input: the critic's layout of a rollout, and mapping its values back (docs/design.md §3).

The critic may see what the policy never sees (e.g. the reference answer). That context is folded in as
``prefix_ids`` placed BEFORE the whole trace (or, ``at="response"``, between the prompt and the first policy
token), and the rollout's token ids stay verbatim (never re-tokenised), so a policy token at position j of the
policy layout sits at position ``prefix_len + j`` of the critic layout, and both layouts hold the same policy
tokens.

Value alignment (the off-by-one): the critic is a token-level value model, its output at position i is
V(causal state ending with token i). Policy token j's state is x_{<j}, which ends with the token BEFORE j,
so its value is read at critic position ``prefix_len + j − 1``.

Truncation: when the critic's context ``max_length`` is shorter than ``prefix + trace``, only the first
``max_length`` critic tokens are scored. Policy tokens at critic positions < max_length keep their values
(``kept_policy_mask``); the bootstrap value for GAE is ``critic_values[max_length − 1]``, the value at the
last kept position, which is V(x_{<max_length}): the state of the first token that did not fit. When that
token is a policy token it is exactly V(p_{n+1}) for the last kept policy token p_n; when environment tokens
sit at the cut it is the value of the state just before them (the critic has not seen them).
"""

from __future__ import annotations

import torch
from torch import Tensor


def critic_layout(
    token_ids: list[int], policy_mask: list[int], prefix_ids: list[int], at: str = "start"
) -> tuple[list[int], list[int]]:
    """critic_ids = prefix_ids + token_ids; critic_mask = [0]·len(prefix_ids) + policy_mask.  [T] -> [P + T].

    ``at="response"`` inserts the block right before the first policy token instead (after the prompt):
    critic_ids = token_ids[:f] + prefix_ids + token_ids[f:], f = first j with policy_mask[j]. Every policy
    token, and every state before one, still sits ``len(prefix_ids)`` positions later than in the policy's
    layout (the states before f are the prompt's, never valued), so the read-back below is the same; but the
    block now sits at a fixed distance before the response, whatever the prompt's length."""
    assert len(token_ids) == len(policy_mask), (
        f"token_ids ({len(token_ids)}) and policy_mask ({len(policy_mask)}) must have the same length"
    )
    assert at in ("start", "response"), f"at must be 'start' or 'response', got {at!r}"
    first = next((j for j, m in enumerate(policy_mask) if m), len(policy_mask)) if at == "response" else 0
    critic_ids = list(token_ids[:first]) + list(prefix_ids) + list(token_ids[first:])
    critic_mask = [0] * (first + len(prefix_ids)) + [int(bool(m)) for m in policy_mask[first:]]
    assert sum(critic_mask) == sum(bool(m) for m in policy_mask), (
        "the critic layout must hold exactly the policy's tokens"
    )
    return critic_ids, critic_mask


def truncate_for_critic(critic_ids: list[int], max_length: int) -> tuple[list[int], bool]:
    """Keep the first ``max_length`` critic tokens; cut = True when something was dropped.

    On a cut the caller bootstraps with ``critic_values[max_length − 1]`` (module docstring) and computes
    advantages over ``kept_policy_mask(...)`` only.
    """
    assert max_length > 0, f"max_length must be > 0, got {max_length}"
    cut = len(critic_ids) > max_length
    return list(critic_ids[:max_length]), cut


def kept_policy_mask(policy_mask: Tensor, prefix_len: int | Tensor, critic_len: int | Tensor) -> Tensor:
    """Policy tokens that lie inside a critic context of ``critic_len`` tokens: j with prefix_len + j < critic_len.

    [T] or [B, T] (with [B] prefix_len / critic_len) -> same shape, bool.
    """
    mask = policy_mask.bool()
    positions = torch.arange(mask.shape[-1], device=mask.device)
    prefix_len = torch.as_tensor(prefix_len, device=mask.device)
    critic_len = torch.as_tensor(critic_len, device=mask.device)
    if mask.dim() == 2:
        prefix_len, critic_len = prefix_len.reshape(-1, 1), critic_len.reshape(-1, 1)
    return mask & (prefix_len + positions < critic_len)


def batch_values_to_policy_layout(critic_values: Tensor, prefix_lens: Tensor, policy_mask: Tensor) -> Tensor:
    """values[b, j] = critic_values[b, prefix_lens[b] + j − 1] where policy_mask[b, j], else 0.

    critic_values [B, L] (right-padded), prefix_lens [B] int, policy_mask [B, T] -> [B, T].
    Every masked read position must lie in [0, L): mask tokens cut off by the critic's context first
    (``kept_policy_mask``).
    """
    mask = policy_mask.bool()
    batch, length = mask.shape
    assert critic_values.dim() == 2 and critic_values.shape[0] == batch, (
        f"critic_values must be [B={batch}, L], got {tuple(critic_values.shape)}"
    )
    critic_len = critic_values.shape[1]
    prefix_lens = torch.as_tensor(prefix_lens, device=mask.device).long().reshape(batch, 1)
    read_at = prefix_lens + torch.arange(length, device=mask.device) - 1  # state x_{<j} ends at token j − 1
    bad = mask & ((read_at < 0) | (read_at >= critic_len))
    assert not bad.any(), (
        f"policy tokens {bad.nonzero().tolist()} read critic positions outside [0, {critic_len}): "
        "the critic context was cut (use kept_policy_mask) or a policy token has no preceding token"
    )
    gathered = critic_values.gather(1, read_at.clamp(0, max(critic_len - 1, 0)))
    return torch.where(mask, gathered, torch.zeros_like(gathered))


def values_to_policy_layout(critic_values: Tensor, prefix_len: int, policy_mask: Tensor) -> Tensor:
    """values[j] = critic_values[prefix_len + j − 1] where policy_mask[j], else 0.  [L], int, [T] -> [T]."""
    assert critic_values.dim() == 1 and policy_mask.dim() == 1, (
        "expected critic_values [L] and policy_mask [T], "
        f"got {tuple(critic_values.shape)} and {tuple(policy_mask.shape)}"
    )
    return batch_values_to_policy_layout(
        critic_values[None], torch.tensor([prefix_len]), policy_mask[None]
    )[0]
