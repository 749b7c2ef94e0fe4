"""Token budgets, checked before any job starts (one line each).

With the embedded character model a prompt is a handful of tokens; with a real model's chat template the prompt
alone is ~40 tokens (SmolLM2's system turn) and a budget chosen for the tiny model can leave no room for the
response. `check_budget` measures the longest prompt a task renders and says which key to raise: for the embedded
model in the config check (`check_embedded_budget`: one token per character, the task's longest prompt and
answer known exactly; registered as the config's `budget` check hook), for a local model before the jobs start
(`check_run_budget`: its tokenizer)."""

from __future__ import annotations

import random
from pathlib import Path

from prime_values.config.base import reported
from prime_values.config.checks import register_check
from prime_values.config.derived import fact
from prime_values.config.root import BUDGET_CHECK
from prime_values.tasks import TASKS, make_task


class BudgetError(ValueError):
    """A token budget that cannot hold the prompt plus a response; the message names the key and the fix."""


def prompt_lengths(tokenizer, prompts: list[str]) -> list[int]:
    """Token count of each prompt as the inference role encodes it (no special tokens added)."""
    return [len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts]


def check_budget(tokenizer, prompts: list[str], max_new_tokens: int, *, model_max_length: int | None = None,
                 critic_max_length: int | None = None, privileged: list[str] | None = None,
                 template: str = "{privileged}", positions_key: str | None = None, response_tokens: int = 1) -> dict:
    """Check that the longest of `prompts` leaves room for a response:

    - prompt + inference.max_new_tokens within the model's positions (`model_max_length`, e.g. the config's
      max_position_embeddings): else generation runs past what the model was trained on (vLLM refuses it);
    - prompt + privileged block + `response_tokens` within critic.max_length (`critic_max_length`): else every
      trace is cut before its first policy token and the critic values nothing (1, the default), or the longest
      correct reply is cut (the embedded model: the longest answer and its eos).

    Returns {"longest_prompt", "longest_block", "full_trace"}: "full_trace" = prompt + block + max_new_tokens, the
    critic.max_length that never cuts a trace. `positions_key`: the key that sets the model's positions, named in
    the message (the embedded model's policy.arch.max_position_embeddings). Raises BudgetError (one line)."""
    if not prompts:
        return {"longest_prompt": 0, "longest_block": 0, "full_trace": max_new_tokens}
    longest = max(prompt_lengths(tokenizer, prompts))
    block = 0
    if privileged:
        block = max(len(tokenizer.encode(template.format(privileged=p), add_special_tokens=False))
                    for p in privileged)
    if model_max_length is not None and longest + max_new_tokens > model_max_length:
        fix = (f"lower inference.max_new_tokens to <= {model_max_length - longest}" if longest < model_max_length
               else "shorten the prompts (the longest alone fills the model)")
        positions = f"{positions_key}={model_max_length}" if positions_key else \
            f"the model's {model_max_length} positions"
        raise BudgetError(f"inference.max_new_tokens={max_new_tokens} plus the longest prompt ({longest} tokens) "
                          f"exceeds {positions}; {fix}")
    if critic_max_length is not None and longest + block + response_tokens > critic_max_length:
        reply = "one response token: every trace would be cut before the critic sees a response" \
            if response_tokens == 1 else f"the longest answer and its eos ({response_tokens}): the longest correct " \
                                         "replies would be cut"
        raise BudgetError(f"critic.max_length={critic_max_length} cannot hold the longest prompt ({longest} tokens) "
                          f"plus the privileged block ({block}) and {reply}; raise critic.max_length to >= "
                          f"{longest + block + max_new_tokens} (prompt + block + inference.max_new_tokens)")
    return {"longest_prompt": longest, "longest_block": block, "full_trace": longest + block + max_new_tokens}


def check_run_budget(cfg, sample: int = 64) -> dict | None:
    """`check_budget` for a run whose policy.model is a local from_pretrained directory: its tokenizer, the task's
    held-out prompts and a sample of training prompts, critic.max_length (with the privileged block when
    critic.privileged), and with inference.backend=vllm (whose engine refuses a request longer than its context;
    transformers just runs past max_position_embeddings) prompt + inference.max_new_tokens against the model's
    positions. None when the model is 'tiny' or not a local directory. Loads the
    tokenizer and builds the task in this process (a second or two; None when either fails to load here: the jobs
    then report it); raises BudgetError."""
    model = str(cfg.policy.model)
    if model == "tiny" or not Path(model).expanduser().is_dir():
        return None
    from transformers import AutoConfig, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
        positions = None
        if cfg.inference.backend == "vllm":  # its context: vllm_args.max_model_len, else the model's positions
            positions = (cfg.inference.get("vllm_args") or {}).get("max_model_len") or \
                getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", None)
        task = make_task(**cfg.task)
        try:
            problems = list(task.heldout())[:sample] + list(task.sample(random.Random(0), sample))
        finally:
            if hasattr(task, "close"):
                task.close()
    except Exception:  # noqa: BLE001 - a model or task that does not load here fails in its job, with its own line
        return None
    ccfg = cfg.critic
    return check_budget(tokenizer, [p.prompt for p in problems], cfg.inference.max_new_tokens,
                        model_max_length=positions, critic_max_length=ccfg.max_length,
                        privileged=[p.privileged for p in problems] if ccfg.privileged else None,
                        template=ccfg.template)


class CharTokens:
    """The embedded model's character tokenizer, counted without building it (prime_values/models/tokenizer.py:
    every character is one token, nothing is added)."""

    @staticmethod
    def encode(text: str, add_special_tokens: bool = False) -> list[int]:
        return [0] * len(text)


def check_embedded_budget(cfg, uses_critic: bool = True) -> dict | None:
    """`check_budget` for the embedded model (policy.model=tiny) on a procedural task, exactly and cheaply: the
    task's longest prompt and longest answer in characters (each character one token; the privileged context of a
    procedural task is its answer), inference.max_new_tokens within policy.arch.max_position_embeddings, and, when
    the run has a critic (`uses_critic`), critic.max_length. None for another model (check_run_budget) or a task
    without those lengths (data sets, environments). Raises BudgetError (one line)."""
    if str(cfg.policy.model) != "tiny" or not hasattr(TASKS.get(cfg.task.name), "max_prompt_chars"):
        return None
    task = make_task(**cfg.task)  # a procedural task: built in milliseconds
    ccfg = cfg.critic
    return check_budget(CharTokens, ["x" * task.max_prompt_chars()], cfg.inference.max_new_tokens,
                        model_max_length=cfg.policy.arch.max_position_embeddings,
                        critic_max_length=ccfg.max_length if uses_critic else None,
                        privileged=["x" * task.max_answer_chars()] if ccfg.privileged else None,
                        template=ccfg.template, positions_key="policy.arch.max_position_embeddings",
                        response_tokens=task.max_answer_chars() + 1)


@register_check(BUDGET_CHECK)
def check_config_budget(cfg, environment: bool) -> None:
    """The config's hook: the embedded model's token budgets (`check_embedded_budget`; critic.max_length only when
    the run has a critic). A local model's are checked once its tokenizer is at hand, before the jobs start."""
    with reported(BudgetError):
        check_embedded_budget(cfg, uses_critic=fact(cfg, "uses_critic"))  # resolved.* is derived after validation
