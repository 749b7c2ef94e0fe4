"""Weights & Biases: the conductor forwards every role's metrics to one W&B run per experiment.

Roles never talk to W&B (nor to the conductor): they append to `metrics/<role>.jsonl`. The conductor starts a
`WandbForwarder` that tails every one of those files (`monitor.MetricsTail`, also the roles that appear later)
and logs each record to the run with its keys prefixed by the role (`policy_trainer/loss`,
`value_trainer/value_loss`, `inference0/tokens_per_s`).

- x-axis: every record carries `policy_step`: the record's own policy step where it has one (`step` of the
  policy trainer and the orchestrator, `for_step` of inference), else the last step the policy trainer
  reported (evaluator, value trainer). `define_metric` makes `policy_step` the x-axis of every role's charts;
  W&B's own `step` is not used because roles run ahead of each other and W&B drops a log whose step goes back.
  Warm-start records (SFT and critic pretraining) come before policy step 1: they get `policy_step` 0 and
  carry their own counters (`warm_start/sft_step`, `warm_start/critic_pretrain_step`) to plot against.
- config: the composed, resolved config is the run's config; `group` is `wandb.group`, or in a Hydra
  multirun the sweep directory's name, so the points of a sweep group together; `name` is `wandb.name`, or
  the values the sweep varies at this point (`advantage=gae,seed=0`), or the run directory's name.
- identity: the W&B run id is derived from the run directory, and what was forwarded is remembered in
  `state/wandb/offsets.json`, so a rerun in the same directory resumes the same W&B run without repeating.
- modes (`wandb.mode`): `disabled` (default, nothing imported), `offline` (files under `<run>/wandb/`;
  upload later with `wandb sync <run>/wandb/offline-run-*`), `online` (needs an API key: WANDB_API_KEY, or a
  netrc entry that `wandb login` writes; without one it falls back to offline with one log line).

wandb is an optional extra: `pip install 'prime_values[wandb]'`. `prime_values.config.check_wandb(cfg)` fails before
launch when a mode needs it and it is not installed. A W&B failure never stops a run: it is reported once and
forwarding stops.
"""

from __future__ import annotations

import hashlib
import json
import logging
import netrc
import os
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

from prime_values.monitor import MetricsTail
from prime_values.rundir import RunDir, write_atomic

log = logging.getLogger(__name__)

POLICY_STEP_KEYS = {"policy_trainer": "step", "orchestrator": "step", "inference": "for_step"}
BEFORE_RL = ("warm_start",)  # roles that run before policy step 1: policy_step 0


def has_api_key() -> bool:
    """An API key W&B would find: WANDB_API_KEY, an identity token file, or a netrc entry for the W&B host."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or "api.wandb.ai"
    paths = [os.environ["NETRC"]] if os.environ.get("NETRC") else \
        [os.path.expanduser("~/.netrc"), os.path.expanduser("~/_netrc")]
    for path in paths:
        try:
            entry = netrc.netrc(path).authenticators(host)
        except (OSError, netrc.NetrcParseError):
            continue
        if entry and entry[2]:
            return True
    return False


def resolve_mode(mode: str) -> str:
    """The mode to run in: `online` without an API key becomes `offline`, with one log line."""
    if mode == "online" and not has_api_key():
        print("prime_values: wandb.mode=online but no W&B API key (WANDB_API_KEY or `wandb login`); logging "
              "offline instead (upload later with `wandb sync <run>/wandb/offline-run-*`)", flush=True)
        return "offline"
    return mode


def hydra_names() -> tuple[str | None, str | None]:
    """(group, name) of this job from Hydra: in a multirun, the sweep directory's name and the point's
    overrides; (None, None) outside Hydra or in a single run."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except Exception:  # noqa: BLE001 - outside a Hydra run there is no sweep
        return None, None
    if hc.mode != RunMode.MULTIRUN:
        return None, None
    name = sweep_point_name(sys.argv[1:], list(hc.overrides.task)) or hc.job.override_dirname or None
    return sweep_group(hc.sweep.dir), name


