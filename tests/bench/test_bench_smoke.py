"""The log benchmark still runs end to end (tiny sizes) and prints its ratio lines."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_bench_log_smoke():
    out = subprocess.run([sys.executable, "-m", "bench.bench_log", "--smoke"], cwd=ROOT, capture_output=True,
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
    from bench import critic_sweep

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

    from bench import critic_oracle

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

    from tests.e2e_helpers import checkpoint, seed_version_zero

    seed_version_zero(path)
    shutil.copy(checkpoint() / "config.yaml", path / "config.yaml")
    return path


@pytest.mark.slow
def test_critic_curve_runs_on_a_run_directory(tmp_path):
    """bench/critic_curve.py end to end on a tiny run directory: a line per evaluation with the critic's and the
    oracle's explained variance; a misspelled override is one line naming the key, exit 2."""
    tiny_run_dir(tmp_path)
    command = [sys.executable, "-m", "bench.critic_curve", str(tmp_path), "--train-prompts", "8", "--eval-prompts", "8",
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
def test_critic_oracle_writes_a_record(tmp_path):
    """bench/critic_oracle.py --record on a tiny run directory: the stamped record holds the printed EVs and one
    entry per position, the critic's settings and the command."""
    import json

    run = tiny_run_dir(tmp_path / "run")
    record = tmp_path / "certify" / "v0.json"
    out = subprocess.run([sys.executable, "-m", "bench.critic_oracle", str(run), "--prompts", "16", "--group", "4",
                          "--record", str(record)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(record.read_text())
    printed = re.search(r"oracle (-?\d+\.\d+)  critic (-?\d+\.\d+)", out.stdout)
    assert printed and (f"{rec['oracle_ev']:.3f}", f"{rec['critic_ev']:.3f}") == printed.groups(), out.stdout
    assert 0 < rec["oracle_ev"] <= 1, "the exact oracle explains nothing: the rewards did not vary"
    assert rec["positions"] and rec["positions"][0]["position"] == 0 and rec["states"] > 0
    assert rec["critic"]["loss"] and rec["commit"] and "--record" in rec["command_line"]


def test_critic_oracle_without_games_on_guess_reports_the_critic_alone(tmp_path):
    """--samples 0 on a guess run: no game is played on, the printed line names the critic's EV only, and the
    record holds null (not NaN, which JSON does not have) for every oracle figure, and the precision it decoded in."""
    import json

    from omegaconf import OmegaConf

    from bench.common import compose

    run = tiny_run_dir(tmp_path / "run")  # the test session's weights, playing guess under guess's config
    cfg = compose(["+experiment=guess", "task.min_number=4", "task.max_number=9", "task.max_turns=3"])
    OmegaConf.save(cfg, run / "config.yaml")
    record = tmp_path / "certify" / "guess.json"
    out = subprocess.run([sys.executable, "-m", "bench.critic_oracle", str(run), "--prompts", "16", "--samples", "0",
                          "--record", str(record)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "(no oracle: --samples 0)" in out.stdout and "against the oracle" not in out.stdout, out.stdout
    text = record.read_text()
    rec = json.loads(text)
    assert "NaN" not in text and rec["oracle_ev"] is None and rec["critic_against_oracle"] is None
    assert rec["samples_per_state"] == 0 and rec["precision"] == "float32" and rec["states"] > 0
    assert all(p["oracle_ev"] is None for p in rec["positions"])


@pytest.mark.slow
def test_prompt_success_features_and_end_to_end(tmp_path):
    """bench/prompt_success.py: hand-worked features; a ridge fit recovers a linear target; the script runs on a
    tiny run directory and prints the oracle's position-0 explained variance and one line per predictor."""
    import torch

    from bench import prompt_success

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
    out = subprocess.run([sys.executable, "-m", "bench.prompt_success", str(tmp_path), "--problems", "30",
                          "--mlp-steps", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "policy v0, 30 problems" in out.stdout and "oracle explained variance at position 0" in out.stdout
    success = float(re.search(r"mean success (\d\.\d+)", out.stdout).group(1))
    assert 0.05 < success < 0.95, out.stdout  # version 0 solves some problems, not all
    assert len(re.findall(r"R\^2 +-?\d+\.\d+ +-> position-0 EV", out.stdout)) == 5, out.stdout


def _budget_run(root, cell, seed, kind, g, accuracies, versions, equal=None, status="finished"):
    """A finished-looking run directory of bench/equal_budget.py: config, metrics, summary and a rollout log whose
    rollout r has policy version versions[r] and r + 1 policy tokens after a 2-token prompt."""
    import json

    from omegaconf import OmegaConf

    from prime_values.config import Config
    from prime_values.log import SegmentWriter

    run = root / "ckpt0" / cell / f"seed{seed}"
    (run / "metrics").mkdir(parents=True)
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = "grpo" if kind == "grpo" else "gae"
    cfg.critic.privileged, cfg.seed, cfg.steps = kind != "plain", seed, 20
    cfg.inference.group_size, cfg.inference.prompts_per_step = g, 8 // g
    OmegaConf.save(cfg, run / "config.yaml")
    policy = [{"time": 100.0 + s, "step": s, "heldout_accuracy": a} for s, a in zip((0, 10, 20), accuracies)]
    policy += [{"time": 100.0 + s, "step": s, "loss": 0.1, "cpu_s": 7.0} for s in (10, 20)]
    (run / "metrics" / "policy_trainer.jsonl").write_text("".join(json.dumps(x) + "\n" for x in policy))
    batches = [{"time": 101.0, "step": s, "dropped_stale": 1, "dropped_warmup": 2,
                **({} if equal is None else {"groups_equal_reward": equal})} for s in range(1, 21)]
    (run / "metrics" / "orchestrator.jsonl").write_text("".join(json.dumps(x) + "\n" for x in batches))
    if kind != "grpo":
        (run / "metrics" / "value_trainer.jsonl").write_text(json.dumps({"time": 90.0, "critic_step": 5,
                                                                         "cpu_s": 30.0}) + "\n")
    (run / "report").mkdir()
    (run / "report" / "summary.json").write_text(json.dumps({"status": status, "policy_steps": 20,
                                                             "critic_steps": 5, "final_explained_variance": 0.4}))
    rows = [{"rollout_id": f"r{r}", "prompt_id": "p", "group_id": "g", "shard": "w0", "policy_version": v,
             "token_ids": [5, 6, *[7] * (r + 1)], "policy_mask": [0, 0, *[1] * (r + 1)],
             "sampling_logprobs": [0.0] * (r + 3), "reward": 0.0, "stop_reason": "eos", "privileged": "1",
             "task": "{}", "created_at": 0.0} for r, v in enumerate(versions)]
    with SegmentWriter(run / "log" / "rollouts", "w0", "rollouts") as writer:
        writer.append(rows[:2])
        writer.append(rows[2:])
    return run


def test_equal_budget_counts_tokens_from_the_log_and_compares_at_grpo_g8s_final_accuracy(tmp_path):
    import json

    from bench import equal_budget

    root, records = tmp_path / "grid", tmp_path / "records"
    key = {"experiment": "arith", "rollouts": 8, "steps": 20, "eval_every": 10, "heldout": 500, "overrides": [],
           "smoke": False}
    base = root / "ckpt0" / "base"
    (base / "metrics").mkdir(parents=True)
    (base / "metrics" / "warm_start.jsonl").write_text(json.dumps(
        {"time": 1.0, "critic_pretrain_rollouts": 4, "critic_pretrain_generated_tokens": 100}) + "\n")
    for model in ("policy", "critic"):
        (base / "weights" / model / "0").mkdir(parents=True)
        (base / "weights" / model / "0" / "model.safetensors").write_bytes(model.encode())
    (base / "report").mkdir()
    (base / "report" / "summary.json").write_text("{}")
    # grpo_g8: rollouts of versions 0, 0, 9, 19, 20 with 1..5 policy tokens; the evaluation at step 10 stands on
    # versions < 10 (1 + 2 + 3 = 6 tokens), step 20 on 6 + 4 = 10; version 20 (5 tokens, in flight at the end)
    # is in the log total (15) but behind no evaluation. Final accuracy 0.5 is the target.
    grpo = _budget_run(root, "grpo_g8", 0, "grpo", 8, (0.3, 0.4, 0.5), (0, 0, 9, 19, 20), equal=0.25)
    # gae_g1 reaches 0.5 at step 10: its tokens there = the base's critic warm start (100) + 1 + 2 + 3
    _budget_run(root, "gae_g1", 0, "gae", 1, (0.3, 0.55, 0.6), (0, 0, 9, 19, 20))
    _budget_run(root, "gae_g1", 1, "gae", 1, (0.3, 0.45, 0.4), (0, 0, 9, 19, 20), status="stopped")  # left out
    summary = equal_budget.report(root, "python -m bench.equal_budget --out grid", records, key)
    assert summary["grpo_g8"]["tokens_to_target"] == [10] and summary["gae_g1"]["tokens_to_target"] == [106]
    run = json.loads((root / "equal_budget.json").read_text())["runs"][0]
    assert run["log_tokens"] == 15 and run["log_rollouts"] == 5 and run["dropped_stale"] == 1
    assert summary["grpo_g8"]["groups_equal_reward_mean"] == 0.25 and summary["grpo_g8"]["critic_cpu_s_mean"] == 0
    assert summary["gae_g1"]["critic_cpu_s_mean"] == 30 and summary["gae_g1"]["runs"] == 1
    assert summary["gae_g1"]["tokens_ratio"] == pytest.approx(10.6)
    text = (root / "equal_budget.md").read_text()
    assert "| gae_g1 | 8 x 1 | 1 | 1 | 106 +- - | 10.60 | 1, 106 +- - | 10.60 |" in text and "NOT MET" in text
    # smoothed over 3 evaluations: grpo_g8's target is (0.3 + 0.4 + 0.5) / 3 = 0.4, which its trailing means
    # (0.3, 0.35, 0.4) reach at step 20 (10 tokens); gae_g1's (0.3, 0.425, 0.483) at step 10 (106)
    assert run["target_smooth"] == pytest.approx(0.4) and summary["grpo_g8"]["tokens_to_target_smooth"] == [10]
    assert summary["gae_g1"]["tokens_to_target_smooth"] == [106]
    assert text.count("NOT MET") == 2
    # the control without a critic: the best grpo cell at any G (here only grpo_g8), one seed each
    assert ("against the best grpo cell run (any G): gae_g1 106 vs grpo_g8 10 tokens (ratio 10.60, difference +96 "
            "+- 0 at two standard errors, one seed in a cell); final accuracy 0.600 vs 0.500") in text
    assert (root / "equal_budget.png").stat().st_size > 10_000
    # the records outlive the run directories (another machine): the same table from them alone
    sha = equal_budget.checkpoint_sha(base)
    assert sorted(p.relative_to(records).as_posix() for p in records.rglob("*.json")) == \
        [f"ckpt0-{sha}/gae_g1/seed0.json", f"ckpt0-{sha}/grpo_g8/seed0.json"]
    assert equal_budget.has_record(records, key, 0, sha, "gae_g1", 0)
    # a new record carries the protocol's stamps: commit, date, CPU model and flags, checkpoint sha
    rec = json.loads((records / f"ckpt0-{sha}" / "gae_g1" / "seed0.json").read_text())
    assert all(rec.get(k) for k in ("commit", "date", "cpu", "checkpoint_sha")) and "cpu_flags" in rec
    assert not equal_budget.has_record(records, {**key, "steps": 30}, 0, sha, "gae_g1", 0)
    assert equal_budget.recorded_sha(records, key, 0, [("grpo_g8", 0), ("gae_g1", 0)]) == sha
    assert equal_budget.recorded_sha(records, key, 0, [("gae_g1", 1)]) is None  # the stopped run has none
    shutil.rmtree(root)
    (root / "ckpt0").mkdir(parents=True)
    again = equal_budget.report(root, "python -m bench.equal_budget --out grid", records, key)
    assert again == summary
    # a record of other grid parameters is left out, and said; a rebuilt checkpoint with other weights is another
    # checkpoint (its own target), never pooled with the first
    other = json.loads((records / f"ckpt0-{sha}" / "grpo_g8" / "seed0.json").read_text())
    (records / "ckpt0-ffffffffffff" / "grpo_g8").mkdir(parents=True)
    (records / "ckpt0-ffffffffffff" / "grpo_g8" / "seed0.json").write_text(json.dumps(
        {**other, "ckpt": "0-ffffffffffff", "final_accuracy": 0.9}))
    (records / "ckpt0-ffffffffffff" / "grpo_g8" / "seed1.json").write_text(json.dumps({**other, "grid": {}}))
    mixed = equal_budget.report(root, "python -m bench.equal_budget --out grid", records, key)
    assert mixed["grpo_g8"]["runs"] == 2 and mixed["grpo_g8"]["tokens_to_target"] == [10, 10]
    # the pooled table holds the cells run on every checkpoint; gae_g1 (checkpoint 0 only) is in checkpoint 0's
    # section, against its own checkpoint's target, 0.5
    assert "gae_g1" not in mixed
    text = (root / "equal_budget.md").read_text()
    section = text.split(f"## Checkpoint 0-{sha}")[1].split("## Checkpoint 0-ffffffffffff")[0]
    assert "| gae_g1 | 8 x 1 | 1 | 1 | 106 +- - | 10.60 |" in section
    assert "1 records of other grid parameters left out" in text
    assert (root / f"equal_budget_ckpt0-{sha}.png").stat().st_size > 10_000
    # the reference is grpo at G = 8 at its best learning rate: the variant with the higher mean final accuracy
    runs = [{"kind": k, "group_size": g, "cell": c, "final_accuracy": a}
            for k, g, c, a in (("grpo", 8, "grpo_g8", 0.7), ("grpo", 8, "grpo_g8", 0.72),
                               ("grpo", 8, "grpo_g8_policy.lr2e-4", 0.8), ("grpo", 4, "grpo_g4", 0.9),
                               ("gae", 8, "gae_g8", 1.0))]
    assert equal_budget.reference_cell(runs) == "grpo_g8_policy.lr2e-4"
    assert equal_budget.reference_cell(runs[:2]) == "grpo_g8" and equal_budget.reference_cell([]) == "grpo_g8"
    mean = [{"cell": "mean_g1", "kind": "mean", "group_size": 1, "final_accuracy": 0.5}]
    assert equal_budget.reference_cell(mean) == "mean_g1"  # no grpo at G = 8: the batch mean at G = 1
    assert equal_budget.reference_cell(runs + mean) == "grpo_g8_policy.lr2e-4"
    # resumable: finished after --steps is kept, anything else (stopped, fewer steps) is redone
    grpo = _budget_run(root, "grpo_g8", 0, "grpo", 8, (0.3, 0.4, 0.5), (0, 0, 9, 19, 20), equal=0.25)
    stopped = _budget_run(root, "gae_g1", 1, "gae", 1, (0.3, 0.45, 0.4), (0, 0, 9, 19, 20), status="stopped")
    assert equal_budget.finished(grpo, 20) and not equal_budget.finished(grpo, 30)
    assert not equal_budget.finished(stopped, 20)
    with pytest.raises(SystemExit, match="does not divide"):
        equal_budget.parse_cells("gae:3", 128)
    assert equal_budget.parse_cells("grpo:8,gae:4@policy.lr=5e-5@critic.lr=1e-3", 128) == [
        ("grpo_g8", "grpo", 8, []),
        ("gae_g4_policy.lr5e-5_critic.lr1e-3", "gae", 4, ["policy.lr=5e-5", "critic.lr=1e-3"])]
    assert equal_budget.cell_overrides("gae", 4, 128, ["policy.lr=5e-5"])[-3:] == [
        "inference.group_size=4", "inference.prompts_per_step=32", "policy.lr=5e-5"]
    with pytest.raises(SystemExit, match="key=value"):
        equal_budget.parse_cells("gae:4@lr", 128)
    # an A/A cell: the same configuration at other RL seeds (a critic-free run at one seed repeats exactly)
    assert equal_budget.parse_cells("mean:1@seed_offset=1000", 128) == [
        ("mean_g1_seed_offset1000", "mean", 1, ["seed_offset=1000"])]
    assert equal_budget.seed_offset(["seed_offset=1000", "policy.lr=1e-4"]) == 1000
    assert equal_budget.seed_offset(["policy.lr=1e-4"]) == 0
    assert "seed_offset=1000" not in equal_budget.cell_overrides("mean", 1, 128, ["seed_offset=1000"])
    with pytest.raises(SystemExit, match="whole number"):
        equal_budget.parse_cells("mean:1@seed_offset=x", 128)
    # the ceiling: gae on the oracle's values, its own critic (a run copies only the base's policy)
    assert equal_budget.cell_overrides("oracle", 1, 128, ["critic.oracle_samples=4"]) == [
        "advantage=gae", "critic=oracle", "inference.group_size=1", "inference.prompts_per_step=128",
        "critic.oracle_samples=4"]
    assert "oracle" in equal_budget.OWN_CRITIC and "oracle" not in equal_budget.CRITIC_FREE
    # a pinned setting of the experiment's records gives way to the cell's own value of it
    assert equal_budget.run_pins("guess", []) == ["advantage.lambda_policy=1.0"]
    assert equal_budget.run_pins("guess", ["advantage.lambda_policy=0.9"]) == []
    assert equal_budget.run_pins("arith", ["critic.warm_start.steps=50"]) == ["replay.ratio=0",
                                                                              "critic.warm_start.rollouts=2048"]


def test_a_base_over_the_size_bound_is_not_kept_beside_the_records(tmp_path, monkeypatch, capsys):
    """A checkpoint's base is copied beside its records only up to KEEP_MAX_MB (a real model's version 0, 682 MB
    would be committed otherwise); over it, it stays in the grid directory, the run says so, and the report's
    stamps line says "not kept"."""
    from bench import equal_budget

    base = tmp_path / "grid" / "ckpt0" / "base"
    for rel in equal_budget.KEPT:
        target = base / rel
        if rel.startswith("weights/"):
            (target / "model.safetensors").parent.mkdir(parents=True, exist_ok=True)
            (target / "model.safetensors").write_bytes(b"x" * 300_000)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text("{}")
    records = tmp_path / "records"
    monkeypatch.setattr(equal_budget, "KEEP_MAX_MB", 0.5)  # 600 kB of weights: over
    equal_budget.keep_base(base, records, 0, "abc")
    assert not (records / "ckpt0-abc").exists() and "not kept beside the records" in capsys.readouterr().out
    monkeypatch.setattr(equal_budget, "KEEP_MAX_MB", 1)  # under: kept, whole
    equal_budget.keep_base(base, records, 0, "abc")
    assert equal_budget.base_done(records / "ckpt0-abc" / "base")
    assert (records / "ckpt0-abc" / "base" / "weights" / "critic" / "0" / "model.safetensors").stat().st_size == 300_000


def test_a_privileged_cell_that_makes_its_own_critic_pays_its_own_warm_start(tmp_path):
    """A gae cell whose overrides change the critic's warm start copies only the base's policy, and its runs are
    charged their own pretraining (tokens and CPU seconds), not the base's; a gae cell without them pays the base's."""
    import json

    from bench import equal_budget

    root = tmp_path / "grid"
    base = root / "ckpt0" / "base"
    (base / "metrics").mkdir(parents=True)
    (base / "metrics" / "warm_start.jsonl").write_text(json.dumps(
        {"time": 1.0, "critic_pretrain_rollouts": 4, "critic_pretrain_generated_tokens": 100,
         "critic_pretrain_cpu_s": 5.0, "critic_pretrain_s": 3.0}) + "\n")
    extra = ["critic.warm_start.rollouts=64", "critic.warm_start.steps=40"]
    assert equal_budget.owns_critic("gae", extra) and equal_budget.owns_critic("tether", ["critic.arch.layers=4"])
    assert not equal_budget.owns_critic("gae", ["critic.lr=1e-3", "advantage.lambda_policy=0.9"])
    assert equal_budget.owns_critic("plain", []) and not equal_budget.owns_critic("gae", [])
    shared = _budget_run(root, "gae_g1", 0, "gae", 1, (0.3, 0.55, 0.6), (0, 0, 9, 19, 20))
    own = _budget_run(root, "gae_g1_critic.warm_start.rollouts64", 0, "gae", 1, (0.3, 0.55, 0.6), (0, 0, 9, 19, 20))
    (own / "metrics" / "warm_start.jsonl").write_text(json.dumps(
        {"time": 50.0, "critic_pretrain_rollouts": 64, "critic_pretrain_generated_tokens": 1000}) + "\n" + json.dumps(
        {"time": 60.0, "critic_pretrain_s": 30.0, "critic_pretrain_cpu_s": 20.0}) + "\n")
    a, b = equal_budget.read_run(shared, base, 0), equal_budget.read_run(own, base, 0)
    # tokens behind the evaluation at step 10: the warm start's, then 1 + 2 + 3 of the log
    assert a["curve"][1] == (10, 0.55, 106) and b["curve"][1] == (10, 0.55, 1006)
    # CPU seconds: the policy trainer's 7 and the value trainer's 30 by step 10, plus the warm start's
    assert a["eval_costs"][1][2] == pytest.approx(7.0 + 30.0 + 5.0)
    assert b["eval_costs"][1][2] == pytest.approx(7.0 + 30.0 + 20.0)
    # wall: the base's pretraining added for the shared critic; the run's own from its start, 30 s before the line
    # that reports 30 s (its first line, at 50, came after the warm start's sampling)
    assert a["eval_costs"][1][1] == pytest.approx(110.0 - 90.0 + 3.0) and b["eval_costs"][1][1] == pytest.approx(80.0)


@pytest.mark.slow
def test_equal_budget_grid_runs_g1_and_g2_and_a_rerun_skips_finished_runs(tmp_path):
    """Two tiny cells (gae at G = 1, grpo at G = 2; 2 steps each) from an untrained version 0, then the same
    command again: nothing is rerun."""
    import json

    command = [sys.executable, "-m", "bench.equal_budget", "--out", str(tmp_path / "grid"), "--smoke", "--lock", "",
               "--cells", "gae:1,grpo:2", "--rollouts", "4", "--steps", "2", "--eval-every", "1", "--heldout", "16"]
    first = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert first.stdout.count("-> rc 0") == 2
    summary = json.loads((tmp_path / "grid" / "equal_budget.json").read_text())["summary"]
    assert set(summary) == {"gae_g1", "grpo_g2"} and summary["gae_g1"]["critic_steps_mean"] > 0
    assert summary["gae_g1"]["tokens_final_mean"] > 0 and summary["grpo_g2"]["groups_equal_reward_mean"] is not None
    again = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "-> rc" not in again.stdout, again.stdout[-3000:]
    # the run directories gone (another machine), the records kept: nothing is rerun or rebuilt, the same table
    shutil.rmtree(tmp_path / "grid" / "ckpt0")
    third = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0 and "-> rc" not in third.stdout and "not rebuilt" in third.stdout, third.stdout
    assert json.loads((tmp_path / "grid" / "equal_budget.json").read_text())["summary"] == summary


def test_bench_heldout_compares_the_two_decodes_on_a_checkpoint(tmp_path):
    """bench/bench_heldout.py on the tests' warm-started checkpoint and arith's held-out problems: both decodes run,
    the old one computes more token positions than the new (its short replies leave the batch), the replies agree,
    and the JSON holds both."""
    from tests.e2e_helpers import checkpoint

    out = subprocess.run([sys.executable, "-m", "bench.bench_heldout", "--experiment", "arith", "--model",
                          str(checkpoint() / "weights" / "policy" / "0"), "--heldout", "32", "--threads", "1",
                          "--json", str(tmp_path / "r.json")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads((tmp_path / "r.json").read_text())
    old, new = result["runs"]["old"][0], result["runs"]["new"][0]
    assert old["positions_computed"] > new["positions_computed"] > 0, result
    assert old["reply_tokens"] == new["reply_tokens"] and result["replies_differ"] == 0, result
    assert "old / new: wall" in out.stdout, out.stdout


def test_equal_budget_keeps_a_built_base_beside_the_records_and_copies_it_in_instead_of_rebuilding(tmp_path):
    """A base is kept once (weights at version 0, warm-start metrics, config, summary) under its sha's records, and a
    grid directory without a base gets that copy: the same sha, so its runs continue the same checkpoint."""
    import json

    from bench import equal_budget

    base, records = tmp_path / "grid" / "ckpt0" / "base", tmp_path / "records"
    for model in ("policy", "critic"):
        (base / "weights" / model / "0").mkdir(parents=True)
        (base / "weights" / model / "0" / "model.safetensors").write_bytes(model.encode())
        (base / "weights" / model / "1").mkdir(parents=True)  # a later version: not kept
    (base / "metrics").mkdir()
    (base / "metrics" / "warm_start.jsonl").write_text(json.dumps({"critic_pretrain_generated_tokens": 7}) + "\n")
    (base / "metrics" / "policy_trainer.jsonl").write_text("{}\n")  # not needed by the runs: not kept
    (base / "report").mkdir()
    (base / "report" / "summary.json").write_text("{}")
    (base / "config.yaml").write_text("seed: 0\n")
    sha = equal_budget.checkpoint_sha(base)
    assert equal_budget.kept_base(records, 0) is None
    equal_budget.keep_base(base, records, 0, sha)
    kept = records / f"ckpt0-{sha}" / "base"
    assert equal_budget.kept_base(records, 0) == kept and equal_budget.checkpoint_sha(kept) == sha
    assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == [
        "config.yaml", "metrics/warm_start.jsonl", "report/summary.json", "weights/critic/0/model.safetensors",
        "weights/critic/LATEST", "weights/policy/0/model.safetensors", "weights/policy/LATEST"]
    assert equal_budget.warm_tokens(kept)["critic_pretrain_generated_tokens"] == 7
    assert equal_budget.kept_base(records, 1) is None  # another checkpoint seed
