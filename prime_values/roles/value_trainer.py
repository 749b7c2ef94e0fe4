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
from prime_values.log import LogReader, to_rows
from prime_values.monitor import Timers
from prime_values.replay import IngestQueue, ReplayBuffer, dump_snapshot, load_snapshot
from prime_values.roles.common import RoleContext
from prime_values.roles.critic_io import critic_step
from prime_values.roles.evaluator import Scorer
from prime_values.weights import prune, publish, resume, version_dir


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


def main(run_dir: str) -> None:
    from transformers import AutoTokenizer

    from prime_values.models import lora, read_optimizer_state, save_optimizer_state
    from prime_values.models.build import enable_checkpointing

    ctx = RoleContext(run_dir, "value_trainer", "value_trainer_device")
    timers = Timers()
    cfg, critic_root = ctx.cfg, ctx.run.weights("critic")
    group = dist.setup(cfg.topology.value_trainer_procs, ctx.device, cfg.launcher.timeout_min)
    device = group.device  # ctx.device, or this rank's GPU
    load = lora.trainer_loader(cfg.critic.lora, "critic", ctx.seed(7))  # LoRA: base + adapter (models/lora.py)
    version, loaded = resume(critic_root, load) if group.main else (None, None)
    version = dist.broadcast(version)
    assert version is not None, f"no critic version in {critic_root}: the warm-start job publishes version 0"
    critic = (loaded if group.main else load(version_dir(critic_root, version))).to(device).train()
    if cfg.critic.activation_checkpointing:  # per transformer block, before sharding
        enable_checkpointing(critic)
    critic = dist.shard(critic)  # policy.dtype=bf16-mixed: bf16 all-gathers, fp32 gradient reduction
    tokenizer = AutoTokenizer.from_pretrained(ctx.run.weights("policy") / "0")
    optimizer = torch.optim.AdamW(lora.trainable(critic), lr=cfg.critic.lr)
    average = WeightAverage(lora.trainable(critic), cfg.critic.weight_average)  # what is published
    if version > 0:  # the Adam moments of the version resumed from, with any process count
        ctx.log.info("resuming after critic version %d: %s", version, dist.restore_optimizer_state(
            critic, optimizer, lambda: read_optimizer_state(version_dir(critic_root, version))))
    queue = IngestQueue(cfg.replay.queue_size)
    rcfg = cfg.replay
    buffer = ReplayBuffer(rcfg.capacity, rcfg.max_reuse, rcfg.sampling, seed=ctx.seed(), max_age=rcfg.max_age,
                          recent_half_life=rcfg.recent_half_life)
    # rank 0 alone ingests, samples replay, publishes and logs; the other ranks train on what it broadcasts
    reader = ctx.reader("targets", "value_trainer") if group.main else None
    if group.main:
        restore_replay(ctx, buffer, version_dir(critic_root, version), reader)

    def save(path) -> None:
        lora.saver(cfg.critic.lora)(full, tokenizer, path)  # adapter-only with LoRA
        (path / REPLAY_SNAPSHOT).write_bytes(dump_snapshot(buffer.snapshot()))
        # the newest policy version this critic has trained on: the orchestrator's value-staleness metric
        (path / TRAINED_ON).write_text(json.dumps({"newest_policy_version": buffer.newest_policy_version}))
        if opt_state is not None:
            save_optimizer_state(opt_state, path)
    stop = threading.Event()
    if group.main:
        threading.Thread(target=ingest, args=(reader, queue, ctx, stop), daemon=True).start()
    scorer = Scorer(ctx, tokenizer, timers=timers) if cfg.topology.evaluator == "colocated" else None  # one process
    # lockstep (schedule.mode): critic version v + 1 is trained on batch v + 1's targets alone (the rollouts of
    # policy version v), lockstep_critic_steps minibatches, then published; the evaluator waits for it
    lockstep = cfg.schedule.mode == "lockstep"
    per_batch = cfg.inference.prompts_per_step * cfg.inference.group_size
    by_version: dict[int, list[dict]] = {}
    plan: list[list[dict]] = []
    steps = 0
    try:
        while True:
            batch, publish_now = None, False  # rank 0 stopping (None ends every rank), or another rank
            if group.main and not ctx.stopping():
                if scorer and scorer.score_pending(critic, version, weights=average.swapped):
                    continue  # scoring has priority: drain the rollouts waiting for values first
                for row in queue.drain():
                    buffer.add(row)
                    if lockstep:
                        by_version.setdefault(row["policy_version"], []).append(row)
                if lockstep and not plan:
                    if len(by_version.get(version, ())) < per_batch:
                        with timers.time("wait"):
                            ctx.wait()
                        continue
                    plan = lockstep_plan(by_version.pop(version), cfg.critic.batch_rollouts,
                                         cfg.schedule.lockstep_critic_steps, ctx.seed(version))
                if lockstep:
                    batch = plan.pop(0)
                    publish_now = not plan  # the batch's last minibatch: publish the version that scores the next
                elif len(buffer) < cfg.replay.min_rollouts:
                    with timers.time("wait"):
                        ctx.wait()
                    continue
                else:
                    batch = buffer.sample(cfg.critic.batch_rollouts)
            batch, publish_now = dist.broadcast((batch, publish_now))
            if batch is None:
                break
            began = time.time()
            with timers.time("compute"):
                stats = critic_step(critic, optimizer, dist.share(batch)[0], tokenizer, cfg, device)
                average.update()
            step_s = time.time() - began
            steps += 1
            if publish_now if lockstep else steps % cfg.critic.publish_every == 0:
                version += 1
                every = cfg.log.optimizer_state_every  # gathered by every rank (a collective), saved by rank 0
                opt_state = dist.optimizer_state(critic, optimizer) if every and version % every == 0 else None
                with average.swapped():  # critic.weight_average: the averaged weights are the version
                    full = dist.unsharded(critic)  # the critic itself with one process
                    if group.main:
                        with timers.time("io"):
                            publish(critic_root, version, save)
                            prune(critic_root, keep=cfg.log.keep_weights, protect=lora.protected(full))
            if not group.main:
                continue
            if cfg.critic.throttle_s or cfg.critic.throttle_factor:  # a simulated slower critic: counted as compute
                with timers.time("compute"):
                    time.sleep(cfg.critic.throttle_s + cfg.critic.throttle_factor * step_s)
            ctx.metrics.log(critic_step=steps, critic_version=version, **stats, step_s=step_s,
                            ingest_dropped=queue.dropped, **{f"replay_{k}": v for k, v in buffer.stats().items()},
                            **timers.snapshot())
    finally:
        stop.set()
    dist.teardown()
