"""How good could the critic be? A run's critic against the exact oracle value, on fresh rollouts of one policy.

    python -m bench.critic_oracle <run dir> [--version V] [--critic C] [--prompts 256] [--temperature T]
        [--record bench/records/<experiment>/certify/<name>.json]

For a task whose reward is exact match with one reference string (arith), the value of every state under the
policy is known exactly, with no Monte-Carlo noise: V*(s_t) = 1[response so far == reference prefix] *
pi(rest of the reference, then eos | s_t), one teacher-forced forward pass of the policy over
prompt + reference + eos per prompt. The script samples `--group` fresh rollouts per training prompt (from the
run's `task.train_pool` when it has one) from policy version V (the inference role's sampler and scorer), scores
them with critic version C (the evaluator's critic input, privileged or not as the run was configured) and prints,
side by side on the same rollouts:

- oracle EV: explained variance of V* against the realised returns, pooled over policy tokens (the ceiling any
  critic of this policy can reach: the rest is the policy's own sampling noise);
- critic EV and its ratio to the oracle; both per position in the response.

Both default to the newest versions of the run. Values are compared with gamma = 1 Monte-Carlo returns (the
reward of the rollout at every state), as the orchestrator's critic-health figure does.

For a task that plays games (task=guess: ``task.continuations``) no exact oracle is at hand: V*(s_t) is estimated
by playing ``--samples`` K games on from every policy state with the same policy and temperature, their mean
reward (a binomial mean: its own variance p(1 - p) / K makes the oracle's EV a slight underestimate). Positions are
then policy tokens counted from the first guess; the "critic against the oracle" line is
1 - Var(V* - V) / Var(V*), how much of the oracle's own variation the critic reproduces. `--samples 0` plays no
games on: the critic's EV against the returns alone (the real model's warm-start bar, EV >= 0.3), in minutes
rather than the oracle's tens of minutes.

`--record` writes the figures as a stamped record (bench.common.write_record): the three EVs, each position's, the
run's critic and warm-start settings, and the command; a certification of a critic warm start is such a record
(recipes/guess.md, "Which critic warm start").
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch
from omegaconf import OmegaConf

from bench.common import add_run, command_line, run_attention, run_config, write_record
from prime_values.algo.gae import explained_variance
from prime_values.critic_io import CriticInputs
from prime_values.models import load_critic, load_policy
from prime_values.roles.evaluator import oracle_values as played_on_values
from prime_values.rollout import sample_and_score
from prime_values.tasks import make_task
from prime_values.tasks.pool import training_prompts
from prime_values.weights import latest_version


@torch.no_grad()
def reference_ids(tokenizer, answer: str) -> list[int]:
    """The token ids of the one right response: the reference answer, then eos."""
    return tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]


def reference_suffix_probs(policy, prompt: list[int], reference: list[int], temperature: float) -> list[float]:
    """pi(reference[j:] | prompt + reference[:j]) for every j: one teacher-forced pass, shared by a prompt's group."""
    logits = policy(torch.tensor([prompt + reference])).logits[0].float()
    logprobs = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
    k = len(prompt)
    token_lp = torch.stack([logprobs[k - 1 + j, reference[j]] for j in range(len(reference))])
    return torch.flip(torch.cumsum(torch.flip(token_lp, [0]), 0), [0]).exp().tolist()


def values_along(suffix: list[float], reference: list[int], response: list[int]) -> list[float]:
    """V*(s_j) for every response position j (the state before response token j): ``suffix[j]`` while the
    response so far equals the reference prefix, else 0."""
    return [suffix[j] if j < len(reference) and response[:j] == reference[:j] else 0.0 for j in range(len(response))]


def oracle_values(policy, prompt: list[int], reference: list[int], response: list[int],
                  temperature: float) -> list[float]:
    """V*(s_j) for exact-match reward; ``reference`` ends with eos. Hand-worked: reference [a, eos] with
    pi(a) = 0.5, pi(eos | a) = 0.8 -> response [a, eos]: [0.4, 0.8]; response [b, eos]: [0.4, 0.0]."""
    return values_along(reference_suffix_probs(policy, prompt, reference, temperature), reference, response)


