"""`task.*`: one config class per task, chosen by the `task` group (conf/task/<name>.yaml starts from the schema
`schema/task/<name>` that `register` stores). `TaskConfig` holds what every task has; a key of another task is
unknown here (`task.dataset=x` with task=arith fails in one line, naming the task that has it)."""

from __future__ import annotations

import difflib
import importlib.util
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Dict, Optional

from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.config.checks import declare, run_check
from prime_values.config.stages import plan

CUSTOM = "custom"
"""the `task` group option whose class `task.target` names (prime_values.tasks.CUSTOM, the same name)"""

TASK_NAMES = ("arith", "guess", "tools", "reverse_text", "math", "reasoning_gym", "verifiers", "vision", "sudoku",
              CUSTOM)

TURN_TASKS = ("verifiers", "guess", "tools", "sudoku")
"""the tasks that drive their own turns (`task.rollout`) through the transformers model: inference=hf only
(vision: its prompts carry images, which only the hf backend samples with); prime_values.backends.choose reads it"""

ANSWER_FORMATS = ("boxed", "answer_line")
"""task.answer_format's choices: the names of prime_values.tasks.reasoning_gym.ANSWER_FORMATS (the instruction
each adds to the prompt lives there)"""

_TASK_HOOKS = {
    "arith": "the task builds (its check_settings, its held-out set, task.train_pool)",
    "guess": "the task builds; a guess and a whole game fit the token budgets",
    "tools": "the task builds; a call and a whole episode fit the token budgets",
    "reverse_text": "the task builds (its rules, its held-out set, task.train_pool)",
    "math": "the prompt rules; math-verify and datasets are installed; task.data and task.heldout_data exist",
    "reasoning_gym": "the generator, its settings and the chat template's source",
    "verifiers": "the environment task.env_id resolves",
    "vision": "the task builds (its check_settings and its held-out set)",
    "sudoku": "the task builds; a move and a whole game fit the token budgets",
    CUSTOM: "task.target imports and is a task, task.args fit it, its turns' backend; the task builds",
}
assert set(_TASK_HOOKS) == set(TASK_NAMES)
TASK_CHECKS = {name: declare(f"task.{name}", what, "prime_values/tasks/checks.py")
               for name, what in _TASK_HOOKS.items()}
"""the hook of each task (`task.<name>`, registered by prime_values/tasks/checks.py): its rules that need the task's
own code, run by its config class's check before the rules of the config alone"""


@dataclass
class TaskConfig:
    """The keys every task has."""

    name: str = choice("arith", *TASK_NAMES)
    """task: 'arith' (procedural arithmetic, verified exactly), 'guess' (a multi-turn game against a hidden secret
    number, the critic's privileged context), 'tools' (a multi-turn task whose policy calls a calculator and a
    lookup table before it answers), 'reverse_text' (reverse a generated string, partial
    credit), 'math' (GSM8K/MATH-style data, math-verify), 'reasoning_gym' (problems a reasoning-gym generator
    makes offline, final answer checked by math-verify), 'verifiers' (an environment of the `verifiers` package) or
    'vision' (count the red shapes of a drawn image with a vision-language policy, policy=tiny_vl) or
    'custom' (a task class of your own, task.target=package.module:Class: docs/extending.md); chosen with the group
    (task=math), which brings that task's keys"""
    heldout_size: int = ranged(200, ">= 1")
    """size of the fixed held-out evaluation set (never trained on)"""
    train_pool: int = ranged(0, ">= 0")
    """0 = every RL prompt drawn fresh from the task's training stream; N = RL prompts (inference and the critic's
    warm-start rollouts) come from a fixed pool of N distinct training problems drawn once with task.seed, visited
    again and again like a dataset's epochs (the supervised warm start keeps the stream)"""
    seed: int = free(1234, "any integer seeds the held-out set")
    """seed of the held-out set (the training stream uses the run seed)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        """The task's own cross-field checks (each task class has its own: its hook, `TASK_CHECKS`, then the rules
        of the config alone)."""


@dataclass
class ArithTaskConfig(TaskConfig):
    """Procedural arithmetic, verified exactly; the privileged context is the reference answer."""

    name: str = choice("arith", *TASK_NAMES)
    digits: int = free(2, "1..9: prime_values/tasks/arith.py check_settings (ArithTaskConfig.check builds the task)")
    """digits per operand, 1..9 (each operand uniform in [0, 10**digits))"""
    min_digits: int = free(0, "0..digits: prime_values/tasks/arith.py check_settings")
    """arith: 0 = off; else each operand draws its digit count uniformly from min_digits..digits first, so every
    difficulty comes in equal shares (1..digits: one-digit problems as common as the longest ones)"""
    operands: int = free(2, ">= 2: prime_values/tasks/arith.py check_settings")
    """numbers per problem, >= 2 (with min_operands: the most)"""
    min_operands: int = free(0, "0 or 2..operands: prime_values/tasks/arith.py check_settings")
    """arith: 0 = off; else each problem draws its operand count uniformly from min_operands..operands, so every
    batch mixes short and long problems (a per-prompt baseline can tell them apart, a batch mean cannot)"""
    ops: str = "+"
    """operators drawn from, any non-empty subset of '+-*'"""
    show_work: bool = False
    """arith: the answer is every running result left to right, comma-separated ('12+34+56=' -> '46,102'),
    and the privileged critic sees that worked solution (needs operands >= 3 to matter; ops from '+-')"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["arith"], cfg, environment)  # ArithTask's rules, its held-out set, task.train_pool


