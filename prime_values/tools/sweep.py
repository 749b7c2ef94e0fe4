"""The summary of a sweep (a Hydra multirun directory): one row per point, and the points' curves overlaid.

    python -m prime_values.tools.report <sweep_dir>      # also rewritten by every point of a multirun as it ends

A point is any subdirectory holding `config.yaml` (its run directory). Its row: the overrides that made it
(`.hydra/overrides.yaml`), its status and final figures (`report/summary.json`, or computed from its metrics
while it runs), and its run directory. Writes `<sweep_dir>/sweep_summary.md`, `sweep_summary.json` and
`sweep_curves.png` (held-out accuracy and critic explained variance vs policy step, one line per point).
"""

from __future__ import annotations

import json
from pathlib import Path

from prime_values.monitor import read_metrics
from prime_values.rundir import write_atomic
from prime_values.tools.summary import summarise

FIGURES = (("final_accuracy", "final acc"), ("first_rl_step_accuracy", "first acc"),
           ("final_explained_variance", "EV"), ("policy_steps", "steps"), ("wall_s", "wall s"))


def points(sweep_dir: str | Path) -> list[Path]:
    sweep_dir = Path(sweep_dir)
    return sorted((p for p in sweep_dir.iterdir() if (p / "config.yaml").is_file()),
                  key=lambda p: (len(p.name), p.name)) if sweep_dir.is_dir() else []


def _overrides(point: Path) -> str:
    path = point / ".hydra" / "overrides.yaml"
    if not path.exists():
        return ""
    lines = [line[2:].strip() for line in path.read_text().splitlines() if line.startswith("- ")]
    return " ".join(x for x in lines if not x.startswith("hydra."))


def row(point: Path) -> dict:
    summary_file = point / "report" / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else \
        summarise(point, status="running or stopped")
    return {"point": point.name, "overrides": _overrides(point), "status": summary.get("status"),
            **{key: summary.get(key) for key, _ in FIGURES}, "run_dir": str(point)}


def _varying(rows: list[dict]) -> list[str]:
    """The overrides that differ between points (what the sweep varies), for short row labels."""
    tokens = [set(r["overrides"].split()) for r in rows]
    common = set.intersection(*tokens) if tokens else set()
    return [" ".join(x for x in r["overrides"].split() if x not in common) or r["point"] for r in rows]


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def write_sweep_summary(sweep_dir: str | Path) -> Path | None:
    """Write the sweep summary files; returns the Markdown path (None when the directory holds no point)."""
    sweep_dir = Path(sweep_dir)
    found = points(sweep_dir)
    if not found:
        return None
    rows = [row(p) for p in found]
    labels = _varying(rows)
    head = ["point", "varies", "status", *[name for _, name in FIGURES], "run dir"]
    lines = ["# Sweep summary", "", f"`{sweep_dir}`: {len(rows)} points", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r, label in zip(rows, labels):
        cells = [r["point"], f"`{label}`", r["status"] or "-", *[_cell(r[key]) for key, _ in FIGURES],
                 f"`{r['run_dir']}`"]
        lines.append("| " + " | ".join(cells) + " |")
    plot = _plot(found, labels, sweep_dir / "sweep_curves.png")
    if plot:
        lines += ["", f"![curves]({plot.name})"]
    write_atomic(sweep_dir / "sweep_summary.json", json.dumps(rows, indent=1) + "\n")
    path = sweep_dir / "sweep_summary.md"
    write_atomic(path, "\n".join(lines) + "\n")
    return path


def _plot(found: list[Path], labels: list[str], out: Path) -> Path | None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc, ev) = plt.subplots(1, 2, figsize=(12, 4.5))
    drawn = False
    for point, label in zip(found, labels):
        trainer = read_metrics(point / "metrics" / "policy_trainer.jsonl")
        curve = [(m["step"], m["heldout_accuracy"]) for m in trainer if "heldout_accuracy" in m]
        if curve:
            acc.plot(*zip(*curve), marker="o", ms=3, label=label)
            drawn = True
        orch = [m for m in read_metrics(point / "metrics" / "orchestrator.jsonl")
                if m.get("critic_explained_variance") is not None]
        if orch:
            ev.plot([m["step"] for m in orch], [m["critic_explained_variance"] for m in orch], lw=0.8, label=label)
    if not drawn:
        plt.close(fig)
        return None
    acc.set(title="held-out accuracy", xlabel="policy step")
    ev.set(title="critic explained variance (fresh rollouts)", xlabel="policy step", ylim=(-0.5, 1))
    for ax in (acc, ev):
        ax.grid(alpha=0.3)
    handles, names = acc.get_legend_handles_labels()
    short = [n if len(n) <= 70 else n[:67] + "..." for n in names]
    fig.legend(handles, short, loc="lower center", ncol=2 if len(short) > 4 else 1, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.035 * ((len(short) + 1) // (2 if len(short) > 4 else 1)), 1, 1))
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def after_point(run_root: Path) -> None:
    """Called when a run ends: inside a Hydra multirun, refresh the sweep summary of its sweep directory."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hydra = HydraConfig.get()
        if hydra.mode != RunMode.MULTIRUN:
            return
        sweep_dir = Path(hydra.sweep.dir)
    except Exception:  # noqa: BLE001 - outside a Hydra run there is no sweep to summarise
        return
    if Path(run_root).resolve().parent == sweep_dir.resolve():
        path = write_sweep_summary(sweep_dir)
        print(f"sweep summary        {path}", flush=True)
