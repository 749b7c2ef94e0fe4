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

REPO = Path(__file__).resolve().parents[1]
SMALL = ["+experiment=arith", "steps=8", "eval_every=4", "policy.warm_start.steps=10", "task.heldout_size=16",
         "inference.prompts_per_step=4", "inference.group_size=4", "replay.min_rollouts=16",
         "critic.batch_rollouts=16", "critic.publish_every=1", "launcher.poll_s=0.2", "launcher.stop_grace_s=20",
         # a smaller model and a short critic pretraining: the test checks the plumbing, not the learning
         "policy.arch.hidden_size=64", "policy.arch.num_heads=2", "policy.arch.num_kv_heads=1",
         "policy.arch.intermediate_size=128", "critic.warm_start.steps=5", "critic.warm_start.rollouts=64"]


def run_pipeline(run_dir: Path, *extra: str, env: dict | None = None, cwd: Path = REPO):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", **(env or {})}
    return subprocess.run([sys.executable, "-m", "prime_values", *SMALL, *extra, f"hydra.run.dir={run_dir}"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=400)


def processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and int(proc.name) != os.getpid():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                found.append(f"{proc.name}: {cmdline}")
    return found


def stream_table(run_dir: Path, stream: str):
    return ds.dataset(str(run_dir / "log" / stream), format="arrow").to_table()


def assert_roles_did_their_part(run_dir: Path, steps: int, critic: bool) -> None:
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
    for name in ("learning", "critic", "advantages", "replay", "throughput"):
        assert (run_dir / "report" / f"{name}.png").stat().st_size > 10_000, f"plot {name}.png missing or empty"
    assert "learning.png" in (run_dir / "report" / "summary.md").read_text()
    from prime_values.status import status

    shown = status(run_dir)
    assert "ended, finished" in shown and f"policy step {steps}/{steps}" in shown
    assert re.search(r"policy_trainer +job \d+ +COMPLETED", shown), shown
    assert not processes_mentioning(str(run_dir)), "a role process outlived the run"


@pytest.mark.parametrize("topology", ["cpu", "colocated"])
def test_pipeline_with_critic(tmp_path, topology):
    run_dir = tmp_path / "run"
    warmup = topology == "cpu"  # one run also holds the policy for a critic warm-up, the other takes the options
    options = ["critic.warmup.min_version=3"] if warmup else \
        ["advantage=tether", "policy.trust_region=prob_diff", "critic.loss=bce", "advantage.lambda_value=0.9",
         "task.train_pool=6"]
    result = run_pipeline(run_dir, f"topology={topology}", *options)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "== prime_values run finished ==" in result.stdout and str(run_dir) in result.stdout
    assert_roles_did_their_part(run_dir, 8, critic=True)
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
        assert all(0 <= m["tether_weight_mean"] <= 1 for m in batches)
        assert all("masked_fraction" in m for m in read_metrics(run_dir / "metrics" / "policy_trainer.jsonl")
                   if "loss" in m)
        values = stream_table(run_dir, "values").column("values").combine_chunks().values.to_numpy()
        assert ((values >= 0) & (values <= 1)).all(), "bce critic values must be probabilities"


def test_pipeline_grpo_starts_no_critic(tmp_path):
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "advantage=grpo", "steps=4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert_roles_did_their_part(run_dir, 4, critic=False)
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"}


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
    assert "detached; conductor job" in result.stdout and f"prime_values.status {run_dir}" in result.stdout
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    deadline = time.time() + 300
    while time.time() < deadline:
        latest = run_dir / "weights" / "policy" / "LATEST"
        if latest.exists() and int(latest.read_text()) >= 3:
            break
        time.sleep(1)
    else:
        raise AssertionError("the detached run made no progress: " + subprocess.run(
            [sys.executable, "-m", "prime_values.status", str(run_dir)], capture_output=True, text=True,
            env=env).stdout)
    shown = subprocess.run([sys.executable, "-m", "prime_values.status", str(run_dir), "--stop"], cwd=REPO, env=env,
                           capture_output=True, text=True)
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


def test_two_inference_workers_and_two_evaluators(tmp_path):
    """topology.evaluators=2: evaluator k scores the rollouts of inference worker k (w % 2 == k), each writes its
    own values shard; every rollout gets values and the run's invariants hold."""
    run_dir = tmp_path / "run"
    result = run_pipeline(run_dir, "steps=4", "topology.inference_workers=2", "topology.evaluators=2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in (run_dir / "jobs").iterdir()} >= {"inference0", "inference1", "evaluator", "evaluator1"}
    for shard, worker in (("e0", "w0"), ("e1", "w1")):
        ids = ds.dataset(str(run_dir / "log" / "values" / shard), format="arrow").to_table().column("rollout_id")
        assert ids.length() > 0 and all(i.startswith(worker + "-") for i in ids.to_pylist()), shard
    check = subprocess.run([sys.executable, "-m", "prime_values.check", str(run_dir)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout
    assert not processes_mentioning(str(run_dir))
