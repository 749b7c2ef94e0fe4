"""The README run (`python -m prime_values +experiment=arith`) over seeds and kernel variants: where its time goes
(SFT, critic pretraining, policy steps; each role's compute / wait / io and CPU per wall second) and its held-out
accuracy curve, one small record per run under bench/records/readme/<label>/seed<S>.json (stamped with the commit,
date, CPU, its flags and the kernels torch ran), and a table side by side.

    python -m bench.readme_run --label L --seeds 0,1,2 --kernels native,avx2  # the README promise: 6 runs
    python -m bench.readme_run --label old --seeds 0,1,2 -- steps=300 ...     # the same with overrides
    python -m bench.readme_run --record <run_dir> --label new --seed 0        # keep a finished run as a record
    python -m bench.readme_run --report [--labels A,B]                        # the table from the records

Seed S is `seed=S policy.warm_start.seed=S`: a warm start of its own, so the SFT stop varies too. Kernel variant
`avx2` runs with torch, MKL and oneDNN held to AVX2 kernels (AVX2_KERNELS: how an AVX2-only machine rounds, on
this one); its records go to <label>_avx2. Runs go to /tmp/readme_run/<label>/seed<S> (the run directory), one
after the other; a record that exists is kept and not rerun (the grid resumes), `--force` reruns it.
`OMP_NUM_THREADS` as given (unset, the warm start uses every core, as the README command does).
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

import torch

from bench import common
from bench.common import ROOT
from prime_values.models.build import AVX2_KERNELS

RECORDS = common.RECORDS / "readme"
OLD = ["steps=300", "eval_every=50", "policy.warm_start.target_accuracy=0.5", "critic.warm_start.steps=300",
       "critic.warm_start.rollouts=2048", "replay.ratio=0", "policy.pack_sequences=false",
       "critic.pack_sequences=false"]  # the defaults before the replay ratio (bench/records/readme/old)


KERNELS = {"native": {}, "avx2": AVX2_KERNELS}  # environment each kernel variant's runs start with
PROMISE = 0.25  # the README's promise: each run gains at least this much held-out accuracy


def machine(env: dict[str, str]) -> dict:
    """Where and with what a record was made: its stamp (commit, date, CPU model and flags), torch's kernels."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    kernels = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stdout.strip()
    load = round(os.getloadavg()[0], 2)  # other processes beside the run slow its roles
    return common.stamp(load_avg_1min_at_end=load, torch=torch.__version__, kernels=kernels or "unknown")


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def record(run_dir: Path, label: str, seed: int, wall_s: float | None = None, cpu_s: float | None = None) -> dict:
    """What the table needs from one finished run directory."""
    summary = common.summary(run_dir)
    metrics = {p.stem: lines(p) for p in (run_dir / "metrics").glob("*.jsonl")}
    warm = {k: v for m in metrics.get("warm_start", []) for k, v in m.items()}
    trainer = metrics.get("policy_trainer", [])
    steps = [m for m in trainer if "train_s" in m]
    roles = {}
    for role, rows in metrics.items():
        last = [m for m in rows if "role_wall_s" in m]
        if last:
            m = last[-1]
            roles[role] = {"wall_s": m["role_wall_s"], "cpu_s": m["cpu_s"],
                           **{k: m[f"{k}_s"] / m["role_wall_s"] for k in ("compute", "wait", "io")}}
    critic = [m for m in metrics.get("value_trainer", []) if "critic_step" in m]
    rl_s = steps[-1]["time"] - steps[0]["time"] + steps[0].get("train_s", 0) if steps else None
    return {"label": label, "seed": seed, "run_dir": str(run_dir), "status": summary["status"],
            "wall_s": wall_s if wall_s is not None else summary["wall_s"], "cpu_s": cpu_s,
            "policy_steps": summary["policy_steps"], "sft_s": warm.get("sft_s"), "sft_steps": warm.get("sft_step"),
            "critic_pretrain_s": warm.get("critic_pretrain_s"), "rl_s": rl_s,
            "step_s": rl_s / max(len(steps) - 1, 1) if rl_s else None,
            "critic_steps": len(critic), "critic_steps_per_policy_step": len(critic) / max(len(steps), 1),
            "first_rl_step_accuracy": summary["first_rl_step_accuracy"], "final_accuracy": summary["final_accuracy"],
            "gain": (summary["final_accuracy"] or 0) - (summary["first_rl_step_accuracy"] or 0),
            "final_explained_variance": summary["final_explained_variance"],
            "curve": [[m["step"], m["heldout_accuracy"]] for m in trainer if "heldout_accuracy" in m],
            "roles": roles}


