"""Room for RL on a task: the warm-started policy's greedy accuracy against its pass@k at the sampling temperature,
on the task's held-out set. A task leaves a method room to assign credit when sampling often finds an answer that
greedy decoding misses (pass@8 well above greedy accuracy); it has room for *per-token* credit when its replies are
long and an early token decides the outcome (mean reply length reported).

    python -m bench.task_headroom --experiment arith_chain --out /tmp/headroom          # warm start + measure
    python -m bench.task_headroom --experiment arith_chain --out /tmp/headroom --record  # ... and commit a record

The warm start is the experiment's own (`policy.warm_start.*`), made by a one-step run with advantage=batch_mean
(no critic pretraining: only the policy matters here; any group size) in `<out>/<experiment>-ws<S>`; a rerun
reuses it. Then, in this process, every held-out problem is decoded greedily once and sampled `--samples` times at
`inference.temperature`; pass@k is the unbiased estimator of the eval stage (prime_values/stages/evaluate.py).
`--record` writes `bench/records/headroom/<experiment>-ws<S>.json`, stamped (bench.common.stamp).
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

from bench.common import RECORDS, ROOT, command_line, run_attention, stamp, write_record


def warm_start(run: Path, experiment: str, warm_seed: int, overrides: list[str]) -> Path:
    """`<run>/weights/policy/0`, made by a one-step run of the experiment with the batch mean for a baseline (no
    critic roles, any group size) unless it exists."""
    policy = run / "weights" / "policy" / "0"
    if not policy.is_dir():
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-m", "prime_values", f"+experiment={experiment}", "advantage=batch_mean",
                        "steps=1", "eval_every=1", "log.plots=false", f"policy.warm_start.seed={warm_seed}", *overrides,
                        f"hydra.run.dir={run}"], cwd=ROOT, env=env, check=True)
    return policy


def measure(run: Path, policy: Path, samples: int, ks: list[int]) -> dict:
    """Greedy accuracy, pass@k at the run's sampling temperature, and reply lengths on the held-out set."""
    import torch
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from prime_values.models import load_policy
    from prime_values.rollout import sample_and_score
    from prime_values.stages.evaluate import summarise
    from prime_values.tasks import make_task

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1)))
    cfg = OmegaConf.load(run / "config.yaml")
    task = make_task(**cfg.task)
    tokenizer = AutoTokenizer.from_pretrained(policy)
    attention = run_attention(cfg)  # the run's precision: its held-out figure and this one decode alike
    model = load_policy(policy, attention).eval()
    problems = task.heldout()
    began = time.time()

    def run_all(n: int, temperature: float) -> list:
        return sample_and_score(model, tokenizer, task, problems, num_samples=n,
                                max_new_tokens=cfg.inference.max_new_tokens, temperature=temperature, seed=0,
                                batch_size=256)
    greedy = run_all(1, 0.0)
    sampled = run_all(samples, cfg.inference.temperature)
    correct = [sum(r.reward >= 1.0 for r in sampled if r.prompt_index == i) for i in range(len(problems))]
    lengths = [sum(r.policy_mask) for r in sampled]  # reply tokens, eos included
    return {"heldout": len(problems), "precision": attention.dtype,
            "greedy_accuracy": statistics.fmean(r.reward >= 1.0 for r in greedy),
            "temperature": cfg.inference.temperature, "samples": samples,
            **summarise(correct, samples, ks), "reply_tokens_mean": statistics.fmean(lengths),
            "reply_tokens_min": min(lengths), "answer_tokens_min": min(len(p.answer) + 1 for p in problems),
            "measure_s": round(time.time() - began, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", required=True, help="+experiment=<this>")
    ap.add_argument("--out", required=True, help="where the warm-start runs live (reused by a rerun)")
    ap.add_argument("--warm-seed", type=int, default=0, help="policy.warm_start.seed (default 0)")
    ap.add_argument("--samples", type=int, default=8, help="samples per held-out problem (default 8)")
    ap.add_argument("--record", action="store_true", help="write bench/records/headroom/<experiment>-ws<S>.json")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for the warm start")
    args = ap.parse_args(argv)
    run = Path(args.out) / f"{args.experiment}-ws{args.warm_seed}"
    policy = warm_start(run, args.experiment, args.warm_seed, args.overrides)
    ks = sorted({1, args.samples, *(k for k in (4,) if k < args.samples)})
    result = measure(run, policy, args.samples, ks)
    result["pass_minus_greedy"] = result[f"pass@{args.samples}"] - result["greedy_accuracy"]
    record = stamp(experiment=args.experiment, warm_seed=args.warm_seed, overrides=args.overrides, **result,
                   command=command_line("task_headroom", argv))
    print(json.dumps(record, indent=1))
    if args.record:
        write_record(RECORDS / "headroom" / f"{args.experiment}-ws{args.warm_seed}.json", record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
