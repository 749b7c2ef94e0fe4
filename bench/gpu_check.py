"""The GPU check: one script, one table, for a lent GPU machine as it is (bench/gpu_check.sh runs it there).

    python -m bench.gpu_check --device cuda:0            # real shapes, <= --budget-s (default 330 s) of run time
    python -m bench.gpu_check --smoke                    # tiny shapes on the CPU, every code path in seconds (CI)

What it measures, per model shape (random weights built from the models' configs: speed needs no trained weights,
and the GPU machine has no network: SmolLM2-135M and Qwen3-0.6B), per precision mode (policy.dtype float32 vs
bf16-mixed) and, for the trainers, with and without activation checkpointing (policy/critic.activation_checkpointing):

- policy trainer: one real `train_step` (PPO-clip, fwd + bwd + AdamW) on a fixed batch: step time, tokens/s,
  peak GPU memory (torch.cuda.max_memory_allocated; on the CPU: -)
- value trainer: one real `critic_step` on the same batch: step time, states/s, peak memory
- inference (hf backend): `models.sampling.sample` of prompts x samples x new tokens: generated tokens/s
- evaluator: a no-grad critic forward over the batch: scored states/s; the scoring / generation ratio (goal >= 5)
- the first on-policy step's importance ratio per mode (float32, bf16-mixed, bfloat16): the hf backend's sampling
  logprobs (KV-cache decode) against the trainer's recomputation (one full forward), same weights
- the pipeline (not in --smoke; bench_pipeline.run_cases, every role on --device): wall s per policy step, async and
  lockstep, fp32 and bf16-mixed: on one chip the roles time-share it, so the <= 0.6 goal (separate devices) does
  not apply there; the table says what one chip gives.

Results: the table on stdout and in --out (gpu_check.md, gpu_check.json).
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import time
import types
from pathlib import Path

import torch

from bench.common import command_line, write_record

# Qwen/Qwen3-0.6B-Base and HuggingFaceTB/SmolLM2-135M config.json: what shapes the compute
SHAPES = {
    "qwen3-0.6b": ("Qwen3Config", dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                                       head_dim=128, max_position_embeddings=4096, rope_theta=1000000.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=True)),
    "smollm2-135m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                         head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                                         rms_norm_eps=1e-5, tie_word_embeddings=True)),
    # the --smoke shapes, one per architecture above: the same code in seconds on the CPU
    "tiny": ("Qwen3Config", dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1, head_dim=32,
                                 max_position_embeddings=256, tie_word_embeddings=True)),
    "tiny-llama": ("LlamaConfig", dict(vocab_size=512, hidden_size=96, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=3, num_key_value_heads=1, head_dim=32,
                                       max_position_embeddings=256, tie_word_embeddings=True)),
}
# the embedded model (policy.arch defaults) for the ratio check
EMBEDDED = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384)
MODES = ("float32", "bf16-mixed")


def configure(mode: str, device: str):
    from omegaconf import OmegaConf

    from prime_values.models import build

    return build.configure_attention(OmegaConf.create({"attn_implementation": "auto", "dtype": mode}), device)


def make_models(shape: str, mode: str, device: str):
    """(policy, critic) of `shape` with random weights, in precision `mode`, on `device` (train mode)."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

    from prime_values.models import build

    chosen = configure(mode, device)
    cls, arch = SHAPES[shape]
    cfg = getattr(transformers, cls)(**arch, pad_token_id=0, eos_token_id=arch["vocab_size"] - 1, bos_token_id=1,
                                     attention_dropout=0.0, use_cache=True)
    made = []
    for auto, config in ((AutoModelForCausalLM, cfg), (AutoModelForTokenClassification,
                                                        build._critic_config(copy.deepcopy(cfg)))):
        torch.manual_seed(0)
        with torch.device(device):
            model = auto.from_config(config, dtype=chosen.torch_dtype, attn_implementation=chosen.implementation)
        made.append(build.apply_precision(model, chosen.mixed).train())
    return made[0], made[1], chosen


