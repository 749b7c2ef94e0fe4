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

from prime_values.rundir import RunDir
from prime_values.tools.live import LiveView, duration, render

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
    live.now = lambda: NOW  # ages from the test's own clock: a loaded machine cannot make '5m00s' read '5m01s'
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
    live = LiveView(run, 5)
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


# ------------------------------------------------------------------ what each role is doing (the heartbeat's activity)
def beat_doing(run: RunDir, role: str, at: float, **activity) -> None:
    """A heartbeat as roles.common.RoleContext writes it: the time, then what the role is doing as JSON."""
    beat(run, role, at)
    path = run.heartbeat_file(role)
    path.write_text(f"{at}\n{json.dumps(activity)}\n")
    os.utime(path, (at, at))


def submitted(run: RunDir, *roles: str) -> None:
    for role in roles:
        (run.jobs / role).mkdir(parents=True, exist_ok=True)


def fresh_run(tmp_path, steps: int = 100) -> RunDir:
    run = RunDir(tmp_path / "run")
    run.mkdirs()
    run.config.write_text(f"steps: {steps}\nadvantage:\n  estimator: gae\ntopology:\n  inference_workers: 1\n"
                          "  evaluator: dedicated\n")
    return run


def by_role(lines: list[str]) -> dict[str, str]:
    roles = ("warm_start", "inference0", "evaluator", "orchestrator", "policy_trainer", "value_trainer")
    return {line.split()[0]: line for line in lines if line.split() and line.split()[0] in roles}


def test_the_warm_start_shows_its_phase_step_rate_and_threads(tmp_path):
    run = fresh_run(tmp_path)
    live, out = view(run, tty=True)
    assert "starting" in live.line()
    submitted(run, "warm_start")
    assert "starting" in by_role(live.lines())["warm_start"]  # submitted, not up yet: imports, building the model
    beat_doing(run, "warm_start", NOW - 1, doing="critic pretraining", since=NOW - 20, unit="step", of=150,
               step=137, rate=8.5, median_s=0.12, last_at=NOW - 1, threads=2)
    lines = live.lines()
    assert "warm start: critic pretraining step 137/150, 8.50 steps/s, 2 threads" in lines[0]
    roles = by_role(lines)
    assert "running" in roles["warm_start"] and "critic pretraining step 137/150" in roles["warm_start"]
    assert "waiting" in roles["policy_trainer"] and "for the warm start" in roles["policy_trainer"]
    assert not any("slow" in line for line in lines)  # every step at its usual pace
    beat_doing(run, "warm_start", NOW - 1, doing="generating rollouts for critic pretraining", unit="rollouts",
               of=1024, step=256, rate=41.0, last_at=NOW - 1, threads=1)
    assert "generating rollouts for critic pretraining: 256/1024 rollouts, 41.0 rollouts/s, 1 thread" in live.line()
    beat_doing(run, "warm_start", NOW - 1, doing="SFT", unit="step", of=900, step=45, rate=3.1, threads=2,
               note="validation acc 0.32 at step 45 (target 0.40)")
    assert "SFT step 45/900, 3.10 steps/s, 2 threads, validation acc 0.32 at step 45 (target 0.40)" in live.line()
    beat_doing(run, "warm_start", NOW - 1, doing="publishing critic v0", since=NOW - 1)
    assert "warm start: publishing critic v0" in live.line()


