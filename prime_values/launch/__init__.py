"""How role jobs start: one submitit executor per role, devices per the topology."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
from pathlib import Path

import psutil

from prime_values.roles import ENTRYPOINTS

FROM_CONFIG = ("resolve_devices", "role_gpus")
"""names read from here that are the config's (prime_values/config/topology.py: 'auto' devices resolved, GPUs per
job), imported when first read (`__getattr__`): the launch package's base imports the standard library and psutil
only, so the tools that read a run directory start without the config"""


def __getattr__(name: str):
    if name in FROM_CONFIG:
        from prime_values.config import topology  # the config package (omegaconf): only where it is read

        return getattr(topology, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RoleEntry:
    """The entry function of a role, by module path: what the conductor submits. Pickled by name and imported
    inside the job, so the conductor itself never imports a role's module, nor the torch it imports (the start-up
    it saves: docs/reliability.md)."""

    def __init__(self, role: str):
        self.role = role
        self.__name__ = role  # submitit names the job's function after it

    def __call__(self, *args):
        module, function = ENTRYPOINTS[self.role].split(":")
        return getattr(importlib.import_module(module), function)(*args)


def entry(role: str) -> RoleEntry:
    """The entry function of role `role` (the conductor knows roles by name, prime_values.roles.ENTRYPOINTS)."""
    if role not in ENTRYPOINTS:
        raise KeyError(f"no role {role!r}: one of {', '.join(ENTRYPOINTS)}")
    return RoleEntry(role)


def make_executor(launcher, jobs_dir: Path, name: str, device: str, tasks: int = 1, gpus: int | None = None,
                  first_gpu: int = 0, nodes: list[int] | None = None, launch=None):
    """A submitit executor for role `name`: a local subprocess, or an sbatch job (launcher=slurm) that asks for
    one GPU when the role's device is a GPU. `tasks` > 1 (a multi-process trainer): that many tasks of one job
    (one node), each with its own GPU on a GPU device (locally the `tasks` GPUs from `device` on). `gpus`: the
    job's GPUs when not one per task (a tensor-parallel inference worker: one task, topology.inference_tp GPUs).
    `first_gpu`: inside a pipeline's allocation, where the role's GPUs start among the allocation's
    (`slurm.gpu_offsets`: every GPU role its own), and `nodes` the role's nodes of it (`slurm.role_nodes`): over
    several, one srun task per process (`slurm.step_command`). `launch`: a local run's LocalLaunch (its jobs fork
    from its fork server)."""
    gpus = (tasks if gpus is None else gpus) if device.startswith("cuda") else 0
    if launcher.name == "slurm":
        from prime_values.launch.slurm import in_allocation, make_slurm_executor, step_command

        if in_allocation():  # inside the pipeline's allocation: the role is an srun step of it
            from prime_values.launch.local import LocalRoleExecutor

            spread = len(nodes or [0])  # over several nodes: each srun task a controller of one process
            executor = LocalRoleExecutor(folder=jobs_dir / name)
            executor.update_parameters(timeout_min=launcher.timeout_min, tasks_per_node=tasks if spread == 1 else 1)
            executor.step_prefix = step_command(name, tasks, gpus, tasks * launcher.cpus_per_task, nodes)
            executor.step_gpus = (first_gpu, first_gpu + gpus // spread) if gpus else None  # on each of its nodes
            executor.step_ranks = spread > 1
            return executor

        return make_slurm_executor(
            jobs_dir / name, partition=launcher.partition, account=launcher.account, qos=launcher.qos,
            constraint=launcher.constraint, extra_sbatch=dict(launcher.extra_sbatch), setup=list(launcher.setup),
            time_min=launcher.timeout_min, job_name=f"pv_{name}", gpus_per_node=gpus, tasks_per_node=tasks,
            cpus_per_task=launcher.cpus_per_task, mem_gb=launcher.mem_gb)
    from prime_values.launch.local import LocalRoleExecutor

    executor = LocalRoleExecutor(folder=jobs_dir / name, fork_server=launch.fork_server if launch else None)
    params = {"timeout_min": launcher.timeout_min, "tasks_per_node": tasks}
    if device.startswith("cuda:"):
        first = int(device.split(":")[1])
        params.update(gpus_per_node=gpus, visible_gpus=list(range(first, first + gpus)))
    executor.update_parameters(**params)
    return executor


def job_device(device: str) -> str:
    """Inside a job that was given one GPU through CUDA_VISIBLE_DEVICES, that GPU is cuda:0."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    if device.startswith("cuda:") and visible and "," not in visible:
        return "cuda:0"
    return device


