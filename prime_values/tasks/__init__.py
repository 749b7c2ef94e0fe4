"""Task registry: ``make_task(name, **kwargs)``."""

from __future__ import annotations

from typing import Callable

from .arith import ArithTask, Problem

TASKS: dict[str, Callable[..., object]] = {
    "arith": ArithTask,
}


def make_task(name: str, **kwargs):
    try:
        factory = TASKS[name]
    except KeyError:
        raise ValueError(f"unknown task {name!r}; allowed: {', '.join(sorted(TASKS))}") from None
    return factory(**kwargs)


__all__ = ["ArithTask", "Problem", "TASKS", "make_task"]
