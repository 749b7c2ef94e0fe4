"""The real model's controlled study: `+experiment=smollm` (SmolLM2-135M on chain_sum, 30 minutes on 2 cores) run
as cells x RL seeds from one SFT start, each run kept as a committed record, and the cells compared paired by seed.

    python -m bench.smollm_grid --out /tmp/smollm_grid --cells gae_g1,mean_g1 --seeds 0,1,2   # runs what is missing
    python -m bench.smollm_grid --out /tmp/smollm_grid --report-only                           # the table only

Cells (the recipe's 32 rollouts a step throughout):

- ``gae_g1``: 32 prompts x 1, GAE with the privileged critic (``advantage=gae``);
- ``mean_g1``: 32 x 1, reward minus the batch's mean reward, no critic (``advantage=batch_mean``, the recipe's
  default since it was measured best here);
- ``plain_g1``: 32 x 1, GAE with a critic that does not see the answer (``advantage=gae critic.privileged=false``);
- ``grpo_g2``: 16 x 2, the group mean (``advantage=grpo``);
- ``mean_g1_avx2``: mean_g1 with torch, MKL and oneDNN held to AVX2 kernels (``ATEN_CPU_CAPABILITY=avx2
  MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2``), so ``policy.dtype=auto`` runs float32 as on an AVX2-only
  machine: the recipe's numbers and step time without bf16 instructions, on this machine's processor.

Every cell names its estimator, so a change of the recipe's default does not change what a cell runs.

Every run is ``python -m prime_values +experiment=smollm seed=<S> <cell overrides> hydra.run.dir=<out>/<cell>/seed<S>``
with the warm start's seed fixed (``policy.warm_start.seed`` stays 0), so every run starts from the same SFT'd
weights and a seed varies RL only. The run's time budget ends it, so a cell without critic roles gets more policy
steps in the same wall time: the comparison is at equal wall time on the same 2 cores, the critic's compute counted.

A finished run (its last held-out evaluation written) becomes ``<records>/<cell>/seed<S>.json``: the date, commit and
command, the CPU it ran on and whether it had bf16 instructions (bf16-mixed, else float32: a different step time),
bench/paired_heldout.py's figures (RL's gain step 0 -> end, paired on the same 200 problems, and SFT's apart),
bench/run_figures.py's (steps, wall, critic EV) and the per-problem rewards of the first and last evaluation (a
cell whose kernels round differently, such as mean_g1_avx2, starts from other SFT'd weights: it is compared by seed
only, not by problem). A rerun skips every (cell, seed) that has a record; a run directory without its last
evaluation is removed and run again.
`--stop-after HH:MM` (UTC) starts no run after that time.

The report compares every cell with ``--reference`` (default gae_g1) paired by RL seed: the difference of the RL gains
per seed, its mean and 95% t-interval over the seeds (Student t, n − 1 df), its verdict at ±0.02 and the seeds its SD
needs (bench/budget_stats.py, docs/benchmarks.md "The critic study protocol"); and, where both records keep
per-problem rewards from the same start (so the difference of the end accuracies is that of the gains), pooled over
(seed, problem) pairs: the paired difference with a normal 95% interval and the exact McNemar test on the discordant
pairs (the problems of these runs as units: how these runs' end policies differ, not the methods over seeds). It
names the stamps of the protocol (commit, date, CPU model and flags, checkpoint sha) that records lack.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from bench import paired_heldout, run_figures
from bench.budget_stats import MARGIN, STAMPS, compare as paired_compare, unstamped
from bench.common import ROOT, add_seeds, add_stop_after, summary, too_late, write_record
from prime_values.models.build import AVX2_KERNELS, cpu_bf16_native

CELLS = {
    "gae_g1": ["advantage=gae"],
    "mean_g1": ["advantage=batch_mean"],
    "plain_g1": ["advantage=gae", "critic.privileged=false"],
    "grpo_g2": ["advantage=grpo", "inference.group_size=2", "inference.prompts_per_step=16"],
    "mean_g1_avx2": ["advantage=batch_mean"],
}
CELL_ENV = {"mean_g1_avx2": AVX2_KERNELS}  # environment a cell's run starts with, beside the overrides


def heldout_files(run: Path) -> dict[int, Path]:
    return {int(f.stem.split("_")[1]): f for f in (run / "metrics" / "heldout").glob("step_*.jsonl")}


def finished(run: Path) -> bool:
    """Done when the run's summary says finished and it wrote a held-out evaluation after step 0."""
    return summary(run).get("status") == "finished" and max(heldout_files(run), default=0) > 0


def rewards(path: Path) -> dict[str, float]:
    return {pid: r["reward"] for pid, r in paired_heldout.load(path).items()}


