"""Orchestrator: join rollouts with their values, turn them into advantages and value targets, batch them.

Rollouts arrive per group (all completions of one prompt). A group is complete when every rollout has its values
(an estimator that uses the critic) or simply when it has arrived (one that does not). The run's estimator
(advantage.estimator: prime_values/algo/estimators.py) scores each complete group into a `ScoredGroup`: per-token
advantages and, with a critic, value targets; the targets of every complete group go to `log/targets` for the value
trainer, the groups fresh enough for the next step go into batch `n` of `log/batches` (after the estimator's
`finish_batch`: the batch baselines subtract a statistic of the whole batch there): a rollout from policy version v
is admitted to batch n only while (n - 1) - v <= schedule.max_off_policy.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from prime_values.algo.estimators import Estimator, Group
from prime_values.algo.ev import ev_sums
from prime_values.algo.gae import explained_variance, whiten
from prime_values.config.advantage import make_estimator
from prime_values.critic_io import padded
from prime_values.log import to_rows
from prime_values.monitor import Timers
from prime_values.roles.common import RoleContext
from prime_values.rundir import write_atomic
from prime_values.weights import latest_version

if TYPE_CHECKING:
    from prime_values.config import Config


class GroupJoin:
    """Holds rollouts until their group is complete (and, with a critic, until every one has values).

    `done`: rollout ids already used (batched, or dropped for good) — a restarted orchestrator re-reads the log
    from its held position and must not use them twice; values of a done rollout (an evaluator that re-scored
    after its own restart) are ignored."""

    def __init__(self, group_size: int, needs_values: bool, done: set[str] | None = None):
        self.group_size, self.needs_values = group_size, needs_values
        self.values: dict[str, dict] = {}
        self.groups: dict[str, list[dict]] = {}
        self.done: set[str] = done if done is not None else set()
        self.waiting_rollouts = 0

    def add_rollouts(self, rows: list[dict]) -> None:
        for row in rows:
            if row["rollout_id"] not in self.done:
                self.groups.setdefault(row["group_id"], []).append(row)

    def add_values(self, rows: list[dict]) -> None:
        for row in rows:
            if row["rollout_id"] not in self.done:
                self.values[row["rollout_id"]] = row

    def pop_complete(self) -> list[tuple[list[dict], list[dict] | None]]:
        """Complete groups in arrival order, each with its values rows (None without a critic)."""
        complete = []
        for group_id, rollouts in list(self.groups.items()):
            if len(rollouts) < self.group_size:
                continue
            if self.needs_values and not all(r["rollout_id"] in self.values for r in rollouts):
                continue
            values = [self.values.pop(r["rollout_id"]) for r in rollouts] if self.needs_values else None
            self.done.update(r["rollout_id"] for r in rollouts)
            complete.append((self.groups.pop(group_id), values))
        self.waiting_rollouts = sum(map(len, self.groups.values()))
        return complete

    def held_rollout_ids(self) -> list[str]:
        """The rollouts waiting for the rest of their group (or for their values)."""
        return [r["rollout_id"] for rollouts in self.groups.values() for r in rollouts]

    def held_value_ids(self) -> list[str]:
        """The rollouts whose values row waits for the rest of its group."""
        return list(self.values)


class SegmentPositions:
    """Which log segment each row still held in memory came from, by rollout id (one instance per stream): a
    stream's cursor is committed no further than the oldest segment whose rows are held, so a restarted
    orchestrator re-reads every group it had not finished instead of losing it."""

    def __init__(self) -> None:
        self.position: dict[str, tuple[str, int]] = {}

    def rows(self, segments) -> list[dict]:
        """The rows of polled segments, noting each one's (shard, seq); a row read again keeps its first position."""
        rows = []
        for segment in segments:
            for row in to_rows(segment.table):
                self.position.setdefault(row["rollout_id"], (segment.shard, segment.seq))
                rows.append(row)
        return rows

    def held(self, rollout_ids) -> dict[str, int]:
        """{shard: oldest seq} of the rows of `rollout_ids` (those still held); the others are forgotten (used)."""
        kept = {rid: self.position[rid] for rid in rollout_ids if rid in self.position}
        self.position = kept
        oldest: dict[str, int] = {}
        for shard, seq in kept.values():
            oldest[shard] = min(seq, oldest.get(shard, seq))
        return oldest


