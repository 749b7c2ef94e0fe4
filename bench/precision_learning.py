"""Does the embedded experiment learn as well in bf16 mixed precision as in fp32? (a benchmark, not a test)

    python -m bench.precision_learning --dtypes float32,bf16-mixed --seeds 0,1,2 [--steps N] [--out DIR]

Runs `python -m prime_values +experiment=arith seed=S policy.dtype=D` for every pair (alternating dtypes, so a
change in the machine's load hits both), then prints one row per run: wall time, held-out accuracy gain (first RL
step -> last evaluation), the critic's explained variance over the last batches, and the first policy step's
importance-ratio statistics (ratio_mean, approx_kl, clip_fraction: the first step is on-policy, so they measure how
far the trainer's logprobs are from the sampler's in that precision), and per dtype the mean and [min-max] over
seeds. "Within the seed spread" means: the mixed runs' gains and EVs fall inside fp32's [min-max] widened by half
its width. Every role here runs on the CPU, where bf16 autocast works but is no faster; the speed figures are the
GPU check's (bench/gpu_check.py).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, add_seeds, command_line, write_record


def first_step(run: Path) -> dict:
    for line in (run / "metrics" / "policy_trainer.jsonl").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("step") == 1 and "ratio_mean" in row:
            return {k: row.get(k) for k in ("ratio_mean", "approx_kl", "clip_fraction")}
    return {}


def run_one(out: Path, dtype: str, seed: int, steps: int | None, extra: list[str]) -> dict:
    run = out / f"{dtype}-seed{seed}"
    args = [sys.executable, "-m", "prime_values", "+experiment=arith", f"seed={seed}", f"policy.dtype={dtype}",
            *([f"steps={steps}"] if steps else []), *extra, f"hydra.run.dir={run}"]
    began = time.time()
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    summary_file = run / "report" / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    first, final = summary.get("first_rl_step_accuracy"), summary.get("final_accuracy")
    return {"dtype": dtype, "seed": seed, "rc": done.returncode, "wall_s": time.time() - began,
            "gain": final - first if first is not None and final is not None else None,
            "first_accuracy": first, "final_accuracy": final, "ev": summary.get("final_explained_variance"),
            "policy_steps": summary.get("policy_steps"), **first_step(run), "run_dir": str(run),
            "error": done.stderr[-800:] if done.returncode else None}


def fmt(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="float32,bf16-mixed")
    add_seeds(ap, "0,1,2")
    ap.add_argument("--steps", type=int, default=None, help="policy steps (default: the experiment's)")
    ap.add_argument("--out", default="/tmp/precision_learning")
    ap.add_argument("overrides", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dtypes, seeds = args.dtypes.split(","), args.seeds
    results = []
    for seed in seeds:
        for dtype in dtypes:
            r = run_one(out, dtype, seed, args.steps, args.overrides)
            results.append(r)
            print(json.dumps(r), flush=True)
            write_record(out / "results.json",
                         {"command": command_line("precision_learning", argv), "runs": results})
    lines = ["| policy.dtype | seed | wall s | held-out gain | EV (last batches) | step 1 ratio_mean "
             "| step 1 approx_kl | step 1 clip_fraction |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['dtype']} | {r['seed']} | {fmt(r['wall_s'], '.0f')} | {fmt(r['gain'], '+.3f')} | "
                     f"{fmt(r['ev'])} | {fmt(r.get('ratio_mean'), '.5f')} | {fmt(r.get('approx_kl'), '.2e')} | "
                     f"{fmt(r.get('clip_fraction'), '.4f')} |")
    for dtype in dtypes:
        mine = [r for r in results if r["dtype"] == dtype and r["gain"] is not None]
        if mine:
            gains, evs = [r["gain"] for r in mine], [r["ev"] for r in mine if r["ev"] is not None]
            lines.append(f"| **{dtype}, {len(mine)} seeds** | | | {statistics.fmean(gains):+.3f} [{min(gains):+.3f}, "
                         f"{max(gains):+.3f}] | " + (f"{statistics.fmean(evs):.3f} [{min(evs):.3f}, {max(evs):.3f}]"
                                                     if evs else "-") + " | | | |")
    print("\n" + "\n".join(lines))
    (out / "results.md").write_text("\n".join(lines) + "\n")
    return results


if __name__ == "__main__":
    main()
