"""The tasks: the registry `TASKS` of the built-in ones, a task class of your own named by import path, and
`make_task`, which every process builds its task with (the config check, the warm start, inference, the policy
trainer's held-out evaluation, the stages).

A task is any class with the members `MEMBERS` lists (docs/extending.md, "A task"): `sample(rng, n)` (training
`Problem`s, whose `privileged` field is what the critic may see), `heldout()`, `is_heldout(problem)`,
`score_many(problems, texts)` (the reward), `max_answer_chars()`, `describe()`, and for the warm start one of
`solution(problem)` (one reply) or `demonstration(problem)` (a multi-turn episode as (text, is_policy) segments);
a task that plays its own turns adds `rollout(...)` (prime_values/rollout.py calls it when present).

`task=custom task.target=package.module:Class` names a class of your own (`package.module.Class` works too);
`task.args` are its constructor's keywords (`+task.args.top=20`) besides `heldout_size` and `seed`, which every
task's constructor takes from `task.heldout_size` and `task.seed`. `user_task_class` imports and checks it in
each process; a misspelt module, class or keyword is one ValueError naming the `task.*` key and the fix.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from prime_values.importpath import first_line, import_class, split

from .arith import ArithTask, Problem
from .guess import GuessTask
from .math import MathTask
from .reasoning_gym import ReasoningGymTask
from .reverse_text import ReverseTextTask
from .sudoku import SudokuTask
from .tools import ToolsTask
from .vision import VisionTask


def _reasoning_gym_task(**kwargs):
    """reasoning-gym problems (the package, an optional extra, is imported only when the task is built); gets the
    keys its constructor names."""
    accepted = inspect.signature(ReasoningGymTask).parameters
    return ReasoningGymTask(**{k: v for k, v in kwargs.items() if k in accepted})


def _verifiers_task(**kwargs):
    """The `verifiers` adapter, imported only when chosen (the package is an optional extra; the adapter imports
    asyncio)."""
    from .verifiers_env import VerifiersTask

    return VerifiersTask(**kwargs)


# A task of your own, named by import path.

CUSTOM = "custom"
"""the `task` group option whose class `task.target` names"""

MEMBERS = ("sample", "heldout", "is_heldout", "score_many", "max_answer_chars", "describe")
"""the methods every task has"""
WARM_START_MEMBERS = ("solution", "demonstration")
"""what the warm start trains on: a task has one of them (a multi-turn task, `demonstration`)"""
COMMON_KEYWORDS = ("heldout_size", "seed")
"""the constructor keywords every task takes, from task.heldout_size and task.seed"""


def missing_members(cls: Any) -> list[str]:
    """The methods of a task that `cls` lacks ('solution or demonstration' when it has neither)."""
    missing = [name for name in MEMBERS if not callable(getattr(cls, name, None))]
    if not any(callable(getattr(cls, name, None)) for name in WARM_START_MEMBERS):
        missing.append(" or ".join(WARM_START_MEMBERS))
    if hasattr(cls, "rollout") and not callable(cls.rollout):
        missing.append("rollout (a method, not a value)")
    return missing


def user_task_class(target: str) -> type:
    """The class `task.target` names as `package.module:Class` (or `package.module.Class`), imported here and
    checked to have every member of a task. A ValueError saying which part is wrong and how to fix it otherwise."""
    key = f"task.target={target!r}"
    if not target:
        raise ValueError("task.target is empty; name your task class as task.target=package.module:Class "
                         "(docs/extending.md, \"A task\")")
    if target in TASKS:
        raise ValueError(f"{key} is a built-in task; choose it with task={target} instead of task={CUSTOM}")
    if split(target) is None:
        raise ValueError(f"{key} is not an import path; name your task class as package.module:Class "
                         "(docs/extending.md, \"A task\")")
    cls = import_class(target, key)
    if not isinstance(cls, type):
        raise ValueError(f"{key} is a {type(cls).__name__}, not a class; name the task's class "
                         "(docs/extending.md, \"A task\")")
    missing = missing_members(cls)
    if missing:
        raise ValueError(f"{key} is not a task class: it lacks {', '.join(missing)}; add "
                         f"{'it' if len(missing) == 1 else 'them'} (docs/extending.md, \"A task\")")
    return cls


def user_task_arguments(cls: type, target: str, args: Any, heldout_size: int, seed: int) -> dict:
    """The keywords `cls` is built with: task.args, task.heldout_size and task.seed, checked against its
    constructor; a ValueError naming the key and the fix otherwise."""
    if args is not None and not isinstance(args, dict):  # a DictConfig: the roles read the run's config.yaml
        from omegaconf import OmegaConf

        args = OmegaConf.to_container(args, resolve=True)
    args = dict(args or {})
    for name in COMMON_KEYWORDS:
        if name in args:
            raise ValueError(f"task.args.{name} is a key every task has; set task.{name}={args[name]} instead")
    parameters = inspect.signature(cls).parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = [p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    lacking = [name for name in COMMON_KEYWORDS if name not in named and not takes_any]
    if lacking:
        raise ValueError(f"task.target={target}: its constructor takes no {' or '.join(lacking)}; every task takes "
                         f"heldout_size and seed (task.heldout_size, task.seed), so add them to its keywords")
    try:
        inspect.signature(cls).bind(**args, heldout_size=heldout_size, seed=seed)
    except TypeError as error:
        takes = ", ".join(n for n in named if n not in COMMON_KEYWORDS) or "none"
        raise ValueError(f"task.args={args} does not fit task.target={target} ({error}); its keyword arguments: "
                         f"{takes}") from None
    return {**args, "heldout_size": heldout_size, "seed": seed}


def user_task(target: str = "", args: Any = None, heldout_size: int = 200, seed: int = 1234):
    """task=custom: the class task.target names, built with task.args, task.heldout_size and task.seed. A
    ValueError of the constructor is the task's own message; any other error becomes one naming task.target."""
    cls = user_task_class(target)
    kwargs = user_task_arguments(cls, target, args, heldout_size, seed)
    try:
        return cls(**kwargs)
    except ValueError:
        raise
    except Exception as error:
        raise ValueError(f"task.target={target}: building it with {kwargs} raised {type(error).__name__}: "
                         f"{first_line(error)}; fix the class or task.args") from error


TASKS: dict[str, Callable[..., object]] = {
    "arith": ArithTask,
    "guess": GuessTask,
    "tools": ToolsTask,
    "reverse_text": ReverseTextTask,
    "math": MathTask,
    "reasoning_gym": _reasoning_gym_task,
    "verifiers": _verifiers_task,
    "vision": VisionTask,  # counting shapes in a drawn image: needs policy=tiny_vl
    "sudoku": SudokuTask,  # 4x4 Sudoku move by move, each move judged legal or not
    CUSTOM: user_task,  # a class of your own: task=custom task.target=package.module:Class
}
"""Every task by its name in the `task` group: the built-in ones, and `custom` for a class named by import path."""


def make_task(name: str, **kwargs):
    """Build task `name` from the `task` config group; each task takes the keys it names (the group holds the
    keys of every task, so e.g. `digits` reaches arith and `data` reaches math)."""
    try:
        factory = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(sorted(TASKS))}") from None
    accepted = inspect.signature(factory).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in accepted.values()):
        kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    return factory(**kwargs)


__all__ = ["ArithTask", "CUSTOM", "GuessTask", "MathTask", "Problem", "ReverseTextTask", "SudokuTask", "TASKS",
           "ToolsTask", "make_task", "user_task_class"]
