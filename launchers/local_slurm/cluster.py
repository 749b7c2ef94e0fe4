"""Drive the local cluster from Python: start it with some nodes, list them, and do to it what a real cluster's
nodes and users do to a job (a node lost, a preempting job). Used by tests/launch/test_slurm.py and
bench/bench_nodes.py; needs root, as start.sh does.

    import cluster                                    # with launchers/local_slurm on sys.path
    cluster.start(LOCAL_SLURM_NODES="2")              # two slurmd on this host; returns start.sh's ready line
    cluster.lose_node(sorted(cluster.nodes())[1])     # a power loss of node 2
    cluster.preempt(count=2, seconds=5)               # a job of the urgent partition takes both nodes for 5 s
    cluster.power_cut(); cluster.start()              # the machine stops under its jobs, and comes back
    cluster.start(LOCAL_SLURM_NODES="")               # back to one node
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
START = HERE / "start.sh"

# A small critic pipeline for this cluster (the tiny embedded model, a few rollouts a step, the policy trainer two
# processes): `python -m prime_values *PIPELINE` runs it as one allocation of 2 CPUs.
PIPELINE = ["+experiment=arith", "steps=4", "eval_every=4", "policy.warm_start.steps=5", "critic.warm_start.steps=3",
            "critic.warm_start.rollouts=16", "task.heldout_size=8", "inference.prompts_per_step=2",
            "inference.group_size=2", "replay.min_rollouts=4", "critic.batch_rollouts=4", "critic.publish_every=1",
            "policy.arch.hidden_size=64", "policy.arch.num_heads=2", "policy.arch.num_kv_heads=1",
            "policy.arch.intermediate_size=128", "topology.policy_trainer_procs=2", "launcher=slurm",
            "launcher.cpus=2", "launcher.poll_s=0.5", "launcher.stop_grace_s=15"]


def two_node_pipeline(steps: int) -> list[str]:
    """PIPELINE over two nodes of 1 CPU each (launcher.nodes=2), `steps` policy steps; the policy trainer's two ranks
    one on each node, the value trainer on node 1, the rest on node 0."""
    return [*(o for o in PIPELINE if not o.startswith(("steps=", "eval_every=", "launcher.cpus="))),
            f"steps={steps}", f"eval_every={steps}", "launcher.cpus=1", "launcher.nodes=2",
            "launcher.placement.policy_trainer=[0,1]"]


def start(**settings: str) -> str:
    """Run start.sh with LOCAL_SLURM_* `settings` (an empty value returns a setting to its default; the CPU count is
    the machine's unless given); its ready line, or RuntimeError with what it said."""
    proc = subprocess.run([str(START)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "LOCAL_SLURM_CPUS": "", **settings})
    if proc.returncode != 0:
        raise RuntimeError(f"start.sh exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def state_dir() -> Path:
    """The cluster's state directory (start.sh's LOCAL_SLURM_STATE): pid files, job state, logs."""
    return Path(os.environ.get("LOCAL_SLURM_STATE", "/var/lib/prime-values-slurm"))


def nodes() -> dict[str, int]:
    """The cluster's nodes and their CPUs (sinfo lists a node once per partition)."""
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N|%c"], capture_output=True, text=True).stdout
    return {name: int(cpus) for name, cpus in (line.split("|") for line in out.split())}


def hostnames(nodelist: str) -> list[str]:
    """`vm-[1-2]` -> ['vm-1', 'vm-2']."""
    return subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True,
                          check=True).stdout.split()


def lose_node(name: str, mark_down: bool = True) -> list[int]:
    """What a power loss of node `name` does: SIGKILL its slurmd, every step daemon it started (found by their
    sockets in the node's spool directory; they run detached from slurmd) and the processes under them. With
    `mark_down`, mark it DOWN at once, as a health check or an administrator does; without, slurmctld does so itself
    once the node has been silent for SlurmdTimeout (LOCAL_SLURM_SLURMD_TIMEOUT). Returns the pids killed."""
    import psutil

    state = state_dir()
    spool = f"{state / 'slurmd' / name}/"
    daemons = [psutil.Process(int((state / "run" / f"slurmd-{name}.pid").read_text()))]
    for proc in psutil.process_iter(["name"]):
        try:
            if (proc.info["name"] or "").startswith("slurmstepd") and any(
                    str(c.laddr).startswith(spool) for c in proc.net_connections(kind="unix")):
                daemons.append(proc)
        except psutil.Error:
            continue
    killed = []
    for proc in [p for d in daemons for p in (d, *d.children(recursive=True))]:
        try:
            proc.kill()
            killed.append(proc.pid)
        except psutil.Error:
            continue
    if mark_down:
        subprocess.run(["scontrol", "update", f"NodeName={name}", "State=DOWN", "Reason=lost"], check=True)
    return killed


def power_cut() -> list[int]:
    """What a power cut of the whole machine does to the cluster: slurmctld's state as last saved, with the jobs
    running then recorded as running (a SIGTERM makes it save now, as its periodic save would have), and every slurmd,
    step daemon and job process gone (lose_node, without marking anything: no slurmctld is left to tell). The next
    start.sh starts the daemons again. Returns the pids killed."""
    import psutil

    names = sorted(nodes())
    state = state_dir()
    ctld = psutil.Process(int((state / "run" / "slurmctld.pid").read_text()))
    ctld.terminate()
    ctld.wait(timeout=30)
    return [pid for name in names for pid in lose_node(name, mark_down=False)]


def node_state(name: str) -> str:
    """sinfo's short state of a node: 'idle', 'alloc', 'down*', ..."""
    out = subprocess.run(["sinfo", "-h", "-n", name, "-o", "%t"], capture_output=True, text=True).stdout.split()
    return out[0] if out else ""


def preempt(count: int, seconds: float, partition: str = "urgent") -> str:
    """Submit a job of the urgent partition that takes every CPU of `count` nodes for `seconds`: SLURM preempts
    what runs there (PreemptType=preempt/partition_prio). Returns its job id."""
    cpus = min(nodes().values())
    out = subprocess.run(["sbatch", "--parsable", "-p", partition, f"--nodes={count}", "--ntasks-per-node=1",
                          f"--cpus-per-task={cpus}", "--mem=100M", "-J", "pv_preemptor", "-o", "/dev/null",
                          "--wrap", f"sleep {seconds}"], capture_output=True, text=True, check=True).stdout
    return out.strip().split(";")[0]
