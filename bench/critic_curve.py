"""How fast can a critic learn one fixed policy's values? A learning curve against the exact oracle, offline.

    python -m bench.critic_curve <run dir> [--version V] [--critic C|fresh] [--steps 600] [--every 100]
        [--train-prompts 4096] [key=value ...]

The pipeline's critic chases a moving policy with a few hundred steps; this separates how fast the critic learns
from how fast the policy moves. It samples a pool of fresh rollouts of policy version V (the inference role's
sampler and scorer, `--group` per prompt), trains critic version C (the critic pretrained in the warm start by
default; `fresh`: a new one built as the run's warm start builds it, from policy version 0, critic.init and
critic.num_layers, which a key=value may change) on it with the value trainer's own `critic_step`, each rollout
used once in order, and every `--every` steps prints the explained variance against the realised returns on a
separate evaluation pool, overall and per response position, next to the exact oracle's (bench/critic_oracle.py) and
the mean squared distance to it.
`key=value` overrides the run's config (e.g. critic.lr=0.006 critic.batch_rollouts=32; with
critic.weight_average=0.95 the curve is the average's). arith only (exact match with one reference).
"""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch
from omegaconf import OmegaConf

from bench.common import add_run, run_config
from bench.critic_oracle import rollout_oracle_values
from prime_values.algo.ema import WeightAverage
from prime_values.algo.gae import explained_variance
from prime_values.critic_io import CriticInputs, critic_step
from prime_values.models import load_critic, load_policy
from prime_values.roles.warm_start import initial_critic
from prime_values.rollout import sample_and_score
from prime_values.tasks import make_task
from prime_values.weights import latest_version


def pool(policy, tokenizer, task, cfg, prompts: int, group: int, seed: int) -> list[dict]:
    """Fresh scored rollouts with Monte-Carlo targets and the oracle value of every policy token."""
    problems = task.sample(random.Random(seed), prompts)
    rollouts = sample_and_score(policy, tokenizer, task, problems, num_samples=group,
                                max_new_tokens=cfg.inference.max_new_tokens,
                                temperature=cfg.inference.temperature, seed=seed)
    oracle = rollout_oracle_values(policy, tokenizer, problems, rollouts, cfg.inference.temperature)
    rows = [{"token_ids": list(r.token_ids), "policy_mask": list(r.policy_mask), "reward": r.reward,
             "privileged": problems[r.prompt_index].privileged,
             "value_targets": [r.reward * m for m in r.policy_mask], "oracle": values}
            for r, values in zip(rollouts, oracle)]
    return rows


@torch.no_grad()
def evaluate(critic, rows: list[dict], tokenizer, cfg) -> dict:
    """Explained variance of the critic (and of the oracle) against the returns, pooled and per position."""
    was_training = critic.training
    critic.eval()
    learnt = []
    for begin in range(0, len(rows), 512):
        chunk = rows[begin: begin + 512]
        inputs = CriticInputs.of(chunk, tokenizer, cfg.critic)
        values = inputs.values(critic, cfg.critic.loss).float()
        learnt += [values[b, r["policy_mask"].index(1): len(r["token_ids"])] for b, r in enumerate(chunk)]
    critic.train(was_training)
    learnt = torch.cat(learnt)
    oracle = torch.tensor([v for r in rows for v in r["oracle"]])
    returns = torch.tensor([float(r["reward"]) for r in rows for _ in r["oracle"]])
    position = torch.tensor([j for r in rows for j in range(len(r["oracle"]))])
    everywhere = torch.ones_like(returns, dtype=torch.bool)
    return {"critic": explained_variance(learnt, returns, everywhere),
            "oracle": explained_variance(oracle, returns, everywhere),
            "per_position": [explained_variance(learnt, returns, position == j) for j in range(4)
                             if int((position == j).sum()) >= 20],
            "mse_to_oracle": float(((learnt - oracle) ** 2).mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run(parser)
    parser.add_argument("--critic", default="0", help="critic version to start from (default 0, the warm start's), "
                        "or 'fresh': a new, untrained critic built as the run's warm start builds it (critic.init, "
                        "critic.num_layers; from policy version 0)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--train-prompts", type=int, default=4096)
    parser.add_argument("--eval-prompts", type=int, default=512)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)")
    parser.add_argument("overrides", nargs="*", help="key=value on the run's config")
    args = parser.parse_intermixed_args(argv)
    cfg = run_config(args.run)  # keys added since the run: their defaults, so they can be overridden
    OmegaConf.set_struct(cfg, True)
    try:
        cfg.merge_with_dotlist(args.overrides)
    except Exception as error:  # noqa: BLE001 - any bad override is reported in one line
        print(f"critic_curve: cannot apply {args.overrides} to {args.run / 'config.yaml'}: "
              f"{str(error).splitlines()[0]}", file=sys.stderr)
        return 2
    if cfg.task.name != "arith":
        print(f"critic_curve: task {cfg.task.name!r} has no exact oracle here; only arith does", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    weights = args.run / "weights"
    version = latest_version(weights / "policy") if args.version is None else args.version
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(weights / "policy" / str(version)))
    policy = load_policy(weights / "policy" / str(version)).eval()
    if args.critic == "fresh":
        critic = initial_critic(cfg, weights / "policy" / "0", tokenizer, seed=1).train()
    else:
        critic = load_critic(weights / "critic" / str(int(args.critic))).train()
    task = make_task(**cfg.task)
    began = time.time()
    with torch.no_grad():
        test = pool(policy, tokenizer, task, cfg, args.eval_prompts, args.group, seed=args.seed)
        train = pool(policy, tokenizer, task, cfg, args.train_prompts, args.group, seed=args.seed + 1)
    random.Random(args.seed).shuffle(train)
    start = f"fresh ({len(critic.model.layers)} blocks)" if args.critic == "fresh" else f"v{args.critic}"
    print(f"run {args.run}: policy v{version}, critic {start}, {len(train)} training and {len(test)} "
          f"evaluation rollouts sampled in {time.time() - began:.0f} s; critic lr {cfg.critic.lr}, batch "
          f"{cfg.critic.batch_rollouts}, weight average {cfg.critic.weight_average}")
    optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr)
    average = WeightAverage(critic.parameters(), cfg.critic.weight_average)
    batch, at, began = cfg.critic.batch_rollouts, 0, time.time()
    for step in range(args.steps + 1):
        if step % args.every == 0:
            with average.swapped():
                e = evaluate(critic, test, tokenizer, cfg)
            per = " / ".join(f"{x:.2f}" for x in e["per_position"])
            print(f"step {step:5d}  EV {e['critic']:.3f} (oracle {e['oracle']:.3f})  per position {per}  "
                  f"mse to oracle {e['mse_to_oracle']:.4f}  {time.time() - began:.0f} s", flush=True)
        if step == args.steps:
            break
        if at + batch > len(train):
            at = 0  # a second pass over the pool
        critic_step(critic, optimizer, train[at: at + batch], tokenizer, cfg, "cpu")
        average.update()
        at += batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
