"""Warm start: build (or load) the policy, fine-tune it on reference solutions until it solves some held-out
problems, publish policy v0, then pretrain the critic on Monte-Carlo returns of v0's own samples and publish
critic v0.

Runs alone before the RL roles start, so it uses every core (launch.solo_threads), fewer while the machine is
shared and fewer are faster (`Phases`, monitor.ThreadTuner, topology.solo_threads_slowdown). What it is doing (the
phase, the step and its rate, slow steps) goes out with its heartbeat for the live view. Rerunning it in a run
directory that already has policy and critic version 0 does nothing (the run resumes from what is published)."""

from __future__ import annotations

import json
import math
import random
import time
from typing import TYPE_CHECKING

import torch

from prime_values.algo.ema import WeightAverage
from prime_values.algo.gae import gae
from prime_values.config.critic import trains_critic
from prime_values.config.policy import VISION_MODEL
from prime_values.critic_io import critic_step, padded
from prime_values.launch import solo_threads
from prime_values.log import LogReader, to_rows
from prime_values.log.images import IMAGES_DIR, ImageStore
from prime_values.monitor import Pace, ThreadTuner
from prime_values.roles.common import RoleContext
from prime_values.roles.inference import env_rows
from prime_values.rollout import greedy_accuracy, sample_and_score
from prime_values.rundir import RunDir, write_atomic
from prime_values.supervised import sft_batch, supervised_train, validation_accuracy
from prime_values.tasks import make_task
from prime_values.tasks.pool import training_prompts
from prime_values.weights import latest_version, publish, version_dir

if TYPE_CHECKING:
    from prime_values.config import Config


class Phases:
    """The warm start's phases, one at a time (SFT, the rollouts for the critic, critic pretraining, and one-off
    ones: a held-out evaluation, publishing): what it is doing, said through the heartbeat (RoleContext.doing) with
    each step's pace (monitor.Pace: step n/N, rate, slow steps), and its thread count, kept to the fastest while
    the machine is shared (monitor.ThreadTuner, fed the training steps' durations). `step()` also polls the stop
    request, as every role's loop does."""

    def __init__(self, ctx: RoleContext):
        self.ctx = ctx
        self.tuner = ThreadTuner(solo_threads(), ctx.cfg.topology.solo_threads_slowdown)
        torch.set_num_threads(self.tuner.threads)
        self.begin("starting", tune=False)

    def begin(self, what: str, of: int | None = None, unit: str = "step", tune: bool = True) -> None:
        """A new phase: `of` steps (or rollouts, `unit`) to go; `tune`: its steps' durations choose the threads."""
        self.what, self.of, self.unit, self.tune, self.note, self.change = what, of, unit, tune, None, None
        self.pace = Pace()
        self.tuner.new_phase()  # a trial the last phase ended in is undone: it decided nothing
        self.show(flush=True)

    def show(self, what: str | None = None, flush: bool = False) -> None:
        """Say the phase's progress; `what`: something else within it (a validation check: no step under way)."""
        extra = {} if what is not None else {**({"of": self.of} if self.of else {}), **self.pace.fields()}
        if self.note:
            extra["note"] = self.note
        if self.change:
            extra["threads_change"] = self.change
        self.ctx.doing(what or self.what, flush=flush, unit=self.unit, threads=self.tuner.threads, **extra)

    def step(self, step: int, seconds: float, amount: float = 1.0) -> None:
        """Step `step` of the phase took `seconds` (its own work: no validation check, no logging)."""
        slow = self.pace.add(seconds, step, amount)
        if slow:
            self.ctx.log.warning("%s step %d took %.2f s, %.0fx the median %.3f s of the steps before it: the "
                                 "machine may be shared", self.what, step, seconds, seconds / slow["median_s"],
                                 slow["median_s"])
        change = self.tuner.add(seconds) if self.tune else None
        if change:
            self.change = {"text": change, "at": time.time()}
            self.ctx.log.info("%s, step %d: %s", self.what, step, change)
            self.ctx.metrics.log(threads=self.tuner.threads, threads_change=change, threads_phase=self.what,
                                 threads_step=step)
        self.show()
        if self.ctx.stopping():
            raise SystemExit(f"warm start stopped during {self.what} at step {step}: the run was stopped")


