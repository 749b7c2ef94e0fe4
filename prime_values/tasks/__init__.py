"""Task registry: ``make_task(name, **kwargs)``."""

from __future__ import annotations

import inspect
from typing import Callable

from .arith import ArithTask, Problem
from .guess import GuessTask
from .math import MathTask
from .reasoning_gym import ReasoningGymTask
from .reverse_text import ReverseTextTask


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


TASKS: dict[str, Callable[..., object]] = {
    "arith": ArithTask,
    "guess": GuessTask,
    "reverse_text": ReverseTextTask,
    "math": MathTask,
    "reasoning_gym": _reasoning_gym_task,
    "verifiers": _verifiers_task,
}


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


__all__ = ["ArithTask", "GuessTask", "MathTask", "Problem", "ReverseTextTask", "TASKS", "make_task"]