def rollout_oracle_values(policy, tokenizer, problems, rollouts, temperature: float) -> list[list[float]]:
    """V*(s_j) for every response position of every rollout: the teacher-forced pass runs once per prompt."""
    suffixes: dict[int, tuple[list[int], list[float]]] = {}  # per prompt: reference ids, pi(reference[j:] | ...)
    out = []
    for r in rollouts:
        k = r.policy_mask.index(1)
        if r.prompt_index not in suffixes:
            reference = reference_ids(tokenizer, problems[r.prompt_index].answer)
            suffixes[r.prompt_index] = reference, reference_suffix_probs(
                policy, list(r.token_ids[:k]), reference, temperature)
        reference, suffix = suffixes[r.prompt_index]
        out.append(values_along(suffix, reference, list(r.token_ids[k:])))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run(parser)
    parser.add_argument("--critic", type=int, default=None, help="critic version (default: LATEST)")
    parser.add_argument("--prompts", type=int, default=256, help="fresh training prompts")
    parser.add_argument("--group", type=int, default=None, help="samples per prompt (default: inference.group_size)")
    parser.add_argument("--temperature", type=float, default=None, help="default: inference.temperature")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--samples", type=int, default=16,
                        help="games played on from each state for the Monte-Carlo oracle (task=guess; 0: no "
                             "oracle, the critic's EV against the returns only)")
    parser.add_argument("--record", type=Path, default=None, help="write the figures to this JSON record")
    args = parser.parse_args(argv)
    cfg = run_config(args.run)
    mc = cfg.task.name == "guess"
    if cfg.task.name != "arith" and not mc:
        print(f"critic_oracle: task {cfg.task.name!r} has no oracle here; arith (exact match with one reference: "
              "exact) and guess (games played on: Monte-Carlo) do", file=sys.stderr)
        return 2
    weights = args.run / "weights"
    version = latest_version(weights / "policy") if args.version is None else args.version
    critic_version = latest_version(weights / "critic") if args.critic is None else args.critic
    if version is None or critic_version is None:
        print(f"critic_oracle: {weights} holds no published policy or critic version", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(weights / "policy" / str(version)))
    attention = run_attention(cfg)  # the run's precision, as its inference and evaluator roles computed
    policy, critic = load_policy(weights / "policy" / str(version), attention).eval(), load_critic(
        weights / "critic" / str(critic_version), attention).eval()
    task = make_task(**cfg.task)
    temperature = cfg.inference.temperature if args.temperature is None else args.temperature
    group = args.group or cfg.inference.group_size
    prompts = training_prompts(task, cfg.task.train_pool, cfg.task.seed)
    problems = prompts.sample(random.Random(args.seed), args.prompts)
    rollouts = sample_and_score(policy, tokenizer, task, problems, num_samples=group,
                                max_new_tokens=cfg.inference.max_new_tokens, temperature=temperature, seed=args.seed)
    rows = [{"token_ids": r.token_ids, "policy_mask": r.policy_mask,
             "privileged": problems[r.prompt_index].privileged} for r in rollouts]
    with torch.no_grad():
        inputs = CriticInputs.of(rows, tokenizer, cfg.critic)
        critic_v = inputs.values(critic, cfg.critic.loss)
    if mc and args.samples == 0:  # the critic alone, against the returns: no games played on (minutes less)
        all_values = [[float("nan")] * sum(r.policy_mask) for r in rollouts]
    elif mc:
        full = played_on_values(policy, tokenizer, task, rows, args.samples, cfg.inference.max_new_tokens,
                                temperature, args.seed + 1)  # the evaluator's oracle (critic=oracle), at every token
        all_values = [[v for v, m in zip(values, r.policy_mask) if m] for values, r in zip(full, rollouts)]
    else:
        all_values = rollout_oracle_values(policy, tokenizer, problems, rollouts, temperature)
    oracle, learnt, returns, position = [], [], [], []
    for b, (r, values) in enumerate(zip(rollouts, all_values)):
        k = r.policy_mask.index(1)
        if mc:  # policy tokens only: the environment's replies are no state the policy acts in
            at = [j for j, m in enumerate(r.policy_mask) if m]
            learnt += critic_v[b, at].tolist()
        else:
            learnt += critic_v[b, k:len(r.token_ids)].tolist()
        oracle += values
        returns += [r.reward] * len(values)
        position += range(len(values))
    oracle, learnt, returns, position = map(torch.tensor, (oracle, learnt, returns, position))
    everywhere = torch.ones_like(returns, dtype=torch.bool)
    o, c = explained_variance(oracle, returns, everywhere), explained_variance(learnt, returns, everywhere)
    print(f"run {args.run}: policy v{version}, critic v{critic_version}, {len(rollouts)} fresh rollouts "
          f"({args.prompts} prompts x {group}, T={temperature}), {len(returns)} states, reward {returns.mean():.3f}")
    against = explained_variance(learnt, oracle, everywhere)
    if mc and args.samples == 0:
        print(f"explained variance  critic {c:.3f}  (no oracle: --samples 0)")
    else:
        print(f"explained variance  oracle {o:.3f}  critic {c:.3f}  critic / oracle {c / o:.2f}"
              + (f"  ({args.samples} games per state)" if mc else ""))
        print(f"critic against the oracle: 1 - Var(V* - V) / Var(V*) = {against:.3f}")
    positions = []
    for j in range(int(position.max()) + 1):
        at = position == j
        if int(at.sum()) >= 20:  # explained_variance is nan where every return at j is the same
            positions.append({"position": j, "states": int(at.sum()),
                              "oracle_ev": explained_variance(oracle, returns, at),
                              "critic_ev": explained_variance(learnt, returns, at),
                              "critic_against_oracle": explained_variance(learnt, oracle, at)})
            print(f"  position {j}: {int(at.sum()):5d} states"
                  + ("" if mc and args.samples == 0 else f"  oracle {positions[-1]['oracle_ev']:.3f}")
                  + f"  critic {positions[-1]['critic_ev']:.3f}")
    if args.record:
        def number(x):  # no oracle (--samples 0): null in the record, not JSON's non-standard NaN
            return None if x != x else x

        positions = [{k: number(v) for k, v in p.items()} for p in positions]
        o, against = number(o), number(against)
        write_record(args.record, {
            "what": "a critic against the oracle on fresh rollouts of one policy version", "run": str(args.run),
            "policy_version": version, "critic_version": critic_version, "prompts": args.prompts, "group": group,
            "temperature": temperature, "precision": attention.dtype,
            "samples_per_state": args.samples if mc else None, "seed": args.seed,
            "states": len(returns), "reward": float(returns.mean()), "oracle_ev": o, "critic_ev": c,
            "critic_against_oracle": against, "positions": positions,
            "critic": OmegaConf.to_container(cfg.critic, resolve=True), "task": OmegaConf.to_container(cfg.task),
            "command_line": command_line("critic_oracle", argv)})
        print(f"record {args.record}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