@dataclass
class ScoredGroup:
    """One complete group after its estimator scored it: its log rows and its per-token tensors [G, T], T the
    length of its longest trace."""

    rollouts: list[dict]
    """its rows of log/rollouts, in arrival order"""
    values: list[dict] | None
    """their rows of log/values in the same order (None: the estimator uses no critic)"""
    mask: torch.Tensor
    """[G, T] bool: the tokens that get an advantage (the policy's; with a critic, those the critic valued)"""
    advantages: torch.Tensor
    """[G, T] the policy's advantages, 0 off the mask"""
    targets: torch.Tensor | None = None
    """[G, T] the critic's value targets (None without a critic)"""
    critic_values: torch.Tensor | None = None
    """[G, T] the critic's values at scoring time (None without a critic)"""
    stats: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    """[G] the estimator's per-rollout figures, logged as `<name>_mean` per batch (tether: tether_weight)"""

    @property
    def shard(self) -> str:
        """the inference worker's log shard the group came from"""
        return self.rollouts[0]["shard"]

    @property
    def policy_version(self) -> int:
        """the policy version that sampled the group"""
        return self.rollouts[0]["policy_version"]

    @property
    def rollout_ids(self) -> list[str]:
        return [r["rollout_id"] for r in self.rollouts]

    @property
    def critic_versions(self) -> list[int]:
        """the critic version behind each rollout's values (-1 without a critic)"""
        return [v["critic_version"] for v in self.values] if self.values is not None else [-1] * len(self.rollouts)


def score_group(rollouts: list[dict], values: list[dict] | None, estimator: Estimator,
                critic_ev: float = math.nan) -> ScoredGroup:
    """One complete group scored by `estimator`: per-token advantages [G, T] and, with the critic's values, value
    targets [G, T] (docs/design.md §3). `critic_ev`: the critic's recent explained variance, for an estimator that
    reads it (tether; nan: none yet)."""
    mask = padded(rollouts, "policy_mask", torch.bool)
    rewards = torch.tensor([r["reward"] for r in rollouts], dtype=torch.float32)
    group_ids = torch.zeros(len(rollouts), dtype=torch.long)  # one group per call
    if values is None:
        scores = estimator.score(Group(rewards, mask, group_ids, critic_ev=critic_ev))
        return _checked(ScoredGroup(rollouts, None, mask, scores.advantages, stats=scores.stats), estimator)
    v = padded(values, "values", torch.float32, length=mask.shape[1])
    # a trace the critic's context cut: GAE runs over the tokens it saw and bootstraps with V(s_cut); the
    # tokens after the cut get no advantage (no value exists for them). A generation cap is never a cut.
    cut = torch.tensor([bool(x["cut"]) for x in values])
    valued = torch.tensor([x["valued_tokens"] for x in values])
    mask = mask & (torch.arange(mask.shape[1])[None, :] < valued[:, None])
    bootstrap = torch.tensor([x["bootstrap_value"] for x in values], dtype=torch.float32)
    scores = estimator.score(Group(rewards, mask, group_ids, v, bootstrap, cut, critic_ev))
    return _checked(ScoredGroup(rollouts, values, mask, scores.advantages, scores.targets, v, scores.stats),
                    estimator)


def _checked(group: ScoredGroup, estimator: Estimator) -> ScoredGroup:
    """The scored group, after checking what its estimator returned has the group's shape."""
    name, shape = type(estimator).__name__, tuple(group.mask.shape)
    if tuple(group.advantages.shape) != shape:
        raise ValueError(f"estimator {name} returned advantages of shape {tuple(group.advantages.shape)} for a "
                         f"group of shape {shape}; return one advantage per token of the policy mask")
    if group.values is not None and (group.targets is None or tuple(group.targets.shape) != shape):
        raise ValueError(f"estimator {name} uses the critic but returned no value targets of shape {shape}; return "
                         "Scores(advantages, value_targets(settings, group))")
    return group


