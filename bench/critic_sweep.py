"""What the critic buys: read a Hydra multirun of the arith experiment and compare advantage estimators.

    python -m prime_values -m +experiment=arith advantage=gae,tether critic.privileged=true,false seed=0,1,2 \
        steps=200 eval_every=25 hydra.sweep.dir=sweeps/critic
    python -m prime_values -m +experiment=arith advantage=grpo seed=0,1,2 steps=200 eval_every=25 \
        hydra.sweep.dir=sweeps/grpo
    python -m bench.critic_sweep sweeps/critic sweeps/grpo --gain 0.2 --out sweeps/report

For every run directory (a subdirectory holding config.yaml and metrics/) it reads the held-out accuracy
curve of the policy trainer and the critic's explained variance on fresh rollouts from the orchestrator, then
groups runs by (estimator, privileged) over seeds. The target accuracy of a run is its accuracy at the first
RL step plus --gain: runs of one seed share the warm-started checkpoint, so they start from the same point.
Writes sweep.md (table + goals), sweep.json and sweep.png (accuracy and explained variance vs step).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from omegaconf import OmegaConf

from bench.common import command_line, write_record
from prime_values.algo.ev import ev_from_sums
from prime_values.monitor import read_metrics


def run_dirs(roots: list[Path]) -> list[Path]:
    found = []
    for root in roots:
        candidates = [root] if (root / "config.yaml").exists() else sorted(p for p in root.iterdir() if p.is_dir())
        found += [p for p in candidates if (p / "config.yaml").exists() and (p / "metrics").is_dir()]
    return found


def read_run(path: Path, gain: float) -> dict | None:
    cfg = OmegaConf.load(path / "config.yaml")
    policy = read_metrics(path / "metrics" / "policy_trainer.jsonl")
    evals = [(m["step"], m["heldout_accuracy"], m["time"]) for m in policy if "heldout_accuracy" in m]
    if not evals or evals[0][0] != 0:
        return None
    start_acc, start_time = evals[0][1], evals[0][2]
    target = start_acc + gain
    reached = next(((s, t - start_time) for s, a, t in evals if a >= target - 1e-9), None)
    batches = [m for m in read_metrics(path / "metrics" / "orchestrator.jsonl") if "step" in m] \
        if (path / "metrics" / "orchestrator.jsonl").exists() else []
    ev = [(m["step"], m["critic_explained_variance"]) for m in batches
          if isinstance(m.get("critic_explained_variance"), float) and math.isfinite(m["critic_explained_variance"])]
    # the run summary's figure: EV pooled over the tokens of the last 10 batches (algo/ev.py); runs from before
    # critic_ev_sums was logged fall back to the mean of the last 10 per-batch EVs
    sums = [m["critic_ev_sums"] for m in batches if m.get("critic_ev_sums")][-10:]
    final_ev = ev_from_sums(sums) if sums else (statistics.fmean(v for _, v in ev[-10:]) if ev else None)
    if final_ev is not None and not math.isfinite(final_ev):
        final_ev = None
    estimator = cfg.advantage.estimator
    label = estimator if estimator == "grpo" else f"{estimator}/{'privileged' if cfg.critic.privileged else 'plain'}"
    return {"run": str(path), "label": label, "seed": cfg.seed, "steps": cfg.steps,
            "start_accuracy": start_acc, "final_accuracy": evals[-1][1], "target": target,
            "steps_to_target": reached[0] if reached else None,
            "seconds_to_target": round(reached[1], 1) if reached else None,
            "final_explained_variance": final_ev,
            "accuracy_curve": [(s, a) for s, a, _ in evals], "ev_curve": ev}


def summarize(runs: list[dict]) -> dict[str, dict]:
    by_label: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by_label[r["label"]].append(r)
    out = {}
    for label, rs in sorted(by_label.items()):
        hit = [r["steps_to_target"] for r in rs if r["steps_to_target"] is not None]
        secs = [r["seconds_to_target"] for r in rs if r["seconds_to_target"] is not None]
        evs = [r["final_explained_variance"] for r in rs if r["final_explained_variance"] is not None]
        out[label] = {
            "runs": len(rs), "reached": len(hit),
            # a run that never reached the target counts as its full length (a lower bound on its cost)
            "steps_to_target_mean": statistics.fmean(r["steps_to_target"] or r["steps"] for r in rs),
            "steps_to_target": [r["steps_to_target"] for r in rs],
            # standard error of the mean steps over seeds (0 with one seed): the "seed noise" of the goals
            "steps_to_target_se": statistics.stdev(r["steps_to_target"] or r["steps"] for r in rs) / len(rs) ** 0.5
            if len(rs) > 1 else 0.0,
            "seconds_to_target_median": statistics.median(secs) if secs else None,
            "final_accuracy_mean": statistics.fmean(r["final_accuracy"] for r in rs),
            "gain_mean": statistics.fmean(r["final_accuracy"] - r["start_accuracy"] for r in rs),
            "final_explained_variance_mean": statistics.fmean(evs) if evs else None,
        }
    return out


def goals(summary: dict[str, dict]) -> list[str]:
    def get(label, key):
        return summary.get(label, {}).get(key)

    lines = []
    for label, goal in (("gae/privileged", 0.9), ("gae/plain", 0.6)):
        ev = get(label, "final_explained_variance_mean")
        if ev is not None:
            lines.append(f"{label} explained variance on fresh rollouts {ev:.2f} (goal >= {goal}): "
                         f"{'MET' if ev >= goal else 'NOT MET'}")
    gae, grpo = get("gae/privileged", "steps_to_target_mean"), get("grpo", "steps_to_target_mean")
    if gae is not None and grpo:
        lines.append(f"gae/privileged steps to target / grpo = {gae / grpo:.2f} (goal <= 0.7): "
                     f"{'MET' if gae / grpo <= 0.7 else 'NOT MET'}")
    tether = get("tether/privileged", "steps_to_target_mean")
    if tether is not None and gae is not None and grpo:
        best_label = "gae/privileged" if gae <= grpo else "grpo"
        best = min(gae, grpo)
        # seed noise: two standard errors of the difference of the two means (seeds are independent runs)
        noise = 2 * math.hypot(get("tether/privileged", "steps_to_target_se"), get(best_label, "steps_to_target_se"))
        lines.append(f"tether/privileged steps to target {tether:.0f} vs the better of gae/grpo ({best_label}) "
                     f"{best:.0f}, seed noise +-{noise:.0f} (goal: not worse beyond seed noise): "
                     f"{'MET' if tether <= best + noise else 'NOT MET'}")
    return lines


def table(summary: dict[str, dict], gain: float) -> str:
    rows = ["| estimator | runs | reached target | steps to target (per seed) | mean steps +- s.e. | "
            "median s to target | final acc | gain | critic EV (fresh) |", "|---|---|---|---|---|---|---|---|---|"]

    def f(x, spec):
        return "n/a" if x is None else format(x, spec)

    for label, s in summary.items():
        per_seed = ", ".join("-" if x is None else str(x) for x in s["steps_to_target"])
        rows.append(f"| {label} | {s['runs']} | {s['reached']} | {per_seed} | {s['steps_to_target_mean']:.0f} "
                    f"+- {s['steps_to_target_se']:.0f} | "
                    f"{f(s['seconds_to_target_median'], '.0f')} | {s['final_accuracy_mean']:.3f} | "
                    f"{s['gain_mean']:+.3f} | {f(s['final_explained_variance_mean'], '.2f')} |")
    return (f"Target: held-out accuracy at the first RL step + {gain:.2f}; '-' = not reached (counted as the run's "
            "length). Critic EV: pooled over the tokens of each run's last 10 batches, mean over seeds.\n\n"
            + "\n".join(rows))


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, ev_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors: dict[str, str] = {}
    for r in sorted(runs, key=lambda r: (r["label"], r["seed"])):
        label = None if r["label"] in colors else r["label"]  # one legend entry per estimator
        color = colors.setdefault(r["label"], f"C{len(colors)}")
        steps, acc = zip(*r["accuracy_curve"])
        acc_ax.plot(steps, acc, color=color, label=label, alpha=0.8)
        if r["ev_curve"]:
            s, v = zip(*r["ev_curve"])
            ev_ax.plot(s, v, color=color, label=label, alpha=0.6, linewidth=0.8)
    acc_ax.set(xlabel="policy step", ylabel="held-out accuracy (greedy)", title="accuracy (one line per seed)")
    ev_ax.set(xlabel="policy step", ylabel="explained variance", title="critic EV on fresh rollouts", ylim=(-0.5, 1))
    for ax in (acc_ax, ev_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path, help="sweep directories (or run directories)")
    parser.add_argument("--gain", type=float, default=0.10, help="target = accuracy at the first RL step + this")
    parser.add_argument("--out", type=Path, default=None, help="where sweep.md/json/png go (default: first dir)")
    args = parser.parse_args(argv)
    runs = [r for r in (read_run(p, args.gain) for p in run_dirs(args.dirs)) if r]
    if not runs:
        print(f"no finished runs under {', '.join(map(str, args.dirs))}", file=sys.stderr)
        return 1
    summary = summarize(runs)
    out = args.out or args.dirs[0]
    out.mkdir(parents=True, exist_ok=True)
    text = table(summary, args.gain) + "\n\n" + "\n".join(f"- {g}" for g in goals(summary)) + "\n"
    (out / "sweep.md").write_text(text)
    write_record(out / "sweep.json", {"command": command_line("critic_sweep", argv), "gain": args.gain,
                                      "summary": summary, "runs": runs})
    plot(runs, out / "sweep.png")
    print(text + f"\nwritten: {out / 'sweep.md'}, {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