def test_roles_say_whether_they_are_starting_and_what_they_wait_for(tmp_path):
    run = fresh_run(tmp_path)
    write_metrics(run, "warm_start", [{"time": NOW - 30, "sft_step": 10, "loss": 0.5}])
    (run.root / "state" / "warm_start").mkdir(parents=True, exist_ok=True)
    (run.root / "state" / "warm_start" / "done").write_text("{}")
    submitted(run, "warm_start", "inference0", "evaluator", "orchestrator", "policy_trainer", "value_trainer")
    beat_doing(run, "policy_trainer", NOW - 1, doing="waiting for batch 1", since=NOW - 12)
    beat_doing(run, "evaluator", NOW - 1, doing="waiting for rollouts to score", since=NOW - 3, note="critic v0")
    beat_doing(run, "orchestrator", NOW - 1, doing="waiting for the groups of batch 1", since=NOW - 5,
               note="12/64 ready")
    beat_doing(run, "value_trainer", NOW - 1, doing="waiting for targets", since=NOW - 8,
               note="replay 0/64 rollouts before the first step")
    live, out = view(run, tty=True)
    roles = by_role(live.lines())
    assert "starting" in roles["inference0"]  # submitted, no heartbeat yet
    assert "waiting for batch 1 for 12s" in roles["policy_trainer"]
    assert "waiting for rollouts to score for 3s, critic v0" in roles["evaluator"]
    assert "waiting for the groups of batch 1 for 5s, 12/64 ready" in roles["orchestrator"]
    assert "waiting for targets for 8s, replay 0/64 rollouts before the first step" in roles["value_trainer"]
    live.show()
    plain, _ = view(run, tty=False)
    line = plain.plain()
    assert "inference0 starting" in line and "policy_trainer: waiting for batch 1 for 12s" in line
    assert "evaluator: waiting for rollouts to score for 3s, critic v0" in line


def test_a_slow_step_is_said_with_its_time_and_the_median(tmp_path):
    run = fresh_run(tmp_path)
    submitted(run, "warm_start")
    pace = dict(doing="critic pretraining", unit="step", of=150, step=137, rate=0.5, median_s=0.12, threads=2)
    # a step that took 100 times the median, 2 s ago
    beat_doing(run, "warm_start", NOW - 1, last_at=NOW - 1, slow={"step": 137, "took_s": 12.0, "median_s": 0.12,
                                                                   "at": NOW - 2}, **pace)
    live, out = view(run, tty=True)
    text = "\n".join(live.lines())
    assert "slow: critic pretraining step 137 took 12.0 s, median 0.12 s — the machine may be shared" in text
    plain, _ = view(run, tty=False)
    assert "slow: critic pretraining step 137 took 12.0 s" in plain.plain()
    # the step under way: no step has ended for 40 s while a step takes 0.12 s
    beat_doing(run, "warm_start", NOW - 38, last_at=NOW - 40, **pace)
    assert "slow: critic pretraining step 138 running for 40s, median step 0.12 s — the machine may be shared" in \
        "\n".join(live.lines())
    # a slow step long past, the next steps at their pace: nothing said
    beat_doing(run, "warm_start", NOW - 1, last_at=NOW - 1, slow={"step": 20, "took_s": 12.0, "median_s": 0.12,
                                                                   "at": NOW - 300}, **pace)
    assert "slow" not in "\n".join(live.lines())
    # a change of threads is said too, and nothing of it once the run ended
    beat_doing(run, "warm_start", NOW - 1, last_at=NOW - 1, threads_change={
        "text": "kept 1 thread: 0.2 s a step against 2.1 s at 2", "at": NOW - 3}, **pace)
    assert "threads: kept 1 thread: 0.2 s a step against 2.1 s at 2" in "\n".join(live.lines())
    assert "threads:" not in "\n".join(live.lines(final=True))


def test_the_heartbeat_carries_what_the_role_says_it_is_doing(tmp_path):
    """RoleContext.doing -> state/<role>/heartbeat -> the live view: nothing before the role came up (its first
    heartbeat: a failure before it stays a start-up failure), then the activity on the heartbeat's second line."""
    from tests.role_context import bare_role_context

    run, ctx = RunDir(tmp_path), bare_role_context(tmp_path, "policy_trainer")
    ctx.doing("loading policy v0")
    assert not run.heartbeat_file("policy_trainer").exists()  # not up yet
    assert ctx.stopping() is False
    first, activity = run.heartbeat_file("policy_trainer").read_text().splitlines()
    assert float(first) > 0 and json.loads(activity)["doing"] == "loading policy v0"
    ctx._last_beat -= 1.0  # as if the last beat was a second ago
    ctx.doing("waiting for batch 1")  # a new activity goes out at once
    assert json.loads(run.heartbeat_file("policy_trainer").read_text().splitlines()[1])["doing"] == \
        "waiting for batch 1"
    live = LiveView(run, 5, out=io.StringIO(), tty=True)
    assert "waiting for batch 1" in by_role(live.lines())["policy_trainer"]