def score_groups(complete: list[tuple[list[dict], list[dict] | None]], estimator: Estimator, recent: deque):
    """Score complete groups in order, yielding a ScoredGroup each; a group with values joins `recent` (the critic's
    latest scored groups) after it is scored. An estimator that reads the critic's explained variance (tether) gets
    it on `recent` as it was before the group (docs/value_functions.md, "Estimators")."""
    for group_rollouts, group_values in complete:
        # nothing scored yet: undefined (nan), which tether reads as weight 0 (the group mean)
        critic_ev = recent_explained_variance(recent) if estimator.uses_critic_ev and recent else math.nan
        group = score_group(group_rollouts, group_values, estimator, critic_ev)
        if group_values is not None:
            recent.append(group)
        yield group


def finish_batch(groups: list[ScoredGroup], estimator: Estimator) -> list[ScoredGroup]:
    """The groups of one policy batch with the estimator's `finish_batch` applied to their advantages (the batch
    baselines subtract a statistic of the whole batch's rewards; the other estimators keep the scored ones)."""
    rewards = torch.tensor([r["reward"] for g in groups for r in g.rollouts], dtype=torch.float32)
    advantages = estimator.finish_batch(rewards, _cat(groups, "advantages"), _cat(groups, "mask"))
    out, b = [], 0
    for g in groups:
        n, width = len(g.rollouts), g.mask.shape[1]
        out.append(dataclasses.replace(g, advantages=advantages[b: b + n, :width]))
        b += n
    return out


def target_rows(group: ScoredGroup) -> list[dict]:
    now = time.time()
    return [{
        "rollout_id": r["rollout_id"], "group_id": r["group_id"], "policy_version": r["policy_version"],
        "critic_version": v["critic_version"], "token_ids": r["token_ids"], "policy_mask": r["policy_mask"],
        "privileged": r["privileged"], "reward": r["reward"], "values": v["values"],
        "value_targets": group.targets[b, : len(r["token_ids"])].tolist(), "token_digest": v["token_digest"],
        "created_at": now, "images": r.get("images") or [],  # the critic trains with the rollout's images
    } for b, (r, v) in enumerate(zip(group.rollouts, group.values))]


def batch_rows(step: int, groups: list[ScoredGroup], whiten_advantages: bool) -> list[dict]:
    """The rows of batch `step`: every rollout of the admitted groups with its advantages."""
    rollouts = [r for g in groups for r in g.rollouts]
    length = max(len(r["token_ids"]) for r in rollouts)
    advantages = torch.zeros((len(rollouts), length))
    mask = torch.zeros((len(rollouts), length), dtype=torch.bool)
    b = 0
    for g in groups:
        a, m = g.advantages, g.mask
        advantages[b: b + len(a), : a.shape[1]] = a
        mask[b: b + len(a), : m.shape[1]] = m
        b += len(a)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    critic_versions = [c for g in groups for c in g.critic_versions]
    return [{
        "step": step, "rollout_id": r["rollout_id"], "policy_version": r["policy_version"],
        "critic_version": critic_versions[b], "token_ids": r["token_ids"], "policy_mask": r["policy_mask"],
        "sampling_logprobs": r["sampling_logprobs"], "advantages": advantages[b, : len(r["token_ids"])].tolist(),
        "reward": r["reward"], "images": r.get("images") or [],  # the policy trainer recomputes with them
    } for b, r in enumerate(rollouts)]


def _cat(groups: list[ScoredGroup], name: str) -> torch.Tensor:
    """One [G, T] tensor of several groups (`mask`, `advantages`, `targets`, `critic_values`), right-padded to a
    common width: [sum G, T]."""
    width = max(g.mask.shape[1] for g in groups)
    return torch.cat([torch.nn.functional.pad(getattr(g, name), (0, width - g.mask.shape[1])) for g in groups])


