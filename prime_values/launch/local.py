"""Local role jobs: submitit's local executor with our controller (`prime_values.launch.controller`), forked from
the run's fork server when there is one (`prime_values.launch.zygote`), and the cause of a job's end read from its
exit state.

A `LocalRoleJob` answers `exit_cause()` without waiting: the controller's own return code (a killed controller),
else the `<job id>_exit.json` it wrote when the job ended (each task's exit code or signal, a time limit), and
for a task that exited with an error the last line of its traceback (its result pickle, else its log). It never
calls submitit's `exception()`/`result()`, which poll up to `Job._results_timeout_s` (15 s) for the result
pickle that a SIGKILLed task never writes.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import submitit
from submitit.local.local import LocalJob

from prime_values.launch.controller import _write_json

STEP_RANKS_ENV = "PRIME_VALUES_STEP_RANKS"  # set: each srun task of the step is one rank (launch.controller)

_ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL|FATAL)\b")
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[,.]\d+ ")  # logging's asctime


def signal_name(number: int) -> str:
    return f"killed by signal {number}" + (f" ({signal.Signals(number).name})" if number != 9 and
                                           number in signal.Signals._value2member_map_ else "")


def oom_kills() -> int | None:
    """The kernel's OOM-kill counter of this machine's memory cgroup (v2 memory.events, v1 memory.oom_control)."""
    for path, key in (("/sys/fs/cgroup/memory.events", "oom_kill"),
                      ("/sys/fs/cgroup/memory/memory.oom_control", "oom_kill")):
        try:
            for line in Path(path).read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def last_error_line(text: str) -> str | None:
    """The error a log or traceback ends with: the last line of its last traceback, else its last ERROR line."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    last_tb = max((i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")),
                  default=None)
    if last_tb is not None:
        # the exception line: the first unindented line after the frames ("ValueError: ...")
        for line in lines[last_tb + 1:]:
            if not line.startswith((" ", "\t")):
                return line.strip()
    errors = [_TIMESTAMP.sub("", line.strip()) for line in lines if _ERROR_LINE.search(line)]
    return errors[-1] if errors else None


def _tail(path: Path, size: int = 65536) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - size))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def result_error(path: Path) -> str | None:
    """The error line of a submitit result pickle that holds ("error", traceback); None otherwise."""
    try:
        with path.open("rb") as f:
            outcome, payload = pickle.load(f)[:2]
    except Exception:  # noqa: BLE001 - missing, torn or foreign: no answer
        return None
    return last_error_line(str(payload)) if outcome == "error" else None


def task_error(folder: Path, job_id: str, task: int) -> str | None:
    return (result_error(folder / f"{job_id}_{task}_result.pkl")
            or last_error_line(_tail(folder / f"{job_id}_{task}_log.err")))


