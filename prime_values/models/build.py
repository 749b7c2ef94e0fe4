"""Building, saving and loading the tiny policy (causal LM) and critic (per-token value model).

Both are standard transformers Qwen3 architectures, so ``save_model`` output reloads with
``AutoModelForCausalLM`` / ``AutoModelForTokenClassification.from_pretrained`` (and vLLM for the
policy). The critic is ``Qwen3ForTokenClassification`` with ``num_labels = 1``: one value per
position, computed causally (position ``t`` sees tokens ``<= t`` only).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    PreTrainedModel,
    Qwen2VLForConditionalGeneration,
    Qwen3Config,
)
from transformers.utils import is_flash_attn_2_available, logging as hf_logging

from . import vision  # registers the vision-language critic with AutoModelForTokenClassification

# 0.80M parameters (800,640) with the 100-token char vocabulary (tied embeddings).
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

# --- attention kernel and precision (policy.attn_implementation, policy.dtype): an `Attention` resolved once per
# process for its device (`configure_attention`) and passed to every builder and loader below -----------------------
#
# sdpa and eager measured within noise of each other for the tiny sizes on 2 CPU threads; sdpa is the transformers
# default and what larger models want. flash-attn (flash_attention_2) is faster on a GPU for long sequences, but it
# has CUDA kernels only, and only for float16 / bfloat16. What transformers 5.x does with a float32 model and
# flash_attention_2 (integrations/flash_attention.py, modeling_utils._flash_attn_can_dispatch): loading only *warns*
# ("Flash Attention 2 only supports torch.float16 and torch.bfloat16 dtypes ... use autocast or load with dtype");
# in the forward pass get_target_dtype() casts float32 q/k/v only under torch.autocast (to the autocast dtype), and
# otherwise "casts" them to the dtype of the model's Linear weights -- float32 again -- so flash-attn raises at the
# first forward. So flash needs autocast around every forward or half-precision weights: 'auto' picks it for
# policy.dtype=bfloat16 (bf16 weights) and bf16-mixed (fp32 weights, every forward under bf16 autocast), on CUDA.
#
# The precision modes (policy.dtype; the policy and the critic, in every role):
#   float32     fp32 weights and compute.
#   bfloat16    "pure" bf16 weights and compute: half the memory, but AdamW updates smaller than ~1/256 of a weight
#               are lost (no fp32 master copy).
#   bf16-mixed  fp32 weights (they are the optimizer's master copy; gradients and Adam moments fp32), every forward
#               of the model under torch.autocast(bfloat16): matmuls and attention in bf16, reductions, norms and
#               softmax where autocast keeps them fp32; the critic's value head (`score`) runs in fp32 outside
#               autocast, and logits / values / losses are fp32. Under FSDP2 (several trainer processes) the blocks
#               are all-gathered in bf16 (MixedPrecisionPolicy) and their gradients reduced in fp32 (dist.shard).
#   auto        bf16-mixed on a CUDA device and on a CPU that multiplies bf16 natively (avx512_bf16 or AMX, as
#               oneDNN allows it here), float32 elsewhere (resolved per process from its device, logged). A CPU
#               without them computes a bf16 matmul ~100x slower than fp32 (0.9 vs 99 GFLOP/s a core with torch
#               held to AVX2), so an explicit bfloat16 / bf16-mixed there is kept but its log line says so.
ATTN_CHOICES = ("auto", "sdpa", "eager", "flash_attention_2")
PRECISIONS = ("float32", "bfloat16", "bf16-mixed", "auto")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "bf16-mixed": torch.float32}  # weight dtypes


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of a CPU with bf16 multiply instructions


AVX2_KERNELS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
"""the environment that holds torch, MKL and oneDNN to AVX2 kernels in a process started with it: how an AVX2-only
machine rounds, on a newer CPU (bench/readme_run.py, bench/smollm_grid.py)"""


def cpu_model(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU's model name from `cpuinfo` ('unknown' where it cannot be read), for stamping records."""
    try:
        lines = Path(cpuinfo).read_text().splitlines()
    except OSError:
        return "unknown"
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), "unknown")


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> set[str] | None:
    """The CPU's feature flags from `cpuinfo` (None where it cannot be read)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return None
    return {flag for line in text.splitlines() if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


@functools.lru_cache(maxsize=None)
def cpu_bf16_native(cpuinfo: str = "/proc/cpuinfo") -> tuple[bool, str]:
    """Whether this CPU multiplies bf16 natively (an avx512_bf16 or amx_bf16 flag, and oneDNN allowed to use it: not
    held below AVX-512 by ONEDNN_MAX_CPU_ISA), and what was found."""
    flags = cpu_flags(cpuinfo)
    if flags is None:
        return False, f"no {cpuinfo} to read the CPU's flags from"
    found = [f for f in CPU_BF16_FLAGS if f in flags]
    if not found:
        return False, "the CPU has no avx512_bf16 or amx_bf16"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return False, f"the CPU has {'/'.join(found)} but oneDNN may not use it (ONEDNN_MAX_CPU_ISA)"
    return True, f"the CPU has {'/'.join(found)}"


def resolve_dtype(requested: str, device: str, native_bf16: tuple[bool, str] | None = None) -> tuple[str, str]:
    """(precision mode, why) for policy.dtype=`requested` on `device`: 'auto' is bf16-mixed on CUDA and on a CPU that
    multiplies bf16 natively (`native_bf16`, default: `cpu_bf16_native()`), else float32."""
    if requested not in PRECISIONS:
        raise ValueError(f"policy.dtype={requested!r} is not allowed; choose one of {', '.join(PRECISIONS)}")
    on_cuda = str(device).startswith("cuda")
    if requested == "float32" or (on_cuda and requested != "auto"):
        return requested, "policy.dtype"
    native, why = (True, "") if on_cuda else (native_bf16 or cpu_bf16_native())
    if requested != "auto":
        if native:
            return requested, "policy.dtype"
        return requested, (f"policy.dtype; slow here: {why}, so bf16 matmuls run ~100x slower than float32 "
                           "(policy.dtype=auto or float32)")
    if on_cuda:
        return "bf16-mixed", f"policy.dtype=auto on {device}"
    if native:
        return "bf16-mixed", f"policy.dtype=auto on {device}: {why}"
    return "float32", f"policy.dtype=auto on {device}: {why}"


@dataclass(frozen=True)
class Attention:
    """What a model gets when it is built or loaded: the attention implementation and the precision mode (a role
    resolves one for its device and passes it to every builder and loader; the default is sdpa in float32)."""

    implementation: str
    dtype: str  # a resolved precision mode: float32, bfloat16 or bf16-mixed
    reason: str
    dtype_reason: str = "policy.dtype"

    @property
    def torch_dtype(self) -> torch.dtype:
        """The weights' dtype (float32 for bf16-mixed)."""
        return DTYPES[self.dtype]

    @property
    def mixed(self) -> bool:
        return self.dtype == "bf16-mixed"

    def line(self) -> str:
        weights = {"float32": "weights float32", "bfloat16": "weights bfloat16 (pure bf16, no fp32 master copy)",
                   "bf16-mixed": "weights float32, compute bf16 autocast (bf16-mixed: fp32 master weights, value "
                                 "head and losses)"}[self.dtype]
        return f"attention: {self.implementation} ({self.reason}); {weights}" + (
            f" [{self.dtype_reason}]" if self.dtype_reason != "policy.dtype" else "")