@dataclass
class GuessTaskConfig(TaskConfig):
    """Guess a secret number in 1..N over several turns, the environment replying to each guess; the privileged
    context is the secret (prime_values/tasks/guess.py)."""

    name: str = choice("guess", *TASK_NAMES)
    min_number: int = free(8, "2..max_number: prime_values/tasks/guess.py check_settings")
    """guess: the smallest range 1..N a game draws (N uniform in min_number..max_number)"""
    max_number: int = free(40, "2..999: prime_values/tasks/guess.py check_settings")
    """guess: the largest range 1..N; binary search finds every secret within max_turns turns when
    max_number <= 2**max_turns - 1 (the defaults, 8..40 in 5 turns: binary search wins 747 of the 792 games, 94.3%, the
    ceiling no policy passes)"""
    max_turns: int = free(5, "1..32: prime_values/tasks/guess.py check_settings")
    """guess: policy turns per game; the game ends at the secret (reward 1) or after max_turns turns (reward 0)"""
    feedback: str = choice("direction", "interval", "direction")
    """guess: the environment's reply to a wrong guess: 'direction' ('<' lower, '>' higher: the policy keeps
    track of the range itself) or 'interval' (the range left, '9-15?': the game is Markov in the last reply); a
    reply that is not a number in 1..N gets '!' and costs its turn"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["guess"], cfg, environment)  # GuessTask's rules, a guess and a game in the budgets


@dataclass
class SudokuTaskConfig(TaskConfig):
    """4x4 Sudoku move by move, the environment judging each move legal or not; the privileged context is the
    solution grid (prime_values/tasks/sudoku.py)."""

    name: str = choice("sudoku", *TASK_NAMES)
    blanks_min: int = free(4, "1..blanks_max: prime_values/tasks/sudoku.py check_settings")
    """sudoku: the fewest blank cells of a puzzle (each puzzle draws its blanks uniformly from
    blanks_min..blanks_max, so a batch mixes difficulties; every puzzle has one solution)"""
    blanks_max: int = free(8, "blanks_min..12: prime_values/tasks/sudoku.py check_settings")
    """sudoku: the most blank cells of a puzzle (12 at most: a 4x4 Sudoku needs 4 clues to have one solution)"""
    max_turns: int = free(10, "blanks_max..64: prime_values/tasks/sudoku.py check_settings")
    """sudoku: policy turns (moves) per game; the game ends when the grid is full (reward 1 iff it is the
    solution), after max_illegal illegal moves or after max_turns turns (reward 0)"""
    max_illegal: int = free(2, "1..max_turns: prime_values/tasks/sudoku.py check_settings")
    """sudoku: illegal moves (a filled cell, a digit already in the row, column or box) or unreadable ones that end
    a game (reward 0); each gets the reply '-' or '?' and leaves the grid as it was"""
    feedback: str = choice("verdict", "verdict", "grid")
    """sudoku: the environment's reply to a move: 'verdict' ('+' legal, '-' illegal, '?' not a move: the policy
    keeps track of the grid itself) or 'grid' (the verdict, then the grid as it now stands: Markov in the last
    reply, ~20 more tokens a turn)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["sudoku"], cfg, environment)  # SudokuTask's rules, a move and a game in the budgets


