"""Metrics: one JSON object per line in `metrics/<role>.jsonl`, readable while the run goes."""

from __future__ import annotations

import json
import math
import resource
import sys
import time
from pathlib import Path


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
