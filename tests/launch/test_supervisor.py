"""The supervisor's rules (prime_values/supervisor.py) on real processes: a deterministic start-up error ends the run,
a fork-server death is not charged to the roles forked from it, a hung (SIGSTOPped) role is killed and restarted
while a slow start is not taken for a hang and the hang limit scales with the silences a role showed, a role's
failed background thread ends it with that error; signals never reach a reused pid; the fork server never
outlives a failed conductor; submitit's private method we override is the one we know."""

from __future__ import annotations

import configparser
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import psutil
import pytest

from prime_values.launch import kill_tree, signal_tree
from prime_values.launch.local import LocalRoleExecutor
from prime_values.rundir import RunDir
from prime_values.supervisor import RoleFailed, RoleJob, Supervisor
from tests.e2e_helpers import REPO, SMALL, env_for_runs, processes_mentioning, seed_version_zero

GUARD_S = 180  # how long a test waits for something that must happen before it calls it broken (not a speed bound)


pytestmark = pytest.mark.usefixtures("importable_tests")  # jobs run this module's functions


def beat_forever(run_dir: str, name: str) -> None:
    """A role that is alive: it writes its heartbeat every 0.1 s, as a role's loop does."""
    path = RunDir(run_dir).heartbeat_file(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        path.write_text(f"{time.time()}\n")
        time.sleep(0.1)


def sleep_forever(run_dir: str, name: str) -> None:
    time.sleep(3600)


START_S_ENV = "PV_TEST_START_S"  # how long `start_slowly_then_beat` takes to come up


def start_slowly_then_beat(run_dir: str, name: str) -> None:
    """A role whose start-up (imports, a rendezvous, loading: a minute or more on a loaded machine) is longer than
    launcher.hang_timeout_s: silent for PV_TEST_START_S seconds, then it beats as `beat_forever`."""
    time.sleep(float(os.environ[START_S_ENV]))
    beat_forever(run_dir, name)


class _Jobs(Supervisor):
    """A supervisor whose roles are this module's functions (real submitit jobs under our controller)."""

    target = staticmethod(sleep_forever)

    def _launch(self, role_job: RoleJob) -> None:
        executor = LocalRoleExecutor(folder=self.run.jobs / role_job.name,
                                     fork_server=self.launch.fork_server if self.launch else None)
        executor.update_parameters(timeout_min=30, tasks_per_node=1)
        role_job.job = executor.submit(self.target, str(self.run.root), role_job.name)


def _supervisor(tmp_path, cls=Supervisor, **launcher) -> Supervisor:
    defaults = {"name": "local", "max_restarts": 5, "restart_window_s": 3600.0, "restart_backoff_s": 0.0,
                "hang_timeout_s": None, "start_timeout_s": 1800.0, "hang_quiet_factor": 3.0}
    run = RunDir(tmp_path)
    run.mkdirs()
    run.restarts_file.parent.mkdir(parents=True, exist_ok=True)
    return cls(run, SimpleNamespace(launcher=SimpleNamespace(**{**defaults, **launcher})))


def _until(condition, what: str):
    deadline = time.time() + GUARD_S
    while time.time() < deadline:
        if value := condition():
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {GUARD_S} s")


class _Fake:
    def __init__(self):
        self.paths = SimpleNamespace(stderr="/nonexistent/log.err")
        self.started_at = time.time()


def test_the_same_error_twice_before_coming_up_ends_the_run(tmp_path, capsys):
    """Twice the same exception, both before the first heartbeat: not restarted again (and the budget is far from
    spent). A different error, a signal, or the same error after the role came up: restarted as before."""
    supervisor = _supervisor(tmp_path)
    launched = []
    supervisor._launch = lambda role_job: launched.append(role_job.name)
    job = RoleJob("warm_start", "warm_start", _Fake())
    supervisor.jobs.append(job)
    error = "exit code 1: ValueError: digits must be in 1..9"
    supervisor._schedule_restart(job, error)
    assert launched == ["warm_start"]
    with pytest.raises(RoleFailed, match=r"failed twice with the same error before it came up .*: exit code 1: "
                                         r"ValueError: digits must be in 1\.\.9 \(log: /nonexistent/log.err\)$"):
        supervisor._schedule_restart(job, error)
    assert launched == ["warm_start"] and job.finished

    other = RoleJob("inference0", "inference", _Fake())
    supervisor.jobs.append(other)
    for cause in ("exit code 1: ImportError: a", "exit code 1: OSError: b", "killed by signal 9", "killed by signal 9"):
        supervisor._schedule_restart(other, cause)  # no two equal exceptions in a row: a crash loop, not fatal
    assert other.restarts == 4 and not other.finished
    came_up = RoleJob("orchestrator", "orchestrator", _Fake())
    supervisor.jobs.append(came_up)
    supervisor.run.heartbeat_file("orchestrator").parent.mkdir(parents=True, exist_ok=True)
    supervisor.run.heartbeat_file("orchestrator").write_text("1\n")  # it came up (after its start)
    supervisor._schedule_restart(came_up, error)
    supervisor._schedule_restart(came_up, error)
    assert came_up.restarts == 2 and not came_up.finished
    assert "restarting it in 0 s (2/5)" in capsys.readouterr().out


class _Clock:
    """The supervisor's clock (its module's `time`), moved by hand; heartbeats are written at its times."""

    def __init__(self, monkeypatch, run: RunDir, name: str, now: float = 10_000.0):
        import prime_values.supervisor as supervisor_module

        self.now, self.path = now, run.heartbeat_file(name)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(supervisor_module, "time", SimpleNamespace(time=lambda: self.now))

    def beat(self, after_s: float = 0.0) -> None:
        self.now += after_s
        self.path.write_text(f"{self.now}\n")
        os.utime(self.path, (self.now, self.now))


def _watched(tmp_path, monkeypatch, **launcher) -> tuple[Supervisor, RoleJob, _Clock, list]:
    """A supervisor over one fake role job started now (its heartbeat: the one its predecessor left, 1 s ago); the
    jobs it kills are listed instead."""
    import prime_values.supervisor as supervisor_module

    supervisor = _supervisor(tmp_path, **launcher)
    clock = _Clock(monkeypatch, supervisor.run, "policy_trainer")
    clock.beat()  # the last beat of the job this one replaces, a second before its start
    clock.now += 1.0
    killed = []
    monkeypatch.setattr(supervisor_module, "kill_job", killed.append)

    def launch(role_job):
        role_job.job = _Fake()
        role_job.job.started_at = clock.now

    supervisor._launch = launch
    return supervisor, supervisor.submit("policy_trainer", "policy_trainer", "cpu"), clock, killed


def test_a_slow_start_is_not_taken_for_a_hang(tmp_path, monkeypatch):
    """Until its first heartbeat since its start a role is starting (an srun step, imports, a rendezvous, loading
    models: a minute or more on a loaded machine), held to launcher.start_timeout_s, not to hang_timeout_s; the beat
    its predecessor left just before it started is not its own. Once it beat, hang_timeout_s holds it."""
    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=3.0, start_timeout_s=120.0)
    for _ in range(119):
        clock.now += 1.0
        supervisor._kill_if_hung(role)
    assert not killed and role.hung is None  # 119 s without a beat, 3 s of hang_timeout_s: still starting
    clock.now += 2.0
    supervisor._kill_if_hung(role)
    assert killed == [role.job] and role.hung == ("hung: no heartbeat for 121 s since its start, before it came up "
                                                  "(launcher.start_timeout_s=120)")

    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=3.0, start_timeout_s=120.0)
    clock.beat(after_s=60.0)  # came up after a minute
    supervisor._kill_if_hung(role)
    clock.now += 2.5
    supervisor._kill_if_hung(role)
    assert not killed
    clock.now += 1.0
    supervisor._kill_if_hung(role)
    assert killed == [role.job] and role.hung == "hung: no heartbeat for 4 s (launcher.hang_timeout_s=3)"

    # start_timeout_s is never less than hang_timeout_s; a null hang_timeout_s turns both off
    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=60.0, start_timeout_s=10.0)
    clock.now += 59.0
    supervisor._kill_if_hung(role)
    assert not killed
    clock.now += 2.0
    supervisor._kill_if_hung(role)
    assert role.hung == ("hung: no heartbeat for 61 s since its start, before it came up (launcher.hang_timeout_s=60, "
                         "more than launcher.start_timeout_s=10)")
    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=None, start_timeout_s=10.0)
    clock.now += 1e6
    supervisor._kill_if_hung(role)
    assert not killed