def batch_rows(vocab: int, rollouts: int, prompt: int, response: int, seed: int = 0) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(rollouts):
        length = prompt + response
        rows.append({"token_ids": torch.randint(2, vocab - 1, (length,), generator=gen).tolist(),
                     "policy_mask": [0] * prompt + [1] * response,
                     "sampling_logprobs": [-float(torch.log(torch.tensor(float(vocab))))] * length,
                     "advantages": [0.0] * prompt + [float(torch.randn(1, generator=gen))] * response,
                     "privileged": "", "reward": float(i % 2), "value_targets": [float(i % 2)] * length})
    return rows


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def peak_reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str):
    return torch.cuda.max_memory_allocated() / 2**30 if device.startswith("cuda") else None


def timed(fn, device: str, repeats: int, warmup: int = 1) -> tuple[float, object]:
    """Median seconds of `fn()` over `repeats` calls after `warmup` (CUDA: synchronised), and the last result."""
    out = None
    for _ in range(warmup):
        out = fn()
    sync(device)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        out = fn()
        sync(device)
        times.append(time.perf_counter() - began)
    return statistics.median(times), out


def train_cfg(micro: int):
    from omegaconf import OmegaConf

    from prime_values.config import Config

    cfg = OmegaConf.structured(Config)
    cfg.policy.micro_batch_rollouts = micro
    cfg.critic.privileged = False
    cfg.critic.max_length = 1 << 16
    cfg.advantage.lambda_value = 1.0
    return cfg


def measure_shape(shape: str, device: str, sizes: dict, repeats: int, log) -> list[dict]:
    """The trainer, generation and scoring rows of one shape, every mode, with and without checkpointing."""
    from prime_values.critic_io import critic_step
    from prime_values.models import build
    from prime_values.models.build import critic_values
    from prime_values.models.sampling import sample
    from prime_values.roles.policy_trainer import train_step

    vocab = SHAPES[shape][1]["vocab_size"]
    rows = batch_rows(vocab, sizes["rollouts"], sizes["prompt"], sizes["response"])
    tokens = sum(len(r["token_ids"]) for r in rows)
    cfg = train_cfg(sizes["micro"])
    stub_tokenizer = types.SimpleNamespace(pad_token_id=0)
    out = []
    for mode in MODES:
        for checkpointing in (False, True):
            policy, critic, chosen = make_models(shape, mode, device)
            if checkpointing:
                build.enable_checkpointing(policy)
                build.enable_checkpointing(critic)
            p_opt = torch.optim.AdamW(policy.parameters(), lr=1e-6)
            c_opt = torch.optim.AdamW(critic.parameters(), lr=1e-6)
            peak_reset(device)
            p_s, _ = timed(lambda: train_step(policy, p_opt, rows, cfg, 0, device), device, repeats)
            p_peak = peak_gib(device)
            peak_reset(device)
            c_s, _ = timed(lambda: critic_step(critic, c_opt, rows, stub_tokenizer, cfg, device), device, repeats)
            c_peak = peak_gib(device)
            common = dict(shape=shape, precision=mode, checkpointing=checkpointing, attention=chosen.implementation)
            out.append({**common, "role": "policy trainer", "rate": tokens / p_s, "unit": "tokens/s",
                        "step_s": p_s, "peak_gib": p_peak})
            out.append({**common, "role": "value trainer", "rate": tokens / c_s, "unit": "states/s",
                        "step_s": c_s, "peak_gib": c_peak})
            log(f"  {shape} {mode} checkpointing={checkpointing}: policy step {p_s:.3f} s, critic step {c_s:.3f} s")
            if not checkpointing:  # inference and scoring do not train: once per mode
                policy.eval()
                critic.eval()
                gen = torch.Generator().manual_seed(1)
                prompts = [torch.randint(2, vocab - 1, (sizes["prompt"],), generator=gen).tolist()
                           for _ in range(sizes["prompts"])]
                peak_reset(device)
                with torch.no_grad():
                    g_s, completions = timed(lambda: sample(policy, prompts, num_samples=sizes["samples"],
                                                            max_new_tokens=sizes["new_tokens"], temperature=1.0,
                                                            eos_id=vocab - 1, pad_id=0, seed=0), device, 1, warmup=1)
                g_peak = peak_gib(device)
                generated = sum(len(c.response_ids) for c in completions)
                ids = torch.tensor([r["token_ids"] for r in rows], device=device)
                mask = torch.ones_like(ids)
                peak_reset(device)
                with torch.no_grad():
                    s_s, _ = timed(lambda: critic_values(critic, ids, mask), device, repeats)
                s_peak = peak_gib(device)
                score_rate, gen_rate = tokens / s_s, generated / g_s
                out.append({**common, "checkpointing": None, "role": "inference (hf)", "rate": gen_rate,
                            "unit": "tokens/s", "step_s": g_s, "peak_gib": g_peak,
                            "note": f"{len(completions)} samples x <= {sizes['new_tokens']} new tokens"})
                out.append({**common, "checkpointing": None, "role": "evaluator (scoring)", "rate": score_rate,
                            "unit": "states/s", "step_s": s_s, "peak_gib": s_peak})
                out.append({**common, "checkpointing": None, "role": "scoring / generation",
                            "rate": score_rate / gen_rate, "unit": "x", "goal": ">= 5",
                            "met": score_rate / gen_rate >= 5})
            policy = critic = p_opt = c_opt = None  # the closures above are done: free the device memory
            if device.startswith("cuda"):
                torch.cuda.empty_cache()
    return out


