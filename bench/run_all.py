"""Every benchmark in one invocation, one table: measure, ours, baseline, ratio [spread], goal, met?

    python -m bench                      # the full suite (~15-25 min on 2 CPU cores)
    python -m bench --smoke              # tiny sizes, every code path (tests/bench/test_bench_suite.py)
    python -m bench --only log,gae       # a subset: log, gae, scoring, pipeline
    python -m bench --device cuda:0      # GPU mode: every role and the scoring models on one GPU (bench/gpu_suite.sh)

Each benchmark runs its two sides in this invocation, alternating repetitions; ratios are paired per
repetition, reported as the median with the [min-max] spread. The table and every measurement go to
`--out` (default bench/results/<date>) as results.json and results.md, with, per pipeline case, where each
role's wall time went (compute / wait / io; prime_values.monitor.Timers).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

from bench.common import ROOT, stamp

GROUPS = ("pipeline", "scoring", "log", "gae")


def _num(x, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return str(x)
    return f"{x:.3g}" if abs(x) < 1000 else f"{x:,.0f}"


def _met(m) -> str:
    return "report" if m is None else ("yes" if m else "NO")


def table(rows: list[dict]) -> list[str]:
    """The Markdown table (also what is printed)."""
    lines = ["| measure | ours | baseline | ratio [spread] | goal | met? |", "|---|---|---|---|---|---|"]
    for r in rows:
        unit = f" {r['unit']}" if r.get("unit") else ""
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3g} [{r['spread'][0]:.3g}-{r['spread'][1]:.3g}]"
        lines.append(f"| {r['measure']} | {_num(r['ours'])}{unit} | {_num(r.get('baseline'))}"
                     f"{unit if r.get('baseline') is not None else ''} | {ratio} | {r['goal']} | {_met(r['met'])} |")
    return lines


def time_lines(pipeline: dict) -> list[str]:
    """Per pipeline case (its last repetition): each role's fraction of wall time in compute / wait / io."""
    from prime_values.tools.summary import format_time_fractions

    lines = []
    for case, runs in pipeline["runs"].items():
        fr = runs[-1]["time_fractions"]
        head = f", policy trainer waiting {fr['policy_trainer']['wait']:.0%}" if "policy_trainer" in fr else ""
        lines += [f"{case} ({' '.join(pipeline['cases'][case]) or 'defaults'}){head}:",
                  *format_time_fractions(fr, indent="    ")]
    return lines


def notes(rows: list[dict]) -> list[str]:
    return [f"- {r['measure']}: {r['note']}" for r in rows if r.get("note")]


def device_name(device: str | None) -> str:
    """What ran the models: 'CPU only', or e.g. 'cuda:0 = NVIDIA H200 (all roles time-share it)'."""
    if not device or device == "cpu":
        return "CPU only"
    import torch

    return f"{device} = {torch.cuda.get_device_name(torch.device(device))} (all roles time-share it)"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny sizes: every benchmark's code path in a few minutes")
    ap.add_argument("--out", default=None, help="results folder (default bench/results/<date>[-smoke])")
    ap.add_argument("--only", default=",".join(GROUPS), help=f"comma-separated subset of {','.join(GROUPS)}")
    ap.add_argument("--steps", type=int, default=None, help="policy steps per pipeline run (default 30; smoke 3)")
    ap.add_argument("--reps", type=int, default=None, help="repetitions of every pipeline case (default 2; smoke 1)")
    ap.add_argument("--warm", default=None, help="reuse policy and critic version 0 of this earlier run directory of "
                    "+experiment=arith (default: a warm-start run first, shared by every pipeline run)")
    ap.add_argument("--device", default=None, help="GPU mode: every role of the pipeline runs and both models of "
                    "the scoring benchmark on this device, e.g. cuda:0 (one GPU: the roles time-share it); the log "
                    "and GAE benchmarks stay on the CPU, where the orchestrator and the log writers run")
    ap.add_argument("--keep-runs", action="store_true", help="keep the pipeline runs' directories under --out")
    args = ap.parse_args(argv)
    only = [g.strip() for g in args.only.split(",") if g.strip()]
    for g in only:
        if g not in GROUPS:
            ap.error(f"--only: unknown benchmark {g!r}; choose from {', '.join(GROUPS)}")
    date = datetime.date.today().isoformat()
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / (date + ("-smoke" if args.smoke else ""))
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    rows, extra = [], {}

    def log(text: str) -> None:
        print(text, flush=True)

    warm = Path(args.warm) if args.warm else None
    if "pipeline" in only:
        from bench import bench_pipeline

        log("pipeline: async / slow critic / colocated / grpo / lockstep, alternating repetitions")
        pipeline = bench_pipeline.run_cases(out if args.keep_runs else None, args.smoke, args.steps, args.reps,
                                            log=lambda text: log(text), warm=args.warm, device=args.device)
        extra["pipeline"] = pipeline
        rows += [{"group": "pipeline", **r} for r in bench_pipeline.rows(pipeline)]
        warm = Path(pipeline["warm"])
    if "scoring" in only:
        from bench import bench_scoring

        log("scoring vs generation")
        policy = critic = None
        if warm is not None and not args.smoke:  # the warm-started models: realistic response lengths
            policy, critic = str(warm / "weights" / "policy" / "0"), str(warm / "weights" / "critic" / "0")
        rows += [{"group": "scoring", **r} for r in bench_scoring.bench_rows(args.smoke, policy, critic,
                                                                                   args.device or "cpu")]
    if "pipeline" in only and not args.keep_runs:
        shutil.rmtree(extra["pipeline"]["base"], ignore_errors=True)
    if "log" in only:
        from bench import bench_log

        log("rollout log")
        rows += [{"group": "log", **r} for r in bench_log.bench_rows(args.smoke)]
    if "gae" in only:
        from bench import bench_gae

        log("gae")
        rows += [{"group": "gae", **r} for r in bench_gae.bench_rows(args.smoke)]

    command = "python -m bench" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    meta = stamp(command=command, smoke=args.smoke, wall_s=time.time() - started,
                 python=platform.python_version(), cpus=os.cpu_count(), device=device_name(args.device),
                 load_average=os.getloadavg() if hasattr(os, "getloadavg") else None)
    lines = table(rows)
    timing = time_lines(extra["pipeline"]) if "pipeline" in extra else []
    print("\n" + "\n".join(lines))
    if timing:
        print("\nwhere the time goes (fraction of each role's wall time):\n" + "\n".join(timing))
    if notes(rows):
        print("\n" + "\n".join(notes(rows)))
    print(f"\n{meta['command']}: {meta['wall_s']:.0f} s, load average at the end {meta['load_average']}; "
          f"results in {out}")
    (out / "results.json").write_text(json.dumps({"meta": meta, "rows": rows, **extra}, indent=1, default=str))
    md = [f"# Benchmarks {date}{' (smoke sizes)' if args.smoke else ''}", "", f"`{command}` — {meta['wall_s']:.0f} s, "
          f"{meta['cpus']} CPUs, {meta['device']}, load average at the end {meta['load_average']}", "", *lines]
    if timing:
        md += ["", "Where the time goes (fraction of each role's wall time, last repetition of each case):", "",
               "```", *timing, "```"]
    if notes(rows):
        md += ["", *notes(rows)]
    (out / "results.md").write_text("\n".join(md) + "\n")
    return {"meta": meta, "rows": rows, "out": str(out)}


if __name__ == "__main__":
    main()
