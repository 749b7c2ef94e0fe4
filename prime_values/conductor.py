"""The conductor: the Hydra main process, which composes the parts of a run and reports. It prepares the run
directory, runs the role jobs under the supervisor (prime_values.supervisor: restarts, budgets, hang detection),
shows live progress, stops every role when the policy trainer reaches its last step (or when a role fails for
good), and ends with a summary. With launcher=slurm it hands the run to the pipeline submitter instead
(prime_values.submitter: one sbatch job for the whole pipeline), and the conductor inside that allocation runs
the roles as srun steps under the same supervisor (`_allocation_main`).

Roles never talk to the conductor: it reads what they write (metrics, heartbeats, done markers) and
asks them to stop through the control file they all poll.

The conductor's console is the live view and the summary: only this project's (and Hydra's) log records of any
level reach it, other libraries' from WARNING up (`quiet_libraries`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from prime_values.config import load_saved, prepare as prepare_config
from prime_values.launch import checks as config_checks, make_executor  # noqa: F401 - checks: registers the hooks
from prime_values.launch.local import LocalLaunch
from prime_values.launch.slurm import ALLOCATION_ENV, in_allocation
from prime_values.launch.zygote import ZygoteClient
from prime_values.rundir import RunDir, StopReason, write_atomic
from prime_values.submitter import submit_pipeline
from prime_values.supervisor import Ending, Outcome, RoleFailed, StopRequested, Supervisor
from prime_values.tools.live import LiveView
from prime_values.tools.report import write_report
from prime_values.tools.summary import format_summary, summarise
from prime_values.tools.sweep import after_point
from prime_values.wandb_sink import start_forwarder
from prime_values.warm_cache import WarmStartCache
from prime_values.weights import latest_version

if TYPE_CHECKING:
    from prime_values.config import Config


def prepare(cfg: Config, output_dir: str | None = None, launch: LocalLaunch | None = None) \
        -> tuple[RunDir, object, ZygoteClient | None]:
    """The run directory (`output_dir`, else Hydra's) holding the config `config.prepare` made (validated with
    every check hook, `config_checks.REGISTRARS`, unless this launch validated it already, 'auto' devices
    resolved, resolved.* derived): what the roles, the submitter and the allocation's conductor read from then on,
    never validating it again; a local attached run's fork server (unless `launch` has one already: the stages')
    starts last, once nothing here can fail any more (none leaks from a failed prepare)."""
    if output_dir is None:
        from hydra.core.hydra_config import HydraConfig

        output_dir = HydraConfig.get().runtime.output_dir
    cfg = prepare_config(cfg)  # validated first: a bad config leaves no run directory
    run = RunDir(output_dir)
    run.mkdirs()
    write_atomic(run.config, OmegaConf.to_yaml(cfg))  # the roles and tools read it (load_saved)
    if run.stop_requested():
        run.stop_file.unlink()  # a rerun in the same directory resumes
    run.register_conductor(watch=cfg.launcher.name == "local")
    starts = wants_fork_server(cfg) and (launch is None or launch.fork_server is None)
    return run, cfg, ZygoteClient(run.root) if starts else None


OUR_LOGGERS = ("prime_values", "hydra", "__main__")  # their INFO records reach the console; other libraries' do not


class _OursOrWarnings(logging.Filter):
    """Lets through this project's records (OUR_LOGGERS) and any library's from WARNING up."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or record.name.split(".")[0] in OUR_LOGGERS


def quiet_libraries() -> list[tuple[logging.Handler, logging.Filter]]:
    """Keep other libraries' INFO records off the conductor's console (and Hydra's log file): Hydra's job logging
    hands every logger's INFO to the root logger's handlers, so matplotlib's 'generated new fontManager' (its font
    cache rebuilt while the report is drawn) would land under the summary, and any library's INFO in the live view.
    A filter on each root handler lets through OUR_LOGGERS' records and others' from WARNING up; loggers keep their
    levels (a library's own WARNING and errors still show). Idempotent; returns the (handler, filter) pairs it
    added, for a caller in a longer-lived process (a test) to remove."""
    added = []
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _OursOrWarnings) for f in handler.filters):
            added.append((handler, _OursOrWarnings()))
            handler.addFilter(added[-1][1])
    return added


