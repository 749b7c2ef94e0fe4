"""The conductor's live view (prime_values/tools/live.py), rendered from a synthetic run directory: metrics files,
heartbeats, done markers and control/restarts.json written by the test. No role runs."""

from __future__ import annotations

import io
import json
import os
import re
import sys
import time

import pytest

from prime_values.tools.live import LiveView, Progress, duration, render
from prime_values.rundir import RunDir

NOW = time.time()


@pytest.fixture(autouse=True)
def _now():
    """The synthetic run's clock is each test's start, not the module's import: the whole suite runs for minutes
    between collecting this file and running it, which would make every heartbeat look stale."""
    global NOW
    NOW = time.time()


def write_metrics(run: RunDir, role: str, records: list[dict]) -> None:
    path = run.metrics(role)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        for record in records:
            f.write(json.dumps({"role": role, **record}) + "\n")


def beat(run: RunDir, role: str, at: float) -> None:
    path = run.root / "state" / role / "heartbeat"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{at}\n")
    os.utime(path, (at, at))


def make_run(tmp_path, workers: int = 2, evaluator: str = "dedicated", estimator: str = "gae") -> RunDir:
    run = RunDir(tmp_path / "run")
    run.mkdirs()
    run.config.write_text(f"steps: 100\nlauncher:\n  name: local\nadvantage:\n  estimator: {estimator}\n"
                          f"topology:\n  inference_workers: {workers}\n  evaluator: {evaluator}\n")
    t0 = NOW - 100
    write_metrics(run, "warm_start", [{"time": t0 - 50, "sft_step": 10, "loss": 0.5}])
    (run.root / "state" / "warm_start").mkdir(parents=True, exist_ok=True)
    (run.root / "state" / "warm_start" / "done").write_text("{}")
    # policy: steps 1..21 one every 4 s (0.25 steps/s), a held-out eval at step 20
    steps = [{"time": t0 + 4 * s, "step": s, "reward_mean": 0.5, "loss": 0.1} for s in range(1, 22)]
    write_metrics(run, "policy_trainer", steps[:20] + [{"time": t0 + 81, "step": 20, "heldout_accuracy": 0.375}]
                  + steps[20:])
    write_metrics(run, "orchestrator", [{"time": t0 + 80, "step": 21, "reward_mean": 0.5,
                                         "critic_explained_variance": 0.42, "off_policy_mean": 0.5,
                                         "off_policy_max": 1, "critic_version_lag_mean": 1.5,
                                         "waiting_rollouts": 12, "dropped_stale": 4}])
    # value trainer: critic steps 1..11, one every 2 s (0.5 critic steps/s)
    write_metrics(run, "value_trainer", [{"time": t0 + 2 * s, "critic_step": s, "critic_version": s // 2,
                                          "replay_size": 64 + s, "replay_capacity": 256, "ingest_dropped": 3}
                                         for s in range(1, 12)])
    # inference0: 8 rollouts of 100 tokens each every 2 s (4 rollouts/s, 400 tokens/s); inference1 never started
    write_metrics(run, "inference0", [{"time": t0 + 2 * c, "chunk": c, "rollouts": 8, "tokens_per_s": 800.0,
                                       "gen_s": 1.0} for c in range(6)])
    # evaluator: 1000 states every 5 s (200 states/s)
    write_metrics(run, "evaluator", [{"time": t0 + 5 * b, "scored": 8, "states_per_s": 2000.0, "score_s": 0.5}
                                     for b in range(4)])
    for role in ("inference0", "evaluator", "orchestrator", "policy_trainer", "value_trainer"):
        beat(run, role, NOW - 1)
    return run


def view(run: RunDir, tty: bool, width: int = 200) -> tuple[LiveView, io.StringIO]:
    out = io.StringIO()
    live = LiveView(run, 100, out=out, tty=tty)
    live.width = width
    return live, out


