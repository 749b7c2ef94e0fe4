"""Sampling and scoring problems (held-out evaluation, the critic warm start, the eval stage) and the supervised
warm start for the embedded tasks.

Token layout everywhere: ``prompt_ids = tokenizer.encode(problem.prompt)`` (no special tokens),
response = ``tokenizer.encode(task.solution(problem)) + [eos]``; sequences are right-padded for
training.
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable

import torch

from prime_values.backends import as_backend
from prime_values.tasks.verifiers_env import EnvRollout


def encode_prompts(tokenizer, problems) -> list[list[int]]:
    return [tokenizer.encode(p.prompt, add_special_tokens=False) for p in problems]


def sample_and_score(policy, tokenizer, task, problems, num_samples: int, max_new_tokens: int, temperature: float,
                     seed: int, batch_size: int | None = None) -> list[EnvRollout]:
    """``num_samples`` scored rollouts per problem, grouped by problem (``prompt_index`` into ``problems``): the
    one path of the inference role, the held-out evaluation, the critic warm start's samples and the eval stage.

    A task that drives its own episodes (``task.rollout``: task=verifiers) runs them: multi-turn traces whose
    environment tokens have ``policy_mask`` 0, rewarded by the environment's rubric after its ``run`` and
    ``finalize``. Every other task samples one reply per rollout (``policy_mask`` 1 on it) and scores the batch
    with ``task.score_many`` (``scored_replies``). ``policy``: an inference backend (``prime_values.backends``)
    or a transformers model; ``max_new_tokens`` caps each policy turn; ``temperature <= 0`` decodes greedily;
    ``batch_size`` caps the rows one decode holds."""
    backend = as_backend(policy)
    if hasattr(task, "rollout"):
        return task.rollout(backend.model, tokenizer, problems, num_samples=num_samples,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, batch_size=batch_size)
    prompt_ids = encode_prompts(tokenizer, problems)
    completions = backend.sample(prompt_ids, num_samples=num_samples, max_new_tokens=max_new_tokens,
                                 temperature=temperature, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id, seed=seed, batch_size=batch_size)
    return scored_replies(task, tokenizer, problems, prompt_ids, completions)


def scored_replies(task, tokenizer, problems, prompt_ids, completions) -> list[EnvRollout]:
    """Sampled single replies (``models.sampling.Completion``) as one-turn rollouts, scored in one batch
    (``task.score_many``: math checks it on every verifier worker)."""
    texts = tokenizer.batch_decode([list(c.response_ids) for c in completions], skip_special_tokens=True)
    rewards = task.score_many([problems[c.prompt_index] for c in completions], texts)
    out = []
    for c, text, reward in zip(completions, texts, rewards):
        prompt, response = prompt_ids[c.prompt_index], list(c.response_ids)
        out.append(EnvRollout(c.prompt_index, prompt + response, [0] * len(prompt) + [1] * len(response),
                              [0.0] * len(prompt) + [float(x) for x in c.logprobs], float(reward), c.stop_reason,
                              text, turns=1))
    return out


def heldout_accuracy(model, tokenizer, task, problems=None, max_new_tokens: int | None = None,
                     batch_size: int = 256, per_problem: list | None = None) -> float:
    """Mean reward of one greedy rollout per problem (default: ``task.heldout()``): exact-match accuracy for
    arith, the rubric's reward of whole (multi-turn) episodes for task=verifiers.

    ``per_problem``: a list that receives one record per problem (``prompt_id``, ``reward``, ``stop_reason``,
    ``response_tokens``, ``response`` text and, where the task has ``parsable``, whether the reply holds a final
    answer in the asked format): what a paired before/after comparison needs (bench/paired_heldout.py)."""
    problems = task.heldout() if problems is None else problems
    if not problems:
        return float("nan")
    if max_new_tokens is None:
        max_new_tokens = task.max_answer_chars() + 1
    rollouts = sample_and_score(model, tokenizer, task, problems, num_samples=1, max_new_tokens=max_new_tokens,
                                temperature=0.0, seed=0, batch_size=batch_size)
    if per_problem is not None:
        parsable = getattr(task, "parsable", None)
        for r in rollouts:
            record = {"prompt_id": problems[r.prompt_index].prompt_id, "reward": float(r.reward),
                      "stop_reason": r.stop_reason, "response_tokens": int(sum(r.policy_mask)), "response": r.text}
            if parsable is not None:
                record["parsable"] = bool(parsable(r.text))
            per_problem.append(record)
    return sum(r.reward for r in rollouts) / len(rollouts)


def sft_batch(tokenizer, task, problems) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels`` (-100 except on solution+eos)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seqs, n_prompt = [], []
    for p in problems:
        pi = tokenizer.encode(p.prompt, add_special_tokens=False)
        ri = tokenizer.encode(task.solution(p), add_special_tokens=False) + [eos]
        seqs.append(pi + ri)
        n_prompt.append(len(pi))
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (s, k) in enumerate(zip(seqs, n_prompt)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        labels[i, k:len(s)] = ids[i, k:len(s)]
    return ids, mask, labels


def sft_loss(model, ids, mask, labels) -> tuple[torch.Tensor, dict]:
    device = next(model.parameters()).device
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()
    tgt = labels[:, 1:]
    valid = tgt != -100
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1),
                                             ignore_index=-100)
    with torch.no_grad():
        correct = (logits.argmax(-1) == tgt) & valid
        # a sequence is right under teacher forcing when all its solution tokens are
        seq_ok = (correct | ~valid).all(-1)
    return loss, {"loss": float(loss.detach()), "token_acc": float(correct.sum() / valid.sum().clamp_min(1)),
                  "seq_acc_tf": float(seq_ok.float().mean())}


def validation_accuracy(model, tokenizer, task, seed: int, size: int, max_new_tokens: int | None = None):
    """The early stop's measure: greedy accuracy on ``size`` fixed *training-distribution* problems (drawn with
    ``Random(f"sft-val-{seed}")``, never the held-out set); a callable that leaves the model in train mode."""
    problems = task.sample(random.Random(f"sft-val-{seed}"), size)

    def measure() -> float:
        accuracy = heldout_accuracy(model, tokenizer, task, problems, max_new_tokens)
        model.train()
        return accuracy
    return measure


def supervised_train(model, batches: Callable[[int], tuple], steps: int, lr: float, warmup_steps: int = 10,
                     weight_decay: float = 0.0, grad_clip: float = 1.0,
                     accuracy: Callable[[], float] | None = None, target_accuracy: float | None = None,
                     check_every: int = 25, log_every: int = 10,
                     on_step: Callable[[int, dict, bool], None] | None = None) -> dict:
    """The one supervised loop (the warm start's SFT and the `sft` stage): ``batches(step)`` gives each step's
    right-padded ``(input_ids, attention_mask, labels)`` (``sft_batch``'s layout); cross-entropy on the labelled
    tokens (``sft_loss``), AdamW (betas 0.9/0.99), linear warm-up over ``warmup_steps`` then constant ``lr``,
    gradient norm clipped at ``grad_clip`` (0 = no clip).

    ``accuracy`` with ``target_accuracy``: every ``check_every`` steps and at the last, ``val_acc = accuracy()``
    (``validation_accuracy``: fixed training problems, never held-out ones), and training stops at the first check
    that reaches the target; ``steps`` is then a cap. Tiny models learn arithmetic through a sharp, seed-dependent
    phase transition, so a fixed step count lands anywhere between 5% and 80%; the target makes SFT land in a band.

    ``on_step(step, metrics, log)`` after every step; ``log`` is true every ``log_every`` steps, at a check, at the
    last step and at the stop. Returns the last step's metrics: ``loss``, ``token_acc``, ``seq_acc_tf``
    (teacher-forced exact-sequence accuracy), ``grad_norm``, ``step``, ``lr`` (the next step's, as LambdaLR
    reports it), ``elapsed_s``, and ``val_acc`` / ``stopped_early`` at a check. Leaves the model in train mode."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup_steps) if warmup_steps > 0 else 1.0)
    checking = accuracy is not None and target_accuracy is not None
    t0 = time.perf_counter()
    metrics: dict = {"step": 0, "elapsed_s": 0.0}
    for step in range(1, steps + 1):
        loss, m = sft_loss(model, *batches(step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if grad_clip:
            m["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip))
        opt.step()
        sched.step()
        if not math.isfinite(m["loss"]):
            raise FloatingPointError(f"SFT loss is {m['loss']} at step {step}")
        metrics = {**m, "step": step, "lr": sched.get_last_lr()[0], "elapsed_s": time.perf_counter() - t0}
        stop = checked = False
        if checking and (step % check_every == 0 or step == steps):
            metrics["val_acc"] = accuracy()
            stop, checked = metrics["val_acc"] >= target_accuracy, True
            metrics["stopped_early"] = stop and step < steps
        if on_step is not None:
            on_step(step, metrics, step % log_every == 0 or step == steps or stop or checked)
        if stop:
            break
    return metrics
