"""The supervisor: the restart policy of a run's role jobs, for local roles and for the srun steps of a SLURM
allocation alike (both are `LocalRoleJob`s: prime_values.launch.local).

A role job that ends before the run is done is resubmitted in the same pass (every role resumes from what it left
in the run directory), within a budget per role (`RestartBudget`: launcher.max_restarts per
launcher.restart_window_s). On top of that budget, five rules:

- a crash loop backs off: a role that fails again before it came up (no heartbeat since its start) waits
  launcher.restart_backoff_s, doubled each time (at most 60 s);
- a deterministic start-up error ends the run at once: the same exception twice in a row, each time before the
  role's first heartbeat, is a config or code error that a restart cannot fix (`+experiment=arith task.digits=10`);
- a death caused by another process (the fork server the role was forked from died) restarts the role without
  charging its budget or backing off;
- a hang is a failure: a role that came up (it beat since its start) and whose newest heartbeat is older than
  its hang limit is SIGKILLed with its process tree and restarted, with the cause `hung: no heartbeat for N s`.
  The limit is launcher.hang_timeout_s, or launcher.hang_quiet_factor times the longest silence between two of
  its heartbeats that the role has shown in this run (one step or evaluation on this machine, under its present
  load), whichever is longer. Its start-up (an srun step, imports, a rendezvous, loading models: a minute or more
  on a loaded machine) has no heartbeat to go by: a role that has not beaten since its start is held to
  launcher.start_timeout_s instead (never less than hang_timeout_s), so a slow start is not taken for a hang;
- a SLURM allocation over several nodes that is losing one (SLURM finds it down or not responding) restarts
  nothing while it lasts, uncharged: SLURM ends the allocation and a fresh one resumes the run
  (prime_values.submitter), or the node answers again and the roles restart then.

Roles never talk to the supervisor: it reads what they write (heartbeats, done markers) and the jobs' exit states.

A run (the conductor), the pipeline submitter and the stages end with an `Outcome`; `python -m prime_values` turns
it into the exit code (prime_values.__main__.EXIT_CODES).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from prime_values.config.critic import trains_critic
from prime_values.launch import entry, kill_job, make_executor
from prime_values.launch.topology import pipeline_roles, role_gpus, role_procs
from prime_values.rundir import RunDir, StopReason, write_atomic

if TYPE_CHECKING:
    from prime_values.launch.local import LocalLaunch

BACKOFF_MAX_S = 60.0
LOST_NODE_RECHECK_S = 5.0  # launcher=slurm over several nodes: how often a role held for a lost node is looked at
STOP_KILL_WAIT_S = 10.0  # after cancel(): how long ended-but-not-gone jobs get before their trees are SIGKILLed


class RoleFailed(RuntimeError):
    pass


class StopRequested(Exception):
    pass


class Ending(Enum):
    FINISHED = "finished"  # every stage, or the run's last policy step, is done
    DETACHED = "detached"  # launcher.detach: a conductor job (or the pipeline's SLURM job) runs it from here on
    STOPPED = "stopped"  # the user asked for a stop (prime_values.tools.status --stop) and the run stopped cleanly
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM
    FAILED = "failed"  # a role or stage failed for good, or the pipeline's job ended badly
    BAD_CONFIG = "bad config"  # refused before any job started


@dataclass(frozen=True)
class Outcome:
    """How a run, or one stage of it, ended: `cause`, its reason in words (the failure, the interruption, the config
    error), and `result`, what it produced (the run's summary, a stage's done record, the pipeline's records)."""

    ending: Ending
    cause: str | None = None
    result: dict = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        """Whether the run ended badly: failed, interrupted, or refused for its config."""
        return self.ending in (Ending.FAILED, Ending.INTERRUPTED, Ending.BAD_CONFIG)


@dataclass
class RestartBudget:
    """At most `max_restarts` restarts within any `window_s` seconds (None: over the whole run)."""

    max_restarts: int
    window_s: float | None
    times: list = field(default_factory=list)  # when each counted restart was made

    @classmethod
    def of(cls, launcher) -> RestartBudget:
        return cls(launcher.max_restarts, launcher.restart_window_s)

    def spent(self, now: float) -> bool:
        """Whether one more restart now would exceed the budget (restarts older than the window are dropped)."""
        self.times = [t for t in self.times if self.window_s is None or now - t < self.window_s]
        return len(self.times) >= self.max_restarts

    def charge(self, now: float) -> None:
        self.times.append(now)

    def exhausted(self) -> str:
        """' after 2 restarts in 100 s (launcher.max_restarts=2 per launcher.restart_window_s=100)', '' for none."""
        if not self.times:
            return ""
        within = f" in {self.window_s:g} s" if self.window_s is not None else ""
        per = f" per launcher.restart_window_s={self.window_s:g}" if self.window_s is not None else ""
        return f" after {len(self.times)} restarts{within} (launcher.max_restarts={self.max_restarts}{per})"

    def used(self) -> str:
        """'(2/5); at most 5 per 3600 s' after a restart was charged."""
        per = f"; at most {self.max_restarts} per {self.window_s:g} s" if self.window_s is not None else ""
        return f"({len(self.times)}/{self.max_restarts}){per}"


@dataclass
class RoleJob:
    name: str
    role: str
    job: object
    device: str = "cpu"
    args: tuple = ()
    finished: bool = False
    restarts: int = 0  # over the whole run, counted or not (the live view and control/restarts.json show it)
    budget: RestartBudget | None = None  # set by the supervisor from launcher.*
    failed_early: int = 0  # failures in a row before the role came up (no heartbeat): these back off
    early_cause: str | None = None  # the cause of the last of those: the same exception again ends the run
    restart_at: float | None = None  # a failed job waiting out its backoff before it is resubmitted
    hung: str | None = None  # the cause once the supervisor killed the job for a hang
    beat_before: float | None = None  # its heartbeat's time when the job was started: a newer one says it came up
    last_beat: float | None = None  # the newest heartbeat the supervisor saw
    quiet_seen: float = 0.0  # how long after last_beat the supervisor last saw no newer one
    longest_quiet: float = 0.0  # the longest silence between two heartbeats of a job of this role it saw, this run
    function: object = None  # a stage job's function (prime_values.stages), run instead of the role's entry


def exit_cause(job) -> tuple[bool, str | None]:
    """(ended, cause) of a role job without waiting: (False, None) while it runs, (True, None) when it exited
    cleanly, else (True, the cause in words). Local jobs and srun steps read their controller's exit state
    (prime_values.launch.local), SLURM jobs their job state (prime_values.launch.slurm.exit_cause)."""
    if hasattr(job, "exit_cause"):
        return job.exit_cause()
    if not job.done():
        return False, None
    from prime_values.launch.slurm import exit_cause as slurm_exit_cause

    return True, slurm_exit_cause(job)


def heartbeat_time(run: RunDir, name: str) -> float | None:
    """The modification time of role `name`'s heartbeat (the filesystem's clock, also on NFS), None before one."""
    try:
        return run.heartbeat_file(name).stat().st_mtime
    except OSError:
        return None


def _heartbeat_since(run: RunDir, name: str, since: float) -> bool:
    """Whether role `name` wrote a heartbeat after `since` (it came up: its loop is running)."""
    beat = heartbeat_time(run, name)
    return beat is not None and beat >= since - 1.0


def _beat_since_start(role_job: RoleJob, beat: float | None) -> bool:
    """Whether the role's job beat since it was started, `beat` its heartbeat's time now: the heartbeat changed
    since its start. No clock is compared (the file's time is the filesystem's, also on NFS), and the last beat of
    the job it replaces, however close to its start, is not taken for its own."""
    return beat is not None and beat != role_job.beat_before


def start_limit(launcher) -> tuple[float | None, str]:
    """How long a role may take from its start to its first heartbeat, and why: launcher.start_timeout_s, never
    less than launcher.hang_timeout_s (None when either is null: no limit)."""
    hang, start = getattr(launcher, "hang_timeout_s", None), getattr(launcher, "start_timeout_s", 1800.0)
    if not hang or not start:
        return None, ""
    if start >= hang:
        return float(start), f"launcher.start_timeout_s={start:g}"
    return float(hang), f"launcher.hang_timeout_s={hang:g}, more than launcher.start_timeout_s={start:g}"


def hang_limit(launcher, role_job: RoleJob) -> tuple[float | None, str]:
    """How long a role that came up may be silent before it is taken for hung, and why: launcher.hang_timeout_s,
    or launcher.hang_quiet_factor x the longest silence it has shown between two heartbeats, whichever is longer
    (None when hang_timeout_s is null: never)."""
    limit = getattr(launcher, "hang_timeout_s", None)
    if not limit:
        return None, ""
    factor = getattr(launcher, "hang_quiet_factor", None)
    if factor and factor * role_job.longest_quiet > limit:
        return factor * role_job.longest_quiet, (f"launcher.hang_quiet_factor={factor:g} x its longest silence in "
                                                 f"this run, {role_job.longest_quiet:.1f} s, more than "
                                                 f"launcher.hang_timeout_s={limit:g}")
    return float(limit), f"launcher.hang_timeout_s={limit:g}"


@dataclass
class Supervisor:
    """The role jobs of one run and their restart policy (module docstring)."""

    run: RunDir
    cfg: object
    launch: LocalLaunch | None = None  # a local run's: its jobs fork from its fork server
    jobs: list[RoleJob] = field(default_factory=list)
    restarts: int = 0

    def _launch(self, role_job: RoleJob) -> None:
        if role_job.function is not None:  # a stage job: one process, on its device
            executor = make_executor(self.cfg.launcher, self.run.jobs, role_job.name, role_job.device,
                                     launch=self.launch)
        else:
            executor = make_executor(self.cfg.launcher, self.run.jobs, role_job.name, role_job.device,
                                     tasks=role_procs(self.cfg.topology, role_job.role),  # trainers: a task per rank
                                     gpus=role_gpus(self.cfg.topology, role_job.role),
                                     first_gpu=self._gpu_offsets().get(role_job.name, 0),
                                     nodes=self._nodes(role_job.role), launch=self.launch)
        role_job.job = executor.submit(*self._call(role_job))
        if not getattr(role_job.job, "started_at", 0.0):
            role_job.job.started_at = time.time()

    def _call(self, role_job: RoleJob) -> tuple:
        """What the role's job runs: its entry function (a stage job's function) and arguments."""
        return (role_job.function or entry(role_job.role), str(self.run.root), *role_job.args)

    def _gpu_offsets(self) -> dict[str, int]:
        """launcher=slurm: where each role's GPUs start among the allocation's (launch.slurm.gpu_offsets)."""
        if self.cfg.launcher.name != "slurm":
            return {}
        from prime_values.launch.slurm import gpu_offsets

        return gpu_offsets(self.cfg)

    def _nodes(self, role: str) -> list[int] | None:
        """launcher=slurm: the nodes of the allocation a role runs on (launch.slurm.role_nodes; the warm start, one
        process that runs alone before the others, on the policy trainer's first)."""
        if self.cfg.launcher.name != "slurm":
            return None
        from prime_values.launch.slurm import role_nodes

        return role_nodes(self.cfg, role) if role != "warm_start" else role_nodes(self.cfg, "policy_trainer")[:1]

    def _start(self, role_job: RoleJob) -> None:
        """Start (or restart) the role's job, noting its heartbeat's time before it (`_beat_since_start`)."""
        role_job.beat_before = role_job.last_beat = heartbeat_time(self.run, role_job.name)
        role_job.quiet_seen = 0.0
        self._launch(role_job)

    def submit(self, name: str, role: str, device: str, *args, function=None) -> RoleJob:
        """Start a job of role `role` named `name`; with `function`, a stage job that runs `function(run_dir)`."""
        role_job = RoleJob(name, role, None, device, args, function=function)
        self._start(role_job)
        self.jobs.append(role_job)
        return role_job

    def start_roles(self) -> None:
        for spec in pipeline_roles(self.cfg.topology, self.cfg.resolved.uses_critic,
                                   trains_critic(self.cfg)):
            self.submit(spec.name, spec.role, spec.device, *spec.args)

    def check(self) -> RoleJob | None:
        """The first job that ended with its work done (policy trainer, warm start). Every job that ended otherwise
        is resubmitted now (all of them in this one pass), or, past the restart budget or on a deterministic
        start-up error, raises RoleFailed with the cause and the log path. A hung job is killed here (it is
        restarted once it has ended). After a stop request, ended jobs are the stop at work: StopRequested."""
        self._restart_due()
        ended = []
        for role_job in self.jobs:
            if role_job.finished or role_job.restart_at is not None:
                continue
            over, cause = exit_cause(role_job.job)
            if over:
                ended.append((role_job, role_job.hung or cause))
            elif role_job.hung is None:
                self._kill_if_hung(role_job)
        for role_job, cause in ended:  # a finished policy trainer ends the run whatever else ended with it
            if cause is None and self.run.done_file(role_job.name).exists():
                role_job.finished = True
                return role_job
        if ended and self.run.stop_requested():
            raise StopRequested(f"stop requested through {self.run.stop_file}")
        for role_job, cause in ended:
            self._schedule_restart(role_job, cause or "exited before the run finished")
        return None

    def _kill_if_hung(self, role_job: RoleJob) -> None:
        """Kill the job if it is hung (module docstring): silent past its hang limit once it came up, or not come up
        within launcher.start_timeout_s. Notes the silences between its heartbeats (`RoleJob.longest_quiet`)."""
        launcher, now = self.cfg.launcher, time.time()
        beat = heartbeat_time(self.run, role_job.name)
        if not _beat_since_start(role_job, beat):  # starting: srun, imports, rendezvous, loading; no beat to go by yet
            limit, why = start_limit(launcher)
            started = getattr(role_job.job, "started_at", 0.0) or now
            if limit is not None and now - started > limit:
                role_job.hung = (f"hung: no heartbeat for {now - started:.0f} s since its start, before it came "
                                 f"up ({why})")
                kill_job(role_job.job)  # SIGKILL: a hung process answers no polite signal (nor does a stopped one)
            return
        quiet = now - beat
        if beat != role_job.last_beat:  # it beat again: the silence before was real, at least as long as was seen
            if role_job.last_beat != role_job.beat_before:  # (not its start-up: start_timeout_s holds that)
                role_job.longest_quiet = max(role_job.longest_quiet, role_job.quiet_seen)
            role_job.last_beat, role_job.quiet_seen = beat, 0.0
        role_job.quiet_seen = max(role_job.quiet_seen, quiet)  # never more than the silence was: beats are polled
        limit, why = hang_limit(launcher, role_job)
        if limit is not None and quiet > limit:
            role_job.hung = f"hung: no heartbeat for {quiet:.0f} s ({why})"
            kill_job(role_job.job)  # SIGKILL: a hung process answers no polite signal (nor does a stopped one)

    def _schedule_restart(self, role_job: RoleJob, cause: str) -> None:
        launcher, now = self.cfg.launcher, time.time()
        role_job.hung = None
        role_job.budget = role_job.budget or RestartBudget.of(launcher)
        message = f"role {role_job.name} failed: {cause} (log: {role_job.job.paths.stderr})"
        if getattr(role_job.job, "collateral", False):  # it died with the process it was forked from
            self._relaunch(role_job, f"{message}; restarting it in 0 s (not counted: it died with the fork "
                                     f"server it was forked from)")
            return
        lost = self._lost_nodes()
        if lost:  # the allocation is losing a node: SLURM ends it (a fresh one resumes); a restart now fails again
            print(f"\nprime_values: {message}; not restarted while node {', '.join(lost)} of the allocation is "
                  f"lost (SLURM ends the allocation, or the node answers again)", flush=True)
            role_job.restart_at = now + LOST_NODE_RECHECK_S
            return
        if role_job.budget.spent(now):
            role_job.finished = True
            raise RoleFailed(message + role_job.budget.exhausted())
        came_up = _heartbeat_since(self.run, role_job.name, getattr(role_job.job, "started_at", now))
        if not came_up and cause.startswith("exit code") and cause == role_job.early_cause:
            role_job.finished = True
            raise RoleFailed(f"role {role_job.name} failed twice with the same error before it came up (a start-up "
                             f"error that a restart does not fix): {cause} (log: {role_job.job.paths.stderr})")
        role_job.failed_early = 0 if came_up else role_job.failed_early + 1
        role_job.early_cause = None if came_up else cause
        # the first failure is restarted at once; a role failing again before it came up backs off (a crash loop)
        early = role_job.failed_early
        delay = 0.0 if early <= 1 else min(launcher.restart_backoff_s * 2 ** (early - 2), BACKOFF_MAX_S)
        role_job.budget.charge(now)
        line = f"{message}; restarting it in {delay:.0f} s {role_job.budget.used()}"
        if delay == 0:
            self._relaunch(role_job, line)
        else:
            self._count(role_job, line)
            role_job.restart_at = now + delay

    def _relaunch(self, role_job: RoleJob, line: str) -> None:
        self._count(role_job, line)
        self._start(role_job)

    def _count(self, role_job: RoleJob, line: str) -> None:
        role_job.restarts += 1
        self.restarts += 1
        print(f"\nprime_values: {line}", flush=True)
        write_atomic(self.run.restarts_file,
                     json.dumps({j.name: j.restarts for j in self.jobs}, sort_keys=True) + "\n")

    def _restart_due(self) -> None:
        for role_job in self.jobs:
            if role_job.restart_at is not None and time.time() >= role_job.restart_at:
                if self._lost_nodes():  # still lost: keep waiting (uncounted) for SLURM or the node
                    role_job.restart_at = time.time() + LOST_NODE_RECHECK_S
                    continue
                role_job.restart_at = None
                self._start(role_job)

    def _lost_nodes(self) -> list[str]:
        """launcher=slurm, inside an allocation over several nodes: its nodes SLURM finds down or not responding."""
        if self.cfg.launcher.name != "slurm" or int(self.cfg.launcher.get("nodes", 1)) == 1:
            return []
        from prime_values.launch.slurm import lost_nodes

        return lost_nodes()

    def running(self) -> list[RoleJob]:
        return [j for j in self.jobs if not j.job.done()]

    def stop(self, reason: StopReason, grace_s: float) -> None:
        """Ask every role to stop, give them `grace_s` to finish, then cancel (and finally kill) the rest."""
        self.run.request_stop(reason)
        for role_job in self.jobs:
            role_job.restart_at = None  # nothing is restarted once the stop is asked for
        deadline = time.time() + grace_s
        while self.running() and time.time() < deadline:
            time.sleep(0.2)
        for role_job in self.running():  # local processes, or (launcher=slurm) the srun steps of this allocation
            role_job.job.cancel()
        deadline = time.time() + STOP_KILL_WAIT_S
        while self.running() and time.time() < deadline:
            time.sleep(0.2)
        for role_job in self.running():
            kill_job(role_job.job)  # last resort: never leave a process behind
