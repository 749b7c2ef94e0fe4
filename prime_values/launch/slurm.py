"""SLURM through submitit: one executor per role, job states that survive a cluster without accounting, cancel.

`make_slurm_executor` maps our launcher/topology settings onto submitit's `SlurmExecutor` parameters (each
becomes one `#SBATCH` line; see submitit's `slurm._make_sbatch_string`). `job_states` asks `squeue` for all
jobs at once, then `sacct` for jobs slurmctld has already forgotten, then the job's submitit result file.
`cancel_all` is one `scancel`.

A one-node SLURM to try this on: `sudo launchers/local_slurm/start.sh` (see its README).
"""

from __future__ import annotations

import os
import pickle
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import submitit

from prime_values.config.base import ConfigError
from prime_values.config.checks import register_check
from prime_values.config.critic import trains_critic
from prime_values.config.derived import fact
from prime_values.config.launcher import FIT_CHECK, PLACEMENT_CHECK
from prime_values.config.topology import role_gpus, role_procs
from prime_values.launch.local import _tail, last_error_line, result_error, signal_name
from prime_values.launch.topology import pipeline_roles

# SLURM job states in which a job will not run again; everything else (PENDING, RUNNING, COMPLETING, a
# PREEMPTED job that may be requeued, UNKNOWN) counts as live, as in submitit.
FINISHED = {
    "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "REVOKED", "TIMEOUT",
}  # fmt: skip


def parse_extra_sbatch(extra: Mapping[str, Any] | Iterable[str] | None) -> dict[str, Any]:
    """Extra sbatch options as submitit's `additional_parameters`.

    A mapping passes through (`{"mail-type": "END", "exclusive": True}`; `True` means a bare flag). A list
    takes long options as they would be written on the command line: `["--exclusive", "--mail-type=END"]`.
    """
    if extra is None:
        return {}
    if isinstance(extra, Mapping):
        return {str(k): v for k, v in extra.items()}
    params: dict[str, Any] = {}
    for item in extra:
        if not isinstance(item, str) or not item.startswith("--") or len(item) < 3:
            raise ValueError(f"extra sbatch option {item!r}: write long options, e.g. '--mail-type=END'")
        key, sep, value = item[2:].partition("=")
        params[key] = value if sep else True
    return params


def make_slurm_executor(
    folder: str | Path,
    *,
    partition: str | None = None,
    account: str | None = None,
    qos: str | None = None,
    time_min: int = 60,
    constraint: str | None = None,
    extra_sbatch: Mapping[str, Any] | Iterable[str] | None = None,
    job_name: str = "prime_values",
    gpus_per_node: int = 0,
    cpus_per_task: int = 1,
    mem_gb: float | None = None,
    nodes: int = 1,
    tasks_per_node: int = 1,
    setup: list[str] | None = None,
    max_num_timeout: int = 0,
    srun_args: list[str] | None = None,
) -> submitit.SlurmExecutor:
    """A submitit executor that submits each `submit()` as one sbatch job.

    `None` leaves a setting to the cluster's defaults (default partition, account, `DefMemPerCPU`);
    `gpus_per_node=0` requests no GPUs. `setup` lines run in the batch script before the job (e.g.
    `module load cuda`). `max_num_timeout` is how often submitit requeues a job that hit its time limit
    (0: never; the conductor restarts roles itself). `srun_args`: options of the batch script's srun, which runs
    the function (e.g. `--nodes=1 --ntasks=1`: once, on the first node of an allocation over several). Raises
    RuntimeError when there is no `srun` here.
    """
    executor = submitit.SlurmExecutor(folder=Path(folder), max_num_timeout=max_num_timeout)
    params: dict[str, Any] = {
        "job_name": job_name,
        "time": int(time_min),
        "nodes": int(nodes),
        "ntasks_per_node": int(tasks_per_node),
        "cpus_per_task": int(cpus_per_task),
        "partition": partition,
        "account": account,
        "qos": qos,
        "constraint": constraint,
        "additional_parameters": parse_extra_sbatch(extra_sbatch),
    }
    if gpus_per_node:
        params["gpus_per_node"] = int(gpus_per_node)
    if mem_gb is not None:
        params["mem"] = f"{int(mem_gb)}GB" if mem_gb == int(mem_gb) else f"{int(mem_gb * 1024)}MB"
    if setup:
        params["setup"] = list(setup)
    if srun_args:
        params["srun_args"] = list(srun_args)
    executor.update_parameters(**{k: v for k, v in params.items() if v is not None})
    return executor


