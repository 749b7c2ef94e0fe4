"""Inference worker: sample groups with the newest adopted policy, score them, append them to the log.

Worker `w` owns log shard `w<w>` and its own slice of the prompt stream. Its chunk `c` (its segment number)
is meant for policy step `c + 1`, so it waits until the policy trainer has published version
`c - max_off_policy` rather than generate rollouts the orchestrator could never admit.
"""

from __future__ import annotations

import json
import random
import time
from typing import TYPE_CHECKING

from prime_values.backends import make_backend
from prime_values.log.images import IMAGES_DIR, ImageStore
from prime_values.monitor import Timers
from prime_values.roles.common import RoleContext
from prime_values.rollout import sample_and_score, scored_replies
from prime_values.rundir import write_atomic
from prime_values.tasks import make_task
from prime_values.tasks.pool import training_prompts
from prime_values.weights import latest_version

if TYPE_CHECKING:
    from prime_values.config import Config


def build_rows(problems, completions, prompt_ids, task, policy_version: int, shard: str, chunk: int,
               tokenizer) -> list[dict]:
    """Rollout records of sampled single replies (``models.sampling.Completion``), scored in one batch."""
    rollouts = scored_replies(task, tokenizer, problems, prompt_ids, completions)
    return env_rows(problems, rollouts, policy_version, shard, chunk)


def env_rows(problems, rollouts, policy_version: int, shard: str, chunk: int, images: ImageStore | None = None
             ) -> list[dict]:
    """One rollout record per scored rollout (``EnvRollout``: a single reply, or an episode of ``task.rollout``
    whose environment tokens have policy_mask 0): the flat trace, its masks, logprobs and verified reward; a
    rollout with images (tasks.vision.VisionRollout) has them put in `images`, the run's image store, once each,
    and recorded by hash."""
    rows, now = [], time.time()
    for k, r in enumerate(rollouts):
        problem = problems[r.prompt_index]
        meta = {"prompt": problem.prompt, "answer": problem.answer, "response": r.text, "turns": r.turns,
                "rewards": r.rewards, "error": r.error}
        if getattr(r, "calls", None) is not None:  # a tool-calling episode (tasks/tools.py): its calls, per turn
            meta["calls"] = r.calls
        rows.append({
            "rollout_id": f"{shard}-{chunk:06d}-{k:04d}",
            "prompt_id": problem.prompt_id,
            "group_id": f"{shard}-{chunk:06d}-{r.prompt_index:04d}",
            "shard": shard,
            "policy_version": policy_version,
            "token_ids": list(r.token_ids),
            "policy_mask": list(r.policy_mask),
            "sampling_logprobs": [float(x) for x in r.logprobs],
            "reward": float(r.reward),
            "stop_reason": r.stop_reason,
            "privileged": problem.privileged,
            "task": json.dumps(meta),
            "created_at": now,
            "images": [_store(images).put(png) for png in getattr(r, "images", ())],
        })
    return rows


def _store(images: ImageStore | None) -> ImageStore:
    assert images is not None, "a rollout with images needs the run's image store (env_rows' images argument)"
    return images


def generate_rows(task, policy, tokenizer, problems, cfg: Config, seed: int, policy_version: int, shard: str,
                  chunk: int, images: ImageStore | None = None) -> list[dict]:
    """Sample and score one chunk: ``group_size`` rollouts per problem (``rollout.sample_and_score``:
    episodes for a task that drives its own turns, one reply per rollout otherwise). ``policy`` is an inference
    backend (``prime_values.backends``: hf or vllm) or a bare transformers model."""

    inf = cfg.inference
    rollouts = sample_and_score(policy, tokenizer, task, problems, num_samples=inf.group_size,
                                max_new_tokens=inf.max_new_tokens, temperature=inf.temperature, seed=seed)
    return env_rows(problems, rollouts, policy_version, shard, chunk, images)


