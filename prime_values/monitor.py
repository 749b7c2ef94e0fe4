"""Metrics: one JSON object per line in `metrics/<role>.jsonl`, readable while the run goes; where a role's time
goes (`Timers`); the pace of a phase of equal steps (`Pace`: its rate and its slow steps, which the live view shows)
and the thread count of a job that runs alone, kept to what is fastest on a shared machine (`ThreadTuner`)."""

from __future__ import annotations

import json
import math
import resource
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None  # JSON has no NaN; null means "not measurable yet"
    return value


class MetricsWriter:
    def __init__(self, path: Path, role: str):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.role = role
        self._file = open(path, "a", buffering=1)  # line-buffered: the conductor tails it live

    def log(self, **metrics) -> None:
        record = {"time": time.time(), "role": self.role, **{k: _clean(v) for k, v in metrics.items()}}
        self._file.write(json.dumps(record) + "\n")

    def close(self) -> None:
        self._file.close()


class MetricsTail:
    """Reads the lines appended to a metrics file since the last call (the conductor's live view)."""

    def __init__(self, path: Path):
        self.path = path
        self._offset = 0
        self.last: dict = {}

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]  # a line still being written waits for the next call
        self._offset += len(complete)
        records = [json.loads(line) for line in complete.decode().splitlines() if line.strip()]
        for record in records:
            self.last.update(record)
        return records


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class Timers:
    """Where a role's wall time goes, cumulative since the role started: `compute` (its own work), `wait`
    (waiting for input: a batch, rollouts, values, a policy or critic version) and `io` (log and weights reads
    and writes). `timers.time("io")` is a context manager; `snapshot()` gives the metric fields every role logs
    (`compute_s`, `wait_s`, `io_s`, `role_wall_s`), from which `tools.summary.time_fractions` computes fractions, and
    `cpu_s`, the process's CPU seconds so far (all threads, user + system: what a role cost the machine)."""

    KINDS = ("compute", "wait", "io")

    def __init__(self) -> None:
        self.started = time.time()
        self.totals = dict.fromkeys(self.KINDS, 0.0)

    def add(self, kind: str, seconds: float) -> None:
        self.totals[kind] += seconds

    def time(self, kind: str):
        return _Span(self, kind)

    def snapshot(self) -> dict:
        return {**{f"{k}_s": round(v, 4) for k, v in self.totals.items()},
                "role_wall_s": round(time.time() - self.started, 4), "cpu_s": round(time.process_time(), 3),
                "peak_rss_mb": peak_rss_mb()}


def peak_rss_mb() -> float | None:
    """This process's peak resident memory so far (MB; None where the platform does not say)."""
    try:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return round(peak / (2 ** 20 if sys.platform == "darwin" else 2 ** 10), 1)  # bytes on macOS, KiB on Linux
    except Exception:  # noqa: BLE001
        return None


class _Span:
    __slots__ = ("timers", "kind", "began")

    def __init__(self, timers: Timers, kind: str):
        self.timers, self.kind = timers, kind

    def __enter__(self):
        self.began = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.timers.add(self.kind, time.perf_counter() - self.began)


SLOW_FACTOR = 5.0  # a step that takes this many times the median of the phase's recent steps ...
SLOW_MIN_S = 1.0  # ... and at least this long is a slow step: the live view says so
PACE_WINDOW = 50  # the recent steps of a phase whose median and rate are reported


class Pace:
    """The pace of one phase of equal steps (the warm start's SFT steps, its critic pretraining steps, the chunks
    of rollouts it generates): `add(seconds, step)` after each step. `fields()` is what the role's heartbeat carries
    for the live view (roles.common.RoleContext.doing): the step, the rate over the recent steps, their median, when
    the last step ended and the latest slow step (`slow`: one that took SLOW_FACTOR times the median of the
    PACE_WINDOW steps before it, and at least SLOW_MIN_S; the machine is likely shared)."""

    def __init__(self, window: int = PACE_WINDOW, clock: Callable[[], float] = time.time):
        self.durations: deque[float] = deque(maxlen=window)
        self.amounts: deque[float] = deque(maxlen=window)
        self.clock = clock
        self.step: int | None = None
        self.last_at: float | None = None
        self.slow: dict | None = None

    def median(self) -> float | None:
        return statistics.median(self.durations) if self.durations else None

    def add(self, seconds: float, step: int, amount: float = 1.0) -> dict | None:
        """Record one step (`amount`: what it did, for the rate: 1 step, or the rollouts of a chunk); returns its
        `slow` record when it was slow."""
        median = self.median()
        slow = None
        if median is not None and len(self.durations) >= 3 and seconds >= max(SLOW_FACTOR * median, SLOW_MIN_S):
            slow = self.slow = {"step": step, "took_s": round(seconds, 3), "median_s": round(median, 4),
                                "at": self.clock()}
        self.durations.append(seconds)
        self.amounts.append(amount)
        self.step, self.last_at = step, self.clock()
        return slow

    def rate(self) -> float | None:
        """Steps (amounts) per second over the recent steps, in their own time (a validation check between them is
        not in it)."""
        total = sum(self.durations)
        return sum(self.amounts) / total if total > 0 else None

    def fields(self) -> dict:
        if self.step is None:
            return {}
        median, rate = self.median(), self.rate()
        return {"step": self.step, "last_at": self.last_at,
                **({"rate": round(rate, 4)} if rate else {}),
                **({"median_s": round(median, 4)} if median is not None else {}),
                **({"slow": self.slow} if self.slow else {})}


