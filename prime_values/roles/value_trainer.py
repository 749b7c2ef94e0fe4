"""Value trainer: a bounded, non-blocking ingest queue into a rollout-granular replay buffer, critic steps on
its own schedule, and monotonically versioned critic weights.

A background thread tails `log/targets` into the ingest queue; when the trainer falls behind, the queue
drops its oldest rollouts (counted) instead of holding anyone up. In the colocated topology this process
also serves the value evaluator, and scoring goes first: it is on the policy's path, training is not.
"""

from __future__ import annotations

import json
import threading
import time

import torch

from prime_values import dist
from prime_values.log import LogReader, to_rows
from prime_values.replay import IngestQueue, ReplayBuffer, dump_snapshot, load_snapshot
from prime_values.roles.common import RoleContext
from prime_values.roles.critic_io import critic_step
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


def main(run_dir: str) -> None:
    from transformers import AutoTokenizer

    from prime_values.models import load_optimizer_state, lora, save_optimizer_state
    from prime_values.roles.evaluator import Scorer

    ctx = RoleContext(run_dir, "value_trainer", "value_trainer_device")
    cfg, critic_root = ctx.cfg, ctx.run.weights("critic")
    group = dist.setup(cfg.topology.value_trainer_procs, ctx.device, cfg.launcher.timeout_min)
    device = group.device  # ctx.device, or this rank's GPU
    load = lora.trainer_loader(cfg.critic.lora, "critic", ctx.seed(7))  # LoRA: base + adapter (models/lora.py)
    version, loaded = resume(critic_root, load) if group.main else (None, None)
    version = dist.broadcast(version)
    assert version is not None, f"no critic version in {critic_root}: the warm-start job publishes version 0"
    critic = dist.shard((loaded if group.main else load(version_dir(critic_root, version))).to(device).train())
    tokenizer = AutoTokenizer.from_pretrained(ctx.run.weights("policy") / "0")
    optimizer = torch.optim.AdamW(lora.trainable(critic), lr=cfg.critic.lr)
    if version > 0:  # TODO(dist): sharded optimizer state (dist.optimizer_state / restore_optimizer_state)
        ctx.log.info("resuming after critic version %d: %s", version,
                     load_optimizer_state(optimizer, version_dir(critic_root, version)) if group.world == 1
                     else "several processes: fresh optimizer")
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
        if cfg.log.optimizer_state_every and version % cfg.log.optimizer_state_every == 0 and group.world == 1:
            save_optimizer_state(optimizer, path)
    stop = threading.Event()
    if group.main:
        threading.Thread(target=ingest, args=(reader, queue, ctx, stop), daemon=True).start()
    scorer = Scorer(ctx, tokenizer) if cfg.topology.evaluator == "colocated" else None  # one process only
    steps = 0
    try:
        while True:
            batch = None  # rank 0 stopping (None ends every rank), or another rank: rank 0's batch comes below
            if group.main and not ctx.stopping():
                if scorer and scorer.score_pending(critic, version):
                    continue  # scoring has priority: drain the rollouts waiting for values first
                for row in queue.drain():
                    buffer.add(row)
                if len(buffer) < cfg.replay.min_rollouts:
                    ctx.wait()
                    continue
                batch = buffer.sample(cfg.critic.batch_rollouts)
            batch = dist.broadcast(batch)
            if batch is None:
                break
            began = time.time()
            stats = critic_step(critic, optimizer, dist.share(batch)[0], tokenizer, cfg, device)
            steps += 1
            if steps % cfg.critic.publish_every == 0:
                version += 1
                full = dist.unsharded(critic)  # the critic itself with one process
                if group.main:
                    publish(critic_root, version, save)
                    prune(critic_root, keep=cfg.log.keep_weights, protect=lora.protected(full))
            if not group.main:
                continue
            ctx.metrics.log(critic_step=steps, critic_version=version, **stats, step_s=time.time() - began,
                            ingest_dropped=queue.dropped, **{f"replay_{k}": v for k, v in buffer.stats().items()})
            if cfg.critic.throttle_s:
                time.sleep(cfg.critic.throttle_s)
    finally:
        stop.set()
    dist.teardown()
