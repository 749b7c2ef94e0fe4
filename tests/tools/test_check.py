"""`python -m prime_values.tools.check`: small run directories built with the real writers (SegmentWriter,
weights.publish); a consistent one passes, each injected violation fails with a line naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import prime_values.log.segments as segments
from prime_values.log import SCHEMA_VERSION, SegmentWriter, apply_retention, records
from prime_values.log.records import token_digest
from prime_values.rundir import RunDir
from prime_values.tools.check import check, main
from prime_values.weights import publish
from tests import log_rows

REPO = Path(__file__).resolve().parents[2]
GROUP, PROMPTS, STEPS = 2, 2, 3


def save_model_files(path: Path) -> None:
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 8)


def rollout(chunk: int, k: int, version: int, n_tokens: int = 6) -> dict:
    return log_rows.row(
        "rollouts", rollout_id=f"w0-{chunk:06d}-{k:04d}", prompt_id=f"p{chunk}-{k // GROUP}",
        group_id=f"w0-{chunk:06d}-{k // GROUP:04d}", shard="w0", policy_version=version,
        token_ids=[chunk, k, *range(n_tokens - 2)], policy_mask=[0, 0] + [1] * (n_tokens - 2),
        sampling_logprobs=[0.0, 0.0] + [-0.5] * (n_tokens - 2), reward=float(k % 2), stop_reason="eos",
        privileged="42", task="{}", created_at=1.7e9 + chunk)


def digested(row: dict, r: dict) -> dict:
    """`row` with the token_digest of its rollout `r`, where its schema has the field (schema_version 3 on)."""
    return {**row, "token_digest": token_digest(r["token_ids"])} if "token_digest" in row else row


def values_row(r: dict, critic_version: int) -> dict:
    n = len(r["token_ids"])
    return digested(log_rows.row("values", rollout_id=r["rollout_id"], critic_version=critic_version,
                                 values=[0.5] * n, valued_tokens=n, scored_at=1.7e9), r)


def target_row(r: dict, critic_version: int) -> dict:
    n = len(r["token_ids"])
    same = ("rollout_id", "group_id", "policy_version", "token_ids", "policy_mask", "privileged", "reward")
    return digested(log_rows.row("targets", **{k: r[k] for k in same}, critic_version=critic_version,
                                 values=[0.5] * n, value_targets=[r["reward"]] * n, created_at=1.7e9), r)


def batch_row(step: int, r: dict, critic_version: int) -> dict:
    same = ("rollout_id", "policy_version", "token_ids", "policy_mask", "sampling_logprobs", "reward")
    return log_rows.row("batches", **{k: r[k] for k in same}, step=step, critic_version=critic_version,
                        advantages=[0.1] * len(r["token_ids"]))


def make_run(root: Path, steps: int = STEPS, critic: bool = True, batches=None, values=None, config: dict | None = None,
             targets=None) -> RunDir:
    """A finished run as the roles leave it: chunk c of shard w0 (policy version max(0, c - 1)) is scored by
    critic version c and becomes batch c + 1; policy versions 0..steps and critic versions 0..steps - 1 are
    published; every consumer's cursor is at the end. `batches(step, rows)` / `values(chunk, rows)` /
    `targets(chunk, rows)` may edit the rows before they are written (return None to skip the segment)."""
    run = RunDir(root)
    run.mkdirs()
    cfg = {"steps": steps, "schedule": {"max_off_policy": 1}, "advantage": {"estimator": "gae" if critic else "grpo"},
           "inference": {"group_size": GROUP, "prompts_per_step": PROMPTS}, "log": {"keep_segments": None}}
    for key, value in (config or {}).items():
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    run.config.write_text(json.dumps(cfg))  # JSON is YAML
    publish(run.weights("policy"), 0, save_model_files)
    publish(run.weights("critic"), 0, save_model_files)
    w = {s: SegmentWriter(run.stream(s), shard, s) for s, shard in
         (("rollouts", "w0"), ("values", "e0"), ("targets", "main"), ("batches", "main"))}
    for chunk in range(steps):
        rows = [rollout(chunk, k, max(0, chunk - 1)) for k in range(GROUP * PROMPTS)]
        w["rollouts"].append(rows)
        cv = chunk if critic else -1
        if critic:
            vrows = [values_row(r, cv) for r in rows]
            vrows = values(chunk, vrows) if values else vrows
            if vrows is not None:
                w["values"].append(vrows)
            trows = [target_row(r, cv) for r in rows]
            trows = targets(chunk, trows) if targets else trows
            if trows is not None:
                w["targets"].append(trows)
            if chunk:
                publish(run.weights("critic"), chunk, save_model_files)
        brows = [batch_row(chunk + 1, r, cv) for r in rows]
        brows = batches(chunk + 1, brows) if batches else brows
        if brows is not None:
            w["batches"].append(brows, seq=brows[0]["step"] - 1)
        publish(run.weights("policy"), chunk + 1, save_model_files)
    for writer in w.values():
        writer.close()
    cursors = {"evaluator": {"rollouts": {"w0": steps}}, "orchestrator": {"rollouts": {"w0": steps}},
               "orchestrator.values": {"values": {"e0": steps}}, "value_trainer": {"targets": {"main": steps}},
               "policy_trainer": {"batches": {"main": steps}}}
    for consumer, data in cursors.items():
        if critic or consumer in ("orchestrator", "policy_trainer"):
            (run.cursors / f"{consumer}.json").write_text(json.dumps(data))
    (run.state("policy_trainer") / "done").write_text(json.dumps({"step": steps}))
    return run


def violations(root: Path, **kw) -> list[str]:
    return [f"[{kind}] {message}" for kind, message in check(root, **kw).violations]


def only(root: Path, kind: str, *fragments: str) -> str:
    """The run has violations of exactly one kind, and one of them contains every fragment."""
    found = violations(root)
    assert found and all(v.startswith(f"[{kind}]") for v in found), found
    assert any(all(f in v for f in fragments) for v in found), found
    return found[0]


@pytest.fixture
def run(tmp_path):
    return make_run(tmp_path / "run")


def test_a_consistent_run_passes_with_a_one_line_summary(run, capsys):
    assert violations(run.root) == []
    assert main([str(run.root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith(f"OK {run.root}: 3 batch steps, 12 rollouts"), out
    assert "policy LATEST 3, critic LATEST 2" in out[0]


def test_a_grpo_run_without_critic_passes(tmp_path):
    assert violations(make_run(tmp_path / "g", critic=False).root) == []


def test_duplicate_rollout_in_two_batches(tmp_path):
    def reuse(step, rows):
        if step == 2:  # batch 2 trains again on a rollout of batch 1 (a restarted orchestrator re-batching)
            rows[0] = batch_row(2, rollout(0, 0, 0), critic_version=0)
        return rows
    root = make_run(tmp_path / "r", batches=reuse).root
    found = violations(root)
    assert any(v.startswith("[duplicate-rollout] rollout 'w0-000000-0000' appears 2 times in batches (steps 1, 2)")
               for v in found), found
    # it also left both groups of batch 2 incomplete
    assert any(v.startswith("[batch-size] batch step 2: group 'w0-000000-0000' has 1 rollouts in the batch, not "
                            "inference.group_size=2 (2 such group(s))") for v in found), found
    assert main([str(root)]) == 1


def test_missing_batch_step(tmp_path):
    root = make_run(tmp_path / "r", batches=lambda step, rows: None if step == 2 else rows).root
    assert "[step] batch step 2 is missing (steps must run 1..3 without gaps)" in violations(root)


def test_batch_segment_with_the_wrong_step(tmp_path):
    def wrong(step, rows):
        if step == 2:
            rows[-1]["step"] = 3
        return rows
    only(make_run(tmp_path / "r", batches=wrong).root, "step", "000000000001.arrow must hold batch step 2",
         "step(s) [2, 3]")


def test_values_record_length_mismatch(tmp_path):
    def short(chunk, rows):
        if chunk == 1:
            rows[2]["values"] = rows[2]["values"][:-1]
            rows[2]["valued_tokens"] -= 1
        return rows
    only(make_run(tmp_path / "r", values=short).root, "values-length",
         "values record of rollout 'w0-000001-0002' has 5 values for a rollout of 6 tokens")


def test_torn_segment_outside_quarantine(run):
    path = run.stream("targets") / "main" / segments.segment_name(1)
    path.write_bytes(path.read_bytes()[:-40])  # a torn write that somehow became visible
    only(run.root, "segment", "log/targets/main/000000000001.arrow is torn or unreadable outside quarantine")


def test_quarantined_and_temp_segments_are_not_violations(run):
    quarantine = segments.quarantine_dir(run.stream("targets"), "main")
    quarantine.mkdir(parents=True)
    (run.stream("targets") / "main" / segments.segment_name(2)).rename(quarantine / segments.segment_name(2))
    (run.stream("rollouts") / "w0" / ".000000000003.arrow.tmp").write_bytes(b"half")
    result = check(run.root)
    assert result.ok, result.violations
    assert result.counts["quarantined"] == 1 and "unpublished temp file" in result.lines()[-1]


def test_cursor_past_the_end(run):
    (run.cursors / "evaluator.json").write_text(json.dumps({"rollouts": {"w0": 9}}))
    only(run.root, "cursor", "evaluator.json: rollouts/w0 next_seq 9 is past the end of the shard (highest seq 2")
    (run.cursors / "evaluator.json").write_text("{not json")
    only(run.root, "cursor", "evaluator.json is unreadable")


def test_latest_pointing_nowhere(run):
    (run.weights("critic") / "LATEST").write_text("7\n")
    only(run.root, "weights", "weights/critic/LATEST points to version 7, which has no directory")


def test_version_dir_without_files(run):
    for f in (run.weights("policy") / "2").iterdir():
        f.unlink()
    only(run.root, "weights",
         "weights/policy/2 is an incomplete version directory: it lacks config.json and a weights file")


def test_policy_latest_must_match_the_trainer_and_the_batches(run):
    (run.cursors / "policy_trainer.json").write_text(json.dumps({"batches": {"main": 1}}))
    only(run.root, "weights", "policy trainer's batch cursor is at 1")


def test_version_used_before_it_was_published(tmp_path):
    def future(chunk, rows):
        return [{**r, "critic_version": 9} for r in rows] if chunk == 2 else rows
    found = violations(make_run(tmp_path / "r", values=future).root)
    assert any("values records carry critic version 9 but weights/critic/LATEST is 2" in v for v in found), found


def test_critic_version_goes_back_in_an_evaluator_shard(tmp_path):
    def back(chunk, rows):
        return [{**r, "critic_version": 0} for r in rows] if chunk == 2 else rows
    found = violations(make_run(tmp_path / "r", values=back).root)
    assert any(v.startswith("[critic-version] log/values/e0/000000000002.arrow has critic_version 0 after 1")
               for v in found), found


def test_too_stale_rollout_in_a_batch(tmp_path):
    root = make_run(tmp_path / "r", config={"schedule.max_off_policy": 0}).root
    only(root, "staleness", "batch step 3: rollout 'w0-000002-0000' from policy version 1 is 1 steps stale; "
                            "admissible is 0..0")


def test_an_old_lockstep_run_is_checked_against_the_bound_it_enforced(tmp_path):
    """A config.yaml saved before resolved.* existed: the loader (config.load_saved) derives the bound, 0 under
    lockstep whatever schedule.max_off_policy says; a recorded resolved.max_off_policy is read as it is."""
    root = make_run(tmp_path / "old", config={"schedule.mode": "lockstep"}).root
    only(root, "staleness", "from policy version 1 is 1 steps stale; admissible is 0..0")
    recorded = make_run(tmp_path / "new", config={"schedule.mode": "lockstep", "resolved.max_off_policy": 1}).root
    assert violations(recorded) == []


def test_batch_rollout_missing_from_the_log(tmp_path):
    def stranger(step, rows):
        if step == 3:
            rows[1] = {**rows[1], "rollout_id": "w0-000002-0099"}
        return rows
    found = violations(make_run(tmp_path / "r", batches=stranger).root)
    assert "[missing-rollout] batch step 3 references rollout 'w0-000002-0099', which is not in the rollout log" \
        in found


def test_old_and_future_schema_versions(run, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(segments, "SCHEMA_VERSION", 1)
        SegmentWriter(run.stream("targets"), "old", "targets").append(
            [target_row(rollout(0, 0, 0), 0)])
    found = violations(run.root)
    assert found == ["[segment] 1 segments were written with schema_version 1 (1 in log/targets); this Prime Values "
                     f"reads only schema_version {SCHEMA_VERSION} (its readers would quarantine them); rerun with "
                     "--allow-old-schema to check their content"]
    assert check(run.root, allow_old_schema=True).ok
    with monkeypatch.context() as m:
        m.setattr(segments, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
        SegmentWriter(run.stream("targets"), "new", "targets").append([target_row(rollout(0, 0, 0), 0)])
    assert any(f"schema_version {SCHEMA_VERSION + 1} is newer" in v
               for v in violations(run.root, allow_old_schema=True))


def test_consistent_run_pairs_every_values_and_targets_record_by_digest(run):
    result = check(run.root)
    assert result.ok and result.counts["paired"] == 2 * 12 and not result.counts["undigested"]
    assert "(24 values/targets records paired with their rollout by token digest)" in result.lines()[-1]


def test_values_computed_on_another_rollouts_tokens(tmp_path):
    # an evaluator that scored rollout 1's tokens but stamped them with rollout 0's id (ids and lengths agree)
    def swapped(chunk, rows):
        if chunk == 1:
            rows[0]["token_digest"] = rows[1]["token_digest"]
        return rows
    only(make_run(tmp_path / "r", values=swapped).root, "pairing", "log/values/e0/000000000001.arrow",
         "rollout 'w0-000001-0000' carries token_digest", "computed on (or joined with) another rollout's tokens")


def test_targets_joined_with_another_rollouts_values(tmp_path):
    # an orchestrator that joined rollout 0 with the values row of rollout 1 carries that row's digest
    def swapped(chunk, rows):
        if chunk == 2:
            rows[0]["token_digest"] = rows[1]["token_digest"]
        return rows
    only(make_run(tmp_path / "r", targets=swapped).root, "pairing", "log/targets: the record of rollout "
         "'w0-000002-0000' carries token_digest")


def test_targets_record_with_other_tokens_than_its_rollout(tmp_path):
    def other(chunk, rows):
        if chunk == 0:
            rows[3]["token_ids"] = list(reversed(rows[3]["token_ids"]))
        return rows
    found = violations(make_run(tmp_path / "r", targets=other).root)
    assert "[targets-rollout] log/targets: record of rollout 'w0-000000-0003' holds other token_ids than the " \
           "rollout log" in found, found


def test_records_written_before_digests_are_not_verifiable_not_violations(tmp_path, monkeypatch):
    # a run directory of schema_version 2: values and targets without token_digest
    with monkeypatch.context() as m:
        m.setattr(segments, "SCHEMA_VERSION", 2)
        for kind in ("values", "targets"):
            old = records.SCHEMAS[kind].remove(records.SCHEMAS[kind].get_field_index("token_digest"))
            m.setitem(records.SCHEMAS, kind, old)
            m.setitem(records._KEYS, kind, (set(old.names), records.itemgetter(*old.names)))
            m.setitem(records._TYPES, kind, list(old.types))

        def without(chunk, rows):
            return [{k: v for k, v in row.items() if k != "token_digest"} for row in rows]
        root = make_run(tmp_path / "r", values=without, targets=without).root
    result = check(root, allow_old_schema=True)
    assert result.ok, result.violations
    assert result.counts["undigested"] == 24 and not result.counts["paired"]
    assert "24 values/targets records carry no token_digest (written before schema_version 3): their pairing with " \
           "a rollout is not verifiable" in result.lines()[-1]


@pytest.mark.parametrize("retention", [True, False])
def test_segments_deleted_by_log_retention(tmp_path, retention):
    """apply_retention deletes what every consumer passed: references into those segments are unverifiable, not
    violations, when log retention is configured; the same holes without it are violations."""
    run = make_run(tmp_path / "r", config={"log.keep_segments": 1 if retention else None})
    consumers = {"rollouts": ["evaluator", "orchestrator"], "values": ["orchestrator.values"],
                 "targets": ["value_trainer"], "batches": ["policy_trainer"]}
    for stream, names in consumers.items():
        assert apply_retention(run.stream(stream), run.cursors, names, keep_last=1, max_age_s=None) == 2
    result = check(run.root)
    if retention:
        assert result.ok, result.violations
        assert "batch steps 1..2 deleted by log retention" in result.lines()[-1]
        assert result.counts["unverifiable_retention"] == 0  # batch 3's rollouts and values are still there
    else:
        kinds = {kind for kind, _ in result.violations}
        assert kinds == {"step"}, result.violations  # steps 1 and 2 missing; nothing else references them


def test_retention_leaves_batches_referencing_deleted_rollouts(tmp_path):
    run = make_run(tmp_path / "r", config={"log.keep_segments": 1})
    apply_retention(run.stream("rollouts"), run.cursors, ["evaluator", "orchestrator"], keep_last=1, max_age_s=None)
    result = check(run.root)
    assert result.ok, result.violations
    assert result.counts["unverifiable_retention"] == 24  # rollouts of chunks 0, 1: in 8 batch, values, targets rows
    # a cursor that has not passed a deleted segment makes the hole a violation again
    (run.cursors / "evaluator.json").write_text(json.dumps({"rollouts": {"w0": 1}}))
    assert any(v.startswith("[missing-rollout]") for v in violations(run.root))


def test_cli_exit_codes_and_lines(run, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "prime_values.tools.check", *args], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=120)
    good = cli(str(run.root))
    assert good.returncode == 0 and len(good.stdout.splitlines()) == 1 and good.stdout.startswith("OK "), good
    (run.weights("critic") / "LATEST").write_text("7\n")
    (run.cursors / "evaluator.json").write_text(json.dumps({"rollouts": {"w0": 9}}))
    bad = cli(str(run.root))
    lines = bad.stdout.splitlines()
    assert bad.returncode == 1 and len(lines) == 3 and lines[-1].startswith("FAILED "), bad
    assert all(line.startswith("VIOLATION [") for line in lines[:2])
    missing = cli(str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "is not a run directory" in missing.stderr
