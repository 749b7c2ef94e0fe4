"""From problems to scored rollouts: the one sampling-and-scoring path of the inference role, the held-out
evaluations (the trainers', the warm start's, the stages'), the SFT early stop, the critic warm start's samples and
the eval stage (docs/design.md §1).

Token layout: ``prompt_ids = tokenizer.encode(problem.prompt)`` (no special tokens), then the sampled reply.
``EnvRollout`` is the one record of a scored rollout, whichever task made it (tasks.verifiers_env builds it too).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prime_values.backends import as_backend


@dataclass
class EnvRollout:
    """One finished, scored episode, what ``sample_and_score`` returns for every task and the inference role records
    (``roles.inference.env_rows``): a single reply is a one-turn episode (``scored_replies``), a task that drives
    its own episodes (``task.rollout``: tasks.verifiers_env) builds them turn by turn."""

    prompt_index: int
    token_ids: list[int]
    policy_mask: list[int]
    logprobs: list[float]
    reward: float
    stop_reason: str  # eos | length | env_done | error
    text: str  # the policy's replies, joined
    turns: int = 0
    rewards: dict = field(default_factory=dict)
    error: str | None = None


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
        # task=vision takes the backend itself (vLLM samples its pictures); the others drive the transformers model
        player = backend if getattr(task, "rollout_takes_backend", False) else backend.model
        return task.rollout(player, tokenizer, problems, num_samples=num_samples,
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


def greedy_accuracy(model, tokenizer, task, problems, max_new_tokens: int | None = None, batch_size: int = 256,
                    per_problem: list | None = None) -> float:
    """Mean reward of one greedy rollout per problem of ``problems``: the held-out set (``task.heldout()``: the
    trainers' and the stages' held-out accuracy) or fixed training problems (the SFT early stop,
    ``supervised.validation_accuracy``). Exact-match accuracy for arith, the rubric's reward of whole (multi-turn)
    episodes for task=verifiers.

    ``per_problem``: a list that receives one record per problem (``prompt_id``, ``reward``, ``stop_reason``,
    ``response_tokens``, ``response`` text and, where the task has ``parsable``, whether the reply holds a final
    answer in the asked format): what a paired before/after comparison needs (bench/paired_heldout.py)."""
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
            if getattr(r, "calls", None) is not None:  # task=tools: the calls as the episode made them
                record["calls"] = r.calls
            per_problem.append(record)
    return sum(r.reward for r in rollouts) / len(rollouts)
