"""The orchestrator's wiring, each piece on hand-worked numbers: what the targets rows hand the value trainer
(value targets, not advantages; each rollout's own privileged block; the values row's token digest), grpo's std
flag, whitening over policy tokens only, and a restarted orchestrator that keeps the groups it was holding."""

from __future__ import annotations

import math
import threading
import time

import pytest
from omegaconf import OmegaConf

from prime_values.config import Config
from prime_values.config.advantage import make_estimator
from prime_values.log import LogReader, SegmentWriter
from prime_values.log.records import token_digest
from prime_values.roles import orchestrator
from prime_values.roles.orchestrator import batch_rows, score_group, target_rows
from prime_values.rundir import RunDir
from tests.log_rows import rollout, values_row


def test_targets_rows_carry_value_targets_not_advantages_and_each_rollouts_privileged_block():
    # gamma 1, lambda_policy 0.5, lambda_value 1: on a's policy tokens (V = .5, .5, .5, R = 1) the targets are the
    # return R = 1 at each, the advantages 0.5 * 0.5^2, 0.5 * 0.5, 0.5 (only the last delta is nonzero), so
    # handing the critic advantages, or the values themselves, is visible at every token
    cfg = OmegaConf.structured(Config)
    cfg.advantage.lambda_policy, cfg.advantage.lambda_value = 0.5, 1.0
    rollouts = [{**rollout("a", "g", 1.0), "privileged": "answer 12"}, {**rollout("b", "g", 0.0), "privileged": "7"}]
    values = [{**values_row(r["rollout_id"], [0, 0, .5, .5, .5]), "token_digest": token_digest(r["token_ids"])}
              for r in rollouts]
    scored = score_group(rollouts, values, make_estimator(cfg.advantage))
    assert scored.advantages[0, 2:].tolist() == pytest.approx([0.125, 0.25, 0.5])
    rows = target_rows(scored)
    assert [r["rollout_id"] for r in rows] == ["a", "b"]
    assert rows[0]["value_targets"] == pytest.approx([0, 0, 1, 1, 1])
    assert rows[1]["value_targets"] == pytest.approx([0, 0, 0, 0, 0])
    assert [r["privileged"] for r in rows] == ["answer 12", "7"]  # what the critic is trained to see
    assert [r["values"] for r in rows] == [v["values"] for v in values]
    assert [r["token_digest"] for r in rows] == [token_digest(r["token_ids"]) for r in rollouts]


@pytest.mark.parametrize("grpo_std,expected", [(False, [0.75, -0.25]), (True, [1.5, -0.5])])
def test_grpo_std_flag_reaches_the_advantages(grpo_std, expected):
    # rewards 1, 0, 0, 0: mean 0.25, so R - mean = 0.75, -0.25 x 3; the sample std is
    # sqrt((0.75^2 + 3 x 0.25^2) / 3) = 0.5, so advantage.grpo_std=true doubles them
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.grpo_std = "grpo", grpo_std
    group = [rollout(f"r{i}", "g", float(i == 0)) for i in range(4)]
    advantages = score_group(group, None, make_estimator(cfg.advantage)).advantages
    assert advantages[0, 2:].tolist() == pytest.approx([expected[0]] * 3, rel=1e-5)
    assert advantages[1:, 2:].flatten().tolist() == pytest.approx([expected[1]] * 9, rel=1e-5)
    assert (advantages[:, :2] == 0).all()  # the prompt gets no advantage


