"""What a hang, a preemption and a lost node each cost a pipeline over two nodes, on the local SLURM.

One run of the small critic pipeline over the two-node local cluster (launchers/local_slurm/cluster.py,
`two_node_pipeline`: the policy trainer's two ranks one on each node, the value trainer on node 1, the rest on
node 0), and three faults in turn, each once the run has made `--gap` clean policy steps since the last one
recovered:

- **hang**: rank 1 of the policy trainer (node 1) is frozen with SIGSTOP, a rank stuck as in a dead collective or
  mount; rank 0 waits on it, the step's heartbeat goes silent, and the supervisor kills and restarts the step
  after `launcher.hang_timeout_s` (`--hang-timeout`);
- **preemption**: a job of the cluster's urgent partition takes both nodes for `--preemptor-s` seconds; SLURM
  preempts the pipeline's allocation, the submitting command submits a fresh one, which starts when the
  preemptor is done and resumes the run;
- **lost node**: node 1's slurmd, step daemons and role processes are SIGKILLed; slurmctld itself marks the node
  DOWN after SlurmdTimeout (`--slurmd-timeout`, the local cluster's LOCAL_SLURM_SLURMD_TIMEOUT) and ends the
  allocation NODE_FAIL; the submitting command submits a fresh one, and the node is brought back as soon as it has.

For each: the pause in policy versions it made (from the last version before the recovered pipeline's first to
that first), the same less the median clean step interval (what the fault cost), and its parts in seconds after
the fault (noticed, the allocation ended, a fresh one submitted and running, its first policy version). Then
`prime_values.tools.check` of the run (nothing lost or trained twice). The one-node cluster comes back after. Needs
root.

    sudo python -m bench.bench_nodes [--hang-timeout 30] [--slurmd-timeout 30] [--preemptor-s 5] [--gap 5]
        [--record bench/records/nodes/<date>_<commit>.json]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import ROOT, stamp, write_record
from launchers.local_slurm import cluster
from prime_values.tools.chaos import policy_step, signal_rank

FAULTS = ("hang", "preemption", "lost node")


class Watch:
    """The run as it goes: when each policy version appeared, and the submitting command's lines with their time."""

    def __init__(self, run_dir: Path, proc: subprocess.Popen):
        self.run_dir, self.proc = run_dir, proc
        self.steps: dict[int, float] = {}
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line.rstrip()))

    def poll(self) -> int:
        step = policy_step(self.run_dir)
        if step and step not in self.steps:
            self.steps[step] = time.time()
        return step

    def until(self, what, timeout: float = 1800.0) -> float:
        """Poll until `what()` is true; the time it became so."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if what():
                return time.time()
            if self.proc.poll() is not None:
                raise RuntimeError(f"the run ended while waiting: {self.tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing after {timeout} s: {self.tail()}")
            time.sleep(0.1)

    def step_after(self, t: float) -> tuple[int, float, float]:
        """The first policy version that appeared after time t: its number, when, and when the one before it did."""
        self.until(lambda: any(when > t for when in self.steps.values()))
        step, when = min(((s, w) for s, w in self.steps.items() if w > t), key=lambda sw: sw[1])
        return step, when, self.steps.get(step - 1, when)

    def said_inside(self, text: str) -> bool:
        """Whether a conductor of the run (inside an allocation: jobs/pipeline/*_log.out) has printed `text`."""
        logs = (self.run_dir / "jobs" / "pipeline").glob("*_log.out")
        return any(text in path.read_text(errors="replace") for path in logs)

    def tail(self) -> str:
        return "\n".join(line for _, line in self.lines[-30:])


def jobs(run_dir: Path) -> list[str]:
    return sorted((p.name.split("_")[0] for p in (run_dir / "jobs" / "pipeline").glob("*_submitted.pkl")), key=int)


def squeue_state(job: str) -> str:
    out = subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.split()
    return out[0] if out else ""


def measure(args) -> dict:
    names = sorted(cluster.nodes())
    run_dir = Path(tempfile.mkdtemp(prefix="pv-nodes-")) / "run"
    overrides = [*cluster.two_node_pipeline(args.steps), f"launcher.hang_timeout_s={args.hang_timeout}",
                 "launcher.max_restarts=10"]
    command = [sys.executable, "-m", "prime_values", *overrides, f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"})
    watch = Watch(run_dir, proc)
    results, windows = {}, []
    try:
        for fault in FAULTS:
            base = watch.poll()
            watch.until(lambda: watch.poll() >= base + args.gap)
            at_step, t0 = watch.poll(), time.time()
            parts = {}
            if fault == "hang":
                if not signal_rank(run_dir, "policy_trainer", 1, signal.SIGSTOP):
                    raise RuntimeError("no rank 1 of the policy trainer to freeze")
                recovering = watch.until(lambda: watch.said_inside("role policy_trainer failed: hung"))
                parts["noticed (the heartbeat silent for hang_timeout_s)"] = recovering - t0
            else:
                before = jobs(run_dir)
                if fault == "preemption":
                    preemptor = cluster.preempt(2, args.preemptor_s)
                    running = watch.until(lambda: squeue_state(preemptor) == "RUNNING")
                    parts["the pipeline's allocation ended, the preemptor started"] = running - t0
                else:
                    cluster.lose_node(names[1], mark_down=False)
                    down = watch.until(lambda: cluster.node_state(names[1]).startswith("down"))
                    parts["slurmctld marked the node DOWN (SlurmdTimeout)"] = down - t0
                fresh = watch.until(lambda: len(jobs(run_dir)) > len(before))
                parts["a fresh allocation submitted"] = fresh - t0
                if fault == "lost node":
                    cluster.start(LOCAL_SLURM_NODES="2", LOCAL_SLURM_SLURMD_TIMEOUT=str(args.slurmd_timeout))
                    parts["the node back in service"] = time.time() - t0
                job = jobs(run_dir)[-1]
                recovering = watch.until(lambda: squeue_state(job) == "RUNNING")
                parts["the fresh allocation running"] = recovering - t0
            step, at, before_at = watch.step_after(recovering)
            parts["the first policy version after that"] = at - t0
            results[fault] = {"at_step": at_step, "first_step_after": step, "to_next_step_s": at - t0,
                              "stall_s": at - before_at, "parts_s": parts}
            windows.append((t0, at))
        watch.until(lambda: proc.poll() is not None, timeout=3600)  # the versions up to the last
    finally:
        if proc.poll() is None:
            proc.kill()
        if jobs(run_dir):
            subprocess.run(["scancel", *jobs(run_dir)], capture_output=True)
    times = [watch.steps[s] for s in sorted(watch.steps)][1:]  # from version 2: the first comes after start-up
    clean = [b - a for a, b in zip(times, times[1:]) if not any(a < end and b > start for start, end in windows)]
    interval = statistics.median(clean)
    for r in results.values():
        r["cost_s"] = r["stall_s"] - interval
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True)
    return {"command": " ".join(["python -m prime_values", *overrides]), "exit": proc.returncode,
            "clean_step_s": interval, "clean_steps": len(clean), "faults": results, "allocations": len(jobs(run_dir)),
            "check": check.returncode, "check_out": check.stdout.strip().splitlines()[-1:], "run_dir": str(run_dir)}


def table(rec: dict) -> str:
    rows = ["| fault | at policy step | the pause in policy versions | cost (the pause less a clean step) "
            "| parts (s after the fault) |", "|---|---|---|---|---|"]
    for fault, r in rec["faults"].items():
        parts = "; ".join(f"{k} {v:.1f}" for k, v in r["parts_s"].items())
        rows.append(f"| {fault} | {r['at_step']} | {r['stall_s']:.1f} s | **{r['cost_s']:.1f} s** | {parts} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hang-timeout", type=float, default=30.0, help="launcher.hang_timeout_s of the run")
    ap.add_argument("--slurmd-timeout", type=int, default=30, help="the cluster's SlurmdTimeout (s)")
    ap.add_argument("--preemptor-s", type=float, default=5.0, help="how long the preempting job holds the nodes")
    ap.add_argument("--gap", type=int, default=5, help="clean policy steps before each fault")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--record", type=Path, default=None, help="write the figures as JSON here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_nodes: the local SLURM needs root (sudo)", file=sys.stderr)
        return 2
    single = cluster.nodes()
    try:
        cluster.start(LOCAL_SLURM_NODES="2", LOCAL_SLURM_SLURMD_TIMEOUT=str(args.slurmd_timeout))
        rec = measure(args)
    finally:
        cluster.start(LOCAL_SLURM_NODES="", LOCAL_SLURM_SLURMD_TIMEOUT="")
    rec = stamp(**rec, time=time.strftime("%H:%M UTC", time.gmtime()),
                settings={"hang_timeout_s": args.hang_timeout, "slurmd_timeout_s": args.slurmd_timeout,
                          "preemptor_s": args.preemptor_s, "gap": args.gap, "steps": args.steps},
                load=os.getloadavg())
    print(f"two nodes, {rec['date']} {rec['time']}, commit {rec['commit']}; clean policy step "
          f"{rec['clean_step_s']:.1f} s (median of {rec['clean_steps']}); {rec['allocations']} allocations; exit "
          f"{rec['exit']}; check exit {rec['check']} {' '.join(rec['check_out'])}")
    print(table(rec))
    if args.record:
        write_record(args.record, rec)
    assert cluster.nodes() == single
    return 0 if rec["exit"] == 0 and rec["check"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
