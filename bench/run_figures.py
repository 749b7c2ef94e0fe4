"""The per-role figures of one run directory, for a recipe's table: wall, held-out accuracy (paired, from
bench/paired_heldout.py), critic explained variance on fresh rollouts, throughput and step times per role, the
cost of publishing a policy version, peak memory per role.

    python -m bench.run_figures <run_dir> [--json out.json]

Medians over the run (the first record of each role, which includes start-up, is left out where there are more).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from bench.common import write_record


def read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def med(values) -> float | None:
    values = [v for v in values if v is not None]
    if len(values) > 2:
        values = values[1:]
    return statistics.median(values) if values else None


def dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2 ** 20


def figures(run: Path) -> dict:
    m = {p.stem: read(p) for p in (run / "metrics").glob("*.jsonl")}
    policy = m.get("policy_trainer", [])
    steps = [r for r in policy if "loss" in r]
    evals = [r for r in policy if "heldout_accuracy" in r]
    inference = [r for k, v in m.items() if k.startswith("inference") for r in v if "tokens_per_s" in r]
    evaluator = [r for k, v in m.items() if k.startswith("evaluator") for r in v if "states_per_s" in r]
    critic = [r for r in m.get("value_trainer", []) if "critic_step" in r]
    batches = [r for r in m.get("orchestrator", []) if "step" in r]
    times = [r["time"] for v in m.values() for r in v if "time" in r]
    out: dict = {"wall_s": (max(times) - min(times)) if times else None, "policy_steps": len(steps)}
    out["heldout"] = [{"step": r["step"], "accuracy": r["heldout_accuracy"], "seconds": r.get("heldout_s")}
                      for r in evals]
    evs = [r.get("critic_explained_variance") for r in batches]
    evs = [e for e in evs if e is not None]
    out["explained_variance_last5"] = statistics.mean(evs[-5:]) if evs else None
    out["explained_variance_by_step"] = evs
    out["reward_by_step"] = [round(r.get("reward_mean", float("nan")), 3) for r in steps]
    out["inference_tokens_per_s"] = med(r.get("generate_tokens_per_s") for r in inference)
    out["inference_chunk_s"] = med(r.get("gen_s") for r in inference)
    out["evaluator_states_per_s"] = med(r.get("states_per_s") for r in evaluator)
    out["policy_train_step_s"] = med(r.get("train_s") for r in steps)
    out["policy_step_wait_s"] = med(r.get("step_wait_s") for r in steps)
    out["critic_step_s"] = med(r.get("step_s") for r in critic)
    out["critic_steps"] = critic[-1]["critic_step"] if critic else 0
    io = [r.get("io_s") for r in steps]
    if len(io) > 1 and all(v is not None for v in io):
        out["policy_io_s_per_step"] = (io[-1] - io[0]) / (len(io) - 1)  # publish + prune + commit, cumulative timer
    versions = sorted((run / "weights" / "policy").glob("[0-9]*"))
    if versions:
        out["policy_version_mb"] = dir_mb(versions[-1])
    out["peak_rss_mb"] = {k: max((r.get("peak_rss_mb") or 0) for r in v) or None for k, v in m.items()}
    warm = m.get("warm_start", [])
    sft = [r for r in warm if "sft_step" in r]
    out["warm_start"] = {
        "heldout_before_sft_s": next((r["heldout_before_sft_s"] for r in warm if "heldout_before_sft_s" in r), None),
        "sft_steps": sft[-1]["sft_step"] if sft else 0,
        "sft_loss_last": sft[-1].get("loss") if sft else None,
        "sft_s": next((r["sft_s"] for r in warm if "sft_s" in r), None),  # includes the before-SFT evaluation
    }
    from bench import paired_heldout

    heldout = run / "metrics" / "heldout"
    paired_files = sorted(heldout.glob("step_*.jsonl"))
    if len(paired_files) >= 2:  # RL: step 0 (after any SFT) -> the last evaluation
        out["paired"] = paired_heldout.paired(paired_heldout.load(paired_files[0]),
                                              paired_heldout.load(paired_files[-1]))
    if paired_files and (heldout / "before_sft.jsonl").exists():  # SFT: the model as loaded -> step 0
        out["paired_sft"] = paired_heldout.paired(paired_heldout.load(heldout / "before_sft.jsonl"),
                                                  paired_heldout.load(paired_files[0]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    out = figures(Path(args.run_dir))
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        write_record(args.json, out)


if __name__ == "__main__":
    main()