def test_the_hang_limit_scales_with_the_silences_a_role_showed(tmp_path, monkeypatch):
    """A role that came back from a silence of q seconds between two heartbeats (a step or an evaluation on this
    machine, under its present load) is taken for hung after launcher.hang_quiet_factor x q once that is longer
    than hang_timeout_s. The supervisor polls: it never counts more silence than it saw (its polls are late on a
    loaded machine, so beats between two of them are missed), and the silence before the first beat is start-up."""
    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=3.0, hang_quiet_factor=3.0)
    clock.beat(after_s=100.0)  # start-up: not a silence of the running role
    supervisor._kill_if_hung(role)
    clock.beat(after_s=10.0)  # beat again 10 s later, but the supervisor did not look in between: 0 s seen
    supervisor._kill_if_hung(role)
    assert role.longest_quiet == 0.0
    for _ in range(5):  # a step of 2.5 s, watched every 0.5 s
        clock.now += 0.5
        supervisor._kill_if_hung(role)
    clock.beat()
    supervisor._kill_if_hung(role)
    assert role.longest_quiet == 2.5 and not killed
    for _ in range(14):  # a step of 7 s: under 3 x 2.5
        clock.now += 0.5
        supervisor._kill_if_hung(role)
    clock.beat()
    supervisor._kill_if_hung(role)
    assert role.longest_quiet == 7.0 and not killed
    clock.now += 21.0  # 3 x 7 s: still within the limit
    supervisor._kill_if_hung(role)
    assert not killed
    clock.now += 1.0
    supervisor._kill_if_hung(role)
    assert killed == [role.job] and role.hung == ("hung: no heartbeat for 22 s (launcher.hang_quiet_factor=3 x its "
                                                  "longest silence in this run, 7.0 s, more than "
                                                  "launcher.hang_timeout_s=3)")
    # what the role showed outlives its restarts: it is the machine's pace, not one process's
    supervisor._start(role)
    assert role.longest_quiet == 7.0

    supervisor, role, clock, killed = _watched(tmp_path, monkeypatch, hang_timeout_s=3.0, hang_quiet_factor=None)
    clock.beat(after_s=1.0)
    supervisor._kill_if_hung(role)
    for _ in range(5):
        clock.now += 0.5
        supervisor._kill_if_hung(role)
    clock.beat()
    supervisor._kill_if_hung(role)
    clock.now += 3.5
    supervisor._kill_if_hung(role)
    assert role.hung == "hung: no heartbeat for 4 s (launcher.hang_timeout_s=3)"  # null: hang_timeout_s alone