def bf16_under(env: dict[str, str]) -> bool:
    """Whether a process started with `env` may multiply bf16 natively (oneDNN reads its ISA limit at start)."""
    probe = "from prime_values.models.build import cpu_bf16_native; print(cpu_bf16_native()[0])"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def make_record(run: Path, cell: str, seed: int, command: list[str], env: dict[str, str]) -> dict:
    files = heldout_files(run)
    first, last = min(files), max(files)
    bf16 = bf16_under(env) if CELL_ENV.get(cell) else cpu_bf16_native()[0]
    return {"cell": cell, "seed": seed, "overrides": CELLS[cell], "env": CELL_ENV.get(cell, {}),
            "command": " ".join(command), "cpu_bf16": bf16,
            "paired": paired_heldout.main([str(run)]), "figures": run_figures.figures(run),
            "rewards_start": rewards(files[first]), "rewards_end": rewards(files[last])}


def run_cells(args, cells: list[str], seeds: list[int], records: Path) -> int:
    base_env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    for seed in seeds:
        for cell in cells:
            path = records / cell / f"seed{seed}.json"
            if path.exists():
                continue
            if too_late(args.stop_after):
                print(f"--stop-after {args.stop_after}: the rest waits for the next invocation")
                return 0
            run = Path(args.out) / cell / f"seed{seed}"
            prefix = [f"{k}={v}" for k, v in CELL_ENV.get(cell, {}).items()]
            env = {**base_env, **CELL_ENV.get(cell, {})}
            command = [*prefix, "python", "-m", "prime_values", "+experiment=smollm", f"seed={seed}", *CELLS[cell]]
            if not finished(run):
                shutil.rmtree(run, ignore_errors=True)
                run.parent.mkdir(parents=True, exist_ok=True)
                print(f"{cell} seed {seed}: {' '.join(command)} hydra.run.dir={run}", flush=True)
                with open(run.parent / f"seed{seed}.log", "w") as log:
                    argv = [sys.executable, *command[len(prefix) + 1:], f"hydra.run.dir={run}"]
                    rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT).returncode
                if rc != 0 or not finished(run):
                    print(f"{cell} seed {seed}: the run failed (exit {rc}); see {run.parent}/seed{seed}.log")
                    return 1
            # stamped at this invocation's commit and machine, also a run it found finished in <out>
            write_record(path, make_record(run, cell, seed, command, env))
    return 0


