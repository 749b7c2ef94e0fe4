"""`python -m prime_values +experiment=tools` over RL seeds from one warm start: held-out accuracy and the tool-use
rate per question kind at each held-out evaluation, the critic's explained variance and the walls, one record per run
under bench/records/tools/<label>/seed<S>.json (recipes/tools.md, "Measured").

    python -m bench.tools_run --label L --seeds 0,1,2                        # one run after the other
    python -m bench.tools_run --label L_grpo --seeds 0,1,2 --base /tmp/tools_run/L/seed0 -- advantage=grpo
    python -m bench.tools_run --record <run_dir> --label L --seed 0          # keep a finished run as a record
    python -m bench.tools_run --report [--labels A,B] [--pair A,B]           # the table, a paired comparison

Seed S is `seed=S` alone: the warm start (`policy.warm_start.seed`) is the same for every seed, so the first run
makes version 0 (SFT, the privileged critic's pretraining) and the warm-start cache (`policy.warm_start.cache`,
prime_values/warm_cache.py) gives it to the next ones; the record says which (`warm_start`: `made`, `cache` or
`copied`) and holds the SHA-256 of version 0 (`v0_sha`), the same for runs that share their start. The cache lives
in `--cache` (PRIME_VALUES_CACHE), a folder of this grid's own, so that other runs on the machine do not evict its
entry. `--base RUN`: version 0 (policy and critic) copied from that run's directory into each fresh run directory
(its warm start then does nothing): the same start for a cell whose key the cache does not share (`advantage=grpo`
has no critic roles, so its cache key differs). Overrides after `--` go to every run.

Each run is `nice -n <--nice> python -m prime_values +experiment=tools seed=S <overrides>
hydra.run.dir=<--out>/<label>/seed<S>` (its output in seed<S>.log beside it), started after the previous one ended;
`--stop-after HH:MM` (UTC) starts none after that time. A seed with a record is skipped (`--force` reruns it).
Records go to `--records` (default bench/records/tools), so a run from a copy of the code writes them into the
checkout.

A record: `command` (the run's command line and the environment variables it needs), the load average (1, 5 and 15
min) at the start and the end, the summary's accuracies, the held-out curve, `heldout` (per evaluation step, the
breakdown of `ToolsTask.heldout_breakdown`: accuracy per kind and the rate of episodes that called the tools their
kind needs, from metrics/heldout/step_<n>.jsonl), the critic's explained variance on fresh rollouts pooled over the
first and the last 10 batches (`ev_first`, `ev_final`), and the walls (the command's, the summary's `waited`, the
policy steps' mean). The stamp (bench.common) names the commit of the checkout the script runs in; a run from a
copy of the code outside a checkout passes `--commit` and `--changes` (the files that differ from it).

The report lists the records, and with `--pair A,B` the paired differences B - A of the final accuracy, the gain
(final - start) and the endpoint (the mean of the last 5 evaluations), by seed, with the 95% Student-t interval of
bench/budget_stats.py (with 3 pairs a t-interval: a bootstrap needs 8) and the binomial standard error of one
evaluation of the held-out set, sqrt(a (1 - a) / n), the noise of a single accuracy.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

from bench import common

RECORDS = common.RECORDS / "tools"
OUT = Path("/tmp/tools_run")
EXPERIMENT = "+experiment=tools"
KINDS = ("calc", "look", "both", "none")
LAUNCH = "launch.json"  # in the run directory: the command, its wall and the load average at its start and end


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def weights_sha(run_dir: Path) -> str | None:
    """First 12 hex digits of the SHA-256 of version 0 (policy and critic files, names and bytes)."""
    digest, found = hashlib.sha256(), False
    for model in ("policy", "critic"):
        root = run_dir / "weights" / model / "0"
        for path in sorted(root.rglob("*")) if root.is_dir() else []:
            if path.is_file():
                found = True
                digest.update(f"{model}/{path.relative_to(root)}".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12] if found else None


def task_of(run_dir: Path):
    """The run's task, built from its config.yaml, and its inference.max_new_tokens."""
    from omegaconf import OmegaConf

    from prime_values.tasks import make_task

    cfg = OmegaConf.load(run_dir / "config.yaml")
    return make_task(**OmegaConf.to_container(cfg.task, resolve=True)), int(cfg.inference.max_new_tokens), cfg


