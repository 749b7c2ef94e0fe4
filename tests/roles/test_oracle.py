"""critic=oracle: no critic is trained; the evaluator values every policy state by games the policy plays on from it
(roles/evaluator.py OracleValues, task=guess's `continuations`)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from prime_values.__main__ import precheck
from prime_values.models.build import build_tiny_policy
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.roles.evaluator import OracleValues
from prime_values.tasks import GuessTask
from tests.e2e_helpers import REPO, env_for_runs, stream_table

# a small game, a small model, a few steps: what the oracle's wiring needs, not what it is for
GUESS_SMALL = ["+experiment=guess", "critic=oracle", "critic.oracle_samples=2", "steps=3", "eval_every=3",
               "task.min_number=4", "task.max_number=7", "task.max_turns=3", "task.heldout_size=8",
               "policy.warm_start.steps=20", "policy.warm_start.target_accuracy=0", "inference.prompts_per_step=4",
               "inference.group_size=2", "policy.arch.hidden_size=64", "policy.arch.num_heads=2",
               "policy.arch.num_kv_heads=1", "policy.arch.intermediate_size=128", "log.plots=false",
               "launcher.poll_s=0.2", "launcher.stop_grace_s=20"]


def test_oracle_values_are_means_of_games_at_policy_tokens_only():
    tok = build_char_tokenizer()
    task = GuessTask(min_number=4, max_number=7, max_turns=3)
    model = build_tiny_policy(tok, seed=0).eval()
    rollouts = task.rollout(model, tok, [task.make_problem(7, 3), task.make_problem(5, 5)], num_samples=2,
                            max_new_tokens=2, temperature=1.0, seed=0)
    rows = [{"token_ids": r.token_ids, "policy_mask": r.policy_mask, "privileged": task.make_problem(7, 3).privileged
             if r.prompt_index == 0 else "5"} for r in rollouts]
    cfg = OmegaConf.create({"critic": {"oracle_samples": 4}, "inference": {"max_new_tokens": 2, "temperature": 1.0}})
    values = OracleValues(cfg, task, tok, seed=0)(model, rows)
    for row, v in zip(rows, values):
        assert len(v) == len(row["token_ids"])
        for value, m in zip(v, row["policy_mask"]):
            if m:
                assert value * 4 == int(value * 4) and 0.0 <= value <= 1.0  # a mean of 4 games
            else:
                assert value == 0.0
    with pytest.raises(ValueError, match="not a game of task=guess"):
        task.problem_from("1-7?", "9")


@pytest.mark.parametrize("overrides, fix", [
    (["+experiment=arith", "critic=oracle"], "the oracle runs on task=guess"),
    (["+experiment=guess", "critic=oracle", "topology=colocated"], "needs topology.evaluator=dedicated"),
])
def test_the_oracle_refuses_what_it_cannot_value(overrides, fix):
    line = precheck(overrides)
    assert line is not None and "\n" not in line and "critic.oracle_samples" in line and fix in line, line


@pytest.mark.slow
def test_a_run_with_the_oracle_trains_no_critic_and_passes_check(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "prime_values", *GUESS_SMALL, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, env=env_for_runs(), capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "evaluator",
                                                              "orchestrator", "policy_trainer"}
    values = stream_table(run_dir, "values").to_pylist()
    rollouts = {r["rollout_id"]: r for r in stream_table(run_dir, "rollouts").to_pylist()}
    assert values and {v["critic_version"] for v in values} == {0}
    for v in values:
        mask = rollouts[v["rollout_id"]]["policy_mask"]
        assert all(x == 0 for x, m in zip(v["values"], mask) if not m)
        assert all(0 <= x <= 1 and x * 2 == int(x * 2) for x, m in zip(v["values"], mask) if m)
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == "3"
