"""The `sft` stage: supervised fine-tuning of `policy.model` on (prompt, response) examples, saved as a
`from_pretrained` directory (safetensors + tokenizer) in `<run>/stages/sft/model`.

Examples come from one of
- `sft.data=task`: the task's own reference solutions (`task.solution(problem)`), what the embedded warm start
  of the rl stage trains on;
- `sft.data=<file | directory | hub name>` through HF `datasets`: rows with `prompt` + `completion` (or
  `response`) are used verbatim; GSM8K / MATH rows (`question`/`problem` + `answer`/`solution`) are formatted by
  the math task (its prompt template, its `solution()`), so SFT prompts are exactly the prompts RL samples on;
- `sft.from_run=<run dir>`: that run's rollouts with `reward >= sft.min_reward` (rejection sampling), each
  distinct prompt + response once.

A task with pictures (task=vision: `task.image`) trains on its own problems only (`sft.data=task`): each batch is
`supervised.sft_batch` of fresh problems, its prompts laid out as the rollouts lay them out (the image's
placeholders, then the text) and read with their pictures; a dataset or an earlier run's texts carry no pictures
and are refused in one sentence. `policy=tiny_vl` builds the embedded vision-language policy (models.vision).

The loss is the embedded warm start's (`supervised.sft_loss`: cross-entropy on response + eos tokens),
with the same optimizer and schedule (AdamW, linear warm-up, constant, gradient clip 1); the optional early stop
(`sft.target_accuracy`) measures greedy accuracy on fixed *training* problems of the task, never held-out ones.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

from prime_values.log import LogReader, to_rows
from prime_values.rollout import greedy_accuracy
from prime_values.rundir import RunDir
from prime_values.stages.common import StageContext, StageStopped
from prime_values.tasks import make_task
from prime_values.tasks.math import _LOCAL_BUILDERS, MathDataError, parse_row, resolve_source

PROMPT_KEYS = ("prompt",)
RESPONSE_KEYS = ("completion", "response")


class SFTDataError(ValueError):
    """The SFT data cannot be used; one line naming the key and the fix."""


def rows_to_examples(rows: list[dict], task, source: str) -> list[tuple[str, str]]:
    """(prompt, response) text pairs from dataset rows (prompt+completion/response, or math-task rows)."""
    examples, skipped = [], 0
    for row in rows:
        prompt = next((row[k] for k in PROMPT_KEYS if isinstance(row.get(k), str) and row[k]), None)
        response = next((row[k] for k in RESPONSE_KEYS if isinstance(row.get(k), str) and row[k]), None)
        if prompt is not None and response is not None:
            examples.append((prompt, response))
            continue
        parsed = parse_row(row)
        if parsed is None or not hasattr(task, "make_problem"):
            skipped += 1
            continue
        problem = task.make_problem(parsed["question"], parsed["answer"], parsed["solution"], source=parsed["source"])
        if task.is_heldout(problem):
            skipped += 1  # never train on the task's held-out prompts
            continue
        examples.append((problem.prompt, task.solution(problem)))
    if not examples:
        hint = "" if hasattr(task, "make_problem") else " (question/answer rows need task=math)"
        raise SFTDataError(f"sft.data={source!r}: none of its {len(rows)} rows has prompt + completion (or response) "
                           f"columns, or a question/problem with an answer{hint}")
    return examples


def load_dataset_rows(sft, cache_dir) -> list[dict]:
    try:
        return load_rows_any(sft.data, sft.split, sft.data_config, cache_dir)
    except MathDataError as error:
        raise SFTDataError(str(error)) from None


def load_rows_any(data: str, split: str, data_config, cache_dir) -> list[dict]:
    """All columns of a dataset's rows (the math task's loader keeps only its own columns)."""
    kind, where = resolve_source(data, "sft.data", cache_dir)
    import datasets

    datasets.logging.set_verbosity_error()
    datasets.disable_progress_bars()
    try:
        if kind == "local" and Path(where).is_file():
            ds = datasets.load_dataset(_LOCAL_BUILDERS[Path(where).suffix.lower()], data_files=where, split="train",
                                       cache_dir=cache_dir)
        else:
            ds = datasets.load_dataset(where, data_config, split=split, cache_dir=cache_dir)
    except Exception as e:  # noqa: BLE001 - one line for the user
        first = (str(e).strip().splitlines() or [""])[0][:300]
        raise MathDataError(f"sft.data={data!r} (split {split!r}) could not be loaded: {type(e).__name__}: {first}") \
            from None
    return ds.to_list()


def rollout_examples(run_dir: str, min_reward: float, cursor_dir: Path) -> tuple[list[tuple[str, str]], dict]:
    """Distinct (prompt, response) texts of an earlier run's rollouts with reward >= min_reward."""
    reader = LogReader(RunDir(run_dir).stream("rollouts"), "sft.from_run", cursor_dir, "rollouts")
    seen, examples, total, kept = set(), [], 0, 0
    for segment in reader.poll():  # never committed: read-only
        for row in to_rows(segment.table):
            total += 1
            if row["reward"] < min_reward:
                continue
            kept += 1
            meta = json.loads(row["task"])
            pair = (meta["prompt"], meta["response"])
            if pair not in seen:
                seen.add(pair)
                examples.append(pair)
    if not examples:
        raise SFTDataError(f"sft.from_run={run_dir!r}: none of its {total} rollouts has reward >= "
                           f"sft.min_reward={min_reward}; lower sft.min_reward or use another run")
    return examples, {"rollouts_read": total, "rollouts_kept": kept, "distinct_examples": len(examples)}


