"""The conductor: the Hydra main process. Prepares the run directory, submits the roles as submitit jobs,
shows live progress, restarts a role that dies (at once, within a budget per time window), stops every role when
the policy trainer reaches its last step (or when a role fails for good), and ends with a summary. With
launcher=slurm it submits the whole pipeline as one sbatch job instead, follows it, and the conductor inside that
allocation runs the roles as srun steps (`submit_pipeline`).

Roles never talk to the conductor: it reads what they write (metrics, heartbeats, done markers) and
asks them to stop through the control file they all poll.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field

from omegaconf import OmegaConf

from prime_values.config import load_saved, resolve, validate
from prime_values.launch import DEVICE_KEYS, entry, kill_tree, make_executor, resolve_devices, role_gpus, role_procs
from prime_values.launch.zygote import ZygoteClient
from prime_values.roles import evaluator_name
from prime_values.rundir import RunDir, write_atomic
from prime_values.tools.live import Progress  # the live view (prime_values/tools/live.py)
from prime_values.tools.report import format_summary, summarise, write_report
from prime_values.tools.sweep import after_point
from prime_values.wandb_sink import start_forwarder
from prime_values.weights import latest_version


class RoleFailed(RuntimeError):
    pass


@dataclass
class RoleJob:
    name: str
    role: str
    job: object
    device: str = "cpu"
    args: tuple = ()
    finished: bool = False
    restarts: int = 0  # over the whole run (the live view and control/restarts.json show it)
    restart_times: list = field(default_factory=list)  # when each restart was made, for the rate budget
    failed_early: int = 0  # failures in a row before the role came up (no heartbeat): these back off
    restart_at: float | None = None  # a failed job waiting out its backoff before it is resubmitted


@dataclass
class Fleet:
    """The submitted role jobs of one run. A role that fails is resubmitted at once (every role resumes from what
    it left in the run directory), within a budget of launcher.max_restarts per launcher.restart_window_s; one
    that fails again before it came up (no heartbeat) waits launcher.restart_backoff_s, doubled each time."""

    run: RunDir
    cfg: object
    jobs: list[RoleJob] = field(default_factory=list)
    restarts: int = 0

    def _launch(self, role_job: RoleJob) -> None:
        executor = make_executor(self.cfg.launcher, self.run.jobs, role_job.name, role_job.device,
                                 tasks=role_procs(self.cfg.topology, role_job.role),  # trainers: one task per rank
                                 gpus=role_gpus(self.cfg.topology, role_job.role))
        role_job.job = executor.submit(entry(role_job.role), str(self.run.root), *role_job.args)
        if not getattr(role_job.job, "started_at", 0.0):
            role_job.job.started_at = time.time()

    def submit(self, name: str, role: str, device: str, *args) -> RoleJob:
        role_job = RoleJob(name, role, None, device, args)
        self._launch(role_job)
        self.jobs.append(role_job)
        return role_job

    def start_roles(self) -> None:
        topo = self.cfg.topology
        with_critic = self.cfg.resolved.uses_critic
        for worker in range(topo.inference_workers):
            self.submit(f"inference{worker}", "inference", topo.inference_device, worker)
        if with_critic and topo.evaluator == "dedicated":
            for index in range(topo.evaluators):
                self.submit(evaluator_name(index), "evaluator", topo.evaluator_device, index)
        self.submit("orchestrator", "orchestrator", "cpu")
        self.submit("policy_trainer", "policy_trainer", topo.policy_trainer_device)
        if with_critic:
            self.submit("value_trainer", "value_trainer", topo.value_trainer_device)

    def check(self) -> RoleJob | None:
        """The first job that ended with its work done (policy trainer, warm start). Every job that ended otherwise
        is resubmitted now (all of them in this one pass), or, past the restart budget, raises RoleFailed with
        the cause and the log path. After a stop request, ended jobs are the stop at work: StopRequested."""
        self._restart_due()
        ended = []
        for role_job in self.jobs:
            if role_job.finished or role_job.restart_at is not None:
                continue
            over, cause = job_end(role_job.job)
            if over:
                ended.append((role_job, cause))
        for role_job, cause in ended:  # a finished policy trainer ends the run whatever else ended with it
            if cause is None and self.run.done_file(role_job.name).exists():
                role_job.finished = True
                return role_job
        if ended and self.run.stop_requested():
            raise StopRequested(f"stop requested through {self.run.stop_file}")
        for role_job, cause in ended:
            self._schedule_restart(role_job, cause or "exited before the run finished")
        return None

    def _schedule_restart(self, role_job: RoleJob, cause: str) -> None:
        launcher, now = self.cfg.launcher, time.time()
        window = launcher.restart_window_s
        recent = [t for t in role_job.restart_times if window is None or now - t < window]
        message = f"role {role_job.name} failed: {cause} (log: {role_job.job.paths.stderr})"
        if len(recent) >= launcher.max_restarts:
            role_job.finished = True
            within = f" in {window:g} s" if window is not None else ""
            budget = f"launcher.max_restarts={launcher.max_restarts}" + \
                (f" per launcher.restart_window_s={window:g}" if window is not None else "")
            raise RoleFailed(message + (f" after {len(recent)} restarts{within} ({budget})" if recent else ""))
        came_up = _heartbeat_since(self.run, role_job.name, getattr(role_job.job, "started_at", now))
        role_job.failed_early = 0 if came_up else role_job.failed_early + 1
        # the first failure is restarted at once; a role failing again before it came up backs off (a crash loop)
        early = role_job.failed_early
        delay = 0.0 if early <= 1 else min(launcher.restart_backoff_s * 2 ** (early - 2), 60.0)
        role_job.restart_times = [*recent, now]
        role_job.restarts += 1
        self.restarts += 1
        per = f"; at most {launcher.max_restarts} per {window:g} s" if window is not None else ""
        print(f"\nprime_values: {message}; restarting it in {delay:.0f} s "
              f"({len(role_job.restart_times)}/{launcher.max_restarts}){per}", flush=True)
        write_atomic(self.run.restarts_file,
                     json.dumps({j.name: j.restarts for j in self.jobs}, sort_keys=True) + "\n")
        if delay == 0:
            self._launch(role_job)
        else:
            role_job.restart_at = now + delay

    def _restart_due(self) -> None:
        for role_job in self.jobs:
            if role_job.restart_at is not None and time.time() >= role_job.restart_at:
                role_job.restart_at = None
                self._launch(role_job)

    def running(self) -> list[RoleJob]:
        return [j for j in self.jobs if not j.job.done()]

    def stop(self, reason: str, grace_s: float) -> None:
        """Ask every role to stop, give them `grace_s` to finish, then cancel (and finally kill) the rest."""
        self.run.request_stop(reason)
        for role_job in self.jobs:
            role_job.restart_at = None  # nothing is restarted once the stop is asked for
        deadline = time.time() + grace_s
        while self.running() and time.time() < deadline:
            time.sleep(0.2)
        for role_job in self.running():  # local processes, or (launcher=slurm) the srun steps of this allocation
            role_job.job.cancel()
        deadline = time.time() + 10
        while self.running() and time.time() < deadline:
            time.sleep(0.2)
        for role_job in self.running():
            kill_tree(int(role_job.job.job_id))  # last resort: never leave a process behind (job_id is the pid)


def _heartbeat_since(run: RunDir, name: str, since: float) -> bool:
    """Whether role `name` wrote a heartbeat after `since` (it came up: imports done, run directory read)."""
    try:
        return run.heartbeat_file(name).stat().st_mtime >= since - 1.0
    except OSError:
        return False


def job_end(job) -> tuple[bool, str | None]:
    """(ended, cause) of a role job without waiting: (False, None) while it runs, (True, None) when it exited
    cleanly, else (True, the cause in words). Local jobs read their controller's exit state
    (prime_values.launch.local), SLURM jobs their job state (prime_values.launch.slurm.exit_cause)."""
    if hasattr(job, "exit_cause"):
        return job.exit_cause()
    if not job.done():
        return False, None
    from prime_values.launch.slurm import exit_cause

    return True, exit_cause(job)


def prepare(cfg) -> tuple[RunDir, object, ZygoteClient | None]:
    """Validate, create the run directory, resolve 'auto' devices and save the config. A local attached run's fork
    server starts here, as early as it can (its imports take ~8 s on 2 cores)."""
    from hydra.core.hydra_config import HydraConfig

    validate(cfg)  # again here: multirun jobs come through here with their own values
    run = RunDir(HydraConfig.get().runtime.output_dir)
    run.mkdirs()
    fork_server = ZygoteClient(run.root) if wants_fork_server(cfg) else None
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if any(cfg.topology[key] == "auto" for key in DEVICE_KEYS):  # an all-CPU run never imports torch here
        import torch

        resolve_devices(cfg.topology, torch.cuda.device_count())
    resolve(cfg)  # the derived facts (resolved.*), once: the roles and tools read them from config.yaml
    write_atomic(run.config, OmegaConf.to_yaml(cfg))
    if run.stop_requested():
        run.stop_file.unlink()  # a rerun in the same directory resumes
    run.register_conductor(watch=cfg.launcher.name == "local")
    return run, cfg, fork_server


def _terminate_gracefully(signum, frame):
    raise KeyboardInterrupt  # SIGTERM: stop the roles like Ctrl-C does


def conduct(cfg) -> dict:
    """The rl stage: prepare the run directory, then run the roles here, or, with launcher.detach, submit a
    conductor job that runs them and return at once."""
    fork_server = None
    try:
        run, cfg, fork_server = prepare(cfg)
        from prime_values.launch.slurm import in_allocation

        if cfg.launcher.name == "slurm" and not in_allocation():
            signal.signal(signal.SIGTERM, _terminate_gracefully)
            return submit_pipeline(run, cfg)
        if cfg.launcher.detach:
            return detach(run, cfg)
        signal.signal(signal.SIGTERM, _terminate_gracefully)
        return run_roles(run, cfg, fork_server)
    finally:
        stop_fork_server(fork_server)  # run_roles stops it once the roles have ended; this covers the other exits


def _allocation_main(run_dir: str) -> dict:
    """The batch step of the pipeline's SLURM job: the conductor, whose roles are srun steps of this job."""
    from prime_values.launch.slurm import ALLOCATION_ENV

    os.environ[ALLOCATION_ENV] = "1"
    signal.signal(signal.SIGTERM, _terminate_gracefully)  # scancel / the end of the time limit: stop the roles
    run = RunDir(run_dir)
    asked = _stop_reason(run)  # the stop the conductor of a lost allocation asked for is not the user's: resume
    if asked is not None and "user" not in asked and asked != "stopped":
        run.stop_file.unlink(missing_ok=True)
    try:
        return drive(run_dir)
    except SystemExit as exit_:  # a failed run: the job fails with it, the summary is in the run directory
        if exit_.code:
            raise RuntimeError(f"the run failed; see {RunDir(run_dir).report / 'summary.json'}") from None
        raise


