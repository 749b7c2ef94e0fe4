"""Orchestrator-side GAE benchmark: vectorised ``algo.gae`` against the textbook per-timestep loop.

Both sides compute the same thing on the same batch, in one run, on one CPU thread:
  fast  ``prime_values.algo.gae.gae`` on [B, T] tensors (float32, as the orchestrator holds them)
  loop  the textbook formulation: per rollout, walk t = T−1 … 0, skip environment tokens, and update
        δ = r + γ·V_next − V_t,  A_t = δ + γλ·A_next  in Python floats
The batch: B rollouts right-padded to T tokens with random prompt lengths, random response lengths (a quarter
of them hit the generation cap T), up to three environment spans inside each trace, a quarter ending with
environment tokens, per-rollout length-adaptive λ, and a tenth of the rollouts cut by the critic's context
(bootstrapped). The loop side runs on a subset of the rollouts (its cost is linear in B) and is scaled to B;
the lists it reads are built before its clock starts, and it writes Python lists. Each side first runs once
untimed (a warm-up: the first call also pays one-off allocator growth), then the sides alternate within every
repetition (so a busy machine slows both alike), and must agree on that subset to float tolerance.

    python -m bench.bench_gae            # 1,024 rollouts x 4,096 tokens (a few seconds)
    python -m bench.bench_gae --smoke    # tiny sizes, about a second (tests/algo/test_gae.py)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from prime_values.algo.gae import adaptive_lambda, gae

GOAL = 10.0  # the goal: the vectorised GAE is >= 10x faster than the per-timestep loop


def make_batch(batch: int, length: int, seed: int = 0) -> dict:
    """A random orchestrator batch (see the module docstring); off-mask values are garbage on purpose."""
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(length)[None, :]
    prompt = torch.randint(1, max(2, length // 16), (batch, 1), generator=g)
    end = torch.randint(length // 8 + 1, length + 1, (batch, 1), generator=g)
    end[torch.rand(batch, generator=g) < 0.25] = length  # hit the generation cap: terminal, not cut
    end = torch.maximum(end, prompt + 1)
    mask = (t >= prompt) & (t < end)
    for _ in range(3):  # environment turns between policy turns
        start = prompt + (torch.rand(batch, 1, generator=g) * (end - prompt).float()).long()
        span = torch.randint(1, max(2, length // 32), (batch, 1), generator=g)
        mask &= ~((t >= start) & (t < start + span))
    trailing = torch.rand(batch, 1, generator=g) < 0.25  # the trace ends with environment tokens
    mask &= ~(trailing & (t >= end - torch.randint(1, max(2, length // 64), (batch, 1), generator=g)))
    values = torch.rand(batch, length, generator=g) * 4 - 2  # garbage off-mask: gae must ignore it
    return {
        "rewards": torch.randint(0, 2, (batch,), generator=g).float(),
        "values": values,
        "policy_mask": mask,
        "gamma": 1.0,
        "lam": adaptive_lambda(mask.sum(1), alpha=0.05),
        "bootstrap": torch.rand(batch, generator=g),
        "cut": torch.rand(batch, generator=g) < 0.1,
    }


def gae_loop(rewards, values, policy_mask, gamma, lam, bootstrap, cut):
    """The textbook per-timestep GAE loop over Python lists; returns (advantages, returns) as lists of lists."""
    advantages, returns = [], []
    for b in range(len(rewards)):
        v, m = values[b], policy_mask[b]
        adv_row, ret_row = [0.0] * len(v), [0.0] * len(v)
        next_value = bootstrap[b] if cut[b] else 0.0  # V(s_cut), or 0 past a terminal rollout
        reward = 0.0 if cut[b] else rewards[b]  # a cut rollout's reward lies beyond the cut
        advantage, last = 0.0, True
        for t in reversed(range(len(v))):
            if not m[t]:
                continue  # environment / prompt / padding: no γλ step
            delta = (reward if last else 0.0) + gamma * next_value - v[t]
            advantage = delta + gamma * lam[b] * advantage
            adv_row[t], ret_row[t] = advantage, advantage + v[t]
            next_value, last = v[t], False
        advantages.append(adv_row)
        returns.append(ret_row)
    return advantages, returns


def bench_rows(smoke: bool = False) -> list[dict]:
    """The row of `python -m bench` (bench/run_all.py): per-timestep loop time / vectorised GAE time, paired per
    repetition (the loop's time scaled to the whole batch)."""
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        out = main(["--smoke"] if smoke else [], detail=True)
    xs = [loop / fast for fast, loop in zip(out["fast"], out["loop"])]
    return [{"measure": f"GAE: vectorised vs per-timestep loop ({out['shape']})",
             "ours": statistics.median(out["fast"]),
             "baseline": statistics.median(out["loop"]), "unit": "s", "ratio": statistics.median(xs),
             "spread": [min(xs), max(xs)], "goal": f">= {GOAL:g}", "met": statistics.median(xs) >= GOAL,
             "reps": len(xs)}]


def main(argv: list[str] | None = None, detail: bool = False):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a second or two)")
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=4096)
    parser.add_argument("--loop-rollouts", type=int, default=128, help="rollouts the loop side runs on")
    parser.add_argument("--reps", type=int, default=7, help="repetitions, the two sides alternating in each")
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls of each side before the repetitions")
    args = parser.parse_args(argv)
    if args.smoke:
        args.rollouts, args.tokens, args.loop_rollouts, args.reps = 16, 256, 8, 3
    torch.set_num_threads(1)
    batch = make_batch(args.rollouts, args.tokens)
    k = min(args.loop_rollouts, args.rollouts)
    subset = {key: value[:k].tolist() if isinstance(value, torch.Tensor) else value for key, value in batch.items()}
    n_policy = batch["policy_mask"].sum().item()
    print(f"gae bench: {args.rollouts} rollouts x {args.tokens} tokens, {n_policy} policy tokens "
          f"({n_policy / batch['policy_mask'].numel():.0%}), {int(batch['cut'].sum())} cut, 1 CPU thread, "
          f"median of {args.reps} alternating reps after {args.warmup} warm-up")

    for _ in range(args.warmup):
        gae(**batch)
        gae_loop(**subset)
    fast_times, loop_times = [], []
    for _ in range(args.reps):
        start = time.perf_counter()
        advantages, returns = gae(**batch)
        fast_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        loop_adv, loop_ret = gae_loop(**subset)
        loop_times.append(time.perf_counter() - start)
    fast_s, loop_k_s = statistics.median(fast_times), statistics.median(loop_times)
    loop_s = loop_k_s * args.rollouts / k
    print(f"fast  algo.gae (vectorised)            : {fast_s * 1e3:9.1f} ms")
    print(f"loop  textbook per-timestep Python loop: {loop_s * 1e3:9.1f} ms  "
          f"(measured on {k} of {args.rollouts} rollouts: {loop_k_s * 1e3:.1f} ms, scaled x{args.rollouts / k:g})")

    error = max((advantages[:k] - torch.tensor(loop_adv)).abs().max().item(),
                (returns[:k] - torch.tensor(loop_ret)).abs().max().item())
    assert error < 1e-3, f"fast and loop GAE disagree by {error}"
    print(f"max |fast - loop| over advantages and returns of those {k} rollouts: {error:.2e}")
    ratio = loop_s / fast_s
    verdict = "met" if ratio >= GOAL else "NOT met"
    note = "  (smoke sizes: per-call overheads dominate, the ratio means nothing)" if args.smoke else ""
    print(f"ratio loop / fast: {ratio:.1f}x  [goal >= {GOAL:g}x: {verdict}]{note}")
    if detail:
        return {"fast": fast_times, "loop": [t * args.rollouts / k for t in loop_times],
                "shape": f"{args.rollouts} rollouts x {args.tokens} tokens"}
    return ratio


if __name__ == "__main__":
    main()