def role_threads(cfg, environ=os.environ, role: str = "") -> int:
    """torch CPU threads of one role process of `cfg` (a prepared config): topology.policy_trainer_threads for a
    policy trainer process when set; topology.threads_per_role when set;
    for 0 (auto), OMP_NUM_THREADS when set, a SLURM step's own CPUs (SLURM_CPUS_PER_TASK: the submitter sized the
    step), else the cores this process may run on split evenly among the run's CPU processes
    (resolved.cpu_processes), at least 1. Worked: 2 cores, 4 processes -> 1 each; 16 cores, 4 -> 4; 7 cores, 3 -> 2
    (one core left to the orchestrator and the conductor)."""
    if role.startswith("policy_trainer") and cfg.topology.get("policy_trainer_threads"):
        return int(cfg.topology.policy_trainer_threads)
    if cfg.topology.threads_per_role:
        return int(cfg.topology.threads_per_role)
    if environ.get("OMP_NUM_THREADS", "").isdigit():  # the environment's own choice, as for solo_threads
        return max(1, int(environ["OMP_NUM_THREADS"]))
    if environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, int(environ["SLURM_CPUS_PER_TASK"]))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, int(cfg.resolved.cpu_processes)))


def solo_threads() -> int:
    """torch CPU threads of a job that runs alone on its machine (the warm start, an sft/eval stage): every core,
    unless OMP_NUM_THREADS says otherwise. The test suite sets it to 1: its tiny models gain nothing from a second
    thread, and where other processes load the cores (CI runs two suites side by side) a 2-thread OpenMP team
    waits at every barrier for a descheduled thread (measured in docs/changelog.md, CI)."""
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or os.cpu_count() or 1


def process_of(target) -> psutil.Process | None:
    """The psutil handle of a job (its `proc`, taken when it was started: psutil then checks the process's create
    time before every signal, so a pid reused after the job ended is never signalled), of a handle, or of a pid
    (found now, for a process known to be alive); None when it is gone."""
    proc = getattr(target, "proc", target)
    try:
        proc = proc if isinstance(proc, psutil.Process) else psutil.Process(int(proc))
        return proc if proc.is_running() else None
    except (psutil.Error, TypeError, ValueError):
        return None


def descendants(target) -> list[int]:
    """The pids of every live descendant of a process (a pid, psutil handle or job), children before
    grandchildren."""
    proc = process_of(target)
    try:
        return [child.pid for child in proc.children(recursive=True)] if proc else []
    except psutil.Error:
        return []


def signal_tree(target, signum: int = signal.SIGKILL) -> list[psutil.Process]:
    """Send `signum` to a process (a job, psutil handle or pid) and everything it started, each through its psutil
    handle (never a reused pid). Returns the processes signalled."""
    proc = process_of(target)
    if proc is None:
        return []
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        tree = [proc]
    signalled = []
    for member in tree:
        try:
            member.send_signal(signum)
            signalled.append(member)
        except psutil.Error:
            pass
    return signalled


def kill_tree(target) -> None:
    """SIGKILL a job's controller and everything it started: the last resort against orphans."""
    signal_tree(target, signal.SIGKILL)


def folder_processes(folder) -> list[psutil.Process]:
    """The processes whose command line ends with job folder `folder` (a controller or a submitit task started as
    a fresh process, also one that slurmstepd started for an srun step, which is no descendant of ours)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):  # the folder name ends the path: 'inference0' is not 'inference01'
        if any(arg.rstrip("/") == str(folder) for arg in proc.info["cmdline"] or ()):
            found.append(proc)
    return found


def kill_job(job) -> None:
    """SIGKILL a local job or srun step: its process tree, and the processes of its folder with theirs (an srun
    step's controller runs under slurmstepd: killing srun alone would leave it running beside a replacement). A
    step over several nodes also gets `scancel --signal=KILL <job>.<step>` (the step its controller recorded):
    its ranks on other nodes are no processes of this machine."""
    for target in [job, *folder_processes(job.paths.folder)]:
        kill_tree(target)
    step_file = job.paths.folder / f"{job.job_id}_step"
    if step_file.exists():
        step = step_file.read_text().strip()
        if step:
            subprocess.run(["scancel", "--quiet", "--signal=KILL", step], capture_output=True, timeout=60,
                           check=False)