def threads_text(count: int) -> str:
    return f"{count} thread{'' if count == 1 else 's'}"


def thread_ladder(top: int) -> list[int]:
    """The thread counts ThreadTuner moves between: `top`, its half, its quarter, ... down to 1."""
    counts = [max(1, top)]
    while counts[-1] > 1:
        counts.append(counts[-1] // 2)
    return counts


class ThreadTuner:
    """The torch thread count of a job that runs alone on its machine (the warm start: launch.solo_threads, every
    core), kept to the fastest one while the machine is shared (topology.solo_threads_slowdown).

    An OpenMP team of N threads waits at every barrier for its slowest thread: when another process takes a core,
    a descheduled thread holds the whole team up and a step can take many times as long as with fewer threads
    (the user's case: 2 threads on 2 shared cores, critic pretraining steps from 0.12 s to 2.2 s). The rule, fed
    one training step's duration at a time (`add`):

    - after `warmup` steps at a count, the median of the next `window` steps is that count's reference, and the
      first reference of a phase is followed by a trial of the next lower count of `thread_ladder` (half: the
      machine may be shared from the start);
    - when the median of the last `window` steps exceeds `slowdown` x the reference (the machine got busier), the
      next lower count is tried for a window;
    - below the top count, every `reprobe` steps the next higher count is tried (the load may have gone; each such
      trial lost doubles the interval, up to 4 x `reprobe`, so a machine that stays busy costs ever fewer trials);
    - a trial keeps the count whose median is lower, the trial's against the last window before it, and that
      median becomes the reference (a lost trial's too, so a machine that stays busy does not retrigger it).

    `new_phase()` forgets the step times (a phase's steps differ from another's) and keeps the count (the one before
    a trial the last phase ended in: that trial decided nothing). `slowdown`
    0, or a single thread: the count never changes. `apply(n)` sets it (torch.set_num_threads by default)."""

    def __init__(self, threads: int, slowdown: float, apply: Callable[[int], None] | None = None, window: int = 8,
                 warmup: int = 1, reprobe: int = 64):
        self.ladder = thread_ladder(threads)
        self.threads, self.slowdown = self.ladder[0], slowdown
        self.window, self.warmup, self.reprobe = window, warmup, reprobe
        self._apply = apply
        self.changes: list[str] = []
        self.trial = None
        self.reprobe_every = reprobe
        self.new_phase()

    def new_phase(self) -> None:
        if self.trial is not None:
            self._switch(self.trial[0])
        self.recent: deque[float] = deque(maxlen=self.window)
        self.skip, self.reference, self.trial, self.since_change = self.warmup, None, None, 0

    @property
    def active(self) -> bool:
        return bool(self.slowdown) and len(self.ladder) > 1

    def _switch(self, threads: int) -> None:
        self.threads = threads
        if self._apply is not None:
            self._apply(threads)
        else:
            import torch

            torch.set_num_threads(threads)
        self.recent.clear()
        self.skip, self.since_change = self.warmup, 0

    def _try(self, threads: int, median: float, why: str) -> str:
        self.trial = (self.threads, median)
        previous = self.threads
        self._switch(threads)
        return f"trying {threads_text(threads)} ({why}; steps at {previous}: {median:.3g} s)"

    def add(self, seconds: float) -> str | None:
        """One training step's duration at the current count; returns what changed, in words (None: nothing)."""
        if not self.active:
            return None
        if self.skip:
            self.skip -= 1
            return None
        self.recent.append(seconds)
        self.since_change += 1
        if len(self.recent) < self.window:
            return None
        median = statistics.median(self.recent)
        if self.trial is not None:
            before, before_median = self.trial
            self.trial = None
            if self.threads > before:  # a trial of more threads: lost, try again later and later
                self.reprobe_every = self.reprobe if median < before_median else \
                    min(2 * self.reprobe_every, 4 * self.reprobe)
            if median < before_median:
                self.reference = median
                change = f"kept {threads_text(self.threads)}: {median:.3g} s a step against {before_median:.3g} s " \
                         f"at {before}"
            else:
                change = f"back to {threads_text(before)}: {median:.3g} s a step at {self.threads} against " \
                         f"{before_median:.3g} s"
                self._switch(before)
                self.reference = before_median
            self.changes.append(change)
            return change
        index = self.ladder.index(self.threads)
        if self.reference is None:
            self.reference = median
            return self._try(self.ladder[index + 1], median, "the phase's first steps") \
                if index + 1 < len(self.ladder) else None
        if median > self.slowdown * self.reference and index + 1 < len(self.ladder):
            return self._try(self.ladder[index + 1], median, f"{median / self.reference:.1f}x the reference "
                                                             f"{self.reference:.3g} s")
        if index > 0 and self.since_change >= self.reprobe_every:
            return self._try(self.ladder[index - 1], median, f"{self.since_change} steps since the last change")
        return None