def has_images(task) -> bool:
    """The task's prompts carry pictures (task=vision: `task.image`, laid out by `task.prompt_ids`)."""
    return hasattr(task, "image")


def check_image_data(task, sft) -> None:
    """A task with pictures trains on its own problems only: one sentence naming the key otherwise."""
    if not has_images(task):
        return
    if sft.from_run:
        raise SFTDataError(f"sft.from_run={sft.from_run!r}: task={task.name} trains on pictures, and SFT on an earlier "
                           "run's rollouts reads their texts only; use sft.data=task (the task's pictures and answers)")
    if sft.data != "task":
        raise SFTDataError(f"sft.data={sft.data!r}: task={task.name} trains on pictures, which a dataset's "
                           "prompt/completion texts do not carry; use sft.data=task (the task's pictures and answers)")


class Examples:
    """Draws SFT batches: from a fixed list (with replacement), or fresh problems of the task (`sft.data=task`)."""

    def __init__(self, task, pairs: list[tuple[str, str]] | None):
        self.task, self.pairs = task, pairs

    def draw(self, rng: random.Random, n: int) -> list[tuple[str, str]]:
        if self.pairs is None:
            return [(p.prompt, self.task.solution(p)) for p in self.task.sample(rng, n)]
        return [self.pairs[rng.randrange(len(self.pairs))] for _ in range(n)]


def encode(tokenizer, pair: tuple[str, str]) -> tuple[list[int], list[int]]:
    prompt, response = pair
    return (tokenizer.encode(prompt, add_special_tokens=False),
            tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id])


def batch_tensors(tokenizer, encoded: list[tuple[list[int], list[int]]]):
    """Right-padded input_ids, attention_mask, labels (-100 except on response + eos): `sft_batch`'s layout."""
    import torch

    seqs = [p + r for p, r in encoded]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    mask, labels = torch.zeros_like(ids), torch.full_like(ids, -100)
    for i, ((p, _), s) in enumerate(zip(encoded, seqs)):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
        labels[i, len(p):len(s)] = ids[i, len(p):len(s)]
    return ids, mask, labels


