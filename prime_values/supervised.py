"""Supervised fine-tuning on reference solutions: the batches, the loss and the one supervised loop under the warm
start's SFT (roles/warm_start.py) and the `sft` stage (stages/sft.py), stepping as the trainers do
(`trainer.optimizer_step`; docs/design.md §1).

Token layout: ``prompt_ids = tokenizer.encode(problem.prompt)`` (no special tokens), response =
``tokenizer.encode(task.solution(problem)) + [eos]`` (a multi-turn task: every turn of its demonstration, each policy
turn followed by eos); sequences are right-padded for training. A task whose problems have a picture (``task.image``:
task=vision) puts its image placeholders before the prompt's characters, the layout its rollouts have
(models/vision.py), and the batch carries the images so the forward reads their pixels.
"""

from __future__ import annotations

import math
import random
import time
from typing import Callable

import torch

from prime_values.rollout import greedy_accuracy
from prime_values.trainer import optimizer_step


def demonstration(task, problem) -> list[tuple[str, bool]]:
    """What the policy is taught to say after ``problem.prompt``: (text, is_policy) segments. A multi-turn task
    (``task.demonstration``: task=guess) plays a whole episode, the environment's replies between the policy's
    turns; every other task answers once, ``task.solution(problem)``."""
    if hasattr(task, "demonstration"):
        return task.demonstration(problem)
    return [(task.solution(problem), True)]


def sft_batch(tokenizer, task, problems, config=None) -> tuple:
    """Right-padded ``input_ids``, ``attention_mask`` and ``labels``: -100 except on the policy's turns, each turn's
    text + eos (a single-reply task: solution + eos); the environment's replies of a multi-turn demonstration are
    context, never labels, as they are policy_mask 0 in RL.

    A task with pictures (``task.image``) needs the policy's ``config`` (how many placeholders an image takes) and
    gives a fourth item, each row's images (PNG bytes, one per row), which ``sft_loss`` reads."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    with_images = hasattr(task, "image")
    if with_images and config is None:
        raise ValueError(f"task={getattr(task, 'name', task)} has images: sft_batch needs the policy's config "
                         "(config=model.config) to lay out their placeholders")
    seqs, labelled, images = [], [], []
    for p in problems:
        if with_images:  # the rollouts' layout: placeholders, then the prompt's characters (tasks/vision.py)
            seq, png = task.prompt_ids(tokenizer, config, p)
            images.append([png])
        else:
            seq = tokenizer.encode(p.prompt, add_special_tokens=False)
        learn = [False] * len(seq)
        for text, is_policy in demonstration(task, p):
            part = tokenizer.encode(text, add_special_tokens=False) + ([eos] if is_policy else [])
            seq += part
            learn += [is_policy] * len(part)
        seqs.append(seq)
        labelled.append(learn)
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (s, learn) in enumerate(zip(seqs, labelled)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        keep = torch.tensor(learn, dtype=torch.bool)
        labels[i, :len(s)] = torch.where(keep, ids[i, :len(s)], torch.tensor(-100))
    return (ids, mask, labels, images) if with_images else (ids, mask, labels)


def sft_loss(model, ids, mask, labels, images: list[list[bytes]] | None = None,
             pack: bool = False) -> tuple[torch.Tensor, dict]:
    """Cross-entropy on the labelled tokens; `pack`: the model runs on the rows' packed lines (critic_io.Packing),
    the same logits, fewer positions computed. `images` (``sft_batch``'s fourth item): each row's images, read by a
    vision-language policy at its placeholders (models.vision.VisionInputs, as the sampler and the policy trainer's
    recompute read them), its vision tokens' logits banned as the sampler bans them (never packed)."""
    from prime_values.critic_io import Packing

    device = next(model.parameters()).device
    ids, mask, labels = ids.to(device), mask.to(device), labels.to(device)
    packing = Packing.gainful(mask.sum(dim=1).tolist()) if pack and images is None else None
    if images is not None:
        from prime_values.models.vision import VisionInputs, reply_logits

        vision = VisionInputs(model, ids, mask, images)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **vision.kwargs).logits[:, :-1].float()
        logits = reply_logits(model.config, logits)
    elif packing is not None:
        logits = packing.forward(model, ids, 0)[:, :-1].float()
    else:
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
        accuracy = greedy_accuracy(model, tokenizer, task, problems, max_new_tokens)
        model.train()
        return accuracy
    return measure


def supervised_train(model, batches: Callable[[int], tuple], steps: int, lr: float, warmup_steps: int = 10,
                     weight_decay: float = 0.0, grad_clip: float = 1.0,
                     accuracy: Callable[[], float] | None = None, target_accuracy: float | None = None,
                     check_every: int = 25, log_every: int = 10,
                     on_step: Callable[[int, dict, bool], None] | None = None, pack: bool = False) -> dict:
    """The one supervised loop (the warm start's SFT and the `sft` stage): ``batches(step)`` gives each step's
    right-padded ``(input_ids, attention_mask, labels)`` (``sft_batch``'s layout); cross-entropy on the labelled
    tokens (``sft_loss``), AdamW (betas 0.9/0.99), linear warm-up over ``warmup_steps`` then constant ``lr``,
    gradient norm clipped at ``grad_clip`` (0 = no clip).

    ``accuracy`` with ``target_accuracy``: every ``check_every`` steps and at the last, ``val_acc = accuracy()``
    (``validation_accuracy``: fixed training problems, never held-out ones), and training stops at the first check
    that reaches the target; ``steps`` is then a cap. Tiny models learn arithmetic through a sharp, seed-dependent
    phase transition, so a fixed step count lands anywhere between 5% and 80%; the target makes SFT land in a band.

    ``pack``: each batch's rows run packed (``sft_loss``; policy.pack_sequences in the warm start).
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

    def backward(step: int) -> dict:
        loss, m = sft_loss(model, *batches(step), pack=pack)
        loss.backward()
        return m
    for step in range(1, steps + 1):
        m = optimizer_step(model, opt, lambda: backward(step), grad_clip)  # the trainers' step (trainer.py)
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
