"""LoRA (PEFT) for the policy and the critic: adapter-only versions, in-place adoption, merge on demand.

With `policy.lora.enabled` / `critic.lora.enabled` a trainer freezes the base model and trains low-rank adapters
on `target_modules` (the critic's value head `score` stays fully trainable: PEFT's `modules_to_save`). Each
published version then holds only the adapter, as PEFT writes it, plus the tokenizer and a base record:

    weights/policy/<v>/adapter_model.safetensors   the LoRA A/B matrices (and, for the critic, the value head)
                       adapter_config.json         PEFT's config; base_model_name_or_path = the base's absolute path
                       lora_base.json              {"base_version": 0, "base_path": "/abs/run/weights/policy/0"}
                       tokenizer files, optimizer.pt (as for full versions)

The base is the full version the adapter was first put on (version 0, published by the warm start; `prune` never
removes it). Adopters (`Adopting`) hold one base model and, for each new adapter version on that same base, load
only the adapter tensors into it (no model reload). `load_merged` / `merge` (also `python -m
prime_values.models.lora merge <version_dir> <out_dir>`) fold an adapter into its base for tools that want a
plain `from_pretrained` directory; `load_policy` / `load_critic` merge automatically when given an adapter dir
(the loading side, `load_merged` and the base record, is in models/build.py, below this module).

peft is imported lazily: runs without LoRA never need it (`pip install 'prime_values[lora]'`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer

# the loading side of adapter versions lives in build (load_policy / load_critic merge them); re-exported here
from prime_values.models.build import (
    ADAPTER_CONFIG,
    BASE_RECORD,
    DEFAULT_ATTENTION,
    Attention,
    _quiet_peft,
    base_of,
    is_adapter,
    load_critic,
    load_merged,
    load_policy,
    save_model,
)

ADAPTER_WEIGHTS = "adapter_model.safetensors"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
TASK_TYPES = {"policy": "CAUSAL_LM", "critic": "TOKEN_CLS"}


def _load_full(path: Path, kind: str, attention: Attention = DEFAULT_ATTENTION):
    return (load_critic if kind == "critic" else load_policy)(path, attention)


def _record_base(model, base: Path) -> None:
    base = Path(base).resolve()
    model.pv_lora_base = {"base_version": int(base.name) if base.name.isdigit() else None, "base_path": str(base)}


def wrap(model, lcfg, kind: str, base: str | os.PathLike, seed: int = 0):
    """A fresh LoRA adapter (B = 0: the same outputs as `model`) on the full model loaded from `base`; only the
    adapter (and the critic's value head) is trainable. `seed` fixes the A matrices' initialisation."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=int(lcfg.r), lora_alpha=float(lcfg.alpha), lora_dropout=float(lcfg.dropout),
                        target_modules=list(lcfg.target_modules), task_type=TASK_TYPES[kind])
    with torch.random.fork_rng(devices=[]), _quiet_peft():
        torch.manual_seed(seed)
        peft_model = get_peft_model(model, config)
    _record_base(peft_model, base)
    return peft_model


def load_trainable(path: str | os.PathLike, lcfg, kind: str, seed: int = 0,
                   attention: Attention = DEFAULT_ATTENTION):
    """For a (re)starting trainer: an adapter version -> its base with the adapter, trainable; a full version (the
    warm start's version 0) -> a fresh adapter on it (`wrap`)."""
    from peft import PeftModel

    path = Path(path)
    if not is_adapter(path):
        return wrap(_load_full(path, kind, attention), lcfg, kind, base=path, seed=seed)
    base = base_of(path)
    with _quiet_peft():
        model = PeftModel.from_pretrained(_load_full(base, kind, attention), str(path), is_trainable=True)
    _record_base(model, base)
    return model


def trainer_loader(lcfg, kind: str, seed: int = 0, attention: Attention = DEFAULT_ATTENTION):
    """`load(path)` for `weights.resume`: LoRA-trainable models when `lcfg.enabled`, plain full models otherwise."""
    if lcfg.enabled:
        return lambda path: load_trainable(path, lcfg, kind, seed, attention)
    return lambda path: _load_full(Path(path), kind, attention)


def trainable(model) -> list[torch.nn.Parameter]:
    """The parameters an optimizer should hold: all of them for a full model, the adapter (+ value head) for LoRA."""
    return [p for p in model.parameters() if p.requires_grad]


def protected(model) -> tuple[int, ...]:
    """Versions `weights.prune` must keep: 0 always, and the base version an adapter was put on."""
    record = getattr(model, "pv_lora_base", None) or {}
    version = record.get("base_version")
    return (0,) if version in (None, 0) else (0, version)