def sweep_point_name(argv: list[str], job_overrides: list[str]) -> str:
    """The overrides of one sweep point that the sweep varies: `advantage=gae,seed=1` for the point of
    `... advantage=gae,tether seed=0,1` (the command line's sweep keys, the job's values), '' if none."""
    try:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        args = [a for a in argv if "=" in a and not a.startswith("-") and not a.lstrip("+~").startswith("hydra")]
        swept = {o.get_key_element().lstrip("+~") for o in OverridesParser.create().parse_overrides(args)
                 if o.is_sweep_override()}
    except Exception:  # noqa: BLE001 - an override Hydra cannot parse names no swept key
        return ""
    return ",".join(o.lstrip("+~") for o in job_overrides if o.split("=", 1)[0].lstrip("+~") in swept)


def sweep_group(sweep_dir) -> str:
    """The W&B group of a sweep directory: its name (`sweeps/critic` -> `critic`), with the date for Hydra's
    default `multirun/<date>/<time>` (-> `2026-11-30/12-28-45`)."""
    sweep = Path(str(sweep_dir))
    dated = sweep.parent.name.count("-") == 2 and sweep.parent.name.replace("-", "").isdigit()
    return "/".join(sweep.parts[-2:]) if dated else sweep.name


def run_id(run: RunDir) -> str:
    """A W&B run id fixed by the run directory: a rerun in the same directory resumes the same W&B run."""
    root = str(run.root.resolve())
    return f"{run.root.resolve().name[:40]}-{hashlib.sha1(root.encode()).hexdigest()[:10]}".replace("/", "_") \
        .replace(" ", "_").replace(":", "_")


def _number(value):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, (int, float)):
        return value
    return None  # strings, lists, nulls: not a chart


def record_to_row(role: str, record: dict, last_policy_step: int | None) -> dict:
    """One metrics record -> the dict to log: keys prefixed with the role, `policy_step` attached."""
    row = {}
    for key, value in record.items():
        if key in ("time", "role"):
            continue
        value = _number(value)
        if value is not None:
            row[f"{role}/{key}"] = value
    family = role.rstrip("0123456789")  # inference0, inference1, ... share the rule of inference
    if family in BEFORE_RL:
        row["policy_step"] = 0
        return row
    key = POLICY_STEP_KEYS.get(family)
    step = record.get(key) if key else None
    step = step if isinstance(step, int) and not isinstance(step, bool) else last_policy_step
    if step is not None:
        row["policy_step"] = step
    return row