def evaluate_heldout(ctx: RoleContext, model, tokenizer, task, name: str) -> float:
    """Greedy held-out accuracy of ``model`` (one reply per problem, ``inference.max_new_tokens``), each problem's
    outcome written to ``metrics/heldout/<name>.jsonl`` as the policy trainer writes its ``step_<n>.jsonl``
    (bench/paired_heldout.py pairs them)."""
    records: list[dict] = []
    accuracy = greedy_accuracy(model.eval(), tokenizer, task, task.heldout(), ctx.cfg.inference.max_new_tokens,
                                per_problem=records)
    path = ctx.run.root / "metrics" / "heldout" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in records))
    return accuracy


def supervised(ctx: RoleContext, model, tokenizer, task, phases: Phases | None = None) -> float | None:
    """SFT until greedy accuracy on a fixed validation sample of *training* problems reaches `target_accuracy`
    (checked every `check_every` steps) or `steps` run out; returns the held-out accuracy it ends at (None
    without SFT steps, or with `heldout_after=false`: the policy trainer's step-0 evaluation measures the same
    weights, and a real model's evaluation takes minutes on a CPU).

    With `heldout_before`, the held-out set is evaluated once with the model as loaded, before any SFT step
    (`metrics/heldout/before_sft.jsonl`, `heldout_accuracy_before_sft`): SFT's gain is then measured apart from
    RL's on the same problems. Nothing is stopped or selected on a held-out number, so "accuracy at the first RL
    step" is not a number SFT was stopped on."""
    ws, last_val = ctx.cfg.policy.warm_start, {}
    phases = phases or Phases(ctx)
    if ws.heldout_before:
        phases.begin("held-out evaluation before SFT", tune=False)
        began = time.time()
        before = evaluate_heldout(ctx, model, tokenizer, task, "before_sft")
        ctx.metrics.log(heldout_accuracy_before_sft=before, heldout_before_sft_s=time.time() - began)
        model.train()
    clock = {"began": 0.0, "check_s": 0.0, "step": 0}  # a step's own time: from its batch to on_step, less the check

    def batch(step: int):
        clock["began"], clock["check_s"], clock["step"] = time.perf_counter(), 0.0, step
        return sft_batch(tokenizer, task, task.sample(rng, ws.batch_size), model.config)

    def check() -> float:
        phases.show(f"SFT validation check after step {clock['step']}", flush=True)
        began = time.perf_counter()
        value = accuracy()
        clock["check_s"] = time.perf_counter() - began
        return value

    def on_step(step: int, metrics: dict, log: bool) -> None:
        if "val_acc" in metrics:
            phases.note = f"validation acc {metrics['val_acc']:.2f} at step {step} (target {target:.2f})"
        if log:
            last_val.update({"sft_val_accuracy": metrics["val_acc"]} if "val_acc" in metrics else {})
            ctx.metrics.log(sft_step=step, **metrics, **last_val, threads=phases.tuner.threads)
        phases.step(step, time.perf_counter() - clock["began"] - clock["check_s"])

    if ws.steps > 0:
        rng = random.Random(f"sft-{ctx.seed()}")
        target = ws.target_accuracy if ws.target_accuracy > 0 else None
        accuracy = validation_accuracy(model, tokenizer, task, ctx.seed(), 200) if target is not None else None
        phases.begin("SFT", of=ws.steps)
        supervised_train(model, batch, ws.steps, lr=ws.lr, warmup_steps=ws.warmup_steps,
                         accuracy=check if target is not None else None, target_accuracy=target,
                         check_every=ws.check_every, log_every=math.gcd(10, ws.check_every), on_step=on_step,
                         pack=ctx.cfg.policy.pack_sequences)
    model.eval()
    if ws.steps == 0 or not ws.heldout_after:
        return None
    phases.begin("held-out evaluation after SFT", tune=False)
    return evaluate_heldout(ctx, model, tokenizer, task, "after_sft")