class WarmupOffset:
    """During the critic warm-up (critic.warmup) inference runs free: its chunks only train the critic. When the
    orchestrator opens the gate, the next chunk becomes the one for step 1; that offset is kept in the role's
    state directory so a restarted worker counts the same way."""

    def __init__(self, ctx: RoleContext) -> None:
        w, self.run = ctx.cfg.critic.warmup, ctx.run
        self.path = ctx.state / "warmup_offset"
        enabled = ctx.cfg.resolved.uses_critic and (w.min_version > 0 or w.min_explained_variance is not None)
        self._offset = int(self.path.read_text()) if self.path.exists() else (None if enabled else 0)

    @property
    def free_running(self) -> bool:
        return self._offset is None

    def offset(self, chunk: int) -> int:
        if self._offset is None and self.run.warmup_done_file.exists():
            self._offset = chunk
            write_atomic(self.path, f"{chunk}\n")
        return self._offset or 0


def main(run_dir: str, worker: int = 0) -> None:
    ctx = RoleContext(run_dir, f"inference{worker}", "inference_device")
    backend = make_backend(ctx.cfg, ctx.device, ctx.run.weights("policy"), seed=ctx.seed(),  # inference.backend
                           attention=ctx.attention)
    try:
        generate(ctx, backend, f"w{worker}")
    finally:
        backend.close()


def generate(ctx: RoleContext, backend, shard: str) -> None:
    """The worker's loop: adopt the newest policy version (`backend.policy`, an Adopter: in place, LoRA versions
    adapter only), sample a chunk for the step it is meant for, append it to the log shard."""
    from transformers import AutoTokenizer

    cfg, policy, timers = ctx.cfg, backend.policy, Timers()
    task = make_task(**cfg.task)
    prompts = training_prompts(task, cfg.task.train_pool, cfg.task.seed)
    policy_root = ctx.run.weights("policy")
    with timers.time("wait"):
        policy.wait(timeout_s=600, stop=ctx.stopping)
    tokenizer = AutoTokenizer.from_pretrained(policy_root / str(policy.version))
    writer = ctx.writer("rollouts", shard)
    images = ImageStore(ctx.run.log / IMAGES_DIR)  # a vision task's images, once each, by content hash
    prompts_per_chunk = cfg.inference.prompts_per_step // cfg.topology.inference_workers
    chunk = writer.next_seq  # resumes after the last published segment
    paused_s = 0.0
    warmup = WarmupOffset(ctx)
    max_off_policy = cfg.resolved.max_off_policy  # lockstep: 0, chunk c waits for policy version c

    while not ctx.stopping():
        step = chunk + 1 - warmup.offset(chunk)  # the policy step this chunk is generated for
        needed = step - 1 - max_off_policy
        if not warmup.free_running and (step > cfg.steps or (latest_version(policy_root) or 0) < needed):
            ctx.doing("all chunks generated" if step > cfg.steps else f"waiting for policy v{needed}",
                      note=f"chunk {chunk} is for step {step}")
            paused = time.time()
            ctx.wait()  # paused: ahead of the policy trainer (or done)
            paused_s += time.time() - paused
            timers.add("wait", time.time() - paused)
            continue
        with timers.time("io"):
            policy.poll()
        started = time.time()
        rng = random.Random(ctx.seed(chunk))
        problems = prompts.sample(rng, prompts_per_chunk)
        ctx.doing(f"generating chunk {chunk}" + (" (free-running until the critic warm-up gate opens)"
                                                 if warmup.free_running else f" for step {step}"),
                  note=f"policy v{policy.version}", flush=True)  # generating polls nothing until the chunk is out
        with timers.time("compute"), ctx.cores.computing():  # topology.lend_idle_cores: lent while waiting
            rows = generate_rows(task, backend, tokenizer, problems, cfg, ctx.seed(chunk, 1), policy.version,
                                 shard, chunk, images)
        generated = time.time() - started
        with timers.time("io"):
            writer.append(rows)
        elapsed = time.time() - started
        new_tokens = sum(sum(r["policy_mask"]) for r in rows)
        ctx.metrics.log(chunk=chunk, for_step=step, warmup=warmup.free_running, policy_version=policy.version,
                        rollouts=len(rows),
                        reward_mean=sum(r["reward"] for r in rows) / len(rows), gen_s=elapsed,
                        tokens_per_s=new_tokens / max(elapsed, 1e-9), paused_s=paused_s,
                        generate_tokens_per_s=new_tokens / max(generated, 1e-9),
                        skipped_policy_versions=len(policy.skipped), **timers.snapshot())
        paused_s = 0.0
        chunk += 1
