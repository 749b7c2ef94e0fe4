"""Does scoring keep up with generation? The value evaluator's scoring throughput against inference's generation
throughput for the same model size, measured in isolation, side by side, one CPU thread each (what
`topology.threads_per_role=0`, auto, gives each role of the embedded run on 2 cores):

  generate  prime_values.models.sampling.sample: one inference chunk (prompts_per_step x group_size rollouts)
            from the policy; tokens/s = sampled (policy) tokens / time, as inference's `tokens_per_s`
  score     the evaluator's forward pass (critic_io.CriticInputs.values, privileged layout) over the same
            rollouts; tokens/s = causal states (every token of the trace) / time, as the evaluator's
            `states_per_s`

Both sides run on the same fixed rollouts, alternating within every repetition; the ratio is paired per
repetition. Without --policy/--critic the models are the embedded default architecture, freshly built.

    python -m bench.bench_scoring [--smoke] [--policy DIR --critic DIR]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

GOAL = 5.0


def load_models(policy_dir: str | None, critic_dir: str | None, arch: dict):
    from transformers import AutoTokenizer

    from prime_values.models import build_char_tokenizer, build_critic, build_tiny_policy, load_critic, load_policy

    if policy_dir:
        tokenizer, policy = AutoTokenizer.from_pretrained(policy_dir), load_policy(policy_dir)
    else:
        tokenizer = build_char_tokenizer()
        policy = build_tiny_policy(tokenizer, seed=0, **arch)
    critic = load_critic(critic_dir) if critic_dir else build_critic(None, tokenizer, seed=1, **arch)
    return tokenizer, policy.eval(), critic.eval()


def measure(smoke: bool = False, policy_dir: str | None = None, critic_dir: str | None = None,
            reps: int | None = None, max_new_tokens: int | None = None, device: str = "cpu") -> dict:
    from omegaconf import OmegaConf

    from prime_values.config import Config
    from prime_values.critic_io import CriticInputs
    from prime_values.models import sample
    from prime_values.roles.inference import build_rows
    from prime_values.rollout import encode_prompts
    from prime_values.tasks import make_task

    cfg = OmegaConf.structured(Config)
    arch = dict(cfg.policy.arch)
    if smoke:
        arch.update(hidden_size=64, num_heads=2, num_kv_heads=1, intermediate_size=128)
    reps = reps or (2 if smoke else 5)
    torch.set_num_threads(1)  # one thread per side, as each role of the embedded run has on 2 cores
    tokenizer, policy, critic = load_models(policy_dir, critic_dir, arch)
    policy, critic = policy.to(device), critic.to(device)
    task = make_task(**cfg.task)
    inf = cfg.inference
    if max_new_tokens:
        inf.max_new_tokens = max_new_tokens
    problems = task.sample(random.Random(0), 4 if smoke else inf.prompts_per_step)
    prompt_ids = encode_prompts(tokenizer, problems)
    gen_s, score_s, gen_tokens, states = [], [], [], []
    for rep in range(reps):
        with torch.no_grad():
            began = time.perf_counter()
            completions = sample(policy, prompt_ids, num_samples=inf.group_size, max_new_tokens=inf.max_new_tokens,
                                 temperature=inf.temperature, eos_id=tokenizer.eos_token_id,
                                 pad_id=tokenizer.pad_token_id, seed=rep)
            _sync(device)
            gen_s.append(time.perf_counter() - began)
        rows = build_rows(problems, completions, prompt_ids, task, 0, "w0", rep, tokenizer)
        gen_tokens.append(sum(sum(r["policy_mask"]) for r in rows))
        states.append(sum(len(r["token_ids"]) for r in rows))
        with torch.no_grad():
            began = time.perf_counter()
            for begin in range(0, len(rows), cfg.critic.score_batch_rollouts):
                chunk = rows[begin: begin + cfg.critic.score_batch_rollouts]
                CriticInputs.of(chunk, tokenizer, cfg.critic, device).values(critic, cfg.critic.loss)
            _sync(device)
            score_s.append(time.perf_counter() - began)
    return {"gen_tokens_per_s": [n / s for n, s in zip(gen_tokens, gen_s)],
            "score_states_per_s": [n / s for n, s in zip(states, score_s)],
            "rollouts": len(rows), "mean_trace_tokens": statistics.mean(states) / len(rows),
            "mean_response_tokens": statistics.mean(gen_tokens) / len(rows),
            "params": sum(p.numel() for p in policy.parameters()), "device": device}


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize(device)


def bench_rows(smoke: bool = False, policy_dir: str | None = None, critic_dir: str | None = None,
               device: str = "cpu") -> list[dict]:
    """Two rows: the given (or fresh) models on the task's own lengths, and fresh (untrained) models whose samples
    run to a longer generation cap (LONG tokens; 16 in smoke): how the ratio grows with the response length."""
    rows = [_row(measure(smoke, policy_dir, critic_dir, device=device), "")]
    long = 16 if smoke else LONG
    rows.append(_row(measure(smoke, max_new_tokens=long, device=device),
                     f", untrained models, max_new_tokens={long}"))
    return rows


LONG = 64


def _row(m: dict, label: str) -> dict:
    xs = [s / g for s, g in zip(m["score_states_per_s"], m["gen_tokens_per_s"])]
    return {"measure": f"scoring keeps up: evaluator states/s / inference tokens/s ({m['rollouts']} rollouts, "
                       f"{m['params'] / 1e6:.1f}M params, "
                       f"{'1 thread' if m['device'] == 'cpu' else m['device']}{label})",
            "ours": statistics.median(m["score_states_per_s"]), "baseline": statistics.median(m["gen_tokens_per_s"]),
            "unit": "tokens/s", "ratio": statistics.median(xs), "spread": [min(xs), max(xs)],
            "goal": f">= {GOAL:g}", "met": statistics.median(xs) >= GOAL, "reps": len(xs),
            "note": f"traces {m['mean_trace_tokens']:.1f} tokens, responses {m['mean_response_tokens']:.1f}"}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--policy", default=None, help="a saved policy directory (default: the embedded model)")
    ap.add_argument("--critic", default=None, help="a saved critic directory")
    args = ap.parse_args(argv)
    for row in bench_rows(args.smoke, args.policy, args.critic):
        print(row)


if __name__ == "__main__":
    main()