# ------------------------------------------------------------------ the pace of a phase, the warm start's threads
def test_pace_flags_a_step_many_times_its_median():
    from prime_values.monitor import SLOW_FACTOR, SLOW_MIN_S, Pace

    pace = Pace(clock=lambda: 1000.0)
    for step in range(1, 21):
        assert pace.add(0.1, step) is None
    assert pace.fields()["rate"] == pytest.approx(10.0) and pace.fields()["median_s"] == pytest.approx(0.1)
    assert pace.add(0.3, 21) is None  # 3x: within the usual spread
    assert pace.add(SLOW_MIN_S * 0.9, 22) is None  # many times the median, but under a second: not worth a word
    slow = pace.add(12.0, 23)
    assert slow == {"step": 23, "took_s": 12.0, "median_s": 0.1, "at": 1000.0} and pace.fields()["slow"] == slow
    assert SLOW_FACTOR * 0.1 < 12.0
    chunks = Pace()
    chunks.add(2.0, 128, amount=128)
    chunks.add(2.0, 256, amount=128)
    assert chunks.fields()["rate"] == pytest.approx(64.0) and chunks.fields()["step"] == 256


class SharedMachine:
    """Step times of a simulated 2-core machine: quiet, 2 threads are faster; busy (another process on a core),
    a 2-thread team waits at every barrier and 1 thread is 10x faster (as measured: 16.8 s against 1.65 s)."""

    QUIET = {2: 0.10, 1: 0.16}
    BUSY = {2: 2.0, 1: 0.2}

    def __init__(self):
        self.busy = False


def run_tuner(tuner, machine: SharedMachine, plan: list[tuple[bool, int]]) -> list[int]:
    """Feed `tuner` the steps of `plan` ((busy, steps) spans); returns the thread count of every step."""
    counts = []
    for busy, steps in plan:
        for _ in range(steps):
            counts.append(tuner.threads)
            tuner.add((machine.BUSY if busy else machine.QUIET)[tuner.threads])
    return counts


def test_thread_tuner_keeps_the_faster_count_as_the_load_comes_and_goes():
    from prime_values.monitor import ThreadTuner, thread_ladder

    assert thread_ladder(16) == [16, 8, 4, 2, 1] and thread_ladder(2) == [2, 1] and thread_ladder(1) == [1]
    applied = []
    tuner = ThreadTuner(2, slowdown=3.0, apply=applied.append)
    counts = run_tuner(tuner, SharedMachine(), [(False, 60), (True, 200), (False, 200)])
    quiet, busy, quiet_again = counts[:60], counts[60:260], counts[260:]
    # the phase's first window at 2 threads, a window trying 1 (slower on a quiet machine), back to 2
    assert quiet[:9] == [2] * 9 and 1 in quiet[9:20] and quiet[30:] == [2] * 30
    # the load comes: within a few windows it runs on 1 thread, and stays there but for short trials of 2
    assert busy[30:].count(1) >= 0.85 * len(busy[30:])
    # the load goes: a trial of 2 threads wins again within the re-probe interval
    assert quiet_again[-100:] == [2] * 100
    assert applied and set(applied) == {1, 2} and tuner.changes
    assert any(change.startswith("kept 1 thread:") for change in tuner.changes)
    # a machine that stays busy: each lost trial of 2 threads doubles the wait for the next (64, 128, 256, 256 steps)
    tuner = ThreadTuner(2, slowdown=3.0, apply=lambda n: None)
    counts = run_tuner(tuner, SharedMachine(), [(True, 800), (False, 300)])
    lost = [change for change in tuner.changes if change.startswith("back to 1 thread")]
    assert 3 <= len(lost) <= 4 and counts[:800].count(2) <= 9 + 4 * 9
    assert counts[-30:] == [2] * 30  # and the quiet machine gets its 2 threads back within 4 x 64 steps