def _terminate_gracefully(signum, frame):
    raise KeyboardInterrupt  # SIGTERM: stop the roles like Ctrl-C does


def conduct(cfg: Config, launch: LocalLaunch | None = None) -> Outcome:
    """The rl stage: prepare the run directory, then run the roles here, or, with launcher.detach, submit a
    conductor job that runs them and return at once. `launch`: the stages' (its fork server serves the roles too);
    without one, a local attached run starts its own fork server when launcher.fork_server asks for it."""
    own = None
    try:
        run, cfg, fork_server = prepare(cfg, launch=launch)
        if fork_server is not None:
            launch = own = LocalLaunch(fork_server)
        if cfg.launcher.name == "slurm" and not in_allocation():
            signal.signal(signal.SIGTERM, _terminate_gracefully)
            return submit_pipeline(run, cfg, _allocation_main)
        if cfg.launcher.detach:
            return detach(run, cfg)
        signal.signal(signal.SIGTERM, _terminate_gracefully)
        return run_roles(run, cfg, launch, close_launch=own is not None)
    finally:  # every exit, an error included, and each point of a multirun (each comes through here)
        if own is not None:
            own.close()  # run_roles closes it once the roles have ended; this covers the other exits


class RunFailed(RuntimeError):
    """A conductor job's run ended badly (failed or interrupted): the job fails with it."""


def _allocation_main(run_dir: str) -> dict:
    """The batch step of the pipeline's SLURM job: the conductor, whose roles are srun steps of this job."""
    os.environ[ALLOCATION_ENV] = "1"
    signal.signal(signal.SIGTERM, _terminate_gracefully)  # scancel / the end of the time limit: stop the roles
    run = RunDir(run_dir)
    asked = run.stop_reason()  # the stop the conductor of a lost allocation asked for is not the user's: resume
    if asked is not None and not asked.asked_by_user:
        run.stop_file.unlink(missing_ok=True)
    return drive(run_dir)


def detach(run: RunDir, cfg: Config) -> Outcome:
    executor = make_executor(cfg.launcher, run.jobs, "conductor", "cpu")
    with _detached_stdio():
        job = executor.submit(drive, str(run.root))
    print(f"prime_values: detached; conductor job {job.job_id} runs the roles of {run.root}\n"
          f"  follow it:  python -m prime_values.tools.status {run.root}\n"
          f"  stop it:    python -m prime_values.tools.status {run.root} --stop", flush=True)
    return Outcome(Ending.DETACHED, result={"status": "detached", "run_dir": str(run.root),
                                            "conductor_job": str(job.job_id)})


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
    """The conductor job of a detached run (and the batch step of the pipeline's SLURM job): the same loop as an
    attached conductor, from the run directory. Returns the run's summary; a run that failed or was interrupted
    fails the job (RunFailed), its summary in the run directory."""
    run = RunDir(run_dir)
    cfg = load_saved(run.config)
    run.register_conductor(watch=cfg.launcher.name == "local")
    outcome = run_roles(run, cfg)
    if outcome.failed:
        raise RunFailed(f"the run failed; see {run.report / 'summary.json'}")
    return outcome.result


