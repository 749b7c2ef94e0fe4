"""What the stage jobs share: where a stage lives in the run directory, its done marker, its job context, and the
conductor-side submit-and-wait of one stage job.

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
import sys
import time
import zlib
from pathlib import Path

from omegaconf import OmegaConf

from prime_values.conductor import wait_for_fork_server
from prime_values.launch import job_device, kill_tree, local, make_executor, solo_threads
from prime_values.monitor import MetricsTail, MetricsWriter
from prime_values.rundir import RunDir, write_atomic
from prime_values.supervisor import exit_cause

MODEL_STAGES = ("sft", "rl")  # stages whose output is a model the next stage starts from


class StageFailed(RuntimeError):
    pass


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
        """The conductor asks a stage job to stop through `stages/<name>/STOP`; a local job also stops when its
        conductor is gone."""
        return (self.dir / "STOP").exists() or not self.run.conductor_alive()


def _progress_line(name: str, record: dict, started: float) -> str:
    shown = {k: v for k, v in record.items() if k not in ("time", "role")}
    parts = [f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in list(shown.items())[:6]]
    return f"[{time.time() - started:6.0f}s] stage {name}: " + (", ".join(parts) or "starting")


def run_stage_job(run: RunDir, cfg, name: str, function, device: str) -> object:
    """Submit `function(run_dir)` as the stage's job (local subprocess or sbatch, as launcher says), show its
    progress, and return what it returned. A failure raises StageFailed with its cause, read at once from the
    job's exit state as the conductor reads a role's (`supervisor.exit_cause`: 'exit code 1: <the error line>',
    'killed by signal 9', 'timeout'); Ctrl-C / SIGTERM asks the job to stop, then cancels it."""
    folder = stage_dir(run, name)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "STOP").unlink(missing_ok=True)
    write_atomic(folder / "config.yaml", OmegaConf.to_yaml(cfg))
    for path in (run.jobs, run.root / "metrics"):  # not run.mkdirs(): a stage alone leaves no empty log/, weights/
        path.mkdir(parents=True, exist_ok=True)
    run.register_conductor(watch=cfg.launcher.name == "local")
    if cfg.launcher.name == "local" and local.FORK_SERVER is not None:
        wait_for_fork_server(local.FORK_SERVER)  # the stages' fork server (run_stages): ready, the job skips imports
    job = make_executor(cfg.launcher, run.jobs, name, device).submit(function, str(run.root))
    tail, started, last_print, shown = MetricsTail(run.metrics(name)), time.time(), 0.0, {}
    tail.read()  # only this attempt's lines
    tail.last = {}
    try:
        while not (end := exit_cause(job))[0]:
            tail.read()
            if time.time() - last_print >= 10:
                print(_progress_line(name, tail.last, started), flush=True)
                last_print, shown = time.time(), dict(tail.last)
            time.sleep(cfg.launcher.poll_s)
    except KeyboardInterrupt:
        write_atomic(folder / "STOP", "interrupted\n")
        deadline = time.time() + cfg.launcher.stop_grace_s
        while not job.done() and time.time() < deadline:
            time.sleep(0.2)
        if not job.done():
            job.cancel()
            if cfg.launcher.name == "local":
                time.sleep(2)
                if not job.done():
                    kill_tree(job)
        raise StageFailed(f"stage {name} interrupted by the user") from None
    cause = end[1]  # read from the job's exit state, never submitit's exception(): a killed job waits 15 s there
    if cause is not None:
        raise StageFailed(f"stage {name} failed: {cause} (full log: {job.paths.stderr})")
    tail.read()
    if tail.last and tail.last != shown:
        print(_progress_line(name, tail.last, started), flush=True)
    result = job.result()
    write_atomic(run.state(name) / "done", json.dumps({"stage": name}))  # `prime_values.tools.status` shows COMPLETED
    return result


def fail(message: str) -> None:
    print(f"prime_values: {message}", file=sys.stderr, flush=True)
    sys.exit(1)