DEFAULT_ATTENTION = Attention("sdpa", "float32", "default")  # what a model gets unless told (tests, tools)


@functools.lru_cache(maxsize=None)
def flash_attn_importable() -> tuple[bool, str]:
    """Whether flash-attn can be used by transformers here, and if not, why (checked once per process)."""
    if importlib.util.find_spec("flash_attn") is None:
        return False, "flash-attn not installed"
    try:
        importlib.import_module("flash_attn")
    except Exception as error:  # noqa: BLE001 - another model's state: fresh optimizer
        return False, f"flash-attn installed but does not import ({type(error).__name__}: {str(error)[:120]})"
    if not is_flash_attn_2_available():
        return False, "flash-attn installed but transformers cannot use it (no CUDA, or an unsupported version)"
    return True, "flash-attn installed"


def resolve_attention(requested: str, device: str, dtype: str = "float32",
                      flash: tuple[bool, str] | None = None) -> Attention:
    """The implementation for `requested` (policy.attn_implementation) on `device` with precision `dtype`
    (policy.dtype; 'auto' is resolved here for `device`).

    'auto': flash_attention_2 when flash-attn is importable, the device is CUDA and the compute is bf16 (bfloat16
    or bf16-mixed), else sdpa, with the reason. An explicit 'flash_attention_2' that cannot work raises ValueError
    (config.validate catches the same cases before any job starts). `flash` = (importable, why) overrides the check
    (tests)."""
    if requested not in ATTN_CHOICES:
        raise ValueError(f"policy.attn_implementation={requested!r} is not allowed; choose one of "
                         f"{', '.join(ATTN_CHOICES)}")
    dtype, dtype_reason = resolve_dtype(dtype, device)
    if requested in ("sdpa", "eager"):
        return Attention(requested, dtype, "policy.attn_implementation", dtype_reason)
    available, why = flash if flash is not None else flash_attn_importable()
    cuda = str(device).startswith("cuda")
    if requested == "flash_attention_2":
        if not available:
            raise ValueError(f"policy.attn_implementation=flash_attention_2 but {why}: pip install flash-attn, or use "
                             "policy.attn_implementation=auto")
        if not cuda:
            raise ValueError(f"policy.attn_implementation=flash_attention_2 needs a CUDA device (this model runs on "
                             f"{device}); use policy.attn_implementation=auto")
        if dtype == "float32":
            raise ValueError("policy.attn_implementation=flash_attention_2 needs policy.dtype=bfloat16 or bf16-mixed "
                             "(flash-attn has no float32 kernels)")
        return Attention("flash_attention_2", dtype, "policy.attn_implementation", dtype_reason)
    if not available:
        return Attention("sdpa", dtype, why, dtype_reason)
    if not cuda:
        return Attention("sdpa", dtype, f"flash-attn installed, but this model runs on {device}", dtype_reason)
    if dtype == "float32":
        return Attention("sdpa", dtype, "flash-attn installed, but policy.dtype=float32 and flash-attn needs bfloat16",
                         dtype_reason)
    return Attention("flash_attention_2", dtype, f"auto: flash-attn installed, {device}, {dtype}", dtype_reason)