def sample_for_critic(ctx: RoleContext, policy, tokenizer, task, phases: Phases | None = None) -> list[dict]:
    """Rollouts of the warm-started policy with their Monte-Carlo value targets (the critic's first data): sampled
    as the inference role samples (``group_size`` per prompt at ``inference.temperature``; a task with episodes,
    task=verifiers, runs them, so multi-turn traces keep their environment tokens at policy_mask 0; a task with
    images, task=vision, has them stored in the run's image store, as the inference role stores its own)."""
    cfg, rows, rng = ctx.cfg, [], random.Random(ctx.seed(2))
    images = ImageStore(ctx.run.log / IMAGES_DIR)  # written only by a task with images
    pool = training_prompts(task, cfg.task.train_pool, cfg.task.seed)
    prompts = max(1, cfg.critic.warm_start.rollouts // cfg.inference.group_size)
    if phases is not None:
        phases.begin("generating rollouts for critic pretraining", of=prompts * cfg.inference.group_size,
                     unit="rollouts", tune=False)
    for chunk, begin in enumerate(range(0, prompts, 64)):
        began = time.perf_counter()
        problems = pool.sample(rng, min(64, prompts - begin))
        rollouts = sample_and_score(policy, tokenizer, task, problems, num_samples=cfg.inference.group_size,
                                    max_new_tokens=cfg.inference.max_new_tokens,
                                    temperature=cfg.inference.temperature, seed=ctx.seed(3, chunk))
        rows += env_rows(problems, rollouts, 0, "pretrain", chunk, images)
        if phases is not None:
            phases.step(len(rows), time.perf_counter() - began, amount=len(rollouts))
    return with_mc_returns(ctx, rows)


def rollouts_of_run(ctx: RoleContext, run_dir: str) -> list[dict]:
    """The newest `critic.warm_start.rollouts` rollouts of an earlier run's log, with Monte-Carlo returns."""
    reader = LogReader(RunDir(run_dir).stream("rollouts"), "warm_start.from_run", ctx.run.cursors, "rollouts")
    rows = [row for segment in reader.poll() for row in to_rows(segment.table)]  # never committed: read-only
    if not rows:
        raise ValueError(f"critic.warm_start.from_run={run_dir!r}: its rollout log holds no readable rollouts")
    rows.sort(key=lambda r: r["created_at"])
    return with_mc_returns(ctx, rows[-ctx.cfg.critic.warm_start.rollouts:])


def with_mc_returns(ctx: RoleContext, rows: list[dict]) -> list[dict]:
    """Attach λ = 1 value targets (Monte-Carlo returns) to rollout rows."""
    cfg = ctx.cfg
    mask = padded(rows, "policy_mask", torch.bool)
    rewards = torch.tensor([r["reward"] for r in rows])
    _, returns = gae(rewards, torch.zeros(mask.shape), mask, cfg.advantage.gamma, 1.0)  # MC: lambda = 1
    for b, row in enumerate(rows):
        row["value_targets"] = returns[b, : len(row["token_ids"])].tolist()
    return rows


def pretrain_critic(ctx: RoleContext, critic, tokenizer, rows: list[dict], phases: Phases | None = None) -> None:
    cfg = ctx.cfg
    phases = phases or Phases(ctx)
    critic.train()
    optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr)
    average = WeightAverage(critic.parameters(), cfg.critic.weight_average)  # version 0 is the average too
    rng = random.Random(ctx.seed(4))
    steps = cfg.critic.warm_start.steps
    phases.begin("critic pretraining", of=steps)
    for step in range(1, steps + 1):
        began = time.perf_counter()
        stats = critic_step(critic, optimizer, rng.sample(rows, min(cfg.critic.batch_rollouts, len(rows))),
                            tokenizer, cfg, ctx.device)
        average.update()
        took = time.perf_counter() - began
        if step % 25 == 0 or step == steps:
            ctx.metrics.log(critic_pretrain_step=step, **stats, threads=phases.tuner.threads)
        phases.step(step, took)  # raises SystemExit when the run was stopped
    average.assign()
    critic.eval()


def initial_critic(cfg: Config, policy_dir, tokenizer, seed: int, attention=None):
    """The untrained critic of a run (critic.init, critic.num_layers): the policy's backbone at `policy_dir`, a
    fresh one from policy.arch, or a saved critic; the value head is fresh where the critic is new. `attention`:
    the role's (models.build.Attention; None = the default, sdpa in float32)."""
    from prime_values.models import build_critic, keep_layers, load_critic
    from prime_values.models.build import DEFAULT_ATTENTION

    attention = attention or DEFAULT_ATTENTION
    if cfg.critic.init == "policy":
        return build_critic(policy_dir, tokenizer, seed=seed, depth=cfg.critic.num_layers, attention=attention)
    if cfg.critic.init == "scratch":
        return build_critic(None, tokenizer, seed=seed, depth=cfg.critic.num_layers, attention=attention,
                            **dict(cfg.policy.arch))
    return keep_layers(load_critic(cfg.critic.init, attention), cfg.critic.num_layers)


