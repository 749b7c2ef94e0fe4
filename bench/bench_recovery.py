"""Recovery benchmark: how fast a killed role is back, and what 20 kills cost a run.

Two runs of the same experiment and steps, both from the same version 0 of policy and critic (built once, so no
warm start is timed): a clean run, and a chaos run (`prime_values.tools.chaos`) that SIGKILLs a role every few seconds
once RL has started, every role in turn. Measures:

- per kill, the seconds from the SIGKILL to the killed role's first output after it (its first rollout segment,
  scored values, batch, policy step or critic step: the first line its metrics file gets for one), as medians per
  role and over all kills; goal <= 10 s;
- the chaos run's wall time over the clean run's (conductor start to exit); goal <= 1.5;
- `prime_values.tools.check` of the chaos run: nothing lost, duplicated or changed (exit 0).

    python -m bench.bench_recovery [--kills 20] [--steps 150] [--min-gap 3] [--max-gap 8] [--out results.json]
        [-- extra overrides]

Run it alone (`flock /tmp/pv-heavy.lock ...`): on a shared machine the figures move with the load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.bench_pipeline import BASE, build_v0, launch, seed_run
from bench.common import command_line, write_record
from prime_values.tools.chaos import chaos


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--min-gap", type=float, default=3.0)
    parser.add_argument("--max-gap", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-clean", action="store_true", help="skip the clean run (no wall-time ratio)")
    parser.add_argument("--out", type=Path, help="write the results here as JSON")
    parser.add_argument("--keep", type=Path, help="keep the run directories under this directory")
    parser.add_argument("overrides", nargs="*", help="more overrides for both runs")
    args = parser.parse_args(argv)
    base = args.keep or Path(tempfile.mkdtemp(prefix="pv-recovery-"))
    base.mkdir(parents=True, exist_ok=True)
    overrides = [*BASE, f"steps={args.steps}", f"eval_every={args.steps}", *args.overrides]
    warm = build_v0(base, [o for o in overrides if o.startswith("policy.arch.")])
    result: dict = {"command": command_line("bench_recovery", argv),
                    "overrides": overrides, "kills_asked": args.kills}
    if not args.no_clean:
        clean = base / "clean"
        seed_run(warm, clean)
        began = time.time()
        launch(clean, overrides, timeout_s=3600)
        result["clean_wall_s"] = round(time.time() - began, 1)
        print(f"clean run: {args.steps} steps in {result['clean_wall_s']} s", flush=True)
    run = base / "chaos"
    seed_run(warm, run)
    report = chaos(run, overrides, args.kills, args.min_gap, args.max_gap, args.seed, timeout_s=3600)
    kills = report["killed"]
    by_role: dict[str, list[float]] = {}
    for kill in kills:
        if kill.get("recovered_s") is not None:
            by_role.setdefault(kill["role"], []).append(kill["recovered_s"])
    every = [t for times in by_role.values() for t in times]
    result.update({
        "kills": len(kills), "recovered": len(every),
        "median_recovery_s": round(statistics.median(every), 2) if every else None,
        "median_recovery_s_per_role": {r: round(statistics.median(t), 2) for r, t in sorted(by_role.items())},
        "max_recovery_s": max(every, default=None),
        "chaos_wall_s": report["run_wall_s"], "policy_steps": report["policy_steps"],
        "run_returncode": report["run_returncode"], "check_returncode": report["check_returncode"],
        "check_output": report["check_output"], "restarts_per_role": report["restarts_per_role"],
        "killed": kills,
    })
    if "clean_wall_s" in result and report["run_wall_s"]:
        result["wall_ratio"] = round(report["run_wall_s"] / result["clean_wall_s"], 2)
    for kill in kills:
        print(f"  kill {kill['role']:<15} at {kill['at_s']:>6} s (step {kill['policy_step']:>3}): back with output "
              f"after {kill.get('recovered_s')} s")
    print(f"recovery (kill -> first output): median {result['median_recovery_s']} s over {len(every)} of "
          f"{len(kills)} kills (goal <= 10 s); per role {result['median_recovery_s_per_role']}")
    if "wall_ratio" in result:
        print(f"wall time: chaos {result['chaos_wall_s']} s / clean {result['clean_wall_s']} s = "
              f"{result['wall_ratio']}x (goal <= 1.5x)")
    print(f"run exit {report['run_returncode']}, prime_values.tools.check exit {report['check_returncode']}: "
          + " | ".join(report["check_output"][-2:]))
    if args.out:
        write_record(args.out, result)
    ok = report["run_returncode"] == 0 and report["check_returncode"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