def ratio_check(device: str, arch: dict | None = None, prompts: int = 16, samples: int = 4,
                new_tokens: int = 16, model_path: str | None = None) -> dict:
    """The first on-policy step's importance ratio in each mode: sample with the hf backend's decode loop (KV
    cache, one token at a time), recompute the logprobs as the policy trainer does (one forward over the padded
    batch, `token_logprobs` in fp32), same weights: a fresh embedded model of `arch`, or the saved policy at
    `model_path` (e.g. a run's weights/policy/0, warm-started: trained logits are larger than a fresh model's, and
    so are their bf16 errors). {mode: {mean_abs_log_ratio, max_abs_log_ratio, ratio_mean}}."""
    from prime_values.algo.losses import token_logprobs
    from prime_values.critic_io import attention_mask, padded
    from prime_values.models import build_char_tokenizer, build_tiny_policy, load_policy
    from prime_values.models.sampling import sample

    if model_path:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_path)
    else:
        tok = build_char_tokenizer()
    text = ["12+34=", "7+8=", "99+1=", "5+60=", "3+3=", "40+2=", "18+27=", "6+9="]
    prompt_ids = [tok.encode(text[i % len(text)], add_special_tokens=False) for i in range(prompts)]
    found = {}
    for mode in ("float32", "bf16-mixed", "bfloat16"):
        chosen = configure(mode, device)
        model = (load_policy(model_path, chosen) if model_path else
                 build_tiny_policy(tok, seed=0, attention=chosen, **(arch or EMBEDDED))).to(device).eval()
        with torch.no_grad():
            completions = sample(model, prompt_ids, num_samples=samples, max_new_tokens=new_tokens,
                                 temperature=1.0, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0)
        rows = []
        for c in completions:
            prompt = prompt_ids[c.prompt_index]
            rows.append({"token_ids": prompt + list(c.response_ids),
                         "policy_mask": [0] * len(prompt) + [1] * len(c.response_ids),
                         "sampling_logprobs": [0.0] * len(prompt) + list(c.logprobs)})
        ids = padded(rows, "token_ids", torch.long, fill=tok.pad_token_id).to(device)
        mask = padded(rows, "policy_mask", torch.bool).to(device)
        sampled = padded(rows, "sampling_logprobs", torch.float32).to(device)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=attention_mask(rows).to(device), use_cache=False)
            trainer = token_logprobs(logits.logits.float(), ids, 1.0)
        log_ratio = (trainer - sampled)[mask]
        found[mode] = {"mean_abs_log_ratio": log_ratio.abs().mean().item(),
                       "max_abs_log_ratio": log_ratio.abs().max().item(),
                       "ratio_mean": log_ratio.exp().mean().item()}
    return found