class WandbForwarder:
    """Tails `metrics/*.jsonl` of a run and logs every record to one W&B run (see the module doc).

    `poll()` forwards what is new (call it from a loop), or `start()` a background thread that polls every
    `wandb.poll_s`; `close()` forwards the rest and finishes the W&B run. With mode `disabled` every method
    does nothing."""

    def __init__(self, run: RunDir | str | os.PathLike, cfg, group: str | None = None, name: str | None = None):
        self.run = run if isinstance(run, RunDir) else RunDir(run)
        self.cfg = cfg
        self.wb = None
        self.tails: dict[str, MetricsTail] = {}
        self.last_policy_step: int | None = None
        self.forwarded = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        wcfg = cfg.wandb
        self.mode = resolve_mode(wcfg.mode) if wcfg.mode != "disabled" else "disabled"
        if self.mode == "disabled":
            return
        hydra_group, hydra_name = hydra_names()
        self.offsets_path = self.run.state("wandb") / "offsets.json"
        try:
            saved = json.loads(self.offsets_path.read_text())
        except (OSError, ValueError):
            saved = {}
        for role, offset in saved.get("offsets", {}).items():
            self._tail(role)._offset = int(offset)
        self.last_policy_step = saved.get("last_policy_step")
        try:
            import wandb
            from omegaconf import OmegaConf

            config = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
            self.wb = wandb.init(
                project=wcfg.project, entity=wcfg.entity, mode=self.mode, dir=str(self.run.root),
                id=run_id(self.run), resume="allow", config=config, tags=list(wcfg.tags) or None,
                group=wcfg.group or group or hydra_group,
                name=wcfg.name or name or hydra_name or self.run.root.resolve().name,
                settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
            )
            self.wb.define_metric("policy_step")
            self.wb.define_metric("*", step_metric="policy_step")
        except Exception as error:  # noqa: BLE001 - W&B failing in any way turns the sink off, never the run
            self._give_up(error)

    def _give_up(self, error: Exception) -> None:
        print(f"prime_values: W&B logging stopped ({type(error).__name__}: {' '.join(str(error).split())[:300]}); "
              f"the metrics stay in {self.run.root / 'metrics'}", flush=True)
        self.wb = None

    def _tail(self, role: str) -> MetricsTail:
        if role not in self.tails:
            self.tails[role] = MetricsTail(self.run.metrics(role))
        return self.tails[role]

    @property
    def enabled(self) -> bool:
        return self.wb is not None

    def poll(self) -> int:
        """Forward the records appended since the last call, in time order; returns how many."""
        if self.wb is None:
            return 0
        with self._lock:
            try:
                for path in sorted((self.run.root / "metrics").glob("*.jsonl")):
                    self._tail(path.stem)
                records = [(rec.get("time", 0.0), role, rec) for role, tail in self.tails.items()
                           for rec in tail.read()]
                records.sort(key=lambda item: item[0])
                for _, role, record in records:
                    if role == "policy_trainer" and isinstance(record.get("step"), int):
                        self.last_policy_step = record["step"]
                    row = record_to_row(role, record, self.last_policy_step)
                    if row:
                        self.wb.log(row)
                self.forwarded += len(records)
                if records:
                    write_atomic(self.offsets_path, json.dumps({
                        "offsets": {role: tail._offset for role, tail in self.tails.items()},
                        "last_policy_step": self.last_policy_step}))
                return len(records)
            except Exception as error:  # noqa: BLE001 - W&B failing in any way turns the sink off, never the run
                self._give_up(error)
                return 0

    def _loop(self) -> None:
        while not self._stop.wait(self.cfg.wandb.poll_s):
            self.poll()

    def start(self) -> "WandbForwarder":
        """Poll in a background (daemon) thread every `wandb.poll_s` until `close()`."""
        if self.wb is not None and self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="wandb-forwarder", daemon=True)
            self._thread.start()
        return self

    def close(self, summary: dict | None = None, exit_code: int = 0) -> None:
        """Forward what is left and finish the W&B run (call after the roles have stopped). `summary`: the run's
        final figures (`tools.summary.summarise`); its numbers become the W&B run summary, under `summary/`."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
            self._thread = None
        if self.wb is None:
            return
        self.poll()
        try:
            import wandb

            for key, value in (summary or {}).items():
                if _number(value) is not None and key != "written_at":
                    self.wb.summary[f"summary/{key}"] = _number(value)
            if summary and isinstance(summary.get("status"), str):
                self.wb.summary["summary/status"] = summary["status"]
            self.wb.finish(exit_code=exit_code)
            wandb.teardown()  # wait until W&B's service process has written everything (it would outlive finish())
        except Exception as error:  # noqa: BLE001 - W&B failing in any way turns the sink off, never the run
            self._give_up(error)
        self.wb = None
        if self.mode == "offline":
            print(f"prime_values: W&B run (offline) in {self.run.root / 'wandb'}; upload with "
                  f"wandb sync {self.run.root / 'wandb'}/offline-run-*", flush=True)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *exc):
        self.close(exit_code=0 if exc_type is None else 1)


def start_forwarder(run: RunDir, cfg) -> WandbForwarder:
    """The conductor's one call: a started forwarder (a no-op with wandb.mode=disabled)."""
    return WandbForwarder(run, cfg).start()