@pytest.mark.slow  # a real run's start (~15 s on 2 cores)
def test_a_deterministic_start_up_error_ends_the_run_at_once(tmp_path):
    """A warm start that fails the same way before its first heartbeat (the roles' fault hook, PRIME_VALUES_FAULT:
    what the config check cannot see, such as a broken install) is restarted once, then the run ends with one line
    naming the error, instead of restarting until its budget of 5 runs out."""
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "prime_values", "+experiment=arith", f"hydra.run.dir={run_dir}",
                             "log.plots=false"], capture_output=True, text=True,
                            env=env_for_runs({"PRIME_VALUES_FAULT": "warm_start"}), cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout[-2000:]
    assert result.stdout.count("restarting it") == 1, result.stdout
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("prime_values: role warm_start failed twice with the same error before it came up"), last
    assert "RuntimeError: injected fault in role warm_start" in last and str(run_dir / "jobs" / "warm_start") in last
    assert json.loads((run_dir / "control" / "restarts.json").read_text()) == {"warm_start": 1}
    assert not processes_mentioning(str(run_dir))


@pytest.mark.slow  # the fork server's imports (~6-10 s on 2 cores)
def test_a_fork_server_death_is_not_charged_to_its_roles(tmp_path, capsys):
    """Two roles forked from the fork server; the server is SIGKILLed and both die with it. With a restart budget of
    0 any charged restart would fail the run: both come back as fresh processes, uncharged."""
    from prime_values.launch.local import LocalLaunch
    from prime_values.launch.zygote import ZygoteClient, ZygoteJob

    server = ZygoteClient(tmp_path)
    supervisor = _supervisor(tmp_path, _Jobs, max_restarts=0)
    try:
        assert server.ready(wait_s=GUARD_S), "the fork server did not come up"
        supervisor.launch = LocalLaunch(server)
        jobs = [supervisor.submit(name, "inference", "cpu") for name in ("inference0", "orchestrator")]
        assert all(isinstance(j.job._process, ZygoteJob) for j in jobs)
        first = [j.job.job_id for j in jobs]
        os.kill(server.process.pid, signal.SIGKILL)
        server.process.wait()
        _until(lambda: supervisor.check() is None and all(j.restarts == 1 for j in jobs), "both roles restarted")
        out = capsys.readouterr().out
        assert out.count("killed with the fork server (it died)") == 2, out
        assert out.count("not counted: it died with the fork server") == 2, out
        assert all(j.budget.times == [] for j in jobs)
        assert all(not isinstance(j.job._process, ZygoteJob) and j.job.job_id not in first for j in jobs)
        assert all(not j.job.done() for j in jobs)  # the replacements run
        assert json.loads(supervisor.run.restarts_file.read_text()) == {"inference0": 1, "orchestrator": 1}
    finally:
        for role_job in supervisor.jobs:
            kill_tree(role_job.job)
        server.close()


