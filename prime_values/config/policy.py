"""`policy.*`: the policy model, its optimiser and trust region, its supervised warm start and LoRA."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import List

from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.config.checks import declare, run_check

ROLE_DEVICES = ("inference", "evaluator", "policy_trainer", "value_trainer")

GGUF_CHECK = declare("policy.gguf", "a GGUF policy.model exists, is a whole GGUF file and the gguf package is there",
                     "prime_values/gguf.py")


def is_gguf(model: str) -> bool:
    """Whether policy.model names a GGUF file (a path ending in .gguf, or 'package:file.gguf'; prime_values.gguf
    converts it)."""
    return str(model).lower().endswith(".gguf")


@dataclass
class TinyArch:
    """Architecture of the embedded tiny model (a Qwen3 built from a config, no download). The default has
    3.2M parameters: a 0.8M model (hidden 128, 4 heads, MLP 384) learns the arithmetic task by SFT but gains
    far less from RL in the same number of steps (see docs/benchmarks.md, "Learnability")."""

    hidden_size: int = ranged(256, ">= 1")
    """width of the residual stream"""
    num_layers: int = ranged(4, ">= 1")
    """number of transformer blocks"""
    num_heads: int = ranged(8, ">= 1")
    """attention heads (head_dim x num_heads need not equal hidden_size in Qwen3)"""
    num_kv_heads: int = ranged(4, ">= 1")
    """key/value heads (grouped-query attention)"""
    head_dim: int = ranged(32, ">= 1")
    """per-head width; >= 32 so vLLM kernels accept the model"""
    intermediate_size: int = ranged(768, ">= 1")
    """MLP width"""
    max_position_embeddings: int = ranged(256, ">= 1")
    """longest sequence the model accepts (prompt + response, or critic prefix + trace)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        arch = cfg.policy.arch
        if arch.num_heads % arch.num_kv_heads:
            raise ConfigError(f"policy.arch.num_heads={arch.num_heads} must be a multiple of policy.arch.num_kv_heads="
                              f"{arch.num_kv_heads} (grouped-query attention)")
        if cfg.policy.model != "tiny":
            return
        if cfg.inference.max_new_tokens >= arch.max_position_embeddings:
            raise ConfigError(f"inference.max_new_tokens={cfg.inference.max_new_tokens} leaves no room for the prompt "
                              f"in policy.arch.max_position_embeddings={arch.max_position_embeddings}; lower it or "
                              "raise max_position_embeddings")
        if cfg.critic.init in ("policy", "scratch") and cfg.critic.max_length > arch.max_position_embeddings:
            raise ConfigError(f"critic.max_length={cfg.critic.max_length} exceeds policy.arch.max_position_embeddings="
                              f"{arch.max_position_embeddings}, the critic's longest input; lower critic.max_length")


VISION_MODEL = "tiny_vl"
"""policy.model of the embedded vision-language policy (conf/policy/tiny_vl.yaml; models.vision.TINY_VL_MODEL)"""


@dataclass
class WarmStartConfig:
    """Supervised warm start on the task's reference solutions before RL (the `sft` job)."""

    steps: int = ranged(900, ">= 0")
    """at most this many SFT optimizer steps before RL starts (0 = start RL from the model as loaded)"""
    seed: int = ranged(0, ">= 0")
    """the warm start's own seed (the embedded model's initialisation, SFT's batches, the critic's pretraining
    samples and initialisation), apart from the RL `seed`: runs that differ only in `seed` start from the same
    version 0, so their spread is RL's own"""
    target_accuracy: float = ranged(0.3, "in [0, 1]")
    """stop SFT early once greedy accuracy on a fixed validation sample of training problems
    (never the held-out set) reaches this (checked every `check_every` steps; 0 = never stop early), so RL starts
    from a policy that solves some problems but has room to improve"""
    check_every: int = ranged(25, ">= 1")
    """SFT steps between validation checks of target_accuracy"""
    batch_size: int = ranged(128, ">= 1")
    """problems per SFT step"""
    lr: float = ranged(2e-3, "> 0")
    """SFT learning rate (AdamW)"""
    warmup_steps: int = ranged(10, ">= 0")
    """SFT steps of linear learning-rate warm-up (from lr / warmup_steps to lr; 0 = none)"""
    heldout_before: bool = False
    """also evaluate the held-out set with the model as loaded, before SFT (one greedy reply per problem,
    `inference.max_new_tokens`; each problem's outcome in metrics/heldout/before_sft.jsonl), so
    bench/paired_heldout.py reports SFT's gain and RL's gain apart on the same problems"""
    cache: bool = False
    """keep version 0 (policy and critic) in `policy.cache_dir`'s warm_start/ and start any later run whose version
    0 would be the same from it, skipping SFT and critic pretraining (prime_values/warm_cache.py: keyed by the policy,
    critic, task and inference config, the package source, torch and the CPU's kernels; the embedded model only).
    The embedded experiments set it (conf/experiment/embedded.yaml)"""
    heldout_after: bool = True
    """evaluate the held-out set after SFT (the warm start's `heldout_accuracy`); the policy trainer's step-0
    evaluation measures the same weights, so a run on a slow model may set false and save one evaluation"""