def configure_attention(policy_cfg, device: str, log=None) -> Attention:
    """policy.attn_implementation / policy.dtype resolved for `device`, for the caller to pass to every model that
    build_* / load_* make (policy and critic alike); logs the choice on `log`."""
    attention = resolve_attention(policy_cfg.get("attn_implementation", "auto"), str(device),
                                  policy_cfg.get("dtype", "float32"))
    if log is not None:
        log.info(attention.line())
    return attention


def _device_type(module: torch.nn.Module) -> str:
    for p in module.parameters():
        return p.device.type
    return "cpu"


def apply_precision(model: PreTrainedModel, mixed: bool = False) -> PreTrainedModel:
    """bf16-mixed (`mixed`: Attention.mixed, policy.dtype=bf16-mixed): every call of `model` runs under
    torch.autocast(bfloat16) on its parameters' device, and the critic's value head (`score`) in fp32 outside it.
    The weights stay as they are (fp32: the optimizer's master copy). A no-op otherwise, and the second time.

    The forward is wrapped on the instance (functools.wraps keeps its signature), so every caller -- the trainers,
    the hf sampler's decode loop, the evaluator's scoring, the warm start -- gets the same numerics without knowing;
    a PEFT wrapper calls the wrapped forward too. (The wrapper holds this instance: a deep copy of the whole model
    would still run the original; nothing here copies one.)"""
    if not mixed or getattr(model, "pv_mixed", False):
        return model
    forward = model.forward

    @functools.wraps(forward)
    def autocast_forward(*args, **kwargs):
        with torch.autocast(_device_type(model), dtype=torch.bfloat16):
            return forward(*args, **kwargs)

    model.forward = autocast_forward
    head = getattr(model, "score", None)  # the critic's value head: hidden -> 1, fp32 costs nothing
    if type(head) is torch.nn.Linear:
        # its class, not its instance, changes: a copy (PEFT's modules_to_save copies the head it trains) computes
        # with its own weights, in fp32 too; the state dict and save_pretrained are unchanged
        head.__class__ = Fp32Linear
    model.pv_mixed = True
    return model


