"""Idle cores lent to the policy trainer (`topology.lend_idle_cores`): the roles of a local run share one
machine, and its cores follow which roles are computing instead of a static split.

Each CPU role of the rl stage keeps one file in `<run>/state/cores/`, named after the role, holding its torch
thread count. While the role computes it holds an exclusive `flock` on its file; a role that lends (an inference
worker, an evaluator, a value trainer) releases it while it waits and takes it back, waiting if need be, before
it computes again; any other role holds it for its whole life (the kernel drops it when the process ends).
Before each micro-batch's forward and backward pass the policy trainer, while it runs on its own threads, locks
every file it can without waiting and runs with

    threads = max(its own, cores − Σ threads of the roles it could not lock)

holding the locks it took until its optimizer step is done, so a lender never computes beside a borrowed team:
OpenMP teams of more threads than free cores wait at every barrier for a descheduled thread, many times slower
(docs/benchmarks.md, "Versus TRL"). Trying again at each micro-batch catches a core freed mid-step: inference's
chunk starts when the trainer takes a batch, so it overlaps the step's first forward and is often over before the
step's later micro-batches (`policy.micro_batch_rollouts`). Hand-worked, 2 cores, 1 thread each: inference
waiting -> the trainer's micro-batch runs on 2 threads, and so does every later one of the step; inference
generating -> 1; with a value trainer and an evaluator beside them, both computing -> max(1, 2 − 2) = 1 whatever
inference does.

Processes outside the run are invisible to the locks, so the borrower also times itself (`BorrowGuard`): seconds
per token of its first `window` steps on its own threads, then of its borrowing steps; while the median borrowing
step is not `gain` times faster it stops borrowing for `retry` steps, then tries again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import statistics
import time
from collections import deque
from pathlib import Path


class BorrowGuard:
    """Whether borrowing pays on this machine now (see the module docstring). Hand-worked, window 2, gain 1.15,
    retry 4: own steps 1.0, 1.0 s/token, then borrowing 0.6, 0.6 -> keeps borrowing (1.0 / 0.6 = 1.67); a busy
    machine then gives 1.1, 1.2 -> the median borrowing step 1.15 is slower than 1.0 / 1.15: the next 4 steps use
    the own threads, then 2 borrowing steps are timed afresh."""

    def __init__(self, window: int = 6, gain: float = 1.15, retry: int = 64) -> None:
        self.window, self.gain, self.retry = window, gain, retry
        self.own: deque[float] = deque(maxlen=window)
        self.borrowing: deque[float] = deque(maxlen=window)
        self.paused = 0  # steps left on the own threads after borrowing lost

    def wants(self) -> bool:
        if self.paused:
            self.paused -= 1
            if not self.paused:
                self.borrowing.clear()
            return False
        return len(self.own) >= self.window

    def add(self, borrowed: bool, seconds_per_unit: float) -> None:
        (self.borrowing if borrowed else self.own).append(seconds_per_unit)
        if borrowed and len(self.borrowing) >= self.window // 2 + 1 and \
                statistics.median(self.borrowing) * self.gain > statistics.median(self.own):
            self.paused = self.retry


def core_share(cfg, role: str, device: str, threads: int, directory: Path, environ=os.environ):
    """This role's share of the machine's cores (`CoreShare`), or `NoShare` where lending does not apply (see
    topology.lend_idle_cores): inference workers, evaluators and a value trainer lend (not one that serves the
    evaluator between its steps, topology.evaluator=colocated: it counts as always computing), the policy trainer
    borrows."""
    topo = cfg.topology
    applies = (topo.get("lend_idle_cores", False) and cfg.launcher.name == "local" and device == "cpu"
               and not environ.get("OMP_NUM_THREADS") and not topo.threads_per_role
               and not topo.policy_trainer_threads and topo.policy_trainer_procs == 1
               and topo.value_trainer_procs == 1 and topo.policy_trainer_device == "cpu"
               and role.startswith(("inference", "evaluator", "value_trainer", "policy_trainer")))
    if not applies:
        return NoShare()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    lends = role.startswith(("inference", "evaluator")) or role == "value_trainer" and topo.evaluator == "dedicated"
    return CoreShare(directory, role, threads, cores, lends=lends)


class CoreShare:
    def __init__(self, directory: Path, role: str, threads: int, cores: int, lends: bool = False) -> None:
        self.directory, self.role, self.threads, self.cores = Path(directory), role, threads, cores
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.directory / role, os.O_RDWR | os.O_CREAT, 0o644)
        os.ftruncate(self.fd, 0)
        os.write(self.fd, f"{threads}\n".encode())
        self.borrowed: list[int] = []  # open, locked files of idle roles, while the trainer computes with their cores
        self.now = threads  # the thread count set now (borrow / give_back)
        self.guard, self.began, self.lends = BorrowGuard(), 0.0, lends
        self.stepping, self.trying, self.peak = False, False, threads  # inside a step; the guard said borrow; its most
        if not lends:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

    @contextlib.contextmanager
    def computing(self):
        """A lender's compute: its file locked for the block (waiting while a borrower holds it); a role that does
        not lend holds its lock already."""
        if not self.lends:
            yield
            return
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)

    def borrow(self) -> int:
        """The threads to compute with now, called before each part of a step (see the module docstring): the
        first call of a step starts its clock and asks the guard; once borrowed, the cores are kept until
        `give_back`, and the idle roles' files stay locked until then."""
        if not self.stepping:
            self.stepping, self.began, self.peak = True, time.perf_counter(), self.threads
            self.trying = self.guard.wants()
        if not self.trying or self.now > self.threads:
            return self.now
        busy = 0
        for path in sorted(self.directory.iterdir()):
            if path.name == self.role:
                continue
            try:
                fd = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                busy += _threads_in(fd)
                os.close(fd)
                continue
            self.borrowed.append(fd)
        threads = max(self.threads, self.cores - busy)
        if threads == self.threads:
            self._release()
        self._set(threads)
        self.peak = max(self.peak, threads)
        return threads

    def give_back(self, work: float = 1.0) -> int:
        """The borrowed cores back; `work` (the step's tokens) times the step for `BorrowGuard` (a step that
        borrowed for any part counts as borrowing). Returns the most threads the step ran with."""
        peak = self.peak
        self.guard.add(peak > self.threads, (time.perf_counter() - self.began) / max(work, 1e-9))
        self._release()
        self._set(self.threads)
        self.stepping = False
        return peak

    def _release(self) -> None:
        for fd in self.borrowed:
            os.close(fd)  # closing the descriptor drops its lock
        self.borrowed = []

    def _set(self, threads: int) -> None:
        if threads != self.now:
            import torch

            torch.set_num_threads(threads)
            self.now = threads

    def close(self) -> None:
        self._release()
        os.close(self.fd)


def _threads_in(fd: int) -> int:
    try:
        return int(os.pread(fd, 16, 0).decode().strip() or 1)
    except (OSError, ValueError):
        return 1


class NoShare:
    """`topology.lend_idle_cores` off, or not applicable (GPU roles, several nodes, a sharded trainer)."""

    @contextlib.contextmanager
    def computing(self):
        yield

    def borrow(self) -> int:
        import torch

        return torch.get_num_threads()

    def give_back(self, work: float = 1.0) -> int:
        import torch

        return torch.get_num_threads()

    def close(self) -> None:
        pass
