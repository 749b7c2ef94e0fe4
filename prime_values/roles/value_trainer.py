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

from prime_values.log import LogReader, to_rows
from prime_values.replay import IngestQueue, ReplayBuffer, dump_snapshot, load_snapshot
from prime_values.roles.common import RoleContext
from prime_values.roles.critic_io import critic_step
from prime_values.weights import latest_version, prune, publish, version_dir


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

    from prime_values.models import load_critic, load_optimizer_state, save_model, save_optimizer_state
    from prime_values.roles.evaluator import Scorer

    ctx = RoleContext(run_dir, "value_trainer", "value_trainer_device")
    cfg, critic_root = ctx.cfg, ctx.run.weights("critic")
    version = latest_version(critic_root)
    assert version is not None, f"no critic version in {critic_root}: the warm-start job publishes version 0"
    critic = load_critic(version_dir(critic_root, version)).to(ctx.device).train()
    tokenizer = AutoTokenizer.from_pretrained(ctx.run.weights("policy") / "0")
    optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr)
    if version > 0:
        ctx.log.info("resuming after critic version %d: %s", version,
                     load_optimizer_state(optimizer, version_dir(critic_root, version)))
    queue = IngestQueue(cfg.replay.queue_size)
    rcfg = cfg.replay
    buffer = ReplayBuffer(rcfg.capacity, rcfg.max_reuse, rcfg.sampling, seed=ctx.seed(), max_age=rcfg.max_age,
                          recent_half_life=rcfg.recent_half_life)
    reader = ctx.reader("targets", "value_trainer")
    restore_replay(ctx, buffer, version_dir(critic_root, version), reader)

    def save(path) -> None:
        save_model(critic, tokenizer, path)
        (path / REPLAY_SNAPSHOT).write_bytes(dump_snapshot(buffer.snapshot()))
        # the newest policy version this critic has trained on: the orchestrator's value-staleness metric
        (path / TRAINED_ON).write_text(json.dumps({"newest_policy_version": buffer.newest_policy_version}))
        if cfg.log.optimizer_state_every and version % cfg.log.optimizer_state_every == 0:
            save_optimizer_state(optimizer, path)
    stop = threading.Event()
    threading.Thread(target=ingest, args=(reader, queue, ctx, stop), daemon=True).start()
    scorer = Scorer(ctx, tokenizer) if cfg.topology.evaluator == "colocated" else None
    steps = 0
    try:
        while not ctx.stopping():
            if scorer and scorer.score_pending(critic, version):
                continue  # scoring has priority: drain the rollouts waiting for values first
            for row in queue.drain():
                buffer.add(row)
            if len(buffer) < cfg.replay.min_rollouts:
                ctx.wait()
                continue
            began = time.time()
            stats = critic_step(critic, optimizer, buffer.sample(cfg.critic.batch_rollouts), tokenizer, cfg,
                                ctx.device)
            steps += 1
            if steps % cfg.critic.publish_every == 0:
                version += 1
                publish(critic_root, version, save)
                prune(critic_root, keep=cfg.log.keep_weights)
            ctx.metrics.log(critic_step=steps, critic_version=version, **stats, step_s=time.time() - began,
                            ingest_dropped=queue.dropped, **{f"replay_{k}": v for k, v in buffer.stats().items()})
            if cfg.critic.throttle_s:
                time.sleep(cfg.critic.throttle_s)
    finally:
        stop.set()
