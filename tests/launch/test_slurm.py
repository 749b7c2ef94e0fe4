"""A real one-node SLURM (launchers/local_slurm/start.sh: Debian's Slurm + munge + slurmdbd/MariaDB) and real
submitit jobs submitted through prime_values.launch.slurm. Skipped only when the cluster cannot be started
here: not root, or apt cannot install the packages. Each test uses its own submitit folder."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import cloudpickle
import pytest

from prime_values.launch.slurm import (
    FINISHED,
    _squeue_states,
    cancel_all,
    job_states,
    make_slurm_executor,
    parse_extra_sbatch,
)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "launchers" / "local_slurm"))
import cluster  # noqa: E402  (launchers/local_slurm/cluster.py: the local cluster, driven from Python)

START = cluster.START
SKIP_CODES = {2, 3}  # start.sh: not root | cannot install the packages

# The jobs unpickle these test functions; the tests directory is not importable there, so send them by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Start (or find running) the local cluster, cancel what an earlier, interrupted run of these tests left in its
    queue; return its `scontrol show config` as a dict."""
    if os.geteuid() != 0:
        pytest.skip("local SLURM needs root: run `sudo launchers/local_slurm/start.sh` first, or the tests as root")
    # the node advertises the machine's real CPUs (2 here): a pipeline is one allocation its roles share. Set but
    # empty, so start.sh does not reuse a LOCAL_SLURM_CPUS an earlier start saved (launchers/local_slurm/common.sh)
    env = {**os.environ, "LOCAL_SLURM_CPUS": "", "LOCAL_SLURM_NODES": ""}  # one node (a two-node test restores it)
    proc = subprocess.run([str(START)], capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode in SKIP_CODES:
        pytest.skip(f"local SLURM cannot be installed here: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, f"start.sh exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    cancel_jobs_of_earlier_runs(tmp_path_factory.getbasetemp())
    out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True).stdout
    return {k.strip(): v.strip() for k, _, v in (line.partition("=") for line in out.splitlines()) if v}


def cancel_jobs_of_earlier_runs(basetemp: Path) -> list[str]:
    """Cancel the jobs an earlier run of these tests left queued or running: a run stopped mid-test (its machine
    stopped, or it was killed) leaves its jobs in slurmctld's saved state, requeued by the next start.sh, and they
    would take the node this run's jobs wait for. Every test job writes its log under its test's temporary directory,
    so theirs lie under pytest's temporary root but outside this run's directory (the parent of a pytest-xdist
    worker's own)."""
    this_run = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    out = subprocess.run(["squeue", "-h", "-O", "JobID:30,StdOut:4096"], capture_output=True, text=True).stdout
    stale = []
    for line in out.splitlines():
        job_id, _, stdout = line.strip().partition(" ")
        log = Path(stdout.strip())
        if log.is_relative_to(this_run.parent) and not log.is_relative_to(this_run):
            stale.append(job_id)
    if stale:
        subprocess.run(["scancel", *stale], check=True)
    return stale


def queue() -> str:
    """The queue as squeue sees it, with each job's reason (what a job waits for), and the nodes' states."""
    jobs = subprocess.run(["squeue", "-o", "%i %j %T %r %M"], capture_output=True, text=True).stdout
    nodes = subprocess.run(["sinfo", "-N", "-o", "%N %P %T %E"], capture_output=True, text=True).stdout
    return f"{jobs}{nodes}"


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
            pytest.fail(f"jobs not in {sorted(accept)} after {timeout} s: {states}; the queue:\n{queue()}")
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


@pytest.mark.slow  # a real SLURM daemon, restarted
def test_a_job_the_machine_stopped_under_is_requeued_and_frees_its_node(slurm, tmp_path):
    """After a power cut, slurmctld's saved state still has the job running; no slurmd reports it when the machine
    comes back, and SLURM would leave it holding every CPU of the node until its time limit. start.sh requeues it (as
    SLURM does after a node failure), so a new job runs at once."""
    cpus = str(sum(cluster.nodes().values()))
    held = subprocess.run(["sbatch", "--parsable", "--requeue", "-J", "pv_test", "-c", cpus, "--mem=100M",
                           "-o", str(tmp_path / "held.out"), "--wrap", "sleep 300"],
                          capture_output=True, text=True, check=True).stdout.strip()
    try:
        wait_job_id(held, "RUNNING", timeout=20)
        assert cluster.power_cut(), "no process of the cluster to kill"
        cluster.start()
        wait_job_id(held, "PENDING", timeout=30)  # requeued: it ends (COMPLETING), then waits out the requeue delay
        ex = executor(tmp_path)
        job = ex.submit(add_and_say, 1, 2)
        assert wait_states([job], FINISHED)[job.job_id] == "COMPLETED"
    finally:
        subprocess.run(["scancel", held])


def wait_job_id(job_id: str, state: str, timeout: float) -> None:
    """Poll slurmctld until the job (submitted without submitit) is in `state`, or fail with the queue."""
    deadline = time.monotonic() + timeout
    while _squeue_states([job_id]).get(job_id) != state:
        assert time.monotonic() < deadline, f"job {job_id} not {state} after {timeout} s:\n{queue()}"
        time.sleep(0.2)


# the full critic pipeline, small: gae, privileged critic, dedicated evaluator, a two-process policy trainer
PIPELINE = cluster.PIPELINE  # the small critic pipeline the SLURM tests run


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "prime_values", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})


