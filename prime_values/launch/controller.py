"""The controller of one local role job: `python -m prime_values.launch.controller <job folder>`.

It replaces submitit's local controller (`submitit.local._local`) for the role jobs, with the same environment and
file layout (the tasks are still `python -m submitit.core._submit <folder>`, so the role's function, its result
pickle and its logs are submitit's), and three differences that make recovery fast:

- it writes the tasks' exit state to `<folder>/<job id>_exit.json` the moment the job ends, and never waits
  for a result pickle (submitit's controller polls 15 s for the pickle of a SIGKILLed task);
- when one task of a multi-process trainer fails, it kills the other tasks at once (they would otherwise wait
  in a collective until its timeout);
- every task dies with the controller (PR_SET_PDEATHSIG): a killed controller leaves no orphan that could run
  next to its replacement.

Exit status: 0 when every task exited 0, else 1. Only the standard library is imported here.
"""

from __future__ import annotations

import ctypes
import functools
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import time
import traceback
from pathlib import Path

POLL_S = 0.05
GRACE_S = 3.0  # after a stop signal or the time limit: SIGINT, then SIGKILL after this long


def _die_with_parent(parent: int) -> None:
    """In the child between fork and exec: SIGKILL when `parent` (the pid that forked us, read before the fork)
    dies. A parent killed before the prctl call would never deliver it, so a child already orphaned exits."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except Exception:  # noqa: BLE001 - not Linux: the conductor's kill_tree remains
        pass
    if os.getppid() != parent:  # the parent died between the fork and the prctl: nobody would end us
        os._exit(1)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data) + "\n")
    os.replace(tmp, path)


class ForkedTask:
    """A task forked from this (pre-imported) process, with the part of Popen's interface the controller uses."""

    def __init__(self, folder: Path, job_id: str, env: dict, out: str, err: str):
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the task: its environment and logs, then submitit's job runner, as `-m submitit.core._submit`
            code = 1
            try:
                _die_with_parent(parent)
                for signum in (signal.SIGTERM, signal.SIGCHLD):
                    signal.signal(signum, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt, as in a fresh process
                os.environ.clear()
                os.environ.update(env)
                for fd, path in ((1, out), (2, err)):
                    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                    os.dup2(target, fd)
                    os.close(target)
                sys.argv = ["submitit-task", str(folder)]
                random.seed()  # fresh unseeded state, as a new interpreter has (the fork copied the server's)
                if "numpy" in sys.modules:
                    sys.modules["numpy"].random.seed()
                pickle = folder / f"{job_id}_submitted.pkl"
                deadline = time.time() + 60
                while not pickle.exists() and time.time() < deadline:  # submitit renames it in right after the start
                    time.sleep(0.01)
                from submitit.core.submission import process_job

                process_job(folder)
                code = 0
            except SystemExit as exit_:
                code = exit_.code if isinstance(exit_.code, int) else 1
            except BaseException:  # noqa: BLE001 - the traceback goes to the task's log, as in a fresh process
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(POLL_S)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)  # our own child: its pid is not free for reuse until poll() has reaped it


