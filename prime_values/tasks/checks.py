"""The tasks' config checks, registered with prime_values.config.checks: each task's hook (`task.<name>`: the rules
its own code knows, the task built before any job, its turns within the token budgets, its data or environment
found) and the sft stage's data source (`sft.data`). Imported by prime_values.launch.checks; the task modules
themselves do not import the config."""

from __future__ import annotations

import importlib.util

from prime_values.config.base import ConfigError, reported
from prime_values.config.checks import register_check
from prime_values.config.inference import planned_backend
from prime_values.config.stages import SFT_DATA_CHECK
from prime_values.config.task import TASK_CHECKS
from prime_values.tasks import CUSTOM, make_task, user_task_arguments, user_task_class
from prime_values.tasks.math import MathDataError, check_settings as check_math_settings, resolve_source
from prime_values.tasks.pool import PromptPool
from prime_values.tasks.reasoning_gym import ReasoningGymError, check_chat_source, check_settings as check_gym_settings


def check_build(cfg) -> None:
    """Build the task here, before any job (a procedural task is cheap to build): its constructor's own rules
    (prime_values/tasks) and, with task.train_pool, that many distinct problems exist."""
    try:
        task = make_task(**cfg.task)
        if cfg.task.train_pool:
            PromptPool(task, cfg.task.train_pool, cfg.task.seed)
    except ValueError as error:
        message = str(error)
        where = f"task.target={cfg.task.target}" if cfg.task.name == CUSTOM else f"task ({cfg.task.name})"
        raise ConfigError(message if message.startswith("task.") else f"{where}: {message}") from None


def check_turn_budget(cfg, task, what: str, episode: str, privileged: str, critic_what: str) -> None:
    """The token budgets of a task that drives its own turns (task=sudoku, task=tools): a turn holds the longest
    answer and its eos; on the embedded model a whole episode fits its positions, and the critic's input (the
    episode and `privileged`, the longest privileged text) fits critic.max_length. `what` names the answer ({n}:
    its characters), `episode` an episode, `critic_what` the critic's input, in the one-line errors."""
    name, new, most = cfg.task.name, cfg.inference.max_new_tokens, task.max_answer_chars()
    if new <= most:
        raise ConfigError(f"inference.max_new_tokens={new} cannot hold {what.format(n=most)} and its eos; raise it "
                          f"above {most}")
    if str(cfg.policy.model) != "tiny":
        return
    longest, positions = task.max_trace_chars(new), cfg.policy.arch.max_position_embeddings
    if longest > positions:
        raise ConfigError(f"task={name}: {episode} of task.max_turns={task.max_turns} turns of "
                          f"inference.max_new_tokens={new} takes up to {longest} tokens, more than "
                          f"policy.arch.max_position_embeddings={positions}; lower task.max_turns or raise "
                          "policy.arch.max_position_embeddings")
    critic_longest = longest + len(cfg.critic.template.format(privileged=privileged))
    if cfg.critic.max_length < critic_longest:
        raise ConfigError(f"task={name}: the critic's input ({critic_what}) takes up to {critic_longest} tokens, "
                          f"more than critic.max_length={cfg.critic.max_length}; raise critic.max_length")


@register_check(TASK_CHECKS["arith"])
@register_check(TASK_CHECKS["reverse_text"])
@register_check(TASK_CHECKS["vision"])
def check_procedural(cfg, environment: bool) -> None:
    """A procedural task: its rules (check_settings), its held-out set and task.train_pool, by building it."""
    check_build(cfg)


@register_check(TASK_CHECKS["guess"])
def check_guess(cfg, environment: bool) -> None:
    check_build(cfg)  # GuessTask's rules (check_settings)
    task = make_task(**cfg.task)
    if cfg.inference.max_new_tokens <= task.max_answer_chars():
        raise ConfigError(f"inference.max_new_tokens={cfg.inference.max_new_tokens} cannot hold a "
                          f"{task.max_answer_chars()}-digit guess and its eos; raise it above "
                          f"{task.max_answer_chars()}")
    if str(cfg.policy.model) != "tiny":
        return
    longest = task.max_trace_chars() + cfg.inference.max_new_tokens
    positions = cfg.policy.arch.max_position_embeddings
    if longest > positions:
        raise ConfigError(f"task=guess: a game of task.max_turns={task.max_turns} turns takes up to {longest} "
                          f"tokens, more than policy.arch.max_position_embeddings={positions}; lower "
                          "task.max_turns or raise policy.arch.max_position_embeddings")
    critic_longest = task.max_trace_chars() + len(cfg.critic.template) + len(str(task.max_number))
    if cfg.critic.max_length < critic_longest:
        raise ConfigError(f"task=guess: the critic's input (a whole game and the secret) takes up to "
                          f"{critic_longest} tokens, more than critic.max_length={cfg.critic.max_length}; "
                          "raise critic.max_length")


