"""What the critic buys at equal budget: held-out accuracy per generated token, critic vs group baseline, with a
fixed number of rollouts per policy step split as prompts x samples (docs/value_functions.md, "Equal
budget").

    python -m bench.equal_budget --out sweeps/budget                       # the default grid, resumable
    python -m bench.equal_budget --out sweeps/budget --seeds 0,1,2 --ckpt-seeds 0,1
    python -m bench.equal_budget --out sweeps/budget --report-only          # the table and plot only

One command runs the grid and writes the table. Per checkpoint seed C it first makes ONE warm start,
`<out>/ckpt<C>/base` (a 1-step run of the experiment at seed C: SFT, then the privileged critic's pretraining on
`critic.warm_start.rollouts` fresh samples of v0), and every run of that checkpoint starts from its policy version
0 and (privileged cells) its critic version 0, copied into the run directory so the run's own warm-start job finds
them and does nothing. A plain-critic cell copies only the policy: its warm-start job pretrains its own
(unprivileged) critic. Each run is then one point of the cell's Hydra sweep directory,

    python -m prime_values -m +experiment=arith <cell overrides> seed=S steps=... \
        hydra.sweep.dir=<out>/ckpt<C>/<cell> hydra.sweep.subdir=seed<S>

(a multirun of one point, so the sweep summary of `python -m prime_values.tools.report` is refreshed as points end),
started under the heavy lock (`--lock`, fcntl; released for 15 s between runs so that other work waiting for
it interleaves). Rerunning the same command
skips every run whose `report/summary.json` says finished after `--steps` policy steps and restarts every other
one from scratch (its run directory is removed and re-seeded: its figures then come from one uninterrupted run).
`--stop-after HH:MM` (UTC) starts no run after that time; the rest waits for the next invocation.

Cells (`--cells`, `<kind>:<G>`, prompts per step = `--rollouts` / G): `grpo` (group mean), `gae` (privileged
critic), `tether` (privileged critic blended with the group mean), `plain` (gae with critic.privileged=false),
the critic-free controls `mean` (advantage=batch_mean), `loo` (advantage=batch_loo) and `reinforce`, and the
ceiling `oracle` (gae on critic=oracle's values, on a task that plays games on: `oracle:1@critic.oracle_samples=4`;
the games it plays are not charged). A cell may carry its own overrides after '@' (the learning-rate grid:
`grpo:8@policy.lr=5e-5,gae:4@policy.lr=5e-5`, named grpo_g8_policy.lr5e-5, gae_g4_policy.lr5e-5; λ:
`oracle:1@advantage.lambda_policy=0.9`), and `@seed_offset=N` runs a copy of a cell at other RL seeds (an A/A cell).
A privileged cell whose overrides change how the critic's version 0 is made (`critic.warm_start.*`, `critic.arch.*`,
`critic.loss`, `critic.template`: `gae:1@critic.warm_start.rollouts=16384@critic.warm_start.steps=2400`, the
certified warm start) cannot share the base's critic: like a plain cell, each of its runs pretrains its own and pays
for it.
The target is grpo tuned with the same grid: of the grpo cells at G = 8 (grpo_g8 and its variants), the one with
the highest mean final accuracy is the reference; a grid without them is read against the batch mean at G = 1.

Generated tokens are counted from the rollout log, not from the config: every rollout inference wrote (the
warm-up ones the orchestrator dropped and stale ones included), policy tokens only (`policy_mask`), up to the
policy version that was evaluated: the tokens behind the evaluation at step s are those of rollouts of policy
versions < s. A critic cell also pays its critic's warm start, `critic_pretrain_generated_tokens` of the warm-start
metrics (the base's for a privileged cell, its own for a plain one or one that makes its own critic); those
rollouts are never in the log.

Each finished run is also kept as a small record, `<records>/ckpt<C>-<sha>/<cell>/seed<S>.json` (default
`--records bench/records/<experiment>`, which is committed: a grid outlives the machine and the run directories
it ran on). A record holds what the table and the plot need (the accuracy curve with the tokens behind each
point, the critic's EV per step, tokens, wall and CPU seconds), the grid's parameters (`grid`: experiment,
rollouts, steps, eval_every, heldout, overrides; a record of other parameters is ignored, and counted) and
`<sha>`, the first 12 hex digits of the SHA-256 of the checkpoint's version 0 (policy and critic weights).
A rerun skips a run that has a record of the same checkpoint sha and grid; a checkpoint whose every asked-for
run is recorded is not rebuilt. A checkpoint rebuilt on another machine that comes out different (another sha)
is a different checkpoint: the report keeps its runs apart (target, tokens, seeds), never pools them. (The warm
start's kernels differ between machines of one kind, and an SFT that stops at a validation threshold amplifies a
rounding; so a built base is also kept, `<records>/ckpt<C>-<sha>/base`: its version-0 weights, warm-start metrics,
config and summary, ~25 MB, committed. Where `<out>` has no base of checkpoint C and the records keep one, it is
copied in instead of rebuilt: every machine then continues the same checkpoint. A base over KEEP_MAX_MB, a real
model's, is not committed: it stays in `<out>`, and a grid continued elsewhere must copy it there itself.)

Every record is stamped (bench.common.stamp): the commit that recorded it (and `commit_dirty`), the date its run
ended, the CPU model and flags, beside the checkpoint sha; the report names records without them "unstamped"
(records made before the stamps), never guesses, and says whether each checkpoint's base is kept.

Beside the table, every cell is compared with the reference paired by (checkpoint, RL seed) under the critic study
protocol (docs/benchmarks.md; bench/budget_stats.py), each difference the mean of the pairs with its 95% Student-t
interval: the endpoint (the mean of the last 5 held-out evaluations) with its verdict at ±0.02 (equivalent, better,
worse or inconclusive), the SD of its pairs and the seeds that SD needs; the final accuracy; the mean accuracy over
tokens 0..X (the area under the accuracy-vs-tokens curve, X common to the table, every warm start charged: the
curve starts at 0 tokens at the start accuracy) with its verdict; tokens to four thresholds from below the
reference's endpoint to it (crossings interpolated between evaluations) and CPU seconds to the last (`eval_costs` of
the records, the critic's warm start included; older records lack them). Then the contrasts the docs read (gae_g1
against plain_g1 and mean_g1, gae at G = 2 against grpo at G = 2, gae_g1 against grpo_g2) and the A/A pair where a
grid has one (tether_g1 and gae_g1: tether at G = 1 is gae), whose true difference is 0.

`--restate` prints every committed grid under the protocol from the records alone (bench/records/arith,
arith_work, arith_chain, and the SmolLM2 grid through bench/smollm_grid.py's report), with `--out` also
`<out>/restated.md`: `python -m bench.equal_budget --restate`.

Writes `<out>/equal_budget.md` (per checkpoint the table and the goals; with several checkpoints, then the same
over the cells run on every checkpoint, each run against its own checkpoint's target), `equal_budget.json` (per
run and per cell) and the plots (held-out accuracy vs generated tokens, mean and band of +-1 standard deviation
over seeds; the critic's explained variance vs step): `equal_budget_ckpt<C>-<sha>.png` per checkpoint and
`equal_budget.png` over the checkpoints, all from the records.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

from bench import common
from bench.budget_stats import MARGIN, STAMPS, paired_table, unstamped
from bench.common import ROOT
from prime_values.monitor import read_metrics

KINDS = {
    "grpo": ["advantage=grpo"],
    "gae": ["advantage=gae", "critic.privileged=true"],
    "tether": ["advantage=tether", "critic.privileged=true"],
    "plain": ["advantage=gae", "critic.privileged=false"],
    # the ceiling: GAE on the oracle's values (critic=oracle, the policy's own success rate from each state by
    # critic.oracle_samples games played on; task=guess, tools, sudoku); the games it plays are not charged
    "oracle": ["advantage=gae", "critic=oracle"],
    # the critic-free controls at any G (a baseline of the whole policy batch, or none)
    "mean": ["advantage=batch_mean"],
    "loo": ["advantage=batch_loo"],
    "reinforce": ["advantage=reinforce"],
}
CRITIC_FREE = {"grpo", "mean", "loo", "reinforce"}  # kinds that start no critic roles
OWN_CRITIC = {"plain", "oracle"}  # kinds whose critic is not the base's privileged one (a run copies only the policy)
# overrides that change how a critic's version 0 is made: a cell with one pretrains its own critic
OWN_CRITIC_KEYS = ("critic.warm_start.", "critic.arch.", "critic.loss=", "critic.template=", "critic.privileged=")
ESTIMATOR_KIND = {"grpo": "grpo", "batch_mean": "mean", "batch_loo": "loo", "reinforce": "reinforce"}
# the base's own sampling, pinned per experiment: the critic's warm start samples its rollouts as prompts x
# inference.group_size, so a later change of the experiment's default G would make a rebuilt checkpoint another
# one (another sha). arith's records were built at its default of that time, 32 x 4 (64 x 2 since 2026-12-03), with
# the SFT stop at 0.5 and the critic pretrained 300 steps on 2,048 rollouts (the README run's defaults since shortened)
BASE_PINS = {"arith": ["inference.group_size=4", "inference.prompts_per_step=32",
                       "policy.warm_start.target_accuracy=0.5", "policy.warm_start.check_every=25",
                       "critic.warm_start.steps=300",
                       "critic.warm_start.rollouts=2048"],
             # the SFT checks of their time (arith checks every 5 steps since 2026-12-05)
             "arith_work": ["policy.warm_start.check_every=25"], "arith_chain": ["policy.warm_start.check_every=25"],
             "guess": ["inference.group_size=2", "inference.prompts_per_step=64"]}
# the RL runs' own settings the records were measured with, where a default has changed since
RUN_PINS = {"arith": ["replay.ratio=0", "critic.warm_start.steps=300", "critic.warm_start.rollouts=2048"],
            # guess's records ran at λ = 1 and 64 x 2 for the base (the recipe's defaults of their time)
            "guess": ["advantage.lambda_policy=1.0"]}
PAUSE_S = 15  # seconds between two runs with the heavy lock released
DEFAULT_CELLS = "grpo:8,gae:8,gae:4,gae:2,gae:1,grpo:4,grpo:2,tether:1,plain:1"  # tether, plain: gae's best G
# the tests' SMALL overrides (tests/e2e_helpers.py): a smaller model, one-digit sums, a short warm start
SMOKE = ["task.digits=1", "task.min_digits=1", "replay.min_rollouts=8", "critic.batch_rollouts=8",
         "critic.publish_every=1", "policy.arch.hidden_size=64", "policy.arch.num_heads=2",
         "policy.arch.num_kv_heads=1", "policy.arch.intermediate_size=128", "policy.warm_start.steps=10",
         "critic.warm_start.steps=5", "critic.warm_start.rollouts=32", "launcher.poll_s=0.2"]


def parse_cells(text: str, rollouts: int) -> list[tuple[str, str, int, list[str]]]:
    """'grpo:8,gae:1,gae:4@policy.lr=5e-5' -> [(name, kind, G, extra overrides)]; G must divide the rollouts per
    step. A cell's own overrides follow '@' (several: '@a=1@b=2') and name it: gae_g4_policy.lr5e-5."""
    cells = []
    for item in text.split(","):
        spec, *extra = item.strip().split("@")
        kind, _, g = spec.partition(":")
        if kind not in KINDS or not g.isdigit() or int(g) < 1:
            raise SystemExit(f"--cells: {item!r} is not <kind>:<G>[@key=value...] with kind one of "
                             f"{', '.join(KINDS)} and G >= 1")
        if rollouts % int(g):
            raise SystemExit(f"--cells: G={g} does not divide --rollouts={rollouts} (prompts x samples per step)")
        if any("=" not in o or not set(o) <= set("abcdefghijklmnopqrstuvwxyz0123456789_.=-") for o in extra):
            raise SystemExit(f"--cells: {item!r}: what follows '@' must be key=value overrides of [a-z0-9_.-]")
        if any(o.startswith(SEED_OFFSET) and not o[len(SEED_OFFSET):].isdigit() for o in extra):
            raise SystemExit(f"--cells: {item!r}: seed_offset takes a whole number (an A/A cell: "
                             "mean:1@seed_offset=1000)")
        name = f"{kind}_g{g}" + "".join(f"_{o.split('=', 1)[0]}{o.split('=', 1)[1]}" for o in extra)
        cells.append((name, kind, int(g), extra))
    return cells


