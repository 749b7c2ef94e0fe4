"""Pipeline benchmarks: short runs of the embedded experiment, the compared configurations alternating.

Cases (every run of one invocation starts from the same warm-started policy and critic version 0, copied
into its run directory, so the warm start is paid once and every case begins from the same weights, seed and
prompt stream):

  async       +experiment=arith (gae, topology=cpu: the value evaluator is its own process)
  slow_critic the same with critic.throttle_factor=9: each critic step followed by 9x its own duration of sleep
  colocated   the same with topology=colocated (the evaluator served inside the value trainer)
  grpo        advantage=grpo (no critic roles; on CPU the topology does not change anything for it, so one
              run is the baseline of both topologies)
  lockstep    schedule.mode=lockstep (synchronous PPO with the same roles)

Repetitions alternate the order of the cases (forward, then backward), so a machine that slows down over time
slows every case alike. Measures, per run: policy steps per minute after the first fifth of the steps (start-up
excluded), the orchestrator's critic version lag, held-out accuracy over time, and each role's compute / wait /
io fractions (prime_values.tools.summary.time_fractions).

    python -m bench.bench_pipeline [--smoke] [--steps 40] [--reps 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from prime_values.monitor import read_metrics
from prime_values.tools.summary import time_fractions

ROOT = Path(__file__).resolve().parents[1]

BASE = ["+experiment=arith", "launcher.poll_s=0.2", "launcher.stop_grace_s=20"]
# the tests' SMALL overrides (tests/e2e_helpers.py): one-digit sums, a smaller model and a short warm start
SMOKE = ["task.digits=1", "task.heldout_size=16", "+debug=small"]  # conf/debug/small.yaml
ROLE_DEVICES = ("inference", "evaluator", "policy_trainer", "value_trainer")


def device_overrides(device: str | None) -> list[str]:
    """Every role on `device` (GPU mode: on one GPU the roles time-share it); None keeps the experiment's own."""
    return [f"topology.{role}_device={device}" for role in ROLE_DEVICES] if device else []


CASES = {
    "async": [],
    "slow_critic": ["critic.throttle_factor=9"],
    "colocated": ["topology=colocated"],
    "grpo": ["advantage=grpo"],
    "lockstep": ["schedule.mode=lockstep"],
}