def load_records(records: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for path in sorted(records.glob("*/seed*.json")):
        r = json.loads(path.read_text())
        out.setdefault(r["cell"], {})[r["seed"]] = r
    return out


def problem_pairs(a: dict, b: dict) -> list[int]:
    """Per (problem) end-accuracy differences a - b of one seed, where both records keep per-problem rewards and
    started from the same rewards (the same SFT'd weights: else end minus end would carry the starts' difference)."""
    ra, rb = a.get("rewards_end"), b.get("rewards_end")
    if not ra or not rb or a.get("rewards_start") != b.get("rewards_start"):
        return []
    return [int(ra[p] >= 1.0) - int(rb[p] >= 1.0) for p in sorted(set(ra) & set(rb))]


def compare(cell: dict[int, dict], ref: dict[int, dict], margin: float = MARGIN) -> dict | None:
    """`cell` minus `ref`, paired by RL seed: the RL gains' differences, their mean, 95% t-interval (Student t,
    n − 1 df; bench/budget_stats.py), SD, verdict at ±margin and the seeds that SD needs to resolve the margin; and,
    where per-problem rewards are kept from one start, pooled over (seed, problem) pairs."""
    seeds = sorted(set(cell) & set(ref))
    if not seeds:
        return None
    diffs = [cell[s]["paired"]["gain"] - ref[s]["paired"]["gain"] for s in seeds]
    c = paired_compare(diffs, margin)
    out = {"seeds": seeds, "per_seed": diffs, "mean": c["mean"], "ci95": [c["lo"], c["hi"]], "sd": c["sd"],
           "verdict": c["verdict"], "seeds_needed": c["seeds_needed"]}
    d = [x for s in seeds for x in problem_pairs(cell[s], ref[s])]
    if d:
        m = statistics.fmean(d)
        half = 1.96 * math.sqrt(statistics.variance(d) / len(d)) if len(d) > 1 else 0.0
        out["problems"] = {"pairs": len(d), "mean": m, "ci95": [m - half, m + half], "wins": d.count(1),
                           "losses": d.count(-1), "mcnemar_p": paired_heldout.mcnemar_p(d.count(1), d.count(-1))}
    return out


# pairs the recipe reads besides the reference column, (cell, other)
CONTRASTS = (("mean_g1", "plain_g1"), ("mean_g1", "grpo_g2"), ("mean_g1_avx2", "mean_g1"))


def report(records: Path, reference: str, margin: float = MARGIN) -> str:
    """The table (every cell, and its difference to `reference` paired by seed with a 95% t-interval and a verdict
    at ±margin) and what it rests on: the stamps the records lack, and the protocol's parts this grid does not have."""
    runs = load_records(records)
    lines = ["| cell | seeds | RL steps | held-out step 0 -> end, per seed | RL gain, mean (per seed) | "
             "seeds with 95% CI > 0 | critic EV, last 5 | minus " + reference + ", paired by seed [95% t-interval] | "
             f"verdict ±{margin} | SD of pairs | seeds for ±{margin} | "
             "pooled over problems [95%], won / lost, McNemar p (these runs only) |", "|---" * 12 + "|"]
    for name in [c for c in CELLS if c in runs] + sorted(set(runs) - set(CELLS)):
        cell = runs[name]
        seeds = sorted(cell)
        p = [cell[s]["paired"] for s in seeds]
        f = [cell[s]["figures"] for s in seeds]
        ev = [x.get("explained_variance_last5") for x in f]
        ev_text = ", ".join(f"{x:.2f}" for x in ev if x is not None) or "-"
        cmp = compare(cell, runs[reference], margin) if reference in runs and name != reference else None
        vs = pooled = verdict = spread = need = "-"
        if cmp:
            vs = (f"{cmp['mean']:+.3f} [{cmp['ci95'][0]:+.3f}, {cmp['ci95'][1]:+.3f}] (" if cmp["ci95"][0] is not None
                  else f"{cmp['mean']:+.3f}, one pair (") + ", ".join(f"{x:+.3f}" for x in cmp["per_seed"]) + ")"
            verdict = cmp["verdict"] or "-"
            spread = f"{cmp['sd']:.3f}" if cmp["sd"] is not None else "-"
            need = str(cmp["seeds_needed"]) if cmp["seeds_needed"] is not None else "-"
            if "problems" in cmp:
                q = cmp["problems"]
                pooled = f"{q['mean']:+.3f} [{q['ci95'][0]:+.3f}, {q['ci95'][1]:+.3f}], {q['wins']} / " \
                         f"{q['losses']}, p = {q['mcnemar_p']:.2g} ({q['pairs']} pairs)"
        lines.append(
            f"| {name} | {','.join(map(str, seeds))} | {', '.join(str(x['policy_steps']) for x in f)} | "
            + ", ".join(f"{x['before']:.3f} -> {x['after']:.3f}" for x in p)
            + f" | {statistics.fmean(x['gain'] for x in p):+.3f} (" + ", ".join(f"{x['gain']:+.3f}" for x in p)
            + f") | {sum(x['ci95'][0] > 0 for x in p)} of {len(p)} | {ev_text} | {vs} | {verdict} | {spread} | "
            f"{need} | {pooled} |")
    lines.append("")
    for a, b in CONTRASTS:
        cmp = compare(runs[a], runs[b], margin) if a in runs and b in runs else None
        if cmp and cmp["ci95"][0] is not None:
            q = f"; by problem {cmp['problems']['mean']:+.3f} [{cmp['problems']['ci95'][0]:+.3f}, " \
                f"{cmp['problems']['ci95'][1]:+.3f}] (these runs only)" if "problems" in cmp else ""
            lines.append(f"- {a} minus {b}, paired by seed: {cmp['mean']:+.3f} [{cmp['ci95'][0]:+.3f}, "
                         f"{cmp['ci95'][1]:+.3f}] (" + ", ".join(f"{x:+.3f}" for x in cmp["per_seed"])
                         + f"), {cmp['verdict']} at ±{margin}; SD {cmp['sd']:.3f}, seeds for ±{margin}: "
                         f"{cmp['seeds_needed']}{q}.")
    every = [r for cell in runs.values() for r in cell.values()]
    missing = unstamped(every)
    lines += [f"- Records: {len(every)}" + (", **unstamped**: they lack " + ", ".join(
        f"{k} ({n})" for k, n in missing.items()) if missing else ", each stamped with " + ", ".join(STAMPS)) + "."]
    lines.append("- The endpoint is each run's last evaluation (the runs evaluate at step 0 and at the end only: the "
                 "protocol's mean of the last 5 evaluations is not available), and the budget is wall time (30 "
                 "minutes on the same 2 cores: a critic's compute is charged in the steps it costs; no critic here has "
                 "a warm start). No two cells are one configuration, so the grid has no A/A cell and its noise floor "
                 "is not measured. The pooled-over-problems column treats the 200 problems of these runs as the "
                 "units: it says how these runs' end policies differ, not how the methods do over seeds.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="run directories go to <out>/<cell>/seed<S>")
    ap.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, of {', '.join(CELLS)}")
    add_seeds(ap, "0,1,2", "RL seeds")
    ap.add_argument("--records", default=str(ROOT / "bench" / "records" / "smollm"),
                    help="per-run records, <records>/<cell>/seed<S>.json (default bench/records/smollm, committed)")
    ap.add_argument("--reference", default="gae_g1", help="the cell every other is compared with")
    add_stop_after(ap)
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args(argv)
    cells = [c for c in args.cells.split(",") if c]
    unknown = [c for c in cells if c not in CELLS]
    if unknown:
        raise SystemExit(f"--cells: unknown {unknown}; the cells are {', '.join(CELLS)}")
    records = Path(args.records)
    rc = 0 if args.report_only else run_cells(args, cells, args.seeds, records)
    text = report(records, args.reference)
    print(text)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "smollm_grid.md").write_text(text + "\n")
    return rc


if __name__ == "__main__":
    sys.exit(main())
