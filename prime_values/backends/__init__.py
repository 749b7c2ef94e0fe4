"""Inference backends: how the inference role samples from the newest policy version (`inference.backend`).

A backend holds the policy and follows the published versions; the role loop only sees this interface:

    backend.policy          a `weights.Adopter`: `.version`, `.skipped`, `.poll()`, `.wait(timeout_s, stop)`
    backend.sample(prompt_ids, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size=None)
                            -> list[models.sampling.Completion], grouped by prompt (prompt 0's samples first);
                            `logprobs[i] = log_softmax(logits / temperature)[token_i]` in float32
    backend.model           the transformers model, for tasks that drive their own turns (`task.rollout`); hf only
    backend.close()         stop what the backend started (vLLM's engine processes)

- `hf` (`hf.py`): transformers with the hand-written KV-cache decode loop of `models/sampling.py`, any device.
- `vllm` (`vllm.py`): vLLM's offline engine (`vllm.LLM`), new versions loaded into the running engine in place,
  LoRA versions served as `LoRARequest`s on the base; an optional extra (`pip install 'prime_values[vllm]'`).
- `auto`: `vllm` where it imports, `hf` otherwise (`choose`); each worker logs the choice and the reason in one
  line, so a machine without vLLM never strands a run (the GPU recipes' default, conf/inference/auto.yaml).

`missing(name)` names what a backend needs and is not installed (config validation calls it before any job
starts: an explicit `inference=vllm` without vLLM fails there in one line naming the extra); `make_backend` builds
one for the role.
"""

from __future__ import annotations

import importlib.util
import logging

BACKENDS = ("hf", "vllm", "auto")

TURN_TASKS = ("verifiers", "guess", "tools", "vision", "sudoku")
"""the tasks that drive their own turns (`task.rollout`) through the transformers model: hf only (vision: its
prompts carry images, which only the hf backend samples with)"""

INSTALL_HINT = {
    "vllm": "inference=vllm needs vLLM, which is not installed: pip install 'prime_values[vllm]' (pip install -e "
            "'.[vllm]' in a checkout; on a CPU-only machine see docs/inference.md)",
}


def installed(module: str) -> bool:
    """True when `module` can be imported (found without importing it: vLLM takes seconds to import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def missing(name: str) -> str | None:
    """One line saying how to install what backend `name` needs, or None when it is there."""
    if name == "vllm" and not installed("vllm"):
        return INSTALL_HINT["vllm"]
    return None


def choose(cfg, try_import: bool = True) -> tuple[str, str]:
    """inference.backend=auto: ('vllm' or 'hf', why). vLLM when it is installed and, with `try_import`, really
    imports (a wheel built for another torch or CUDA is installed but raises); the transformers backend otherwise,
    and always for a task that drives its own turns (TURN_TASKS: its episodes drive the transformers model)."""
    if cfg.task.name in TURN_TASKS:
        return "hf", f"task={cfg.task.name} rolls out its episodes through the transformers model"
    if not installed("vllm"):
        return "hf", "vLLM is not installed (pip install 'prime_values[vllm]' to use it)"
    if try_import:
        try:
            import vllm
        except Exception as error:  # noqa: BLE001 - any failure to import means: not usable here
            said = str(error).splitlines()[0][:160] if str(error) else ""
            return "hf", f"vLLM is installed but does not import ({type(error).__name__}: {said})"
        return "vllm", f"vLLM {getattr(vllm, '__version__', '?')} imports"
    return "vllm", "vLLM is installed"


def make_backend(cfg, device: str, policy_root, seed: int = 0, attention=None):
    """The inference backend `cfg.inference.backend` for a worker on `device`, following `policy_root`
    (inference.backend=auto: `choose`, logged in one line)."""
    name = cfg.inference.backend
    if name == "auto":
        name, why = choose(cfg)
        logging.getLogger("prime_values.backends").info("inference backend: %s (inference.backend=auto: %s)",
                                                        name, why)
    if name == "hf":
        from prime_values.backends.hf import HFBackend

        return HFBackend(policy_root, device, attention)
    if name == "vllm":
        from prime_values.backends.vllm import VLLMBackend

        return VLLMBackend(cfg, policy_root, device, seed=seed)
    raise ValueError(f"inference.backend={name!r}: choose one of {', '.join(BACKENDS)}")


def as_backend(policy):
    """A backend as is; a bare transformers model (tests, tools) wrapped as an hf backend holding it."""
    if hasattr(policy, "sample") and hasattr(policy, "policy"):
        return policy
    from prime_values.backends.hf import HFBackend

    return HFBackend.holding(policy)
