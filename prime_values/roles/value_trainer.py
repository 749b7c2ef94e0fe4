"""Value trainer: a bounded, non-blocking ingest queue into a rollout-granular replay buffer, critic steps on
its own schedule, and monotonically versioned critic weights.

A background thread tails `log/targets` into the ingest queue; when the trainer falls behind, the queue
drops its oldest rollouts (counted) instead of holding anyone up. In the colocated topology this process
also serves the value evaluator, and scoring goes first: it is on the policy's path, training is not.
"""

from __future__ import annotations

import json
import random
import threading
import time

import torch

from prime_values import dist
from prime_values.algo.ema import WeightAverage
from prime_values.critic_io import critic_step
from prime_values.log import LogReader, to_rows
from prime_values.monitor import Timers
from prime_values.replay import IngestQueue, ReplayBuffer, dump_snapshot, load_snapshot
from prime_values.roles.common import RoleContext
from prime_values.roles.evaluator import Scorer
from prime_values.trainer import Trainer
from prime_values.weights import version_dir


def ingest(reader: LogReader, queue: IngestQueue, ctx: RoleContext, stop: threading.Event) -> None:
    """Tail the targets log into the ingest queue; never blocks on the trainer."""
    while not stop.is_set():
        segments = reader.poll()
        for segment in segments:
            for row in to_rows(segment.table):
                queue.put(row)
        if segments:
            reader.commit()
        else:
            time.sleep(0.02)


REPLAY_SNAPSHOT = "replay.json"  # saved inside each published critic version, atomically with the weights
TRAINED_ON = "trained_on.json"


def restore_replay(ctx: RoleContext, buffer: ReplayBuffer, critic_dir, reader: LogReader) -> None:
    """After a restart: rebuild the buffer from the targets log up to this trainer's cursor, with the reuse
    counts of the snapshot saved with the critic version we resume from (rows that retention already deleted
    are reported as missing)."""
    path = critic_dir / REPLAY_SNAPSHOT
    if not path.exists():
        return
    tail = LogReader(ctx.run.stream("targets"), "value_trainer.rebuild", ctx.run.cursors, "targets")  # never commits
    rows = [row for segment in tail.poll() if segment.seq < reader.next_seq.get(segment.shard, 0)
            for row in to_rows(segment.table)]
    outcome = buffer.rebuild(rows, load_snapshot(path.read_bytes()))
    ctx.log.info("replay buffer rebuilt from %d logged rollouts: %s", len(rows), outcome)


def lockstep_plan(rows: list[dict], batch_rollouts: int, steps: int, seed: int) -> list[list[dict]]:
    """schedule.mode=lockstep: the critic minibatches trained on one batch's targets before the next publication,
    `steps` minibatches of `batch_rollouts` drawn in shuffled passes over the batch's rows."""
    rng, order, plan = random.Random(seed), [], []
    for _ in range(steps):
        batch = []
        while len(batch) < min(batch_rollouts, len(rows)):
            if not order:
                order = list(range(len(rows)))
                rng.shuffle(order)
            batch.append(rows[order.pop()])
        plan.append(batch)
    return plan


class ReplayRatio:
    """replay.ratio: the critic trains at most `ratio` rollouts per new rollout ingested. A step of `batch`
    rollouts is allowed while trained + batch <= ratio x ingested (ratio 0: always). Hand-worked, ratio 1, batch
    64: after 128 ingested, steps 1 and 2 run (64, 128 trained) and step 3 waits (192 > 128) until 64 more
    arrive; ratio 0.5 with 128 per policy step is one step of 64 per policy step."""

    def __init__(self, ratio: float) -> None:
        self.ratio, self.ingested, self.trained = ratio, 0, 0

    def allows(self, batch: int) -> bool:
        return self.ratio <= 0 or self.trained + batch <= self.ratio * self.ingested

    def stats(self) -> dict:
        return {"rollouts_ingested": self.ingested, "rollouts_trained": self.trained}


def replay_batches(ctx: RoleContext, queue: IngestQueue, buffer: ReplayBuffer, score, timers: Timers,
                   budget: ReplayRatio | None = None):
    """schedule.mode=async: a replay sample per critic step once the buffer holds replay.min_rollouts and the
    replay ratio allows it (`ReplayRatio`, counted from this process's start: a restarted trainer waits for new
    rollouts; None: unbounded), a version published every critic.publish_every steps. `score()` serves the
    colocated evaluator first (True when it scored: it is on the policy's path, training is not)."""
    cfg, steps, budget = ctx.cfg, 0, budget or ReplayRatio(0)
    while not ctx.stopping():
        if score():
            continue  # scoring has priority: drain the rollouts waiting for values first
        for row in queue.drain():
            buffer.add(row)
            budget.ingested += 1
        size = min(cfg.critic.batch_rollouts, len(buffer))
        if len(buffer) < cfg.replay.min_rollouts or not budget.allows(size):
            ctx.doing("waiting for targets", note=f"replay {len(buffer)}/{cfg.replay.min_rollouts} rollouts before "
                      "the first step" if len(buffer) < cfg.replay.min_rollouts else "replay.ratio: new rollouts")
            with timers.time("wait"):
                ctx.wait()
            continue
        steps += 1
        batch = buffer.sample(cfg.critic.batch_rollouts)
        budget.trained += len(batch)
        yield batch, steps % cfg.critic.publish_every == 0