def test_whitening_is_over_policy_tokens_only():
    # grpo (no std) on rewards 1, 0: a's 3 policy tokens get +0.5, b's 2 get -0.5 (b's response is shorter). Over
    # those 5 tokens: mean 0.1, variance 0.25 - 0.01 = 0.24, so a -> 0.4 / sqrt(0.24) = 2/sqrt(6), b -> -3/sqrt(6).
    # Counting the 4 prompt tokens (or the padding) as zeros would give other numbers; prompt tokens stay 0.
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = "grpo"
    group = [rollout("a", "g", 1.0), rollout("b", "g", 0.0, response=(7, 2))]
    groups = [score_group(group, None, make_estimator(cfg.advantage))]
    rows = batch_rows(1, groups, whiten_advantages=True)
    assert rows[0]["advantages"] == pytest.approx([0, 0] + [2 / math.sqrt(6)] * 3, rel=1e-5)
    assert rows[1]["advantages"] == pytest.approx([0, 0] + [-3 / math.sqrt(6)] * 2, rel=1e-5)
    plain = batch_rows(1, groups, whiten_advantages=False)
    assert plain[0]["advantages"] == pytest.approx([0, 0, .5, .5, .5])


def test_a_restarted_orchestrator_keeps_the_groups_it_was_holding(tmp_path):
    # advantage=grpo, groups of 2, one group per batch. The first orchestrator reads segment 0, which holds only
    # rollout a of group g, and stops holding it: its cursor must stay at segment 0 (held_positions). The second
    # reads a again, then b (segment 1), and batches the group. Committing past segment 0 would lose a for good
    # and no batch would ever come.
    run = RunDir(tmp_path)
    run.mkdirs()
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.inference.group_size, cfg.inference.prompts_per_step = "grpo", 2, 1
    cfg.steps = 1
    OmegaConf.save(cfg, run.config)
    from prime_values.config import load_saved

    assert not load_saved(run.config).resolved.uses_critic
    writer = SegmentWriter(run.stream("rollouts"), "w0", "rollouts")
    full = lambda r: {**r, "prompt_id": "p", "shard": "w0", "stop_reason": "eos", "task": "{}",
                      "created_at": time.time()}
    writer.append([full(rollout("w0-000000-0000", "g", 1.0))])

    def orchestrate_until(done) -> None:
        role = threading.Thread(target=orchestrator.main, args=(str(tmp_path),), daemon=True)
        role.start()
        deadline = time.time() + 60  # in-process: a poll takes milliseconds; this only bounds a failure
        while not done() and time.time() < deadline:
            time.sleep(0.05)
        run.request_stop("test")
        role.join(60)
        assert not role.is_alive()
        run.stop_file.unlink()

    cursor = run.cursors / "orchestrator.json"
    orchestrate_until(cursor.exists)
    writer.append([full(rollout("w0-000000-0001", "g", 0.0))])
    batches = LogReader(run.stream("batches"), "test", run.cursors, "batches")
    found = []
    orchestrate_until(lambda: found.extend(batches.poll()) or found)
    assert found, "the restarted orchestrator never batched the group it had been holding"
    ids = found[0].table.column("rollout_id").to_pylist()
    assert ids == ["w0-000000-0000", "w0-000000-0001"], ids


def test_segment_positions_hold_the_oldest_segment_of_each_shard_and_forget_used_rows():
    from types import SimpleNamespace

    import pyarrow as pa

    from prime_values.roles.orchestrator import SegmentPositions

    def segment(shard, seq, *ids):
        return SimpleNamespace(shard=shard, seq=seq, table=pa.table({"rollout_id": list(ids)}))

    at = SegmentPositions()
    rows = at.rows([segment("w0", 3, "a", "b"), segment("w1", 5, "c"), segment("w0", 4, "d")])
    assert [r["rollout_id"] for r in rows] == ["a", "b", "c", "d"]  # the rows themselves carry no position
    assert all(set(r) == {"rollout_id"} for r in rows)
    at.rows([segment("w0", 6, "b")])  # read again later (a re-scored row): the older position stays held
    assert at.held(["b", "c", "d"]) == {"w0": 3, "w1": 5}  # b is in w0's segment 3; a was used
    assert at.held(["d"]) == {"w0": 4} and at.held(["c"]) == {}  # c was forgotten with the call before