def pipeline_rows(device: str, steps: int, log, smoke: bool = False) -> list[dict]:
    """Wall s per policy step of the embedded experiment with every role on `device`: async vs lockstep, fp32 and
    bf16-mixed (one shared warm start; bench_pipeline.run_cases)."""
    from bench import bench_pipeline

    cases = {"async": [], "lockstep": ["schedule.mode=lockstep"],
             "async_mixed": ["policy.dtype=bf16-mixed"], "lockstep_mixed": ["schedule.mode=lockstep",
                                                                             "policy.dtype=bf16-mixed"]}
    result = bench_pipeline.run_cases(None, smoke, steps, 1, cases=cases, log=log, device=device)
    runs = {name: rs[0] for name, rs in result["runs"].items() if rs}
    out = []
    for precision, suffix in (("float32", ""), ("bf16-mixed", "_mixed")):
        a, b = runs.get("async" + suffix), runs.get("lockstep" + suffix)
        for name, run in (("async", a), ("lockstep", b)):
            if run:
                out.append({"shape": "embedded", "role": f"pipeline, {name}: wall s per policy step",
                            "precision": precision, "rate": run["s_per_step"], "unit": "s/step"})
        if a and b:
            r = a["s_per_step"] / b["s_per_step"]
            out.append({"shape": "embedded", "role": "pipeline: async / lockstep wall per step",
                        "precision": precision, "rate": r, "unit": "x",
                        "goal": "<= 0.6 with separate devices; one chip time-shares it", "met": None})
    import shutil

    shutil.rmtree(result["base"], ignore_errors=True)
    return out


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.{digits}g}"
    return str(value)


