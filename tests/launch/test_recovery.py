"""Fault handling of the conductor's jobs: the cause of a role's end read from its exit state at once, the restart
budget as a rate, and the command-line tools answering --help. Real processes (submitit jobs under our
controller); no pipeline is run here (tests/e2e/test_pipeline.py and tests/launch/test_chaos.py do that)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from prime_values.launch import descendants
from prime_values.launch.local import LocalRoleExecutor, last_error_line

ROOT = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("importable_tests")  # jobs run this module's functions


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def _raise() -> None:
    raise ValueError("the answer column is missing")


def _log_error_and_exit() -> None:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s role %(levelname)s %(message)s")
    logging.getLogger("t").error("could not open the rollout log")
    logging.getLogger("t").info("attention: sdpa (flash-attn not installed)")  # the last line, not the cause
    sys.stderr.flush()
    os._exit(3)


@pytest.fixture
def no_result_wait(monkeypatch):
    """How a killed job's end is seen at once, as behaviour rather than a clock: `exit_cause` answers from the job's
    exit state and never asks submitit's `result()`/`results()`/`exception()`, which poll up to 15 s for the result
    pickle a SIGKILLed task never writes (here they fail the test instead)."""
    def waiting(self, *args, **kwargs):
        raise AssertionError("exit_cause waited on submitit's result pickle")
    for name in ("result", "results", "exception"):
        monkeypatch.setattr(LocalRoleExecutor.job_class, name, waiting)


def _submit(tmp_path: Path, fn, tasks: int = 1, *args, fork_server=None):  # jobs/<fn name>: as a role job folder
    executor = LocalRoleExecutor(folder=tmp_path / "jobs" / fn.__name__, fork_server=fork_server)
    executor.update_parameters(timeout_min=5, tasks_per_node=tasks)
    return executor.submit(fn, *args)


def _wait_end(job, timeout: float = 30.0) -> tuple[float, str | None]:
    began = time.time()
    while time.time() - began < timeout:
        ended, cause = job.exit_cause()
        if ended:
            return time.time() - began, cause
        time.sleep(0.02)
    raise AssertionError(f"job {job.job_id} did not end within {timeout} s")


def test_a_killed_rank_is_seen_at_once_and_its_sibling_ended(tmp_path, no_result_wait):
    """A SIGKILLed task of a two-process job: the job's end is read from its exit state (no result wait), the cause
    says 'killed by signal 9', and the other process does not outlive it."""
    job = _submit(tmp_path, _sleep, 2, 120.0)
    deadline = time.time() + 30
    while len(tasks := descendants(int(job.job_id))) < 2 and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    os.kill(tasks[0], signal.SIGKILL)
    took, cause = _wait_end(job)
    assert cause == "killed by signal 9", cause
    assert not descendants(int(job.job_id)) and job.done()
    for pid in tasks:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_killed_controller_takes_its_tasks_with_it(tmp_path, no_result_wait):
    job = _submit(tmp_path, _sleep, 1, 120.0)
    deadline = time.time() + 30
    while not (tasks := descendants(int(job.job_id))) and time.time() < deadline:
        time.sleep(0.05)
    os.kill(int(job.job_id), signal.SIGKILL)
    took, cause = _wait_end(job)
    assert cause == "killed by signal 9", (cause, took)
    deadline = time.time() + 5
    while time.time() < deadline and any(os.path.exists(f"/proc/{pid}") and
                                         "Z" not in open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1][:3]
                                         for pid in tasks):
        time.sleep(0.05)
    assert not [p for p in tasks if os.path.exists(f"/proc/{p}") and "Z" not in
                open(f"/proc/{p}/stat").read().rsplit(")", 1)[1][:3]], "an orphaned task outlived its controller"


def test_the_cause_is_the_error_not_the_last_log_line(tmp_path):
    took, cause = _wait_end(_submit(tmp_path, _raise))
    assert cause == "exit code 1: ValueError: the answer column is missing", cause
    _, cause = _wait_end(_submit(tmp_path, _log_error_and_exit))
    assert cause == "exit code 3: role ERROR could not open the rollout log", cause
    _, cause = _wait_end(_submit(tmp_path, _sleep, 1, 0.1))
    assert cause is None  # a clean exit


def test_last_error_line():
    trace = "INFO start\nTraceback (most recent call last):\n  File \"x.py\", line 1, in f\n    g()\n" \
            "RuntimeError: boom\nINFO after"
    assert last_error_line(trace) == "RuntimeError: boom"
    assert last_error_line("2026-01-01 10:00:00,123 x ERROR disk full\n... INFO fine") == "x ERROR disk full"
    assert last_error_line("just INFO lines\n") is None


class _FakeJob:
    """What the conductor reads of a job when it schedules a restart (its log path and start time)."""

    def __init__(self):
        self.paths = SimpleNamespace(stderr="/nonexistent/log.err")
        self.started_at = time.time()


def _fleet(tmp_path, **launcher):
    from prime_values.rundir import RunDir
    from prime_values.supervisor import RoleJob, Supervisor

    defaults = {"name": "local", "max_restarts": 2, "restart_window_s": 100.0, "restart_backoff_s": 2.0}
    cfg = SimpleNamespace(launcher=SimpleNamespace(**{**defaults, **launcher}))
    fleet = Supervisor(RunDir(tmp_path), cfg)
    fleet.run.restarts_file.parent.mkdir(parents=True, exist_ok=True)
    launched = []
    fleet._launch = lambda role_job: launched.append(time.time())  # no real role here: count the resubmissions
    job = RoleJob("inference0", "inference", _FakeJob())
    fleet.jobs.append(job)
    return fleet, job, launched


def test_restart_budget_is_a_rate(tmp_path, monkeypatch, capsys):
    from prime_values.supervisor import RoleFailed

    clock = [1000.0]
    monkeypatch.setattr(time, "time", lambda: clock[0])
    fleet, job, launched = _fleet(tmp_path)
    fleet.run.heartbeat_file("inference0").parent.mkdir(parents=True)
    fleet.run.heartbeat_file("inference0").write_text("1\n")  # it came up: restarts are immediate
    os.utime(fleet.run.heartbeat_file("inference0"), (2000.0, 2000.0))
    fleet._schedule_restart(job, "killed by signal 9")
    clock[0] += 10
    fleet._schedule_restart(job, "killed by signal 9")
    assert len(launched) == 2 and job.restart_at is None  # both at once, no backoff
    assert "restarting it in 0 s (2/2); at most 2 per 100 s" in capsys.readouterr().out
    clock[0] += 10
    with pytest.raises(RoleFailed, match=r"killed by signal 9 .*after 2 restarts in 100 s \(launcher.max_restarts=2 "
                                         r"per launcher.restart_window_s=100\)"):
        fleet._schedule_restart(job, "killed by signal 9")
    fleet, job, launched = _fleet(tmp_path)
    for _ in range(5):  # one kill every 60 s: never more than 2 in any 100 s window, so never out of budget
        clock[0] += 60
        fleet._schedule_restart(job, "preempted")
    assert job.restarts == 5 and len(launched) == 5
    fleet, job, launched = _fleet(tmp_path, restart_window_s=None)  # null: the whole run, as max_restarts was
    fleet._schedule_restart(job, "x")
    clock[0] += 1e6
    fleet._schedule_restart(job, "x")
    with pytest.raises(RoleFailed):
        clock[0] += 1e6
        fleet._schedule_restart(job, "x")


def test_a_crash_loop_backs_off(tmp_path, monkeypatch):
    """No heartbeat since the job started: the first restart is still immediate, the next ones wait
    restart_backoff_s, doubled."""
    fleet, job, launched = _fleet(tmp_path, max_restarts=10)
    fleet._schedule_restart(job, "killed by signal 9")
    assert len(launched) == 1 and job.restart_at is None
    now = time.time()
    fleet._schedule_restart(job, "killed by signal 9")
    assert len(launched) == 1 and 1.5 < job.restart_at - now < 2.5
    job.restart_at = None
    fleet._schedule_restart(job, "killed by signal 9")
    assert 3.5 < job.restart_at - now < 4.5


def _tools() -> list[str]:
    """Every `python -m prime_values...` entry point: the package, and each module with a __main__ guard."""
    found = ["prime_values"]
    for path in sorted((ROOT / "prime_values").rglob("*.py")):
        if path.name != "__init__.py" and 'if __name__ == "__main__":' in path.read_text():
            module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if module != "prime_values.__main__":
                found.append(module)
    return found


@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_every_tool_answers_help():
    tools = _tools()
    assert {f"prime_values.tools.{name}" for name in ("status", "chaos", "check", "report", "show")} <= set(tools)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    procs = {m: subprocess.Popen([sys.executable, "-m", m, "--help"], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT) for m in tools}
    failed = {}
    for module, proc in procs.items():
        out, _ = proc.communicate(timeout=180)
        if proc.returncode != 0 or not out.strip():
            failed[module] = (proc.returncode, out[-300:])
    assert not failed, failed


def test_cfg_job_prints_a_slurm_config_without_sbatch(tmp_path):
    # a PATH with no SLURM commands (the local cluster of tests/launch/test_slurm.py may have installed them)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "PATH": str(Path(sys.executable).parent)}
    result = subprocess.run([sys.executable, "-m", "prime_values", "+experiment=arith", "launcher=slurm",
                             "--cfg", "job"], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=180)
    assert result.returncode == 0, result.stderr
    assert "name: slurm" in result.stdout


@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_jobs_forked_from_the_fork_server(tmp_path, no_result_wait):
    """launcher.fork_server: the job runs in a process forked from the pre-imported server (no fresh interpreter),
    with the same exit causes, the run directory on its command line, and nothing left when the server closes."""
    from prime_values.launch.zygote import ZygoteClient, ZygoteJob

    server = ZygoteClient(tmp_path)
    try:
        assert server.ready(wait_s=120), "the fork server did not come up"
        job = _submit(tmp_path, _raise, fork_server=server)
        assert isinstance(job._process, ZygoteJob)
        took, cause = _wait_end(job)
        assert cause == "exit code 1: ValueError: the answer column is missing", (cause, took)
        job = _submit(tmp_path, _sleep, 1, 120.0, fork_server=server)
        deadline = time.time() + 10
        while not (tasks := descendants(int(job.job_id))) and time.time() < deadline:
            time.sleep(0.02)
        assert tasks and str(tmp_path) in open(f"/proc/{tasks[0]}/cmdline").read().replace("\0", " ")
        from prime_values.tools.chaos import role_pids

        assert set(role_pids(tmp_path, "_sleep")) >= {int(job.job_id), *tasks}
        os.kill(tasks[0], signal.SIGKILL)
        took, cause = _wait_end(job)
        assert cause == "killed by signal 9", (cause, took)
    finally:
        server.close()
    assert server.process.poll() is not None


class _EndedJob(_FakeJob):
    def __init__(self, cause):
        super().__init__()
        self.cause = cause

    def exit_cause(self):
        return True, self.cause

    def done(self):
        return True


def test_roles_ending_after_a_stop_request_are_not_restarted(tmp_path, capsys):
    from prime_values.rundir import StopReason
    from prime_values.supervisor import StopRequested

    fleet, job, launched = _fleet(tmp_path)
    job.job = _EndedJob(None)  # it exited cleanly because it was told to stop
    fleet.run.request_stop(StopReason.USER)
    with pytest.raises(StopRequested):
        fleet.check()
    assert not launched and "restarting" not in capsys.readouterr().out


def test_every_dead_role_is_restarted_in_one_pass_and_the_trainer_end_wins(tmp_path, capsys):
    from prime_values.supervisor import RoleJob

    fleet, job, launched = _fleet(tmp_path)
    job.job = _EndedJob("killed by signal 9")
    other = RoleJob("evaluator", "evaluator", _EndedJob("exit code 1: RuntimeError: x"))
    fleet.jobs.append(other)
    assert fleet.check() is None and len(launched) == 2  # both resubmitted in the same pass
    out = capsys.readouterr().out
    assert "role inference0 failed: killed by signal 9" in out and "role evaluator failed: exit code 1" in out
    trainer = RoleJob("policy_trainer", "policy_trainer", _EndedJob(None))
    fleet.jobs.append(trainer)
    fleet.run.done_file("policy_trainer").parent.mkdir(parents=True, exist_ok=True)
    fleet.run.done_file("policy_trainer").write_text("{}")
    assert fleet.check() is trainer  # the run's end: nothing else is restarted with it
    assert len(launched) == 2
