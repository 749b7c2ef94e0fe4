"""End to end: the conductor runs the roles as real subprocesses through submitit; assertions read the run
directory the roles wrote (the log, weights, metrics, cursors) and /proc for processes left behind."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from prime_values.monitor import read_metrics

# the shared pieces live in tests/e2e_helpers.py; other test files import them from here too
from tests.e2e_helpers import CRITIC_EV_BOUND, REPO, assert_learned, processes_mentioning, run_pipeline, stream_table

pytestmark = pytest.mark.slow  # every test here runs the whole pipeline of processes


def assert_roles_did_their_part(run_dir: Path, steps: int, critic: bool, lockstep: bool = False,
                                plots: bool = False, critic_ev_bound: float | None = None) -> None:
    assert_learned(run_dir, critic=critic, lockstep=lockstep, critic_ev_bound=critic_ev_bound)
    from prime_values.tools.check import check

    invariants = check(run_dir)  # every invariant of the run directory (staleness bound, one batch per step, ...)
    assert invariants.ok, invariants.violations
    counts = invariants.counts  # with a critic: every values and targets record paired with its rollout by digest
    assert counts["paired"] == (counts["values"] + counts["targets"] if critic else 0) and not counts["undigested"]
    rollouts = stream_table(run_dir, "rollouts")
    assert rollouts.num_rows >= steps * 16, "inference logged fewer rollouts than the batches need"
    assert set(rollouts.column("stop_reason").to_pylist()) <= {"eos", "length"}
    batches = stream_table(run_dir, "batches")
    assert sorted(set(batches.column("step").to_pylist())) == list(range(1, steps + 1))
    trained = [m["step"] for m in read_metrics(run_dir / "metrics" / "policy_trainer.jsonl") if "loss" in m]
    assert trained == list(range(1, steps + 1)), "batches were not consumed once each, in order"
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == str(steps)
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run_dir / "weights" / "policy" / str(steps))
    if critic:
        values = stream_table(run_dir, "values")
        assert len(set(values.column("critic_version").to_pylist())) >= 2, "the evaluator never adopted a new critic"
        value_steps = [m for m in read_metrics(run_dir / "metrics" / "value_trainer.jsonl") if "critic_step" in m]
        assert value_steps and value_steps[-1]["replay_sampled"] > 0, "the replay buffer was never sampled"
        critic_latest = int((run_dir / "weights" / "critic" / "LATEST").read_text())
        assert critic_latest >= 2 and critic_latest == value_steps[-1]["critic_version"]
    else:
        assert set(batches.column("critic_version").to_pylist()) == {-1}
        assert not (run_dir / "log" / "values").exists()
    summary = json.loads((run_dir / "report" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["policy_steps"] == steps
    report = (run_dir / "report" / "summary.md").read_text()
    if plots:
        for name in ("learning", "critic", "advantages", "replay", "throughput"):
            assert (run_dir / "report" / f"{name}.png").stat().st_size > 10_000, f"plot {name}.png missing or empty"
        assert "learning.png" in report
    else:
        assert "No plots (log.plots=false)" in report and not list((run_dir / "report").glob("*.png"))
    from prime_values.tools.status import status

    shown = status(run_dir)
    assert "ended, finished" in shown and f"policy step {steps}/{steps}" in shown
    assert re.search(r"policy_trainer +job \d+ +COMPLETED", shown), shown
    assert not processes_mentioning(str(run_dir)), "a role process outlived the run"


@pytest.mark.parametrize("topology", ["cpu", "colocated"])
def test_pipeline_with_critic(tmp_path, topology):
    run_dir = tmp_path / "run"
    warmup = topology == "cpu"  # one run also holds the policy for a critic warm-up, the other takes the options
    options = ["critic.warmup.min_version=3", "log.plots=true"] if warmup else \
        ["advantage=tether", "policy.trust_region=prob_diff", "critic.loss=bce", "advantage.lambda_value=0.9",
         "task.train_pool=6"]
    result = run_pipeline(run_dir, f"topology={topology}", *options)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== prime_values run finished ==" in result.stdout and str(run_dir) in result.stdout
    # the critic's quality bound is argued for the easy configuration (mse, lambda_value = 1); the other run's bce
    # critic with lambda_value = 0.9 and tether is not that configuration
    assert_roles_did_their_part(run_dir, 8, critic=True, plots=warmup,
                                critic_ev_bound=CRITIC_EV_BOUND if warmup else None)
    jobs = {p.name for p in (run_dir / "jobs").iterdir()}
    assert ("evaluator" in jobs) == (topology == "cpu"), jobs
    first = stream_table(run_dir, "batches").filter(ds.field("step") == 1).column("critic_version").to_pylist()
    if warmup:
        assert min(first) >= 3, f"batch 1 used values of critic versions {first} before the warm-up gate"
        assert (run_dir / "control" / "warmup_done").exists()
        chunks = read_metrics(run_dir / "metrics" / "inference0.jsonl")
        assert any(c["warmup"] for c in chunks) and not chunks[-1]["warmup"], "inference did not free-run"
        orchestrated = read_metrics(run_dir / "metrics" / "orchestrator.jsonl")
        assert orchestrated[-1]["dropped_warmup"] > 0
    else:
        assert min(first) == 0  # no gate: the first batch uses the pretrained critic v0
        prompts = set(stream_table(run_dir, "rollouts").column("prompt_id").to_pylist())
        assert len(prompts) <= 6, f"task.train_pool=6 but inference drew {len(prompts)} distinct prompts"
        batches = [m for m in read_metrics(run_dir / "metrics" / "orchestrator.jsonl") if "step" in m]
        # tether_mode=group weighs the critic by its R^2 on each group (0 for a useless critic, e.g. a constant);
        # measured 0-0.29 per batch (2026-12-03), so a critic the blend never uses fails
        weights = [m["tether_weight_mean"] for m in batches]
        assert max(weights) > 0.05, f"advantage=tether never used the critic: weights {weights}"
        # the bce critic discriminates: at the last policy token (<eos>: the answer written, the reference
        # privileged) its value is higher for right answers than for wrong ones. Measured 0.74 against 0.46 on
        # 42 / 86 rollouts (2026-12-03); a constant or answer-blind critic gives ~0
        rollouts = {r["rollout_id"]: r for r in stream_table(run_dir, "rollouts").to_pylist()}
        last = {True: [], False: []}
        for v in stream_table(run_dir, "values").to_pylist():
            r = rollouts[v["rollout_id"]]
            last[r["reward"] == 1.0].append(v["values"][max(i for i, m in enumerate(r["policy_mask"]) if m)])
        means = {k: sum(x) / len(x) for k, x in last.items()}
        assert means[True] - means[False] > 0.1, f"the bce critic's final values ignore the outcome: {means}"


def test_pipeline_grpo_lockstep_starts_no_critic(tmp_path):
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "advantage=grpo", "schedule.mode=lockstep", "steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_roles_did_their_part(run_dir, 4, critic=False, lockstep=True)
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"}
    for row in stream_table(run_dir, "batches").to_pylist():
        assert row["policy_version"] == row["step"] - 1, "lockstep batch n must come from policy version n - 1"
    ratios = [m["ratio_mean"] for m in read_metrics(run_dir / "metrics" / "policy_trainer.jsonl") if "loss" in m]
    assert all(abs(r - 1) < 1e-3 for r in ratios), f"a lockstep step was off-policy: ratios {ratios}"


# The learning test. One-digit sums, a fixed pool of 4 problems, grpo in lockstep: batch n holds 32 groups (one
# prompt x 4 samples each) sampled by policy version n - 1. Compared: the mean reward of batches 1-3 (versions 0-2)
# and of the last 3 batches. Measured (2 cores, loaded): 0.27-0.30 -> 0.72-0.85, a rise of +0.52 and +0.57 with
# seeds 3 and 5 (the first update dips the reward: Adam's first step moves every weight by ~lr).
# Why MARGIN cannot be reached without learning, on any machine: with a missing update every batch is sampled by
# version 0, so the 3 x 32 = 96 group means of each window are independent draws (prompt uniform from the pool,
# samples independent given it) of one distribution on [0, 1]; the difference of the two windows' means then
# exceeds t with probability <= exp(-n t^2) (Hoeffding, n = 96 groups per window): exp(-96 * 0.3^2) = 1.8e-4.
# A flipped update descends the same surrogate, so it lowers the expected reward and the rise is even less likely
# (tests/mutations.py, sign-flip: the reward collapses). Floating-point differences between machines change which
# samples are drawn, not these distributions.
MARGIN = 0.3


def test_reward_rises_on_an_easy_configuration(tmp_path):
    run_dir = tmp_path / "run"
    steps = 24
    result = run_pipeline(run_dir, "advantage=grpo", "schedule.mode=lockstep", f"steps={steps}", "eval_every=100",
                          "task.train_pool=4", "inference.prompts_per_step=32", "inference.group_size=4",
                          "policy.lr=1e-3", "seed=3")
    assert result.returncode == 0, result.stderr[-3000:]
    figures = assert_learned(run_dir, critic=False, lockstep=True)
    batches = stream_table(run_dir, "batches").to_pylist()
    per_step = {s: [r["reward"] for r in batches if r["step"] == s] for s in range(1, steps + 1)}
    assert all(len(v) == 32 * 4 for v in per_step.values()), {s: len(v) for s, v in per_step.items()}
    means = [sum(v) / len(v) for v in per_step.values()]
    first, last = sum(means[:3]) / 3, sum(means[-3:]) / 3
    figures.update(reward_per_step=[round(m, 3) for m in means])
    assert last - first >= MARGIN, f"reward rose {last - first:+.3f} (< {MARGIN}) from batches 1-3 to the last 3: " \
                                   f"{figures}"


def test_crashing_role_stops_the_run(tmp_path):
    """A role that fails again after its restarts (launcher.max_restarts) stops the run with its error."""
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "launcher.max_restarts=1", "launcher.restart_backoff_s=0.1",
                          env={"PRIME_VALUES_FAULT": "orchestrator"})
    assert result.returncode == 1
    assert "restarting it in 0 s (1/1)" in result.stdout, result.stdout[-2000:]
    assert "role orchestrator failed" in result.stderr and "injected fault" in result.stderr
    assert "after 1 restarts" in result.stderr
    assert json.loads((run_dir / "control" / "restarts.json").read_text())["orchestrator"] == 1
    assert str(run_dir / "jobs" / "orchestrator") in result.stderr  # the role's log path
    assert not processes_mentioning(str(run_dir)), "a role process outlived the failed run"


def test_detached_run_is_followed_and_stopped_from_the_run_directory(tmp_path):
    """launcher.detach=true: the command returns at once, a conductor job runs the roles; `status --stop` ends it
    cleanly (summary written, every role gone)."""
    import time

    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "advantage=grpo", "steps=100000", "launcher.detach=true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "detached; conductor job" in result.stdout and f"prime_values.tools.status {run_dir}" in result.stdout
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    deadline = time.time() + 300
    while time.time() < deadline:
        latest = run_dir / "weights" / "policy" / "LATEST"
        if latest.exists() and int(latest.read_text()) >= 3:
            break
        time.sleep(1)
    else:
        raise AssertionError("the detached run made no progress: " + subprocess.run(
            [sys.executable, "-m", "prime_values.tools.status", str(run_dir)], capture_output=True, text=True,
            env=env).stdout)
    shown = subprocess.run([sys.executable, "-m", "prime_values.tools.status", str(run_dir), "--stop"], cwd=REPO,
                           env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "stop requested" in shown.stdout, shown.stderr
    assert re.search(r"conductor +job \d+ +RUNNING", shown.stdout), shown.stdout
    summary = run_dir / "report" / "summary.json"
    while time.time() < deadline and not summary.exists():
        time.sleep(1)
    assert json.loads(summary.read_text())["status"] == "stopped"
    # the conductor job still writes the report (plots) after summary.json: give it time to exit
    left = processes_mentioning(str(run_dir))
    while left and time.time() < deadline + 120:
        time.sleep(1)
        left = processes_mentioning(str(run_dir))
    assert not left, f"a role outlived the stopped detached run: {left}"
    assert_learned(run_dir, critic=False)  # the steps it made before the stop


def test_two_inference_workers_and_two_evaluators(tmp_path):
    """topology.evaluators=2: evaluator k scores the rollouts of inference worker k (w % 2 == k), each writes its
    own values shard; every rollout gets values (paired with it by token digest) and the run's invariants hold.
    replay.max_age=1: the value trainer's replay never holds a rollout more than 1 policy version behind the newest
    it has seen, and it did evict some for age (rollouts of versions 0..3 arrive over the 4 steps)."""
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "steps=4", "topology.inference_workers=2", "topology.evaluators=2",
                          "replay.max_age=1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in (run_dir / "jobs").iterdir()} >= {"inference0", "inference1", "evaluator", "evaluator1"}
    for shard, worker in (("e0", "w0"), ("e1", "w1")):
        ids = ds.dataset(str(run_dir / "log" / "values" / shard), format="arrow").to_table().column("rollout_id")
        assert ids.length() > 0 and all(i.startswith(worker + "-") for i in ids.to_pylist()), shard
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout
    paired = re.search(r"(\d+) values records, (\d+) targets records \((\d+) values/targets records paired",
                       check.stdout)
    assert paired and int(paired[3]) == int(paired[1]) + int(paired[2]) > 0, check.stdout
    replay = [m for m in read_metrics(run_dir / "metrics" / "value_trainer.jsonl") if "replay_age_max" in m]
    assert max(m["replay_age_max"] for m in replay) <= 1 and replay[-1]["replay_evicted_age"] > 0, \
        [(m["replay_age_max"], m["replay_evicted_age"], m["replay_newest_policy_version"]) for m in replay]
    # no bound on the critic's explained variance here: replay.max_age=1 keeps only the newest two policy versions'
    # rollouts in replay, which is not the easy configuration CRITIC_EV_BOUND is argued for. Measured 0.100-0.266
    # over 8 runs of 4 steps and 0.098-0.242 over 6 of 8 (2026-12-06, the committed version 0): a bound of 0.1 here
    # failed on some seeds, as a machine's kernels pick one. test_pipeline_with_critic[cpu] holds the bound
    assert_learned(run_dir, critic=True)
    assert not processes_mentioning(str(run_dir))