@dataclass
class LoraSettings:
    """LoRA (PEFT) for one trainer: the base stays frozen, only low-rank adapters (and the critic's value head)
    train, and each published version holds only the adapter (docs/lora.md). Needs `pip install
    'prime_values[lora]'` and one trainer process."""

    enabled: bool = False
    """train adapters instead of the full model; versions are adapter-only, adopted in place by inference /
    the evaluator, merged on demand by `python -m prime_values.models.lora merge <version_dir> <out_dir>`"""
    r: int = free(8, "checked by LoraSettings.check, only when enabled")
    """adapter rank"""
    alpha: float = free(16.0, "checked by LoraSettings.check, only when enabled")
    """LoRA scaling numerator: the update is (alpha / r) * B @ A"""
    dropout: float = free(0.0, "checked by LoraSettings.check, only when enabled")
    """dropout on the adapter's input while training (in [0, 1))"""
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])
    """names of the linear layers that get adapters (Qwen/Llama naming: attention and MLP projections)"""

    @staticmethod
    def check(cfg, role: str, trainer: str, environment: bool) -> None:
        """`role`.lora (policy or critic), trained by topology.`trainer`_procs processes."""
        lora = cfg[role].lora
        if not lora.enabled:
            return
        if lora.r < 1 or lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules:
            raise ConfigError(f"{role}.lora needs r >= 1, alpha > 0, 0 <= dropout < 1 and some target_modules (got "
                              f"r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}, "
                              f"target_modules={list(lora.target_modules)})")
        if cfg.topology[f"{trainer}_procs"] > 1:
            raise ConfigError(f"{role}.lora.enabled=true runs in one process; set topology.{trainer}_procs=1 "
                              f"(LoRA with FSDP is not supported yet)")
        if environment and importlib.util.find_spec("peft") is None:
            raise ConfigError(f"{role}.lora.enabled=true needs peft: pip install 'prime_values[lora]' "
                              "(or pip install -e '.[lora]' in a checkout)")


def path_like(value: str) -> bool:
    """A value meant as a file system path rather than a hub id."""
    return value.startswith(("/", "./", "../", "~")) or value in (".", "..")


