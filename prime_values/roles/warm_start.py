"""Warm start: build (or load) the policy, fine-tune it on reference solutions, publish policy and critic v0.

Runs alone before the RL roles start, so it uses every core. Rerunning it in a run directory that already
has policy version 0 does nothing (the run resumes from what is published)."""

from __future__ import annotations

import os
import time

import torch

from prime_values.roles.common import RoleContext
from prime_values.weights import latest_version, publish, version_dir


def main(run_dir: str) -> None:
    from transformers import AutoTokenizer

    from prime_values.models import build_critic, build_char_tokenizer, build_tiny_policy, load_policy, save_model
    from prime_values.roles.evaluation import heldout_accuracy, supervised_warm_start
    from prime_values.tasks import make_task

    ctx = RoleContext(run_dir, "warm_start")
    cfg = ctx.cfg
    policy_root, critic_root = ctx.run.weights("policy"), ctx.run.weights("critic")
    if latest_version(policy_root) is not None and latest_version(critic_root) is not None:
        ctx.log.info("policy and critic already published in %s; nothing to do", ctx.run.root)
        return
    torch.set_num_threads(os.cpu_count() or 1)  # alone on the machine while it runs
    task = make_task(**cfg.task)
    arch = dict(cfg.policy.arch)
    if cfg.policy.model == "tiny":
        tokenizer = build_char_tokenizer()
        model = build_tiny_policy(tokenizer, seed=ctx.seed(), **arch)
    else:
        tokenizer, model = AutoTokenizer.from_pretrained(cfg.policy.model), load_policy(cfg.policy.model)
    began = time.time()
    ws = cfg.policy.warm_start

    def on_log(step: int, metrics: dict) -> None:
        ctx.metrics.log(sft_step=step, **metrics)
        if ctx.stopping():
            raise SystemExit(f"warm start stopped at step {step}: the run was stopped")

    if ws.steps > 0:
        supervised_warm_start(model, tokenizer, task, steps=ws.steps, batch_size=ws.batch_size, lr=ws.lr,
                              seed=ctx.seed(), on_log=on_log, log_every=10)
    model.eval()
    accuracy = heldout_accuracy(model, tokenizer, task, task.heldout(), cfg.inference.max_new_tokens)
    ctx.metrics.log(sft_steps=ws.steps, sft_s=time.time() - began, heldout_accuracy=accuracy)
    if latest_version(policy_root) is None:
        publish(policy_root, 0, lambda path: save_model(model, tokenizer, path))
    if cfg.critic.init == "policy":
        critic = build_critic(version_dir(policy_root, 0), tokenizer, seed=ctx.seed(1), **arch)
    elif cfg.critic.init == "scratch":
        critic = build_critic(None, tokenizer, seed=ctx.seed(1), **arch)
    else:
        from prime_values.models import load_critic

        critic = load_critic(cfg.critic.init)
    publish(critic_root, 0, lambda path: save_model(critic, tokenizer, path))
