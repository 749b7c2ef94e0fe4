"""Paired before/after held-out accuracy of one run, from the policy trainer's own evaluations.

The policy trainer writes each held-out evaluation problem by problem (``<run>/metrics/heldout/step_<n>.jsonl``:
prompt_id, reward, parsable, ...). This compares two of them on the same problems:

- the paired difference of accuracy with a 95% interval (normal approximation on the per-problem differences,
  which are -1, 0 or +1; plus an exact McNemar sign test on the discordant pairs);
- how much of it is format and how much correctness: with p = the share of replies holding a parsable final
  answer and c = accuracy among those, ``p1 c1 - p0 c0 = (p1 - p0) (c0 + c1) / 2 + (c1 - c0) (p0 + p1) / 2``:
  the first term is the gain from more parsable replies (format), the second the gain in correctness among
  parsable replies, each at the mean of the other factor (the symmetric split: the one-sided
  ``(p1 - p0) c0 + p1 (c1 - c0)`` would call all of a format-only warm start's gain "correctness" where c0 = 0).

With a supervised warm start that evaluated the model as loaded (``policy.warm_start.heldout_before=true``:
``<run>/metrics/heldout/before_sft.jsonl``), it also reports SFT's gain (before SFT -> step 0, the SFT'd weights)
and the whole run's (before SFT -> the last evaluation), each paired on the same problems; the top-level figures
stay RL's own (step 0 -> the last evaluation).

    python -m bench.paired_heldout <run_dir> [--before 0] [--after <last>] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from bench.common import write_record


def load(path: Path) -> dict[str, dict]:
    return {r["prompt_id"]: r for r in map(json.loads, path.read_text().splitlines()) if r}


def mcnemar_p(wins: int, losses: int) -> float:
    """Two-sided exact sign test on the discordant pairs."""
    n = wins + losses
    if n == 0:
        return 1.0
    k = min(wins, losses)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def paired(before: dict[str, dict], after: dict[str, dict]) -> dict:
    ids = sorted(set(before) & set(after))
    if not ids:
        raise SystemExit("the two evaluations share no problem")
    n = len(ids)
    b = [before[i]["reward"] >= 1.0 for i in ids]
    a = [after[i]["reward"] >= 1.0 for i in ids]
    d = [int(x) - int(y) for x, y in zip(a, b)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    half = 1.96 * math.sqrt(var / n)
    out = {"problems": n, "before": sum(b) / n, "after": sum(a) / n, "gain": mean,
           "ci95": [mean - half, mean + half], "wins": d.count(1), "losses": d.count(-1),
           "mcnemar_p": mcnemar_p(d.count(1), d.count(-1))}
    if all("parsable" in before[i] and "parsable" in after[i] for i in ids):
        pb = [before[i]["parsable"] for i in ids]
        pa = [after[i]["parsable"] for i in ids]
        p0, p1 = sum(pb) / n, sum(pa) / n
        c0 = sum(x for x, p in zip(b, pb) if p) / max(1, sum(pb))
        c1 = sum(x for x, p in zip(a, pa) if p) / max(1, sum(pa))
        out.update(parsable_before=p0, parsable_after=p1, correct_given_parsable_before=c0,
                   correct_given_parsable_after=c1, gain_format=(p1 - p0) * (c0 + c1) / 2,
                   gain_correctness=(c1 - c0) * (p0 + p1) / 2)
    tokens = [after[i].get("response_tokens") for i in ids]
    if all(t is not None for t in tokens):
        out["after_mean_response_tokens"] = sum(tokens) / n
        out["after_cut_at_length"] = sum(after[i].get("stop_reason") == "length" for i in ids) / n
    return out


def describe(label: str, out: dict) -> None:
    lo, hi = out["ci95"]
    print(f"{label}, {out['problems']} problems: {out['before']:.3f} -> {out['after']:.3f}  gain {out['gain']:+.3f} "
          f"(95% CI {lo:+.3f} .. {hi:+.3f}; {out['wins']} won, {out['losses']} lost, McNemar p={out['mcnemar_p']:.2g})")
    if "parsable_before" in out:
        print(f"  parsable final answer {out['parsable_before']:.3f} -> {out['parsable_after']:.3f}; correct among "
              f"parsable {out['correct_given_parsable_before']:.3f} -> {out['correct_given_parsable_after']:.3f}; "
              f"gain = format {out['gain_format']:+.3f} + correctness {out['gain_correctness']:+.3f}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--before", type=int, default=None, help="policy step of the 'before' evaluation (first)")
    ap.add_argument("--after", type=int, default=None, help="policy step of the 'after' evaluation (last)")
    ap.add_argument("--json", default=None, help="also write the figures here")
    args = ap.parse_args(argv)
    root = Path(args.run_dir) / "metrics" / "heldout"
    files = sorted(root.glob("step_*.jsonl"))
    if len(files) < 2:
        raise SystemExit(f"{root}: fewer than two held-out evaluations (the policy trainer writes one at step 0 "
                         "and every eval_every steps)")
    steps = {int(f.stem.split("_")[1]): f for f in files}
    before = args.before if args.before is not None else min(steps)
    after = args.after if args.after is not None else max(steps)
    for s in (before, after):
        if s not in steps:
            raise SystemExit(f"no held-out evaluation at step {s}; there are: {sorted(steps)}")
    out = {"before_step": before, "after_step": after, **paired(load(steps[before]), load(steps[after]))}
    describe(f"RL: held-out, step {before} -> {after}", out)
    base = root / "before_sft.jsonl"
    if base.exists():
        out["sft"] = paired(load(base), load(steps[before]))
        out["total"] = paired(load(base), load(steps[after]))
        describe(f"SFT: held-out, before SFT -> step {before}", out["sft"])
        describe(f"SFT + RL: held-out, before SFT -> step {after}", out["total"])
    if args.json:
        write_record(args.json, out)
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