@dataclass
class PolicyConfig:
    model: str = "tiny"
    """'tiny' builds the embedded model from `arch`; a GGUF file (a path ending in .gguf, or '<package>:<file>.gguf'
    for one an installed package ships, e.g. policy=smollm2_135m) is converted once into a from_pretrained directory
    under `cache_dir` before any job starts (docs/real_model.md); anything else is a path/name for from_pretrained"""
    cache_dir: str = ""
    """where GGUF conversions are kept (policy.model=*.gguf), reused by every role, stage and later run; '' =
    $PRIME_VALUES_CACHE, else ~/.cache/prime_values"""
    arch: TinyArch = field(default_factory=TinyArch)
    """architecture of the embedded model (used when model='tiny'; the critic reuses it)"""
    attn_implementation: str = choice("auto", "auto", "sdpa", "eager", "flash_attention_2")
    """attention kernel of every transformers model, policy and critic, in every role and stage: 'auto' =
    'flash_attention_2' when flash-attn is importable, the model runs on CUDA and dtype computes in bf16 (bfloat16,
    bf16-mixed, or auto on CUDA), else 'sdpa' (each role logs its choice and why); or 'sdpa', 'eager',
    'flash_attention_2' (pip install flash-attn, CUDA devices and a bf16 dtype)"""
    dtype: str = choice("float32", "float32", "bfloat16", "bf16-mixed", "auto")
    """precision of the policy and the critic in every role (their one precision key): 'float32'; 'bf16-mixed'
    (fp32 weights, which are the optimizer's master copy, every forward under bf16 autocast, the critic's value
    head and all losses in fp32; under FSDP2 bf16 all-gathers and fp32 gradient reduction); 'bfloat16' (pure
    bf16 weights and compute: half the memory, but AdamW drops updates under ~1/256 of a weight, so small learning
    rates may stall); 'auto' = bf16-mixed on a CUDA device and on a CPU with bf16 instructions (avx512_bf16 or
    AMX), float32 elsewhere, where a bf16 matmul runs ~100x slower (each role logs what it resolved)"""
    activation_checkpointing: bool = False
    """policy trainer: recompute each transformer block's activations in the backward pass instead of keeping
    them (the same gradients, less memory; costs one more forward pass per block, ~1/3 more compute)"""
    lr: float = ranged(1e-4, "> 0")
    """policy learning rate (AdamW)"""
    lr_decay_steps: int = ranged(0, ">= 0")
    """the last this many policy steps decay the learning rate linearly toward 0 (step s of N steps uses
    lr * min(1, (N - s + 1) / (lr_decay_steps + 1))); 0 = constant"""
    weight_decay: float = ranged(0.0, ">= 0")
    """AdamW weight decay"""
    max_grad_norm: float = ranged(1.0, ">= 0")
    """gradient-norm clip per step (0 = off)"""
    clip_low: float = ranged(0.2, ">= 0", ("< 1", " (the ratio clip is [1 - clip_low, 1 + clip_high]); use e.g. 0.2"))
    """PPO ratio clip below: ratios under 1 - clip_low stop contributing gradient"""
    clip_high: float = ranged(0.2, ">= 0")
    """PPO ratio clip above: ratios over 1 + clip_high stop contributing gradient"""
    trust_region: str = choice("clip", "clip", "prob_diff")
    """'clip': PPO ratio clipping (clip_low/clip_high); 'prob_diff': no gradient for tokens whose probability
    moved more than prob_diff_high up (A > 0) or prob_diff_low down (A < 0) from the sampling policy"""
    prob_diff_low: float = ranged(0.2, ">= 0")
    """prob_diff trust region: largest probability drop below the sampling policy that still gets a push down"""
    prob_diff_high: float = ranged(0.2, ">= 0")
    """prob_diff trust region: largest probability rise above the sampling policy that still gets a push up"""
    kl_coef: float = ranged(0.0, ">= 0")
    """weight of the k3 KL estimate to the sampling policy (0 = off)"""
    micro_batch_rollouts: int = ranged(0, ">= 0")
    """rollouts per forward/backward micro-batch (0 = the whole batch at once)"""
    direction_every: int = ranged(10, ">= 0")
    """the direction diagnostic (`direction_gap` in metrics/policy_trainer.jsonl; docs/value_functions.md,
    "Direction of a step") on every Nth policy step: one extra no-grad forward of the batch, ~20% of a step of the
    embedded run on 2 cores (1 = every step, as the end-to-end tests check it; 0 = never)"""
    pack_sequences: bool = True
    """policy trainer and the warm start's SFT: lay each micro-batch's rollouts end to end in lines of at least 64
    tokens (first-fit decreasing, critic_io.Packing) instead of one right-padded row each; the same logprobs,
    fewer positions computed (docs/benchmarks.md, "Against the machine's peak")"""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """supervised warm start before RL"""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters for the policy trainer (version 0, the warm start's full model, is the base)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        model = cfg.policy.model
        if model == VISION_MODEL:  # what task=vision's check says of the pipeline (config/task.py) applies too
            if cfg.task.name != "vision":
                raise ConfigError(f"policy.model={VISION_MODEL} is the vision-language policy of task=vision; use "
                                  f"policy=tiny with task={cfg.task.name}")
            return
        if is_gguf(model):
            if environment:
                run_check(GGUF_CHECK, cfg, environment)  # the file, read without loading it (prime_values/gguf.py)
        elif environment and model != "tiny" and not Path(model).expanduser().is_dir() and \
                (path_like(model) or "/" not in model):
            raise ConfigError(f"policy.model={model!r} is neither 'tiny' nor an existing directory; give the path of a "
                              "from_pretrained directory, a hub id like 'Qwen/Qwen3-0.6B', or 'tiny'")

    @staticmethod
    def check_attention(cfg, environment: bool) -> None:
        """policy.attn_implementation=flash_attention_2 can run here: flash-attn, a bf16 dtype, CUDA devices."""
        if cfg.policy.attn_implementation != "flash_attention_2" or not environment:
            return
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError("policy.attn_implementation=flash_attention_2 but flash-attn is not installed: pip "
                              "install flash-attn, or use policy.attn_implementation=auto (sdpa without it)")
        if cfg.policy.dtype == "float32":
            raise ConfigError("policy.attn_implementation=flash_attention_2 needs policy.dtype=bfloat16 or bf16-mixed "
                              "(or auto on CUDA; flash-attn has no float32 kernels), or use "
                              "policy.attn_implementation=auto")
        on_cpu = [f"topology.{r}_device" for r in ROLE_DEVICES
                  if cfg.topology[f"{r}_device"] == "cpu" and not (r == "evaluator" and
                                                                   cfg.topology.evaluator == "colocated")]
        if on_cpu:
            raise ConfigError(f"policy.attn_implementation=flash_attention_2 needs CUDA devices, but {on_cpu[0]}=cpu; "
                              "use policy.attn_implementation=auto (flash where it can run, sdpa elsewhere)")