@pytest.mark.slow  # real jobs (~5-10 s on 2 cores)
def test_a_hung_role_is_killed_and_restarted(tmp_path, capsys, monkeypatch):
    """A role that takes twice launcher.hang_timeout_s to start, then beats its heartbeat, is left alone; frozen with
    SIGSTOP (prime_values.tools.chaos --stop) it is killed after launcher.hang_timeout_s (or, had the loaded machine
    kept it silent longer between beats, launcher.hang_quiet_factor times that) and restarted, with the cause
    `hung: no heartbeat for N s`, charged to its budget."""
    from prime_values.tools.chaos import role_processes, signal_role

    class Beating(_Jobs):
        target = staticmethod(start_slowly_then_beat)

    monkeypatch.setenv(START_S_ENV, "6")  # twice launcher.hang_timeout_s before its first heartbeat
    supervisor = _supervisor(tmp_path, Beating, hang_timeout_s=3.0)
    try:
        role = supervisor.submit("policy_trainer", "policy_trainer", "cpu")
        beat = supervisor.run.heartbeat_file("policy_trainer")
        _until(lambda: supervisor.check() is None and beat.exists(), "the first heartbeat")  # watched as it starts
        assert role.restarts == 0 and role.hung is None, "a slow start was taken for a hang"
        assert supervisor.check() is None and role.restarts == 0 and role.hung is None  # beating: alive
        frozen = role_processes(tmp_path, "policy_trainer")
        assert {p.pid for p in frozen} >= {int(role.job.job_id)} and len(frozen) >= 2  # controller and task
        assert signal_role(tmp_path, "policy_trainer", signal.SIGSTOP)
        assert _until(lambda: all(p.status() == psutil.STATUS_STOPPED for p in frozen), "the role frozen")
        _until(lambda: supervisor.check() is None and role.restarts == 1, "the hung role restarted")
        out = capsys.readouterr().out
        assert re.search(r"role policy_trainer failed: hung: no heartbeat for \d+ s \((launcher.hang_quiet_factor=3 "
                         r"x its longest silence in this run, [\d.]+ s, more than )?launcher.hang_timeout_s=3\) "
                         r".*restarting it in 0 s \(1/5\)", out), out
        assert len(role.budget.times) == 1
        assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in frozen)
        restarted_at = time.time()
        _until(lambda: beat.stat().st_mtime > restarted_at, "the replacement's heartbeat")
    finally:
        for role_job in supervisor.jobs:
            kill_tree(role_job.job)


def _failing_thread() -> None:
    raise OSError("the targets log went away")