def _keyed(jobs: Mapping[str, submitit.Job] | Iterable[submitit.Job]) -> dict[str, submitit.Job]:
    return dict(jobs) if isinstance(jobs, Mapping) else {job.job_id: job for job in jobs}


def _squeue_states(job_ids: list[str]) -> dict[str, str]:
    """States slurmctld still holds (live jobs, and finished ones for MinJobAge seconds)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "--states=all", "-o", "%i|%T", "-j", ",".join(job_ids)],
            capture_output=True, text=True, timeout=30, check=False,
        ).stdout  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def _result_state(job: submitit.Job) -> str | None:
    """COMPLETED or FAILED from submitit's result file, when the job got far enough to write one."""
    try:
        with job.paths.result_pickle.open("rb") as f:
            outcome = pickle.load(f)[0]
    except (OSError, EOFError, pickle.UnpicklingError, IndexError, TypeError):
        return None
    return "COMPLETED" if outcome == "success" else "FAILED"


def job_states(jobs: Mapping[str, submitit.Job] | Iterable[submitit.Job]) -> dict[str, str]:
    """The SLURM state of every job, e.g. PENDING, RUNNING, COMPLETED, CANCELLED, FAILED, TIMEOUT, UNKNOWN.

    Keys are the mapping's keys (role names) or, for a plain iterable, the job ids. States are normalised to
    one word ("CANCELLED by 0" -> "CANCELLED"). squeue answers first: it is slurmctld's own view (sacct lags
    a second or so behind it: a running job can still read PENDING there) and covers finished jobs for
    `MinJobAge` (300 s by default). sacct (through submitit's shared watcher) answers for older jobs, and the
    submitit result file when there is no accounting. Never raises for a missing command or daemon.
    """
    keyed = _keyed(jobs)
    found = _squeue_states([job.job_id for job in keyed.values()]) if keyed else {}
    missing = [job.job_id for job in keyed.values() if job.job_id not in found]
    if missing:
        watcher = submitit.SlurmJob.watcher  # one sacct call for all of them; logs a warning if sacct fails
        for job_id in missing:
            watcher.register_job(job_id)
        watcher.update()
        found.update({job_id: watcher.get_state(job_id, mode="cache") for job_id in missing})
    states = {}
    for key, job in keyed.items():
        state = (found.get(job.job_id) or "UNKNOWN").split()[0].upper()
        if state == "UNKNOWN":
            state = _result_state(job) or state
        states[key] = state
    return states


def cancel_all(jobs: Mapping[str, submitit.Job] | Iterable[submitit.Job]) -> list[str]:
    """scancel every job in one call (finished ones are ignored by SLURM); returns the job ids."""
    ids = [job.job_id for job in _keyed(jobs).values()]
    if ids:
        subprocess.run(["scancel", "--quiet", *ids], capture_output=True, timeout=60, check=False)
    return ids