def recent_explained_variance(recent: deque) -> float:
    """The critic's explained variance on the last scored groups (values at scoring time vs their targets)."""
    groups = list(recent)
    return explained_variance(_cat(groups, "critic_values"), _cat(groups, "targets"), _cat(groups, "mask"))


class WarmupGate:
    """critic.warmup: batch 1 waits until the values come from critic version >= `min_version` and the
    explained variance over the last `prompts_per_step` scored groups is >= `min_explained_variance`, or until
    `max_rollouts` warm-up rollouts were scored. Groups scored while the gate is closed only train the critic.
    Opening writes `control/warmup_done`, which tells inference to stop free-running (and survives restarts)."""

    def __init__(self, cfg: Config, run) -> None:
        w = cfg.critic.warmup
        self.min_version, self.min_ev, self.max_rollouts = w.min_version, w.min_explained_variance, w.max_rollouts
        self.file = run.warmup_done_file
        self.is_open = self.file.exists() or (self.min_version <= 0 and self.min_ev is None)
        self.scored = 0

    def admit(self, group: ScoredGroup, recent: deque) -> bool:
        """Observe a scored group (`recent`: the last scored groups, this one included); True when it may go
        into policy batches."""
        if self.is_open:
            return True
        self.scored += len(group.rollouts)
        version = max(c for g in recent for c in g.critic_versions)
        ev = recent_explained_variance(recent)
        good = version >= self.min_version and (
            self.min_ev is None or (len(recent) == recent.maxlen and ev >= self.min_ev))
        capped = 0 < self.max_rollouts <= self.scored
        if good or capped:
            self.is_open = True
            self.reason = (f"critic version {version}, explained variance {ev:.3f} after {self.scored} warm-up "
                           f"rollouts" + ("" if good else f" (critic.warmup.max_rollouts={self.max_rollouts} reached)"))
            self.file.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.file, self.reason + "\n")
        return False


class CriticProvenance:
    """The newest policy version each critic version had trained on (`trained_on.json` in its weights dir,
    cached; None for version 0 and pruned versions): how stale the values are, in policy versions."""

    def __init__(self, critic_root) -> None:
        self.root, self.cache = critic_root, {}

    def trained_on(self, version: int) -> int | None:
        if version not in self.cache:
            try:
                self.cache[version] = json.loads((self.root / str(version) / "trained_on.json").read_text()
                                                 )["newest_policy_version"]
            except (OSError, ValueError, KeyError):
                return None  # not (yet) readable: do not cache, a later call may succeed
        return self.cache[version]


def batch_metrics(step: int, groups: list[ScoredGroup], newest_critic: int | None = None,
                  provenance: CriticProvenance | None = None) -> dict:
    """Policy-side and critic-health figures of one batch (docs/design.md §3): reward, off-policy lag, advantage
    statistics, and, with a critic, explained variance on fresh rollouts, mean value vs mean return at the
    first policy token, and how many critic versions behind the newest the values were scored; and the mean of each
    per-rollout figure the estimator reports (`<name>_mean`: tether_weight_mean)."""
    rewards = [r["reward"] for g in groups for r in g.rollouts]
    versions = [r["policy_version"] for g in groups for r in g.rollouts]
    mask, advantages = _cat(groups, "mask"), _cat(groups, "advantages")
    a = advantages[mask]
    out = {"step": step, "reward_mean": sum(rewards) / len(rewards),
           "off_policy_mean": sum((step - 1) - v for v in versions) / len(versions),
           "off_policy_max": max((step - 1) - v for v in versions),
           "advantage_mean": a.mean().item(), "advantage_std": a.std().item() if a.numel() > 1 else 0.0,
           "advantage_abs_mean": a.abs().mean().item(), "advantage_positive": (a > 0).float().mean().item()}
    sized = [[r["reward"] for r in g.rollouts] for g in groups if len(g.rollouts) > 1]
    if sized:  # groups whose rewards are all equal: a group-mean baseline gives them advantage 0
        out["groups_equal_reward"] = sum(max(r) == min(r) for r in sized) / len(sized)
    if groups[0].values is not None:
        values, targets = _cat(groups, "critic_values"), _cat(groups, "targets")
        first = mask.float().argmax(dim=1)  # the first policy token of each rollout
        rows = torch.arange(len(first))
        # values were predicted before the critic trained on these rollouts: a fresh-data measurement
        out["critic_explained_variance"] = explained_variance(values, targets, mask)
        out["critic_ev_sums"] = ev_sums(values, targets, mask)  # pooled over the run's last batches in the report
        out["value_first_mean"] = values[rows, first].mean().item()
        out["return_first_mean"] = targets[rows, first].mean().item()
        critic_versions = [c for g in groups for c in g.critic_versions]
        out["critic_version_mean"] = sum(critic_versions) / len(critic_versions)
        if newest_critic is not None:
            lags = [newest_critic - v for v in critic_versions]
            out["critic_version_lag_mean"], out["critic_version_lag_max"] = sum(lags) / len(lags), max(lags)
        seen = [provenance.trained_on(v) for v in critic_versions] if provenance else []
        stale = [(step - 1) - s for s in seen if s is not None]
        if stale:  # policy versions between what the critic had trained on and the policy being updated
            out["value_staleness_mean"], out["value_staleness_max"] = sum(stale) / len(stale), max(stale)
    for name in groups[0].stats:
        out[f"{name}_mean"] = torch.cat([g.stats[name] for g in groups]).mean().item()
    return out