def main(run_dir: str) -> None:
    from transformers import AutoTokenizer

    from prime_values.models import build_char_tokenizer, build_tiny_policy, load_policy, save_model
    from prime_values.models.build import build_tiny_vl_policy
    from prime_values.models.tokenizer import ensure_pad_token
    from prime_values.models.vision import build_vl_tokenizer

    ctx = RoleContext(run_dir, "warm_start", "policy_trainer_device")  # the policy trainer's device is free now
    cfg = ctx.cfg
    ctx.seed_root = cfg.policy.warm_start.seed  # version 0 does not depend on the RL seed
    torch.manual_seed(ctx.seed())
    policy_root, critic_root = ctx.run.weights("policy"), ctx.run.weights("critic")
    if latest_version(policy_root) is not None and latest_version(critic_root) is not None:
        ctx.log.info("policy and critic already published in %s; nothing to do", ctx.run.root)
        ctx.mark_done()
        return
    phases = Phases(ctx)  # alone on the machine while it runs: every core, fewer while fewer are faster
    task = make_task(**cfg.task)
    arch = dict(cfg.policy.arch)
    began = time.time()
    if latest_version(policy_root) is None:
        if cfg.policy.model == "tiny":
            tokenizer = build_char_tokenizer()
            model = build_tiny_policy(tokenizer, seed=ctx.seed(), attention=ctx.attention, **arch)
        elif cfg.policy.model == VISION_MODEL:  # policy.arch does not apply (models.vision.VL_ARCH)
            tokenizer = build_vl_tokenizer()
            model = build_tiny_vl_policy(tokenizer, seed=ctx.seed(), attention=ctx.attention)
        else:
            tokenizer = AutoTokenizer.from_pretrained(cfg.policy.model)
            model = load_policy(cfg.policy.model, ctx.attention)
            ensure_pad_token(tokenizer)  # the sampler pads with it; saved with version 0 for every role
        model = model.to(ctx.device)
        accuracy = supervised(ctx, model, tokenizer, task, phases)
        ctx.metrics.log(sft_s=time.time() - began, threads=phases.tuner.threads,
                        **({} if accuracy is None else {"heldout_accuracy": accuracy}))
        phases.begin("publishing policy v0", tune=False)
        publish(policy_root, 0, lambda path: save_model(model, tokenizer, path))
    policy_dir = version_dir(policy_root, 0)
    phases.begin("loading policy v0 and building the critic", tune=False)
    model = load_policy(policy_dir, ctx.attention).to(ctx.device).eval()
    tokenizer = AutoTokenizer.from_pretrained(policy_dir)
    critic = initial_critic(cfg, policy_dir, tokenizer, seed=ctx.seed(1), attention=ctx.attention).to(ctx.device)
    if cfg.critic.warm_start.steps > 0 and cfg.resolved.uses_critic and trains_critic(cfg):
        began, cpu_began = time.time(), time.process_time()
        from_run = cfg.critic.warm_start.from_run
        if from_run:
            phases.begin(f"reading the rollouts of {from_run}", tune=False)
        rows = rollouts_of_run(ctx, from_run) if from_run else sample_for_critic(ctx, model, tokenizer, task, phases)
        # what the critic's warm start cost in generation (0 new tokens when it reuses an earlier run's log):
        # these rollouts are never written to the rollout log (bench/equal_budget.py charges them to the run)
        generated = 0 if from_run else sum(sum(r["policy_mask"]) for r in rows)
        ctx.metrics.log(critic_pretrain_rollouts=len(rows), critic_pretrain_generated_tokens=generated)
        pretrain_critic(ctx, critic, tokenizer, rows, phases)
        ctx.metrics.log(critic_pretrain_s=time.time() - began, critic_pretrain_cpu_s=time.process_time() - cpu_began,
                        threads=phases.tuner.threads, threads_changes=len(phases.tuner.changes))
    phases.begin("publishing critic v0", tune=False)
    publish(critic_root, 0, lambda path: save_model(critic, tokenizer, path))
    ctx.mark_done()
