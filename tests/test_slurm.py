"""A real one-node SLURM (launchers/local_slurm/start.sh: Debian's Slurm + munge + slurmdbd/MariaDB) and real
submitit jobs submitted through prime_values.launch.slurm. Skipped only when the cluster cannot be started
here: not root, or apt cannot install the packages. Each test uses its own submitit folder."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from prime_values.launch.slurm import FINISHED, cancel_all, job_states, make_slurm_executor, parse_extra_sbatch

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "launchers" / "local_slurm" / "start.sh"
SKIP_CODES = {2, 3}  # start.sh: not root | cannot install the packages

# The jobs unpickle these test functions; the tests directory is not importable there, so send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="session")
def slurm():
    """Start (or find running) the local cluster; return its `scontrol show config` as a dict."""
    if os.geteuid() != 0:
        pytest.skip("local SLURM needs root: run `sudo launchers/local_slurm/start.sh` first, or the tests as root")
    # 8 advertised CPUs: a run's 4-5 role jobs (1 CPU each) must all run at once; nothing is enforced
    # without cgroups, so advertising more than the machine has is safe
    proc = subprocess.run([str(START)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "LOCAL_SLURM_CPUS": "8"})
    if proc.returncode in SKIP_CODES:
        pytest.skip(f"local SLURM cannot be installed here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, f"start.sh exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if v}


def executor(folder, **overrides):
    params = dict(time_min=5, cpus_per_task=1, mem_gb=0.25, job_name="pv_test")
    return make_slurm_executor(folder, **{**params, **overrides})


def wait_states(jobs, accept, timeout=30.0, poll=0.1):
    """Poll job_states until every job's state is in `accept`; return the states (or fail with them)."""
    deadline = time.monotonic() + timeout
    while True:
        states = job_states(jobs)
        if all(state in accept for state in states.values()):
            return states
        if time.monotonic() > deadline:
            pytest.fail(f"jobs not in {sorted(accept)} after {timeout} s: {states}")
        time.sleep(poll)


def add_and_say(a, b):
    print(f"hello from SLURM job {os.environ.get('SLURM_JOB_ID')}", flush=True)
    return a + b


def timed_sleep(seconds):
    start = time.time()
    time.sleep(seconds)
    return start, time.time()


def test_extra_sbatch_forms():
    assert parse_extra_sbatch(None) == {}
    assert parse_extra_sbatch({"mail-type": "END"}) == {"mail-type": "END"}
    assert parse_extra_sbatch(["--exclusive", "--mail-type=END"]) == {"exclusive": True, "mail-type": "END"}
    with pytest.raises(ValueError, match="long options"):
        parse_extra_sbatch(["-x"])


@pytest.mark.slow  # a real SLURM daemon
def test_result_comes_back_with_its_log(slurm, tmp_path):
    ex = executor(
        tmp_path, partition="debug", account="root", qos="normal", constraint="local", extra_sbatch=["--comment=pv"]
    )
    job = ex.submit(add_and_say, 2, 3)
    assert wait_states([job], FINISHED)[job.job_id] == "COMPLETED"
    assert job.result() == 5
    # every launcher setting reached sbatch, and the job's stdout log is in the executor's folder
    script = job.paths.submission_file.read_text()
    for flag in ("partition=debug", "account=root", "qos=normal", "constraint=local", "comment=pv", "time=5"):
        assert f"#SBATCH --{flag}" in script
    assert job.paths.stdout.parent == tmp_path and job.paths.stdout.exists()
    assert f"hello from SLURM job {job.job_id}" in job.stdout()