class ReadyGroups:
    """Complete, admitted groups waiting for a batch: one FIFO per inference worker shard. Batch n takes the oldest
    `prompts_per_step / inference_workers` groups of EVERY worker, as each worker generates one chunk of that many
    groups per step: a worker that ran ahead must not fill a batch with its next chunk while another worker's chunk
    for this step waits, which would leave that chunk to go stale with nothing generated to replace it."""

    def __init__(self, workers: int, per_worker: int) -> None:
        self.queues: dict[str, deque] = {f"w{w}": deque() for w in range(workers)}
        self.per_worker = per_worker

    def add(self, group: ScoredGroup) -> None:
        self.queues[group.shard].append(group)

    def drop_stale(self, step: int, max_off_policy: int) -> int:
        """Drop the groups too far behind for `step` (oldest first in each queue); returns the rollouts dropped."""
        dropped = 0
        for queue in self.queues.values():
            while queue and (step - 1) - queue[0].policy_version > max_off_policy:
                dropped += len(queue.popleft().rollouts)
        return dropped

    def take(self) -> list[ScoredGroup] | None:
        """The next batch's groups (worker by worker), or None while some worker has fewer than its share."""
        if any(len(queue) < self.per_worker for queue in self.queues.values()):
            return None
        return [queue.popleft() for queue in self.queues.values() for _ in range(self.per_worker)]

    def __iter__(self):
        return (group for queue in self.queues.values() for group in queue)

    def rollout_ids(self) -> list[str]:
        """The rollouts of every waiting group."""
        return [rid for group in self for rid in group.rollout_ids]

    def __len__(self) -> int:
        return sum(map(len, self.queues.values()))


def already_used(ctx: RoleContext, needs_values: bool) -> tuple[set[str], set[str]]:
    """(rollout ids in published batches, group ids whose targets were published): what a restarted
    orchestrator must not batch or send to the value trainer again."""
    def ids(stream: str, column: str) -> set[str]:
        reader = ctx.reader(stream, f"orchestrator.restart.{stream}")
        return {x for segment in reader.poll() for x in segment.table.column(column).to_pylist()}  # never commits
    return ids("batches", "rollout_id"), (ids("targets", "group_id") if needs_values else set())


def log_health(*readers) -> dict:
    """Segments the orchestrator's readers could not use: quarantined (damaged) and skipped (newer schema)."""
    readers = [r for r in readers if r is not None]
    return {"quarantined_segments": sum(r.quarantined for r in readers),
            "skipped_newer_segments": sum(r.skipped_newer for r in readers)}


