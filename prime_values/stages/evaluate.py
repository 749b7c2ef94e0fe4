"""The `eval` stage: sample `eval.samples` (n) completions per held-out prompt at `eval.temperature`, score them
with the task's verifier, and report avg@n and pass@k. A completion is what the inference role samples: one
reply, or for a task with episodes (task=verifiers) a whole (multi-turn) episode scored by the environment's
rubric; a sample is correct when its reward is at least 1.

- avg@n: the mean over prompts of c/n (c = correct completions of that prompt): the expected accuracy of one
  sample, i.e. pass@1;
- pass@k: the unbiased estimator of Chen et al. 2021 (Codex), per prompt ``1 - C(n-c, k) / C(n, k)`` (the chance
  that k of the n samples drawn without replacement hold at least one correct one), averaged over prompts.

A task with pictures (task=vision) samples each held-out prompt with its picture (`VisionTask.rollout`, through
the transformers model of `policy.model`: a from_pretrained directory such as `<run>/stages/sft/model` or
`<run>/weights/policy/<n>`, whose config.json tells a vision-language model).

Results go to `<run>/stages/eval/results.json` (with each prompt's c) and are printed as a table.
"""

from __future__ import annotations

import json
import time
from math import comb

from prime_values.rollout import sample_and_score
from prime_values.rundir import write_atomic
from prime_values.stages.common import StageContext, StageStopped
from prime_values.tasks import make_task


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt with c correct out of n samples: 1 - C(n-c, k) / C(n, k)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (got n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0  # every k-subset holds a correct sample
    return 1.0 - comb(n - c, k) / comb(n, k)


def summarise(correct: list[int], n: int, ks: list[int]) -> dict:
    """{'avg@n': ..., 'pass@k': ...} averaged over prompts, from each prompt's number of correct samples."""
    if not correct:
        raise ValueError("no held-out prompts to evaluate")
    out = {f"avg@{n}": sum(c / n for c in correct) / len(correct)}
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
    return out


def format_table(results: dict) -> str:
    head = (f"stage eval: {results['model']}\n  {results['prompts']} held-out prompts x {results['samples']} samples, "
            f"temperature {results['temperature']}, at most {results['max_new_tokens']} new tokens")
    rows = [f"  {'metric':<10} {'value':>7}", f"  {'-' * 10} {'-' * 7}"]
    rows += [f"  {name:<10} {value:7.4f}" for name, value in results["metrics"].items()]
    return "\n".join([head, *rows])


def main(run_dir: str) -> dict:
    """The eval stage job: sample, score, write results.json; returns the results."""

    from transformers import AutoTokenizer

    from prime_values.models import load_policy
    from prime_values.models.tokenizer import ensure_pad_token
    from prime_values.models.vision import TINY_VL_MODEL
    ctx = StageContext(run_dir, "eval", "inference_device")
    cfg, ev, began = ctx.cfg, ctx.cfg.eval, time.time()
    max_new = ev.max_new_tokens or cfg.inference.max_new_tokens
    if cfg.policy.model == TINY_VL_MODEL:
        raise ValueError(f"the eval stage evaluates policy.model, which is '{TINY_VL_MODEL}' (an untrained model); set "
                         "policy.model=<a from_pretrained directory, e.g. <run>/weights/policy/<step> or "
                         "<run>/stages/sft/model>")
    task = make_task(**cfg.task)
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.policy.model)
        ensure_pad_token(tokenizer)
        model = load_policy(cfg.policy.model, ctx.attention).to(ctx.device).eval()
        problems = task.heldout()
        per_chunk = max(1, ev.batch_size // ev.samples)
        correct: list[int] = []
        for chunk, begin in enumerate(range(0, len(problems), per_chunk)):
            batch = problems[begin:begin + per_chunk]
            rollouts = sample_and_score(model, tokenizer, task, batch, num_samples=ev.samples, max_new_tokens=max_new,
                                        temperature=ev.temperature, seed=ctx.seed(chunk), batch_size=ev.batch_size)
            for i in range(len(batch)):
                correct.append(sum(r.reward >= 1.0 for r in rollouts if r.prompt_index == i))
            ctx.metrics.log(prompts_done=len(correct), prompts=len(problems),
                            running_avg=sum(correct) / (len(correct) * ev.samples))
            if ctx.stopping():
                raise StageStopped(f"eval stopped after {len(correct)} prompts: the run was stopped")
        results = {
            "model": cfg.policy.model,
            "task": cfg.task.name,
            "prompts": len(problems),
            "samples": ev.samples,
            "temperature": ev.temperature,
            "max_new_tokens": max_new,
            "metrics": summarise(correct, ev.samples, list(ev.k)),
            "per_prompt": [{"prompt_id": p.prompt_id, "correct": c} for p, c in zip(problems, correct)],
            "wall_s": time.time() - began,
        }
        write_atomic(ctx.dir / "results.json", json.dumps(results, indent=2))
        ctx.metrics.log(**results["metrics"], eval_done=True)
        return results
    finally:
        if hasattr(task, "close"):
            task.close()
