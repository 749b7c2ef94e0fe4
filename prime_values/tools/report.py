"""`python -m prime_values.tools.report <run_dir | sweep_dir>`: the report of a run directory (report/summary.json,
summary.md and the plots), or the one-row-per-point summary of a sweep (multirun) directory (tools/sweep.py).

The figures are prime_values.tools.summary's; this module adds summary.md with the plots, and the command line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from prime_values.rundir import RunDir, write_atomic
from prime_values.tools.plots import plot_run
from prime_values.tools.summary import format_summary, summarise
from prime_values.tools.sweep import write_sweep_summary

USAGE = "usage: python -m prime_values.tools.report <run_dir | sweep_dir>"


def write_report(run: RunDir | str | Path, summary: dict, plots: bool = True) -> Path:
    """report/summary.md with the figures and, with `plots` (log.plots), the plots (prime_values.tools.plots); returns
    its path."""
    run = run if isinstance(run, RunDir) else RunDir(run)
    images = [f"![{p.stem}]({p.name})" for p in plot_run(run)] if plots else \
        [f"No plots (log.plots=false): `python -m prime_values.tools.report {run.root}` draws them."]
    text = "\n".join(["# Run report", "", "```", format_summary(summary), "```", ""] + images) + "\n"
    path = run.report / "summary.md"
    write_atomic(path, text)
    return path


def main(argv: list[str]) -> int:
    """A run directory (it holds config.yaml): its summary and report, keeping the status an earlier summary
    recorded; any other directory: the sweep summary of the run directories in it."""
    if any(a in ("-h", "--help") for a in argv):
        print(f"{USAGE}\n\nWrites <run>/report/ (summary and plots) for a run directory, or the one-row-per-point "
              "summary of a sweep (multirun) directory.")
        return 0
    if len(argv) != 1:
        print(USAGE, file=sys.stderr)
        return 1
    run = RunDir(argv[0])
    if not (run.root / "config.yaml").exists():
        written = write_sweep_summary(run.root)  # a sweep (multirun) directory: one row per point
        if not written:
            print(f"{USAGE}  ({argv[0]} holds no config.yaml and no run directories)", file=sys.stderr)
            return 1
        print(written.read_text() + f"\nsweep summary        {written}")
        return 0
    earlier = run.report / "summary.json"
    summary = summarise(run, status=json.loads(earlier.read_text())["status"] if earlier.exists() else "finished")
    print(format_summary(summary))
    print(f"report               {write_report(run, summary)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
