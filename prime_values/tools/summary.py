"""The summary of a run directory (report/summary.json): the figures a run is judged by, from the roles' metrics
files. The report (`python -m prime_values.tools.report`) and the sweep summary both use it; it imports neither."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from prime_values.algo.ev import ev_from_sums
from prime_values.monitor import read_metrics
from prime_values.rundir import RunDir, write_atomic
from prime_values.weights import latest_version

EV_WINDOW = 10  # batches pooled for the final explained variance (one batch is noisy)


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


TIMED_ROLES = ("policy_trainer", "inference0", "evaluator", "orchestrator", "value_trainer")


def time_fractions(run: RunDir | str | Path) -> dict[str, dict[str, float]]:
    """Per role, the fraction of its wall time spent computing, waiting for input and on log/weights I/O
    (`compute_s`, `wait_s`, `io_s` over `role_wall_s` in the role's last metrics record that has them;
    prime_values.monitor.Timers). Roles that logged no timers are left out."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    out = {}
    names = [p.stem for p in (run.root / "metrics").glob("*.jsonl")]
    for name in sorted(names, key=lambda n: (TIMED_ROLES.index(n) if n in TIMED_ROLES else len(TIMED_ROLES), n)):
        timed = [m for m in read_metrics(run.metrics(name)) if m.get("role_wall_s")]
        if timed:
            last = timed[-1]
            out[name] = {k: last[f"{k}_s"] / last["role_wall_s"] for k in ("compute", "wait", "io")}
            out[name]["wall_s"] = last["role_wall_s"]
    return out


def format_time_fractions(fractions: dict[str, dict[str, float]], indent: str = "") -> list[str]:
    """One line per role: 'policy_trainer  compute 41%  wait 55%  io 3%  other 1%  (of 80 s)'; other = start-up
    (model loading) and what no timer covers."""
    return [f"{indent}{name:<15} compute {f['compute']:4.0%}  wait {f['wait']:4.0%}  io {f['io']:4.0%}  "
            f"other {max(0.0, 1 - f['compute'] - f['wait'] - f['io']):4.0%}  (of {f['wall_s']:.0f} s)"
            for name, f in fractions.items()]


def final_explained_variance(batches: list[dict]) -> float | None:
    """The critic's explained variance on fresh rollouts over these batches: pooled over all their tokens from
    the orchestrator's `critic_ev_sums` (runs from before they were logged: the mean of per-batch EVs)."""
    sums = [m["critic_ev_sums"] for m in batches if m.get("critic_ev_sums")]
    if sums and len(sums) == len(batches):
        ev = ev_from_sums(sums)
        return None if math.isnan(ev) else ev
    return _mean([m.get("critic_explained_variance") for m in batches])


def summarise(run: RunDir | str | Path, status: str = "finished", error: str | None = None) -> dict:
    run = run if isinstance(run, RunDir) else RunDir(run)
    policy = read_metrics(run.metrics("policy_trainer"))
    orchestrator = read_metrics(run.metrics("orchestrator"))
    warm = [m for m in read_metrics(run.metrics("warm_start")) if "heldout_accuracy" in m]
    critic = [m for m in read_metrics(run.metrics("value_trainer")) if "critic_step" in m]
    evals = [m for m in policy if "heldout_accuracy" in m]
    steps = [m for m in policy if "loss" in m]
    batches = [m for m in orchestrator if "step" in m]
    policy_version, critic_version = latest_version(run.weights("policy")), latest_version(run.weights("critic"))
    warm_all = read_metrics(run.metrics("warm_start"))
    first_time = min((m["time"] for m in warm_all), default=None)
    last_time = max((m["time"] for m in policy), default=None)
    summary = {
        "status": status,
        "error": error,
        "run_dir": str(run.root.resolve()),
        "policy_steps": steps[-1]["step"] if steps else 0,
        "warm_start_accuracy": warm[-1]["heldout_accuracy"] if warm else None,
        "first_rl_step_accuracy": evals[0]["heldout_accuracy"] if evals else None,
        "final_accuracy": evals[-1]["heldout_accuracy"] if len(evals) > 1 else None,
        "final_accuracy_step": evals[-1]["step"] if len(evals) > 1 else None,
        "final_reward_mean": _mean([m.get("reward_mean") for m in steps[-EV_WINDOW:]]),
        "final_explained_variance": final_explained_variance(batches[-EV_WINDOW:]),
        "critic_version": critic_version,
        "critic_steps": critic[-1]["critic_step"] if critic else 0,
        "wall_s": (last_time - first_time) if first_time and last_time else None,
        "waited": waited(run, warm_all, policy, last_time),
        "policy_weights": str(run.weights("policy") / str(policy_version)) if policy_version is not None else None,
        "critic_weights": str(run.weights("critic") / str(critic_version)) if critic_version is not None else None,
        "time_fractions": time_fractions(run),
        "written_at": time.time(),
    }
    run.report.mkdir(parents=True, exist_ok=True)
    write_atomic(run.report / "summary.json", json.dumps(summary, indent=2))
    return summary