def test_a_failed_background_thread_ends_the_role_with_its_error(tmp_path):
    from prime_values.roles.common import BackgroundThreadFailed
    from tests.role_context import bare_role_context

    run, ctx = RunDir(tmp_path), bare_role_context(tmp_path, "value_trainer")
    assert not run.heartbeat_file("value_trainer").exists()  # not up before its loop runs
    assert ctx.stopping() is False and run.heartbeat_file("value_trainer").exists()
    ctx.start_thread(_failing_thread).join()
    for poll in (ctx.stopping, ctx.wait):
        with pytest.raises(BackgroundThreadFailed, match=r"background thread '_failing_thread' of role value_trainer "
                                                         r"failed: OSError: the targets log went away") as caught:
            poll()
        assert isinstance(caught.value.__cause__, OSError)


def test_the_value_trainer_ingests_through_the_role_thread():
    """The value trainer's ingest thread is started through RoleContext.start_thread (no bare threading.Thread in
    any role: its failure would go unnoticed while the role keeps beating)."""
    roles = REPO / "prime_values" / "roles"
    assert "ctx.start_thread(ingest," in (roles / "value_trainer.py").read_text()
    assert not [p.name for p in roles.glob("*.py") if p.name != "common.py" and "threading.Thread(" in p.read_text()]


def _raise_thread_error(run_dir: str, name: str) -> None:
    from prime_values.roles.common import RoleContext

    ctx = RoleContext(run_dir, name)
    ctx.start_thread(_failing_thread)
    while not ctx.stopping():
        ctx.wait()


@pytest.mark.slow  # a real job that imports torch (~5-10 s on 2 cores)
def test_a_role_whose_thread_failed_ends_with_that_cause(tmp_path):
    from omegaconf import OmegaConf

    from prime_values.config import Config

    run = RunDir(tmp_path)
    run.mkdirs()
    OmegaConf.save(OmegaConf.structured(Config), run.config)
    executor = LocalRoleExecutor(folder=run.jobs / "value_trainer")
    executor.update_parameters(timeout_min=10, tasks_per_node=1)
    job = executor.submit(_raise_thread_error, str(tmp_path), "value_trainer")
    ended = _until(lambda: (end := job.exit_cause())[0] and end, "the role's end")
    assert ended[1] == ("exit code 1: prime_values.roles.common.BackgroundThreadFailed: background thread "
                        "'_failing_thread' of role value_trainer failed: OSError: the targets log went away"), ended


