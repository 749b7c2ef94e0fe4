"""The pipeline submitter (launcher=slurm, from a login node): the rl stage as one sbatch job sized for every role
at once, followed from here (queued and why, then the live view read from the run directory), resubmitted when
the allocation is lost (node failure, preemption) within the restart budget of the supervisor, and stopped
cleanly on Ctrl-C. The conductor inside the allocation runs the roles as srun steps (prime_values.conductor)."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

from prime_values.rundir import RunDir, StopReason, write_atomic
from prime_values.supervisor import Ending, Outcome, RestartBudget, StopRequested
from prime_values.tools.live import LiveView
from prime_values.tools.summary import format_summary, summarise

LOST = {"NODE_FAIL", "PREEMPTED", "BOOT_FAIL"}  # the allocation was lost, not the run: requeue and resume
LOST_GRACE_S = 30.0  # how long a lost job may take to be requeued by SLURM itself before it is resubmitted

if TYPE_CHECKING:
    from prime_values.config import Config


def submit_pipeline(run: RunDir, cfg: Config, allocation_main) -> Outcome:
    """launcher=slurm: the rl stage as one sbatch job for all roles (prime_values.launch.slurm), followed from here:
    queued (and why), then the live view from the run directory; a lost allocation is resubmitted (launcher.
    max_restarts per launcher.restart_window_s, the supervisor's RestartBudget) and the next one resumes the run;
    Ctrl-C stops it cleanly. `allocation_main(run_dir)`: the batch step (the conductor inside the allocation)."""
    from prime_values.launch.slurm import (
        cancel_all,
        describe_request,
        job_states,
        make_slurm_executor,
        pipeline_request,
        queued_line,
    )

    request, launcher = pipeline_request(cfg), cfg.launcher
    # one node: SLURM itself requeues the job after a node failure. Over several nodes the lost job ends and a fresh
    # one is submitted here: a requeued job keeps its id and the records of the steps that ran on the lost node,
    # and on Slurm 22.05 (the local cluster, 2026-12-03) the requeued allocation then refused every step on the
    # returned node ("--relative and --nodes option incompatible with count of allocated nodes (1+1>1)",
    # "Requested nodes are busy"); a fresh job has none
    requeue = request["nodes"] == 1
    extra = {**dict(launcher.extra_sbatch), "requeue" if requeue else "no-requeue": True}
    grace_s = LOST_GRACE_S if requeue else 0.0
    executor = make_slurm_executor(
        run.jobs / "pipeline", partition=launcher.partition, account=launcher.account, qos=launcher.qos,
        constraint=launcher.constraint, extra_sbatch=extra, setup=list(launcher.setup),
        time_min=launcher.timeout_min, job_name="pv_pipeline", gpus_per_node=request["gpus"], tasks_per_node=1,
        cpus_per_task=request["cpus"], mem_gb=launcher.mem_gb, nodes=request["nodes"],
        # over several nodes the batch step still runs one conductor, on the first node; the roles' steps go to theirs
        srun_args=["--nodes=1", "--ntasks=1"] if request["nodes"] > 1 else None)
    progress = LiveView(run, cfg.steps)
    print(f"prime_values: run directory {run.root}\nprime_values: one allocation for the pipeline: "
          f"{describe_request(request)}", flush=True)
    job = executor.submit(allocation_main, str(run.root))
    print(f"prime_values: submitted pipeline job {job.job_id}", flush=True)
    if launcher.detach:
        print(f"prime_values: detached; follow it:  python -m prime_values.tools.status {run.root}\n"
              f"  stop it:    python -m prime_values.tools.status {run.root} --stop", flush=True)
        return Outcome(Ending.DETACHED, result={"status": "detached", "run_dir": str(run.root),
                                                "conductor_job": str(job.job_id)})
    budget = RestartBudget.of(launcher)  # the budget of a role, for the whole allocation
    shown_queue, reason, lost_since, interrupted = None, None, None, False
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
            if state in LOST and time.time() - lost_since >= grace_s:  # SLURM did not requeue it (or was not to)
                cancel_all([job])  # never two allocations on one run directory
                if budget.spent(time.time()):
                    reason = f"the pipeline's allocation was lost ({state}){budget.exhausted()}"
                    break
                budget.charge(time.time())
                lost_since = None
                job = executor.submit(allocation_main, str(run.root))
                print(f"\nprime_values: the pipeline's allocation was lost ({state}); resubmitted as job "
                      f"{job.job_id}: the run resumes from its run directory", flush=True)
                continue
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "DEADLINE", "REVOKED"):
                if state != "COMPLETED":
                    reason = f"the pipeline job {job.job_id} ended {state} (log: {job.paths.stderr})"
                break
            if run.stop_reason() in (StopReason.USER, StopReason.USER_INTERRUPT):  # not a conductor's own stop
                raise StopRequested(f"stop requested through {run.stop_file}")
            time.sleep(max(cfg.launcher.poll_s, 1.0))
    except (KeyboardInterrupt, StopRequested) as stop:
        if isinstance(stop, KeyboardInterrupt):  # (a StopRequested: the user's stop file is there already)
            run.request_stop(StopReason.USER_INTERRUPT)
        deadline = time.time() + cfg.launcher.stop_grace_s + 30
        while time.time() < deadline and job_states([job]).get(job.job_id) not in (
                "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"):
            time.sleep(1)
        cancel_all([job])
        interrupted = isinstance(stop, KeyboardInterrupt)
        reason = "interrupted by the user" if interrupted else None
    (run.root / "control" / "queued").unlink(missing_ok=True)
    progress.show(final=True)
    summary_file = run.report / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else \
        summarise(run, status="failed" if reason else "stopped", error=reason)
    print(format_summary(summary), flush=True)
    failure = (summary.get("error") if summary.get("status") == "failed" else None) or reason
    if failure:
        print(f"prime_values: {failure}", file=sys.stderr, flush=True)
        return Outcome(Ending.INTERRUPTED if interrupted else Ending.FAILED, failure, summary)
    return Outcome(Ending.STOPPED if summary.get("status") == "stopped" else Ending.FINISHED, result=summary)
