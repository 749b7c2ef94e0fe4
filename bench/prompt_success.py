"""How much of the policy's per-prompt success could a critic read off the problem? (arith)

    python -m bench.prompt_success <run dir> [--version V] [--problems 1500] [--seed 5]

At the prompt's state (response position 0) the value is the policy's probability of solving the problem,
p(x) = pi(reference, then eos | prompt), known exactly for exact-match arith (one teacher-forced pass per
problem, as in bench/critic_oracle.py). Its spread over problems is all a critic can explain there: the oracle's
explained variance of the returns at position 0 is Var p / (p_mean (1 - p_mean)). This script computes p on fresh
problems of policy version V and fits predictors of p from the problem alone on two thirds of them, then reports,
on the other third, the share of Var p each explains (R^2) and so the position-0 explained variance it would give:
ridge regressions on hand features (operand digits, answer digits, a carry in the units column, the answer's
length) and an MLP on all of them, trained on the exact p (no Monte-Carlo noise: an upper bound for what a critic
learns from the same number of problems, when it sees each one's returns rather than p); and, for V > 0, a
quadratic in the warm-started policy's (version 0's) own success on each problem, which is what a critic built
from that policy could carry over.
"""

from __future__ import annotations

import argparse
import random
import re
import sys

import torch

from bench.common import add_run, run_config
from bench.critic_oracle import reference_ids, reference_suffix_probs
from prime_values.models import load_policy
from prime_values.tasks import make_task
from prime_values.weights import latest_version


def one_hot(index: int, size: int) -> list[float]:
    return [float(i == index) for i in range(size)]


def digits(n: int, width: int) -> list[float]:
    """One-hot of each of the `width` last decimal digits of n, units first (a missing digit is 0)."""
    return [x for k in range(width) for x in one_hot(n // 10 ** k % 10, 10)]


def features(prompt: str, answer: str, width: int, groups: str) -> list[float]:
    """Hand features of one problem: 'operands' (digits of each), 'answer' (its digits and length), 'carry'
    (a carry out of the units column of the first two operands)."""
    nums = [int(x) for x in re.findall(r"\d+", prompt)]
    out = [1.0]
    if "operands" in groups:
        out += [x for n in nums for x in digits(n, width)]
    if "answer" in groups:
        value = int(answer) if answer.lstrip("-").isdigit() else 0
        out += digits(abs(value), width + 1) + one_hot(min(len(answer), width + 2), width + 3)
    if "carry" in groups:
        out += [float(sum(n % 10 for n in nums[:2]) >= 10)]
    return out


def r_squared(pred: torch.Tensor, y: torch.Tensor) -> float:
    return float(1 - ((pred - y) ** 2).mean() / y.var(unbiased=False))


def ridge(x_train, y_train, x_test, alpha: float = 1.0) -> torch.Tensor:
    eye = torch.eye(x_train.shape[1], dtype=x_train.dtype)
    w = torch.linalg.solve(x_train.T @ x_train + alpha * eye, x_train.T @ y_train)
    return x_test @ w


def mlp(x_train, y_train, x_test, steps: int = 2000, seed: int = 0) -> torch.Tensor:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(x_train.shape[1], 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                              torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.1)
    for _ in range(steps):
        loss = ((net(x_train).squeeze(-1) - y_train) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        return net(x_test).squeeze(-1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run(parser)
    parser.add_argument("--problems", type=int, default=1500)
    parser.add_argument("--mlp-steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=5)
    args = parser.parse_args(argv)
    cfg = run_config(args.run)
    if cfg.task.name != "arith" or cfg.task.show_work:
        print("prompt_success: only arith without show_work has one exact answer to score against here",
              file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    weights = args.run / "weights" / "policy"
    version = latest_version(weights) if args.version is None else args.version
    tokenizer = AutoTokenizer.from_pretrained(str(weights / str(version)))
    policy = load_policy(weights / str(version)).eval()
    problems = make_task(**cfg.task).sample(random.Random(args.seed), args.problems)
    temperature = cfg.inference.temperature

    @torch.no_grad()
    def success(model) -> torch.Tensor:
        return torch.tensor([reference_suffix_probs(model, tokenizer.encode(x.prompt, add_special_tokens=False),
                                                     reference_ids(tokenizer, x.answer), temperature)[0]
                             for x in problems], dtype=torch.float64)

    p = success(policy)
    mean = float(p.mean())
    if not 0 < mean < 1:
        print(f"prompt_success: policy v{version} solves {mean:.0%} of the problems: no spread to explain",
              file=sys.stderr)
        return 2
    oracle = float(p.var(unbiased=False)) / (mean * (1 - mean))
    print(f"run {args.run}: policy v{version}, {len(problems)} problems, mean success {mean:.3f}, "
          f"Var p {float(p.var(unbiased=False)):.4f}; oracle explained variance at position 0: {oracle:.3f}")
    cut = 2 * len(problems) // 3

    def table(groups: str) -> torch.Tensor:
        return torch.tensor([features(q.prompt, q.answer, cfg.task.digits, groups) for q in problems],
                            dtype=torch.float64)

    for groups in ("carry", "operands", "operands carry", "operands answer carry"):
        x = table(groups)
        r2 = r_squared(ridge(x[:cut], p[:cut], x[cut:]), p[cut:])
        print(f"  ridge on {groups:24s} ({x.shape[1]:3d} features): R^2 {r2:6.3f}  -> position-0 EV {r2 * oracle:.3f}")
    x = table("operands answer carry").float()
    r2 = r_squared(mlp(x[:cut], p[:cut].float(), x[cut:], args.mlp_steps), p[cut:].float())
    print(f"  MLP on {'operands answer carry':26s} ({x.shape[1]:3d} features): R^2 {r2:6.3f}  -> position-0 EV "
          f"{r2 * oracle:.3f}")
    start = weights / "0"
    if version > 0 and start.is_dir():  # what the critic's starting point, the warm-started policy, knew
        p0 = success(load_policy(start).eval())
        x = torch.stack([torch.ones_like(p0), p0, p0 * p0], dim=1)
        r2 = r_squared(ridge(x[:cut], p[:cut], x[cut:], alpha=1e-6), p[cut:])
        print(f"  quadratic in policy v0's own success ({3:3d} features): R^2 {r2:6.3f}  -> position-0 EV "
              f"{r2 * oracle:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
