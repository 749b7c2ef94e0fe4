"""The README run (`python -m prime_values +experiment=arith`), before and after: where its time goes (SFT, critic
pretraining, policy steps; each role's compute / wait / io and CPU per wall second) and its held-out accuracy
curve, one small record per run under bench/records/readme/<label>/seed<S>.json, and a table side by side.

    python bench/readme_run.py --label new --seeds 0,1,2                   # run the README command per seed
    python bench/readme_run.py --label old --seeds 0,1,2 -- steps=300 ...  # the same with overrides (old defaults)
    python bench/readme_run.py --record <run_dir> --label new --seed 0     # keep a finished run as a record
    python bench/readme_run.py --report                                    # the table from the records

Runs go to /tmp/readme_run/<label>/seed<S> (the run directory), one after the other; `OMP_NUM_THREADS` as given
(unset, the warm start uses every core, as the README command does).
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

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records" / "readme"
OLD = ["steps=300", "eval_every=50", "policy.warm_start.target_accuracy=0.5", "critic.warm_start.steps=300",
       "critic.warm_start.rollouts=2048", "replay.ratio=0", "policy.pack_sequences=false",
       "critic.pack_sequences=false"]  # the defaults before the replay ratio (bench/records/readme/old)


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def record(run_dir: Path, label: str, seed: int, wall_s: float | None = None, cpu_s: float | None = None) -> dict:
    """What the table needs from one finished run directory."""
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
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


def run(label: str, seed: int, overrides: list[str]) -> dict:
    run_dir = Path("/tmp/readme_run") / label / f"seed{seed}"
    command = [sys.executable, "-m", "prime_values", "+experiment=arith", f"seed={seed}", *overrides,
               f"hydra.run.dir={run_dir}"]
    began, cpu = time.time(), os.times()
    subprocess.run(command, cwd=ROOT, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    after = os.times()
    cpu_s = (after.children_user - cpu.children_user) + (after.children_system - cpu.children_system)
    return record(run_dir, label, seed, time.time() - began, cpu_s)


def save(rec: dict) -> Path:
    path = RECORDS / rec["label"] / f"seed{rec['seed']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return path


def report() -> None:
    recs = [json.loads(p.read_text()) for p in sorted(RECORDS.glob("*/seed*.json"))]
    print("| label | seed | wall s | SFT s (steps) | critic pretrain s | RL s (steps, s/step) | critic steps / policy "
          "step | held-out first -> final (gain) | critic EV | curve |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        curve = " ".join(f"{s}:{a:.3f}" for s, a in r["curve"])
        print(f"| {r['label']} | {r['seed']} | {r['wall_s']:.0f} | {r['sft_s'] or 0:.0f} ({r['sft_steps']}) | "
              f"{r['critic_pretrain_s'] or 0:.0f} | {r['rl_s'] or 0:.0f} ({r['policy_steps']}, {r['step_s'] or 0:.2f}) | "
              f"{r['critic_steps_per_policy_step']:.2f} | {r['first_rl_step_accuracy']:.3f} -> "
              f"{r['final_accuracy'] or 0:.3f} ({r['gain']:+.3f}) | {r['final_explained_variance'] or 0:.3f} | {curve} |")
    by_label: dict[str, list[dict]] = {}
    for r in recs:
        by_label.setdefault(r["label"], []).append(r)
    for label, rs in by_label.items():
        print(f"{label}: mean wall {statistics.mean(r['wall_s'] for r in rs):.0f} s, mean gain "
              f"{statistics.mean(r['gain'] for r in rs):+.3f} over {len(rs)} seed(s)")
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
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--old", action="store_true", help="run with the old defaults (OLD) before any overrides")
    ap.add_argument("--record", type=Path, default=None, help="keep this finished run directory as a record")
    ap.add_argument("--wall-s", type=float, default=None, help="with --record: the command's wall time")
    ap.add_argument("--report", action="store_true")
    args = ap.parse_args(argv)
    if args.record:
        print(save(record(args.record, args.label, args.seed, args.wall_s)))
    elif not args.report:
        for seed in (int(s) for s in args.seeds.split(",")):
            print(save(run(args.label, seed, (OLD if args.old else []) + overrides)))
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