@pytest.mark.parametrize("value,ok", [(0, True), (3.0, True), (1.5, True), (1.2, False), (-1, False)])
def test_solo_threads_slowdown_is_zero_or_at_least_one_and_a_half(value, ok):
    from omegaconf import OmegaConf

    from prime_values.config import Config, ConfigError, validate

    cfg = OmegaConf.structured(Config)
    cfg.topology.solo_threads_slowdown = value
    if ok:
        validate(cfg, cuda_count=0, environment=False)
    else:
        with pytest.raises(ConfigError, match=r"topology.solo_threads_slowdown=-?1(\.[02])? must be"):
            validate(cfg, cuda_count=0, environment=False)


def test_thread_tuner_off_or_single_threaded_never_changes():
    from prime_values.monitor import ThreadTuner

    for tuner in (ThreadTuner(2, slowdown=0.0, apply=pytest.fail), ThreadTuner(1, slowdown=3.0, apply=pytest.fail)):
        counts = run_tuner(tuner, SharedMachine(), [(False, 30), (True, 100)])
        assert set(counts) == {tuner.threads} and not tuner.changes


def test_thread_tuner_new_phase_measures_again_and_keeps_the_count():
    from prime_values.monitor import ThreadTuner

    tuner = ThreadTuner(2, slowdown=3.0, apply=lambda n: None)
    run_tuner(tuner, SharedMachine(), [(True, 40)])
    assert tuner.threads == 1
    tuner.new_phase()  # critic pretraining after SFT: other step times, the same machine
    assert tuner.threads == 1 and tuner.reference is None
    counts = run_tuner(tuner, SharedMachine(), [(True, 30)])
    assert counts == [1] * 30
    # a phase that ends during a trial (SFT stopped early) leaves the count the trial started from: it decided nothing
    tuner = ThreadTuner(2, slowdown=3.0, apply=lambda n: None)
    assert run_tuner(tuner, SharedMachine(), [(False, 12)])[-1] == 1 and tuner.trial is not None
    tuner.new_phase()
    assert tuner.threads == 2 and tuner.trial is None


# ------------------------------------------------------------------ the summary: no library's log lines under it
HYDRA_LOGGING = """
import logging.config, sys
from pathlib import Path

import hydra
import yaml

# the conductor's logging as Hydra's job logging sets it up: every logger's INFO to stdout (and a log file)
config = yaml.safe_load((Path(hydra.__file__).parent / "conf/hydra/job_logging/default.yaml").read_text())
config["handlers"]["file"]["filename"] = sys.argv[2]
logging.config.dictConfig(config)
"""