@dataclass
class ReverseTextTaskConfig(TaskConfig):
    """Reverse a generated string ("hello|" -> "olleh"); partial credit (1 - normalised edit distance)."""

    name: str = choice("reverse_text", *TASK_NAMES)
    min_chars: int = free(3, "1..max_chars: ReverseTextTaskConfig.check builds the task")
    """reverse_text: shortest generated string"""
    max_chars: int = free(6, "min_chars.., below inference.max_new_tokens: ReverseTextTaskConfig.check")
    """reverse_text: longest generated string (the answer is as long; keep inference.max_new_tokens > it)"""
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"
    """reverse_text: characters the strings are drawn from (printable, no spaces, no '|')"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        task = cfg.task
        run_check(TASK_CHECKS["reverse_text"], cfg, environment)  # ReverseTextTask's rules, held-out set, train_pool
        if cfg.inference.max_new_tokens <= task.max_chars:
            raise ConfigError(f"inference.max_new_tokens={cfg.inference.max_new_tokens} cannot hold a "
                              f"{task.max_chars}-character answer and its eos; raise it above task.max_chars")


@dataclass
class VerifiedTaskConfig(TaskConfig):
    """The keys of the tasks whose final answer math-verify checks in a worker pool (math, reasoning_gym)."""

    prompt_template: str = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
    """math, reasoning_gym: policy prompt; {question} is replaced, other braces are literal"""
    privileged_solution: bool = True
    """math, reasoning_gym: the critic also sees the reference solution (reasoning_gym: the generator's steps or
    expression, where its metadata has them), not only the reference answer"""
    max_response_chars: int = free(1024, "a hint the task reports, not a limit")
    """math, reasoning_gym: what task.max_answer_chars() reports (generation-budget hint)"""
    verifier_workers: int = free(2, "the verifier pool checks it when it starts")
    """math, reasoning_gym: math-verify worker processes"""
    verifier_timeout_s: float = free(3.0, "the verifier pool checks it when it starts")
    """math, reasoning_gym: per-check limit (fractions fine); +1 s grace, then the worker is killed and replaced"""
    verifier_batch_timeout_s: float = free(60.0, "the verifier pool checks it when it starts")
    """math, reasoning_gym: total deadline of one score_many batch; unfinished checks score 0"""
    verifier_max_chars: int = free(4096, "the verifier pool checks it when it starts")
    """math, reasoning_gym: responses are cut to their last N characters before checking"""
    verifier_memory_mb: Optional[int] = free(4096, "the verifier pool checks it when it starts")
    """math, reasoning_gym: address-space limit per verifier worker (null: none)"""


@dataclass
class MathTaskConfig(VerifiedTaskConfig):
    """GSM8K / MATH-style problems through HF datasets, answers checked by math-verify."""

    name: str = choice("math", *TASK_NAMES)
    data: str = ""
    """math: local .jsonl/.json/.parquet/.csv file or directory, or a hub dataset name (e.g. openai/gsm8k)"""
    split: str = "train"
    """math: split of a hub dataset (a local file is its own split)"""
    data_config: Optional[str] = None
    """math: hub dataset config name ('main' for openai/gsm8k)"""
    heldout_data: Optional[str] = None
    """math: separate held-out source (default: heldout_size prompts carved out of data)"""
    heldout_split: str = "test"
    """math: split of heldout_data when it is a hub name"""
    data_cache_dir: Optional[str] = None
    """math: HF datasets cache directory (default: HF_HOME)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["math"], cfg, environment)  # MathTask's rules; here: the extras and the data


