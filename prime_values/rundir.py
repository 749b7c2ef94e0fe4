"""Where everything lives in a run directory (docs/design.md §2). The run directory is the bus between roles."""

from __future__ import annotations

import json
import os
import time
from enum import Enum
from pathlib import Path

import psutil

from prime_values.log import fsutil


def process_alive(pid: int, create_time: float | None = None) -> bool:
    """Whether process `pid` runs, and, given the `create_time` it was recorded with (psutil's), is still the same
    process: a pid that was reaped and reused by another process counts as gone."""
    try:
        process = psutil.Process(pid)
        return create_time is None or abs(process.create_time() - create_time) < 0.01
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:  # it exists, owned by someone else
        return create_time is None

class StopReason(Enum):
    """Why `control/STOP` was written. Its file holds the value (`{"reason": "user", "detail": ..., "at": ...}`); a
    file this enum does not know (an older run directory's free text, a test's) reads as OTHER."""

    USER = "user"  # `python -m prime_values.tools.status <run> --stop`
    USER_INTERRUPT = "user_interrupt"  # Ctrl-C (or SIGTERM) on the pipeline submitter of launcher=slurm
    STOPPED = "stopped"  # the conductor stops the roles after a stop was asked for
    FINISHED = "finished"  # the conductor stops the roles when the policy trainer reached its last step
    FAILED = "failed"  # the conductor stops the roles when one failed for good
    INTERRUPTED = "interrupted"  # the conductor got Ctrl-C or SIGTERM (scancel, the end of a time limit)
    OTHER = "other"  # any other text

    @property
    def asked_by_user(self) -> bool:
        """Whether the user asked for the stop (status --stop, Ctrl-C on the submitter), or the conductor relays
        such a stop: a fresh allocation of the run stops too instead of resuming it."""
        return self in (StopReason.USER, StopReason.USER_INTERRUPT, StopReason.STOPPED)


DEFAULT_STOP_DETAIL = {StopReason.USER: "stop requested by the user (prime_values.tools.status --stop)",
                       StopReason.USER_INTERRUPT: "interrupted by the user"}


class RunDir:
    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    # the log: one directory per stream, one sub-directory per shard
    @property
    def log(self) -> Path:
        return self.root / "log"

    def stream(self, name: str) -> Path:
        assert name in ("rollouts", "values", "targets", "batches"), f"unknown stream {name!r}"
        return self.log / name

    @property
    def cursors(self) -> Path:
        return self.log / "cursors"

    def weights(self, model: str) -> Path:
        assert model in ("policy", "critic"), f"unknown model {model!r}"
        return self.root / "weights" / model

    def state(self, role: str) -> Path:
        path = self.root / "state" / role
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def restarts_file(self) -> Path:
        """{role job: restarts so far}, written by the conductor when it schedules a restart."""
        return self.root / "control" / "restarts.json"

    def heartbeat_file(self, role: str) -> Path:
        return self.root / "state" / role / "heartbeat"

    def done_file(self, role: str) -> Path:
        """Written by a role whose work is complete (warm start, policy trainer): it is not run again."""
        return self.root / "state" / role / "done"

    def metrics(self, role: str) -> Path:
        return self.root / "metrics" / f"{role}.jsonl"

    @property
    def jobs(self) -> Path:
        return self.root / "jobs"

    @property
    def report(self) -> Path:
        return self.root / "report"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    # stopping: the conductor writes the control file; every role polls it
    @property
    def stop_file(self) -> Path:
        return self.root / "control" / "STOP"

    def request_stop(self, reason: StopReason | str, detail: str | None = None) -> None:
        """Write the stop file; a text `reason` (a tool's own words) is kept as the detail of StopReason.OTHER."""
        if not isinstance(reason, StopReason):
            reason, detail = StopReason.OTHER, reason if detail is None else detail
        detail = DEFAULT_STOP_DETAIL.get(reason, reason.value) if detail is None else detail
        self.stop_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.stop_file, json.dumps({"reason": reason.value, "detail": detail, "at": time.time()}))

    def stop_requested(self) -> bool:
        return self.stop_file.exists()

    def stop_reason(self) -> StopReason | None:
        """The reason in the stop file, None when there is none; OTHER when it is unreadable or not one of
        StopReason's values."""
        if not self.stop_requested():
            return None
        try:
            return StopReason(json.loads(self.stop_file.read_text()).get("reason"))
        except (OSError, ValueError, AttributeError):
            return StopReason.OTHER

    @property
    def warmup_done_file(self) -> Path:
        """Written by the orchestrator when the critic warm-up gate opens (critic.warmup)."""
        return self.root / "control" / "warmup_done"

    @property
    def conductor_file(self) -> Path:
        return self.root / "control" / "conductor.json"

    def register_conductor(self, watch: bool) -> None:
        """Record the conductor's pid and start time; with `watch`, roles stop if that process disappears (a reused
        pid does not keep them alive: the start time must match)."""
        self.conductor_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.conductor_file, json.dumps({"pid": os.getpid(), "host": os.uname().nodename,
                                                      "created": psutil.Process().create_time(), "watch": watch}))

    def conductor_alive(self) -> bool:
        now = time.time()
        if now - getattr(self, "_conductor_checked", 0.0) < 1.0:  # at most one check a second
            return getattr(self, "_conductor_ok", True)
        self._conductor_checked, self._conductor_ok = now, True
        try:
            info = json.loads(self.conductor_file.read_text())
        except (OSError, ValueError):
            return True  # no conductor recorded (a role started by hand or by a test)
        if info.get("watch") and info.get("host") == os.uname().nodename:
            self._conductor_ok = process_alive(info["pid"], info.get("created"))  # older files: the pid alone
        return self._conductor_ok

    def mkdirs(self) -> None:
        for path in (self.log, self.cursors, self.root / "weights", self.root / "state", self.root / "metrics",
                     self.jobs, self.report):
            path.mkdir(parents=True, exist_ok=True)


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` with `text` so a reader sees the old or the new content, never a torn one."""
    fsutil.write_atomic(path, text.encode())