def save_adapter(model, tokenizer, path: str | os.PathLike) -> None:
    """An adapter-only version: PEFT's adapter files, the tokenizer and the base record (see the module doc)."""
    path = Path(path)
    save_model(model, tokenizer, path)  # save_pretrained of a PeftModel writes the adapter only
    (path / "README.md").unlink(missing_ok=True)  # PEFT's model-card stub
    record = model.pv_lora_base
    config_file = path / ADAPTER_CONFIG
    config = json.loads(config_file.read_text())
    config["base_model_name_or_path"] = record["base_path"]  # what vLLM / PeftModel.from_pretrained users read
    config_file.write_text(json.dumps(config, indent=2) + "\n")
    (path / BASE_RECORD).write_text(json.dumps(record) + "\n")


def saver(lcfg):
    """`save(model, tokenizer, path)` for a trainer's publication: adapter-only with LoRA, the full model otherwise."""
    return save_adapter if lcfg.enabled else save_model


def _signature(path: Path) -> tuple:
    config = json.loads((path / ADAPTER_CONFIG).read_text())
    return tuple(json.dumps(config.get(k), sort_keys=True) for k in
                 ("peft_type", "task_type", "r", "lora_alpha", "target_modules", "modules_to_save", "use_dora",
                  "use_rslora", "rank_pattern", "alpha_pattern"))


class Adopting:
    """`load(path)` for `weights.Adopter` (inference, evaluator) that adopts adapter versions in place.

    A full version is loaded as before (`load_full(path).to(device)`). The first adapter version loads its base
    and wraps it (PEFT); every later adapter version on the same base with the same adapter shape only reads its
    adapter_model.safetensors and copies those tensors into the held model, which is returned again (the same
    object). The file is read completely before the model is touched, so a damaged version leaves the held
    weights as they were (the Adopter skips it). `in_place` counts in-place adoptions.

    What is returned for an adapter version is the transformers model itself with PEFT's LoRA layers inside
    (`PeftModel.get_base_model()`), so callers see the usual forward signature (e.g. the `cache` argument)."""

    def __init__(self, load_full, device: str = "cpu"):
        self.load_full, self.device = load_full, device
        self.model = None  # the PeftModel wrapping the held base (adapter versions only)
        self.key: tuple | None = None  # (base dir, adapter signature) of the held adapter model
        self.in_place = 0

    def __call__(self, path: str | os.PathLike):
        path = Path(path)
        if not is_adapter(path):
            self.model, self.key = None, None
            return self.load_full(path).to(self.device)
        from peft import PeftModel, set_peft_model_state_dict

        key = (str(base_of(path).resolve()), _signature(path))
        if self.model is not None and self.key == key:
            state = load_file(str(path / ADAPTER_WEIGHTS), device=str(self.device))
            result = set_peft_model_state_dict(self.model, state)
            if result.unexpected_keys:
                raise KeyError(f"{path}: adapter tensors that the held model lacks: {result.unexpected_keys[:3]}")
            self.in_place += 1
            return self.model.get_base_model()
        with _quiet_peft():
            model = PeftModel.from_pretrained(self.load_full(base_of(path)), str(path)).to(self.device).eval()
        self.model, self.key = model, key
        return model.get_base_model()


def merge(version_dir: str | os.PathLike, out_dir: str | os.PathLike) -> Path:
    """Write the merged model of an adapter version (and its tokenizer) to `out_dir`, loadable with
    `AutoModelForCausalLM` (policy) / `AutoModelForTokenClassification` (critic) `.from_pretrained`."""
    version_dir, out_dir = Path(version_dir), Path(out_dir)
    if not is_adapter(version_dir):
        raise ValueError(f"{version_dir} is not an adapter version (no {ADAPTER_CONFIG}); it is already loadable")
    tokenizer_dir = version_dir if (version_dir / "tokenizer_config.json").is_file() else base_of(version_dir)
    save_model(load_merged(version_dir), AutoTokenizer.from_pretrained(str(tokenizer_dir)), out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_values.models.lora",
                                     description="LoRA versions of a prime_values run")
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="merge an adapter version into its base: a plain from_pretrained directory")
    m.add_argument("version_dir", help="an adapter version, e.g. <run>/weights/policy/12")
    m.add_argument("out_dir", help="where to write the merged model (created)")
    args = parser.parse_args(argv)
    try:
        out = merge(args.version_dir, args.out_dir)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
