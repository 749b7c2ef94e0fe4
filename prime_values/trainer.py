"""One trainer scaffold: resume -> shard -> step -> publish/prune (docs/design.md §1, §2.3), under the policy
trainer and the value trainer (roles/) and, for its optimizer step, the supervised loop (supervised.py).

- `Trainer.resume`: the newest version of `weights/<kind>/` that loads (rank 0 decides; `weights.resume` moves a
  damaged one aside and the trainer redoes it), which the other ranks then load; activation checkpointing per block,
  FSDP2 sharding (`dist.shard`), the optimizer, and the Adam moments saved with that version (any process count).
- `Trainer.batches(source)`: rank 0's `(batch, publish_now)` items, broadcast to every rank, until the source ends
  (the run stops; the steps or the time budget run out). A role's loop is one `for` over them; the source is where
  a role's schedule lives (batch n for step n; replay samples; lockstep plans).
- `optimizer_step`: one optimizer step (zero the gradients, accumulate them, clip the norm, step), the policy
  trainer's and the critic's (`critic_io.critic_step`).
- `Trainer.publish`: the next version: the optimizer state gathered every `log.optimizer_state_every` versions,
  the full model gathered, published by rank 0, then `published()` (the policy trainer commits its batch there),
  then pruned to `log.keep_weights` (version 0 and a LoRA base protected). Every rank calls it (collectives).
  With `background` (the policy trainer's `log.publish_in_background`) the files are written at once and the rest
  (fsync, rename, `published()`, prune) runs on a thread while the next step computes; `Trainer.settle()` waits
  for it and raises its error. The value trainer publishes in the foreground: its colocated evaluator labels values
  with the version it just published.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable

from prime_values import dist
from prime_values.weights import prune, resume, stage, version_dir


def optimizer_step(model, optimizer, backward: Callable[[], dict], max_grad_norm: float) -> dict:
    """One optimizer step, the policy trainer's, the critic's (`critic_io.critic_step`) and the supervised loop's:
    zero the gradients, `backward()` (accumulates them, the loss scaled by `dist.loss_scale`; returns the step's
    statistics), clip the gradient norm at `max_grad_norm` and report it as `grad_norm` (0: no clip, no
    `grad_norm`), step."""
    optimizer.zero_grad(set_to_none=True)
    stats = backward()
    if max_grad_norm > 0:
        stats["grad_norm"] = dist.clip_grad_norm(model.parameters(), max_grad_norm)
    optimizer.step()
    return stats


class Trainer:
    """A trainer's model, optimizer and newest published version (`version`), on every rank of its group."""

    def __init__(self, ctx, kind: str, section, group, model, optimizer, tokenizer, version: int, timers):
        self.ctx, self.kind, self.section, self.group, self.timers = ctx, kind, section, group, timers
        self.model, self.optimizer, self.tokenizer, self.version = model, optimizer, tokenizer, version
        self.root = ctx.run.weights(kind)
        self._finishing: Future | None = None  # the previous version's fsync-rename-commit-prune
        self._finisher: ThreadPoolExecutor | None = None

    @classmethod
    def resume(cls, ctx, kind: str, section, procs: int, make_optimizer: Callable, timers) -> "Trainer":
        """Join the trainer's process group and resume `kind` ('policy' or 'critic', whose config `section` has
        lora and activation_checkpointing) from its newest loadable version; `make_optimizer(parameters)` builds the
        optimizer over the trainable parameters (LoRA: the adapter)."""
        from transformers import AutoTokenizer

        from prime_values.models import lora, read_optimizer_state
        from prime_values.models.build import enable_checkpointing

        cfg, root = ctx.cfg, ctx.run.weights(kind)
        group = dist.setup(procs, ctx.device, cfg.launcher.timeout_min)  # group.device: ctx.device or this rank's GPU
        load = lora.trainer_loader(section.lora, kind, ctx.seed(7), ctx.attention)  # LoRA: base + adapter
        version, loaded = resume(root, load) if group.main else (None, None)
        version = dist.broadcast(version)
        assert version is not None, f"no {kind} version in {root}: the warm-start job publishes version 0"
        model = (loaded if group.main else load(version_dir(root, version))).to(group.device).train()
        if section.activation_checkpointing:  # per transformer block, before sharding
            enable_checkpointing(model)
        model = dist.shard(model)  # policy.dtype=bf16-mixed: bf16 all-gathers, fp32 gradient reduction
        tokenizer = AutoTokenizer.from_pretrained(version_dir(ctx.run.weights("policy"), 0))
        optimizer = make_optimizer(lora.trainable(model))
        if version > 0:  # the Adam moments of the version resumed from, with any process count
            name = "version" if kind == "policy" else f"{kind} version"
            ctx.log.info("resuming after %s %d: %s", name, version, dist.restore_optimizer_state(
                model, optimizer, lambda: read_optimizer_state(version_dir(root, version))))
        return cls(ctx, kind, section, group, model, optimizer, tokenizer, version, timers)

    @property
    def main(self) -> bool:
        return self.group.main

    @property
    def device(self) -> str:
        return self.group.device

    def batches(self, source: Iterable | None):
        """Every rank: the `(batch, publish_now)` items of rank 0's `source` (None on the other ranks, which train
        on what rank 0 broadcasts), until the source ends."""
        items = iter(source) if self.main else None
        while True:
            batch, publish_now = dist.broadcast(next(items, (None, False)) if self.main else None)
            if batch is None:
                return
            yield batch, publish_now

    def publish(self, extra: Callable[[Path], None] | None = None, weights=contextlib.nullcontext,
                published: Callable[[], None] | None = None, background: bool = False):
        """Publish version `version + 1` (every rank calls it); returns the whole model (rank 0's unsharded copy
        when sharded, None on the other ranks). `extra(path)` adds files to the version; `weights()` is a context
        in which the model holds the weights to publish (critic.weight_average: the averaged ones). `background`
        (the policy trainer's `log.publish_in_background`): the fsync, rename, `published()` and prune run on a
        thread, and the caller goes on at once (`settle` waits for them)."""
        from prime_values.models import lora, save_optimizer_state

        self.version += 1
        every = self.ctx.cfg.log.optimizer_state_every
        with self.timers.time("compute"):  # gathered by every rank (a collective), saved by rank 0
            opt_state = dist.optimizer_state(self.model, self.optimizer) \
                if every and self.version % every == 0 else None
        with weights():
            with self.timers.time("compute"):
                full = dist.unsharded(self.model)  # the model itself with one process
            if self.main:

                def save(path: Path) -> None:
                    lora.saver(self.section.lora)(full, self.tokenizer, path)  # adapter-only with LoRA
                    if extra is not None:
                        extra(path)
                    if opt_state is not None:
                        save_optimizer_state(opt_state, path)
                self.settle()  # at most one version in flight: versions appear in order
                with self.timers.time("io"):
                    staged = stage(self.root, self.version, save)

                def finish() -> None:
                    staged.finish()
                    if published is not None:
                        published()
                    prune(self.root, keep=self.ctx.cfg.log.keep_weights, protect=lora.protected(full))
                if background:
                    self._finisher = self._finisher or ThreadPoolExecutor(1, thread_name_prefix=f"publish-{self.kind}")
                    self._finishing = self._finisher.submit(finish)
                else:
                    with self.timers.time("io"):
                        finish()
        return full

    def settle(self) -> None:
        """Wait until the last `publish` is visible and its input committed; raise what it raised."""
        if self._finishing is not None:
            finishing, self._finishing = self._finishing, None
            with self.timers.time("io"):
                finishing.result()

    def close(self) -> None:
        self.settle()
        if self._finisher is not None:
            self._finisher.shutdown()
        dist.teardown()
