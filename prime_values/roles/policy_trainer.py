"""Policy trainer: batch n in, one importance-weighted PPO-clip step on the given advantages, version n out.

It never loads a critic: the advantages arrive in the batch, computed by the orchestrator.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import torch

from prime_values import dist
from prime_values.algo.losses import direction_gap, logprob_shift_sums, ppo_clip_loss, prob_diff_mask_loss
from prime_values.critic_io import padded, rollout_logprobs
from prime_values.log import LogReader, to_rows
from prime_values.monitor import Timers
from prime_values.roles.common import RoleContext
from prime_values.rollout import greedy_accuracy
from prime_values.rundir import write_atomic
from prime_values.tasks import make_task
from prime_values.trainer import Trainer, optimizer_step

if TYPE_CHECKING:
    from prime_values.config import Config


def train_step(model, optimizer, rows: list[dict], cfg: Config, pad_id: int, device: str, direction: bool = True,
               cores=None) -> dict:
    """One optimizer step over the batch (gradient accumulated over micro-batches, token-mean overall), then, with
    `direction` (every `policy.direction_every`th step), the direction diagnostic on the same batch
    (`direction_after_step`). `cores` (launch.cores, topology.lend_idle_cores): each micro-batch's forward and
    backward pass and the optimizer step run with the cores no other role is computing on, borrowed as they free.

    With several processes (prime_values.dist) every rank holds the whole batch and trains on its strided
    share of each micro-batch; the loss is scaled so the averaged gradient is the single-process one."""
    pcfg = cfg.policy
    size = pcfg.micro_batch_rollouts or len(rows)
    total_tokens = sum(sum(r["policy_mask"]) for r in rows)
    world = dist.current().world
    seen = []  # per micro-batch: (its rows, mask, advantages, logprobs before the step)

    def accumulate() -> dict:
        stats_sum: dict[str, float] = {}
        for begin in range(0, len(rows), size):
            micro, real = dist.share(rows[begin: begin + size])
            if cores is not None:
                cores.borrow()
            mask = padded(micro, "policy_mask", torch.bool).to(device)
            sampling = padded(micro, "sampling_logprobs", torch.float32).to(device)
            advantages = padded(micro, "advantages", torch.float32).to(device)
            # policy.dtype=bf16-mixed: the forward runs under bf16 autocast (models.build.apply_precision); the
            # logits, the logprobs and the loss are fp32 from here on; policy.pack_sequences: on packed lines
            logprobs = rollout_logprobs(model, micro, pad_id, device, cfg.inference.temperature,
                                        pcfg.pack_sequences)
            if direction:
                seen.append((micro, mask & real, advantages, logprobs.detach()))
            if pcfg.trust_region == "prob_diff":
                loss, stats = prob_diff_mask_loss(logprobs, sampling, advantages, mask, delta_low=pcfg.prob_diff_low,
                                                  delta_high=pcfg.prob_diff_high, kl_coef=pcfg.kl_coef)
            else:
                loss, stats = ppo_clip_loss(logprobs, sampling, advantages, mask, clip_low=pcfg.clip_low,
                                            clip_high=pcfg.clip_high, kl_coef=pcfg.kl_coef)
            if cores is not None:  # the first forward overlaps inference's chunk: try again before its backward
                cores.borrow()
            tokens = mask.sum().item() * real  # a stand-in share (not real) counts no tokens
            weight = tokens / max(total_tokens, 1)  # token-level aggregation across micro-batches and ranks
            (loss * dist.loss_scale(tokens, total_tokens, world)).backward()
            for key, value in {"loss": loss.item(), **stats}.items():
                stats_sum[key] = stats_sum.get(key, 0.0) + value * weight
        return dist.all_reduce_sum(stats_sum)
    try:
        stats = optimizer_step(model, optimizer, accumulate, pcfg.max_grad_norm)
    finally:
        threads = cores.give_back(total_tokens) if cores is not None else None
    if threads is not None:
        stats["backward_threads"] = threads  # the most the step ran with
    if not direction:
        return stats
    return {**stats, **direction_after_step(model, seen, pad_id, device, cfg.inference.temperature,
                                            pcfg.pack_sequences)}


@torch.no_grad()
def direction_after_step(model, seen: list, pad_id: int, device: str, temperature: float, pack: bool) -> dict:
    """`direction_gap` (algo.losses; docs/value_functions.md, "Direction of a step"): one no-grad forward of the
    step's own micro-batches with the updated weights, each token's logprob compared with the one the step's
    forward computed before the update. Every rank runs it on its share (FSDP needs every rank in a forward)."""
    sums: dict[str, float] = {}
    for micro, mask, advantages, before in seen:  # the same forward as the step's (packed or padded)
        after = rollout_logprobs(model, micro, pad_id, device, temperature, pack)
        for key, value in logprob_shift_sums(before, after, advantages, mask).items():
            sums[key] = sums.get(key, 0.0) + value
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():  # FSDP2 keeps the root's parameters gathered after a forward without backward
        if isinstance(module, FSDPModule):  # (the optimizer and its state dict hold the sharded ones)
            module.reshard()
    return direction_gap(dist.all_reduce_sum(sums))


def next_batch(reader: LogReader, ctx: RoleContext, timers: Timers | None = None):
    """Block until the next batch segment is published (or the run stops)."""
    timers = timers or Timers()
    while not ctx.stopping():
        with timers.time("io"):
            segments = reader.poll(max_segments=1)
        if segments:
            return segments[0]
        with timers.time("wait"):
            ctx.wait(0.01)
    return None


def next_rows(reader: LogReader, ctx: RoleContext, step: int, timers: Timers | None = None) -> list[dict] | None:
    """The rows of batch `step` (None when the run stops). Batches of earlier steps are committed and skipped:
    a trainer restarted after publishing version n but before committing batch n meets batch n again, and its
    update is already in the published weights."""
    ctx.doing(f"waiting for batch {step}")
    while True:
        segment = next_batch(reader, ctx, timers)
        if segment is None:
            return None
        rows = to_rows(segment.table)
        if rows and rows[0]["step"] < step:
            reader.commit()
            continue
        assert all(r["step"] == step for r in rows), f"batch segment {segment.path} is not for step {step}"
        return rows


def policy_lr(pcfg, step: int, steps: int) -> float:
    """policy.lr at policy step `step` of `steps` (1-based): constant, then with policy.lr_decay_steps = D the
    last D steps fall linearly, lr * (steps - step + 1) / (D + 1). Hand-worked, lr 1, 10 steps, D = 3: steps
    1-7 use 1, steps 8 / 9 / 10 use 3/4, 2/4, 1/4."""
    return pcfg.lr * min(1.0, (steps - step + 1) / (pcfg.lr_decay_steps + 1))


class TimeBudget:
    """``time_budget_min``: the run ends after the step that would otherwise leave too little time for one more
    step and the final held-out evaluation, counted from the run's start (its config.yaml, written when the run
    is launched or resumed). The next step is estimated as long as the last one, the evaluation as the step-0
    one (from the trainer's metrics)."""

    def __init__(self, minutes: float, config_path, metrics_path) -> None:
        self.limit_s = float(minutes or 0) * 60
        self.began = config_path.stat().st_mtime if self.limit_s and config_path.exists() else time.time()
        self.metrics_path, self.previous = metrics_path, None

    def eval_s(self) -> float:
        if self.metrics_path is None or not self.metrics_path.exists():
            return 0.0
        spans = [r.get("heldout_s") for r in map(json.loads, self.metrics_path.read_text().splitlines())
                 if "heldout_s" in r]
        return float(spans[0]) if spans else 0.0

    def spent(self) -> bool:
        if not self.limit_s:
            return False
        now = time.time()
        step_s = now - self.previous if self.previous is not None else 0.0
        self.previous = now
        return now - self.began + step_s + self.eval_s() >= self.limit_s


class Batches:
    """Rank 0's batch source (`trainer.Trainer.batches`): batch n for step n = version + 1, each published (True),
    until `steps`, the time budget (`TimeBudget`), or the run's stop (`stopped`: then the role ends unfinished)."""

    def __init__(self, ctx: RoleContext, trainer: Trainer, timers: Timers):
        self.ctx, self.trainer, self.timers, self.stopped = ctx, trainer, timers, False
        self.reader = ctx.reader("batches", "policy_trainer")
        self.budget = TimeBudget(ctx.cfg.time_budget_min, ctx.run.config, ctx.run.metrics("policy_trainer"))

    def __iter__(self):
        while self.trainer.version < self.ctx.cfg.steps:
            if self.budget.spent():
                self.ctx.log.info("time_budget_min=%s: step %d is the last one", self.ctx.cfg.time_budget_min,
                                  self.trainer.version)
                return
            rows = next_rows(self.reader, self.ctx, self.trainer.version + 1, self.timers)
            if rows is None:
                self.stopped = True
                return
            yield rows, True


def evaluate(ctx: RoleContext, trainer: Trainer, task, heldout, timers: Timers, step: int, full) -> None:
    """Held-out accuracy of `full` (the whole model: rank 0's unsharded copy when sharded), each problem's outcome
    in metrics/heldout/step_<n>.jsonl for paired before/after comparisons (bench/paired_heldout.py)."""
    records: list[dict] = []
    began = time.time()
    ctx.doing(f"held-out evaluation of policy v{step}", flush=True)
    with timers.time("compute"):
        accuracy = greedy_accuracy(full.to(trainer.device).eval(), trainer.tokenizer, task, heldout,
                                   ctx.cfg.inference.max_new_tokens, per_problem=records)
    trainer.model.train()
    path = ctx.run.root / "metrics" / "heldout" / f"step_{step:06d}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    ctx.metrics.log(step=step, heldout_accuracy=accuracy, heldout_s=time.time() - began, **timers.snapshot())


def main(run_dir: str) -> None:
    ctx, timers = RoleContext(run_dir, "policy_trainer", "policy_trainer_device"), Timers()
    cfg = ctx.cfg
    trainer = Trainer.resume(ctx, "policy", cfg.policy, cfg.topology.policy_trainer_procs, lambda params:
                             torch.optim.AdamW(params, lr=cfg.policy.lr, weight_decay=cfg.policy.weight_decay), timers)
    start, task, optimizer = trainer.version, make_task(**cfg.task), trainer.optimizer
    heldout = task.heldout()
    # rank 0 alone reads batches, publishes, logs and evaluates; the other ranks train on what it broadcasts
    source = Batches(ctx, trainer, timers) if trainer.main else None
    full = dist.unsharded(trainer.model) if start == 0 else None
    if start == 0 and trainer.main:
        evaluate(ctx, trainer, task, heldout, timers, 0, full)  # the accuracy at the first RL step, before any update
    waited = time.time()
    for rows, _ in trainer.batches(source):
        step, began = trainer.version + 1, time.time()
        ctx.doing(f"training step {step}", flush=True)
        with timers.time("compute"):
            for param_group in optimizer.param_groups:
                param_group["lr"] = policy_lr(cfg.policy, step, cfg.steps)
            every = cfg.policy.direction_every
            stats = train_step(trainer.model, optimizer, rows, cfg, trainer.tokenizer.pad_token_id, trainer.device,
                               direction=bool(every) and step % every == 0, cores=ctx.cores)
        full = trainer.publish(published=source.reader.committer() if trainer.main else None,
                               background=cfg.log.publish_in_background)
        if trainer.main:
            ctx.metrics.log(step=step, **stats, lr=optimizer.param_groups[0]["lr"],
                            reward_mean=sum(r["reward"] for r in rows) / len(rows),
                            off_policy_max=max((step - 1) - r["policy_version"] for r in rows),
                            step_wait_s=began - waited, train_s=time.time() - began, rollouts=len(rows),
                            **timers.snapshot())
            if step % cfg.eval_every == 0 or step == cfg.steps:
                evaluate(ctx, trainer, task, heldout, timers, step, full)
        waited = time.time()
    last = trainer.version
    trainer.settle()  # the last version visible before the role says it is done
    if trainer.main and not source.stopped:
        if start < last < cfg.steps and last % cfg.eval_every:  # ended by the time budget: evaluate the last version
            evaluate(ctx, trainer, task, heldout, timers, last, full)
        ctx.mark_done(step=last)
    trainer.close()
