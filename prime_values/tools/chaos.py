"""Chaos run: start a real run, SIGKILL a random role at random moments, and check the run directory after.

    python -m prime_values.tools.chaos --kills 20 --run-dir /tmp/chaos -- +experiment=arith steps=60
    python -m prime_values.tools.chaos --stop --kills 5 --hang-timeout 20 --run-dir /tmp/hang -- +experiment=arith

The conductor restarts every killed role (launcher.max_restarts, raised here to the number of kills) and each
role resumes from the run directory; when the run ends, `prime_values.tools.check` must find no violated invariant.
With --stop each role is frozen with SIGSTOP instead (a hang: a deadlock, a dead mount): the supervisor notices
its silent heartbeat after launcher.hang_timeout_s (set from --hang-timeout), kills and restarts it.
Prints one line per kill and a final report (kills per role, restarts the conductor made, wall time, check
result); exits non-zero when the run failed or the check found a violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from prime_values.launch import folder_processes
from prime_values.rundir import RunDir, StopReason

ROLES = ("inference0", "evaluator", "orchestrator", "policy_trainer", "value_trainer")


def role_processes(run_dir: Path, name: str) -> list[psutil.Process]:
    """The live processes of one role job: its newest job's controller as recorded when it was started
    (`jobs/<name>/<job id>_process.json`: pid and create time, so a reused pid is never taken for it; for an srun
    step of a SLURM allocation, srun) with its descendants, and every process whose command line ends with the job
    folder (a controller or task started as a fresh process, also one that slurmstepd started for a step) with
    its descendants. Each is a psutil handle: a signal through it checks the create time first."""
    folder = run_dir / "jobs" / name
    roots = []
    records = sorted(folder.glob("*_process.json"), key=lambda p: p.stat().st_mtime)
    if records and not (folder / f"{records[-1].name.split('_')[0]}_exit.json").exists():
        try:
            recorded = json.loads(records[-1].read_text())
            proc = psutil.Process(int(recorded["pid"]))
            if abs(proc.create_time() - recorded["create_time"]) < 0.01:
                roots.append(proc)
        except (OSError, ValueError, KeyError, psutil.Error):
            pass
    roots += folder_processes(folder)
    found = {}
    for root in roots:
        try:
            for proc in [root, *root.children(recursive=True)]:
                found[proc.pid] = proc
        except psutil.Error:
            continue
    return list(found.values())


def role_pids(run_dir: Path, name: str) -> list[int]:
    """The pids of `role_processes`."""
    return sorted(proc.pid for proc in role_processes(run_dir, name))


def signal_role(run_dir: Path, name: str, signum: int = signal.SIGKILL) -> bool:
    """Send `signum` to every process of a role job (SIGKILL: a crash; SIGSTOP: a hang, which the supervisor
    notices after launcher.hang_timeout_s); False when the role has no live process now (between restarts)."""
    sent = False
    for proc in role_processes(Path(run_dir), name):
        try:
            proc.send_signal(signum)  # psutil checks the create time first
            sent = True
        except psutil.Error:
            pass
    return sent


def signal_rank(run_dir: Path, name: str, rank: int, signum: int = signal.SIGKILL) -> bool:
    """Send `signum` to one rank of a role of several processes (its task whose SUBMITIT_LOCAL_GLOBALID is `rank`)
    and the processes under it: a crash of that rank (SIGKILL), or a rank stuck in a collective (SIGSTOP: the other
    ranks then wait on it, so the whole step's heartbeat goes silent). False when no such task lives now."""
    sent = False
    for proc in role_processes(Path(run_dir), name):
        try:
            if "submitit.core._submit" not in proc.cmdline() or \
                    proc.environ().get("SUBMITIT_LOCAL_GLOBALID") != str(rank):
                continue
            for target in (proc, *proc.children(recursive=True)):
                target.send_signal(signum)
            sent = True
        except psutil.Error:
            continue
    return sent


def kill_role(run_dir: Path, name: str) -> bool:
    return signal_role(run_dir, name, signal.SIGKILL)


def policy_step(run_dir: Path) -> int:
    try:
        return int((run_dir / "weights" / "policy" / "LATEST").read_text())
    except (OSError, ValueError):
        return 0


# what a role's metrics line says when it has produced something: a rollout segment, scored values, a batch, a
# policy step, a critic step (each role logs such a line right after publishing it)
OUTPUT_KEYS = {"inference": "chunk", "evaluator": "scored", "orchestrator": "step", "policy_trainer": "lr",
               "value_trainer": "critic_step"}


def recovery_times(run_dir: Path, killed: list[dict]) -> list[float | None]:
    """For each kill ({"role", "at"}), seconds from the kill to the killed role's first output after it (its
    first segment, batch, policy or critic step, from its metrics file); None when it produced none before the
    run ended."""
    times = []
    for kill in killed:
        key = OUTPUT_KEYS.get(kill["role"].rstrip("0123456789"))
        path = Path(run_dir) / "metrics" / f"{kill['role']}.jsonl"
        lines = []
        for line in (path.read_text(errors="replace").splitlines() if key and path.exists() else []):
            try:
                lines.append(json.loads(line))
            except ValueError:  # the line a killed role was writing
                continue
        after = [m["time"] for m in lines if key in m and m.get("time", 0) > kill["at"]]
        times.append(round(min(after) - kill["at"], 2) if after else None)
    return times


def chaos(run_dir: Path, overrides: list[str], kills: int, min_gap_s: float = 4.0, max_gap_s: float = 12.0,
          seed: int = 0, roles: tuple[str, ...] = ROLES, timeout_s: float = 3600, out=None,
          stop_after_steps: int | None = None, freeze: bool = False, hang_timeout_s: float = 20.0) -> dict:
    """Run the experiment with `overrides` in `run_dir`, killing a role `kills` times once RL has started
    (each role in turn, in a seeded random order, at random gaps); with `freeze`, SIGSTOP instead of SIGKILL,
    and the run's launcher.hang_timeout_s is `hang_timeout_s`.
    With `stop_after_steps`, once every kill is done the run goes on for that many more policy steps and is then
    asked to stop (the control file): the kills cannot race the run's own end, however fast the machine (give
    `steps` more than the kills can take). Returns the report (also written to `<run_dir>/chaos.json`; the run's
    whole output is `<run_dir>/chaos.log`)."""
    rng, out = random.Random(seed), out or sys.stdout  # the stdout of the call (a default would keep the import's)
    run_dir = Path(run_dir).resolve()
    command = [sys.executable, "-m", "prime_values", *overrides, f"hydra.run.dir={run_dir}",
               f"launcher.max_restarts={kills + 1}", "launcher.restart_backoff_s=0.5"]
    if freeze:
        command.append(f"launcher.hang_timeout_s={hang_timeout_s:g}")
    signum, verb = (signal.SIGSTOP, "froze (SIGSTOP)") if freeze else (signal.SIGKILL, "killed")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    began = time.time()
    conductor = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done: list[dict] = []
    run_wall_s = None
    order = list(roles)
    rng.shuffle(order)
    try:
        while conductor.poll() is None and len(done) < kills and time.time() - began < timeout_s:
            time.sleep(rng.uniform(min_gap_s, max_gap_s))
            if policy_step(run_dir) < 1 and not (run_dir / "weights" / "critic" / "1").exists():
                continue  # RL has not started yet: the roles are still loading
            order = [r for r in order if (run_dir / "jobs" / r).exists()]  # roles this topology has
            name = order[len(done) % len(order)]  # every role in turn, in a seeded order
            if not signal_role(run_dir, name, signum):
                continue  # between restarts: try again later
            killed_at = time.time()
            done.append({"role": name, "at_s": round(killed_at - began, 1), "at": killed_at,
                         "policy_step": policy_step(run_dir)})
            print(f"chaos: {verb} {name} at {done[-1]['at_s']} s (policy step {done[-1]['policy_step']})",
                  file=out, flush=True)
        if stop_after_steps is not None and conductor.poll() is None:
            target = policy_step(run_dir) + stop_after_steps  # every role resumed and the run still progresses
            while conductor.poll() is None and policy_step(run_dir) < target and time.time() - began < timeout_s:
                time.sleep(0.2)
            RunDir(run_dir).request_stop(StopReason.USER,
                                         f"chaos: {len(done)} kills done, {stop_after_steps} policy steps after")
        output, _ = conductor.communicate(timeout=max(timeout_s - (time.time() - began), 60))
        run_wall_s = time.time() - began
    finally:
        if conductor.poll() is None:
            conductor.send_signal(signal.SIGINT)
            conductor.wait(timeout=120)
            output = ""
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True, env=env)
    for kill, took in zip(done, recovery_times(run_dir, done)):
        kill["recovered_s"] = took
    restarts_file = RunDir(run_dir).restarts_file
    restarts = json.loads(restarts_file.read_text()) if restarts_file.exists() else {}
    report = {
        "kills": len(done), "kills_per_role": {r: sum(k["role"] == r for k in done) for r in roles},
        "restarts_per_role": restarts, "run_returncode": conductor.returncode, "check_returncode": check.returncode,
        "check_output": check.stdout.strip().splitlines()[-5:], "wall_s": round(time.time() - began, 1),
        "run_wall_s": round(run_wall_s, 1) if run_wall_s else None,
        "policy_steps": policy_step(run_dir), "killed": done, "run_output_tail": output.strip().splitlines()[-15:],
    }
    (run_dir / "chaos.json").write_text(json.dumps(report, indent=1) + "\n")
    (run_dir / "chaos.log").write_text(output)  # the run's whole output: every restart and its cause
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="python -m prime_values.tools.chaos [options] -- <overrides>")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--min-gap", type=float, default=4.0, help="seconds between kills, at least")
    parser.add_argument("--max-gap", type=float, default=12.0, help="seconds between kills, at most")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--stop", action="store_true", help="SIGSTOP the roles (a hang) instead of SIGKILL")
    parser.add_argument("--hang-timeout", type=float, default=20.0,
                        help="with --stop: the run's launcher.hang_timeout_s (seconds)")
    parser.add_argument("overrides", nargs="*", help="the experiment's overrides, e.g. +experiment=arith steps=60")
    args = parser.parse_args(argv)
    report = chaos(args.run_dir, args.overrides or ["+experiment=arith"], args.kills, args.min_gap, args.max_gap,
                   args.seed, freeze=args.stop, hang_timeout_s=args.hang_timeout)
    print("\n".join(report["run_output_tail"]))
    print(f"chaos: {report['kills']} kills {report['kills_per_role']}, restarts {report['restarts_per_role']}, "
          f"run exit {report['run_returncode']}, check exit {report['check_returncode']}, "
          f"{report['policy_steps']} policy steps in {report['wall_s']} s")
    print("\n".join(report["check_output"]))
    return 0 if report["run_returncode"] == 0 and report["check_returncode"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