def launch(run_dir: Path, overrides: list[str], timeout_s: float) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    out = subprocess.run([sys.executable, "-m", "prime_values", *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=timeout_s)
    if out.returncode != 0:
        raise RuntimeError(f"run {run_dir} failed ({out.returncode}):\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def warm_start(base: Path, overrides: list[str], timeout_s: float) -> Path:
    """One run of a single policy step: its warm start publishes policy and critic version 0."""
    run = base / "warm"
    launch(run, [*overrides, "steps=1"], timeout_s)
    return run


def build_v0(base: Path, overrides: list[str]) -> Path:
    """Smoke mode: untrained version 0 of both models, built here (the warm-start run would cost a pipeline
    start-up); the architecture comes from the policy.arch.* overrides."""
    from omegaconf import OmegaConf

    from prime_values.config import Config
    from prime_values.models import build_char_tokenizer, build_critic, build_tiny_policy, save_model

    arch = dict(OmegaConf.structured(Config).policy.arch)
    arch.update({o.split("=")[0][len("policy.arch."):]: int(o.split("=")[1]) for o in overrides
                 if o.startswith("policy.arch.")})
    warm, tokenizer = base / "warm", build_char_tokenizer()
    save_model(build_tiny_policy(tokenizer, seed=0, **arch), tokenizer, warm / "weights" / "policy" / "0")
    save_model(build_critic(warm / "weights" / "policy" / "0", tokenizer, seed=1, **arch), tokenizer,
               warm / "weights" / "critic" / "0")
    return warm


def seed_run(warm: Path, run: Path) -> None:
    """Version 0 of both models in a fresh run directory: the warm-start job finds them and does nothing."""
    for model in ("policy", "critic"):
        shutil.copytree(warm / "weights" / model / "0", run / "weights" / model / "0")
        (run / "weights" / model / "LATEST").write_text("0\n")


def measure_run(run: Path, steps: int) -> dict:
    policy = read_metrics(run / "metrics" / "policy_trainer.jsonl")
    trained = [m for m in policy if "loss" in m]
    skip = max(1, steps // 5)
    first = next(m for m in trained if m["step"] == skip)
    last = trained[-1]
    evals = [(m["time"], m["step"], m["heldout_accuracy"]) for m in policy if "heldout_accuracy" in m]
    batches = [m for m in read_metrics(run / "metrics" / "orchestrator.jsonl") if "step" in m]
    lags = [m["critic_version_lag_mean"] for m in batches if m["step"] > skip and m.get("critic_version_lag_mean")
            is not None]
    stale = [m["value_staleness_mean"] for m in batches if m["step"] > skip and m.get("value_staleness_mean")
             is not None]
    critic = [m for m in read_metrics(run / "metrics" / "value_trainer.jsonl") if "critic_step" in m]
    return {
        "run_dir": str(run),
        "steps": last["step"],
        "steps_per_min": 60 * (last["step"] - first["step"]) / (last["time"] - first["time"]),
        "s_per_step": (last["time"] - first["time"]) / (last["step"] - first["step"]),
        "critic_version_lag_mean": statistics.mean(lags) if lags else None,
        "value_staleness_mean": statistics.mean(stale) if stale else None,
        "critic_steps": critic[-1]["critic_step"] if critic else 0,
        "critic_version": critic[-1]["critic_version"] if critic else None,
        "evals": [(t - evals[0][0], s, a) for t, s, a in evals],  # seconds since the step-0 evaluation
        "time_fractions": time_fractions(run),
    }


def run_cases(out_dir: Path, smoke: bool = False, steps: int | None = None, reps: int | None = None,
              cases: dict | None = None, log=print, warm: str | None = None, device: str | None = None) -> dict:
    """Every case `reps` times, alternating; returns {case: [measure_run per rep]} plus the settings. `device`
    puts every role on it (`device_overrides`)."""
    steps = steps or (3 if smoke else 30)
    reps = reps or (1 if smoke else 2)
    cases = cases or CASES
    overrides = [*BASE, *(SMOKE if smoke else []), f"eval_every={1 if smoke else 10}", *device_overrides(device)]
    timeout_s = 300 if smoke else 900
    base = Path(tempfile.mkdtemp(prefix="bench_pipeline_", dir=out_dir))
    began = time.time()
    if warm:  # version 0 of an earlier run of the same experiment (its warm start is not paid again)
        warm = Path(warm)
    else:
        warm = build_v0(base, overrides) if smoke else warm_start(base, overrides, timeout_s)
    log(f"  warm start (once, shared by every run): {time.time() - began:.0f} s")
    result = {"steps": steps, "reps": reps, "overrides": overrides, "cases": cases, "base": str(base),
              "warm": str(warm)}
    results: dict = {name: [] for name in cases}
    for rep in range(reps):
        order = list(cases) if rep % 2 == 0 else list(cases)[::-1]
        for name in order:
            run = base / f"{name}-{rep}"
            seed_run(warm, run)
            began = time.time()
            launch(run, [*overrides, f"steps={steps}", *cases[name]], timeout_s)
            results[name].append(measure_run(run, steps))
            log(f"  rep {rep} {name:<12} {time.time() - began:5.0f} s  "
                f"{results[name][-1]['steps_per_min']:6.1f} policy steps/min")
    return {**result, "runs": results}


def _ratio_row(measure: str, ours: list[float], base: list[float], goal: str, ok, unit: str, **extra) -> dict:
    xs = [a / b for a, b in zip(ours, base)]  # paired per repetition
    ratio = statistics.median(xs)
    return {"measure": measure, "ours": statistics.median(ours), "baseline": statistics.median(base), "unit": unit,
            "ratio": ratio, "spread": [min(xs), max(xs)], "goal": goal, "met": ok(ratio), "reps": len(xs), **extra}


def accuracy_at(evals: list, t: float):
    """Held-out accuracy of the last evaluation at or before `t` seconds (and its step)."""
    done = [(s, a) for when, s, a in evals if when <= t + 1e-6]
    return done[-1] if done else (None, None)


def rows(result: dict) -> list[dict]:
    """The suite's rows from `run_cases`' result."""
    runs = result["runs"]
    spm = {name: [r["steps_per_min"] for r in rs] for name, rs in runs.items()}
    out = []
    if "slow_critic" in runs:
        lag = {n: statistics.median(r["critic_version_lag_mean"] or 0.0 for r in runs[n])
               for n in ("slow_critic", "async")}
        critic = {n: statistics.median(r["critic_steps"] for r in runs[n]) for n in ("slow_critic", "async")}
        stale = {n: statistics.median(r["value_staleness_mean"] or 0.0 for r in runs[n])
                 for n in ("slow_critic", "async")}
        out.append(_ratio_row("decoupling: policy steps/min, critic 10x slower / normal critic", spm["slow_critic"],
                              spm["async"], ">= 0.95", lambda r: r >= 0.95, "steps/min",
                              note=f"critic version lag {lag['slow_critic']:.2f} (slow) vs {lag['async']:.2f} "
                                   f"(normal); critic steps {critic['slow_critic']:.0f} vs {critic['async']:.0f}; "
                                   f"values from a critic trained up to {stale['slow_critic']:.1f} vs "
                                   f"{stale['async']:.1f} policy versions back (value_staleness_mean)"))
    for name, topo in (("async", "dedicated (topology=cpu)"), ("colocated", "colocated")):
        if name in runs and "grpo" in runs:
            out.append(_ratio_row(f"critic cost, {topo}: policy steps/min gae / grpo", spm[name], spm["grpo"],
                                  "report", lambda r: None, "steps/min"))
    if "lockstep" in runs:
        sec = {n: [r["s_per_step"] for r in runs[n]] for n in ("async", "lockstep")}
        # held-out accuracy at equal wall time: where each run stood when the shorter of the two ended
        notes = []
        for a, b in zip(runs["async"], runs["lockstep"]):
            t = min(a["evals"][-1][0], b["evals"][-1][0])
            (sa, aa), (sb, ab) = accuracy_at(a["evals"], t), accuracy_at(b["evals"], t)
            notes.append(f"at {t:.0f} s: async step {sa} acc {aa:.3f}, lockstep step {sb} acc {ab:.3f}")
        out.append(_ratio_row("async vs lockstep: wall s per policy step, async / lockstep", sec["async"],
                              sec["lockstep"], "<= 0.6 (separate devices)", lambda r: r <= 0.6, "s/step",
                              note="; ".join(notes)))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--reps", type=int, default=None)
    ap.add_argument("--out", default=None, help="where the run directories go (default: a temp dir)")
    args = ap.parse_args(argv)
    result = run_cases(Path(args.out) if args.out else None, args.smoke, args.steps, args.reps)
    print(json.dumps(rows(result), indent=1, default=str))


if __name__ == "__main__":
    main()
