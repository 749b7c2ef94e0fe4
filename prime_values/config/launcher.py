"""`launcher.*`: where the jobs run (local subprocesses or SLURM), restarts, and the SLURM request."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Optional

from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.config.checks import declare, run_check

ONE_NODE = "null, a node index 0..launcher.nodes-1: launch.slurm.placement_problem"
NODES = "null, a node index 0..launcher.nodes-1, or a list of consecutive ones: launch.slurm.placement_problem"

PLACEMENT_CHECK = declare("launcher.placement", "launcher=slurm: launcher.nodes and launcher.placement.* lay the "
                          "roles out over the allocation", "prime_values/launch/slurm.py")
FIT_CHECK = declare("launcher.fit", "launcher=slurm: a node of the partition can hold the pipeline",
                    "prime_values/launch/slurm.py")


@dataclass
class PlacementConfig:
    """`launcher.placement.*` (launcher=slurm): which node of the pipeline's allocation each role runs on, as an index
    into its node list (0..launcher.nodes-1); null follows the rule of launcher.nodes (launcher=local: null)."""

    inference: Any = free(None, ONE_NODE)
    """node of the inference workers (null = node 0)"""
    evaluator: Any = free(None, ONE_NODE)
    """node of the dedicated evaluators (null = node 0)"""
    orchestrator: Any = free(None, ONE_NODE)
    """node of the orchestrator (null = node 0)"""
    policy_trainer: Any = free(None, NODES)
    """node of the policy trainer, or a list of consecutive nodes, e.g. [0, 1]: its topology.policy_trainer_procs
    processes split evenly over them, one srun step across them (FSDP2 across nodes; ranks and rendezvous from
    SLURM's step: prime_values.dist) (null = node 1 when launcher.nodes >= 2, else node 0)"""
    value_trainer: Any = free(None, NODES)
    """node of the value trainer, or a list of consecutive nodes, as policy_trainer (null = node 1 when
    launcher.nodes >= 2, else node 0)"""


@dataclass
class LauncherConfig:
    name: str = choice("local", "local", "slurm")
    """'local': every role a subprocess of this machine; 'slurm': the rl stage is one sbatch job sized for every
    role at once (it starts whole or not at all), whose conductor runs each role as an srun step of it"""
    poll_s: float = ranged(0.5, "> 0")
    """how often the conductor checks jobs and refreshes progress"""
    stop_grace_s: float = ranged(30.0, ">= 0")
    """after the stop file is written, how long roles get to finish before they are cancelled"""
    timeout_min: int = ranged(120, ">= 1")
    """wall-clock limit of every role job"""
    max_restarts: int = ranged(5, ">= 0")
    """the restart budget, a rate: a role that fails (crash, kill, node failure, preemption) is resubmitted at once
    from its state in the run directory, up to this many times per role within any restart_window_s; one more
    failure in that window fails the run (0 = fail the run at the first failure)"""
    restart_window_s: Optional[float] = ranged(3600.0, ("> 0", " (seconds), or null to count restarts over the "
                                                               "whole run"))
    """the window of the restart budget in seconds: restarts older than this no longer count (null = the whole run,
    i.e. at most max_restarts restarts per role per run)"""
    restart_backoff_s: float = ranged(2.0, ">= 0")
    """a failed role is restarted at once; one that fails again before it came up (no heartbeat since its start: a
    crash loop) waits this long before its next restart, doubled for each further such failure (at most 60 s)"""
    hang_timeout_s: Optional[float] = ranged(1800.0, ("> 0", " (seconds), or null to never take a silent role "
                                                            "for hung"))
    """a role that came up (it beat since its start) and whose newest heartbeat is older than this is taken for hung
    (a deadlock, a collective that never returns, a dead mount, a SIGSTOP): it is SIGKILLed with its processes and
    restarted with the cause 'hung: no heartbeat for N s', counted in its restart budget. Roles beat every ~2 s
    while they poll; one step or evaluation of a big model on a CPU can keep one quiet for minutes: raise it there,
    or let hang_quiet_factor do it. Before its first heartbeat a role is starting: start_timeout_s holds it
    (null = never, start-up included)"""
    start_timeout_s: Optional[float] = ranged(1800.0, ("> 0", " (seconds), or null to never take a role that has "
                                                             "not come up for hung"))
    """how long a role may take from its start (or restart) to its first heartbeat (an srun step's start, imports,
    the trainers' rendezvous, loading models, the first held-out evaluation: a minute or more on a loaded machine)
    before it is taken for hung and restarted ('hung: no heartbeat for N s since its start, before it came up');
    never less than hang_timeout_s, and off with it (null = never)"""
    hang_quiet_factor: Optional[float] = ranged(3.0, (">= 1", ", or null to hold every role to hang_timeout_s "
                                                              "alone"))
    """a role that has shown a silence of q seconds between two heartbeats in this run (one step or evaluation, on
    this machine under its present load) is taken for hung only after this many times q, when that is longer than
    hang_timeout_s: the limit scales with what the machine measured (null = hang_timeout_s alone)"""
    fork_server: bool = True
    """local: fork every role job from one process that has imported torch and transformers already (a restarted
    role is working in about a second instead of paying 5-15 s of imports); false = a fresh Python process each"""
    detach: bool = False
    """submit a conductor job that runs the roles (restarts, stop, summary) and return at once; follow the run
    with `python -m prime_values.tools.status <run_dir>`, stop it with `... status <run_dir> --stop` (rl stage only)"""
    partition: Optional[str] = None
    """slurm: partition (null = the cluster's default)"""
    account: Optional[str] = None
    """slurm: account to charge"""
    qos: Optional[str] = None
    """slurm: quality of service"""
    constraint: Optional[str] = None
    """slurm: node feature constraint"""
    extra_sbatch: dict = field(default_factory=dict)
    """slurm: further #SBATCH options, e.g. {mail-type: END, exclusive: true} (true = a bare flag)"""
    setup: list = field(default_factory=list)
    """slurm: shell lines run before the role starts, e.g. ['module load cuda/12.4']"""
    cpus_per_task: int = free(1, "SLURM refuses a request it cannot meet, in its own words")
    """slurm: CPUs per role process, for sizing the pipeline's allocation when launcher.cpus is null, and per job of
    the sft/eval stages (threads within a role: topology.threads_per_role)"""
    cpus: Optional[int] = ranged(None, (">= 1", ", or null to size the allocation from launcher.cpus_per_task"))
    """slurm: CPUs of the pipeline's allocation (on each of its nodes), shared by its roles (null = cpus_per_task per
    role process plus one for the conductor, on the node that needs most); a pipeline the partition cannot hold
    fails before submission, in one line"""
    mem_gb: Optional[int] = free(None, "SLURM refuses a request it cannot meet, in its own words")
    """slurm: memory of the pipeline's allocation (on each of its nodes) and of each stage job (null = the cluster's
    default per CPU)"""
    nodes: int = ranged(1, ">= 1")
    """slurm: nodes of the pipeline's allocation. With 1 every role shares the node; with 2 or more the generation
    side (inference workers, evaluators, orchestrator, and the conductor) runs on node 0 and the trainers on node 1,
    unless launcher.placement.* says otherwise; launcher.cpus, launcher.mem_gb and the GPUs are then asked for on each
    node (the most any node needs). Every node must hold a role: LauncherConfig.check; launcher=local has one
    node, this machine: keep 1 there"""
    placement: PlacementConfig = field(default_factory=lambda: PlacementConfig())
    """slurm: the node(s) of each role within the pipeline's allocation (launcher.placement.*)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        if cfg.launcher.name != "slurm":
            _check_one_machine(cfg.launcher)
            return
        run_check(PLACEMENT_CHECK, cfg, environment)  # launcher.nodes / launcher.placement against the topology
        if not environment:
            return
        _check_slurm(cfg.launcher)
        run_check(FIT_CHECK, cfg, environment)  # a node can hold the whole pipeline


def _check_one_machine(launcher) -> None:
    """launcher=local runs every role on this machine: launcher.nodes and launcher.placement.* (SLURM's allocation
    over nodes) would be ignored, so a value other than their defaults is a mistake."""
    name = launcher.name
    if launcher.nodes != 1:
        raise ConfigError(f"launcher.nodes={launcher.nodes} applies to launcher=slurm only (launcher={name} runs "
                          "every role on this one machine); set launcher.nodes=1 or use launcher=slurm")
    for role, placed in (launcher.get("placement") or {}).items():
        if placed is not None:
            raise ConfigError(f"launcher.placement.{role}={placed} applies to launcher=slurm only (launcher={name} "
                              f"runs every role on this one machine); set launcher.placement.{role}=null or use "
                              "launcher=slurm")


def _check_slurm(launcher) -> None:
    """launcher=slurm: the client commands exist, and a partition is named or the cluster has a default one."""
    if launcher.partition is not None and not str(launcher.partition).strip():
        raise ConfigError("launcher.partition is empty; name a partition (sinfo lists them) or set it to null for "
                          "the cluster's default")
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise ConfigError("launcher=slurm needs the SLURM client commands (sbatch, sinfo) on this machine; run on a "
                          "login node, or try launchers/local_slurm/start.sh")
    listed = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30).stdout.split()
    names = [p.rstrip("*") for p in listed]
    if launcher.partition is None and not any(p.endswith("*") for p in listed):
        raise ConfigError(f"launcher.partition is null but the cluster has no default partition; set "
                          f"launcher.partition to one of: {', '.join(names) or '(sinfo lists none)'}")
    if launcher.partition is not None and names and launcher.partition not in names:
        raise ConfigError(f"launcher.partition={launcher.partition!r} is not a partition of this cluster; "
                          f"choose one of: {', '.join(names)}")