SEED_OFFSET = "seed_offset="  # a cell's own '@seed_offset=N': its run paired with RL seed S runs at seed S + N


def run_pins(experiment: str, extra: list[str]) -> list[str]:
    """The experiment's RUN_PINS, less those a cell sets itself (a pin comes later on the command line, where the
    last value of a key wins)."""
    own = {o.split("=", 1)[0] for o in extra}
    return [p for p in RUN_PINS.get(experiment, []) if p.split("=", 1)[0] not in own]


def seed_offset(extra: list[str]) -> int:
    """The RL seed offset a cell's overrides name (0 when none): an A/A cell, the same configuration as another
    under a second name, must run at other seeds. A run's own seed is its whole randomness where no critic runs
    beside it (a critic-free run at one seed repeats exactly), so the same seed under two names measures nothing."""
    return sum(int(o[len(SEED_OFFSET):]) for o in extra if o.startswith(SEED_OFFSET))


def cell_overrides(kind: str, g: int, rollouts: int, extra: list[str] = ()) -> list[str]:
    return [*KINDS[kind], f"inference.group_size={g}", f"inference.prompts_per_step={rollouts // g}",
            *(o for o in extra if not o.startswith(SEED_OFFSET))]


def finished(run: Path, steps: int) -> bool:
    """A run is done when its summary says finished after `steps` policy steps (anything else is restarted)."""
    try:
        summary = json.loads((run / "report" / "summary.json").read_text())
    except (OSError, ValueError):
        return False
    return summary.get("status") == "finished" and (summary.get("policy_steps") or 0) >= steps


def base_done(base: Path) -> bool:
    return all((base / "weights" / m / "0").is_dir() for m in ("policy", "critic")) and \
        (base / "report" / "summary.json").exists()


def owns_critic(kind: str, extra: list[str]) -> bool:
    """Whether a cell's runs make their own critic version 0 instead of copying the base's privileged one."""
    return kind in OWN_CRITIC or any(o.startswith(OWN_CRITIC_KEYS) for o in extra)


def seed_run(base: Path, run: Path, models: tuple[str, ...]) -> None:
    """Version 0 of `models` copied from the base into a fresh run directory (its warm start skips them)."""
    for model in models:
        shutil.copytree(base / "weights" / model / "0", run / "weights" / model / "0")
        (run / "weights" / model / "LATEST").write_text("0\n")


KEPT = ("weights/policy/0", "weights/critic/0", "metrics/warm_start.jsonl", "report/summary.json", "config.yaml")