def test_the_summary_ends_without_library_log_lines(tmp_path):
    """The conductor's end of a run (prime_values.conductor.report) under Hydra's job logging, with an empty
    MPLCONFIGDIR so that matplotlib rebuilds its font cache and logs 'generated new fontManager' at INFO: no
    '[matplotlib' line may land in the summary. Run in a fresh process (matplotlib builds the cache once per
    process and configuration directory)."""
    import subprocess

    run = make_run(tmp_path)
    script = HYDRA_LOGGING + """
from prime_values.conductor import report
from prime_values.rundir import RunDir
from prime_values.tools.summary import summarise

run = RunDir(sys.argv[1])
report(run, summarise(run, status="finished"), plots=True)
logging.getLogger("prime_values.conductor").info("our own INFO still shows")
"""
    mpl = tmp_path / "mplconfig"
    mpl.mkdir()
    result = subprocess.run([sys.executable, "-c", script, str(run.root), str(tmp_path / "conductor.log")],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "MPLCONFIGDIR": str(mpl), "HF_HUB_OFFLINE": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert list(mpl.glob("fontlist-*.json")), "matplotlib did not rebuild its font cache: the test shows nothing"
    assert "report " in result.stdout and (run.report / "learning.png").exists()
    assert "[matplotlib" not in output, output[-3000:]
    assert "our own INFO still shows" in result.stdout


def test_library_info_records_stay_off_the_console_ours_and_warnings_do_not(capsys):
    import logging

    from prime_values.conductor import quiet_libraries

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("[%(name)s][%(levelname)s] - %(message)s"))
    saved = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    added = []
    try:
        added = quiet_libraries()
        assert not quiet_libraries()  # idempotent: one filter per handler
        assert len(handler.filters) == 1
        logging.getLogger("somelib.cache").info("built a cache")
        logging.getLogger("somelib").warning("a library's warning")
        logging.getLogger("prime_values.conductor").info("our own news")
        logging.getLogger("hydra.launcher").info("Launching 2 jobs locally")
    finally:  # pytest's own handlers got the filter too: later tests of this process must see every record
        for h, f in added:
            h.removeFilter(f)
        root.removeHandler(handler)
        root.setLevel(saved)
    out = capsys.readouterr().out
    assert "built a cache" not in out
    assert "[somelib][WARNING] - a library's warning" in out and "our own news" in out and "Launching 2 jobs" in out


@pytest.mark.slow  # the real warm start of a tiny model, twice 12 steps (~15-30 s on 2 cores)
def test_the_warm_start_reports_its_phases_and_thread_trials(tmp_path):
    """The warm start (roles/warm_start.py, Phases) on 2 threads: its heartbeat ends on its last phase, its metrics
    carry the threads, and each tuned phase tries 1 thread after its first 1 + 8 steps (ThreadTuner: a trial
    whatever the step times, so this does not depend on how loaded the machine is)."""
    import subprocess

    from omegaconf import OmegaConf

    from prime_values.monitor import read_metrics
    from tests.e2e_helpers import REPO, SMALL, compose, env_for_runs

    root = tmp_path / "run"
    root.mkdir()
    (root / "config.yaml").write_text(OmegaConf.to_yaml(compose([
        *SMALL, "policy.warm_start.steps=12", "policy.warm_start.check_every=5",
        "policy.warm_start.target_accuracy=0.99",
        "critic.warm_start.steps=12", "critic.warm_start.rollouts=16", "topology.solo_threads_slowdown=3"])))
    result = subprocess.run([sys.executable, "-c", "import sys; from prime_values.roles.warm_start import main; "
                             "main(sys.argv[1])", str(root)], cwd=REPO, capture_output=True, text=True, timeout=600,
                            env=env_for_runs({"OMP_NUM_THREADS": "2"}))
    assert result.returncode == 0, result.stderr[-3000:]
    first, activity = (root / "state" / "warm_start" / "heartbeat").read_text().splitlines()
    assert float(first) > 0 and json.loads(activity)["doing"] == "publishing critic v0"
    metrics = read_metrics(root / "metrics" / "warm_start.jsonl")
    assert [m["sft_step"] for m in metrics if "sft_step" in m] == [5, 10, 12]
    assert all(m["threads"] in (1, 2) for m in metrics if "sft_step" in m or "critic_pretrain_step" in m)
    trials = [(m["threads_phase"], m["threads_step"], m["threads"], m["threads_change"]) for m in metrics
              if "threads_change" in m]
    assert [t[:3] for t in trials] == [("SFT", 9, 1), ("critic pretraining", 9, 1)], trials
    assert all(t[3].startswith("trying 1 thread (the phase's first steps; steps at 2: ") for t in trials)