def run_roles(run: RunDir, cfg: Config, launch: LocalLaunch | None = None, close_launch: bool = False) -> Outcome:
    """Run the roles of the rl stage from this process until the policy trainer ends. `launch`: how the local role
    jobs start (its fork server, when it has one, is waited for before the first); with `close_launch` it is closed
    once the roles have ended."""
    quiet_libraries()
    launch = launch or LocalLaunch()
    fleet = Supervisor(run, cfg, launch)
    progress = LiveView(run, cfg.steps)
    print(f"prime_values: run directory {run.root}", flush=True)
    ending, failure = Ending.FINISHED, None
    if run.done_file("policy_trainer").exists() and (latest_version(run.weights("policy")) or 0) >= cfg.steps:
        print(f"prime_values: this run already finished all {cfg.steps} steps; nothing to redo", flush=True)
        summary = summarise(run, status="finished")
        print(format_summary(summary), flush=True)
        if close_launch:
            launch.close()
        return Outcome(Ending.FINISHED, result=summary)
    sink = start_forwarder(run, cfg)  # forwards metrics/*.jsonl to W&B; a no-op with wandb.mode=disabled
    launch.wait_ready()
    try:
        cache = WarmStartCache.of(cfg)  # policy.warm_start.cache: an earlier run's version 0, where it is the same
        if cache is not None and latest_version(run.weights("policy")) is not None:
            cache = None  # a resumed run keeps its own version 0, and it is not stored under today's key
        elif cache is not None and cache.restore(run):
            print(f"prime_values: version 0 from the warm-start cache {cache.entry} (policy.warm_start.cache=false "
                  f"makes a new one)", flush=True)
            cache = None
        warm = fleet.submit("warm_start", "warm_start", cfg.topology.policy_trainer_device)
        while fleet.check() is not warm:
            _poll(run, progress, cfg)
        if cache is not None:
            cache.store(run)
        fleet.start_roles()
        while (ended := fleet.check()) is None or ended.role != "policy_trainer":
            _poll(run, progress, cfg)
    except RoleFailed as error:
        ending, failure = Ending.FAILED, str(error)
    except KeyboardInterrupt:
        ending, failure = Ending.INTERRUPTED, "interrupted by the user"
    except StopRequested as stop:
        ending, failure = Ending.STOPPED, str(stop)
    finally:
        fleet.stop(STOP_REASONS[ending], cfg.launcher.stop_grace_s)
        if close_launch:
            launch.close()
    progress.show(final=True)
    outcome = Outcome(ending, failure, summarise(run, status=ending.value, error=failure))
    sink.close(outcome.result, exit_code=1 if outcome.failed else 0)  # the W&B run's exit code
    report(run, outcome.result, cfg.log.plots)
    try:
        after_point(run.root)  # inside a multirun: refresh the sweep's one-row-per-point summary
    except Exception as error:  # noqa: BLE001 - the sweep summary is a convenience; the run's outcome stands
        print(f"prime_values: could not write the sweep summary ({type(error).__name__}: {error})", file=sys.stderr)
    if outcome.failed:
        print(f"prime_values: {failure}", file=sys.stderr, flush=True)
    return outcome


# what the conductor writes to control/STOP when it stops the roles at the end of a run
STOP_REASONS = {Ending.FINISHED: StopReason.FINISHED, Ending.FAILED: StopReason.FAILED,
                Ending.INTERRUPTED: StopReason.INTERRUPTED, Ending.STOPPED: StopReason.STOPPED}


def report(run: RunDir, summary: dict, plots: bool) -> None:
    """Print the summary, then write the report (and, with `plots`, draw its plots) and print where it is; a
    library's INFO records stay off the console meanwhile (`quiet_libraries`)."""
    quiet_libraries()
    print(format_summary(summary), flush=True)
    try:
        where = write_report(run, summary, plots=plots)
        print(f"report               {where}{' (plots next to it)' if plots else ''}", flush=True)
    except Exception as error:  # noqa: BLE001 - the plots are a convenience; the run's outcome stands
        print(f"prime_values: could not write the plots ({type(error).__name__}: {error}); "
              f"retry with python -m prime_values.tools.report {run.root}", file=sys.stderr, flush=True)


def wants_fork_server(cfg: Config) -> bool:
    """Whether launcher.fork_server asks for a fork server for this process's jobs: a local attached run, not
    inside a SLURM allocation."""
    return bool(cfg.launcher.name == "local" and cfg.launcher.fork_server and not cfg.launcher.detach
                and not in_allocation())


def _poll(run: RunDir, progress: LiveView, cfg: Config) -> None:
    """One tick of the conductor's loop: refresh the view, notice a stop asked for from outside
    (`python -m prime_values.tools.status <run> --stop`), wait."""
    progress.show()
    if run.stop_requested():
        raise StopRequested(f"stop requested through {run.stop_file}")
    time.sleep(cfg.launcher.poll_s)
