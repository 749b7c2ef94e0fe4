"""The GAE the tests compare `prime_values.algo.gae.gae` with: written from the definition in plain Python loops
over Python floats, sharing no code with prime_values (it imports nothing from it), so that a change to the
library's handling of terminal or cut rollouts cannot change the reference with it.

For rollout b with policy tokens p_1 ... p_n (positions where policy_mask is true, in order):

    terminal rollout (cut[b] false, or no cut given):  r_n = rewards[b],  V(p_{n+1}) = 0
    cut by the critic's context (cut[b] true):        r_n = 0,           V(p_{n+1}) = bootstrap[b]
    r_k = 0 for k < n
    delta_k = r_k + gamma * V(p_{k+1}) - V(p_k)
    A_k = sum_{i=0}^{n-k} (gamma * lam_b)^i * delta_{k+i}      (summed as written: O(n^2))
    returns_k = A_k + V(p_k)

Every other position (prompt, environment, padding) gets 0 in both outputs and its value is never read.
"""

from __future__ import annotations

import torch


def _floats(x, batch: int) -> list[float]:
    """A number or a [B] tensor / list as B Python floats."""
    if isinstance(x, (int, float)):
        return [float(x)] * batch
    values = x.tolist() if hasattr(x, "tolist") else list(x)
    if not isinstance(values, list):  # a 0-d tensor
        return [float(values)] * batch
    assert len(values) == batch, f"expected {batch} per-rollout values, got {len(values)}"
    return [float(v) for v in values]


def reference_gae(rewards, values, policy_mask, gamma, lam, bootstrap=None, cut=None):
    """(advantages [B, T], returns [B, T]) in values' dtype, by the definition above."""
    batch, length = values.shape
    rewards, lams = _floats(rewards, batch), _floats(lam, batch)
    cuts = [False] * batch if cut is None else [bool(c) for c in cut.tolist()]
    bootstraps = [0.0] * batch if bootstrap is None else _floats(bootstrap, batch)
    mask = policy_mask.tolist()
    table = values.tolist()
    advantages = [[0.0] * length for _ in range(batch)]
    returns = [[0.0] * length for _ in range(batch)]
    for b in range(batch):
        positions = [t for t in range(length) if mask[b][t]]
        n = len(positions)
        if n == 0:
            continue
        v = [float(table[b][t]) for t in positions]
        if cuts[b]:
            last_reward, value_after = 0.0, bootstraps[b]
        else:
            last_reward, value_after = rewards[b], 0.0
        deltas = []
        for k in range(n):
            reward = last_reward if k == n - 1 else 0.0
            next_value = value_after if k == n - 1 else v[k + 1]
            deltas.append(reward + gamma * next_value - v[k])
        for k, t in enumerate(positions):
            a = 0.0
            for i in range(n - k):
                a += (gamma * lams[b]) ** i * deltas[k + i]
            advantages[b][t] = a
            returns[b][t] = a + v[k]
    like = dict(dtype=values.dtype)
    return torch.tensor(advantages, **like), torch.tensor(returns, **like)
