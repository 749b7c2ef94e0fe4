"""What the benchmark and study scripts share: the repository's root, the stamp every record carries, a run
directory read back, the composed config, and the arguments several scripts take alike.

Every script runs from the repository root as `python -m bench.<name>` (that puts the `bench` package on the path).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "records"
VECTOR_FLAGS = ("avx", "amx")  # the CPU flags that pick torch's kernels (and so a run's rounding and speed)


# ------------------------------------------------------------------------------------------------- stamps
def git(*args: str) -> str:
    """`git <args>` in the repository, its stdout stripped ('' where git or the repository is missing)."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def stamp(**fields) -> dict:
    """Where and when a record is made: `commit` (12 hex digits of HEAD, 'unknown' outside a checkout),
    `commit_dirty` (tracked files differ from it), `date` (UTC, YYYY-MM-DD), `cpu` (the model name) and `cpu_flags`
    (its vector flags, avx* and amx*; None where /proc/cpuinfo cannot be read); then `fields`, which take precedence
    (a record whose run ended on another day gives that `date`)."""
    from prime_values.models.build import cpu_flags, cpu_model

    flags = cpu_flags()
    return {"commit": git("rev-parse", "--short=12", "HEAD") or "unknown",
            "commit_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "cpu": cpu_model(),
            "cpu_flags": sorted(f for f in flags if f.startswith(VECTOR_FLAGS)) if flags is not None else None,
            **fields}


def write_record(path: Path | str, record: dict) -> dict:
    """Write `record` as JSON to `path`, stamped (`stamp`; the record's own keys win), atomically (a reader never
    sees half a file); returns what was written."""
    path = Path(path)
    stamped = stamp(**record)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(stamped, indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return stamped


def command_line(module: str, argv: list[str] | None = None) -> str:
    """The command that runs `bench.<module>` with `argv` (default this process's arguments), for a record."""
    return " ".join(["python", "-m", f"bench.{module}", *(sys.argv[1:] if argv is None else argv)])


# ------------------------------------------------------------------------------------------ run directories
def read_json(path: Path, default=None):
    """A JSON file's contents, or `default` where it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def summary(run: Path) -> dict:
    """A run's report/summary.json ({} before the conductor wrote it)."""
    return read_json(Path(run) / "report" / "summary.json", {})


def metrics(run: Path, role: str) -> list[dict]:
    """The metrics records of one role of a run (metrics/<role>.jsonl; [] where it wrote none)."""
    from prime_values.monitor import read_metrics

    return read_metrics(Path(run) / "metrics" / f"{role}.jsonl")


def run_config(run: Path):
    """A run's saved config.yaml, completed with the defaults of keys added since the run (so they can be
    overridden)."""
    from prime_values.config import load_saved

    return load_saved(Path(run) / "config.yaml")


def run_attention(cfg, device: str = "cpu"):
    """The precision and attention a run's roles used (policy.dtype, policy.attn_implementation resolved for
    `device`), for a bench that loads the run's weights: greedy decoding of a barely fine-tuned policy flips on
    rounding, so the same weights decoded in float32 and in bf16-mixed can win different games."""
    from prime_values.models.build import configure_attention

    return configure_attention(cfg.policy, device)


def compose(overrides: list[str]):
    """The config `python -m prime_values <overrides>` would run with (Hydra's composition, no run directory)."""
    from prime_values.config import compose as compose_config

    return compose_config(overrides)


# ----------------------------------------------------------------------------------------------- arguments
def seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (the type of every `--seeds`)."""
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"seeds are comma-separated integers, not {text!r}") from None


class StopAfter:
    """`--stop-after HH:MM` (UTC): the next time the clock shows it, within 24 hours of the start, so 01:00 given
    at 23:00 is two hours on, not a time already past."""

    def __init__(self, text: str, now: datetime | None = None):
        hour, _, minute = text.partition(":")
        if not (hour.isdigit() and minute.isdigit() and len(minute) == 2 and int(hour) < 24 and int(minute) < 60):
            raise argparse.ArgumentTypeError(f"{text!r} is not HH:MM (UTC), for example 16:30")
        now = now or datetime.now(timezone.utc)
        at = now.replace(hour=int(hour), minute=int(minute), second=0, microsecond=0)
        self.text, self.at = text, at if at > now else at + timedelta(days=1)

    def __str__(self) -> str:
        return self.text

    def passed(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(timezone.utc)) >= self.at


def add_stop_after(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--stop-after", type=StopAfter, default=None,
                        help="HH:MM UTC: start no run after the next time the clock shows it (within 24 h)")


def too_late(stop_after: StopAfter | None) -> bool:
    return stop_after is not None and stop_after.passed()


def add_seeds(parser: argparse.ArgumentParser, default: str = "0", what: str = "seeds", flag: str = "--seeds"):
    parser.add_argument(flag, type=seeds, default=seeds(default), help=f"{what}, comma-separated (default {default})")


def add_run(parser: argparse.ArgumentParser) -> None:
    """The run directory and the policy version of the scripts that study a run's weights."""
    parser.add_argument("run", type=Path, help="a run directory (config.yaml, weights/)")
    parser.add_argument("--version", type=int, default=None, help="policy version (default: LATEST)")
