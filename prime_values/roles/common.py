"""What every role shares: the run directory, the resolved config, metrics, heartbeat, the stop check, and
background threads whose failure ends the role.

The heartbeat (`state/<role>/heartbeat`) is written from the role's loop (`stopping()`, at most every
HEARTBEAT_EVERY_S): its first one says the role came up. A role that fails before it (config, imports, loading)
failed at start-up, which the supervisor treats apart (prime_values.supervisor); one whose heartbeat stops is
taken for hung after launcher.hang_timeout_s. Its first line is the time it was written; a second line, once the
role said what it is doing (`doing`), is that activity as JSON, which the live view shows."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import zlib

from prime_values.config import load_saved
from prime_values.launch import job_device, role_threads
from prime_values.launch.cores import core_share
from prime_values.log import LogReader, SegmentWriter
from prime_values.monitor import MetricsWriter
from prime_values.rundir import RunDir, write_atomic

HEARTBEAT_EVERY_S = 2.0
ACTIVITY_EVERY_S = 0.5  # a changed activity (`doing`) is written at most this often


class BackgroundThreadFailed(RuntimeError):
    """A role's background thread (`RoleContext.start_thread`) raised: the role ends with this, caused by it."""


class RoleContext:
    def __init__(self, run_dir: str | os.PathLike, name: str, device_key: str | None = None):
        self.run = RunDir(run_dir)
        self.cfg = load_saved(self.run.config)  # a run saved by older code: keys added since get defaults
        self.name = name
        self.metrics = MetricsWriter(self.run.metrics(name), name)
        self.state = self.run.state(name)
        self.device = job_device(self.cfg.topology[device_key]) if device_key else "cpu"
        self._last_beat = 0.0
        self._activity: dict = {}  # what the role is doing (`doing`), written with its heartbeat
        self._activity_written = True
        self._thread_errors: list[tuple[str, BaseException]] = []
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
        self.log = logging.getLogger(f"prime_values.{name}")
        import torch

        threads = role_threads(self.cfg, role=name)
        torch.set_num_threads(threads)
        self.cores = core_share(self.cfg, name, self.device, threads, self.run.state("cores"))  # lend_idle_cores
        self.seed_root = self.cfg.seed  # what this role's seeds derive from (the warm start: its own seed)
        torch.manual_seed(self.seed())
        self.attention = None  # a role that builds models: its attention kernel and weight dtype, logged once,
        if device_key:  # passed to every model it builds or loads
            from prime_values.models.build import configure_attention

            self.attention = configure_attention(self.cfg.policy, self.device, self.log)
        if os.environ.get("PRIME_VALUES_FAULT") == name:  # a test hook: make this role crash on start
            raise RuntimeError(f"injected fault in role {name} (PRIME_VALUES_FAULT={name})")

    def seed(self, *salt: int) -> int:
        """A seed of this role's own, derived from `seed_root` (every worker gets a different stream)."""
        return zlib.crc32(repr((self.seed_root, self.name, salt)).encode()) % (2**31)

    def heartbeat(self) -> None:
        now = time.time()
        due = HEARTBEAT_EVERY_S if self._activity_written else ACTIVITY_EVERY_S  # a new activity goes out sooner
        if now - self._last_beat >= due:
            activity = f"{json.dumps(self._activity)}\n" if self._activity else ""
            write_atomic(self.run.heartbeat_file(self.name), f"{now}\n{activity}")
            self._last_beat, self._activity_written = now, True

    def doing(self, what: str, flush: bool = False, **progress) -> None:
        """Say what the role is doing now ('waiting for batch 3', 'critic pretraining' with `progress` such as
        step=12, of=150 and monitor.Pace.fields()), for the live view. It goes out with the heartbeat: when `what`
        changed, with the next `stopping()` ACTIVITY_EVERY_S after the last beat, else with the next beat; `flush`:
        at once (what comes next polls nothing for a while: loading, publishing, an evaluation). Before the role
        came up (its first heartbeat, from `stopping()`) nothing is written: the view shows it starting."""
        changed = what != self._activity.get("doing")
        since = time.time() if changed else self._activity.get("since")
        self._activity = {"doing": what, "since": since, **progress}
        self._activity_written = not changed and self._activity_written
        if self._last_beat and (flush or changed):
            if flush:
                self._last_beat = 0.0  # due now (heartbeat() sets it again at once: the role stays up)
            self.heartbeat()

    def stopping(self) -> bool:
        """Polled by every loop: the conductor asks roles to stop by writing the control file. A role of a
        local run also stops when its conductor process is gone (killed), so no role outlives its run. Raises
        BackgroundThreadFailed once a thread of `start_thread` has failed (before the heartbeat: a role whose
        thread died does not look alive)."""
        self.check_threads()
        self.heartbeat()
        return self.run.stop_requested() or not self.run.conductor_alive()

    def wait(self, seconds: float = 0.02) -> None:
        self.check_threads()
        time.sleep(seconds)

    def start_thread(self, target, *args) -> threading.Thread:
        """Run `target(*args)` in a daemon thread of this role. An exception it raises is kept, and the role's
        next `stopping()` or `wait()` raises BackgroundThreadFailed from it: the role ends (and is restarted)
        with the thread's error as its cause, instead of running on without the thread."""
        def run() -> None:
            try:
                target(*args)
            except BaseException as error:  # noqa: BLE001 - handed to the role's own thread
                self._thread_errors.append((threading.current_thread().name, error))

        thread = threading.Thread(target=run, name=getattr(target, "__name__", "background"), daemon=True)
        thread.start()
        return thread

    def check_threads(self) -> None:
        if self._thread_errors:
            name, error = self._thread_errors[0]
            raise BackgroundThreadFailed(f"background thread {name!r} of role {self.name} failed: "
                                         f"{type(error).__name__}: {error}") from error

    def writer(self, stream: str, shard: str):
        """The single writer of one shard of a log stream."""
        return SegmentWriter(self.run.stream(stream), shard, stream, durable_rename=self.cfg.log.durable_rename)

    def reader(self, stream: str, consumer: str, shards=None):
        """A cursor-keeping reader of every shard of a log stream (or of those `shards(name)` accepts)."""
        return LogReader(self.run.stream(stream), consumer, self.run.cursors, stream, shards=shards)

    def mark_done(self, **summary) -> None:
        write_atomic(self.run.done_file(self.name), json.dumps(summary))