def _stop_reason(run: RunDir) -> str | None:
    """The reason in the run's stop file ('' when unreadable), None when there is none."""
    if not run.stop_requested():
        return None
    try:
        return str(json.loads(run.stop_file.read_text()).get("reason", ""))
    except (OSError, ValueError, AttributeError):
        return ""


LOST = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}  # the allocation was lost, not the run: requeue and resume
LOST_GRACE_S = 30.0  # how long a lost job may take to be requeued by SLURM itself before it is resubmitted


def submit_pipeline(run: RunDir, cfg) -> dict:
    """launcher=slurm: the rl stage as one sbatch job for all roles (prime_values.launch.slurm), followed from here:
    queued (and why), then the live view from the run directory; a lost allocation is resubmitted (launcher.
    max_restarts per launcher.restart_window_s) and the next one resumes the run; Ctrl-C stops it cleanly."""
    from prime_values.launch.slurm import (cancel_all, describe_request, job_states, make_slurm_executor,
                                           pipeline_request, queued_line)

    request, launcher = pipeline_request(cfg), cfg.launcher
    extra = {**dict(launcher.extra_sbatch), "requeue": True}  # SLURM itself requeues it after a node failure
    executor = make_slurm_executor(
        run.jobs / "pipeline", partition=launcher.partition, account=launcher.account, qos=launcher.qos,
        constraint=launcher.constraint, extra_sbatch=extra, setup=list(launcher.setup),
        time_min=launcher.timeout_min, job_name="pv_pipeline", gpus_per_node=request["gpus"], tasks_per_node=1,
        cpus_per_task=request["cpus"], mem_gb=launcher.mem_gb)
    progress = Progress(run, cfg.steps)
    print(f"prime_values: run directory {run.root}\nprime_values: one allocation for the pipeline: "
          f"{describe_request(request)}", flush=True)
    job = executor.submit(_allocation_main, str(run.root))
    print(f"prime_values: submitted pipeline job {job.job_id}", flush=True)
    if launcher.detach:
        print(f"prime_values: detached; follow it:  python -m prime_values.status {run.root}\n"
              f"  stop it:    python -m prime_values.status {run.root} --stop", flush=True)
        return {"status": "detached", "run_dir": str(run.root), "conductor_job": str(job.job_id)}
    resubmits: list[float] = []
    shown_queue, reason, lost_since = None, None, None
    try:
        while True:
            state = job_states([job]).get(job.job_id, "UNKNOWN")
            if state == "PENDING":
                line = queued_line(job.job_id)
                if line and line != shown_queue:
                    print(f"prime_values: {line}", flush=True)
                    shown_queue = line
                    write_atomic(run.root / "control" / "queued", line + "\n")
            elif state not in ("UNKNOWN",):
                if shown_queue is not None:
                    (run.root / "control" / "queued").unlink(missing_ok=True)
                    shown_queue = None
                progress.show()
            lost_since = (lost_since or time.time()) if state in LOST else None
            if state in LOST and time.time() - lost_since >= LOST_GRACE_S:  # SLURM did not requeue it (--requeue)
                cancel_all([job])  # never two allocations on one run directory
                now = time.time()
                window = launcher.restart_window_s
                resubmits = [t for t in resubmits if window is None or now - t < window]
                if len(resubmits) >= launcher.max_restarts:
                    reason = f"the pipeline's allocation was lost ({state}) after {len(resubmits)} resubmissions"
                    break
                resubmits.append(now)
                lost_since = None
                job = executor.submit(_allocation_main, str(run.root))
                print(f"\nprime_values: the pipeline's allocation was lost ({state}); resubmitted as job "
                      f"{job.job_id}: the run resumes from its run directory", flush=True)
                continue
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "REVOKED"):
                if state != "COMPLETED":
                    reason = f"the pipeline job {job.job_id} ended {state} (log: {job.paths.stderr})"
                break
            if _stop_reason(run) and "user" in _stop_reason(run):  # not the stop of a lost allocation's conductor
                raise StopRequested(f"stop requested through {run.stop_file}")
            time.sleep(max(cfg.launcher.poll_s, 1.0))
    except (KeyboardInterrupt, StopRequested) as stop:
        if isinstance(stop, KeyboardInterrupt):  # (a StopRequested: the user's stop file is there already)
            run.request_stop("interrupted by the user")
        deadline = time.time() + cfg.launcher.stop_grace_s + 30
        while time.time() < deadline and job_states([job]).get(job.job_id) not in (
                "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            time.sleep(1)
        cancel_all([job])
        reason = None if isinstance(stop, StopRequested) else "interrupted by the user"
    (run.root / "control" / "queued").unlink(missing_ok=True)
    progress.show(final=True)
    summary_file = run.report / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else \
        summarise(run, status="failed" if reason else "stopped", error=reason)
    print(format_summary(summary), flush=True)
    failure = (summary.get("error") if summary.get("status") == "failed" else None) or reason
    if failure:
        print(f"prime_values: {failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    return summary


def detach(run: RunDir, cfg) -> dict:
    executor = make_executor(cfg.launcher, run.jobs, "conductor", "cpu")
    with _detached_stdio():
        job = executor.submit(drive, str(run.root))
    print(f"prime_values: detached; conductor job {job.job_id} runs the roles of {run.root}\n"
          f"  follow it:  python -m prime_values.status {run.root}\n"
          f"  stop it:    python -m prime_values.status {run.root} --stop", flush=True)
    return {"status": "detached", "run_dir": str(run.root), "conductor_job": str(job.job_id)}


@contextlib.contextmanager
def _detached_stdio():
    """submitit's local job controller inherits our stdout/stderr: a caller reading them to EOF (a pipe, `| tee`,
    CI) would wait for the whole detached run. Point them at /dev/null while it is started (the job writes its
    own log files under jobs/conductor/)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def drive(run_dir: str) -> dict:
    """The conductor job of a detached run: the same loop as an attached conductor, from the run directory."""
    run = RunDir(run_dir)
    cfg = load_saved(run.config)
    run.register_conductor(watch=cfg.launcher.name == "local")
    return run_roles(run, cfg)


def run_roles(run: RunDir, cfg, fork_server: ZygoteClient | None = None) -> dict:
    """Run the roles of the rl stage from this process until the policy trainer ends; `fork_server`: one already
    starting (prepare), else one is started here when launcher.fork_server asks for it."""
    fleet = Fleet(run, cfg)
    progress = Progress(run, cfg.steps)
    print(f"prime_values: run directory {run.root}", flush=True)
    reason, failure = "finished", None
    if run.done_file("policy_trainer").exists() and (latest_version(run.weights("policy")) or 0) >= cfg.steps:
        print(f"prime_values: this run already finished all {cfg.steps} steps; nothing to redo", flush=True)
        summary = summarise(run, status="finished")
        print(format_summary(summary), flush=True)
        return summary
    sink = start_forwarder(run, cfg)  # forwards metrics/*.jsonl to W&B; a no-op with wandb.mode=disabled
    fork_server = start_fork_server(run, cfg, fork_server)
    try:
        warm = fleet.submit("warm_start", "warm_start", cfg.topology.policy_trainer_device)
        while fleet.check() is not warm:
            _poll(run, progress, cfg)
        fleet.start_roles()
        while (ended := fleet.check()) is None or ended.role != "policy_trainer":
            _poll(run, progress, cfg)
    except RoleFailed as error:
        reason, failure = "failed", str(error)
    except KeyboardInterrupt:
        reason, failure = "interrupted", "interrupted by the user"
    except StopRequested as stop:
        reason, failure = "stopped", str(stop)
    finally:
        fleet.stop(reason, cfg.launcher.stop_grace_s)
        stop_fork_server(fork_server)
    progress.show(final=True)
    summary = summarise(run, status=reason, error=failure)
    sink.close(summary, exit_code=1 if failure and reason != "stopped" else 0)
    print(format_summary(summary), flush=True)
    try:
        where = write_report(run, summary, plots=cfg.log.plots)
        print(f"report               {where}{' (plots next to it)' if cfg.log.plots else ''}", flush=True)
    except Exception as error:  # a plotting problem must not turn a finished run into a failed one
        print(f"prime_values: could not write the plots ({type(error).__name__}: {error}); "
              f"retry with python -m prime_values.report {run.root}", file=sys.stderr, flush=True)
    try:
        after_point(run.root)  # inside a multirun: refresh the sweep's one-row-per-point summary
    except Exception as error:
        print(f"prime_values: could not write the sweep summary ({type(error).__name__}: {error})", file=sys.stderr)
    if failure and reason != "stopped":
        print(f"prime_values: {failure}", file=sys.stderr, flush=True)
        sys.exit(1)
    return summary


def wants_fork_server(cfg) -> bool:
    """Whether this process should start a fork server for its jobs: launcher.fork_server on a local attached run
    (not inside a SLURM allocation), and none is running for it yet (the stages' one, `run_stages`)."""
    from prime_values.launch import local
    from prime_values.launch.slurm import in_allocation

    return (cfg.launcher.name == "local" and cfg.launcher.fork_server and not cfg.launcher.detach
            and not in_allocation() and local.FORK_SERVER is None)


def start_fork_server(run: RunDir, cfg, server: ZygoteClient | None = None) -> ZygoteClient | None:
    """launcher.fork_server (local runs): the process the role jobs are forked from (`server` when it is already
    starting), ready before the first one. Returns the server this caller must stop (None: none, or the stages'
    one, which they stop)."""
    from prime_values.launch import local

    if server is None and not wants_fork_server(cfg):
        if local.FORK_SERVER is not None:
            wait_for_fork_server(local.FORK_SERVER)
        return None
    server = server or ZygoteClient(run.root)
    wait_for_fork_server(server)
    local.FORK_SERVER = server
    return server


def wait_for_fork_server(server: ZygoteClient) -> None:
    if not server.ready(wait_s=120):  # its imports take what one role's would; then every role skips them
        print("prime_values: the fork server did not start; jobs start as fresh processes", flush=True)


def stop_fork_server(server) -> None:
    if server is None:
        return
    from prime_values.launch import local

    if local.FORK_SERVER is server:
        local.FORK_SERVER = None
    server.close()


class StopRequested(Exception):
    pass


def _poll(run: RunDir, progress: Progress, cfg) -> None:
    """One tick of the conductor's loop: refresh the view, notice a stop asked for from outside
    (`python -m prime_values.status <run> --stop`), wait."""
    progress.show()
    if run.stop_requested():
        raise StopRequested(f"stop requested through {run.stop_file}")
    time.sleep(cfg.launcher.poll_s)