def waited(run: RunDir, warm: list[dict], policy: list[dict], last_time: float | None) -> dict:
    """What a user waits for, from the launch (the run's config.yaml, written when it is launched or resumed) to
    the policy trainer's last record: `total_s`; `before_rl_s` up to the policy trainer's first record (start-up,
    the warm start's SFT `sft_s` and critic pretraining `critic_pretrain_s`, the first held-out evaluation), then
    `rl_s`, of which `heldout_s` in held-out evaluations. None where the run has not got that far;
    `warm_start_cached`: version 0 came from the warm-start cache (prime_values/warm_cache.py)."""
    began = run.config.stat().st_mtime if run.config.exists() else None
    first_policy = min((m["time"] for m in policy), default=None)
    cached = any("cached_from" in m for m in warm)  # version 0 from the warm-start cache: no SFT in this run

    def span(a, b):
        return round(b - a, 1) if a is not None and b is not None and b >= a else None
    return {"total_s": span(began, last_time), "before_rl_s": span(began, first_policy),
            "warm_start_cached": cached,
            "sft_s": None if cached else next((round(m["sft_s"], 1) for m in warm if "sft_s" in m), None),
            "critic_pretrain_s": None if cached else next((round(m["critic_pretrain_s"], 1) for m in warm
                                                           if "critic_pretrain_s" in m), None),
            "rl_s": span(first_policy, last_time),
            "heldout_s": round(sum(m.get("heldout_s", 0.0) for m in policy), 1) if policy else None}


def _fmt(value, spec=".3f"):
    return "n/a" if value is None else format(value, spec)


def format_summary(s: dict) -> str:
    gain = (s["final_accuracy"] - s["first_rl_step_accuracy"]) if s["final_accuracy"] is not None and \
        s["first_rl_step_accuracy"] is not None else None
    return "\n".join([
        f"== prime_values run {s['status']} ==",
        f"run directory        {s['run_dir']}",
        f"policy steps         {s['policy_steps']}   wall {_fmt(s['wall_s'], '.0f')} s",
        *_wait_line(s.get("waited")),
        f"held-out accuracy    warm start {_fmt(s['warm_start_accuracy'])} -> first RL step "
        f"{_fmt(s['first_rl_step_accuracy'])} -> final {_fmt(s['final_accuracy'])} (gain {_fmt(gain, '+.3f')})",
        f"reward (last {EV_WINDOW} steps) {_fmt(s['final_reward_mean'])}",
        f"critic               version {s['critic_version']} after {s['critic_steps']} steps, explained variance "
        f"on fresh rollouts (pooled over the last {EV_WINDOW} batches) {_fmt(s['final_explained_variance'])}",
        *_time_lines(s.get("time_fractions")),
        f"policy weights       {s['policy_weights']}",
        f"critic weights       {s['critic_weights']}",
        f"summary              {s['run_dir']}/report/summary.json",
    ])


def _wait_line(w) -> list[str]:
    """'waited               96 s: 41 s before RL (SFT 25 s, critic pretraining 12 s), 55 s of RL (2 s held-out)'"""
    if not w or w.get("total_s") is None:
        return []
    parts = [f"{k} {w[key]:.0f} s" for k, key in (("SFT", "sft_s"), ("critic pretraining", "critic_pretrain_s"))
             if w.get(key) is not None]
    if w.get("warm_start_cached"):
        parts = ["version 0 from the warm-start cache"]
    before = f"{_fmt(w['before_rl_s'], '.0f')} s before RL" + (f" ({', '.join(parts)})" if parts else "")
    rl = f"{_fmt(w['rl_s'], '.0f')} s of RL ({_fmt(w['heldout_s'], '.0f')} s held-out evaluation)"
    return [f"waited               {w['total_s']:.0f} s from the launch: {before}, {rl}"]


def _time_lines(fractions) -> list[str]:
    """The summary's "where the time goes" lines; the policy trainer's waiting fraction is the headline."""
    if not fractions:
        return []
    head = fractions.get("policy_trainer")
    first = f"where the time goes   policy trainer waits {head['wait']:.0%} of its wall time for batches" if head \
        else "where the time goes"
    return [first, *format_time_fractions(fractions, indent="  ")]