class LocalRoleJob(LocalJob):
    """A local job whose end is read from its controller at once (see the module docstring)."""

    started_at: float = 0.0
    oom_at_start: int | None = None
    proc: psutil.Process | None = None  # the controller (or srun), taken at its start: signals check its create time

    @property
    def collateral(self) -> bool:
        """Whether the job died because the fork server it was forked from died (not a failure of its own)."""
        return bool(getattr(self._process, "server_lost", False))

    @property
    def exit_file(self) -> Path:
        return self.paths.folder / f"{self.job_id}_exit.json"

    def exit_cause(self) -> tuple[bool, str | None]:
        """(ended, cause): (False, None) while running; (True, None) when every task exited 0; else (True, the
        cause in words: 'killed by signal 9', 'exit code 1: ValueError: ...', 'timeout', 'out of memory')."""
        if self._process is None:  # a job of another process (unpickled): only its files
            if not self.exit_file.exists():
                return (self.paths.result_pickle.exists(), None)
            code = None
        else:
            code = self._process.poll()
            if code is None:
                return False, None
            if code < 0:  # the controller itself was killed; its tasks die with it (PR_SET_PDEATHSIG)
                return True, "killed with the fork server (it died)" if self.collateral else self._signal_cause(-code)
        try:
            state = self._exit_state()
        except (OSError, ValueError):
            if code is not None and code > 128 and getattr(self, "step_prefix", None):
                return True, self._signal_cause(code - 128)  # srun: its step's controller died of a signal
            return True, None if code == 0 else f"exit code {code}: the job controller ended without an exit state " \
                f"(log: {self.paths.stderr})"
        if state.get("timeout"):
            return True, "timeout"
        if state.get("signal") is not None and any(c != 0 for c in state["final"]):
            return True, f"cancelled (signal {state['signal']} to its controller)"
        failed = state.get("failed_task")
        if failed is None:
            return True, None
        task_code = state["codes"][failed]
        rank = f" (process {failed} of {len(state['codes'])})" if len(state["codes"]) > 1 else ""
        if state.get("spread"):  # a step over several nodes: which rank, on which node (log: <job id>_<rank>_log.err)
            rank = f" (process {failed} of {len(state['codes'])}, on node {state.get('node')})"
        if task_code < 0:
            return True, self._signal_cause(-task_code) + (rank if state.get("spread") else "")
        error = task_error(self.paths.folder, self.job_id, failed)
        return True, f"exit code {task_code}{rank}: " + (error or f"no error line in {self.paths.stderr}")

    def _exit_state(self) -> dict:
        """The exit state the controller wrote; for a step over several nodes (one controller per rank, each its
        own `<job id>_exit.<rank>.json` besides rank 0's `<job id>_exit.json`) the one that says why: a rank that
        failed by itself before the ones the step's end then signalled. Raises OSError when there is none."""
        others = sorted(self.paths.folder.glob(f"{self.job_id}_exit.*.json"))
        if not others:
            return json.loads(self.exit_file.read_text())
        states = []
        for path in [self.exit_file, *others]:
            try:
                states.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue  # a controller killed before it wrote one (the step's end kills every rank)
        if not states:
            raise OSError(f"no exit state in {self.paths.folder}")
        state = states[0]
        failed = [s for s in states if s.get("failed_task") is not None]
        cause = next((s for s in failed if s.get("signal") is None), None) or next(iter(failed), None) or \
            next((s for s in states if s.get("timeout") or s.get("signal") is not None), state)
        merged = dict(cause, spread=True)
        codes: list = [None] * max(s.get("first_task", 0) + len(s["codes"]) for s in states)
        for s in states:  # by rank; None for the ranks whose controller wrote nothing
            codes[s.get("first_task", 0):s.get("first_task", 0) + len(s["codes"])] = s["codes"]
        merged["codes"] = codes
        merged["final"] = [c for s in states for c in s["final"]]
        if cause.get("failed_task") is not None:
            merged["failed_task"] = cause.get("first_task", 0) + cause["failed_task"]
        return merged

    def _signal_cause(self, number: int) -> str:
        now = oom_kills()
        if number == signal.SIGKILL and now is not None and self.oom_at_start is not None and now > self.oom_at_start:
            return "out of memory (killed by signal 9)"
        return signal_name(number)


class LocalLaunch:
    """How the jobs of a local run start: forked from the run's fork server (`fork_server`, a
    prime_values.launch.zygote.ZygoteClient: pre-imported, they skip the imports) or, without one, as fresh Python
    processes. Whoever starts the fork server makes this object, hands it to whatever submits jobs (the supervisor,
    the stage jobs) and closes it."""

    def __init__(self, fork_server=None):
        self.fork_server = fork_server

    def wait_ready(self) -> None:
        """Wait for the fork server to be ready before the first job (its imports take what one job's would)."""
        if self.fork_server is not None and not self.fork_server.ready(wait_s=120):
            print("prime_values: the fork server did not start; jobs start as fresh processes", flush=True)

    def close(self) -> None:
        """Stop the fork server (jobs submitted afterwards start as fresh processes)."""
        server, self.fork_server = self.fork_server, None
        if server is not None:
            server.close()


class LocalRoleExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, whose jobs run under prime_values.launch.controller, forked from `fork_server` when
    one is given."""

    job_class = LocalRoleJob

    def __init__(self, folder, fork_server=None, **kwargs):
        super().__init__(folder, **kwargs)
        self.fork_server = fork_server

    def _submit_command(self, command: str) -> LocalRoleJob:
        ntasks = self.parameters.get("tasks_per_node", 1)
        n_gpus = self.parameters.get("gpus_per_node", 0)
        visible = self.parameters.get("visible_gpus", ())
        gpus = range(n_gpus) if visible == () else visible[:n_gpus]
        env = {**os.environ, "SUBMITIT_LOCAL_NTASKS": str(ntasks), "SUBMITIT_LOCAL_COMMAND": command,
               "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
               "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
               "SUBMITIT_LOCAL_NODEID": "0", "SUBMITIT_LOCAL_JOB_NUM_NODES": "1", "SUBMITIT_STDERR_TO_STDOUT": "",
               "SUBMITIT_EXECUTOR": "local", "CUDA_VISIBLE_DEVICES": ",".join(str(k) for k in gpus),
               "SUBMITIT_LOCAL_WITH_SHELL": "1" if self.parameters.get("setup") else ""}
        # the job folder ends the command line, as with submitit's controller (prime_values.tools.chaos finds roles
        # by it)
        cmd: list[str] | str = [sys.executable, "-m", "prime_values.launch.controller", str(self.folder)]
        if self.parameters.get("setup"):
            cmd = " && ".join([*self.parameters["setup"], shlex.join(cmd)])
        prefix = getattr(self, "step_prefix", None)
        if prefix:  # a step of the pipeline's SLURM allocation (prime_values.launch.slurm.step_command)
            env.pop("CUDA_VISIBLE_DEVICES")  # slurmstepd sets the allocation's GPUs; the controller keeps the role's
            first, last = getattr(self, "step_gpus", None) or (0, 0)  # a CPU role: none (CUDA_VISIBLE_DEVICES='')
            env["PRIME_VALUES_GPU_SLICE"] = f"{first}:{last}"  # launch.slurm.GPU_SLICE_ENV
            if getattr(self, "step_ranks", False):  # one srun task per process, over several nodes
                env[STEP_RANKS_ENV] = "1"
            inner = shlex.join([*prefix, *cmd]) if isinstance(cmd, list) else \
                shlex.join(prefix) + " bash -c " + shlex.quote(cmd)
            # the job id is the pid of this shell, which becomes srun: the controller on the node learns it here
            cmd = f"export PRIME_VALUES_JOB_ID=$$; exec {inner}"
        oom = oom_kills()
        process = None if self.parameters.get("setup") or prefix or self.fork_server is None else \
            self.fork_server.start(self.folder, env)
        if process is None:  # no fork server (or it is not ready, or gone): a fresh Python process
            process = subprocess.Popen(cmd, shell=isinstance(cmd, str), env=env, start_new_session=bool(prefix))
        job = LocalRoleJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=list(range(ntasks)))
        job.started_at, job.oom_at_start, job.step_prefix = time.time(), oom, prefix
        job.proc = _handle(process)
        if job.proc is not None:  # who the job is, for tools that signal it (prime_values.tools.chaos)
            _write_json(self.folder / f"{job.job_id}_process.json",
                        {"pid": job.proc.pid, "create_time": job.proc.create_time()})
        return job


def _handle(process) -> psutil.Process | None:
    """The psutil handle of a job's controller just started: a child of ours (not reaped yet, so the pid is
    its own), or one the fork server forked, checked to be the server's child."""
    if not isinstance(process, subprocess.Popen):
        return process.proc  # a ZygoteJob: its handle, checked to be the fork server's child
    try:
        return psutil.Process(process.pid)
    except psutil.Error:
        return None