def sacct_rows(job_id: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-n", "-P", "-D", "-j", job_id, "-o", "JobID,JobName,State"], capture_output=True,
                         text=True).stdout
    return [line.split("|") for line in out.splitlines() if line]


def _job(run_dir: Path, job_id: str):
    import submitit

    return submitit.SlurmJob(folder=run_dir / "jobs" / "pipeline", job_id=job_id)


def _wait_step(run_dir: Path, step: int, proc, timeout: float = 300) -> None:
    from prime_values.tools.chaos import policy_step

    deadline = time.monotonic() + timeout
    while policy_step(run_dir) < step:
        assert proc.poll() is None, f"the run ended before policy step {step}"
        assert time.monotonic() < deadline, f"no policy step {step} after {timeout} s"
        time.sleep(0.5)


@pytest.mark.slow  # a real SLURM daemon
def test_the_critic_pipeline_runs_in_one_allocation(slurm, tmp_path):
    """launcher=slurm end to end on the node's real CPUs: the whole critic pipeline is one sbatch job (2 CPUs its
    roles share), each role an srun step of it (the policy trainer two processes). A killed role comes back as a
    new step of the same allocation; a requeued allocation (what a node failure or preemption does) resumes the run.
    It finishes, nothing is left queued, and prime_values.tools.check finds nothing lost."""
    from prime_values.tools.chaos import kill_role, recovery_times

    run_dir = tmp_path / "run"
    args = [o for o in PIPELINE if not o.startswith(("steps=", "eval_every="))] + ["steps=10", "eval_every=10"]
    proc = subprocess.Popen([sys.executable, "-m", "prime_values", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    try:
        _wait_step(run_dir, 2, proc)
        killed_at = time.time()
        assert kill_role(run_dir, "inference0"), "no inference0 process to kill"
        _wait_step(run_dir, 4, proc)
        # the policy may reach step 4 on rollouts already queued: requeue only once the replacement step has
        # written a segment, so that the allocation holds the three inference0 steps asserted below
        deadline = time.monotonic() + 300
        while recovery_times(run_dir, [{"role": "inference0", "at": killed_at}]) == [None]:
            assert proc.poll() is None and time.monotonic() < deadline, "no inference0 segment after the kill"
            time.sleep(0.5)
        pipeline = [p.name.split("_")[0] for p in (run_dir / "jobs" / "pipeline").glob("*_submitted.pkl")]
        assert len(pipeline) == 1, pipeline
        subprocess.run(["scontrol", "requeue", pipeline[0]], check=True, capture_output=True)
        # SLURM holds a requeued job ~2 min (BeginTime); the test does not wait that out
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job_states([_job(run_dir, pipeline[0])])[pipeline[0]] != "PENDING":
            time.sleep(0.5)
        subprocess.run(["scontrol", "update", f"JobId={pipeline[0]}", "StartTime=now"], capture_output=True)
        out, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-4000:]
    assert "== prime_values run finished ==" in out and "one allocation for the pipeline: 2 CPUs on one node" in out
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == "10"
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    inside = "".join(p.read_text(errors="replace") for p in (run_dir / "jobs" / "pipeline").glob("*_log.out"))
    assert "role inference0 failed: killed by signal 9" in inside, inside[-3000:]
    assert inside.count("prime_values: run directory") == 2, "the requeued allocation did not run the conductor again"
    assert not subprocess.run(["squeue", "-h", "-j", pipeline[0]], capture_output=True, text=True).stdout.strip()
    if slurm["AccountingStorageType"] != "accounting_storage/none":
        deadline = time.monotonic() + 180  # sacct records the steps a moment after they end (60 s once too few, loaded)
        while time.monotonic() < deadline:
            steps = [row[1] for row in sacct_rows(pipeline[0])]
            if steps.count("pv_inference0") >= 3 and "pv_value_trainer" in steps:
                break
            time.sleep(1)
        assert {"pv_warm_start", "pv_policy_trainer", "pv_value_trainer", "pv_evaluator"} <= set(steps), steps
        # the first allocation's worker, its replacement step after the kill, the requeued allocation's worker
        assert steps.count("pv_inference0") >= 3, steps
    assert list((run_dir / "jobs" / "policy_trainer").glob("*_1_log.err")), "no second policy trainer process"
    from prime_values.tools.status import status

    shown = status(run_dir)
    assert "(slurm): ended, finished" in shown and "pipeline" in shown, shown


@pytest.mark.slow  # a real SLURM daemon
def test_a_pipeline_too_big_for_the_partition_fails_in_one_line(slurm, tmp_path):
    result = cli("+experiment=arith", "launcher=slurm", "launcher.cpus=64", f"hydra.run.dir={tmp_path / 'run'}",
                 timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "asks for 64 CPUs on one node" in lines[0] and "partition debug has nodes of at most 2 CPUs" in lines[0]
    assert not (tmp_path / "run").exists()


def test_placement_over_nodes_and_what_each_node_is_asked_for():
    """launcher.nodes / launcher.placement.* (no cluster needed): the rule, the per-node request, the GPU positions
    of a trainer over two nodes, and one sentence for each layout that cannot be."""
    from prime_values.launch.slurm import describe_request, gpu_offsets, pipeline_request, placement_problem, role_nodes
    from tests.e2e_helpers import compose

    cfg = compose(["+experiment=arith", "topology.policy_trainer_procs=2"])
    cfg.topology.policy_trainer_device, cfg.topology.value_trainer_device = "cuda:0", "cuda:2"  # (no GPU here)
    assert [role_nodes(cfg, r) for r in ("inference", "orchestrator", "policy_trainer")] == [[0], [0], [0]]
    cfg.launcher.nodes = 2
    assert placement_problem(cfg) is None
    assert [role_nodes(cfg, r) for r in ("inference", "evaluator", "policy_trainer", "value_trainer")] == \
        [[0], [0], [1], [1]]
    request = pipeline_request(cfg)
    assert (request["nodes"], request["cpus"], request["gpus"]) == (2, 4, 3), request  # node 1: 3 trainer ranks
    cfg.launcher.placement.policy_trainer = [0, 1]
    request = pipeline_request(cfg)
    assert (request["cpus"], request["gpus"]) == (5, 2), request  # 3 roles + a rank + the conductor on node 0
    assert describe_request(request) == ("5 CPUs and 2 GPUs on each of 2 nodes (node 0: inference0, evaluator, "
                                         "orchestrator, policy_trainer, the conductor; node 1: policy_trainer, "
                                         "value_trainer)")
    assert gpu_offsets(cfg) == {"warm_start": 0, "policy_trainer": 0, "value_trainer": 1}
    for key, value, words in (("policy_trainer", [0, 2], "outside the allocation's 0..1"),
                              ("inference", [0, 1], "only a trainer spans nodes"),
                              ("value_trainer", "x", "give a node index"),
                              ("policy_trainer", [1, 0], "must be consecutive")):
        cfg.launcher.placement[key] = value
        assert words in (placement_problem(cfg) or ""), (key, value, placement_problem(cfg))
        cfg.launcher.placement[key] = None
    cfg.topology.policy_trainer_procs = 3
    cfg.launcher.placement.policy_trainer = [0, 1]
    assert "do not split evenly over 2 nodes" in placement_problem(cfg)
    cfg.launcher.placement.policy_trainer = None
    cfg.launcher.nodes = 3
    assert "no role runs on node 2" in placement_problem(cfg)


def test_the_cause_of_a_step_over_two_nodes_is_the_rank_that_failed(tmp_path):
    """One controller per rank writes its own exit state (rank 0 `<id>_exit.json`, rank r `<id>_exit.<r>.json`);
    the step's cause is the rank that failed by itself, not the one the step's end then signalled."""
    from prime_values.launch.local import LocalRoleJob

    def state(rank, code, failed, signum, node):
        return json.dumps({"codes": [code], "final": [code], "failed_task": failed, "timeout": False,
                           "signal": signum, "first_task": rank, "node": node})

    (tmp_path / "7_exit.json").write_text(state(0, -15, 0, 15, "n1"))
    (tmp_path / "7_exit.1.json").write_text(state(1, -9, 0, None, "n2"))
    job = LocalRoleJob(folder=tmp_path, job_id="7", process=None, tasks=[0])
    assert job.exit_cause() == (True, "killed by signal 9 (process 1 of 2, on node n2)")
    (tmp_path / "7_exit.json").write_text(state(0, 0, None, None, "n1"))
    (tmp_path / "7_exit.1.json").write_text(state(1, 0, None, None, "n2"))
    assert job.exit_cause() == (True, None)


@pytest.mark.slow  # a real SLURM daemon
def test_a_pipeline_over_more_nodes_than_the_partition_has_fails_in_one_line(slurm, tmp_path):
    result = cli("+experiment=arith", "launcher=slurm", "launcher.cpus=1", "launcher.nodes=2",
                 f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "asks for 1 CPUs on each of 2 nodes" in lines[0] and "partition debug has 1 node, 1 of them" in lines[0], \
        lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a real SLURM daemon
def test_a_queued_pipeline_says_so(slurm, tmp_path):
    """The node is busy: the pipeline's one job waits whole (nothing of it runs), and status says why."""
    cpus = subprocess.run(["sinfo", "-h", "-o", "%c"], capture_output=True, text=True).stdout.split()[0]
    hog = subprocess.run(["sbatch", "--parsable", f"--cpus-per-task={cpus}", "--mem=100M", "--output=/dev/null",
                          "--wrap", "sleep 120"],
                         capture_output=True, text=True, check=True).stdout.strip()
    run_dir = tmp_path / "run"
    try:
        result = cli(*PIPELINE, "launcher.detach=true", f"hydra.run.dir={run_dir}", timeout=120)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        from prime_values.tools.status import status

        deadline = time.monotonic() + 20
        while "Resources)" not in (shown := status(run_dir)) and time.monotonic() < deadline:  # once scheduled
            time.sleep(0.5)
        assert "queued: 2 CPUs on partition debug" in shown and "Resources" in shown, shown
        assert not list((run_dir / "jobs").glob("warm_start/*_submitted.pkl"))  # no role started
    finally:
        job = [p.name.split("_")[0] for p in (run_dir / "jobs" / "pipeline").glob("*_submitted.pkl")]
        subprocess.run(["scancel", hog, *job], check=False)


@pytest.mark.slow  # a real SLURM daemon
def test_launcher_slurm_config_is_checked_against_the_cluster(slurm):
    from prime_values.__main__ import precheck

    line = precheck(["+experiment=arith", "launcher=slurm", "launcher.partition=nope"])
    assert line is not None and "launcher.partition='nope' is not a partition" in line and "debug" in line, line
    # the local cluster has a default partition, and 2 CPUs: the pipeline fits when its roles share them
    assert precheck(["+experiment=arith", "launcher=slurm", "launcher.cpus=2"]) is None


def report_gpus(name: str) -> str:
    time.sleep(3)  # every step runs at once: GPUs handed to two of them at the same time would show
    return os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")


def probe_role_steps(run_dir: str, cfg) -> dict:
    """Inside a pipeline-like allocation: start the rl stage's roles as srun steps, exactly as its conductor does
    (the supervisor, launch.make_executor), each running `report_gpus` instead of the role."""
    from prime_values.launch.slurm import ALLOCATION_ENV
    from prime_values.rundir import RunDir
    from prime_values.supervisor import Supervisor

    class Probe(Supervisor):
        def _call(self, role_job):
            return (report_gpus, role_job.name)

    os.environ[ALLOCATION_ENV] = "1"
    run = RunDir(run_dir)
    run.mkdirs()
    supervisor = Probe(run, cfg)
    supervisor.start_roles()
    return {role_job.name: role_job.job.result() for role_job in supervisor.jobs}


@pytest.mark.slow  # a real SLURM daemon
def test_each_step_gets_the_gpus_the_topology_asks_for(slurm, tmp_path):
    """The local cluster's fake GPUs (launchers/local_slurm, LOCAL_SLURM_GPUS=2): the roles' steps run at once in one
    allocation of 2 GPUs; each GPU role sees its own GPU (srun --overlap alone would give both GPU 0), the CPU roles
    none."""
    from prime_values.launch.slurm import pipeline_request
    from tests.e2e_helpers import compose

    gres = subprocess.run(["sinfo", "-h", "-o", "%G"], capture_output=True, text=True).stdout.split()
    assert gres and gres[0].startswith("gpu:2"), f"the local node has no 2 fake GPUs: {gres}"
    cfg = compose(["+experiment=arith", "launcher=slurm", "launcher.cpus=2", "topology.policy_trainer_device=cuda:0",
                   "topology.value_trainer_device=cuda:1"])
    request = pipeline_request(cfg)
    assert request["gpus"] == 2, request
    ex = executor(tmp_path / "jobs", gpus_per_node=request["gpus"], cpus_per_task=2, mem_gb=1)
    job = ex.submit(probe_role_steps, str(tmp_path / "run"), cfg)
    assert wait_states([job], FINISHED, timeout=300)[job.job_id] == "COMPLETED", job.paths.stderr.read_text()
    seen = job.result()
    assert seen == {"inference0": "", "evaluator": "", "orchestrator": "", "policy_trainer": "0",
                    "value_trainer": "1"}, seen


@pytest.mark.slow  # a real SLURM daemon
def test_a_pipeline_asking_for_more_gpus_than_the_partition_has_fails_in_one_line(slurm, tmp_path):
    result = cli("+experiment=arith", "launcher=slurm", "launcher.cpus=2", "topology.policy_trainer_device=cuda:0",
                 "topology.policy_trainer_procs=2", "topology.value_trainer_device=cuda:2",
                 f"hydra.run.dir={tmp_path / 'run'}", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "asks for 2 CPUs and 3 GPUs on one node" in lines[0] and "at most 2 CPUs and 2 GPUs" in lines[0], lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.slow  # a real SLURM daemon, restarted twice
def test_two_nodes_on_one_host(slurm):
    """LOCAL_SLURM_NODES=2: two slurmd on this host (`slurmd -N`, a port each) share the machine's CPUs; a job over
    both nodes runs one task on each. The one-node cluster the other tests use comes back after."""
    single = cluster.nodes()
    assert len(single) == 1, single
    try:
        assert "2 nodes" in cluster.start(LOCAL_SLURM_NODES="2")
        nodes = cluster.nodes()
        assert len(nodes) == 2 and sum(nodes.values()) == sum(single.values()), (nodes, single)
        out = subprocess.run(["srun", "--nodes=2", "--ntasks=2", "--mem=100M", "bash", "-c",
                              "echo $SLURM_PROCID $SLURMD_NODENAME $SLURM_STEP_NUM_NODES"],
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        tasks = sorted(line.split() for line in out.stdout.splitlines())
        assert tasks == [["0", sorted(nodes)[0], "2"], ["1", sorted(nodes)[1], "2"]], (tasks, nodes)
    finally:
        cluster.start(LOCAL_SLURM_NODES="")
    assert cluster.nodes() == single


def _pipeline_jobs(run_dir: Path) -> list[str]:
    return [p.name.split("_")[0] for p in (run_dir / "jobs" / "pipeline").glob("*_submitted.pkl")]


@contextlib.contextmanager
def _two_node_pipeline(tmp_path: Path, steps: int, *overrides: str):
    """The small pipeline on the two-node cluster (launcher.nodes=2, the policy trainer's two ranks one on each
    node): yields the submitting command (a Popen), its run directory and the node names. Leaves no allocation
    behind and restores the one-node cluster the other tests use, also when the test fails."""
    single = cluster.nodes()
    run_dir = tmp_path / "run"
    args = [*cluster.two_node_pipeline(steps), *overrides]
    proc = None
    try:
        assert "2 nodes" in cluster.start(LOCAL_SLURM_NODES="2")
        names = sorted(cluster.nodes())
        assert len(names) == 2, names
        proc = subprocess.Popen([sys.executable, "-m", "prime_values", *args, f"hydra.run.dir={run_dir}"], cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
        yield proc, run_dir, names
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        if _pipeline_jobs(run_dir):
            subprocess.run(["scancel", *_pipeline_jobs(run_dir)], capture_output=True)
        cluster.start(LOCAL_SLURM_NODES="")
    assert cluster.nodes() == single


def _finished(proc, run_dir: Path, steps: int) -> tuple[str, str]:
    """Wait for the submitting command; assert the run finished every step and prime_values.tools.check finds
    nothing lost. Returns its output and the conductors' (every allocation's) output."""
    out, _ = proc.communicate(timeout=1800)  # a guard against a hang, not a bound on the run's time
    assert proc.returncode == 0, out[-4000:]
    assert (run_dir / "weights" / "policy" / "LATEST").read_text().strip() == str(steps)
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    inside = "".join(p.read_text(errors="replace") for p in (run_dir / "jobs" / "pipeline").glob("*_log.out"))
    return out, inside


def _restarts(run_dir: Path) -> dict:
    path = run_dir / "control" / "restarts.json"  # the conductor's count of each role's restarts
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _restarted_and_up(run_dir: Path, role: str, restarts: int, proc, timeout: float = 1800) -> None:
    """Wait until the conductor has restarted `role` `restarts` times and the newest of its jobs came up: its
    heartbeat is newer than that job's start (`jobs/<role>/<job id>_process.json`, written as the job starts; only
    the filesystem's clock is compared). Its processes are then all there, past their start-up."""
    folder, heartbeat = run_dir / "jobs" / role, run_dir / "state" / role / "heartbeat"
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the run ended before restart {restarts} of {role} came up"
        starts = sorted(p.stat().st_mtime for p in folder.glob("*_process.json"))
        if _restarts(run_dir).get(role, 0) >= restarts and len(starts) > restarts and heartbeat.exists() and \
                heartbeat.stat().st_mtime > starts[-1]:
            return
        assert time.monotonic() < deadline, f"restart {restarts} of {role} did not come up in {timeout} s"
        time.sleep(0.5)


HANG_TIMEOUT_S = 30  # the two-node test's launcher.hang_timeout_s: the floor of its hang limit (hang_quiet_factor)


@pytest.mark.slow  # a real SLURM daemon, restarted twice
def test_the_pipeline_runs_over_two_nodes(slurm, tmp_path):
    """LOCAL_SLURM_NODES=2 and launcher.nodes=2: one allocation over both nodes, the generation side (inference,
    evaluator, orchestrator) beside the conductor on node 0, the value trainer on node 1, and the policy trainer's
    two FSDP ranks one on each node (launcher.placement.policy_trainer=[0, 1]: one srun step of two tasks, gloo
    over TCP, rendezvous through its job folder). Rank 1 is killed mid-run, and once the restarted step came up it
    is frozen (SIGSTOP: a rank stuck, so rank 0 waits in a collective and the step's heartbeat goes silent): each
    time the step ends as a whole and the supervisor restarts it. The hang is the frozen role's alone: no start-up
    (an srun step, imports, the rendezvous: far longer than launcher.hang_timeout_s on a loaded machine) and no
    step is taken for one. The run finishes, each role ran on its node (SLURM's accounting and the controllers'
    exit states say so), both ranks trained, prime_values.tools.check finds nothing lost."""
    from prime_values.tools.chaos import policy_step, signal_rank

    steps = 12  # the freeze comes right after the restarted step came up, several steps before the last
    with _two_node_pipeline(tmp_path, steps, f"launcher.hang_timeout_s={HANG_TIMEOUT_S}") as (proc, run_dir, names):
        _wait_step(run_dir, 2, proc, timeout=1800)
        assert signal_rank(run_dir, "policy_trainer", 1, signal.SIGKILL), "no rank 1 of the policy trainer to kill"
        _restarted_and_up(run_dir, "policy_trainer", 1, proc)  # not a step count: the killed step may have gone on
        frozen_at = policy_step(run_dir)
        assert frozen_at < steps, f"the run reached step {frozen_at} of {steps} before the freeze: give it more steps"
        assert signal_rank(run_dir, "policy_trainer", 1, signal.SIGSTOP), "no rank 1 of the policy trainer to stop"
        # a guard, not a bound on the detection: 10 x hang_timeout_s (hang_quiet_factor may raise the limit above
        # hang_timeout_s on a loaded machine, by what the run measured); a supervisor blind to hangs fails here
        _restarted_and_up(run_dir, "policy_trainer", 2, proc, timeout=10 * HANG_TIMEOUT_S)
        out, inside = _finished(proc, run_dir, steps)
        assert ("one allocation for the pipeline: 1 CPUs on each of 2 nodes (node 0: inference0, evaluator, "
                "orchestrator, policy_trainer, the conductor; node 1: policy_trainer, value_trainer)") in out, \
            out[:3000]
        assert "role policy_trainer failed: killed by signal 9 (process 1 of 2, on node " in inside, inside[-3000:]
        assert "role policy_trainer failed: hung: no heartbeat for " in inside, inside[-3000:]
        hung = re.findall(r"role (\S+) failed: hung: ", inside)
        assert hung == ["policy_trainer"], inside[-3000:]  # the frozen role's hang, and nothing else taken for one
        # SLURM's own record of where each step ran
        pipeline = _pipeline_jobs(run_dir)
        assert len(pipeline) == 1, pipeline
        where: dict[str, set] = {}
        deadline = time.monotonic() + 60  # sacct records the steps a moment after they end (later on a loaded node)
        while time.monotonic() < deadline:
            out_ = subprocess.run(["sacct", "-n", "-P", "-j", pipeline[0], "-o", "JobName,NodeList"],
                                  capture_output=True, text=True).stdout
            where = {}
            for line in out_.splitlines():
                step, _, nodelist = line.partition("|")
                if step.startswith("pv_") and nodelist and nodelist != "None assigned":
                    where.setdefault(step, set()).add(tuple(cluster.hostnames(nodelist)))
            if {"pv_inference0", "pv_evaluator", "pv_orchestrator", "pv_policy_trainer", "pv_value_trainer"} <= \
                    set(where):
                break
            time.sleep(1)
        for step in ("pv_inference0", "pv_evaluator", "pv_orchestrator"):
            assert where.get(step) == {(names[0],)}, where
        assert where.get("pv_value_trainer") == {(names[1],)}, where
        assert where.get("pv_policy_trainer") == {tuple(names)}, where  # each of its steps (two restarted) on both
        # the policy trainer's controllers: one per node, each its rank; both ranks joined the gloo group
        folder = run_dir / "jobs" / "policy_trainer"
        nodes_of = {}
        for path in folder.glob("*_exit*.json"):
            state = json.loads(path.read_text())
            nodes_of.setdefault(state["first_task"], set()).add(state["node"])
        assert nodes_of == {0: {names[0]}, 1: {names[1]}}, nodes_of
        for rank in (0, 1):
            logs = "".join(p.read_text(errors="replace") for p in folder.glob(f"*_{rank}_log.err"))
            assert f"prime_values.dist: rank {rank} of 2 (gloo) on node {names[rank]}" in logs, logs[-2000:]


@pytest.mark.slow  # a real SLURM daemon, restarted three times
def test_a_lost_node_ends_the_allocation_and_the_pipeline_resumes_in_a_fresh_one(slurm, tmp_path):
    """The pipeline over two nodes (as above) loses node 1 mid-run: its slurmd and steps die (the value trainer and
    the policy trainer's rank 1 with them) and the node goes DOWN. SLURM ends the allocation NODE_FAIL; the
    submitting command submits a fresh one (over several nodes it does not let SLURM requeue the old one:
    prime_values.submitter), which waits for two nodes, starts once the node is back, and its conductor resumes the
    run from the run directory. The run finishes all its steps and prime_values.tools.check finds nothing lost."""
    with _two_node_pipeline(tmp_path, 12) as (proc, run_dir, names):
        _wait_step(run_dir, 3, proc, timeout=1800)
        pipeline = _pipeline_jobs(run_dir)
        assert len(pipeline) == 1, pipeline
        assert cluster.lose_node(names[1]), f"nothing of node {names[1]} to kill"
        while len(_pipeline_jobs(run_dir)) < 2:  # the fresh allocation
            assert proc.poll() is None, "the submitting command ended instead of resubmitting the pipeline"
            time.sleep(0.5)
        cluster.start(LOCAL_SLURM_NODES="2")  # the node comes back (ReturnToService=2: it is taken into service)
        out, inside = _finished(proc, run_dir, 12)
        assert inside.count("prime_values: run directory") == 2, "the second allocation did not run the conductor"
        assert "the pipeline's allocation was lost (NODE_FAIL); resubmitted as job" in out, out[-3000:]
        if slurm["AccountingStorageType"] != "accounting_storage/none":
            assert [row[2].split()[0] for row in sacct_rows(pipeline[0]) if row[0] == pipeline[0]] == ["NODE_FAIL"]