def train(ctx: StageContext, model, tokenizer, task, examples: Examples) -> dict:
    """The sft stage's steps (`supervised.supervised_train`, the warm start's loop) on batches of examples
    that fit `sft.max_length`; returns the last step's metrics (plus val_acc when target_accuracy is set)."""
    from prime_values.supervised import supervised_train, validation_accuracy

    sft, cfg = ctx.cfg.sft, ctx.cfg
    rng, dropped = random.Random(ctx.seed()), [0]

    def batch_with_images(step: int):
        """`sft_batch` of fresh problems (their pictures as its fourth item), rows longer than sft.max_length
        dropped and counted."""
        from prime_values.supervised import sft_batch

        ids, mask, labels, images = sft_batch(tokenizer, task, task.sample(rng, sft.batch_size), model.config)
        fits = [b for b, n in enumerate(mask.sum(dim=1).tolist()) if n <= sft.max_length]
        dropped[0] += len(images) - len(fits)
        if not fits:
            raise SFTDataError(f"every SFT example drawn is longer than sft.max_length={sft.max_length} tokens (its "
                               "image tokens included); raise sft.max_length")
        width = int(mask[fits].sum(dim=1).max())
        return ids[fits, :width], mask[fits, :width], labels[fits, :width], [images[b] for b in fits]

    def batch(step: int):
        encoded = []
        for _ in range(100):  # draw until the batch is full of examples that fit
            for pair in examples.draw(rng, sft.batch_size - len(encoded)):
                prompt_ids, response_ids = encode(tokenizer, pair)
                if len(prompt_ids) + len(response_ids) <= sft.max_length:
                    encoded.append((prompt_ids, response_ids))
                else:
                    dropped[0] += 1
            if len(encoded) == sft.batch_size:
                break
        if not encoded:
            raise SFTDataError(f"every SFT example drawn is longer than sft.max_length={sft.max_length} tokens; "
                               "raise sft.max_length")
        return batch_tensors(tokenizer, encoded)

    def on_step(step: int, metrics: dict, log: bool) -> None:
        last.clear()
        last.update({"sft_step": step, **{k: v for k, v in metrics.items() if k not in ("step", "stopped_early")},
                     "dropped_too_long": dropped[0]})
        if log:
            ctx.metrics.log(**last)
        if ctx.stopping():
            raise StageStopped(f"sft stopped at step {step}: the run was stopped")

    last: dict = {"sft_step": 0}
    accuracy = validation_accuracy(model, tokenizer, task, ctx.seed(), sft.val_size, cfg.inference.max_new_tokens) \
        if sft.target_accuracy > 0 and sft.val_size > 0 else None
    supervised_train(model, batch_with_images if has_images(task) else batch, sft.steps, lr=sft.lr,
                     warmup_steps=sft.warmup_steps, accuracy=accuracy, target_accuracy=sft.target_accuracy,
                     check_every=sft.check_every, on_step=on_step)
    model.eval()
    return last


def main(run_dir: str) -> dict:
    """The sft stage job: load the data, fine-tune, save `<stage>/model`; returns the stage's figures."""
    from transformers import AutoTokenizer

    from prime_values.models import build_char_tokenizer, build_tiny_policy, load_policy, save_model
    from prime_values.models.build import build_tiny_vl_policy
    from prime_values.models.tokenizer import ensure_pad_token
    from prime_values.models.vision import TINY_VL_MODEL, build_vl_tokenizer

    ctx = StageContext(run_dir, "sft", "policy_trainer_device")
    cfg, sft, began = ctx.cfg, ctx.cfg.sft, time.time()
    task = make_task(**cfg.task)
    try:
        check_image_data(task, sft)
        info: dict = {}
        if sft.from_run:
            pairs, info = rollout_examples(sft.from_run, sft.min_reward, ctx.dir / "cursors")
        elif sft.data == "task":
            pairs = None
        else:
            pairs = rows_to_examples(load_dataset_rows(sft, cfg.task.get("data_cache_dir")), task, sft.data)
            info = {"examples": len(pairs)}
        ctx.log.info("SFT data: %s", info or "the task's reference solutions")
        if cfg.policy.model == "tiny":
            tokenizer = build_char_tokenizer()
            model = build_tiny_policy(tokenizer, seed=ctx.seed(), attention=ctx.attention, **cfg.policy.arch)
        elif cfg.policy.model == TINY_VL_MODEL:  # the embedded vision-language policy (policy.arch does not apply)
            tokenizer = build_vl_tokenizer()
            model = build_tiny_vl_policy(tokenizer, seed=ctx.seed(), attention=ctx.attention)
        else:
            tokenizer = AutoTokenizer.from_pretrained(cfg.policy.model)
            model = load_policy(cfg.policy.model, ctx.attention)
        ensure_pad_token(tokenizer)
        model = model.to(ctx.device)
        last = train(ctx, model, tokenizer, task, Examples(task, pairs))
        accuracy = greedy_accuracy(model, tokenizer, task, task.heldout(), cfg.inference.max_new_tokens)
        target = ctx.dir / "model"
        partial = ctx.dir / "model.partial"
        shutil.rmtree(partial, ignore_errors=True)
        save_model(model.cpu(), tokenizer, partial)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)  # the model directory appears whole
        figures = {"steps": last.get("sft_step", 0), "loss": last.get("loss"), "val_acc": last.get("val_acc"),
                   "heldout_accuracy": accuracy, "wall_s": time.time() - began, **info}
        ctx.metrics.log(**{k: v for k, v in figures.items() if k != "steps"}, sft_done=True)
        return {"model": str(target), "figures": figures}
    finally:
        if hasattr(task, "close"):
            task.close()
