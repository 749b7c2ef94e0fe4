"""Model and tokenizer building for the embedded tiny models (see build.py, sampling.py)."""

from .build import (
    ARCH_PRESETS,
    DEFAULT_ARCH,
    build_critic,
    build_tiny_policy,
    critic_values,
    keep_layers,
    load_critic,
    load_optimizer_state,
    load_policy,
    num_parameters,
    read_optimizer_state,
    save_model,
    save_optimizer_state,
    tiny_config,
)
from .sampling import Completion, greedy, sample, teacher_forced_logprobs
from .tokenizer import build_char_tokenizer

__all__ = [
    "ARCH_PRESETS", "DEFAULT_ARCH", "Completion", "build_char_tokenizer", "build_critic", "build_tiny_policy",
    "critic_values", "greedy", "keep_layers", "load_critic", "load_optimizer_state", "load_policy", "num_parameters",
    "read_optimizer_state", "sample", "save_model", "save_optimizer_state",
    "teacher_forced_logprobs", "tiny_config",
]