def test_tty_view_shows_every_figure_and_role(tmp_path):
    run = make_run(tmp_path)
    beat(run, "value_trainer", NOW - 300)  # quiet for 5 minutes: a long step, or hung
    (run.root / "control").mkdir(exist_ok=True)
    restarts = run.root / "control" / "restarts.json"
    restarts.write_text(json.dumps({"evaluator": 1, "inference0": 2}))
    os.utime(restarts, (NOW - 10, NOW - 10))  # the evaluator has not beaten since; inference0 has
    beat(run, "evaluator", NOW - 20)
    live, out = view(run, tty=True)
    live.show()
    text = out.getvalue()
    lines = re.sub(r"\x1b\[[0-9]*[A-Za-z]", "", text).splitlines()
    head, figures, roles = lines[0], lines[1], lines[2:]
    # policy step 21/100 at 0.25 steps/s: 79 steps to go, 316 s
    assert "policy step 21/100 ETA 5m16s" in head and "0.25 steps/s" in head
    assert "reward 0.50" in head and "held-out acc 0.38" in head
    assert "critic v5 (step 11) EV 0.42" in figures and "values 1.5 versions behind" in figures
    assert "off-policy 0.5/1 (mean/max)" in figures
    assert "replay 75/256 rollouts, ingest dropped 3" in figures
    by_role = {line.split()[0]: line for line in roles}
    assert list(by_role) == ["warm_start", "inference0", "inference1", "evaluator", "orchestrator",
                             "policy_trainer", "value_trainer"]
    assert "done" in by_role["warm_start"]
    assert "running [2 restarts]" in by_role["inference0"]
    assert "4.00 rollouts/s" in by_role["inference0"] and "400 tokens/s" in by_role["inference0"]
    assert "waiting" in by_role["inference1"]
    assert "restarting [1 restart]" in by_role["evaluator"] and "200 states/s" in by_role["evaluator"]
    assert "12 rollouts waiting for values" in by_role["orchestrator"]
    assert "running" in by_role["policy_trainer"] and "0.25 steps/s" in by_role["policy_trainer"]
    assert "quiet 5m00s" in by_role["value_trainer"] and "0.50 critic steps/s" in by_role["value_trainer"]
    assert "\x1b[2K" in text and "\x1b[J" in text  # each line cleared, the rest of the screen too

    # the next frame goes back up over the last one, and shows what changed
    live._last_print = 0.0
    write_metrics(run, "policy_trainer", [{"time": NOW, "step": 22, "reward_mean": 0.75}])
    mark = len(out.getvalue())
    live.show()
    second = out.getvalue()[mark:]
    assert second.startswith(f"\x1b[{len(lines)}F") and "policy step 22/100" in second and "reward 0.75" in second


def test_tty_redraw_after_foreign_output_starts_below_it(tmp_path, monkeypatch):
    run = make_run(tmp_path)
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(sys, "stderr", sys.stderr)  # put back even if the view is not closed
    live = LiveView(run, 100, tty=True)
    live.show()
    assert sys.stdout is not out  # watched while the view is up
    print("prime_values: role evaluator failed: boom; restarting it in 2 s")  # the conductor's restart line
    live._last_print = 0.0
    mark = len(out.getvalue())
    live.show()
    assert not re.match(r"\x1b\[\d+F", out.getvalue()[mark:])  # not drawn over the message: it stays on screen
    assert "restarting it in 2 s" in out.getvalue()
    live._last_print = 0.0
    mark = len(out.getvalue())
    live.show()
    assert re.match(r"\x1b\[\d+F", out.getvalue()[mark:])  # nothing printed since: redrawn in place
    live.show(final=True)
    assert sys.stdout is out  # restored at the end


def test_narrow_terminal_wraps_figures_and_cuts_role_lines(tmp_path):
    live, out = view(make_run(tmp_path), tty=True, width=50)
    lines = live.lines()
    assert max(len(line) for line in lines) <= 50 and len(lines) > 9  # headline and figures over several lines
    text = "\n".join(lines)
    assert "held-out acc 0.38" in text and "replay 75/256 rollouts, ingest dropped 3" in text