def heldout(run_dir: Path) -> dict[int, dict]:
    """Per held-out evaluation step of the policy trainer, ToolsTask.heldout_breakdown of its records."""
    task, max_new_tokens, _ = task_of(run_dir)
    out = {}
    for path in sorted((run_dir / "metrics" / "heldout").glob("step_*.jsonl")):
        out[int(path.stem.split("_")[1])] = task.heldout_breakdown(lines(path), max_new_tokens)
    return out


def record(run_dir: Path, label: str, seed: int) -> dict:
    """What the report needs from one finished run directory (`wall_s`: the summary's, until `with_launch`)."""
    from prime_values.tools.summary import EV_WINDOW, final_explained_variance

    summary = common.summary(run_dir)
    _, _, cfg = task_of(run_dir)
    trainer = common.metrics(run_dir, "policy_trainer")
    batches = [m for m in common.metrics(run_dir, "orchestrator") if "step" in m]
    steps = [m for m in trainer if "train_s" in m]
    curve = [[m["step"], m["heldout_accuracy"]] for m in trainer if "heldout_accuracy" in m]
    by_step = heldout(run_dir)
    first, last = (by_step[min(by_step)], by_step[max(by_step)]) if by_step else ({}, {})
    warm = common.metrics(run_dir, "warm_start")
    log = run_dir.parent / f"{run_dir.name}.log"
    from_cache = "from the warm-start cache" in (log.read_text(errors="replace") if log.exists() else "")
    made = "copied" if not warm else "cache" if from_cache or any("cached_from" in m for m in warm) else "made"
    start, final = summary.get("first_rl_step_accuracy"), summary.get("final_accuracy")
    return {"label": label, "seed": seed, "run_dir": str(run_dir), "status": summary.get("status"),
            "advantage": cfg.advantage.estimator, "steps": cfg.steps, "eval_every": cfg.eval_every,
            "policy_steps": summary.get("policy_steps"), "warm_start": made, "v0_sha": weights_sha(run_dir),
            "warm_start_accuracy": summary.get("warm_start_accuracy"), "start_accuracy": start,
            "final_accuracy": final, "gain": final - start if final is not None and start is not None else None,
            "endpoint": statistics.fmean(a for _, a in curve[-5:]) if len(curve) > 5 else None,
            "curve": curve, "heldout_problems": sum(k["problems"] for k in first.get("kinds", {}).values()),
            "start": first, "final": last, "heldout": {str(s): b for s, b in by_step.items()},
            "ev_first": final_explained_variance(batches[:EV_WINDOW]) if batches else None,
            "ev_final": summary.get("final_explained_variance"), "ev_window_batches": EV_WINDOW,
            "final_reward_mean": summary.get("final_reward_mean"),
            "wall_s": summary.get("wall_s"), "waited": summary.get("waited"),
            "step_s": statistics.fmean(m["train_s"] for m in steps) if steps else None,
            "step_wall_s": (steps[-1]["time"] - steps[0]["time"]) / (len(steps) - 1) if len(steps) > 1 else None,
            "time_fractions": summary.get("time_fractions")}


def seed_run(base: Path, run_dir: Path) -> None:
    """Version 0 of the policy and the critic copied from `base` into a fresh run directory."""
    for model in ("policy", "critic"):
        shutil.copytree(base / "weights" / model / "0", run_dir / "weights" / model / "0")
        (run_dir / "weights" / model / "LATEST").write_text("0\n")


