"""Chaos, quick version: SIGKILL each role in turn during a real run; the conductor restarts them, every role
resumes from the run directory, and the run ends with every invariant of `prime_values.tools.check` intact.
The long version is `python -m prime_values.tools.chaos --kills 20 ...` (docs/reliability.md)."""

from __future__ import annotations

import pytest

from prime_values.tools.chaos import ROLES, chaos
from tests.e2e_helpers import SMALL, processes_mentioning, seed_version_zero

pytestmark = pytest.mark.slow


def test_killing_every_role_loses_nothing(tmp_path):
    run_dir = seed_version_zero(tmp_path / "run")
    # far more steps than the kills take: the harness stops the run 3 policy steps after the last kill, so on a fast
    # machine the run cannot end before every role was killed, and on a slow one no kill lands after its end
    overrides = [o for o in SMALL if not o.startswith("steps=")] + ["steps=100000", "eval_every=100000"]
    report = chaos(run_dir, overrides, kills=len(ROLES), min_gap_s=0.5, max_gap_s=1.5, seed=1, timeout_s=600,
                   stop_after_steps=3)
    assert report["run_returncode"] == 0, report["run_output_tail"]
    assert report["check_returncode"] == 0, report["check_output"]
    assert report["kills"] == len(ROLES), report["killed"]
    assert sorted(k["role"] for k in report["killed"]) == sorted(ROLES), report["killed"]
    assert report["policy_steps"] >= report["killed"][-1]["policy_step"] + 3, report
    # the conductor noticed and restarted every role killed: the run needed each of them until it was stopped
    for role in ROLES:
        assert report["restarts_per_role"].get(role, 0) >= 1, report
    assert not processes_mentioning(str(run_dir)), "a role process outlived the run"
    # a restarted trainer resumes its Adam moments from the version it resumes (dist.optimizer_state, saved with
    # every version by default): never a fresh optimizer after a kill
    resumed = [line for log in (run_dir / "jobs").glob("*_trainer/*_log.err")
               for line in log.read_text(errors="replace").splitlines() if "resuming after" in line]
    # (every policy trainer killed after version 1 logs one such line when restarted: never an empty list that passes)
    policy_kills = sum(k["role"] == "policy_trainer" and k["policy_step"] >= 1 for k in report["killed"])
    assert resumed and sum("critic" not in line for line in resumed) >= policy_kills, (report["killed"], resumed)
    assert all("optimizer state restored" in line for line in resumed), resumed
