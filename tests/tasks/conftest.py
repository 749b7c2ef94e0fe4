"""Fixtures shared by the task tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def tiny():
    from prime_values.models import build_char_tokenizer, build_tiny_policy

    tokenizer = build_char_tokenizer()
    model = build_tiny_policy(tokenizer, seed=0, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                              head_dim=32, intermediate_size=128, max_position_embeddings=64).eval()
    return tokenizer, model