def run(label: str, seed: int, overrides: list[str], kernels: str = "native") -> dict:
    run_dir = Path("/tmp/readme_run") / label / f"seed{seed}"
    if run_dir.exists():  # a run that was cut off: start it again rather than resume half of another start
        import shutil
        shutil.rmtree(run_dir)
    command = [sys.executable, "-m", "prime_values", "+experiment=arith", f"seed={seed}",
               f"policy.warm_start.seed={seed}", "policy.warm_start.cache=false", *overrides,
               f"hydra.run.dir={run_dir}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **KERNELS[kernels]}
    began, cpu = time.time(), os.times()
    subprocess.run(command, cwd=ROOT, check=True, env=env)
    after = os.times()
    cpu_s = (after.children_user - cpu.children_user) + (after.children_system - cpu.children_system)
    return {**record(run_dir, label, seed, time.time() - began, cpu_s), **machine(env), "command": command[1:]}


def save(rec: dict) -> Path:
    path = RECORDS / rec["label"] / f"seed{rec['seed']}.json"
    common.write_record(path, rec)
    return path


def report(labels: list[str] | None = None) -> None:
    recs = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*/seed*.json"))]
    recs = [r for r in recs if labels is None or r["label"] in labels]
    print("| label | seed | wall s | SFT s (steps) | critic pretrain s | RL s (steps, s/step) | critic steps / policy "
          "step | held-out first -> final (gain) | critic EV | curve |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        curve = " ".join(f"{s}:{a:.3f}" for s, a in r["curve"])
        print(f"| {r['label']} | {r['seed']} | {r['wall_s']:.0f} | {r['sft_s'] or 0:.0f} ({r['sft_steps']}) | "
              f"{r['critic_pretrain_s'] or 0:.0f} | {r['rl_s'] or 0:.0f} ({r['policy_steps']}, "
              f"{r['step_s'] or 0:.2f}) | "
              f"{r['critic_steps_per_policy_step']:.2f} | {r['first_rl_step_accuracy']:.3f} -> "
              f"{r['final_accuracy'] or 0:.3f} ({r['gain']:+.3f}) | {r['final_explained_variance'] or 0:.3f} | "
              f"{curve} |")
    by_label: dict[str, list[dict]] = {}
    for r in recs:
        by_label.setdefault(r["label"], []).append(r)
    for label, rs in by_label.items():
        gains = [r["gain"] for r in rs]
        where = sorted({f"{r['cpu']} ({r['kernels']} kernels), {r['commit']}" for r in rs if "cpu" in r})
        print(f"{label}: mean wall {statistics.mean(r['wall_s'] for r in rs):.0f} s, gain {min(gains):+.3f} to "
              f"{max(gains):+.3f} (mean {statistics.mean(gains):+.3f}) over {len(rs)} seed(s); "
              f"{sum(g >= PROMISE for g in gains)} of {len(rs)} at or above {PROMISE:+.2f}"
              + (f"; {'; '.join(where)}" if where else ""))
    print("per role (compute / wait / io of its wall; CPU s per wall s):")
    for r in recs:
        parts = ", ".join(f"{role} {v['compute']:.0%}/{v['wait']:.0%}/{v['io']:.0%} cpu {v['cpu_s'] / v['wall_s']:.2f}"
                          for role, v in sorted(r["roles"].items()))
        print(f"  {r['label']} seed {r['seed']}: {parts}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="new")
    common.add_seeds(ap, "0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--old", action="store_true", help="run with the old defaults (OLD) before any overrides")
    ap.add_argument("--record", type=Path, default=None, help="keep this finished run directory as a record")
    ap.add_argument("--wall-s", type=float, default=None, help="with --record: the command's wall time")
    ap.add_argument("--kernels", default="native", help="comma-separated variants of " + ", ".join(KERNELS))
    ap.add_argument("--force", action="store_true", help="rerun a seed whose record exists")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--labels", default=None, help="with --report: only these labels (comma-separated)")
    args = ap.parse_args(argv)
    variants = args.kernels.split(",")
    if unknown := [k for k in variants if k not in KERNELS]:
        ap.error(f"--kernels {','.join(unknown)}: choose from {', '.join(KERNELS)}")
    labels = [args.label if k == "native" else f"{args.label}_{k}" for k in variants]
    if args.record:
        print(save(record(args.record, args.label, args.seed, args.wall_s)))
    elif not args.report:
        for seed in args.seeds:
            for kernels, label in zip(variants, labels):
                if (RECORDS / label / f"seed{seed}.json").exists() and not args.force:
                    print(f"{label} seed {seed}: recorded already (--force reruns it)")
                    continue
                print(save(run(label, seed, (OLD if args.old else []) + overrides, kernels)), flush=True)
    report(args.labels.split(",") if args.labels else None if args.report else labels)
    return 0


if __name__ == "__main__":
    sys.exit(main())
