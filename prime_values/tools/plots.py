"""PNG plots of a run directory, from the roles' metrics files (`python -m prime_values.tools.report <run_dir>`).

One figure per question a researcher asks of an RL run:
  learning.png     is the policy improving? reward and held-out accuracy vs policy step and vs wall time
  critic.png       is the critic any good? explained variance (fresh rollouts and replay), value loss,
                   critic version lag, mean value vs mean return
  advantages.png   what the policy is fed: advantage mean, std, |A| and share positive per batch
  replay.png       the value trainer's intake: buffer size, age, reuse, evictions, ingest drops
  throughput.png   who is busy: generation tokens/s, scoring states/s, policy train/wait time, critic step time
"""

from __future__ import annotations

import logging
from pathlib import Path

from prime_values.monitor import read_metrics
from prime_values.rundir import RunDir


def _series(records: list[dict], x: str, y: str, t0: float = 0.0):
    pts = [(r[x] - (t0 if x == "time" else 0.0), r[y]) for r in records
           if isinstance(r.get(y), (int, float)) and not isinstance(r.get(y), bool) and x in r]
    return tuple(zip(*pts)) if pts else ((), ())


def _panel(ax, title: str, xlabel: str, lines: list[tuple[str, tuple]], ylim=None) -> None:
    for label, (xs, ys) in lines:
        if xs:
            ax.plot(xs, ys, label=label, linewidth=1.0, alpha=0.85, marker="o" if len(xs) < 25 else None,
                    markersize=3)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel, fontsize=9)
    ax.grid(alpha=0.3)
    if ylim:
        ax.set_ylim(*ylim)
    if any(xs for _, (xs, _) in lines):
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="grey")


def plot_run(run: RunDir | str | Path) -> list[Path]:
    """Write the PNGs into `<run>/report/` and return their paths."""
    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its INFO ('generated new fontManager') is no news
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = run if isinstance(run, RunDir) else RunDir(run)
    m = {role: read_metrics(run.metrics(role)) for role in
         ("warm_start", "policy_trainer", "orchestrator", "value_trainer", "evaluator", "inference0")}
    t0 = min((r["time"] for records in m.values() for r in records), default=0.0)
    steps = [r for r in m["policy_trainer"] if "loss" in r]
    evals = [r for r in m["policy_trainer"] if "heldout_accuracy" in r]
    batches = [r for r in m["orchestrator"] if "reward_mean" in r]
    critic = [r for r in m["value_trainer"] if "critic_step" in r]
    out = run.report
    out.mkdir(parents=True, exist_ok=True)
    paths = []

    def figure(name: str, panels: list, ncols: int = 2) -> None:
        nrows = (len(panels) + ncols - 1) // ncols
        fig, axes = plt.subplots(nrows, ncols, figsize=(6 * ncols, 3.6 * nrows), squeeze=False)
        for ax, args in zip(axes.flat, panels):
            _panel(ax, *args)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(f"{name} — {run.root.name}", fontsize=11)
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)

    figure("learning", [
        ("reward per batch", "policy step", [("reward", _series(steps, "step", "reward_mean"))]),
        ("held-out accuracy (greedy)", "policy step", [("accuracy", _series(evals, "step", "heldout_accuracy"))],
         (0, 1)),
        ("reward per batch", "seconds since start", [("reward", _series(steps, "time", "reward_mean", t0))]),
        ("held-out accuracy (greedy)", "seconds since start",
         [("accuracy", _series(evals, "time", "heldout_accuracy", t0))], (0, 1)),
    ])
    figure("critic", [
        ("explained variance", "policy step / critic step",
         [("fresh rollouts (at scoring)", _series(batches, "step", "critic_explained_variance")),
          ("replay sample (train)", _series(critic, "critic_step", "train_explained_variance"))], (-0.5, 1)),
        ("value loss", "critic step", [("value loss", _series(critic, "critic_step", "value_loss"))]),
        ("critic staleness at batch time", "policy step",
         [("critic versions behind the newest (mean)", _series(batches, "step", "critic_version_lag_mean")),
          ("policy versions since its newest data (mean)", _series(batches, "step", "value_staleness_mean"))]),
        ("first-state value vs return", "policy step",
         [("mean value", _series(batches, "step", "value_first_mean")),
          ("mean return", _series(batches, "step", "return_first_mean"))]),
    ])
    figure("advantages", [
        ("advantage mean and std", "policy step", [("mean", _series(batches, "step", "advantage_mean")),
                                                   ("std", _series(batches, "step", "advantage_std"))]),
        ("|advantage| and share positive", "policy step",
         [("mean |A|", _series(batches, "step", "advantage_abs_mean")),
          ("share A > 0", _series(batches, "step", "advantage_positive")),
          ("tether weight", _series(batches, "step", "tether_weight_mean"))]),
        ("off-policy lag", "policy step", [("mean", _series(batches, "step", "off_policy_mean")),
                                           ("max", _series(batches, "step", "off_policy_max"))]),
        ("groups dropped", "policy step", [("stale", _series(batches, "step", "dropped_stale")),
                                           ("warm-up", _series(batches, "step", "dropped_warmup"))]),
    ])
    figure("replay", [
        ("buffer size (rollouts)", "critic step", [("size", _series(critic, "critic_step", "replay_size"))]),
        ("age in policy versions", "critic step", [("mean", _series(critic, "critic_step", "replay_age_mean")),
                                                   ("max", _series(critic, "critic_step", "replay_age_max"))]),
        ("reuse", "critic step", [("mean uses held", _series(critic, "critic_step", "replay_reuse_mean")),
                                  ("mean uses of evicted",
                                   _series(critic, "critic_step", "replay_mean_reuse_of_evicted"))]),
        ("evictions and drops (cumulative)", "critic step",
         [("capacity", _series(critic, "critic_step", "replay_evicted_capacity")),
          ("reuse", _series(critic, "critic_step", "replay_evicted_reuse")),
          ("age", _series(critic, "critic_step", "replay_evicted_age")),
          ("ingest dropped", _series(critic, "critic_step", "ingest_dropped"))]),
    ])
    figure("throughput", [
        ("generation (inference0)", "seconds since start",
         [("new tokens/s", _series(m["inference0"], "time", "tokens_per_s", t0))]),
        ("scoring (evaluator; inside the value trainer when colocated)", "seconds since start",
         [("states/s", _series(m["evaluator"] + m["value_trainer"], "time", "states_per_s", t0))]),
        ("policy trainer per step", "policy step", [("train s", _series(steps, "step", "train_s")),
                                                    ("waiting for a batch s", _series(steps, "step", "step_wait_s"))]),
        ("value trainer per step", "critic step", [("step s", _series(critic, "critic_step", "step_s"))]),
    ])
    return paths
