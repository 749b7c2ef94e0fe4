"""The log benchmark still runs end to end (tiny sizes) and prints its ratio lines."""

import re
import subprocess
import sys
from pathlib import Path

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

    def fake_run(name, estimator, seed, accuracies, ev):
        run = tmp_path / "sweep" / name
        (run / "metrics").mkdir(parents=True)
        cfg = OmegaConf.structured(Config)
        cfg.advantage.estimator, cfg.seed, cfg.steps = estimator, seed, 100
        OmegaConf.save(cfg, run / "config.yaml")
        lines = [{"time": 10.0 + s, "step": s, "heldout_accuracy": a} for s, a in zip((0, 50, 100), accuracies)]
        (run / "metrics" / "policy_trainer.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        batches = [{"time": 0.0, "step": s, "critic_explained_variance": ev} for s in range(1, 101)]
        (run / "metrics" / "orchestrator.jsonl").write_text("".join(json.dumps(x) + "\n" for x in batches))

    fake_run("0", "gae", 0, (0.3, 0.45, 0.5), 0.95)
    fake_run("1", "grpo", 0, (0.3, 0.35, 0.45), float("nan"))
    sys.path.insert(0, str(ROOT / "bench"))
    import critic_sweep

    assert critic_sweep.main([str(tmp_path / "sweep"), "--gain", "0.1"]) == 0
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["summary"]
    assert summary["gae/privileged"]["steps_to_target"] == [50] and summary["grpo"]["steps_to_target"] == [100]
    text = (tmp_path / "sweep" / "sweep.md").read_text()
    assert "steps to target / grpo = 0.50 (goal <= 0.7): MET" in text
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 10_000