@dataclass
class ReasoningGymTaskConfig(VerifiedTaskConfig):
    """Problems a reasoning-gym generator makes offline, the final answer checked by math-verify."""

    name: str = choice("reasoning_gym", *TASK_NAMES)
    dataset: str = ""
    """reasoning_gym: the generator's name in reasoning_gym.factory.DATASETS (chain_sum, basic_arithmetic,
    gsm_symbolic, ...); an unknown name fails before any job starts, listing the close matches"""
    dataset_args: Dict[str, Any] = field(default_factory=dict)
    """reasoning_gym: the generator's config fields, e.g. {min_terms: 2, max_terms: 2, min_digits: 1,
    max_digits: 2} for chain_sum"""
    dataset_size: int = free(5000, "more than heldout_size: ReasoningGymTaskConfig.check")
    """reasoning_gym: problems generated (with task.seed); the distinct questions, minus the held-out ones, are
    the training pool"""
    answer_format: str = choice("boxed", *ANSWER_FORMATS)
    """reasoning_gym: where the reward reads the final answer: 'boxed' (the last \\boxed{...}) or 'answer_line'
    (the last line 'Answer: ...'); say the same in task.prompt_template. No final answer: reward 0"""
    chat: bool = True
    """reasoning_gym: render the prompt with task.chat_tokenizer's chat template (one user turn plus the
    generation prompt); false: the template text as it is"""
    chat_tokenizer: str = ""
    """reasoning_gym: tokenizer whose chat template renders prompts (a from_pretrained directory or hub id;
    conf/task/reasoning_gym.yaml sets it to ${policy.model})"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        if importlib.util.find_spec("math_verify") is None:
            raise ConfigError("task.name=reasoning_gym needs math-verify: pip install 'prime_values[reasoning_gym]' "
                              "(or pip install -e '.[reasoning_gym]' in a checkout)")
        run_check(TASK_CHECKS["reasoning_gym"], cfg, environment)  # ReasoningGymTask's rules, the chat source


@dataclass
class VerifiersTaskConfig(TaskConfig):
    """An environment of the `verifiers` package, rolled out in-process against the policy's own sampler."""

    name: str = choice("verifiers", *TASK_NAMES)
    env_id: str = ""
    """verifiers: the environment (taskset) id as `verifiers` resolves it: an importable module exporting its
    Taskset subclass via __all__ (an installed environment package: 'reverse-text'; 'owner/name@version' installs
    as 'name') or a built-in taskset"""
    env_args: Dict[str, Any] = field(default_factory=dict)
    """verifiers: the taskset's config fields (its TasksetConfig), e.g. {dataset_split: train}"""
    env_class: str = ""
    """verifiers: an explicit Env id, e.g. 'user-sim' (default: the Env the taskset's module exports, else the
    single-agent env)"""
    max_turns: int = ranged(8, ">= 1")
    """verifiers: most policy turns per rollout (an agent's own max_turns, when set, is used instead)"""
    privileged_field: str = "answer"
    """verifiers: the task-data field the critic may see (e.g. the reference answer); empty or absent: nothing"""
    env_pool: int = ranged(4096, ">= 1")
    """verifiers: tasks read from an infinite taskset (bounded ones are read whole) before the held-out split"""
    tool_format: str = choice("auto", "auto", "hermes", "plain")
    """verifiers tool environments: how the policy writes a call: 'hermes' (<tool_call>{"name": ..., "arguments":
    {...}}</tool_call>, for chat templates that render calls so), 'plain' (a reply that is only name({...JSON
    arguments...}); the tool list follows the system prompt) or 'auto' (hermes where the chat template writes
    <tool_call>, else plain: SmolLM2-135M's template and the embedded tokenizer get plain)"""
    tool_timeout: float = ranged(10.0, "in (0, 3600]")
    """verifiers tool environments: seconds one tool call may take; a slower one is stopped and the policy reads an
    error instead of its result"""
    max_tool_calls: int = ranged(16, ">= 1")
    """verifiers tool environments: tool calls run per episode; later ones get an error reply instead"""
    max_tool_call_chars: int = ranged(4096, ">= 16")
    """verifiers tool environments: longest call in characters (name and JSON arguments); a longer one is not read
    and gets an error reply"""
    max_tool_result_chars: int = ranged(4096, ">= 16")
    """verifiers tool environments: a tool's result longer than this many characters is cut before the policy
    reads it"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        if environment:
            run_check(TASK_CHECKS["verifiers"], cfg, environment)  # the environment task.env_id resolves


@dataclass
class CustomTaskConfig(TaskConfig):
    """A task class of your own, named by import path and built in every process that needs it; the keys every
    task has reach its constructor as heldout_size and seed (docs/extending.md, "A task")."""

    name: str = choice(CUSTOM, *TASK_NAMES)
    target: str = free("", "an import path; CustomTaskConfig.check imports the class and checks its members")
    """custom: the task's class as package.module:Class (or package.module.Class), importable in every process:
    install its package or put its directory on PYTHONPATH (the role processes inherit the environment)"""
    args: Dict[str, Any] = field(default_factory=dict)
    """custom: the constructor's keyword arguments besides heldout_size and seed, on the command line
    +task.args.top=20"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        """The class imports and has every member of a task, task.args fit its constructor, and where it plays its
        own turns the inference backend is hf; on this machine (`environment`) the task is built, as the roles
        will build it (with task.train_pool, that many distinct problems exist)."""
        run_check(TASK_CHECKS[CUSTOM], cfg, environment)


@dataclass
class ToolsTaskConfig(TaskConfig):
    """Answer a question by calling tools over several turns (a calculator, a lookup in a generated table), the
    environment replying to each call; the privileged context is the answer (prime_values/tasks/tools.py)."""

    name: str = choice("tools", *TASK_NAMES)
    kinds: str = free("calc,look,both,none", "distinct names of calc, look, both, none: prime_values/tasks/tools.py "
                      "check_settings")
    """tools: the problem kinds drawn (uniformly), comma-separated: 'calc' (a product for the calculator, '37*48?'),
    'look' (a key's value, 'k7?'), 'both' (a key's value times a number, 'k7*13?') and 'none' (a one-digit product,
    '7*8?', answered without a tool)"""
    num_keys: int = free(500, "1..10000: prime_values/tasks/tools.py check_settings")
    """tools: keys k0..k<num_keys-1> of the lookup table, each with a two-digit value drawn from task.seed (too many
    to learn by heart: a policy has to call look)"""
    calc_digits: int = free(2, "2..max_arg_digits: prime_values/tasks/tools.py check_settings")
    """tools: digits of each operand of a 'calc' problem and of the multiplier of a 'both' problem"""
    max_arg_digits: int = free(4, "2..9: prime_values/tasks/tools.py check_settings")
    """tools: the most digits of a calculator operand (and twice that of an answer) a call may write; more is
    '=error: bad arguments'"""
    max_call_chars: int = free(24, "7 + 2 * max_arg_digits..256: prime_values/tasks/tools.py check_settings")
    """tools: the longest call read, in characters; a longer one (or a turn cut at inference.max_new_tokens) is
    '=error: too long', never parsed"""
    max_turns: int = free(4, "the turns the kinds need (both: 3)..32: prime_values/tasks/tools.py check_settings")
    """tools: policy turns per episode (calls and the answer); the episode ends at the answer (reward 1 iff right)
    or after max_turns turns (reward 0)"""
    privileged_fact: bool = False
    """tools: the critic sees the looked-up fact after the answer ('689;k7=53'), not only the answer"""
    demo_tool_rate: float = free(1.0, "0..1: prime_values/tasks/tools.py check_settings")
    """tools: the share of the warm start's demonstrations of a problem that needs a tool that call it (chosen by a
    hash of the prompt); the others answer at once, from memory, so RL has tool use left to raise (1.0: every one)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["tools"], cfg, environment)  # ToolsTask's rules, a call and an episode in the budgets


