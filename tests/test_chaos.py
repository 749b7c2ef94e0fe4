"""Chaos, quick version: SIGKILL each role in turn during a real run; the conductor restarts them, every role
resumes from the run directory, and the run ends with every invariant of `prime_values.check` intact.
The long version is `python -m prime_values.chaos --kills 20 ...` (docs/reliability.md)."""

from __future__ import annotations

from prime_values.chaos import ROLES, chaos
from test_pipeline import SMALL, processes_mentioning


def test_killing_every_role_loses_nothing(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [o for o in SMALL if not o.startswith("steps=")] + ["steps=24", "eval_every=12"]
    report = chaos(run_dir, overrides, kills=len(ROLES), min_gap_s=0.5, max_gap_s=1.5, seed=1, timeout_s=600)
    assert report["run_returncode"] == 0, report["run_output_tail"]
    assert report["check_returncode"] == 0, report["check_output"]
    assert report["kills"] >= 3, report["killed"]
    assert report["policy_steps"] == 24
    # the conductor noticed and restarted every role killed while the run still needed it (a kill in the last
    # couple of steps can land after the policy trainer finished: then the run just ends)
    for role in ROLES:
        needed = sum(k["role"] == role and k["policy_step"] < 22 for k in report["killed"])
        assert report["restarts_per_role"].get(role, 0) >= needed, report
    assert sum(report["restarts_per_role"].values()) >= 2, report
    assert not processes_mentioning(str(run_dir)), "a role process outlived the run"
    # a restarted trainer resumes its Adam moments from the version it resumes (dist.optimizer_state, saved with
    # every version by default): never a fresh optimizer after a kill
    resumed = [line for log in (run_dir / "jobs").glob("*_trainer/*_log.err")
               for line in log.read_text(errors="replace").splitlines() if "resuming after" in line]
    # (a policy trainer killed after version 1 and restarted logs one such line: never an empty list that passes)
    policy_kills = sum(k["role"] == "policy_trainer" and 1 <= k["policy_step"] < 22 for k in report["killed"])
    assert sum("critic" not in line for line in resumed) >= policy_kills, (report["killed"], resumed)
    assert all("optimizer state restored" in line for line in resumed), resumed
