"""`python -m prime_values.tools.status <run_dir>`: where a run stands, from its run directory alone.

Prints the view the conductor shows (`prime_values.tools.live`: policy step and ETA, reward, held-out accuracy,
critic version and explained variance, off-policy lag, replay, each role's state and throughput), then one
line per role job: its job id and state. Works for a run in progress, a finished one, and one whose conductor
is gone: local jobs are looked up by pid (a local job's id is its pid); with launcher=slurm the pipeline's one job
through squeue/sacct (`prime_values.launch.slurm.job_states`; while it is pending the first line says so: "queued:
7 CPUs on partition debug (job 12: Resources)"), and its roles (srun steps) from their exit state files.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

from prime_values.rundir import RunDir, StopReason, process_alive
from prime_values.tools.live import LiveView


def role_jobs(run: RunDir) -> dict[str, str]:
    """{role job name: newest submitit job id}, from the `<id>_submitted.pkl` files under jobs/."""
    jobs = {}
    for folder in sorted(p for p in run.jobs.iterdir() if p.is_dir()) if run.jobs.is_dir() else []:
        pickles = sorted(folder.glob("*_submitted.pkl"), key=lambda p: p.stat().st_mtime)
        if pickles:
            jobs[folder.name] = pickles[-1].name.split("_")[0]
    return jobs


def local_state(run: RunDir, name: str, job_id: str, ended: bool) -> str:
    if run.done_file(name).exists():
        return "COMPLETED"
    if ended or not job_id.isdigit():  # the run is over: a pid seen now may belong to another process
        return "ENDED"
    try:  # the job's pid and start time as the launcher recorded them: a reused pid is not the job
        created = json.loads((run.jobs / name / f"{job_id}_process.json").read_text())["create_time"]
    except (OSError, ValueError, KeyError):
        created = None  # a job launched before the start time was recorded: the pid alone
    return "RUNNING" if process_alive(int(job_id), created) else "ENDED"


def job_lines(run: RunDir, cfg, ended: bool) -> list[str]:
    jobs = role_jobs(run)
    if cfg.launcher.name == "slurm" and "pipeline" in jobs:
        # one allocation: the pipeline job's SLURM state; its roles are srun steps (an exit state once ended)
        import submitit

        from prime_values.launch.slurm import job_states

        pipeline = job_states({"pipeline": submitit.SlurmJob(folder=run.jobs / "pipeline",
                                                             job_id=jobs["pipeline"])})["pipeline"]
        states = {"pipeline": pipeline}
        for name, job_id in jobs.items():
            if name != "pipeline":
                ended = (run.jobs / name / f"{job_id}_exit.json").exists() or pipeline != "RUNNING"
                states[name] = "COMPLETED" if run.done_file(name).exists() else "ENDED" if ended else "RUNNING"
    elif cfg.launcher.name == "slurm":  # a run of the sft/eval stages: their jobs are sbatch jobs
        import submitit

        from prime_values.launch.slurm import job_states

        states = job_states({name: submitit.SlurmJob(folder=run.jobs / name, job_id=job_id)
                             for name, job_id in jobs.items()})
    else:
        states = {name: local_state(run, name, job_id, ended) for name, job_id in jobs.items()}
    return [f"  {name:<16} job {job_id:<10} {states.get(name, 'UNKNOWN')}" for name, job_id in jobs.items()]


def status(run_dir: str | Path) -> str:
    run = RunDir(run_dir)
    cfg = OmegaConf.load(run.config)
    summary = run.report / "summary.json"
    ended = json.loads(summary.read_text())["status"] if summary.exists() else None
    progress = LiveView(run, cfg.steps)
    times = [json.loads(line)["time"] for p in run.root.glob("metrics/*.jsonl")
             for line in (lambda lines: lines[:1] + lines[-1:])(p.read_text().splitlines())]
    progress.started = min(times, default=progress.started)
    if ended:  # elapsed up to the last metric, not up to now
        progress.clock = lambda: max(times, default=progress.started)
    queued = None
    if cfg.launcher.name == "slurm" and not ended and "pipeline" in role_jobs(run):
        from prime_values.launch.slurm import queued_line

        queued = queued_line(role_jobs(run)["pipeline"])  # "queued: 7 CPUs on partition debug (job 12: Resources)"
    state = f"ended, {ended}" if ended else queued or "running"
    head = f"run {run.root} ({cfg.launcher.name}): {state}" + \
        ("; stop requested" if run.stop_requested() and not ended else "")
    return "\n".join([head, *progress.lines(final=bool(ended)), "jobs:", *job_lines(run, cfg, bool(ended))])


USAGE = "usage: python -m prime_values.tools.status <run_dir> [--stop]"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + __doc__.strip())
        return 0
    stop = "--stop" in argv
    argv = [a for a in argv if a != "--stop"]
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").exists():
        print(USAGE + "  (a directory holding config.yaml)", file=sys.stderr)
        return 2
    if stop:  # the conductor (attached or a detached conductor job) sees it, stops every role, writes the summary
        RunDir(argv[0]).request_stop(StopReason.USER)
        print(f"stop requested: {RunDir(argv[0]).stop_file}")
    print(status(argv[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