def main(run_dir: str) -> None:
    ctx = RoleContext(run_dir, "orchestrator")
    cfg = ctx.cfg
    timers = Timers()
    estimator = make_estimator(cfg.advantage)
    needs_values, max_off_policy = cfg.resolved.uses_critic, cfg.resolved.max_off_policy
    if bool(estimator.uses_critic) != needs_values:
        raise ValueError(f"advantage.estimator={cfg.advantage.estimator} has uses_critic={estimator.uses_critic} "
                         f"but the run was prepared with resolved.uses_critic={needs_values} (the class changed "
                         "since); start a new run")
    rollouts = ctx.reader("rollouts", "orchestrator")
    values = ctx.reader("values", "orchestrator.values") \
        if needs_values else None
    batches = ctx.writer("batches", "main")
    targets = ctx.writer("targets", "main") if needs_values else None
    batched, targeted = already_used(ctx, needs_values)
    if batched or targeted:
        ctx.log.info("resuming: %d rollouts already batched, targets of %d groups already published",
                     len(batched), len(targeted))
    join = GroupJoin(cfg.inference.group_size, needs_values, done=set(batched))
    gate = WarmupGate(cfg, ctx.run) if needs_values else None
    provenance = CriticProvenance(ctx.run.weights("critic")) if needs_values else None
    recent: deque[ScoredGroup] = deque(maxlen=cfg.inference.prompts_per_step)  # the critic's latest scored groups
    workers = cfg.topology.inference_workers
    ready = ReadyGroups(workers, cfg.inference.prompts_per_step // workers)
    step = batches.next_seq + 1  # batch n is segment n - 1 of the batches stream
    dropped_stale = dropped_warmup = 0
    rollouts_at, values_at = SegmentPositions(), SegmentPositions()  # where the rows held in memory came from

    while not ctx.stopping():
        with timers.time("io"):
            new = rollouts.poll()
            new_values = values.poll() if values else []
        began = time.perf_counter()
        join.add_rollouts(rollouts_at.rows(new))
        join.add_values(values_at.rows(new_values))
        complete = join.pop_complete()
        scored_rows = []
        for group in score_groups(complete, estimator, recent):
            if gate is None or gate.admit(group, recent):
                ready.add(group)
            else:
                dropped_warmup += len(group.rollouts)
                if gate.is_open:
                    ctx.log.info("critic warm-up done: %s", gate.reason)
                    ctx.metrics.log(warmup_done=True, warmup_rollouts=gate.scored)
            if group.values is not None and group.rollouts[0]["group_id"] not in targeted:
                scored_rows += target_rows(group)
        timers.add("compute", time.perf_counter() - began)
        if scored_rows:
            with timers.time("io"):
                targets.append(scored_rows)
        while step <= cfg.steps:
            dropped_stale += ready.drop_stale(step, max_off_policy)  # too far behind for this step
            groups = ready.take()
            if groups is None:
                break
            with timers.time("compute"):
                groups = finish_batch(groups, estimator)
                rows = batch_rows(step, groups, cfg.advantage.whiten)
            with timers.time("io"):
                batches.append(rows)
            newest = latest_version(ctx.run.weights("critic")) if needs_values else None
            ctx.metrics.log(**batch_metrics(step, groups, newest, provenance), dropped_stale=dropped_stale,
                            dropped_warmup=dropped_warmup, waiting_rollouts=join.waiting_rollouts,
                            **log_health(rollouts, values),
                            ready_groups=len(ready), **timers.snapshot())
            step += 1
        if new or new_values:
            with timers.time("io"):
                rollouts.commit(hold=rollouts_at.held([*join.held_rollout_ids(), *ready.rollout_ids()]))
                if values:
                    values.commit(hold=values_at.held([*join.held_value_ids(), *ready.rollout_ids()]))
        else:
            ctx.doing(f"waiting for the groups of batch {step}" if step <= cfg.steps else "all batches written",
                      **({"note": f"{len(ready)}/{cfg.inference.prompts_per_step} ready"} if step <= cfg.steps else {}))
            with timers.time("wait"):
                ctx.wait()
