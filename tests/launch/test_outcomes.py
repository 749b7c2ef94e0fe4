"""How a run ends: the outcome the conductor, the submitter and the stages return, the one table that turns it into
an exit code (prime_values.__main__), and the stop file's reason (prime_values.rundir.StopReason)."""

from __future__ import annotations

import json
import signal
import time

import pytest
from omegaconf import OmegaConf

from prime_values.__main__ import EXIT_CODES, exit_code
from prime_values.rundir import RunDir, StopReason
from prime_values.supervisor import Ending, Outcome


def test_every_ending_has_an_exit_code_and_only_bad_ones_are_not_zero():
    assert {ending.value for ending in Ending} == set(EXIT_CODES)
    for ending in Ending:
        assert (exit_code(Outcome(ending)) != 0) == Outcome(ending).failed, ending
    assert [exit_code(Outcome(e)) for e in (Ending.FINISHED, Ending.STOPPED, Ending.FAILED, Ending.INTERRUPTED,
                                            Ending.BAD_CONFIG)] == [0, 0, 1, 1, 2]


def test_the_stop_file_holds_a_reason_and_reads_back(tmp_path):
    run = RunDir(tmp_path)
    assert run.stop_reason() is None
    run.request_stop(StopReason.USER)
    assert run.stop_reason() is StopReason.USER
    assert json.loads(run.stop_file.read_text())["detail"] == \
        "stop requested by the user (prime_values.tools.status --stop)"
    run.request_stop("chaos: 5 kills done")  # a tool's own words: kept as the detail of OTHER
    assert run.stop_reason() is StopReason.OTHER
    assert json.loads(run.stop_file.read_text())["detail"] == "chaos: 5 kills done"


@pytest.mark.parametrize("text", ['{"reason": "stop requested by the user (prime_values.tools.status --stop)"}',
                                  '{"reason": "interrupted by the user", "at": 1}', "not json", "[1, 2]", ""])
def test_an_older_or_unreadable_stop_file_reads_as_other(tmp_path, text):
    run = RunDir(tmp_path)
    run.stop_file.parent.mkdir(parents=True)
    run.stop_file.write_text(text)
    assert run.stop_requested() and run.stop_reason() is StopReason.OTHER


@pytest.mark.parametrize("reason, kept", [(StopReason.USER, True), (StopReason.USER_INTERRUPT, True),
                                          (StopReason.STOPPED, True), (StopReason.FINISHED, False),
                                          (StopReason.INTERRUPTED, False), (StopReason.FAILED, False),
                                          ("an older run's text", False)])
def test_a_fresh_allocation_keeps_only_a_stop_the_user_asked_for(tmp_path, monkeypatch, reason, kept):
    from prime_values import conductor
    from prime_values.launch.slurm import ALLOCATION_ENV

    monkeypatch.setenv(ALLOCATION_ENV, "")  # restored after the test (the batch step sets it)
    monkeypatch.setattr(conductor, "drive", lambda run_dir: {"status": "finished"})
    handler = signal.getsignal(signal.SIGTERM)
    run = RunDir(tmp_path)
    run.request_stop(reason)
    try:
        assert conductor._allocation_main(str(tmp_path)) == {"status": "finished"}
    finally:
        signal.signal(signal.SIGTERM, handler)
    assert run.stop_requested() == kept


def test_a_conductor_job_fails_with_its_run(tmp_path, monkeypatch):
    from prime_values import conductor

    monkeypatch.setattr(conductor, "load_saved", lambda path: OmegaConf.create({"launcher": {"name": "local"}}))
    for ending, fails in ((Ending.FAILED, True), (Ending.INTERRUPTED, True), (Ending.STOPPED, False)):
        monkeypatch.setattr(conductor, "run_roles", lambda run, cfg, e=ending: Outcome(e, "why", {"status": e.value}))
        if fails:
            with pytest.raises(conductor.RunFailed, match=r"^the run failed; see .*summary\.json$"):
                conductor.drive(str(tmp_path))
        else:
            assert conductor.drive(str(tmp_path)) == {"status": "stopped"}


def _until_stopped(run_dir: str) -> dict:
    """A stage job that works until the run's stop file appears (as sft and eval check `StageContext.stopping`)."""
    from prime_values.stages.common import StageStopped

    while not RunDir(run_dir).stop_requested():
        time.sleep(0.05)
    raise StageStopped("the run was stopped")


def test_a_stage_job_stops_through_the_run_stop_file_and_ignores_an_old_one(tmp_path, importable_tests):
    """A stop file left from before (the rl stage's end writes one) does not stop the next stage job; one written
    while it runs (`status --stop`) stops it through the supervisor, and the stage ends stopped, not failed."""
    import threading

    from prime_values.stages.common import StageStopped, run_stage_job

    run = RunDir(tmp_path / "run")
    run.request_stop(StopReason.FINISHED)
    cfg = OmegaConf.create({"launcher": {"name": "local", "poll_s": 0.1, "stop_grace_s": 5, "timeout_min": 5}})
    threading.Timer(3.0, lambda: run.request_stop(StopReason.USER)).start()
    with pytest.raises(StageStopped, match=r"^stage eval stopped: stop requested through .*STOP$"):
        run_stage_job(run, cfg, "eval", _until_stopped, "cpu")
    assert run.stop_reason() is StopReason.STOPPED  # the supervisor's stop, as after a run's roles