def run(args, seed: int, overrides: list[str]) -> dict:
    run_dir = args.out / args.label / f"seed{seed}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run that was cut off starts again, not half of another start
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    if args.base:
        seed_run(args.base, run_dir)
    env_vars = {"HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PRIME_VALUES_CACHE": str(args.cache),
                **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {})}
    command = ["nice", "-n", str(args.nice), sys.executable, "-m", "prime_values", EXPERIMENT, f"seed={seed}",
               *overrides, f"hydra.run.dir={run_dir}"]
    load_start, began = load_average(), time.time()
    with open(run_dir.parent / f"seed{seed}.log", "w") as log:
        rc = subprocess.run(command, cwd=common.ROOT, env={**os.environ, **env_vars}, stdout=log,
                            stderr=subprocess.STDOUT).returncode
    launch = {"returncode": rc, "wall_s": time.time() - began, "load_avg_start": load_start,
              "load_avg_end": load_average(),
              "started": datetime.fromtimestamp(began, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
              "command": {"env": env_vars, "cwd": str(common.ROOT),
                          "argv": ["nice", "-n", str(args.nice), "python", *command[4:]]},
              "bench_command": common.command_line("tools_run"), "base": str(args.base) if args.base else None}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / LAUNCH).write_text(json.dumps(launch, indent=1) + "\n")  # what --record takes up again
    return with_launch(record(run_dir, args.label, seed), run_dir)


def with_launch(rec: dict, run_dir: Path) -> dict:
    """The record with what its launch wrote (the command, its wall, the load average), where it wrote it."""
    launch = common.read_json(run_dir / LAUNCH, {})
    return {**rec, **launch, "wall_s": launch.get("wall_s", rec["wall_s"])}


def save(rec: dict, args) -> Path:
    path = args.records / rec["label"] / f"seed{rec['seed']}.json"
    extra = {}
    if args.commit:
        extra = {"commit": args.commit[:12], "commit_dirty": bool(args.changes),
                 "uncommitted_changes": [c for c in (args.changes or "").split(",") if c]}
    common.write_record(path, {**rec, **extra})
    return path


