"""`python -m prime_values.tools.check <run_dir>`: verify the invariants of a run directory (docs/design.md §2).

Read-only. Prints one line per violation and exits 1, or prints a one-line OK summary and exits 0 (2: not a
run directory). What is checked is what the roles actually guarantee (read from `prime_values/roles/`):

- segments: every published segment (`log/<stream>/<shard>/<seq>.arrow`) decodes and verifies with
  `read_segment` as its stream's kind; quarantined segments (`log/quarantine/`) are counted, not read.
- rollouts: ids unique across the log, per-token columns as long as `token_ids`, and per inference shard the
  `policy_version` never decreases in seq order (an inference worker only adopts newer policies).
- batches: batch `n` is segment `n - 1` of its shard and all its rows carry step `n`; steps are 1..N without
  gap or duplicate, N <= `steps`; each batch holds `prompts_per_step` complete groups of `group_size`; every
  rollout in a batch exists in the rollout log with the same tokens and policy version, appears in no other
  batch row, and is admissible: 0 <= (n - 1) - policy_version <= `resolved.max_off_policy` (the run's bound:
  schedule.max_off_policy, 0 under lockstep); with a critic, its `critic_version` is one a values record of that
  rollout carries.
- values: every record's rollout exists, `values` is exactly as long as the rollout's `token_ids`,
  `valued_tokens` is all of them unless `cut`; per values shard `critic_version` never decreases in seq
  order (the evaluator adopts only newer critics, and restarts from LATEST). Several records for one rollout
  are allowed: the evaluator re-scores what it had not committed when it died.
- targets: every record's rollout exists and its per-token columns match the rollout's length.
- images (a task with pictures, task=vision): every image a rollout refers to (its `images` column, content
  hashes) is in the run's image store (`log/images/<h[:2]>/<h>.png`, log/images.py) and its bytes hash to its
  name; every batch and targets row carries exactly its rollout's images.
- pairing by identity: each values and targets record's `token_digest` (log.records.token_digest) is that of its
  rollout's tokens, so values were computed on, and targets joined with, the very rollout whose id they carry.
  Records without one (schema_version < 3, read with `--allow-old-schema`) are counted as not verifiable.
- weights (`policy`, `critic`): LATEST is a number naming an existing version directory; every version
  directory is complete (config.json and a safetensors/bin weights file); version 0 is kept; LATEST is the
  newest complete version (a newer directory is only noted: a publisher died between rename and LATEST, and
  its successor replaces it); rollouts' policy versions and values' critic versions are <= LATEST; policy
  LATEST <= the last batch step and equals the policy trainer's batch cursor (or one more, if it died between
  publishing and committing); a finished run (`state/policy_trainer/done`) has LATEST = last step = `steps`.
- cursors: each `log/cursors/<consumer>.json` is valid JSON and each `next_seq` is within
  0 .. highest seq + 1 of its shard (published or quarantined).

With log retention configured (`log.keep_segments` / `log.max_age_s`), a reference into a leading run of
deleted segments that every consumer had passed is counted as unverifiable, not as a violation. Streams are
read batches -> targets -> values -> rollouts -> weights, so a live run checks consistently too (a consumer's
input is always read after its output).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from prime_values.log.images import IMAGES_DIR, ImageError, ImageStore
from prime_values.log.records import SCHEMA_VERSION, token_digest
from prime_values.log.segments import (
    CorruptSegment,
    NewerSchemaVersion,
    list_seqs,
    quarantine_dir,
    read_segment,
    segment_name,
    verify_checksum,
)

STREAMS = ("batches", "targets", "values", "rollouts")  # the order they are read in (see the module doc)
_ROLLOUT_ID = re.compile(r"^(?P<shard>.+)-(?P<seq>\d{6})-\d{4}$")  # inference's `<shard>-<chunk>-<k>`
_WEIGHT_FILES = (".safetensors", ".bin")


@dataclass
class Result:
    run: Path
    violations: list[tuple[str, str]] = field(default_factory=list)  # (kind, message)
    notes: list[str] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violation(self, kind: str, message: str) -> None:
        self.violations.append((kind, message))

    def lines(self, limit: int = 0) -> list[str]:
        """One line per violation (at most `limit` per kind, 0 = all) and a one-line summary."""
        out, shown = [], Counter()
        for kind, message in self.violations:
            shown[kind] += 1
            if not limit or shown[kind] <= limit:
                out.append(f"VIOLATION [{kind}] {message}")
        for kind, n in shown.items():
            if limit and n > limit:
                out.append(f"VIOLATION [{kind}] ... and {n - limit} more")
        c = self.counts
        what = (f"{c['steps']} batch steps, {c['rollouts']} rollouts in {c['segments_rollouts']} segments, "
                f"{c['values']} values records, {c['targets']} targets records ({c['paired']} values/targets "
                f"records paired with their rollout by token digest), policy LATEST "
                f"{c.get('policy_latest', '-')}, critic LATEST {c.get('critic_latest', '-')}, "
                f"{c['cursors']} cursors, {c['quarantined']} quarantined segments"
                + (f", {c['images']} images" if c["images"] else ""))
        notes = f"; notes: {'; '.join(self.notes)}" if self.notes else ""
        if self.violations:
            kinds = ", ".join(f"{k} x{n}" for k, n in shown.items())
            out.append(f"FAILED {self.run}: {len(self.violations)} violations ({kinds}); checked {what}{notes}")
        else:
            out.append(f"OK {self.run}: {what}{notes}")
        return out


def _cfg_get(cfg, dotted: str, default=None):
    node = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def _load_config(run: Path, res: Result) -> dict:
    path = run / "config.yaml"
    if not path.exists():
        res.notes.append("no config.yaml: batch size, staleness and step-count checks skipped")
        return {}
    from omegaconf import OmegaConf

    from prime_values.config import load_saved

    try:  # load_saved: derived facts (resolved.*) an old run's file lacks are derived there, never here
        return OmegaConf.to_container(load_saved(path), resolve=True)
    except Exception as e:  # noqa: BLE001 - an unreadable config is reported, never a crash
        res.violation("config", f"{path} cannot be read ({type(e).__name__}: {e})")
        return {}


def _old_schema_table(path: Path, kind: str) -> tuple[int, pa.Table] | None:
    """A segment an older Prime Values wrote: (its schema version, its table) when it is intact (checksum and
    row count verify), else None. Only for checking old run directories (`--allow-old-schema`)."""
    data = path.read_bytes()
    try:
        reader = pa.ipc.open_file(pa.py_buffer(data))
        meta = {k.decode(): v.decode() for k, v in (reader.schema.metadata or {}).items()}
        version = int(meta.get("pv.schema_version", "-1"))
        if not 1 <= version < SCHEMA_VERSION or meta.get("pv.kind") != kind:
            return None
        verify_checksum(path, data, meta)  # the log's own check (raises CorruptSegment)
        table = reader.read_all()
        if str(table.num_rows) != meta.get("pv.rows"):
            return None
        return version, table
    except Exception:  # noqa: BLE001
        return None


def _lengths(table: pa.Table, column: str) -> np.ndarray:
    return pc.list_value_length(table.column(column).combine_chunks()).to_numpy(zero_copy_only=False)


def _crcs(table: pa.Table, column: str, digest=lambda tokens: zlib.crc32(tokens.tobytes())) -> list[int]:
    """CRC32 (or `digest`) of each row's list of a list column (identifies token lists without holding them)."""
    arr = table.column(column).combine_chunks()
    offsets, values = arr.offsets.to_numpy(), arr.values.to_numpy(zero_copy_only=False)
    return [digest(values[offsets[i]: offsets[i + 1]]) for i in range(len(arr))]