def table(rows: list[dict]) -> list[str]:
    lines = ["| shape | role | precision | checkpointing | rate | step s | peak GPU GiB | attention | goal / note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        goal = r.get("goal", "")
        if r.get("met") is not None:
            goal += " (met)" if r["met"] else " (NOT met)"
        note = "; ".join(x for x in (goal, r.get("note", "")) if x)
        lines.append(f"| {r['shape']} | {r['role']} | {r.get('precision', '-')} | {fmt(r.get('checkpointing'))} | "
                     f"{fmt(r.get('rate'))} {r.get('unit', '')} | {fmt(r.get('step_s'))} | "
                     f"{fmt(r.get('peak_gib'), 3)} | {r.get('attention', '-')} | {note} |")
    return lines


def probe(device: str) -> dict:
    import importlib.util

    import transformers

    found = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
             "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else platform.processor() or "cpu"}
    for name in ("flash_attn", "vllm", "hydra", "omegaconf", "submitit"):
        found[name] = "installed" if importlib.util.find_spec(name) else "no"
    from prime_values.models.build import flash_attn_importable

    found["flash_attn_usable"] = flash_attn_importable()[1]
    return found


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cuda:0 (default: cuda:0 where CUDA is, else cpu)")
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, no pipeline: every code path in seconds")
    ap.add_argument("--shapes", default=None, help="comma-separated of " + ", ".join(SHAPES))
    ap.add_argument("--pipeline-steps", type=int, default=None, help="policy steps per pipeline run (0: skip; "
                    "default 12, with --smoke 0: --smoke --pipeline-steps 3 runs bench_pipeline's smoke sizes)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repetitions of each trainer step")
    ap.add_argument("--budget-s", type=float, default=330.0, help="seconds: a shape or the pipeline part that would "
                    "not fit is skipped (and named in the table's header)")
    ap.add_argument("--out", default=None, help="folder for gpu_check.md / gpu_check.json")
    ap.add_argument("--ratio-model", default=None, help="the ratio check on this saved policy (e.g. a run's "
                    "weights/policy/0) instead of a fresh embedded model")
    args = ap.parse_args(argv)
    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {device}: no CUDA device here; use --smoke (or --device cpu)")
    shapes = (args.shapes or ("tiny,tiny-llama" if args.smoke else "smollm2-135m,qwen3-0.6b")).split(",")
    for s in shapes:
        if s not in SHAPES:
            ap.error(f"--shapes: unknown shape {s!r}; choose from {', '.join(SHAPES)}")
    sizes = (dict(rollouts=4, micro=2, prompt=8, response=16, prompts=2, samples=2, new_tokens=8) if args.smoke else
             dict(rollouts=16, micro=8, prompt=64, response=448, prompts=16, samples=4, new_tokens=128))
    repeats = args.repeats or (1 if args.smoke else 3)
    pipeline_steps = args.pipeline_steps if args.pipeline_steps is not None else (0 if args.smoke else 12)
    started = time.time()

    def log(text: str) -> None:
        print(f"[{time.time() - started:5.0f} s] {text}", flush=True)

    info = probe(device)
    log(json.dumps(info))
    torch.manual_seed(0)
    rows: list[dict] = []
    skipped = []
    for shape in shapes:
        if time.time() - started > args.budget_s:
            skipped.append(shape)
            continue
        log(f"{shape}: trainers, generation, scoring ({', '.join(MODES)}; checkpointing off/on)")
        rows += measure_shape(shape, device, sizes, repeats, log)
    log(f"first on-policy ratio ({args.ratio_model or 'fresh embedded model'})")
    ratios = ratio_check(device, SHAPES_ARCH_SMOKE if args.smoke else None, model_path=args.ratio_model)
    for mode, r in ratios.items():
        rows.append({"shape": "warm-started" if args.ratio_model else "embedded",
                     "role": "first on-policy step: sampling vs trainer logprobs", "precision": mode,
                     "rate": r["mean_abs_log_ratio"], "unit": "mean abs log-ratio",
                     "note": f"max abs log-ratio {r['max_abs_log_ratio']:.2e}, ratio mean {r['ratio_mean']:.5f}"})
    def report(final: bool) -> float:
        """The table so far, printed and written (before the pipeline too: a run cut by its timeout keeps it)."""
        lines = table(rows)
        wall = time.time() - started
        header = (f"`{command_line('gpu_check', argv)}` on "
                  f"{info['device']} (torch {info['torch']}, transformers {info['transformers']}, flash-attn: "
                  f"{info['flash_attn_usable']}; vllm: {info['vllm']}): {wall:.0f} s"
                  + ("" if final else " so far (the pipeline part follows)")
                  + (f"; skipped for the budget: {', '.join(skipped)}" if skipped else ""))
        sizes_line = (f"trainer batch {sizes['rollouts']} rollouts x {sizes['prompt'] + sizes['response']} tokens "
                      f"(micro-batches of {sizes['micro']}); generation {sizes['prompts']} prompts x "
                      f"{sizes['samples']} samples x {sizes['new_tokens']} new tokens; rates are tokens (states) per "
                      "second of the step; peak memory: torch.cuda.max_memory_allocated over the part")
        print("\n" + header + "\n" + sizes_line + "\n\n" + "\n".join(lines) + "\n", flush=True)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "gpu_check.md").write_text("\n".join([header, "", sizes_line, "", *lines]) + "\n")
            write_record(out / "gpu_check.json", {"command": command_line("gpu_check", argv), "info": info,
                                                  "sizes": sizes, "rows": rows, "wall_s": wall, "skipped": skipped,
                                                  "final": final})
        return wall

    # the pipeline part: a shared warm start (~45 s on the H200 of 2026-11-30) and 4 runs of ~40 s (role start-up
    # dominates at 12 steps); started only when that still fits the budget
    if pipeline_steps and time.time() - started < args.budget_s - (0 if args.smoke else PIPELINE_EST_S):
        report(final=False)
        log(f"pipeline: async / lockstep x fp32 / bf16-mixed, {pipeline_steps} policy steps each, every role on "
            f"{device}")
        try:
            rows.extend(pipeline_rows(device, pipeline_steps, log, smoke=args.smoke))
        except Exception as error:  # noqa: BLE001 - the table still comes out, with the failure in it
            rows.append({"shape": "embedded", "role": "pipeline", "note": f"FAILED: {type(error).__name__}: "
                                                                          f"{str(error)[:300]}"})
    elif pipeline_steps:
        skipped.append("pipeline")
    wall = report(final=True)
    return {"info": info, "rows": rows, "skipped": skipped, "wall_s": wall}


PIPELINE_EST_S = 210
SHAPES_ARCH_SMOKE = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128)

if __name__ == "__main__":
    main()