def test_plain_mode_one_line_every_ten_seconds(tmp_path):
    run = make_run(tmp_path)
    live, out = view(run, tty=False)
    live.show()
    live.show()  # within 10 s: nothing more
    printed = out.getvalue().splitlines()
    assert len(printed) == 1 and "\x1b" not in out.getvalue()
    line = printed[0]
    assert "policy step 21/100 ETA 5m16s" in line and "reward 0.50" in line and "held-out acc 0.38" in line
    assert "critic v5 EV 0.42" in line and "off-policy 0.5/1" in line and "replay 75 dropped 3" in line
    assert "4.00 rollouts/s 400 tok/s" in line and "200 states/s" in line and "0.50 critic steps/s" in line
    live._last_print -= 10
    live.show()
    assert len(out.getvalue().splitlines()) == 2
    live.show(final=True)  # always printed
    assert len(out.getvalue().splitlines()) == 3


def test_plain_mode_names_roles_that_are_not_simply_running(tmp_path):
    run = make_run(tmp_path)
    beat(run, "orchestrator", NOW - 120)
    line = render(run.root)
    assert "orchestrator running (quiet 2m00s)" in line and "inference1" not in line  # waiting is normal


def test_stopped_run_and_final_frame(tmp_path):
    run = make_run(tmp_path)
    (run.root / "state" / "policy_trainer" / "done").write_text("{}")
    run.request_stop("finished")
    beat(run, "evaluator", NOW - 60)
    live, out = view(run, tty=True)
    by_role = {line.split()[0]: line for line in live.lines()[2:]}
    assert "done" in by_role["policy_trainer"] and "stopped" in by_role["evaluator"]
    assert "stopping" in by_role["orchestrator"] and "not started" in by_role["inference1"]
    live.show(final=True)
    by_role = {line.split()[0]: line for line in re.sub(r"\x1b\[[0-9]*[A-Za-z]", "", out.getvalue()).splitlines()[2:]}
    assert "stopped" in by_role["orchestrator"]


def test_warm_start_and_empty_run(tmp_path):
    run = RunDir(tmp_path / "run")
    run.mkdirs()
    run.config.write_text("steps: 5\nadvantage:\n  estimator: grpo\ntopology:\n  inference_workers: 1\n"
                          "  evaluator: dedicated\n")
    live = Progress(run, 5)
    assert live.line().endswith("starting")
    assert [line.split()[0] for line in live.lines()[1:]] == ["warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"]  # grpo: no critic roles
    write_metrics(run, "warm_start", [{"time": NOW, "sft_step": 3, "loss": 1.25, "sft_val_accuracy": 0.5}])
    assert "warm start: SFT step 3 loss 1.250 validation acc 0.50" in live.line()
    (run.root / "state" / "warm_start").mkdir(parents=True)
    (run.root / "state" / "warm_start" / "done").write_text("{}")
    assert "warm start done; waiting for policy step 1/5" in live.line()
    assert "warm_start      done" in live.lines()[1]


def test_colocated_scoring_and_many_workers(tmp_path):
    run = make_run(tmp_path, workers=6, evaluator="colocated")
    write_metrics(run, "value_trainer", [{"time": NOW - 100 + 5 * b, "scored": 8, "states_per_s": 1000.0,
                                          "score_s": 1.0} for b in range(3)])
    lines = view(run, tty=True)[0].lines()  # 200 columns: not the terminal the tests run in
    roles = [line.split()[0] for line in lines[2:]]
    assert "evaluator" not in roles and roles.count("inference") == 1  # six workers on one line
    workers = next(line for line in lines if line.split()[0] == "inference")
    assert "inference x6" in workers and "1 running, 5 waiting" in workers and "4.00 rollouts/s" in workers
    critic = next(line for line in lines if line.split()[0] == "value_trainer")
    assert "200 states/s scored" in critic


def test_status_prints_the_view(tmp_path):
    from prime_values.tools.status import status

    run = make_run(tmp_path)
    (run.report / "summary.json").write_text(json.dumps({"status": "finished"}))
    run.request_stop("finished")
    shown = status(run.root)
    assert "ended, finished" in shown and "policy step 21/100" in shown and "value_trainer" in shown


@pytest.mark.parametrize("seconds,text", [(5, "5s"), (65, "1m05s"), (3725, "1h02m"), (None, "-")])
def test_duration(seconds, text):
    assert duration(seconds) == text
