"""The log benchmark still runs end to end (tiny sizes) and prints its ratio lines."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_bench_log_smoke():
    out = subprocess.run([sys.executable, "bench/bench_log.py", "--smoke"], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    for pattern in (r"ratio arrow +/ raw fsync'd disk .*: +\d+\.\d+ \[",
                    r"ratio arrow +/ jsonl .*: +\d+\.\d+ \[",
                    r"ratio arrow +/ parquet .*: +\d+\.\d+ \[",
                    r"latency publish->seen: p50 \d+\.\d+ ms +p99 \d+\.\d+ ms"):
        assert re.search(pattern, out.stdout), f"missing {pattern!r} in:\n{out.stdout}"


def test_critic_sweep_report_reads_run_directories(tmp_path):
    import json

    from omegaconf import OmegaConf

    from prime_values.config import Config

    def fake_run(name, estimator, seed, accuracies, ev, sums=None):
        run = tmp_path / "sweep" / name
        (run / "metrics").mkdir(parents=True)
        cfg = OmegaConf.structured(Config)
        cfg.advantage.estimator, cfg.seed, cfg.steps = estimator, seed, 100
        OmegaConf.save(cfg, run / "config.yaml")
        lines = [{"time": 10.0 + s, "step": s, "heldout_accuracy": a} for s, a in zip((0, 50, 100), accuracies)]
        (run / "metrics" / "policy_trainer.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        batches = [{"time": 0.0, "step": s, "critic_explained_variance": ev} for s in range(1, 101)]
        for b in batches[-10:] if sums else []:
            b["critic_ev_sums"] = sums
        (run / "metrics" / "orchestrator.jsonl").write_text("".join(json.dumps(x) + "\n" for x in batches))

    # pooled over the last 10 batches: y = [0, 1], pred = [0, 0.5] in each -> EV 0.75 (algo/ev.py), not the 0.95
    # of the per-batch figure
    fake_run("0", "gae", 0, (0.3, 0.45, 0.5), 0.95, sums=[2.0, 0.5, 0.25, 1.0, 1.0])
    fake_run("1", "grpo", 0, (0.3, 0.35, 0.45), float("nan"))
    sys.path.insert(0, str(ROOT / "bench"))
    import critic_sweep

    assert critic_sweep.main([str(tmp_path / "sweep"), "--gain", "0.1"]) == 0
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["summary"]
    assert summary["gae/privileged"]["steps_to_target"] == [50] and summary["grpo"]["steps_to_target"] == [100]
    assert summary["gae/privileged"]["final_explained_variance_mean"] == pytest.approx(0.75)
    assert summary["grpo"]["final_explained_variance_mean"] is None
    text = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "steps to target / grpo = 0.50 (goal <= 0.7): MET" in text
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 10_000


def test_critic_oracle_values_hand_worked():
    """V*(s_j) = pi(reference[j:] | prefix) while the response follows the reference, else 0 (critic_oracle.py)."""
    import math
    from types import SimpleNamespace

    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import critic_oracle

    a, b, eos = 3, 4, 1

    def policy(ids):  # prompt [7, 8]; pi(a | prompt) = 0.5, pi(eos | prompt + a) = 0.8
        logits = torch.full((1, ids.shape[1], 6), -1e9)
        logits[0, 1, a], logits[0, 1, b] = 0.0, 0.0  # two equal tokens: 0.5 each
        logits[0, 2, eos], logits[0, 2, b] = math.log(0.8), math.log(0.2)
        return SimpleNamespace(logits=logits)

    assert critic_oracle.oracle_values(policy, [7, 8], [a, eos], [a, eos], 1.0) == pytest.approx([0.4, 0.8])
    assert critic_oracle.oracle_values(policy, [7, 8], [a, eos], [b, eos], 1.0) == pytest.approx([0.4, 0.0])
    assert critic_oracle.oracle_values(policy, [7, 8], [a, eos], [a, b, eos], 1.0) == pytest.approx([0.4, 0.8, 0.0])


def tiny_run_dir(path: Path) -> Path:
    """A run directory with what the offline bench scripts read: config.yaml (arith, one-digit sums), policy v0,
    critic v0: the test session's version 0 (tests/e2e_helpers.py), which solves about half of its problems, so
    returns vary and there is something for a critic to explain."""
    import shutil

    from e2e_helpers import checkpoint, seed_version_zero

    seed_version_zero(path)
    shutil.copy(checkpoint() / "config.yaml", path / "config.yaml")
    return path


@pytest.mark.slow
def test_critic_curve_runs_on_a_run_directory(tmp_path):
    """bench/critic_curve.py end to end on a tiny run directory: a line per evaluation with the critic's and the
    oracle's explained variance; a misspelled override is one line naming the key, exit 2."""
    tiny_run_dir(tmp_path)
    command = [sys.executable, "bench/critic_curve.py", str(tmp_path), "--train-prompts", "8", "--eval-prompts", "8",
               "--steps", "2", "--every", "1", "critic.weight_average=0.5", "critic.batch_rollouts=16",
               "--critic", "fresh", "critic.num_layers=1"]
    out = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    steps = re.findall(r"step +(\d+) +EV (-?\d+\.\d+|nan) \(oracle (-?\d+\.\d+|nan)\)", out.stdout)
    assert [int(s[0]) for s in steps] == [0, 1, 2], out.stdout
    assert "64 training and 64 evaluation rollouts" in out.stdout and "batch 16" in out.stdout, out.stdout
    assert "critic fresh (1 blocks)" in out.stdout, out.stdout  # from policy v0, critic.num_layers=1 of its 4
    oracle = [float(s[2]) for s in steps]
    assert all(0 < ev <= 1 for ev in oracle), f"the oracle explains nothing: rewards did not vary {out.stdout}"
    bad = subprocess.run(command[:-1] + ["critic.lrr=1"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "critic.lrr" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


@pytest.mark.slow
def test_prompt_success_features_and_end_to_end(tmp_path):
    """bench/prompt_success.py: hand-worked features; a ridge fit recovers a linear target; the script runs on a
    tiny run directory and prints the oracle's position-0 explained variance and one line per predictor."""
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    import prompt_success

    f = prompt_success.features("12+39=", "51", 2, "operands answer carry")
    # bias; 12 -> units 2, tens 1; 39 -> 9, 3; answer 51 -> 1, 5, 0 (3 digits), length 2 of 0..4; carry 2 + 9 >= 10
    want = [1.0]
    for digit in (2, 1, 9, 3, 1, 5, 0):
        want += prompt_success.one_hot(digit, 10)
    assert f == want + prompt_success.one_hot(2, 5) + [1.0]
    x = torch.randn(300, 5, dtype=torch.float64)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 0.0, 3.0], dtype=torch.float64)
    assert prompt_success.r_squared(prompt_success.ridge(x[:200], y[:200], x[200:], alpha=1e-6), y[200:]) > 0.999
    tiny_run_dir(tmp_path)
    out = subprocess.run([sys.executable, "bench/prompt_success.py", str(tmp_path), "--problems", "30",
                          "--mlp-steps", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "policy v0, 30 problems" in out.stdout and "oracle explained variance at position 0" in out.stdout
    success = float(re.search(r"mean success (\d\.\d+)", out.stdout).group(1))
    assert 0.05 < success < 0.95, out.stdout  # version 0 solves some problems, not all
    assert len(re.findall(r"R\^2 +-?\d+\.\d+ +-> position-0 EV", out.stdout)) == 5, out.stdout