class Fp32Linear(torch.nn.Linear):
    """A Linear that computes in fp32 outside any autocast region (bf16-mixed: the critic's value head)."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            return torch.nn.functional.linear(hidden.float(), self.weight.float(),
                                              None if self.bias is None else self.bias.float())


def enable_checkpointing(model) -> None:
    """Activation checkpointing per transformer block (policy/critic.activation_checkpointing): each block's
    activations are recomputed in the backward pass instead of kept (transformers' per-layer
    gradient checkpointing, torch.utils.checkpoint non-reentrant: the same gradients, lower peak memory)."""
    kwargs = {"use_reentrant": False}
    target = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT (LoRA) wrapper
    if hasattr(target, "activation_checkpointing_enable"):  # transformers >= 5.2x; the old name warns there
        target.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        target.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


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


def tiny_config(tokenizer, attention: Attention = DEFAULT_ATTENTION, **arch) -> Qwen3Config:
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
    cfg._attn_implementation = attention.implementation
    return cfg


def _seeded_from_config(auto_cls, cfg, seed: int, attention: Attention) -> PreTrainedModel:
    # fork the RNG so building a model does not disturb the caller's global torch stream
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_cls.from_config(cfg, attn_implementation=attention.implementation, dtype=attention.torch_dtype)
    return apply_precision(model.to(attention.torch_dtype), attention.mixed)


def build_tiny_policy(tokenizer, seed: int = 0, attention: Attention = DEFAULT_ATTENTION, **arch) -> PreTrainedModel:
    """A freshly initialised ``Qwen3ForCausalLM`` sized for the tokenizer (`attention`'s precision, train mode)."""
    model = _seeded_from_config(AutoModelForCausalLM, tiny_config(tokenizer, attention, **arch), seed, attention)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return model


def build_tiny_vl_policy(tokenizer, seed: int = 0, attention: Attention = DEFAULT_ATTENTION,
                         **arch) -> PreTrainedModel:
    """A freshly initialised tiny ``Qwen2VLForConditionalGeneration`` (models/vision.py: VL_ARCH, `arch` overriding
    its keys) for a tokenizer with the vision tokens (`vision.build_vl_tokenizer`); `attention`'s precision."""
    cfg = vision.tiny_vl_config(tokenizer, attention, **arch)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration._from_config(
            cfg, attn_implementation=attention.implementation, dtype=attention.torch_dtype)
    for key in ("pad_token_id", "eos_token_id", "bos_token_id"):
        setattr(model.generation_config, key, getattr(tokenizer, key))
    return apply_precision(model.to(attention.torch_dtype), attention.mixed)


def load_policy(path: str | os.PathLike, attention: Attention = DEFAULT_ATTENTION) -> PreTrainedModel:
    if is_adapter(path):  # a LoRA version (models/lora.py): merged onto its base
        return load_merged(path, "policy", attention)
    with _quiet():
        auto = Qwen2VLForConditionalGeneration if _is_vision(path) else AutoModelForCausalLM
        model = auto.from_pretrained(str(path), dtype=attention.torch_dtype,
                                     attn_implementation=attention.implementation)
    vision.attach_run_images(model, path)  # a vision policy of a run reads the run's images (models/vision.py)
    return apply_precision(model.to(attention.torch_dtype), attention.mixed).eval()


def _is_vision(path: str | os.PathLike) -> bool:
    """A vision-language model (models/vision.py), told by its config's model_type: a saved directory's config.json,
    or a hub id's config (from the local cache when offline)."""
    file = Path(path) / "config.json"
    if file.is_file():
        return json.loads(file.read_text()).get("model_type") == "qwen2_vl"
    if Path(path).exists():
        return False
    try:
        return AutoConfig.from_pretrained(str(path)).model_type == "qwen2_vl"
    except (OSError, ValueError):
        return False  # the text path's loader reports what is wrong with it


def _critic_config(cfg) -> Qwen3Config:
    cfg.num_labels = 1  # must be set on the config: from_config(num_labels=1) raises in transformers 5.x
    cfg.classifier_dropout = 0.0  # a regression head: no dropout on the hidden state
    cfg.tie_word_embeddings = False  # the critic has no LM head to tie
    cfg.problem_type = "regression"
    return cfg


def build_critic(init_from: str | os.PathLike | None, tokenizer, seed: int = 0, depth: int = 0,
                 attention: Attention = DEFAULT_ATTENTION, **arch) -> PreTrainedModel:
    """A per-token value model (``AutoModelForTokenClassification``, one output per position).

    ``init_from=None``: a fresh backbone with the given ``arch``. ``init_from=<policy dir>``: the
    backbone (embeddings, layers, final norm) is copied from the saved policy and ``arch`` is
    ignored; the value head (``score``) is always fresh, seeded by ``seed``. ``depth > 0`` keeps only
    the first ``depth`` transformer blocks (critic.num_layers; 0 = all).
    """
    if init_from is None:
        cfg = _critic_config(tiny_config(tokenizer, attention, **arch))
        return keep_layers(_seeded_from_config(AutoModelForTokenClassification, cfg, seed, attention), depth)
    cfg = _critic_config(AutoConfig.from_pretrained(str(init_from)))
    cfg._attn_implementation = attention.implementation
    critic = _seeded_from_config(AutoModelForTokenClassification, cfg, seed, attention)
    policy = load_policy(init_from, attention)
    missing, unexpected = critic.model.load_state_dict(policy.model.state_dict(), strict=True)
    assert not missing and not unexpected
    vision.attach_run_images(critic, init_from)  # a vision critic reads the images of the policy's run
    return keep_layers(critic, depth)


def keep_layers(model: PreTrainedModel, num_layers: int) -> PreTrainedModel:
    """Keep the first `num_layers` transformer blocks of a Qwen/Llama-style model (0 = keep all); the config
    follows, so `save_pretrained` / `from_pretrained` round-trip the shallower model."""
    holder, config = vision.text_blocks(model)  # a vision-language model: its language model's blocks
    layers = holder.layers
    if num_layers == 0 or num_layers == len(layers):
        return model
    if not 0 < num_layers < len(layers):
        raise ValueError(f"critic.num_layers={num_layers}: the critic's initialisation has {len(layers)} "
                         f"transformer blocks; choose 1..{len(layers)} (or 0 for all)")
    holder.layers = layers[:num_layers]
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:num_layers]
    return model