def _f(x, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def kinds_line(b: dict) -> str:
    """'calc 0.82/0.96 look 0.92/1.00 both 0.68/0.94 none 0.16 (tool 0.02)': accuracy / right-tools rate."""
    if not b:
        return "-"
    parts = []
    for k in KINDS:
        v = b["kinds"].get(k)
        if v:
            tools = f"/{_f(v['right_tools'], '.2f')}" if v["right_tools"] is not None else \
                f" (tool {_f(v['any_tool'], '.2f')})"
            parts.append(f"{k} {_f(v['accuracy'], '.2f')}{tools}")
    return " ".join(parts)


def report(records: Path, labels: list[str] | None, pair: list[str] | None) -> None:
    from bench.budget_stats import compare

    recs = [json.loads(p.read_text()) for p in sorted(records.glob("*/seed*.json"))]
    recs = [r for r in recs if labels is None or r["label"] in labels]
    print("| label | seed | advantage | steps | start -> final (gain) | endpoint | right tools start -> final | "
          "by kind at the start (accuracy/right tools) | by kind at the end | critic EV first -> last 10 | "
          "wall s (RL s, s/step) | load start -> end |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in recs:
        w = r.get("waited") or {}
        print(f"| {r['label']} | {r['seed']} | {r['advantage']} | {r['policy_steps']} | {_f(r['start_accuracy'])} -> "
              f"{_f(r['final_accuracy'])} ({_f(r['gain'], '+.3f')}) | {_f(r['endpoint'])} | "
              f"{_f(r['start'].get('right_tools'))} -> {_f(r['final'].get('right_tools'))} | "
              f"{kinds_line(r['start'])} | {kinds_line(r['final'])} | {_f(r['ev_first'])} -> {_f(r['ev_final'])} | "
              f"{_f(r['wall_s'], '.0f')} ({_f(w.get('rl_s'), '.0f')}, {_f(r['step_wall_s'], '.2f')}) | "
              f"{r.get('load_avg_start', ['-'])[0]} -> {r.get('load_avg_end', ['-'])[0]} |")
    by_label: dict[str, list[dict]] = {}
    for r in recs:
        by_label.setdefault(r["label"], []).append(r)
    for label, rs in by_label.items():
        gains = [r["gain"] for r in rs if r["gain"] is not None]
        finals = [r["final_accuracy"] for r in rs if r["final_accuracy"] is not None]
        if finals and gains:
            n = max(r["heldout_problems"] or 0 for r in rs)
            a = statistics.fmean(finals)
            print(f"{label}: {len(rs)} run(s), final {a:.3f} (SD over seeds {_f(common_sd(finals))}; binomial SE "
                  f"of one evaluation of {n} problems {math.sqrt(a * (1 - a) / n) if n else float('nan'):.3f}), "
                  f"gain {statistics.fmean(gains):+.3f} ({min(gains):+.3f} to {max(gains):+.3f}); version 0 "
                  f"{', '.join(sorted({str(r['v0_sha']) for r in rs}))}")
    if pair:
        a, b = ({r["seed"]: r for r in by_label.get(name, [])} for name in pair)
        seeds = sorted(set(a) & set(b))
        print(f"paired by seed ({', '.join(map(str, seeds))}), {pair[1]} - {pair[0]}, 95% Student-t interval:")
        for key in ("final_accuracy", "gain", "endpoint"):
            diffs = [b[s][key] - a[s][key] if b[s][key] is not None and a[s][key] is not None else None
                     for s in seeds]
            c = compare(diffs)
            interval = f"[{c['lo']:+.3f}, {c['hi']:+.3f}]" if c["lo"] is not None else "(no interval)"
            print(f"  {key}: {' '.join(_f(d, '+.3f') for d in c['diffs'])} -> mean {_f(c['mean'], '+.3f')} "
                  f"{interval}, SD {_f(c['sd'])}, verdict at +-0.02: {c['verdict']}")


def common_sd(xs: list[float]) -> float | None:
    return statistics.stdev(xs) if len(xs) > 1 else None


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    overrides = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--label", default="new")
    common.add_seeds(ap, "0")
    ap.add_argument("--seed", type=int, default=0, help="with --record: the run's seed")
    ap.add_argument("--out", type=Path, default=OUT, help=f"run directories go to <out>/<label>/ (default {OUT})")
    ap.add_argument("--cache", type=Path, default=OUT / "cache", help="the warm-start cache (PRIME_VALUES_CACHE)")
    ap.add_argument("--records", type=Path, default=RECORDS, help=f"records go to <records>/<label>/ (default "
                    f"{RECORDS.relative_to(common.ROOT)})")
    ap.add_argument("--base", type=Path, default=None, help="copy version 0 from this run directory into each run")
    ap.add_argument("--nice", type=int, default=10, help="the runs' niceness (default 10)")
    common.add_stop_after(ap)
    ap.add_argument("--commit", default=None, help="the commit the code was copied from (outside a checkout)")
    ap.add_argument("--changes", default=None, help="with --commit: the files changed from it, comma-separated")
    ap.add_argument("--record", type=Path, default=None, help="keep this finished run directory as a record")
    ap.add_argument("--wall-s", type=float, default=None, help="with --record: the command's wall time")
    ap.add_argument("--force", action="store_true", help="rerun a seed whose record exists")
    ap.add_argument("--report", action="store_true")
    ap.add_argument("--labels", default=None, help="with --report: only these labels (comma-separated)")
    ap.add_argument("--pair", default=None, help="with --report: A,B, the paired differences B - A by seed")
    args = ap.parse_args(argv)
    if args.record:
        rec = with_launch(record(args.record, args.label, args.seed), args.record)
        print(save({**rec, **({"wall_s": args.wall_s} if args.wall_s is not None else {})}, args))
    elif not args.report:
        args.cache = args.cache.resolve()
        for seed in args.seeds:
            if (args.records / args.label / f"seed{seed}.json").exists() and not args.force:
                print(f"{args.label} seed {seed}: recorded already (--force reruns it)")
                continue
            if common.too_late(args.stop_after):
                print(f"stop-after {args.stop_after} UTC passed: seed {seed} not started")
                break
            try:
                print(save(run(args, seed, overrides), args), flush=True)
            except Exception:  # noqa: BLE001 - a failed record: the run directory stays, --record retries it
                traceback.print_exc()
                print(f"seed {seed}: no record; `--record {args.out / args.label / f'seed{seed}'}` retries it",
                      flush=True)
    report(args.records, args.labels.split(",") if args.labels else None if args.report else [args.label],
           args.pair.split(",") if args.pair else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