def _digests(table: pa.Table) -> list[int | None]:
    """Each record's token_digest; None for records written before digests (schema_version < 3)."""
    if "token_digest" not in table.column_names:
        return [None] * table.num_rows
    return table.column("token_digest").to_pylist()


class Checker:
    def __init__(self, run_dir: str | os.PathLike, allow_old_schema: bool = False):
        self.run = Path(run_dir)
        self.log = self.run / "log"
        self.allow_old_schema = allow_old_schema
        self.res = Result(self.run)
        self.old_schema: Counter = Counter()  # stream -> segments written with an older schema version
        # what the streams hold, filled while reading
        self.rollouts: dict[str, tuple[int, int, int]] = {}  # id -> (n_tokens, policy_version, crc(token_ids))
        self.group_of: dict[str, str] = {}  # rollout id -> group id
        self.values: dict[str, list[int]] = defaultdict(list)  # rollout id -> critic versions of its records
        self.batch_refs: list[tuple[int, str, int, int, int, int]] = []  # (step, id, n, pv, cv, crc)
        self.target_refs: list[tuple[str, int, int, int | None]] = []  # (id, n, crc(token_ids), token_digest)
        self.value_refs: list[tuple] = []  # (id, n_values, valued_tokens, cut, seq, shard, token_digest)
        self.digest_of: dict[str, int] = {}  # rollout id -> token_digest(token_ids)
        self.images_of: dict[str, tuple[str, ...]] = {}  # rollout id -> its images (content hashes), if any
        self.image_refs: list[tuple[str, str, tuple[str, ...]]] = []  # (where, id, images) of batches, targets
        self.max_policy_version = self.max_critic_version = -1
        self.highest: dict[tuple[str, str], int] = {}  # (stream, shard) -> highest seq, quarantined included
        self.lowest: dict[tuple[str, str], int] = {}  # (stream, shard) -> lowest published seq

    # --- reading ------------------------------------------------------------------------------------------
    def shards(self, stream: str) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.log / stream) if e.is_dir() and not e.name.startswith("."))
        except FileNotFoundError:
            return []

    def segments(self, stream: str):
        """(shard, seq, table) of every readable published segment, each shard in seq order."""
        stream_dir = self.log / stream
        for shard in self.shards(stream):
            seqs = list_seqs(stream_dir / shard)
            quarantined = list_seqs(quarantine_dir(stream_dir, shard))
            self.res.counts["quarantined"] += len(quarantined)
            self.highest[(stream, shard)] = max(seqs + quarantined, default=-1)
            if seqs:
                self.lowest[(stream, shard)] = seqs[0]
            leftovers = list((stream_dir / shard).glob(".*.arrow.tmp"))
            if leftovers:
                self.res.notes.append(f"{len(leftovers)} unpublished temp file(s) in log/{stream}/{shard} (a writer "
                                      "died mid-append; invisible to readers, removed by its next writer)")
            for seq in seqs:
                path = stream_dir / shard / segment_name(seq)
                table = self.read(stream, path)
                if table is not None:
                    self.res.counts[f"segments_{stream}"] += 1
                    yield shard, seq, table

    def read(self, stream: str, path: Path) -> pa.Table | None:
        rel = path.relative_to(self.run)
        try:
            return read_segment(path, stream)
        except FileNotFoundError:
            self.res.notes.append(f"{rel} vanished while checking (retention or quarantine in a live run)")
        except NewerSchemaVersion as e:
            self.res.violation("segment", f"{rel} is unreadable: {e.reason}")
        except CorruptSegment as e:
            old = _old_schema_table(path, stream) if "unsupported or missing schema_version" in e.reason else None
            if old is not None:
                self.old_schema[stream] += 1
                self.old_version = old[0]
                return old[1]
            self.res.violation("segment", f"{rel} is torn or unreadable outside quarantine: {e.reason}")
        except OSError as e:
            self.res.violation("segment", f"{rel} cannot be read: {e}")
        return None

    # --- retention --------------------------------------------------------------------------------------
    def retained_away(self, stream: str, shard: str, seq: int) -> bool:
        """True when segment `seq` of a shard is gone because retention deleted it: retention is configured,
        the seq precedes the shard's oldest published segment and every consumer of the stream passed it."""
        if not self.retention:
            return False
        if seq >= self.lowest.get((stream, shard), 0):
            return False
        passed = [c[stream].get(shard, 0) for c in self.cursor_data.values() if stream in c]
        return bool(passed) and seq < min(passed)

    def rollout_retained_away(self, rollout_id: str) -> bool:
        m = _ROLLOUT_ID.match(rollout_id)
        return bool(m) and self.retained_away("rollouts", m["shard"], int(m["seq"]))

    def missing_rollout(self, where: str, rollout_id: str) -> None:
        if self.rollout_retained_away(rollout_id):
            self.res.counts["unverifiable_retention"] += 1
        else:
            self.res.violation("missing-rollout", f"{where} references rollout {rollout_id!r}, which is not in the "
                                                  "rollout log")

    # --- the checks -------------------------------------------------------------------------------------
    def run_checks(self) -> Result:
        res = self.res
        self.cfg = _load_config(self.run, res)
        self.retention = _cfg_get(self.cfg, "log.keep_segments") is not None or \
            _cfg_get(self.cfg, "log.max_age_s") is not None
        self.read_cursors()
        self.read_batches()
        self.read_targets()
        self.read_values()
        self.read_rollouts()
        self.check_cursors()
        self.check_batches()
        self.check_values_and_targets()
        self.check_images()
        self.check_weights()
        if self.old_schema:
            where = ", ".join(f"{n} in log/{stream}" for stream, n in self.old_schema.items())
            message = (f"{sum(self.old_schema.values())} segments were written with schema_version "
                       f"{self.old_version} ({where}); this Prime Values reads only schema_version {SCHEMA_VERSION} "
                       "(its readers would quarantine them)")
            if self.allow_old_schema:
                res.notes.append(message + "; checked leniently")
            else:
                res.violation("segment", message + "; rerun with --allow-old-schema to check their content")
        if res.counts["unverifiable_retention"]:
            res.notes.append(f"{res.counts['unverifiable_retention']} references into segments deleted by log "
                             "retention not verifiable")
        return res

    def read_cursors(self) -> None:
        self.cursor_data: dict[str, dict] = {}
        cursor_dir = self.log / "cursors"
        paths = sorted(p for p in cursor_dir.glob("*.json") if not p.name.startswith(".")) \
            if cursor_dir.is_dir() else []
        for path in paths:
            try:
                data = json.loads(path.read_text())
                if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
                    raise ValueError("not a {stream: {shard: next_seq}} object")
            except (OSError, ValueError) as e:
                self.res.violation("cursor", f"log/cursors/{path.name} is unreadable ({e})")
                continue
            self.cursor_data[path.stem] = data
        self.res.counts["cursors"] = len(self.cursor_data)

    def check_cursors(self) -> None:
        for consumer, data in self.cursor_data.items():
            for stream, shards in data.items():
                if stream not in STREAMS:
                    self.res.violation("cursor", f"log/cursors/{consumer}.json has a cursor for unknown stream "
                                                 f"{stream!r}; streams are {', '.join(STREAMS)}")
                    continue
                for shard, next_seq in shards.items():
                    highest = self.highest.get((stream, shard), -1)
                    if not isinstance(next_seq, int) or isinstance(next_seq, bool) or next_seq < 0:
                        self.res.violation("cursor", f"log/cursors/{consumer}.json: {stream}/{shard} next_seq "
                                                     f"{next_seq!r} is not a seq (an integer >= 0)")
                    elif next_seq > highest + 1:
                        self.res.violation("cursor", f"log/cursors/{consumer}.json: {stream}/{shard} next_seq "
                                                     f"{next_seq} is past the end of the shard (highest seq "
                                                     f"{highest}, so at most {highest + 1})")

    def read_batches(self) -> None:
        self.batch_segments: dict[int, list[tuple[str, int]]] = defaultdict(list)  # step -> [(shard, seq)]
        group_size = _cfg_get(self.cfg, "inference.group_size")
        prompts = _cfg_get(self.cfg, "inference.prompts_per_step")
        for shard, seq, table in self.segments("batches"):
            where = f"log/batches/{shard}/{segment_name(seq)}"
            steps = set(table.column("step").to_pylist())
            if steps != {seq + 1}:
                self.res.violation("step", f"{where} must hold batch step {seq + 1} (batch n is segment n - 1) "
                                           f"but its rows carry step(s) {sorted(steps)}")
            for step in steps:
                self.batch_segments[step].append((shard, seq))
            step = seq + 1
            if group_size and prompts and table.num_rows != group_size * prompts:
                self.res.violation("batch-size", f"{where} has {table.num_rows} rows; a batch is "
                                                 f"prompts_per_step x group_size = {prompts * group_size}")
            n = self.check_token_lengths(table, where, "batch-length",
                                         ("policy_mask", "sampling_logprobs", "advantages"))
            ids = table.column("rollout_id").to_pylist()
            self.batch_refs += zip([step] * len(ids), ids, n.tolist(), table.column("policy_version").to_pylist(),
                                   table.column("critic_version").to_pylist(), _crcs(table, "token_ids"))
            self.read_image_refs(table, f"batch step {step}")

    def check_batches(self) -> None:
        res = self.res
        steps = sorted(self.batch_segments)
        res.counts["steps"] = len(steps)
        for step, where in sorted(self.batch_segments.items()):
            if len(where) > 1:
                res.violation("step", f"batch step {step} appears in {len(where)} segments: "
                                      + ", ".join(f"log/batches/{s}/{segment_name(q)}" for s, q in where))
        last = steps[-1] if steps else 0
        first = 1
        if steps and steps[0] > 1 and all(self.retained_away("batches", s, steps[0] - 2)
                                          for s in self.shards("batches")):
            first = steps[0]  # earlier batches were deleted by retention after the policy trainer passed them
            res.notes.append(f"batch steps 1..{first - 1} deleted by log retention")
        present = set(steps)
        for step in range(first, last + 1):
            if step not in present:
                in_quarantine = any((quarantine_dir(self.log / "batches", s) / segment_name(step - 1)).exists()
                                    for s in self.shards("batches"))
                res.violation("step", f"batch step {step} is missing (steps must run 1..{last} without gaps)"
                              + ("; its segment is in quarantine" if in_quarantine else ""))
        cfg_steps = _cfg_get(self.cfg, "steps")
        if cfg_steps is not None and last > cfg_steps:
            res.violation("step", f"batch step {last} exceeds the run's steps={cfg_steps}")
        self.last_step = last

        max_off = _cfg_get(self.cfg, "resolved.max_off_policy")  # the bound the run enforced (lockstep: 0)
        used_in: dict[str, list[int]] = defaultdict(list)
        for step, rid, *_ in self.batch_refs:
            used_in[rid].append(step)
        for rid, where in used_in.items():
            if len(where) > 1:
                res.violation("duplicate-rollout", f"rollout {rid!r} appears {len(where)} times in batches (steps "
                                                   f"{', '.join(map(str, sorted(where)))}); each rollout may train "
                                                   "the policy once")
        group_size = _cfg_get(self.cfg, "inference.group_size")
        groups: dict[int, Counter] = defaultdict(Counter)  # step -> group id -> rollouts of it in the batch
        for step, rid, n, pv, cv, crc in self.batch_refs:
            rollout = self.rollouts.get(rid)
            if rid in self.group_of:
                groups[step][self.group_of[rid]] += 1
            if rollout is None:
                self.missing_rollout(f"batch step {step}", rid)
            elif (n, pv, crc) != rollout:
                diff = "token_ids" if (n, crc) != rollout[::2] else f"policy_version {pv} (log: {rollout[1]})"
                res.violation("batch-rollout", f"batch step {step}: rollout {rid!r} differs from the rollout log in "
                                               f"{diff}")
            staleness = (step - 1) - pv
            if staleness < 0 or (max_off is not None and staleness > max_off):
                res.violation("staleness", f"batch step {step}: rollout {rid!r} from policy version {pv} is "
                                           f"{staleness} steps stale; admissible is 0..{max_off} "
                                           "(schedule.max_off_policy)")
            if cv >= 0:
                if rid in self.values and cv not in self.values[rid]:
                    res.violation("batch-values", f"batch step {step}: rollout {rid!r} carries critic_version {cv} "
                                                  f"but its values records have {sorted(set(self.values[rid]))}")
                elif rid not in self.values:
                    if self.retention and any(self.lowest.get(("values", s), 0) > 0 for s in self.shards("values")):
                        res.counts["unverifiable_retention"] += 1  # its values segment may be the deleted one
                    else:
                        res.violation("batch-values", f"batch step {step}: rollout {rid!r} was batched with critic "
                                                      f"version {cv} but has no values record")

        for step, counts in sorted(groups.items()) if group_size else ():
            partial = {g: n for g, n in counts.items() if n != group_size}
            for g, n in sorted(partial.items())[:1]:
                res.violation("batch-size", f"batch step {step}: group {g!r} has {n} rollouts in the batch, not "
                                            f"inference.group_size={group_size} ({len(partial)} such group(s))")

    def check_token_lengths(self, table: pa.Table, where: str, kind: str, columns: tuple[str, ...]) -> np.ndarray:
        """Every per-token column as long as token_ids, row by row; returns the token_ids lengths."""
        n = _lengths(table, "token_ids")
        for column in columns:
            bad = np.flatnonzero(_lengths(table, column) != n)
            if len(bad):
                self.res.violation(kind, f"{where}: {column} of {len(bad)} row(s) is not as long as token_ids "
                                         f"(first: row {bad[0]})")
        return n

    def read_targets(self) -> None:
        for shard, seq, table in self.segments("targets"):
            where = f"log/targets/{shard}/{segment_name(seq)}"
            n = self.check_token_lengths(table, where, "targets-length", ("policy_mask", "values", "value_targets"))
            self.target_refs += zip(table.column("rollout_id").to_pylist(), n.tolist(), _crcs(table, "token_ids"),
                                    _digests(table))
            self.read_image_refs(table, where)
            self.res.counts["targets"] += table.num_rows

    def read_values(self) -> None:
        for shard, seq, table in self.segments("values"):
            ids = table.column("rollout_id").to_pylist()
            versions = table.column("critic_version").to_pylist()
            n = _lengths(table, "values").tolist()
            cut = table.column("cut").to_pylist()
            valued = table.column("valued_tokens").to_pylist() if "valued_tokens" in table.column_names else n
            previous = self.__dict__.setdefault("_last_critic", {}).get(shard)
            if previous is not None and min(versions, default=previous[0]) < previous[0]:
                self.res.violation("critic-version", f"log/values/{shard}/{segment_name(seq)} has critic_version "
                                                     f"{min(versions)} after {previous[0]} in "
                                                     f"{segment_name(previous[1])}; an evaluator only adopts newer "
                                                     "critic versions")
            if any(b < a for a, b in zip(versions, versions[1:])):
                self.res.violation("critic-version", f"log/values/{shard}/{segment_name(seq)}: critic_version "
                                                     "decreases within the segment")
            if versions:
                self._last_critic[shard] = (max(versions), seq)
                self.max_critic_version = max(self.max_critic_version, max(versions))
            for rid, v, k, c, m, d in zip(ids, versions, n, cut, valued, _digests(table)):
                self.values[rid].append(v)
                self.value_refs.append((rid, k, m, c, seq, shard, d))
            self.res.counts["values"] += table.num_rows

    def read_rollouts(self) -> None:
        last_version: dict[str, tuple[int, int]] = {}
        for shard, seq, table in self.segments("rollouts"):
            where = f"log/rollouts/{shard}/{segment_name(seq)}"
            n = self.check_token_lengths(table, where, "rollout", ("policy_mask", "sampling_logprobs"))
            versions = table.column("policy_version").to_pylist()
            if versions:
                low = min(versions)
                if shard in last_version and low < last_version[shard][0]:
                    self.res.violation("policy-version", f"{where} has policy_version {low} after "
                                                         f"{last_version[shard][0]} in "
                                                         f"{segment_name(last_version[shard][1])}; an inference "
                                                         "worker only adopts newer policy versions")
                last_version[shard] = (max(versions), seq)
                self.max_policy_version = max(self.max_policy_version, max(versions))
            for rid, k, pv, crc, group, digest in zip(table.column("rollout_id").to_pylist(), n.tolist(), versions,
                                                      _crcs(table, "token_ids"), table.column("group_id").to_pylist(),
                                                      _crcs(table, "token_ids", token_digest)):
                if rid in self.rollouts:
                    self.res.violation("rollout", f"rollout id {rid!r} appears twice in the rollout log "
                                                  f"(again in {where}); ids must be unique")
                self.rollouts[rid] = (k, pv, crc)
                self.group_of[rid] = group
                self.digest_of[rid] = digest
            if "images" in table.column_names:
                for rid, images in zip(table.column("rollout_id").to_pylist(), table.column("images").to_pylist()):
                    if images:
                        self.images_of[rid] = tuple(images)
        self.res.counts["rollouts"] = len(self.rollouts)

    def check_pairing(self, where: str, rid: str, digest: int | None) -> None:
        """A values or targets record carries the token digest of the rollout whose id it carries."""
        if digest is None:
            self.res.counts["undigested"] += 1
        elif digest == self.digest_of[rid]:
            self.res.counts["paired"] += 1
        else:
            self.res.violation("pairing", f"{where}: the record of rollout {rid!r} carries token_digest {digest:#x}, "
                                          f"but that rollout's tokens digest to {self.digest_of[rid]:#x}: it was "
                                          "computed on (or joined with) another rollout's tokens")

    def read_image_refs(self, table: pa.Table, where: str) -> None:
        """A batches or targets segment's rows with the images they carry (checked against their rollouts')."""
        if "images" in table.column_names:
            self.image_refs += [(where, rid, tuple(images or ())) for rid, images in
                                zip(table.column("rollout_id").to_pylist(), table.column("images").to_pylist())]

    def check_images(self) -> None:
        store, checked = ImageStore(self.log / IMAGES_DIR), set()
        for rid, images in self.images_of.items():
            for digest in images:
                if digest in checked:
                    continue
                checked.add(digest)
                try:
                    store.get(digest)
                except ImageError as error:
                    self.res.violation("image", f"rollout {rid!r}: {error}")
        self.res.counts["images"] = len(checked)
        for where, rid, images in self.image_refs:
            if rid in self.rollouts and images != self.images_of.get(rid, ()):
                self.res.violation("image", f"{where}: the row of rollout {rid!r} carries images "
                                            f"{[h[:12] for h in images]}, its rollout "
                                            f"{[h[:12] for h in self.images_of.get(rid, ())]}: it would train on "
                                            "another picture")

    def check_values_and_targets(self) -> None:
        for rid, n_values, valued, cut, seq, shard, digest in self.value_refs:
            rollout = self.rollouts.get(rid)
            where = f"log/values/{shard}/{segment_name(seq)}"
            if rollout is None:
                self.missing_rollout(where, rid)
                continue
            self.check_pairing(where, rid, digest)
            if n_values != rollout[0]:
                self.res.violation("values-length", f"{where}: values record of rollout {rid!r} has {n_values} "
                                                    f"values for a rollout of {rollout[0]} tokens")
            elif valued > n_values or (not cut and valued != n_values):
                self.res.violation("values-length", f"{where}: values record of rollout {rid!r} says "
                                                    f"valued_tokens={valued} (cut={cut}) for {n_values} tokens")
        for rid, n, crc, digest in self.target_refs:
            rollout = self.rollouts.get(rid)
            if rollout is None:
                self.missing_rollout("log/targets", rid)
                continue
            if n != rollout[0]:
                self.res.violation("targets-length", f"log/targets: record of rollout {rid!r} has {n} tokens, the "
                                                     f"rollout {rollout[0]}")
            elif crc != rollout[2]:
                self.res.violation("targets-rollout", f"log/targets: record of rollout {rid!r} holds other token_ids "
                                                      "than the rollout log")
            self.check_pairing("log/targets", rid, digest)
        if self.res.counts["undigested"]:
            self.res.notes.append(f"{self.res.counts['undigested']} values/targets records carry no token_digest "
                                  "(written before schema_version 3): their pairing with a rollout is not verifiable")

    def check_weights(self) -> None:
        for model in ("policy", "critic"):
            root = self.run / "weights" / model
            latest = self.check_weights_dir(model, root)
            if latest is not None:
                self.res.counts[f"{model}_latest"] = latest
            newest_used = self.max_policy_version if model == "policy" else self.max_critic_version
            used_by = "rollouts" if model == "policy" else "values records"
            if newest_used >= 0 and (latest is None or newest_used > latest):
                self.res.violation("weights", f"{used_by} carry {model} version {newest_used} but weights/{model}/"
                                              f"LATEST is {latest}: a version was used before it was published")
        latest = self.res.counts.get("policy_latest")
        if latest is None:
            return
        # batches published since they were read (a live run) count too: batch n precedes policy version n
        last_step = max([self.last_step] + [max(list_seqs(self.log / "batches" / s), default=-1) + 1
                                            for s in self.shards("batches")])
        if latest > last_step:
            self.res.violation("weights", f"weights/policy/LATEST is {latest} but the last batch step is "
                                          f"{last_step}; policy version n is published after batch n")
        cursor, latest_now = self.trainer_cursor_and_latest()
        if cursor is not None and latest_now is not None and not cursor <= latest_now <= cursor + 1:
            self.res.violation("weights", f"weights/policy/LATEST is {latest_now} but the policy trainer's batch "
                                          f"cursor is at {cursor}; it publishes version n, then commits batch n, so "
                                          "LATEST is the cursor or one more")
        if (self.run / "state" / "policy_trainer" / "done").exists():
            steps = _cfg_get(self.cfg, "steps", self.last_step)
            if not latest == self.last_step == steps:
                self.res.violation("weights", f"the policy trainer marked the run done but policy LATEST is {latest}, "
                                              f"the last batch step {self.last_step}, steps={steps}")

    def trainer_cursor_and_latest(self) -> tuple[int | None, int | None]:
        """The policy trainer's batch cursor and policy LATEST at one moment: cursor, LATEST, cursor again until
        the two cursor reads agree (the trainer publishes version n, then commits; a live run moves on)."""
        path, latest_path = self.log / "cursors" / "policy_trainer.json", self.run / "weights" / "policy" / "LATEST"

        def cursor() -> int | None:
            try:
                shards = json.loads(path.read_text()).get("batches", {})
            except (OSError, ValueError, AttributeError):
                return None
            return sum(shards.values()) if shards and all(isinstance(v, int) for v in shards.values()) else None

        for _ in range(10):
            before = cursor()
            try:
                text = latest_path.read_text().strip()
            except OSError:
                return before, None
            if before == cursor():
                return before, int(text) if text.isdigit() else None
        return None, None

    def check_weights_dir(self, model: str, root: Path) -> int | None:
        """Complete version dirs and a LATEST that names one; returns LATEST (None when nothing was published)."""
        if not root.is_dir():
            return None
        rel = f"weights/{model}"

        def listing() -> list[int]:
            return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())

        have = listing()
        try:
            text = (root / "LATEST").read_text().strip()
        except FileNotFoundError:
            if have:
                self.res.violation("weights", f"{rel} has version directories {have[:3]}... but no LATEST pointer")
            return None
        if not text.isdigit():
            self.res.violation("weights", f"{rel}/LATEST holds {text!r}, not a version number")
            return None
        latest = int(text)
        if latest not in have:
            have = listing()  # it may have been published after the first listing (live run)
        if latest not in have:
            self.res.violation("weights", f"{rel}/LATEST points to version {latest}, which has no directory "
                                          f"(versions on disk: {have or 'none'})")
        for v in have:
            files = {p.name for p in (root / str(v)).iterdir()} if (root / str(v)).is_dir() else set()
            missing = [] if "config.json" in files else ["config.json"]
            if not any(f.endswith(_WEIGHT_FILES) for f in files):
                missing.append("a weights file (*.safetensors or *.bin)")
            if missing:
                self.res.violation("weights", f"{rel}/{v} is an incomplete version directory: it lacks "
                                              f"{' and '.join(missing)}")
        if have and 0 not in have:
            self.res.violation("weights", f"{rel}/0 is missing; version 0 is never pruned")
        newer = [v for v in have if v > latest]
        if newer:
            self.res.notes.append(f"{rel}/{newer[0]} is newer than LATEST={latest} (a publisher died before "
                                  "moving LATEST; never adopted, replaced by the next publication)")
        return latest


def check(run_dir: str | os.PathLike, allow_old_schema: bool = False) -> Result:
    """Verify a run directory; the Result lists violations (empty when it is consistent)."""
    return Checker(run_dir, allow_old_schema).run_checks()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m prime_values.tools.check", description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="the run directory (Hydra's output dir) to verify; only read")
    parser.add_argument("--allow-old-schema", action="store_true",
                        help="check segments an older Prime Values wrote (older schema_version) leniently instead "
                             "of reporting them")
    parser.add_argument("--limit", type=int, default=0, help="print at most this many violations per kind (0 = all)")
    args = parser.parse_args(argv)
    run = Path(args.run_dir)
    if not (run / "log").is_dir() and not (run / "weights").is_dir():
        print(f"prime_values.tools.check: {run} is not a run directory (no log/ or weights/); pass the directory "
              "`python -m prime_values` printed as its run directory", file=sys.stderr)
        return 2
    result = check(run, args.allow_old_schema)
    print("\n".join(result.lines(args.limit)))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