@dataclass
class VisionTaskConfig(TaskConfig):
    """Count the red shapes in a small drawn image ("count red:" -> "3"); the privileged context is the count."""

    name: str = choice("vision", *TASK_NAMES)
    max_count: int = free(3, "1..9: prime_values/tasks/vision.py check_settings (VisionTaskConfig.check builds it)")
    """vision: the most red shapes in a picture; each problem draws its count uniformly from 0..max_count"""
    distractors: int = free(2, "0..16 - max_count: prime_values/tasks/vision.py check_settings")
    """vision: the most shapes of another colour (blue, green) in a picture, drawn uniformly from 0..distractors"""
    size: int = free(32, "32, 48 or 64: prime_values/tasks/vision.py check_settings")
    """vision: the picture's side in pixels (a multiple of the 16-pixel image token of policy=tiny_vl)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        run_check(TASK_CHECKS["vision"], cfg, environment)  # VisionTask's rules and its held-out set
        if cfg.policy.model == "tiny":
            raise ConfigError("task=vision reads images, which policy.model=tiny (a text-only model) cannot see; "
                              "set policy=tiny_vl")
        kind = "gguf" if str(cfg.policy.model).endswith(".gguf") else \
            saved_model_type(cfg.policy.model) if environment else None
        if kind not in (None, "qwen2_vl"):
            raise ConfigError(f"policy.model={cfg.policy.model!r} is a text-only model (model_type {kind!r}), and "
                              "task=vision reads images; set policy.model to a Qwen2-VL model: policy=tiny_vl "
                              "(embedded) or policy=qwen2_vl_2b")
        if "sft" in plan(cfg) and cfg.sft.from_run:
            raise ConfigError(f"sft.from_run={cfg.sft.from_run!r}: task=vision trains on pictures, and SFT on an "
                              "earlier run's rollouts reads their texts only; use sft.data=task (the task's pictures "
                              "and answers)")
        if "sft" in plan(cfg) and cfg.sft.data not in ("", "task"):
            raise ConfigError(f"sft.data={cfg.sft.data!r}: task=vision trains on pictures, which a dataset's "
                              "prompt/completion texts do not carry; use sft.data=task (the task's pictures and "
                              "answers)")
        if cfg.policy.pack_sequences:
            raise ConfigError("policy.pack_sequences=true would lay several rollouts on one line, and a packed line "
                              "has no multimodal positions for their images; set policy.pack_sequences=false with "
                              "task=vision")


def saved_model_type(model: str) -> str | None:
    """The model_type in a saved model directory's config.json (None: not a directory with one, e.g. a hub id or
    the embedded names; the loader reports what is wrong with those)."""
    try:
        return json.loads((Path(model) / "config.json").read_text()).get("model_type", "?")
    except (OSError, ValueError, AttributeError):
        return None


TASK_CONFIGS: dict[str, type[TaskConfig]] = {
    "arith": ArithTaskConfig, "guess": GuessTaskConfig, "tools": ToolsTaskConfig, "reverse_text": ReverseTextTaskConfig,
    "math": MathTaskConfig, "reasoning_gym": ReasoningGymTaskConfig, "verifiers": VerifiersTaskConfig,
    "vision": VisionTaskConfig, "sudoku": SudokuTaskConfig, CUSTOM: CustomTaskConfig}
assert tuple(TASK_CONFIGS) == TASK_NAMES


def owner_of(key: str) -> list[str]:
    """The tasks that have key `key` (for the message about a key of another task)."""
    return [name for name, cls in TASK_CONFIGS.items() if key in {f.name for f in fields(cls)}]


def unknown_key_hint(full_key: str, allowed: list[str]) -> str:
    """What to say about an unknown key: the task that has it (a task.* key of another task), else the allowed key
    nearest its spelling, else nothing."""
    section, _, name = full_key.rpartition(".")
    owners = owner_of(name) if section == "task" else []
    if owners:
        return f" (a key of task={' / task='.join(owners)}: choose that task with task={owners[0]})"
    near = difflib.get_close_matches(name, allowed, n=1)
    return f" (did you mean '{near[0]}'?)" if near else ""
