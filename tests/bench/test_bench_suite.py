"""`python -m bench --smoke` runs every benchmark end to end (tiny sizes) and writes its table, so the suite
cannot rot (its lockstep run keeps the schedule); plus the small pieces it relies on (timers, lockstep
minibatches, the summary's time lines)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_suite_smoke(tmp_path):
    import os

    from tests.e2e_helpers import assert_learned, checkpoint

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    # version 0 of every pipeline run: the test session's (SFT'd on one-digit sums, the smoke task), so the runs
    # earn reward; an untrained version 0 would leave every reward, advantage and gradient at 0
    out = subprocess.run([sys.executable, "-m", "bench", "--smoke", "--keep-runs", "--out", str(tmp_path / "res"),
                          "--warm", str(checkpoint())], cwd=ROOT, capture_output=True, text=True, timeout=900,
                         env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads((tmp_path / "res" / "results.json").read_text())
    measures = [r["measure"] for r in result["rows"]]
    for expected in ("decoupling", "critic cost, dedicated", "critic cost, colocated", "async vs lockstep",
                     "scoring keeps up", "log: arrow vs raw", "log: arrow vs jsonl", "latency", "GAE"):
        assert any(expected in m for m in measures), f"no {expected!r} row in {measures}"
    for row in result["rows"]:
        assert set(row) >= {"measure", "ours", "baseline", "ratio", "spread", "goal", "met"}, row
    runs = result["pipeline"]["runs"]
    assert set(runs) == {"async", "slow_critic", "colocated", "grpo", "lockstep"}
    lockstep = runs["lockstep"][0]
    assert lockstep["steps"] == result["pipeline"]["steps"]
    # the lockstep run's batches: on-policy, and scored by the critic trained on the previous batch
    import pyarrow.dataset as ds

    batches = ds.dataset(str(Path(lockstep["run_dir"]) / "log" / "batches"), format="arrow").to_table().to_pylist()
    assert batches
    for row in batches:
        assert row["policy_version"] == row["step"] - 1, "lockstep batch n must come from policy version n - 1"
        assert row["critic_version"] == row["step"] - 1, "batch n is scored by critic version n - 1"
    assert_learned(Path(lockstep["run_dir"]), critic=True, lockstep=True)
    for name in ("async", "colocated", "grpo"):
        assert_learned(Path(runs[name][0]["run_dir"]), critic=name != "grpo")
    for case in runs.values():
        fr = case[0]["time_fractions"]["policy_trainer"]
        # well-formed and not double-counted; no lower bound on their sum: a smoke run's policy trainer lives ~2 s,
        # up to half of it loading its model before its first step (neither compute, wait nor io)
        assert 0 <= fr["wait"] <= 1 and fr["compute"] > 0 and fr["compute"] + fr["wait"] + fr["io"] <= 1.05, fr
    assert "evaluator" not in runs["colocated"][0]["time_fractions"]
    text = (tmp_path / "res" / "results.md").read_text()
    assert "| measure | ours | baseline | ratio [spread] | goal | met? |" in text
    assert re.search(r"policy_trainer +compute +\d+% +wait +\d+% +io +\d+%", out.stdout), out.stdout[-2000:]


def test_timers_and_summary_lines(tmp_path):
    import time

    from prime_values.monitor import MetricsWriter, Timers
    from prime_values.roles.value_trainer import lockstep_plan
    from prime_values.tools.summary import _time_lines, time_fractions

    timers = Timers()
    with timers.time("wait"):
        time.sleep(0.05)
    snap = timers.snapshot()
    assert snap["wait_s"] >= 0.04 and snap["role_wall_s"] >= snap["wait_s"] and snap["io_s"] == 0
    writer = MetricsWriter(tmp_path / "metrics" / "policy_trainer.jsonl", "policy_trainer")
    writer.log(step=1, compute_s=1.0, wait_s=3.0, io_s=0.0, role_wall_s=4.0)
    writer.close()
    fractions = time_fractions(tmp_path)
    assert fractions["policy_trainer"]["wait"] == 0.75
    assert "policy trainer waits 75%" in _time_lines(fractions)[0]
    plan = lockstep_plan(list(range(10)), 4, 5, seed=0)
    assert [len(b) for b in plan] == [4] * 5
    first, second = plan[0] + plan[1] + plan[2][:2], plan[2][2:] + plan[3] + plan[4]  # 20 draws: two passes
    assert sorted(first) == sorted(second) == list(range(10)), "one pass over the batch before repeating"
    assert first != sorted(first) and first != second, "each pass is shuffled afresh"
    assert lockstep_plan(list(range(10)), 4, 5, seed=0) == plan != lockstep_plan(list(range(10)), 4, 5, seed=1)


def test_gpu_mode_puts_every_role_on_the_device():
    """`python -m bench --device X` (GPU mode): the pipeline's overrides move all four device-holding roles to X
    (composed through the real config, with X = cpu here so validation passes on this machine)."""
    from bench import bench_pipeline
    from prime_values import config

    assert bench_pipeline.device_overrides(None) == []
    cfg = config.compose([*bench_pipeline.BASE, "topology.inference_device=cuda:3",
                          *bench_pipeline.device_overrides("cpu")])
    assert [cfg.topology[f"{r}_device"] for r in bench_pipeline.ROLE_DEVICES] == ["cpu"] * 4
    config.validate(cfg, cuda_count=0)
    from bench.run_all import device_name

    assert device_name(None) == device_name("cpu") == "CPU only"