@register_check(TASK_CHECKS["sudoku"])
def check_sudoku(cfg, environment: bool) -> None:
    check_build(cfg)  # SudokuTask's rules (check_settings)
    check_turn_budget(cfg, make_task(**cfg.task), what="a move of task=sudoku ('12=3', {n} characters)",
                      episode="a game", privileged="1234/3412/2143/4321", critic_what="a whole game and the solution")


@register_check(TASK_CHECKS["tools"])
def check_tools(cfg, environment: bool) -> None:
    check_build(cfg)  # ToolsTask's rules (check_settings)
    task = make_task(**cfg.task)
    check_turn_budget(cfg, task, what="the longest call of task=tools ({n} characters)", episode="an episode",
                      privileged="9" * task.max_privileged_chars(), critic_what="a whole episode and the answer")


@register_check(TASK_CHECKS["math"])
def check_math(cfg, environment: bool) -> None:
    """The rules MathTask checks before it loads its data; on this machine the extras it needs and its sources."""
    with reported(MathDataError):
        check_math_settings(cfg.task.prompt_template, cfg.task.heldout_size)
    if not environment:
        return
    if importlib.util.find_spec("math_verify") is None or importlib.util.find_spec("datasets") is None:
        raise ConfigError("task.name=math needs math-verify and datasets: pip install 'prime_values[math]' "
                          "(or pip install -e '.[math]' in a checkout)")
    for key in ("data", "heldout_data"):
        if key == "data" or cfg.task[key]:
            with reported(MathDataError):
                resolve_source(cfg.task[key], f"task.{key}", cfg.task.data_cache_dir)


@register_check(TASK_CHECKS["reasoning_gym"])
def check_reasoning_gym(cfg, environment: bool) -> None:
    """The rules ReasoningGymTask checks before it generates problems, and where its chat template comes from."""
    task = cfg.task
    with reported(ReasoningGymError):
        check_gym_settings(task.dataset, task.prompt_template, task.answer_format, task.dataset_size,
                           task.heldout_size, task.chat, task.chat_tokenizer)
    if task.chat:
        with reported(ReasoningGymError):
            check_chat_source(task.chat_tokenizer)


@register_check(TASK_CHECKS["verifiers"])
def check_verifiers(cfg, environment: bool) -> None:
    """The environment task.env_id names resolves (VerifiersTaskConfig.check runs it on this machine only)."""
    from prime_values.tasks.verifiers_env import VerifiersUnavailable, check_env_id

    with reported(VerifiersUnavailable):
        check_env_id(cfg.task.env_id, cfg.task.env_class)


@register_check(TASK_CHECKS[CUSTOM])
def check_custom(cfg, environment: bool) -> None:
    """The class imports and has every member of a task, task.args fit its constructor, and where it plays its
    own turns the inference backend is hf; on this machine (`environment`) the task is built, as the roles
    will build it (with task.train_pool, that many distinct problems exist)."""
    task = cfg.task
    try:
        cls = user_task_class(task.target)
        user_task_arguments(cls, task.target, task.args, task.heldout_size, task.seed)
    except ValueError as error:
        raise ConfigError(str(error)) from None
    if hasattr(cls, "rollout"):
        if planned_backend(cfg) == "vllm":
            raise ConfigError(f"task.target={task.target} plays its own turns (it has rollout) through the "
                              f"transformers model; use inference=hf with it (inference={cfg.inference.backend} "
                              "samples single-turn replies through vLLM)")
    if environment:
        check_build(cfg)


@register_check(SFT_DATA_CHECK)
def check_sft_data(cfg, environment: bool) -> None:
    """sft.data (a file, directory or hub dataset name) can be found, as the math task finds its data."""
    with reported(MathDataError):
        resolve_source(cfg.sft.data, "sft.data", cfg.task.get("data_cache_dir"))