KEEP_MAX_MB = 64  # a larger base (a real model's: SmolLM2-135M's version 0 with its critic, 682 MB) is not committed


def keep_base(base: Path, records: Path, ckpt: int, sha: str) -> None:
    """Keep what the runs of a checkpoint need of its base (KEPT) beside their records, once, where it is at most
    KEEP_MAX_MB (the report then says the base is not kept; it stays in the grid directory)."""
    kept = records / f"ckpt{ckpt}-{sha}" / "base"
    if kept.is_dir():
        return
    size = sum(p.stat().st_size for rel in KEPT for p in ([base / rel] if (base / rel).is_file() else
                                                          (base / rel).rglob("*")) if p.is_file())
    if size > KEEP_MAX_MB * 2**20:
        print(f"checkpoint {ckpt}: its base is {size / 2**20:.0f} MB, over {KEEP_MAX_MB} MB to commit; not kept "
              f"beside the records (it stays in {base})")
        return
    tmp = kept.with_name("base.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    for rel in KEPT:
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        (shutil.copytree if (base / rel).is_dir() else shutil.copy2)(base / rel, tmp / rel)
    for model in ("policy", "critic"):
        (tmp / "weights" / model / "LATEST").write_text("0\n")
    tmp.rename(kept)  # whole or absent


def kept_base(records: Path, ckpt: int) -> Path | None:
    """The base of checkpoint `ckpt` kept beside the records (the one with the most records where several are)."""
    kept = [b for b in records.glob(f"ckpt{ckpt}-*/base") if base_done(b)] if records.is_dir() else []
    return max(kept, key=lambda b: len(list(b.parent.glob("*/seed*.json"))), default=None)


def checkpoint_sha(base: Path) -> str:
    """First 12 hex digits of the SHA-256 over the base's version-0 files (policy, then critic), name and bytes."""
    digest = hashlib.sha256()
    for model in ("policy", "critic"):
        for path in sorted((base / "weights" / model / "0").rglob("*")):
            if path.is_file():
                digest.update(f"{model}/{path.relative_to(base / 'weights' / model / '0')}".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def grid_key(args) -> dict:
    """The parameters that make two runs of a cell comparable (a record of other parameters is not counted)."""
    return {"experiment": args.experiment, "rollouts": args.rollouts, "steps": args.steps,
            "eval_every": args.eval_every, "heldout": args.heldout, "overrides": list(args.overrides),
            "smoke": bool(args.smoke)}


def record_path(records: Path, ckpt: int, sha: str, cell: str, seed: int) -> Path:
    return records / f"ckpt{ckpt}-{sha}" / cell / f"seed{seed}.json"


def load_records(records: Path, key: dict) -> tuple[list[dict], int]:
    """Every record under `records` of the grid `key`, and how many records of other grids were left out."""
    runs, other = [], 0
    for path in sorted(records.glob("ckpt*/*/seed*.json")) if records.is_dir() else []:
        rec = json.loads(path.read_text())
        if rec.get("grid") == key:
            runs.append(rec)
        else:
            other += 1
    return runs, other


def recorded_sha(records: Path, key: dict, ckpt: int, wanted: list[tuple[str, int]]) -> str | None:
    """The checkpoint sha whose records cover every (cell, seed) in `wanted` (then the base need not be rebuilt)."""
    for folder in sorted(records.glob(f"ckpt{ckpt}-*")) if records.is_dir() else []:
        sha = folder.name.split("-", 1)[1]
        if all(has_record(records, key, ckpt, sha, cell, seed) for cell, seed in wanted):
            return sha
    return None


def has_record(records: Path, key: dict, ckpt: int, sha: str, cell: str, seed: int) -> bool:
    path = record_path(records, ckpt, sha, cell, seed)
    try:
        return json.loads(path.read_text()).get("grid") == key
    except (OSError, ValueError):
        return False


def write_record(records: Path, key: dict, run: Path, out: Path, ckpt: int, sha: str,
                 seed: int | None = None) -> dict | None:
    """The record of a finished run directory (None: not finished, nothing written), stamped (its date is its run's
    own; a run found finished in <out> is recorded at this invocation's commit and machine); written atomically.
    `seed`: the RL seed it is paired by, where the run's own (`rl_seed`) is offset from it (an A/A cell)."""
    rec = read_run(run, out / f"ckpt{ckpt}" / "base", ckpt)
    if rec is None or rec["status"] != "finished":
        return None
    if seed is not None and seed != rec["seed"]:
        rec.update(rl_seed=rec["seed"], seed=seed)
    rec.update(run=str(run.relative_to(out)), grid=key, checkpoint_sha=sha, ckpt=f"{ckpt}-{sha}")
    return common.write_record(record_path(records, ckpt, sha, rec["cell"], rec["seed"]), rec)


class HeavyLock:
    """fcntl lock on the shared heavy-work lock file, held for one child run at a time."""

    def __init__(self, path: str | None):
        self.path, self.file = path, None

    def __enter__(self):
        if self.path:
            self.file = open(self.path, "a")
            fcntl.flock(self.file, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc):
        if self.file:
            fcntl.flock(self.file, fcntl.LOCK_UN)
            self.file.close()


class TooLate(Exception):
    """--stop-after passed while a run waited for the heavy lock: it is not started."""


def child(args_: list[str], log_path: Path, timeout_s: float, lock: str | None,
          stop_after: common.StopAfter | None = None) -> int:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with HeavyLock(lock):
        if common.too_late(stop_after):  # the wait for the lock may have outlasted --stop-after
            raise TooLate
        out = open(log_path, "w")
        began = time.time()
        print(f"  [{time.strftime('%H:%M:%S')}] {' '.join(args_)}", flush=True)
        try:
            rc = subprocess.run([sys.executable, "-m", "prime_values", *args_], cwd=ROOT, env=env, stdout=out,
                                stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            rc = 124
        out.close()
        print(f"    -> rc {rc} in {time.time() - began:.0f} s (output {log_path})", flush=True)
    if lock:
        time.sleep(PAUSE_S)  # outside the lock: work waiting for it gets it before the next run
    return rc


def build_smoke_base(base: Path, overrides: list[str]) -> None:
    """Smoke mode: untrained version 0 of both models, built here instead of a warm-start run."""
    from omegaconf import OmegaConf

    from prime_values.config import Config
    from prime_values.models import build_char_tokenizer, build_critic, build_tiny_policy, save_model

    arch = dict(OmegaConf.structured(Config).policy.arch)
    arch.update({o.split("=")[0][len("policy.arch."):]: int(o.split("=")[1]) for o in overrides
                 if o.startswith("policy.arch.")})
    tokenizer = build_char_tokenizer()
    save_model(build_tiny_policy(tokenizer, seed=0, **arch), tokenizer, base / "weights" / "policy" / "0")
    save_model(build_critic(base / "weights" / "policy" / "0", tokenizer, seed=1, **arch), tokenizer,
               base / "weights" / "critic" / "0")
    (base / "report").mkdir(parents=True, exist_ok=True)
    (base / "report" / "summary.json").write_text(json.dumps({"status": "smoke: untrained version 0"}))


def run_grid(args, cells, overrides_all: list[str]) -> int:
    out, records, key = Path(args.out), Path(args.records), grid_key(args)
    failures = 0
    for c in args.ckpt_seeds:
        base = out / f"ckpt{c}" / "base"
        wanted = [(name, s) for s in args.seeds for name, *_ in cells]
        if not base_done(base) and recorded_sha(records, key, c, wanted):
            print(f"checkpoint {c}: every asked-for run is recorded under {records}; not rebuilt")
            continue
        kept = None if base_done(base) else kept_base(records, c)
        if kept is not None:
            shutil.rmtree(base, ignore_errors=True)
            shutil.copytree(kept, base)
            print(f"checkpoint {c}: the base kept in {kept} copied in, not rebuilt")
        if not base_done(base):
            if common.too_late(args.stop_after):
                print(f"stop-after {args.stop_after} UTC passed: base of checkpoint {c} not started")
                return failures
            shutil.rmtree(base, ignore_errors=True)
            if args.smoke:
                build_smoke_base(base, overrides_all)
            else:
                try:
                    rc = child([*overrides_all, *BASE_PINS.get(args.experiment, []), f"seed={c}",
                                f"policy.warm_start.seed={c}", "steps=1", "eval_every=1", f"hydra.run.dir={base}"],
                               out / "logs" / f"ckpt{c}_base.txt", args.timeout, args.lock, args.stop_after)
                except TooLate:
                    print(f"stop-after {args.stop_after} UTC passed while waiting for the lock: base not started")
                    return failures
                if rc != 0 or not base_done(base):
                    print(f"warm start of checkpoint {c} failed: see {out / 'logs'}")
                    failures += 1
                    continue
        sha = checkpoint_sha(base)
        if not args.smoke:
            keep_base(base, records, c, sha)
        for s in args.seeds:  # every cell at seed 0 first: a stopped grid still compares all cells
            for name, kind, g, extra in cells:
                sweep = out / f"ckpt{c}" / name
                run = sweep / f"seed{s}"
                if has_record(records, key, c, sha, name, s):
                    continue
                if finished(run, args.steps):  # finished before its record was written
                    write_record(records, key, run, out, c, sha, s)
                    continue
                if common.too_late(args.stop_after):
                    print(f"stop-after {args.stop_after} UTC passed: no new run started")
                    return failures
                shutil.rmtree(run, ignore_errors=True)
                seed_run(base, run, ("policy",) if owns_critic(kind, extra) else ("policy", "critic"))
                try:
                    rc = child(["-m", *overrides_all, *cell_overrides(kind, g, args.rollouts, extra),
                                f"seed={s + seed_offset(extra)}",
                                *run_pins(args.experiment, extra),
                                f"steps={args.steps}", f"eval_every={args.eval_every}", f"hydra.sweep.dir={sweep}",
                                f"hydra.sweep.subdir=seed{s}"],
                               out / "logs" / f"ckpt{c}_{name}_seed{s}.txt", args.timeout, args.lock, args.stop_after)
                except TooLate:
                    print(f"stop-after {args.stop_after} UTC passed while waiting for the lock: no new run started")
                    return failures
                if rc != 0 or not finished(run, args.steps):
                    print(f"    run {run} did not finish (rc {rc}); the next invocation restarts it")
                    failures += 1
                else:
                    write_record(records, key, run, out, c, sha, s)
    return failures


# ---------------------------------------------------------------------------------------------------------------
# reading the runs


def generated_tokens(run: Path) -> tuple[dict[int, int], int]:
    """Policy tokens of every rollout in the run's rollout log, per policy version, and the rollout count."""
    from prime_values.log import CorruptSegment, read_segment

    per_version: dict[int, int] = defaultdict(int)
    count = 0
    stream = run / "log" / "rollouts"
    for path in sorted(stream.glob("*/*.arrow")) if stream.is_dir() else []:
        try:
            table = read_segment(path, "rollouts")
        except (CorruptSegment, FileNotFoundError):
            continue
        for version, mask in zip(table.column("policy_version").to_pylist(), table.column("policy_mask").to_pylist()):
            per_version[version] += sum(mask)
            count += 1
    return dict(per_version), count


NO_WARM_START = {"critic_pretrain_rollouts": 0, "critic_pretrain_generated_tokens": 0, "critic_pretrain_s": 0.0,
                 "critic_pretrain_cpu_s": 0.0}


def warm_tokens(run_dir: Path) -> dict:
    """The critic warm start's generation: its rollouts, tokens and seconds (from warm-start metrics)."""
    out = dict(NO_WARM_START)
    for m in read_metrics(run_dir / "metrics" / "warm_start.jsonl"):
        for key in out:
            if key in m:
                out[key] = m[key]
    return out


def pretrained_its_critic(run_dir: Path) -> bool:
    """Whether the run's own warm-start job pretrained its critic (a cell that owns its critic; a run given the
    base's finds it and logs no pretraining)."""
    return any("critic_pretrain_rollouts" in m for m in read_metrics(run_dir / "metrics" / "warm_start.jsonl"))


def eval_costs(run: Path, evals: list[dict], warm: dict, own_warm_start: bool) -> list[tuple[int, float, float]]:
    """(step, wall s, CPU s) behind each held-out evaluation: wall from the run's first metrics line, CPU the sum
    over its roles of each process's CPU seconds logged by then (`cpu_s`); both plus the critic's warm start when
    the base made it (`own_warm_start` False: a privileged cell), whose wall the run's own clock never saw."""
    per_role = [[(m["time"], m["cpu_s"]) for m in read_metrics(f) if "time" in m and "cpu_s" in m]
                for f in sorted((run / "metrics").glob("*.jsonl"))]
    times = [m["time"] for f in (run / "metrics").glob("*.jsonl") for m in read_metrics(f) if "time" in m]
    # a run that pretrained its own critic logged its first line after sampling the warm start's rollouts: its
    # clock starts critic_pretrain_s before the line that reports it
    ends = [m["time"] - m["critic_pretrain_s"] for m in read_metrics(run / "metrics" / "warm_start.jsonl")
            if "time" in m and "critic_pretrain_s" in m]
    start = min(times + (ends if own_warm_start else []))
    extra_wall = 0.0 if own_warm_start else warm["critic_pretrain_s"]
    out = []
    for m in evals:
        cpu = sum(max((c for t, c in role if t <= m["time"]), default=0.0) for role in per_role)
        out.append((m["step"], round(m["time"] - start + extra_wall, 2), round(cpu + warm["critic_pretrain_cpu_s"], 2)))
    return out


def last(records: list[dict], key: str):
    return next((m[key] for m in reversed(records) if m.get(key) is not None), None)


def read_run(run: Path, base: Path, ckpt: int) -> dict | None:
    from omegaconf import OmegaConf

    if not (run / "config.yaml").exists():
        return None
    cfg = OmegaConf.load(run / "config.yaml")
    policy = read_metrics(run / "metrics" / "policy_trainer.jsonl")
    eval_rows = [m for m in policy if "heldout_accuracy" in m]
    evals = [(m["step"], m["heldout_accuracy"]) for m in eval_rows]
    trained = [m for m in policy if "loss" in m]
    if not evals or not trained:
        return None
    kind = ESTIMATOR_KIND.get(cfg.advantage.estimator) or ("oracle" if cfg.critic.get("oracle_samples") else
                                                            "plain" if not cfg.critic.privileged else
                                                            cfg.advantage.estimator)
    # the critic's warm start: the base's (shared by every privileged run of the checkpoint) or the run's own; the
    # oracle has none, and the games it plays to value states are not in these counts (a ceiling, not a method)
    own = kind == "plain" or pretrained_its_critic(run)
    warm = dict(NO_WARM_START) if kind in CRITIC_FREE or kind == "oracle" else warm_tokens(run if own else base)
    per_version, rollouts = generated_tokens(run)
    cumulative, tokens_before = 0, {}
    for version in range(max([*per_version, cfg.steps]) + 2):
        tokens_before[version] = cumulative + warm["critic_pretrain_generated_tokens"]
        cumulative += per_version.get(version, 0)
    orch = read_metrics(run / "metrics" / "orchestrator.jsonl")
    batches = [m for m in orch if "step" in m]
    times = [m["time"] for f in (run / "metrics").glob("*.jsonl") for m in read_metrics(f) if "time" in m]
    critic_cpu = sum(last(read_metrics(run / "metrics" / f"{role}.jsonl"), "cpu_s") or 0.0
                     for role in ("value_trainer", "evaluator")) if kind not in CRITIC_FREE else 0.0
    summary = common.summary(run)
    equal = [m["groups_equal_reward"] for m in batches if m.get("groups_equal_reward") is not None]
    ev = [(m["step"], m["critic_explained_variance"]) for m in batches
          if isinstance(m.get("critic_explained_variance"), float) and math.isfinite(m["critic_explained_variance"])]
    return {
        "run": str(run), "cell": run.parent.name, "kind": kind,  # the cell is the sweep directory's name
        "group_size": cfg.inference.group_size, "prompts_per_step": cfg.inference.prompts_per_step,
        "ckpt": ckpt, "seed": cfg.seed, "steps": trained[-1]["step"], "status": summary.get("status"),
        "date": datetime.fromtimestamp(max(times), timezone.utc).strftime("%Y-%m-%d") if times else None,
        "curve": [(s, a, tokens_before[s]) for s, a in evals],  # (step, held-out accuracy, tokens behind it)
        "start_accuracy": evals[0][1], "final_accuracy": evals[-1][1],
        "tokens_final": tokens_before[trained[-1]["step"]],
        "log_tokens": cumulative, "log_rollouts": rollouts, **warm,
        "dropped_stale": last(batches, "dropped_stale") or 0, "dropped_warmup": last(batches, "dropped_warmup") or 0,
        "wall_s": trained[-1]["time"] - min(times) if times else None,
        "critic_steps": summary.get("critic_steps", 0) if kind not in CRITIC_FREE else 0,
        "critic_cpu_s": critic_cpu, "policy_cpu_s": last(policy, "cpu_s"),
        "final_explained_variance": summary.get("final_explained_variance") if kind not in CRITIC_FREE else None,
        "groups_equal_reward": statistics.fmean(equal) if equal else None,
        "ev_curve": ev if kind not in CRITIC_FREE else [],  # (step, the orchestrator's critic EV on that batch)
        "eval_costs": eval_costs(run, eval_rows, warm, own_warm_start=kind in CRITIC_FREE or kind in OWN_CRITIC or own),
    }


def tokens_to(curve: list, target: float) -> float | None:
    """Generated tokens at the first evaluation at or above `target` (None: never)."""
    return next((t for _, a, t in curve if a >= target - 1e-9), None)


SMOOTH = 3  # evaluations in the smoothed variant: one held-out evaluation of 500 problems has s.e. ~0.02


def trailing_mean(curve: list, k: int) -> list:
    """The curve with each accuracy replaced by the mean of it and the k - 1 evaluations before it (fewer at the
    start): causal, so a crossing is dated at the last of the evaluations that made it."""
    return [(s, statistics.fmean(a for _, a, _ in curve[max(0, i - k + 1):i + 1]), t)
            for i, (s, _, t) in enumerate(curve)]


def _mean_se(xs: list[float]) -> tuple[float | None, float | None]:
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.fmean(xs), (statistics.stdev(xs) / len(xs) ** 0.5 if len(xs) > 1 else None)


def reference_cell(runs: list[dict]) -> str:
    """grpo tuned with the same grid as gae: of the grpo cells at G = 8 (grpo_g8 and its '@' variants), the one
    with the highest mean final accuracy; in a grid without grpo at G = 8, the batch mean at G = 1 (mean_g1, the
    control a critic at G = 1 must beat); "grpo_g8" when there is neither."""
    finals: dict[str, list[float]] = defaultdict(list)
    for r in runs:
        if r["kind"] == "grpo" and r["group_size"] == 8:
            finals[r["cell"]].append(r["final_accuracy"])
    if not finals and any(r["cell"] == "mean_g1" for r in runs):
        return "mean_g1"
    return max(finals, key=lambda c: (statistics.fmean(finals[c]), c == "grpo_g8"), default="grpo_g8")


def summarize(runs: list[dict], reference: str | None = None) -> dict:
    """Per cell over its runs: the target (per checkpoint, the mean final accuracy of the reference cell's runs),
    tokens to reach it, final accuracy, wall, critic EV and compute, and the all-equal group fraction."""
    reference = reference or reference_cell(runs)
    for suffix, k in (("", 1), ("_smooth", SMOOTH)):  # as specified; and over SMOOTH evaluations
        targets = {}
        for c in {r["ckpt"] for r in runs}:
            finals = [trailing_mean(r["curve"], k)[-1][1] for r in runs if r["ckpt"] == c and r["cell"] == reference]
            if finals:
                targets[c] = statistics.fmean(finals)
        for r in runs:
            target = r["target" + suffix] = targets.get(r["ckpt"])
            # not reached: counted as the run's whole budget (a lower bound on its cost), flagged
            hit = tokens_to(trailing_mean(r["curve"], k), target) if target is not None else None
            r["reached" + suffix] = hit is not None
            r["tokens_to_target" + suffix] = hit if hit is not None else (r["tokens_final"] if target is not None
                                                                          else None)
    cells: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        cells[r["cell"]].append(r)
    order = {k: i for i, k in enumerate(KINDS)}
    out = {}
    for name, rs in sorted(cells.items(), key=lambda kv: (order[kv[1][0]["kind"]], -kv[1][0]["group_size"], kv[0])):
        acc, acc_se = _mean_se([r["final_accuracy"] for r in rs])
        out[name] = {
            "runs": len(rs), "kind": rs[0]["kind"], "reference": reference,
            "group_size": rs[0]["group_size"], "prompts_per_step": rs[0]["prompts_per_step"],
            "start_accuracy_mean": _mean_se([r["start_accuracy"] for r in rs])[0],
            "final_accuracy_mean": acc, "final_accuracy_se": acc_se,
            "tokens_final_mean": _mean_se([r["tokens_final"] for r in rs])[0],
            "wall_s_mean": _mean_se([r["wall_s"] for r in rs])[0],
            "final_explained_variance_mean": _mean_se([r["final_explained_variance"] for r in rs])[0],
            "critic_steps_mean": _mean_se([r["critic_steps"] for r in rs])[0],
            "critic_cpu_s_mean": _mean_se([r["critic_cpu_s"] for r in rs])[0],
            "critic_pretrain_tokens": rs[0]["critic_pretrain_generated_tokens"],
            "dropped_mean": _mean_se([r["dropped_stale"] + r["dropped_warmup"] for r in rs])[0],
            "groups_equal_reward_mean": _mean_se([r["groups_equal_reward"] for r in rs])[0],
        }
        for suffix in ("", "_smooth"):
            tok, tok_se = _mean_se([r["tokens_to_target" + suffix] for r in rs])
            out[name].update({f"reached{suffix}": sum(r["reached" + suffix] for r in rs),
                              f"tokens_to_target{suffix}_mean": tok, f"tokens_to_target{suffix}_se": tok_se,
                              f"tokens_to_target{suffix}": [r["tokens_to_target" + suffix] for r in rs]})
    for suffix in ("", "_smooth"):
        ref = out.get(reference, {}).get(f"tokens_to_target{suffix}_mean")
        for s in out.values():
            mine = s[f"tokens_to_target{suffix}_mean"]
            s[f"tokens_ratio{suffix}"] = mine / ref if ref and mine is not None else None
    return out


def goals(summary: dict) -> list[str]:
    """The goal, gae at <= 0.5x the reference's (tuned grpo_g8) tokens beyond two standard errors: as specified (the
    first single evaluation at or above the reference's final one) and smoothed (both over SMOOTH evaluations)."""
    reference = next(iter(summary.values()))["reference"] if summary else "grpo_g8"
    lines = []
    for suffix, what in (("", "final accuracy"), ("_smooth", f"final accuracy, {SMOOTH}-evaluation means")):
        mean, se = f"tokens_to_target{suffix}_mean", f"tokens_to_target{suffix}_se"
        ref = summary.get(reference)
        gae = {k: s for k, s in summary.items() if s["kind"] == "gae" and s[mean] is not None}
        if not ref or not gae or ref[mean] is None:
            return [f"goal: needs {reference} and a gae cell with finished runs"]
        name, best = min(gae.items(), key=lambda kv: kv[1][mean])
        half = 0.5 * ref[mean]
        ses = [x for x in (best[se], ref[se]) if x is not None]
        # the difference to 0.5x GRPO-G8 must exceed two standard errors of the difference (seeds independent)
        noise = 2 * math.hypot(best[se] or 0.0, 0.5 * (ref[se] or 0.0))
        met = best[mean] + noise <= half and len(ses) == 2
        lines.append(f"best gae cell {name}: {best[mean]:.0f} tokens to {reference}'s {what} against "
                     f"{ref[mean]:.0f} for {reference} (ratio {best['tokens_ratio' + suffix]:.2f}; goal <= 0.5 "
                     f"beyond two standard errors, +-{noise:.0f} tokens"
                     f"{'' if len(ses) == 2 else ', needs >= 2 seeds'}): {'MET' if met else 'NOT MET'}")
    # the controls: the best critic-free cell at any G (is it the critic, or the smaller groups?), and the best
    # unprivileged critic (is it the privileged answer?)
    for kind, question in (("grpo", "the best grpo cell run (any G)"), ("plain", "a plain critic"),
                           ("mean", "a batch-mean baseline, no critic"), ("loo", "a leave-one-out batch baseline"),
                           ("reinforce", "no baseline at all")):
        lines += [_versus(summary, "gae", kind, suffix, question) for suffix in ("", "_smooth")
                  if any(s["kind"] == kind for s in summary.values())]
    return lines


def _versus(summary: dict, kind: str, other: str, suffix: str, question: str) -> str:
    """The best `kind` cell against the best `other` cell (fewest tokens to the target): the ratio and the
    difference with two standard errors of it."""
    mean, se = f"tokens_to_target{suffix}_mean", f"tokens_to_target{suffix}_se"
    best = {k: min(((n, s) for n, s in summary.items() if s["kind"] == k and s[mean] is not None),
                   key=lambda kv: kv[1][mean], default=(None, None)) for k in (kind, other)}
    (a, sa), (b, sb) = best[kind], best[other]
    if a is None or b is None:
        return f"{kind} vs {question}: needs a finished cell of each"
    diff, noise = sa[mean] - sb[mean], 2 * math.hypot(sa[se] or 0.0, sb[se] or 0.0)
    return (f"against {question}{' (smoothed)' if suffix else ''}: {a} {sa[mean]:.0f} vs {b} {sb[mean]:.0f} tokens "
            f"(ratio {sa[mean] / sb[mean]:.2f}, difference {diff:+.0f} +- {noise:.0f} at two standard errors"
            f"{'' if sa[se] is not None and sb[se] is not None else ', one seed in a cell'}); final accuracy "
            f"{sa['final_accuracy_mean']:.3f} vs {sb['final_accuracy_mean']:.3f}")


def table(summary: dict) -> str:
    def f(x, spec):
        return "-" if x is None else format(x, spec)

    ref = next(iter(summary.values()))["reference"] if summary else "grpo_g8"
    rows = [f"| cell | prompts x G | runs | reached | tokens to target (mean +- s.e.) | / {ref} | "
            f"smoothed ({SMOOTH} evals): reached, tokens | / {ref} | start acc | "
            "final acc (+- s.e.) | tokens at the end | wall s | critic EV | critic steps | critic CPU s | "
            "critic warm-start tokens | dropped rollouts | all-equal groups |", "|" + "---|" * 18]
    for name, s in summary.items():
        rows.append(
            f"| {name} | {s['prompts_per_step']} x {s['group_size']} | {s['runs']} | {s['reached']} | "
            f"{f(s['tokens_to_target_mean'], '.0f')} +- {f(s['tokens_to_target_se'], '.0f')} | "
            f"{f(s['tokens_ratio'], '.2f')} | {s['reached_smooth']}, {f(s['tokens_to_target_smooth_mean'], '.0f')} "
            f"+- {f(s['tokens_to_target_smooth_se'], '.0f')} | {f(s['tokens_ratio_smooth'], '.2f')} | "
            f"{f(s['start_accuracy_mean'], '.3f')} | "
            f"{f(s['final_accuracy_mean'], '.3f')} +- {f(s['final_accuracy_se'], '.3f')} | "
            f"{f(s['tokens_final_mean'], '.0f')} | {f(s['wall_s_mean'], '.0f')} | "
            f"{f(s['final_explained_variance_mean'], '.2f')} | {f(s['critic_steps_mean'], '.0f')} | "
            f"{f(s['critic_cpu_s_mean'], '.0f')} | {s['critic_pretrain_tokens']} | {f(s['dropped_mean'], '.0f')} | "
            f"{f(s['groups_equal_reward_mean'], '.2f')} |")
    return "\n".join(rows)


def plot(runs: list[dict], summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (acc_ax, ev_ax) = plt.subplots(1, 2, figsize=(13, 4.8))
    for i, name in enumerate(summary):
        rs = [r for r in runs if r["cell"] == name]
        steps = sorted(set.intersection(*[{s for s, _, _ in r["curve"]} for r in rs]))
        at = [{s: (a, t) for s, a, t in r["curve"]} for r in rs]
        tokens = [statistics.fmean(x[s][1] for x in at) for s in steps]
        mean = [statistics.fmean(x[s][0] for x in at) for s in steps]
        sd = [statistics.stdev(x[s][0] for x in at) if len(at) > 1 else 0.0 for s in steps]
        color, style = plt.cm.tab20(i % 20), "--" if rs[0]["kind"] in CRITIC_FREE else "-"
        acc_ax.plot(tokens, mean, color=color, ls=style, marker="o", ms=2.5, label=f"{name} ({len(rs)} runs)")
        acc_ax.fill_between(tokens, [m - d for m, d in zip(mean, sd)], [m + d for m, d in zip(mean, sd)],
                            color=color, alpha=0.15, lw=0)
        for r in rs:
            if r["ev_curve"]:
                ev_ax.plot([s for s, _ in r["ev_curve"]], [e for _, e in r["ev_curve"]], color=color,
                           lw=0.6, alpha=0.7, label=name if r is rs[0] else None)
    targets = {r["target"] for r in runs if r.get("target") is not None}
    for t in targets:
        acc_ax.axhline(t, color="grey", ls=":", lw=0.8)
    acc_ax.set(title="held-out accuracy vs generated tokens (mean, band +-1 s.d. over seeds)",
               xlabel="generated policy tokens (rollout log + critic warm start)", ylabel="held-out accuracy")
    ev_ax.set(title="critic explained variance on fresh rollouts", xlabel="policy step", ylim=(-0.5, 1))
    for ax in (acc_ax, ev_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def sync_records(out: Path, records: Path, key: dict) -> None:
    """Records for the finished run directories under `out` that have none yet (a grid run by older code)."""
    for base in sorted(out.glob("ckpt*/base")):
        if not base_done(base):
            continue
        ckpt, sha = int(base.parent.name[len("ckpt"):]), checkpoint_sha(base)
        for run in sorted(base.parent.glob("*/seed*")):
            seed = int(run.name[len("seed"):])  # the seed it is paired by (an A/A cell's run seed is offset)
            if (run / "config.yaml").exists() and not has_record(records, key, ckpt, sha, run.parent.name, seed):
                write_record(records, key, run, out, ckpt, sha, seed)


# contrasts the docs read, (cell, other, what it asks), where a grid has both cells
CONTRASTS = (("gae_g1", "plain_g1", "the privileged answer"), ("gae_g1", "mean_g1", "a critic or a batch mean"),
             ("gae_g2", "grpo_g2", "a critic or the group mean, at G = 2"),
             ("gae_g1", "grpo_g2", "the best G of each"))


def aa_pairs(cells: set[str]) -> list[tuple[str, str, str]]:
    """Cells that are one configuration under two names, (cell, other, label): a cell and its copy at other RL seeds
    (`@seed_offset=N`); tether at G = 1 is gae (a group of one has no mean to blend with, docs/value_functions.md),
    with the same overrides after the name."""
    out = []
    for c in sorted(cells):
        same, offset, _ = c.rpartition("_" + SEED_OFFSET.rstrip("="))
        if offset and same in cells:  # the same cell at other seeds
            out.append((c, same, f"A/A: {c} − {same} (other RL seeds)"))
            continue
        rest = c[len("tether_g1"):]
        if c.startswith("tether_g1") and (rest == "" or rest.startswith("_")) and "gae_g1" + rest in cells:
            out.append((c, "gae_g1" + rest, f"A/A: {c} − gae_g1{rest}"))  # not tether_g16: G = 16 has a mean
    return out


PAIRED_HOW = ("each difference is the mean over the (checkpoint, RL seed) pairs both cells ran, with its 95% "
              "t-interval (Student t, n − 1 df); endpoint: the mean of a run's last 5 held-out evaluations; verdict "
              f"at ±{MARGIN}: equivalent (the whole interval inside ±{MARGIN}), better or worse (it excludes 0), else "
              f"inconclusive; SD of the pairs, and the seeds that SD needs to resolve ±{MARGIN} with 80% power; mean "
              "accuracy over tokens 0..X: the area under the accuracy-vs-tokens curve over a range X common to the "
              "table, divided by X, the warm-start stretch counted at the start accuracy; thresholds: the "
              "reference's start plus 25/50/75/100% of its gain to its endpoint, crossings interpolated between "
              "evaluations; tokens and CPU seconds include every warm start ('-' where no record keeps the costs per "
              "evaluation). Below the cells: contrasts, and the A/A rows (one configuration under two names: its "
              "true difference is 0).")


def paired_section(runs: list[dict], explain: bool = True) -> list[str]:
    """Every cell against the reference cell, paired by (checkpoint, RL seed), then the contrasts and the A/A pairs
    (bench/budget_stats.py)."""
    reference = reference_cell(runs)
    cells = {r["cell"] for r in runs}
    extra = [(a, b, f"{a} − {b} ({why})") for a, b, why in CONTRASTS if a in cells and b in cells] + aa_pairs(cells)
    return [f"Paired by seed against {reference} (the critic study protocol, docs/benchmarks.md)"
            + (f": {PAIRED_HOW}" if explain else ":"), "", *paired_table(runs, reference, MARGIN, tuple(extra))]


def stamps_line(runs: list[dict], records: Path) -> str:
    """What the records of one checkpoint carry: the stamps they lack (named, not guessed) and whether the
    checkpoint's base is kept."""
    missing = unstamped(runs)
    ckpts = sorted({r["ckpt"] for r in runs})
    kept = [c for c in ckpts if base_done(records / f"ckpt{c}" / "base")]
    text = (f"{len(runs)} records **unstamped**: they lack " + ", ".join(f"{k} ({n})" for k, n in missing.items())
            if missing else f"{len(runs)} records, each stamped with {', '.join(STAMPS)}")
    commits = sorted({r["commit"] for r in runs if r.get("commit")})
    dates = sorted({r["date"] for r in runs if r.get("date")})
    if commits:
        text += f"; commits {', '.join(commits)}"
    if dates:
        text += f"; dates {dates[0]}{' to ' + dates[-1] if len(dates) > 1 else ''}"
    lost = [c for c in ckpts if c not in kept]
    bases = [f"kept for {', '.join(kept)}"] if kept else []
    bases += [f"not kept for {', '.join(lost)}"] if lost else []
    return text + f". Base {'; '.join(bases)} (`<records>/ckpt<C>-<sha>/base`)."


def cells_table(runs: list[dict]) -> list[str]:
    """Per cell: runs and seeds, start, endpoint and final accuracy (mean and SD over seeds), warm-start tokens."""
    from bench.budget_stats import run_endpoint, warm_start_tokens

    def ms(xs):
        xs = [x for x in xs if x is not None]
        if not xs:
            return "-"
        return f"{statistics.fmean(xs):.3f}" + (f" (SD {statistics.stdev(xs):.3f})" if len(xs) > 1 else "")

    lines = ["| cell | prompts x G | runs (seeds) | start acc | endpoint (last 5 evals) | final acc | "
             "warm-start tokens | tokens at the end |", "|---|---|---|---|---|---|---|---|"]
    order = {k: i for i, k in enumerate(KINDS)}
    by: dict[str, list[dict]] = defaultdict(list)
    for r in runs:
        by[r["cell"]].append(r)
    for name, rs in sorted(by.items(), key=lambda kv: (order.get(kv[1][0]["kind"], 99), -kv[1][0]["group_size"],
                                                         kv[0])):
        lines.append(f"| {name} | {rs[0]['prompts_per_step']} x {rs[0]['group_size']} | {len(rs)} "
                     f"({','.join(str(r['seed']) for r in sorted(rs, key=lambda r: (r['ckpt'], r['seed'])))}) | "
                     f"{ms(r['start_accuracy'] for r in rs)} | {ms(run_endpoint(r) for r in rs)} | "
                     f"{ms(r['final_accuracy'] for r in rs)} | "
                     f"{statistics.fmean(warm_start_tokens(r) for r in rs):,.0f} | "
                     f"{statistics.fmean(r['tokens_final'] for r in rs):,.0f} |")
    return lines


def restate(records_root: Path = ROOT / "bench" / "records") -> str:
    """Every committed grid under the protocol, from its records alone: every experiment's grids under
    bench/records/<experiment>/ckpt* (per grid parameters and checkpoint, then the cells run on every checkpoint
    pooled) and the SmolLM2 grid (bench/smollm_grid.py's report)."""
    lines = ["# The critic study's grids under the protocol", "",
             "`python -m bench.equal_budget --restate` (from the committed records alone; docs/benchmarks.md, "
             "\"The critic study protocol\"). Per checkpoint: the cells, then every cell paired by seed against the "
             "reference (grpo at G = 8 at its best learning rate; the batch mean at G = 1 in a grid without it), "
             f"the contrasts, and the A/A cell where a grid has one. In the paired tables {PAIRED_HOW}"]
    gridded = sorted(p.name for p in records_root.iterdir() if p.is_dir() and any(p.glob("ckpt*/*/seed*.json")))
    for experiment in gridded:  # arith, arith_work, arith_chain, guess, ...
        folder = records_root / experiment
        grids: dict[str, list[dict]] = defaultdict(list)
        for path in sorted(folder.glob("ckpt*/*/seed*.json")):
            rec = json.loads(path.read_text())
            grids[json.dumps(rec.get("grid"), sort_keys=True)].append(rec)
        for key, runs in grids.items():
            grid = json.loads(key)
            shas = sorted({r["ckpt"] for r in runs}, key=lambda c: (int(c.split("-")[0]), c))
            lines += ["", f"## {experiment}", "",
                      f"{grid['rollouts']} rollouts a step, {grid['steps']} policy steps, {grid['heldout']} held-out "
                      f"problems every {grid['eval_every']} steps; records under `bench/records/{experiment}/`."]
            parts = [(c, [r for r in runs if r["ckpt"] == c]) for c in shas]
            if len(shas) > 1:
                everywhere = [r for r in runs if all(any(x["cell"] == r["cell"] and x["ckpt"] == c for x in runs)
                                                     for c in shas)]
                parts.append((" and ".join(shas) + " pooled (the cells run on each)", everywhere))
            for name, mine in parts:
                lines += ["", f"### Checkpoint {name}", "", stamps_line(mine, folder), "", *cells_table(mine), "",
                          *paired_section(mine, explain=False)]
        ran = {r["ckpt"] for runs in grids.values() for r in runs}
        idle = sorted(b.parent.name[len("ckpt"):] for b in folder.glob("ckpt*/base") if b.parent.name[4:] not in ran)
        if idle:
            lines += ["", f"Kept bases of {experiment} without runs: {', '.join(idle)}."]
    smollm = records_root / "smollm"
    if smollm.is_dir():
        from bench import smollm_grid

        lines += ["", "## smollm (SmolLM2-135M on chain_sum, 32 rollouts a step, 30 minutes)", "",
                  smollm_grid.report(smollm, "gae_g1")]
    return "\n".join(lines) + "\n"


def report(out: Path, command: str, records: Path, key: dict) -> dict:
    """The table, goals and plot per checkpoint, then (several checkpoints) over the cells run on every one;
    returns the summary over all checkpoints (the only one's when there is one)."""
    sync_records(out, records, key)
    runs, other = load_records(records, key)
    shas = sorted({r["ckpt"] for r in runs}, key=lambda c: int(c.split("-")[0]))
    lines = ["# Equal budget: held-out accuracy per generated token", "", f"`{command}`", "",
             f"{len(runs)} finished runs recorded under `{records}` (checkpoints {', '.join(shas) or '-'}"
             f"{f'; {other} records of other grid parameters left out' if other else ''}). Target: the mean final "
             "held-out accuracy of the reference cell's runs of the same checkpoint (grpo at G = 8 at its best "
             "learning rate of the grid: the grpo_g8 variant with the highest mean final accuracy); tokens to target "
             "= generated policy tokens (rollout log, every rollout, plus "
             "the critic's warm start) behind the first evaluation at or above it (a run that never reaches it "
             f"counts its whole budget). Smoothed: the same with every accuracy the mean of its evaluation and the "
             f"{SMOOTH - 1} before it (target: the reference's mean of its last {SMOOTH}), less at the mercy of one "
             "evaluation's noise. Critic EV: pooled over each run's last 10 batches. All-equal groups: the "
             "fraction of groups (G >= 2) whose rewards are all equal, mean over the run's batches.",
             "", stamps_line(runs, records)]
    for c in shas if len(shas) > 1 else []:
        mine = [dict(r) for r in runs if r["ckpt"] == c]
        part = summarize(mine)
        plot(mine, part, out / f"equal_budget_ckpt{c}.png")
        lines += ["", f"## Checkpoint {c}", "", table(part), "", *[f"- {g}" for g in goals(part)], "",
                  *paired_section(mine), "", f"![accuracy vs tokens, checkpoint {c}](equal_budget_ckpt{c}.png)"]
    everywhere = [r for r in runs if all(any(x["cell"] == r["cell"] and x["ckpt"] == c for x in runs)
                                         for c in shas)]
    summary = summarize(everywhere)
    lines += ["", f"## {'Over checkpoints ' + ', '.join(shas) + ' (cells run on each)' if len(shas) > 1 else 'Table'}",
              "", table(summary), "", *[f"- {g}" for g in goals(summary)], "", *paired_section(everywhere)]
    if everywhere:
        plot(everywhere, summary, out / "equal_budget.png")
        lines += ["", "![accuracy vs tokens](equal_budget.png)"]
    (out / "equal_budget.md").write_text("\n".join(lines) + "\n")
    (out / "equal_budget.json").write_text(json.dumps({"command": command, "summary": summary, "runs": runs},
                                                      indent=1) + "\n")
    print("\n".join(lines))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="grid directory (rerun with the same one to continue); required "
                                                 "but with --restate")
    ap.add_argument("--restate", action="store_true",
                    help="print every committed grid (bench/records: arith, arith_work, arith_chain, smollm) under "
                         "the critic study protocol, from the records alone; with --out also <out>/restated.md")
    ap.add_argument("--experiment", default="arith", help="+experiment=<this> for every run (default arith)")
    ap.add_argument("--cells", default=DEFAULT_CELLS, help=f"<kind>:<G>,... (default {DEFAULT_CELLS})")
    ap.add_argument("--rollouts", type=int, default=128, help="rollouts per policy step, prompts x G (default 128)")
    ap.add_argument("--steps", type=int, default=200, help="policy steps per run (default 200)")
    ap.add_argument("--eval-every", type=int, default=10, help="policy steps between held-out evaluations")
    ap.add_argument("--heldout", type=int, default=500, help="task.heldout_size (default 500)")
    common.add_seeds(ap, "0", "RL seeds")
    common.add_seeds(ap, "0", "checkpoint (warm-start) seeds", flag="--ckpt-seeds")
    ap.add_argument("--records", default=None,
                    help="directory of the per-run records (default bench/records/<experiment>, committed; "
                         "--smoke: <out>/records)")
    ap.add_argument("--lock", default="/tmp/pv-heavy.lock", help="heavy-work lock file held per run ('' = none)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds one run may take")
    common.add_stop_after(ap)
    ap.add_argument("--report-only", action="store_true", help="write the table and plot from what is there")
    ap.add_argument("--smoke", action="store_true", help="tiny model, untrained version 0 (tests)")
    ap.add_argument("overrides", nargs="*", help="more key=value overrides for every run")
    args = ap.parse_args(argv)
    if args.restate:
        text = restate()
        print(text, end="")
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / "restated.md").write_text(text)
        return 0
    if not args.out:
        ap.error("--out is required (but with --restate)")
    args.lock = args.lock or None
    cells = parse_cells(args.cells, args.rollouts)
    overrides_all = [f"+experiment={args.experiment}", f"task.heldout_size={args.heldout}",
                     *(SMOKE if args.smoke else []), *args.overrides]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    args.records = args.records or str(out / "records" if args.smoke else ROOT / "bench" / "records" / args.experiment)
    command = common.command_line("equal_budget", argv)
    failures = 0 if args.report_only else run_grid(args, cells, overrides_all)
    report(out, command, Path(args.records), grid_key(args))
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