class Controller:
    def __init__(self, folder: Path, fork: bool = False):
        self.fork = fork
        self.folder = folder
        self.ntasks = int(os.environ["SUBMITIT_LOCAL_NTASKS"])
        self.command = shlex.split(os.environ["SUBMITIT_LOCAL_COMMAND"])
        self.timeout_s = int(os.environ["SUBMITIT_LOCAL_TIMEOUT_S"])
        with_shell = bool(os.environ.get("SUBMITIT_LOCAL_WITH_SHELL"))
        self.job_id = os.environ.get("PRIME_VALUES_JOB_ID") or \
            str(os.getppid() if with_shell and not fork else os.getpid())  # the pid the conductor knows the job by
        # one srun task of a step over several nodes (PRIME_VALUES_STEP_RANKS, launch.slurm.step_command): this
        # controller's processes are ranks first_task.. of the step's, and rank 0 of them rendezvouses
        self.step_rank = int(os.environ.get("SLURM_PROCID", 0)) if os.environ.get("PRIME_VALUES_STEP_RANKS") else None
        self.first_task = (self.step_rank or 0) * self.ntasks
        self.tasks: list[subprocess.Popen] = []
        self.signal_received: int | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signal_received = signum
        self._send(signum)

    def _send(self, signum: int) -> None:
        for task in self.tasks:
            if task.poll() is None:  # not reaped yet: its pid is still its own (a zombie at worst), never reused
                try:
                    task.send_signal(signum)
                except OSError:
                    pass

    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.step_rank == 0 and os.environ.get("SLURM_STEP_ID"):  # what kill_job cancels on every node
            step = f"{os.environ.get('SLURM_JOB_ID')}.{os.environ['SLURM_STEP_ID']}"
            tmp = self.folder / f".{self.job_id}_step.{os.getpid()}.tmp"
            tmp.write_text(step + "\n")
            os.replace(tmp, self.folder / f"{self.job_id}_step")
        if "PRIME_VALUES_GPU_SLICE" in os.environ:  # an srun step: keep the role's GPUs of the allocation's
            first, last = (int(k) for k in os.environ["PRIME_VALUES_GPU_SLICE"].split(":"))
            visible = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
            if len(visible) < last:
                raise RuntimeError(f"the step sees GPUs {visible or 'none'} but its role needs positions {first}.."
                                   f"{last - 1} of them (PRIME_VALUES_GPU_SLICE={first}:{last})")
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(visible[first:last])
        for k in range(self.ntasks):
            env = {**os.environ, "SUBMITIT_LOCAL_LOCALID": str(k), "SUBMITIT_LOCAL_GLOBALID": str(k),
                   "SUBMITIT_LOCAL_JOB_ID": self.job_id, **self._step_env(k)}
            task = self.first_task + k
            out, err = (str(self.folder / f"{self.job_id}_{task}_log.{kind}") for kind in ("out", "err"))  # submitit's
            if self.fork:
                self.tasks.append(ForkedTask(self.folder, self.job_id, env, out, err))
                continue
            with open(out, "a") as stdout, open(err, "a") as stderr:
                self.tasks.append(subprocess.Popen(self.command, env=env, stdout=stdout, stderr=stderr,
                                                   preexec_fn=functools.partial(_die_with_parent, os.getpid())))

    def _step_env(self, k: int) -> dict:
        """For process k of one task of a step over several nodes: submitit's view of the step's ranks, and the
        file through which rank 0 publishes where the others meet it (prime_values.dist.RENDEZVOUS_ENV): named
        after this job, the SLURM step and the allocation's restart count, so a restarted step (a new step id) or a
        requeued allocation never reads an earlier one's."""
        if self.step_rank is None:
            return {}
        tasks = int(os.environ.get("SLURM_STEP_NUM_TASKS") or os.environ.get("SLURM_NTASKS") or 1)
        step = ".".join(os.environ.get(key) or "0" for key in ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT"))
        return {"SUBMITIT_LOCAL_GLOBALID": str(self.first_task + k), "SUBMITIT_LOCAL_NTASKS": str(tasks * self.ntasks),
                "SUBMITIT_LOCAL_LOCALID": str(int(os.environ.get("SLURM_LOCALID") or 0) * self.ntasks + k),
                "SUBMITIT_LOCAL_NODEID": os.environ.get("SLURM_NODEID") or "0",
                "SUBMITIT_LOCAL_JOB_NUM_NODES": os.environ.get("SLURM_STEP_NUM_NODES") or "1",
                "PRIME_VALUES_RENDEZVOUS": str(self.folder / f"{self.job_id}_rendezvous.{step}.json")}

    @property
    def exit_file(self) -> Path:
        """`<job id>_exit.json`; in a step over several nodes, rank r > 0's controller `<job id>_exit.<r>.json`."""
        return self.folder / (f"{self.job_id}_exit.json" if not self.step_rank else
                              f"{self.job_id}_exit.{self.step_rank}.json")

    def wait(self) -> dict:
        """Until every task ended, or one failed (the others are then ended), or the time limit passed."""
        began, timeout, stop_at = time.time(), False, None
        while True:
            codes = [t.poll() for t in self.tasks]
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if self.signal_received is not None and stop_at is None:
                stop_at = time.time() + GRACE_S * 3
            if stop_at is not None and time.time() > stop_at:
                break
            if time.time() - began > self.timeout_s:
                timeout = True
                break
            time.sleep(POLL_S)
        failed = next((k for k, c in enumerate(codes) if c not in (None, 0)), None)
        ended_at = time.time()
        if failed is not None:  # one rank is gone: the others' work is lost with it, end them now
            self._send(signal.SIGKILL)
        if any(t.poll() is None for t in self.tasks):
            self._send(signal.SIGINT)  # submitit's task process ignores SIGTERM ("bypassing signal")
            deadline = time.time() + GRACE_S
            while any(t.poll() is None for t in self.tasks) and time.time() < deadline:
                time.sleep(POLL_S)
            self._send(signal.SIGKILL)
        for task in self.tasks:
            task.wait()
        return {"codes": codes, "final": [t.returncode for t in self.tasks], "failed_task": failed,
                "timeout": timeout, "signal": self.signal_received, "ended_at": ended_at,
                "first_task": self.first_task, "node": os.environ.get("SLURMD_NODENAME") or os.uname().nodename}

    def run(self) -> int:
        self.start()
        state = self.wait()
        _write_json(self.exit_file, state)
        return 0 if all(c == 0 for c in state["final"]) and not state["timeout"] else 1


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m prime_values.launch.controller <job folder>  (started by the conductor)",
              file=sys.stderr)
        sys.exit(0 if "--help" in sys.argv or "-h" in sys.argv else 2)
    sys.exit(Controller(Path(sys.argv[1])).run())