@pytest.mark.slow  # a real SLURM daemon
def test_two_jobs_run_concurrently(slurm, tmp_path):
    assert int(slurm.get("DefMemPerCPU", "0")) > 0, "without DefMemPerCPU one job takes the whole node"
    cpus = int(subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0])
    assert cpus >= 2, f"the node has {cpus} CPU: restart it with `LOCAL_SLURM_CPUS=2 launchers/local_slurm/start.sh`"
    ex = executor(tmp_path)
    jobs = {name: ex.submit(timed_sleep, 4) for name in ("a", "b")}
    assert wait_states(jobs, {"RUNNING"} | FINISHED, timeout=20) == {"a": "RUNNING", "b": "RUNNING"}
    (start_a, end_a), (start_b, end_b) = (jobs[n].result() for n in ("a", "b"))
    assert max(start_a, start_b) < min(end_a, end_b)  # their sleeps overlapped
    assert wait_states(jobs, FINISHED) == {"a": "COMPLETED", "b": "COMPLETED"}


@pytest.mark.slow  # a real SLURM daemon
def test_cancel_all_cancels_a_sleeping_job(slurm, tmp_path):
    ex = executor(tmp_path)
    job = ex.submit(time.sleep, 300)
    wait_states([job], {"RUNNING"}, timeout=20)
    assert cancel_all({"sleeper": job}) == [job.job_id]
    assert wait_states({"sleeper": job}, FINISHED, timeout=30) == {"sleeper": "CANCELLED"}
    if slurm["AccountingStorageType"] == "accounting_storage/none":
        # documented limitation: without sacct, submitit itself never learns that the job is over
        assert not job.done(force_check=True) and job.state == "UNKNOWN"
    else:
        # with slurmdbd, submitit's own view agrees (sacct records arrive a moment after slurmctld's)
        deadline = time.monotonic() + 15
        while not job.done(force_check=True) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert job.done() and job.state.startswith("CANCELLED")


@pytest.mark.slow  # a real SLURM daemon
def test_a_run_with_every_role_a_slurm_job(slurm, tmp_path):
    """launcher=slurm end to end: warm start, then the roles as sbatch jobs; the conductor sees them finish and
    cancels what is left; nothing stays queued."""
    run_dir = tmp_path / "run"
    small = ["+experiment=arith", "advantage=grpo", "steps=3", "eval_every=3", "policy.warm_start.steps=5",
             "task.heldout_size=8", "inference.prompts_per_step=2", "inference.group_size=2",
             "policy.arch.hidden_size=64", "policy.arch.num_heads=2", "policy.arch.num_kv_heads=1",
             "policy.arch.intermediate_size=128", "launcher=slurm", "launcher.poll_s=0.5", "launcher.stop_grace_s=15"]
    result = subprocess.run([sys.executable, "-m", "prime_values", *small, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "== prime_values run finished ==" in result.stdout
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == "3"
    ids = [p.name.split("_")[0] for p in (run_dir / "jobs").glob("*/*_log.out")]
    assert len(ids) == 4, ids  # warm_start, inference0, orchestrator, policy_trainer: each its own SLURM job
    queued = subprocess.run(["squeue", "-h", "-j", ",".join(ids)], capture_output=True, text=True).stdout.strip()
    assert not queued, f"jobs left in the queue after the run:\n{queued}"
    from prime_values.status import status

    shown = status(run_dir)  # job states from SLURM: every role left when asked to stop (or was cancelled)
    assert "(slurm): ended, finished" in shown and "policy step 3/3" in shown, shown
    jobs = shown.split("\njobs:\n", 1)[1]  # the job table after the live view's lines
    states = {line.split()[0]: line.split()[-1] for line in jobs.splitlines() if line.startswith("  ")}
    assert set(states) == {"warm_start", "inference0", "orchestrator", "policy_trainer"}, shown
    assert states["policy_trainer"] == "COMPLETED" and set(states.values()) <= {"COMPLETED", "CANCELLED"}, shown


@pytest.mark.slow  # a real SLURM daemon
def test_launcher_slurm_config_is_checked_against_the_cluster(slurm):
    from prime_values.__main__ import precheck

    line = precheck(["+experiment=arith", "launcher=slurm", "launcher.partition=nope"])
    assert line is not None and "launcher.partition='nope' is not a partition" in line and "debug" in line, line
    assert precheck(["+experiment=arith", "launcher=slurm"]) is None  # the local cluster has a default partition