def test_signals_never_reach_a_reused_pid():
    """A handle taken at a process's start keeps its create time: when the pid now belongs to another process
    (simulated: the handle's identity is an older process of the same pid), nothing is signalled."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        handle = psutil.Process(child.pid)
        stale = psutil.Process(child.pid)
        stale._ident = (child.pid, stale._ident[1] - 100.0)  # the handle of an older process that had this pid
        assert signal_tree(stale, signal.SIGKILL) == []
        assert child.poll() is None and handle.is_running()
        assert [p.pid for p in signal_tree(handle, signal.SIGKILL)] == [child.pid]
        assert child.wait(timeout=GUARD_S) == -signal.SIGKILL
        assert signal_tree(handle, signal.SIGKILL) == []  # ended (and reaped): no pid to reach
    finally:
        if child.poll() is None:
            child.kill()


def test_the_fork_server_starts_last_and_never_outlives_a_failed_conductor(tmp_path, monkeypatch):
    """`prepare` starts the fork server after every step that can raise; `conduct` stops it on every way out (one
    multirun point after another comes through here)."""
    from prime_values import conductor
    from tests.e2e_helpers import compose

    started = []

    class Recorder:
        def __init__(self, run_dir):
            started.append(self)
            self.closed = False

        def close(self):
            self.closed = True

    monkeypatch.setattr(conductor, "ZygoteClient", Recorder)
    cfg = compose(["+experiment=arith", "launcher.fork_server=true"])

    def broken(_cfg):
        raise RuntimeError("the derived facts could not be computed")

    monkeypatch.setattr(conductor, "prepare_config", broken)
    with pytest.raises(RuntimeError, match="derived facts"):
        conductor.prepare(cfg, str(tmp_path / "a"))
    assert started == []  # it had not started: nothing to leak
    monkeypatch.undo()
    monkeypatch.setattr(conductor, "ZygoteClient", Recorder)
    monkeypatch.setattr(conductor, "prepare", lambda cfg, launch: (RunDir(tmp_path / "b"), cfg, Recorder(tmp_path)))

    def failing_roles(run, cfg, launch, close_launch):
        raise KeyError("a role list that cannot be built")

    monkeypatch.setattr(conductor, "run_roles", failing_roles)
    for _ in range(2):  # two points of a multirun, both failing
        with pytest.raises(KeyError):
            conductor.conduct(cfg)
    assert len(started) == 2 and all(server.closed for server in started)


def test_submitit_private_api_is_the_version_we_override():
    """launch/local.py overrides submitit's private `LocalExecutor._submit_command` and sets the controller
    environment of `start_controller`; setup.cfg pins submitit to the versions where both are as written here."""
    import submitit
    from packaging.specifiers import SpecifierSet
    from submitit.local import local as submitit_local

    signature = inspect.signature(submitit_local.LocalExecutor._submit_command)
    assert list(signature.parameters) == ["self", "command"], signature
    assert list(inspect.signature(submitit_local.LocalJob.__init__).parameters)[:5] == \
        ["self", "folder", "job_id", "tasks", "process"]
    theirs = set(re.findall(r"\b(SUBMITIT_\w+)=", inspect.getsource(submitit_local.start_controller)))
    ours = set(re.findall(r'"(SUBMITIT_\w+)"', inspect.getsource(LocalRoleExecutor._submit_command)))
    assert theirs and theirs <= ours, theirs - ours
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    pin = next(line.split("submitit", 1)[1] for line in setup["options"]["install_requires"].splitlines()
               if line.strip().startswith("submitit"))
    assert "<" in pin and submitit.__version__ in SpecifierSet(pin), (pin, submitit.__version__)


@pytest.mark.slow  # a real run with two roles frozen (~2-3 min on 2 cores)
def test_a_run_recovers_from_frozen_roles(tmp_path):
    """prime_values.tools.chaos --stop: the policy trainer and an inference worker are frozen with SIGSTOP mid-run; the
    supervisor kills and restarts each after launcher.hang_timeout_s, the run goes on and ends with every invariant
    of prime_values.tools.check intact, and nothing outlives it."""
    from prime_values.tools.chaos import chaos

    run_dir = seed_version_zero(tmp_path / "run")
    overrides = [o for o in SMALL if not o.startswith("steps=")] + ["steps=100000", "eval_every=100000"]
    roles = ("policy_trainer", "inference0")
    report = chaos(run_dir, overrides, kills=len(roles), min_gap_s=0.5, max_gap_s=1.5, seed=1, roles=roles,
                   timeout_s=900, stop_after_steps=2, freeze=True, hang_timeout_s=30)
    assert report["run_returncode"] == 0, report["run_output_tail"]
    assert report["check_returncode"] == 0, report["check_output"]
    assert sorted(k["role"] for k in report["killed"]) == sorted(roles), report["killed"]
    output = (run_dir / "chaos.log").read_text()
    for role in roles:
        assert re.search(rf"role {role} failed: hung: no heartbeat for \d+ s", output), output[-3000:]
        assert report["restarts_per_role"].get(role, 0) >= 1, report
    assert report["policy_steps"] >= report["killed"][-1]["policy_step"] + 2, report
    assert not processes_mentioning(str(run_dir)), "a role process outlived the run"


def test_the_roles_started_are_the_roles_the_allocation_is_sized_for(tmp_path):
    """One role list (launch.pipeline_roles): what the supervisor starts is what a SLURM allocation asks for."""
    from prime_values.launch.slurm import pipeline_processes
    from tests.e2e_helpers import compose

    for overrides in ([], ["topology.evaluators=2", "topology.inference_workers=2"], ["advantage=grpo"]):
        cfg = compose(["+experiment=arith", *overrides])
        supervisor = Supervisor(RunDir(tmp_path), cfg)
        started = []
        supervisor._launch = lambda role_job: started.append((role_job.name, role_job.role, role_job.args))
        supervisor.start_roles()
        assert [name for name, _, _ in started] == [name for name, _, _ in pipeline_processes(cfg)], overrides
        assert len(started) == len({name for name, _, _ in started}) >= 3
    assert ("inference0", "inference", (0,)) in started and not any(role == "value_trainer" for _, role, _ in started)