def _sacct_exit(job_id: str) -> tuple[str, str] | None:
    """(State, ExitCode 'code:signal') of a job from accounting, None without it."""
    try:
        out = subprocess.run(["sacct", "-n", "-X", "-P", "-o", "State,ExitCode", "-j", str(job_id)],
                             capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        if "|" in line:
            state, code = line.split("|", 1)
            return state.split()[0].upper(), code.strip()
    return None


# the words for a SLURM end state that says why by itself
STATE_CAUSES = {"PREEMPTED": "preempted", "OUT_OF_MEMORY": "out of memory", "TIMEOUT": "timeout",
                "DEADLINE": "timeout", "NODE_FAIL": "node failure", "BOOT_FAIL": "node failure",
                "CANCELLED": "cancelled", "REVOKED": "cancelled"}


def exit_cause(job: submitit.Job) -> str | None:
    """Why a finished SLURM role job ended, in words (None: it completed). Reads squeue/sacct and the job's files,
    never submitit's result wait (15 s for a job that wrote no result)."""
    state = job_states([job]).get(job.job_id, "UNKNOWN")
    if state == "COMPLETED":
        return None
    if state in STATE_CAUSES:
        return STATE_CAUSES[state]
    code, sig = None, None
    accounted = _sacct_exit(job.job_id)
    if accounted:
        state = accounted[0] if accounted[0] in STATE_CAUSES else state
        if state in STATE_CAUSES:
            return STATE_CAUSES[state]
        first, _, second = accounted[1].partition(":")
        code, sig = int(first or 0), int(second or 0)
    if sig:
        return signal_name(sig)
    error = result_error(job.paths.result_pickle) or last_error_line(_tail(job.paths.stderr))
    return f"exit code {code if code is not None else '?'}: " + (error or f"no error line in {job.paths.stderr}")


# --- a pipeline in one allocation ---------------------------------------------------------------------------
# launcher=slurm runs the rl stage as ONE sbatch job, sized for every role at once: it starts whole or not at all.
# Its batch step is the conductor (prime_values.conductor.drive), which starts each role as an `srun` step of that
# allocation (a dead role restarts as a new step); losing the allocation (node failure, preemption) requeues the
# job, and the conductor of the next allocation resumes the run from its run directory.

ALLOCATION_ENV = "PRIME_VALUES_ALLOCATION"  # set in the pipeline job: role jobs become srun steps of it


def in_allocation() -> bool:
    return bool(os.environ.get(ALLOCATION_ENV)) and bool(os.environ.get("SLURM_JOB_ID"))


GENERATION_ROLES = ("inference", "evaluator", "orchestrator")  # with launcher.nodes >= 2: node 0, beside the conductor
PLACED_ROLES = (*GENERATION_ROLES, "policy_trainer", "value_trainer")


def role_nodes(cfg, role: str) -> list[int]:
    """The nodes (indices into the allocation's node list) a role's job runs on: launcher.placement.<role>, else
    node 0 for everything on one node, and with 2 or more nodes node 0 for the generation side (which shares it
    with the conductor) and node 1 for the trainers."""
    placed = (cfg.launcher.get("placement") or {}).get(role)
    if placed is not None and not isinstance(placed, (bool, str)):
        return [int(placed)] if isinstance(placed, int) else [int(n) for n in placed]
    return [0] if int(cfg.launcher.get("nodes", 1)) == 1 or role in GENERATION_ROLES else [1]


def placement_problem(cfg) -> str | None:
    """One sentence when launcher.nodes / launcher.placement cannot be laid out, else None: an unknown role, a node
    outside the allocation, a multi-node role that is not a trainer, whose nodes are not consecutive, or whose
    processes do not split evenly over them, or a node no role runs on."""
    launcher, topo = cfg.launcher, cfg.topology
    nodes, placement = int(launcher.get("nodes", 1)), dict(launcher.get("placement") or {})
    for role, placed in placement.items():
        if role not in PLACED_ROLES:
            return f"launcher.placement.{role}: no such role; place one of {', '.join(PLACED_ROLES)}"
        if placed is None:
            continue
        listed = not isinstance(placed, (str, bytes)) and hasattr(placed, "__len__") and len(placed) > 0
        ok = (isinstance(placed, int) and not isinstance(placed, bool)) or \
            (listed and all(isinstance(n, int) and not isinstance(n, bool) for n in placed))
        if not ok:
            return f"launcher.placement.{role}={placed!r}: give a node index, or a list of consecutive ones"
        where = role_nodes(cfg, role)
        if any(not 0 <= n < nodes for n in where):
            return (f"launcher.placement.{role}={list(where) if len(where) > 1 else where[0]} names a node outside "
                    f"the allocation's 0..{nodes - 1}; raise launcher.nodes or place it on one of those")
        if len(where) > 1:
            procs = role_procs(topo, role)
            if role not in ("policy_trainer", "value_trainer"):
                return f"launcher.placement.{role}={list(where)}: only a trainer spans nodes; give one node index"
            if where != list(range(where[0], where[0] + len(where))):
                return f"launcher.placement.{role}={list(where)}: its nodes must be consecutive, e.g. [0, 1]"
            if procs % len(where):
                return (f"launcher.placement.{role}={list(where)}: topology.{role}_procs={procs} processes do not "
                        f"split evenly over {len(where)} nodes; make it a multiple of {len(where)}")
    if nodes > 1:
        used = {n for spec in pipeline_roles(cfg.topology, fact(cfg, "uses_critic"), trains_critic(cfg))
                for n in role_nodes(cfg, spec.role)} | {0}
        idle = [n for n in range(nodes) if n not in used]
        if idle:
            return (f"launcher.nodes={nodes}, but no role runs on node{'s' if len(idle) > 1 else ''} "
                    f"{', '.join(map(str, idle))}; place roles there with launcher.placement (e.g. "
                    f"launcher.placement.value_trainer={idle[0]}) or lower launcher.nodes")
    return None


def pipeline_processes(cfg) -> list[tuple[str, int, int]]:
    """(role job, processes, GPUs) of every role the rl stage runs at once (the warm start runs before them)."""
    topo = cfg.topology
    # also before the run is prepared (validate): `fact` derives what resolved.* does not hold yet
    roles = pipeline_roles(topo, fact(cfg, "uses_critic"), trains_critic(cfg))
    return [(spec.name, role_procs(topo, spec.role), role_gpus(topo, spec.role) if str(spec.device).startswith("cuda")
             else 0) for spec in roles]


def pipeline_layout(cfg) -> list[dict]:
    """Per node of the allocation: {"roles": [(role job, processes there)], "procs", "gpus"}; a role over several
    nodes has an equal share of its processes (and GPUs) on each."""
    nodes = int(cfg.launcher.get("nodes", 1))
    layout = [{"roles": [], "procs": 0, "gpus": 0} for _ in range(nodes)]
    roles = {spec.name: spec.role
             for spec in pipeline_roles(cfg.topology, fact(cfg, "uses_critic"), trains_critic(cfg))}
    for name, procs, gpus in pipeline_processes(cfg):
        where = role_nodes(cfg, roles[name])
        for n in where:
            if 0 <= n < nodes:  # (placement_problem reports one outside)
                layout[n]["roles"].append((name, procs // len(where)))
                layout[n]["procs"] += procs // len(where)
                layout[n]["gpus"] += gpus // len(where)
    return layout


def pipeline_request(cfg) -> dict:
    """What the pipeline's allocation asks for, on each of launcher.nodes nodes (one node by default): CPUs
    (launcher.cpus, else launcher.cpus_per_task per role process there plus one for the conductor on node 0, for
    the node that needs most), GPUs (the most any node's roles need: one per trainer process on a cuda device,
    topology.inference_tp per inference worker; srun gives each role step its own), memory (launcher.mem_gb, else
    the cluster's default per CPU)."""
    launcher, layout = cfg.launcher, pipeline_layout(cfg)
    cpus = launcher.cpus or max(node["procs"] * launcher.cpus_per_task + (k == 0) for k, node in enumerate(layout))
    gpus = max(node["gpus"] for node in layout)  # every GPU role its own GPUs: srun binds each step to its share
    return {"cpus": int(cpus), "gpus": gpus, "mem_gb": launcher.mem_gb, "processes": pipeline_processes(cfg),
            "nodes": len(layout), "layout": layout}


def describe_request(request: dict) -> str:
    gpus = f" and {request['gpus']} GPUs" if request["gpus"] else ""

    def names(roles):
        return ", ".join(f"{name}" + (f" x{n}" if n > 1 else "") for name, n in roles)

    if request.get("nodes", 1) == 1:
        return f"{request['cpus']} CPUs{gpus} on one node ({names((n, p) for n, p, _ in request['processes'])}, " \
               f"and the conductor)"
    where = "; ".join(f"node {k}: {names(node['roles'])}" + (", the conductor" if k == 0 else "")
                      for k, node in enumerate(request["layout"]))
    return f"{request['cpus']} CPUs{gpus} on each of {request['nodes']} nodes ({where})"


def partition_nodes(partition: str | None) -> tuple[str, list[dict]]:
    """(partition name, its nodes as {"name", "cpus", "gpus", "mem_mb"}) from sinfo; the default partition for None."""
    args = ["sinfo", "-h", "-N", "-o", "%N|%c|%G|%m|%P"] + (["-p", partition] if partition else [])
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    nodes, name = [], partition
    for line in out.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        if partition is None and not fields[4].endswith("*"):
            continue
        name = fields[4].rstrip("*")
        gpus = 0
        for gres in fields[2].split(","):
            parts = gres.split("(")[0].split(":")
            if parts[0] == "gpu" and parts[-1].isdigit():
                gpus += int(parts[-1])
        nodes.append({"name": fields[0], "cpus": int(fields[1].rstrip("+") or 0), "gpus": gpus,
                      "mem_mb": int(fields[3].rstrip("+") or 0) if fields[3].rstrip("+").isdigit() else 0})
    return name or "(default)", nodes


def fit_problem(request: dict, partition: str | None) -> str | None:
    """One sentence when the pipeline can never run on the partition (fewer of its nodes than the allocation asks
    for have what it asks for on each), else None."""
    name, nodes = partition_nodes(partition)
    if not nodes:
        return None  # sinfo said nothing (a cluster we cannot read): let sbatch decide
    mem_mb = (request["mem_gb"] or 0) * 1024
    fits = [n for n in nodes if n["cpus"] >= request["cpus"] and n["gpus"] >= request["gpus"]
            and (not mem_mb or not n["mem_mb"] or n["mem_mb"] >= mem_mb)]
    wanted = request.get("nodes", 1)
    if len(fits) >= wanted:
        return None
    if wanted > 1:
        has = f"{len(nodes)} node{'s' if len(nodes) > 1 else ''}, {len(fits)} of them that big"
        return (f"launcher=slurm: the pipeline asks for {describe_request(request)}, but partition {name} has {has}; "
                f"lower launcher.nodes (and move roles with launcher.placement), set launcher.cpus (CPUs per node; "
                f"its roles share them), or choose another launcher.partition")
    most_cpus = max(n["cpus"] for n in nodes)
    most_gpus = max(n["gpus"] for n in nodes)
    has = f"nodes of at most {most_cpus} CPUs" + (f" and {most_gpus} GPUs" if most_gpus else " and no GPUs"
                                                    if request["gpus"] else "")
    return (f"launcher=slurm: the pipeline asks for {describe_request(request)}, but partition {name} has {has}; "
            f"set launcher.cpus (CPUs of the whole allocation; its roles share them), fewer roles or processes, or "
            f"another launcher.partition")


@register_check(PLACEMENT_CHECK)
def check_placement(cfg, environment: bool) -> None:
    """The config's hook (launcher=slurm): `placement_problem` as a ConfigError."""
    problem = placement_problem(cfg)
    if problem:
        raise ConfigError(problem)


@register_check(FIT_CHECK)
def check_fit(cfg, environment: bool) -> None:
    """The config's hook (launcher=slurm, on a login node): a node of the partition can hold the pipeline."""
    problem = fit_problem(pipeline_request(cfg), cfg.launcher.partition)
    if problem:
        raise ConfigError(problem)


def step_command(name: str, tasks: int, gpus: int, cpus: int, nodes: list[int] | None = None) -> list[str]:
    """The srun prefix that starts a role's controller as a step of this allocation. --overlap: the roles share
    the allocation's CPUs (a role is mostly waiting); it asks for no GPUs: `--overlap` shares GRES too, so two
    steps with `--gpus=1` would both get the allocation's first GPU (measured on the local SLURM's fake GPUs). The
    step sees every GPU of the allocation, and its controller keeps the role's own (`GPU_SLICE_ENV`, from
    `gpu_offsets`). `nodes` (an allocation over several nodes): the role's nodes, `--relative` to the
    allocation's node list (no host names needed). On one node the step is one task, the controller, which starts
    the role's processes; over k nodes it is `tasks` tasks, tasks/k per node, each a controller of one process
    (the trainer's ranks: SLURM_PROCID, prime_values.dist), and one that fails ends the step (--kill-on-bad-exit):
    the supervisor restarts the step as a whole. `cpus`: of the whole role; at most the allocation's per node."""
    cap = int(os.environ.get("SLURM_CPUS_ON_NODE") or 0)
    where = [] if not nodes or os.environ.get("SLURM_JOB_NUM_NODES", "1") == "1" else [f"--relative={nodes[0]}"]
    if nodes and len(nodes) > 1:
        per_task = max(1, cpus // tasks)
        shape = [f"--nodes={len(nodes)}", f"--ntasks={tasks}", f"--ntasks-per-node={tasks // len(nodes)}",
                 f"--cpus-per-task={min(per_task, cap) if cap else per_task}"]
    else:
        shape = ["--ntasks=1", "--nodes=1", f"--cpus-per-task={max(1, min(cpus, cap) if cap else cpus)}"]
    return ["srun", "--overlap", *shape, *where, "--mem=0", f"--job-name=pv_{name}", "--kill-on-bad-exit=1",
            "--quiet"]


GPU_SLICE_ENV = "PRIME_VALUES_GPU_SLICE"  # 'a:b': the step's controller keeps CUDA_VISIBLE_DEVICES[a:b]


def gpu_offsets(cfg) -> dict[str, int]:
    """Where each GPU role's GPUs start among the allocation's on its node(s): in the order the allocation is sized
    for (`pipeline_processes`), each role the next ones free on its nodes (a role over several nodes the same
    positions on each); the warm start, which runs alone before them, from 0."""
    roles = {spec.name: spec.role
             for spec in pipeline_roles(cfg.topology, fact(cfg, "uses_critic"), trains_critic(cfg))}
    offsets, free_from = {"warm_start": 0}, {}
    for name, _, gpus in pipeline_processes(cfg):
        if gpus:
            where = role_nodes(cfg, roles[name])
            first = max(free_from.get(n, 0) for n in where)
            offsets[name] = first
            for n in where:
                free_from[n] = first + gpus // len(where)
    return offsets


def lost_nodes() -> list[str]:
    """Inside an allocation over several nodes: its nodes that SLURM finds down or not responding (sinfo's `*`), in
    words ('vm-2 (down)'); [] on one node (the conductor's own: were it lost, nothing here would run) or when sinfo
    does not answer."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST", "")
    if not in_allocation() or os.environ.get("SLURM_JOB_NUM_NODES", "1") == "1" or not nodelist:
        return []
    try:
        out = subprocess.run(["sinfo", "-h", "-N", "-n", nodelist, "-o", "%N|%t"], capture_output=True, text=True,
                             timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    lost = []
    for line in sorted(set(out.split())):
        name, _, state = line.partition("|")
        if state.endswith("*") or state.startswith(("down", "fail", "boot", "pow")):
            lost.append(f"{name} ({state.rstrip('*') or 'unknown'}{', not responding' if state.endswith('*') else ''})")
    return lost


def queued_line(job_id: str) -> str | None:
    """'queued: 7 CPUs on partition debug (job 12: Resources)' while the job is pending, else None."""
    try:
        out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T|%C|%P|%r|%b"], capture_output=True,
                             text=True, timeout=30, check=False).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if not out or "|" not in out:
        return None
    state, cpus, partition, reason, gres = (out.splitlines()[0].split("|") + [""] * 5)[:5]
    if state != "PENDING":
        return None
    gpus = f" and {gres.replace('gres:', '').replace('gres/', '')}" if gres and gres not in ("N/A", "(null)") else ""
    why = f": {reason}" if reason and reason not in ("None", "(null)") else ""
    return f"queued: {cpus} CPUs{gpus} on partition {partition} (job {job_id}{why})"
