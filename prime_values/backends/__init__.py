"""Inference backends: how the inference role samples from the newest policy version (`inference.backend`).

A backend holds the policy and follows the published versions; the role loop only sees this interface:

    backend.policy          a `weights.Adopter`: `.version`, `.skipped`, `.poll()`, `.wait(timeout_s, stop)`
    backend.sample(prompt_ids, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size=None)
                            -> list[models.sampling.Completion], grouped by prompt (prompt 0's samples first);
                            `logprobs[i] = log_softmax(logits / temperature)[token_i]` in float32
    backend.model           the transformers model, for tasks that drive their own turns (`task.rollout`); hf only
    backend.sample_images(prompt_ids, images, ...)
                            vllm: `sample` with each prompt's pictures (task=vision; the hf backend samples them
                            through `backend.model`); `backend.config` the version's model config
    backend.close()         stop what the backend started (vLLM's engine processes)

- `hf` (`hf.py`): transformers with the hand-written KV-cache decode loop of `models/sampling.py`, any device.
- `vllm` (`vllm.py`): vLLM's offline engine (`vllm.LLM`), new versions loaded into the running engine in place,
  LoRA versions served as `LoRARequest`s on the base; an optional extra (`pip install 'prime_values[vllm]'`).
- `auto`: `vllm` where it imports, `hf` otherwise (`choose`); each worker logs the choice and the reason in one
  line, so a machine without vLLM never strands a run (the GPU recipes' default, conf/inference/auto.yaml).

The config checks the backend before any job starts (prime_values/config/inference.py: an explicit `inference=vllm`
without vLLM fails there in one line naming the extra; inference=auto's pick without importing anything,
`auto_backend`, which `choose` follows); `make_backend` builds one for the role. This package imports nothing but
the standard library at the top (vLLM's worker processes import it): the config package only where a backend is
chosen.
"""

from __future__ import annotations

import importlib.util
import logging

BACKENDS = ("hf", "vllm", "auto")


def installed(module: str) -> bool:
    """True when `module` can be imported (found without importing it: vLLM takes seconds to import)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def choose(cfg, try_import: bool = True) -> tuple[str, str]:
    """inference.backend=auto: ('vllm' or 'hf', why). vLLM when it is installed and, with `try_import`, really
    imports (a wheel built for another torch or CUDA is installed but raises); the transformers backend otherwise,
    and always for a task that drives its own turns (config.task.TURN_TASKS: its episodes drive the transformers
    model). Without `try_import`, what the config check says (config.inference.auto_backend)."""
    from prime_values.config.inference import auto_backend  # the config package (omegaconf): only where chosen

    name, why = auto_backend(cfg, installed("vllm"))
    if name != "vllm" or not try_import:
        return name, why
    try:
        import vllm
    except Exception as error:  # noqa: BLE001 - any failure to import means: not usable here
        said = str(error).splitlines()[0][:160] if str(error) else ""
        return "hf", f"vLLM is installed but does not import ({type(error).__name__}: {said})"
    return "vllm", f"vLLM {getattr(vllm, '__version__', '?')} imports"


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
