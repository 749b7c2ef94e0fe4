"""A tiny policy's architecture (2 layers, hidden 64) and a policy batch scored by the model itself, shared by the
precision, policy-step and distributed tests."""

from __future__ import annotations

import torch

ARCH = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)


def policy_rows(model, tokenizer, n: int = 6) -> list[dict]:
    """A policy batch whose sampling logprobs are the fp32 model's own (the first on-policy step: ratio 1 in fp32,
    far from the clip range, so no token changes side of a clip between precisions)."""
    from prime_values.algo.losses import token_logprobs

    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(n):
        prompt, response = 3 + i % 3, 4 + (2 * i) % 5
        ids = torch.randint(4, len(tokenizer), (prompt + response,), generator=gen)
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=ids[None]).logits.float(), ids[None])[0]
        rows.append({"token_ids": ids.tolist(), "policy_mask": [0] * prompt + [1] * response,
                     "sampling_logprobs": lp.tolist(),
                     "advantages": [0.0] * prompt + [float(torch.randn(1, generator=gen))] * response,
                     "privileged": str(i), "reward": float(i % 2),
                     "value_targets": [float(i % 2)] * (prompt + response)})
    return rows