def load_critic(path: str | os.PathLike, attention: Attention = DEFAULT_ATTENTION) -> PreTrainedModel:
    if is_adapter(path):  # a LoRA version (models/lora.py): merged onto its base
        return load_merged(path, "critic", attention)
    with _quiet():
        model = AutoModelForTokenClassification.from_pretrained(
            str(path), dtype=attention.torch_dtype, attn_implementation=attention.implementation
        )
    vision.attach_run_images(model, path)  # a vision critic of a run reads the run's images (models/vision.py)
    return apply_precision(model.to(attention.torch_dtype), attention.mixed).eval()


# --- LoRA versions, loaded merged: `load_policy` / `load_critic` of an adapter-only version (the training side,
# wrap / save / adopt, is prime_values/models/lora.py; peft is imported only here, on first use) ---------------

ADAPTER_CONFIG = "adapter_config.json"
BASE_RECORD = "lora_base.json"


def is_adapter(path: str | os.PathLike) -> bool:
    """True for an adapter-only version directory (PEFT's adapter_config.json, no full weights)."""
    return (Path(path) / ADAPTER_CONFIG).is_file()


def base_of(path: str | os.PathLike) -> Path:
    """The full model directory an adapter version was trained on: the sibling version `base_version` when it is
    there (the run directory may have moved), else the recorded absolute `base_path`."""
    path = Path(path)
    record_file = path / BASE_RECORD
    if record_file.is_file():
        record = json.loads(record_file.read_text())
        version = record.get("base_version")
        if version is not None and (path.parent / str(version) / "config.json").is_file():
            return path.parent / str(version)
        if record.get("base_path"):
            return Path(record["base_path"])
    base = json.loads((path / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    if not base:
        raise FileNotFoundError(f"{path} is an adapter without a recorded base model ({BASE_RECORD} missing)")
    return Path(base)


def kind_of(path: str | os.PathLike) -> str:
    """'policy' or 'critic', from the adapter's PEFT task type."""
    task = json.loads((Path(path) / ADAPTER_CONFIG).read_text()).get("task_type")
    return "critic" if task == "TOKEN_CLS" else "policy"


@contextlib.contextmanager
def _quiet_peft():
    """No transformers deprecation warning from PEFT's model inspection on every wrap / load."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        yield


def load_merged(path: str | os.PathLike, kind: str | None = None, attention: Attention = DEFAULT_ATTENTION):
    """The adapter version at `path` folded into its base: a plain transformers model (eval mode, float32)."""
    from peft import PeftModel

    path = Path(path)
    kind = kind or kind_of(path)
    base = base_of(path)
    with _quiet_peft():
        load = load_critic if kind == "critic" else load_policy
        model = PeftModel.from_pretrained(load(base, attention), str(path))
    return model.merge_and_unload().eval()


def critic_values(critic, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                  **images) -> torch.Tensor:
    """``[B, L]`` values, one per position (position ``t`` has seen tokens ``0..t``).

    Right padding is assumed (positions are 0..L-1); padded positions hold meaningless values.
    Gradients flow when called under grad mode (the value trainer); wrap in ``torch.no_grad()``
    to score. `images`: a vision critic's image inputs (``models.vision.VisionInputs.kwargs``).
    """
    out = critic(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **images)
    return out.logits.squeeze(-1).float()  # float32 values (and losses) whatever policy.dtype is


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


def save_optimizer_state(state: dict | torch.optim.Optimizer, path: str | os.PathLike) -> None:
    """The optimizer state that produced the weights in `path` (called inside `publish`, so it appears atomically
    with them): a restarted trainer resumes its Adam moments instead of starting them at zero, which would make
    its first steps after a restart larger than any before. `state`: what `dist.optimizer_state` gathered (the
    full state keyed by parameter name, whatever the process count), or an optimizer (its own state_dict)."""
    torch.save(state if isinstance(state, dict) else state.state_dict(), Path(path) / OPTIMIZER_STATE)


def read_optimizer_state(path: str | os.PathLike) -> tuple[dict | None, str]:
    """(the optimizer state saved with the version in `path`, or None; what happened, for the role's log). A
    version saved without one (log.optimizer_state_every) or an unreadable file is not fatal: None, and the
    trainer goes on with a fresh optimizer."""
    file = Path(path) / OPTIMIZER_STATE
    if not file.exists():
        return None, f"no optimizer state in {path}: fresh optimizer"
    try:
        return torch.load(file, map_location="cpu", weights_only=True), f"optimizer state restored from {file}"
    except Exception as error:  # noqa: BLE001 - an unreadable optimizer state means a fresh optimizer
        return None, f"optimizer state {file} unusable ({type(error).__name__}: {error}): fresh optimizer"


def load_optimizer_state(optimizer: torch.optim.Optimizer, path: str | os.PathLike) -> str:
    """Restore a single-process optimizer from the version in `path` (`read_optimizer_state`; a state that does
    not fit this optimizer is not fatal either); returns what happened."""
    state, said = read_optimizer_state(path)
    if state is None:
        return said
    try:
        optimizer.load_state_dict(state)
    except Exception as error:  # noqa: BLE001 - a state that does not fit means a fresh optimizer
        return f"optimizer state in {path} unusable ({type(error).__name__}: {error}): fresh optimizer"
    return said
