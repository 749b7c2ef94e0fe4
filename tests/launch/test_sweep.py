"""A Hydra multirun of the pipeline: each point is a full run in its own directory, and the sweep directory gets
a one-row-per-point summary (overrides, final figures, run dir) and the points' curves overlaid."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.e2e_helpers import REPO, SMALL, assert_learned, processes_mentioning, seed_version_zero

pytestmark = pytest.mark.slow


def test_multirun_points_and_sweep_summary(tmp_path):
    sweep = tmp_path / "sweep"
    for point in ("0", "1"):  # each point's run directory gets the session's version 0: no warm start
        seed_version_zero(sweep / point)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    args = [a for a in SMALL if not a.startswith("steps=")]
    result = subprocess.run([sys.executable, "-m", "prime_values", "-m", *args, "advantage=grpo", "steps=2",
                             "seed=0,1", f"hydra.sweep.dir={sweep}"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for point in ("0", "1"):
        assert json.loads((sweep / point / "report" / "summary.json").read_text())["status"] == "finished"
        assert_learned(sweep / point, critic=False)
    rows = json.loads((sweep / "sweep_summary.json").read_text())
    assert [r["point"] for r in rows] == ["0", "1"]
    assert ["seed=0" in r["overrides"] for r in rows] == [True, False] and "seed=1" in rows[1]["overrides"]
    assert all(r["status"] == "finished" and r["policy_steps"] == 2 and r["run_dir"].endswith(r["point"])
               for r in rows)
    table = (sweep / "sweep_summary.md").read_text()
    assert "| 0 | `seed=0` | finished |" in table and "| 1 | `seed=1` | finished |" in table, table
    assert (sweep / "sweep_curves.png").stat().st_size > 10_000
    # the same summary from the command line
    again = subprocess.run([sys.executable, "-m", "prime_values.tools.report", str(sweep)], cwd=REPO, env=env,
                           capture_output=True, text=True)
    assert again.returncode == 0 and "2 points" in again.stdout, again.stderr
    assert not processes_mentioning(str(sweep))
