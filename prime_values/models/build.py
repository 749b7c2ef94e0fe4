"""Building, saving and loading the tiny policy (causal LM) and critic (per-token value model).

Both are standard transformers Qwen3 architectures, so ``save_model`` output reloads with
``AutoModelForCausalLM`` / ``AutoModelForTokenClassification.from_pretrained`` (and vLLM for the
policy). The critic is ``Qwen3ForTokenClassification`` with ``num_labels = 1``: one value per
position, computed causally (position ``t`` sees tokens ``<= t`` only).
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PreTrainedModel,
    Qwen3Config,
)
from transformers.utils import logging as hf_logging

# ~0.85M parameters with the 100-token char vocabulary (tied embeddings).
DEFAULT_ARCH: dict = dict(
    hidden_size=128,
    num_layers=4,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    intermediate_size=384,
    max_position_embeddings=128,
    tie_word_embeddings=True,
)

# Named sizes. "small" (3.2M) is what the arith study recommends for RL: at hidden 128 group-mean
# REINFORCE gains 10-35 greedy points in 200 steps depending on the seed; at hidden 256 it gained 29-41.
ARCH_PRESETS: dict[str, dict] = {
    "tiny": dict(DEFAULT_ARCH),
    "small": dict(DEFAULT_ARCH, hidden_size=256, num_heads=8, num_kv_heads=4, intermediate_size=768),
}

# sdpa and eager measured within noise of each other for these sizes on 2 CPU threads; sdpa is the
# transformers default and what larger models want.
ATTN_IMPLEMENTATION = "sdpa"


@contextlib.contextmanager
def _quiet():
    """No per-file progress bars when roles load/save tiny checkpoints many times."""
    was = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            hf_logging.enable_progress_bar()


def tiny_config(tokenizer, **arch) -> Qwen3Config:
    unknown = set(arch) - set(DEFAULT_ARCH)
    if unknown:
        raise TypeError(f"unknown architecture arguments {sorted(unknown)}; allowed: {sorted(DEFAULT_ARCH)}")
    a = {**DEFAULT_ARCH, **arch}
    if a["head_dim"] < 32:
        raise ValueError("head_dim must be >= 32 (vLLM rejects smaller heads)")
    if a["num_heads"] % a["num_kv_heads"]:
        raise ValueError("num_heads must be a multiple of num_kv_heads")
    cfg = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=a["hidden_size"],
        intermediate_size=a["intermediate_size"],
        num_hidden_layers=a["num_layers"],
        num_attention_heads=a["num_heads"],
        num_key_value_heads=a["num_kv_heads"],
        head_dim=a["head_dim"],
        max_position_embeddings=a["max_position_embeddings"],
        tie_word_embeddings=a["tie_word_embeddings"],
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        attention_dropout=0.0,
        use_cache=True,
    )
    cfg._attn_implementation = ATTN_IMPLEMENTATION
    return cfg


def _seeded_from_config(auto_cls, cfg, seed: int) -> PreTrainedModel:
    # fork the RNG so building a model does not disturb the caller's global torch stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_cls.from_config(cfg, attn_implementation=ATTN_IMPLEMENTATION, dtype=torch.float32)
    return model.float()


def build_tiny_policy(tokenizer, seed: int = 0, **arch) -> PreTrainedModel:
    """A freshly initialised ``Qwen3ForCausalLM`` sized for the tokenizer (float32, train mode)."""
    model = _seeded_from_config(AutoModelForCausalLM, tiny_config(tokenizer, **arch), seed)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def load_policy(path: str | os.PathLike) -> PreTrainedModel:
    if (Path(path) / "adapter_config.json").is_file():  # a LoRA version (models/lora.py): merged onto its base
        from prime_values.models.lora import load_merged

        return load_merged(path, "policy")
    with _quiet():
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
        )
    return model.float().eval()


def _critic_config(cfg) -> Qwen3Config:
    cfg.num_labels = 1  # must be set on the config: from_config(num_labels=1) raises in transformers 5.x
    cfg.classifier_dropout = 0.0  # a regression head: no dropout on the hidden state
    cfg.tie_word_embeddings = False  # the critic has no LM head to tie
    cfg.problem_type = "regression"
    return cfg


def build_critic(init_from: str | os.PathLike | None, tokenizer, seed: int = 0, **arch) -> PreTrainedModel:
    """A per-token value model (``AutoModelForTokenClassification``, one output per position).

    ``init_from=None``: a fresh backbone with the given ``arch``. ``init_from=<policy dir>``: the
    backbone (embeddings, layers, final norm) is copied from the saved policy and ``arch`` is
    ignored; the value head (``score``) is always fresh, seeded by ``seed``.
    """
    if init_from is None:
        cfg = _critic_config(tiny_config(tokenizer, **arch))
        return _seeded_from_config(AutoModelForTokenClassification, cfg, seed)
    cfg = _critic_config(AutoConfig.from_pretrained(str(init_from)))
    cfg._attn_implementation = ATTN_IMPLEMENTATION
    critic = _seeded_from_config(AutoModelForTokenClassification, cfg, seed)
    policy = load_policy(init_from)
    missing, unexpected = critic.model.load_state_dict(policy.model.state_dict(), strict=True)
    assert not missing and not unexpected
    return critic


def load_critic(path: str | os.PathLike) -> PreTrainedModel:
    if (Path(path) / "adapter_config.json").is_file():  # a LoRA version (models/lora.py): merged onto its base
        from prime_values.models.lora import load_merged

        return load_merged(path, "critic")
    with _quiet():
        model = AutoModelForTokenClassification.from_pretrained(
            str(path), dtype=torch.float32, attn_implementation=ATTN_IMPLEMENTATION
        )
    return model.float().eval()


def critic_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, L]`` values, one per position (position ``t`` has seen tokens ``0..t``).

    Right padding is assumed (positions are 0..L-1); padded positions hold meaningless values.
    Gradients flow when called under grad mode (the value trainer); wrap in ``torch.no_grad()``
    to score.
    """
    out = critic(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    return out.logits.squeeze(-1)


def save_model(model: PreTrainedModel, tokenizer, path: str | os.PathLike) -> None:
    """``save_pretrained`` of model (safetensors) and tokenizer into ``path`` (created if needed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    with _quiet():
        model.save_pretrained(str(path), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(path))
        # the generic class name loads in transformers 4.x and 5.x alike (5.x writes "TokenizersBackend")
        cfg_file = path / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text())
        if cfg.get("tokenizer_class") == "TokenizersBackend":
            cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
            cfg_file.write_text(json.dumps(cfg, indent=2) + "\n")


def num_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


OPTIMIZER_STATE = "optimizer.pt"  # inside a published version dir, next to model.safetensors


def save_optimizer_state(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> None:
    """The optimizer state that produced the weights in `path` (called inside `publish`, so it appears atomically
    with them): a restarted trainer resumes its Adam moments instead of starting them at zero, which would make
    its first steps after a restart larger than any before."""
    torch.save(optimizer.state_dict(), Path(path) / OPTIMIZER_STATE)


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> str:
    """Restore the optimizer state saved with the version in `path`; returns what happened, for the role's log.
    A version saved without one (log.optimizer_state_every) or an unreadable file is not fatal: the trainer
    goes on with a fresh optimizer."""
    file = Path(path) / OPTIMIZER_STATE
    if not file.exists():
        return f"no optimizer state in {path}: fresh optimizer"
    try:
        optimizer.load_state_dict(torch.load(file, map_location="cpu", weights_only=True))
    except Exception as error:  # torn or foreign file: never fatal
        return f"optimizer state {file} unusable ({type(error).__name__}: {error}): fresh optimizer"
    return f"optimizer state restored from {file}"