def lockstep_batches(ctx: RoleContext, queue: IngestQueue, buffer: ReplayBuffer, score, timers: Timers, version):
    """schedule.mode=lockstep: critic version v + 1 is trained on batch v + 1's targets alone (the rollouts of
    policy version v = `version()`), lockstep_critic_steps minibatches (`lockstep_plan`), and published after the
    last of them; the evaluator waits for it. `score()` as in `replay_batches`."""
    cfg, by_version, plan = ctx.cfg, {}, []
    per_batch = cfg.inference.prompts_per_step * cfg.inference.group_size
    while not ctx.stopping():
        if score():
            continue
        for row in queue.drain():
            buffer.add(row)
            by_version.setdefault(row["policy_version"], []).append(row)
        if not plan:
            if len(by_version.get(version(), ())) < per_batch:
                ctx.doing(f"waiting for the targets of batch {version() + 1}")
                with timers.time("wait"):
                    ctx.wait()
                continue
            plan = lockstep_plan(by_version.pop(version()), cfg.critic.batch_rollouts,
                                 cfg.schedule.lockstep_critic_steps, ctx.seed(version()))
        batch = plan.pop(0)
        yield batch, not plan  # the batch's last minibatch: publish the version that scores the next


def critic_batches(ctx: RoleContext, trainer: Trainer, queue: IngestQueue, buffer: ReplayBuffer, score,
                   timers: Timers, stop: threading.Event, budget: ReplayRatio):
    """Rank 0's batch source: the replay buffer rebuilt as it was at the version resumed from, the ingest thread
    started (until `stop`), and the schedule's batches."""
    reader = ctx.reader("targets", "value_trainer")
    restore_replay(ctx, buffer, version_dir(trainer.root, trainer.version), reader)
    ctx.start_thread(ingest, reader, queue, ctx, stop)
    if ctx.cfg.resolved.lockstep:
        return lockstep_batches(ctx, queue, buffer, score, timers, lambda: trainer.version)
    return replay_batches(ctx, queue, buffer, score, timers, budget)


def replay_files(buffer: ReplayBuffer):
    """What a critic version holds beside its weights: the replay snapshot (a restart rebuilds the buffer from it)
    and the newest policy version trained on (the orchestrator's value-staleness metric)."""
    def extra(path) -> None:
        (path / REPLAY_SNAPSHOT).write_bytes(dump_snapshot(buffer.snapshot()))
        (path / TRAINED_ON).write_text(json.dumps({"newest_policy_version": buffer.newest_policy_version}))
    return extra


def main(run_dir: str) -> None:
    from prime_values.models import lora

    ctx, timers = RoleContext(run_dir, "value_trainer", "value_trainer_device"), Timers()
    cfg, rcfg = ctx.cfg, ctx.cfg.replay
    trainer = Trainer.resume(ctx, "critic", cfg.critic, cfg.topology.value_trainer_procs,
                             lambda params: torch.optim.AdamW(params, lr=cfg.critic.lr), timers)
    average = WeightAverage(lora.trainable(trainer.model), cfg.critic.weight_average)  # what is published
    queue = IngestQueue(rcfg.queue_size)
    buffer = ReplayBuffer(rcfg.capacity, rcfg.max_reuse, rcfg.sampling, seed=ctx.seed(), max_age=rcfg.max_age,
                          recent_half_life=rcfg.recent_half_life)
    scorer = Scorer(ctx, trainer.tokenizer, timers=timers) if cfg.topology.evaluator == "colocated" else None

    def score() -> bool:  # topology.evaluator=colocated: this process serves the evaluator (one process)
        return scorer is not None and scorer.score_pending(trainer.model, trainer.version, weights=average.swapped)
    stop, budget = threading.Event(), ReplayRatio(rcfg.ratio)
    # rank 0 alone ingests, samples replay, publishes and logs; the other ranks train on what it broadcasts
    source = critic_batches(ctx, trainer, queue, buffer, score, timers, stop, budget) if trainer.main else None
    try:
        for steps, (batch, publish_now) in enumerate(trainer.batches(source), 1):
            began = time.time()
            ctx.doing("training", step=steps, note=f"critic v{trainer.version}")
            with timers.time("compute"), ctx.cores.computing():  # lends its core while waiting (dedicated evaluator)
                rows, real = dist.share(batch)
                stats = critic_step(trainer.model, trainer.optimizer, rows, trainer.tokenizer, cfg, trainer.device,
                                    real)
                average.update()
            step_s = time.time() - began
            if publish_now:  # critic.weight_average: the averaged weights are the version
                trainer.publish(replay_files(buffer), weights=average.swapped)
            if not trainer.main:
                continue
            if cfg.critic.throttle_s or cfg.critic.throttle_factor:  # a simulated slower critic: counted as compute
                with timers.time("compute"):
                    time.sleep(cfg.critic.throttle_s + cfg.critic.throttle_factor * step_s)
            ctx.metrics.log(critic_step=steps, critic_version=trainer.version, **stats, step_s=step_s,
                            ingest_dropped=queue.dropped, **budget.stats(),
                            **{f"replay_{k}": v for k, v in buffer.stats().items()},
                            **timers.snapshot())
    finally:
        stop.set()
    trainer.close()
