"""What the stage jobs share: where a stage lives in the run directory, its done marker, its job context, and the
conductor-side submit-and-wait of one stage job (submitted, watched and stopped by the supervisor, as a role is).

A stage lives in `<run>/stages/<name>/`: `config.yaml` (the resolved config its job reads), its outputs, and
`done.json`, written atomically and last, when the stage finished. `rl` keeps its outputs where a run has always
kept them (log/, weights/, metrics/, report/ at the run root) so every tool that reads a run directory still
works; its stage directory holds only its marker.
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import time
import zlib
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from prime_values.launch import job_device, solo_threads
from prime_values.launch.local import LocalLaunch
from prime_values.monitor import MetricsTail, MetricsWriter
from prime_values.rundir import RunDir, StopReason, write_atomic
from prime_values.supervisor import StopRequested, Supervisor, exit_cause

MODEL_STAGES = ("sft", "rl")  # stages whose output is a model the next stage starts from

if TYPE_CHECKING:
    from prime_values.config import Config


class StageFailed(RuntimeError):
    pass


class StageInterrupted(StageFailed):
    """Ctrl-C or SIGTERM while a stage job ran: the job was asked to stop, then cancelled."""


class StageStopped(Exception):
    """A stop was asked for through the run's stop file: inside a stage job, the job ends without a result; in the
    conductor, the stage ended that way."""


def stage_dir(run: RunDir, name: str) -> Path:
    return run.root / "stages" / name


def done_file(run: RunDir, name: str) -> Path:
    return stage_dir(run, name) / "done.json"


def read_done(run: RunDir, name: str) -> dict | None:
    try:
        return json.loads(done_file(run, name).read_text())
    except (OSError, ValueError):
        return None


def mark_done(run: RunDir, name: str, record: dict) -> dict:
    """Write the stage's done marker (atomically; the last thing a stage writes)."""
    record = {"stage": name, "finished_at": time.time(), **record}
    done_file(run, name).parent.mkdir(parents=True, exist_ok=True)
    write_atomic(done_file(run, name), json.dumps(record, indent=2))
    return record


class StageContext:
    """Inside a stage job: the run, the stage's resolved config, metrics, device, seeds and the stop check."""

    def __init__(self, run_dir: str | os.PathLike, name: str, device_key: str):
        self.run, self.name = RunDir(run_dir), name
        self.dir = stage_dir(self.run, name)
        self.cfg = OmegaConf.load(self.dir / "config.yaml")
        self.metrics = MetricsWriter(self.run.metrics(name), name)
        self.device = job_device(self.cfg.topology[device_key])
        logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {name} %(levelname)s %(message)s")
        self.log = logging.getLogger(f"prime_values.stages.{name}")
        import torch

        torch.set_num_threads(solo_threads())  # a stage runs alone on its machine
        torch.manual_seed(self.seed())
        from prime_values.models.build import configure_attention

        # attention kernel and weight dtype, logged; passed to every model the stage builds or loads
        self.attention = configure_attention(self.cfg.policy, self.device, self.log)
        # A stage job is a fresh interpreter holding torch, transformers, datasets and sympy: its exit ran a final
        # garbage collection over all of them, ~2 s of CPU after the result was written, that the conductor waited
        # out (it waits for the process). Frozen objects are left out of that collection; atexit handlers (the
        # logging flush, temporary directories) still run. Registered last, so it runs first at exit.
        atexit.register(gc.freeze)

    def seed(self, *salt: int) -> int:
        return zlib.crc32(repr((self.cfg.seed, self.name, salt)).encode()) % (2**31)

    def stopping(self) -> bool:
        """The conductor asks a stage job to stop through the run's stop file (`control/STOP`, as it asks the
        roles); a local job also stops when its conductor is gone."""
        return self.run.stop_requested() or not self.run.conductor_alive()


def _progress_line(name: str, record: dict, started: float) -> str:
    shown = {k: v for k, v in record.items() if k not in ("time", "role")}
    parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(shown.items())[:6]]
    return f"[{time.time() - started:6.0f}s] stage {name}: " + (", ".join(parts) or "starting")


def run_stage_job(run: RunDir, cfg: Config, name: str, function, device: str,
                  launch: LocalLaunch | None = None) -> object:
    """Submit `function(run_dir)` as the stage's job (local subprocess or sbatch, as launcher says; forked from
    `launch`'s fork server when it has one), show its progress, and return what it returned. A failure raises
    StageFailed with its cause, read at once from the job's exit state as the conductor reads a role's
    (`supervisor.exit_cause`: 'exit code 1: <the error line>', 'killed by signal 9', 'timeout'). The supervisor
    submits the job and stops it as it stops roles (`Supervisor.stop`: the stop file, a grace period, cancel, kill):
    on Ctrl-C / SIGTERM, raising StageInterrupted, and on a stop asked for through the run's stop file
    (`prime_values.tools.status --stop`), raising StageStopped. A stage job is never restarted."""
    folder = stage_dir(run, name)
    folder.mkdir(parents=True, exist_ok=True)
    run.stop_file.unlink(missing_ok=True)  # one left from before (the rl stage's end writes one) is not for this job
    write_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    for path in (run.jobs, run.root / "metrics"):  # not run.mkdirs(): a stage alone leaves no empty log/, weights/
        path.mkdir(parents=True, exist_ok=True)
    run.register_conductor(watch=cfg.launcher.name == "local")
    if cfg.launcher.name == "local" and launch is not None:
        launch.wait_ready()  # the stages' fork server (run_stages): ready, the job skips imports
    fleet = Supervisor(run, cfg, launch)
    job = fleet.submit(name, name, device, function=function).job
    tail, started, last_print, shown = MetricsTail(run.metrics(name)), time.time(), 0.0, {}
    tail.read()  # only this attempt's lines
    tail.last = {}
    try:
        while not (end := exit_cause(job))[0]:
            if run.stop_requested():
                raise StopRequested(f"stop requested through {run.stop_file}")
            tail.read()
            if time.time() - last_print >= 10:
                print(_progress_line(name, tail.last, started), flush=True)
                last_print, shown = time.time(), dict(tail.last)
            time.sleep(cfg.launcher.poll_s)
    except KeyboardInterrupt:
        fleet.stop(StopReason.INTERRUPTED, cfg.launcher.stop_grace_s)
        raise StageInterrupted(f"stage {name} interrupted by the user") from None
    except StopRequested as stop:
        fleet.stop(StopReason.STOPPED, cfg.launcher.stop_grace_s)
        raise StageStopped(f"stage {name} stopped: {stop}") from None
    cause = end[1]  # read from the job's exit state, never submitit's exception(): a killed job waits 15 s there
    if cause is not None and run.stop_requested():  # it ended on the stop asked for since the last look
        fleet.stop(StopReason.STOPPED, cfg.launcher.stop_grace_s)
        raise StageStopped(f"stage {name} stopped: stop requested through {run.stop_file}")
    if cause is not None:
        raise StageFailed(f"stage {name} failed: {cause} (full log: {job.paths.stderr})")
    tail.read()
    if tail.last and tail.last != shown:
        print(_progress_line(name, tail.last, started), flush=True)
    result = job.result()
    write_atomic(run.state(name) / "done", json.dumps({"stage": name}))  # `prime_values.tools.status` shows COMPLETED
    return result
