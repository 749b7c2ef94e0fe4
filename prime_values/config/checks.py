"""The checks of a config that need the code above it (a task built, a data set found, a GGUF file read, the SLURM
layout), as hooks: config declares each one where validation runs it (`declare`, in the section's module), the
module that knows how registers its check function (`register_check`), and the section's check runs it in place
(`run_check`), so config imports nothing of prime_values outside this package.

Registration happens when the registering module is imported; `prime_values.launch.checks` imports every one of
them (`python -m prime_values` and the conductor import it before they validate) and then `require_all`, which
raises when a declared hook has no check. Where a hook runs before its module was imported (a tool, a library
user's `compose(prepared=True)`, a test that builds a config by hand), `run_check` imports the module the hook
names, as a registry loads a plugin by its name: every check runs wherever a config is validated, and config still
imports nothing above it at import time.

A check is `check(cfg, environment: bool) -> None` and raises ConfigError with the usual one sentence naming the
key and the fix; `environment=False` (`--cfg job`, composing for another machine) asks it to leave out what only
this machine can say (installed packages, files, data sets, the cluster).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable

Check = Callable[..., None]  # check(cfg, environment: bool) -> None


@dataclass
class Hook:
    """One check config runs and another module provides."""

    name: str
    what: str  # what it checks, in a few words
    where: str  # the module that registers it
    check: Check | None = None


HOOKS: dict[str, Hook] = {}
"""every declared hook by name, in declaration order (config's modules declare theirs as they are imported)"""


def declare(name: str, what: str, where: str) -> str:
    """Declare hook `name` (`what` it checks, the module `where` registers it); returns the name."""
    hook = HOOKS.setdefault(name, Hook(name, what, where))
    assert (hook.what, hook.where) == (what, where), f"hook {name!r} declared twice, differently"
    return name


def register_check(name: str) -> Callable[[Check], Check]:
    """Decorator: `check` is what hook `name` runs. An undeclared name is a ValueError (a misspelt hook would
    never run); registering a second, different function for a hook too (the same one again, as a reloaded module
    does, replaces it)."""

    def register(check: Check) -> Check:
        hook = HOOKS.get(name)
        if hook is None:
            raise ValueError(f"no config check hook {name!r} is declared; declare it in prime_values/config "
                             f"(declared: {', '.join(HOOKS)})")
        old = hook.check
        if old is not None and (old.__module__, old.__qualname__) != (check.__module__, check.__qualname__):
            raise ValueError(f"config check hook {name!r} is registered twice: {old.__module__}.{old.__qualname__} "
                             f"and {check.__module__}.{check.__qualname__}")
        hook.check = check
        return check

    return register


def run_check(name: str, cfg, environment: bool) -> None:
    """Run hook `name` on `cfg`, importing the module it names first where nothing registered it yet (module
    docstring); a module that does not register it is a RuntimeError naming both."""
    hook = HOOKS[name]
    if hook.check is None:
        importlib.import_module(hook.where.removesuffix(".py").replace("/", "."))
    if hook.check is None:
        raise RuntimeError(f"config check hook {name!r}: {hook.where} does not register it (register_check)")
    hook.check(cfg, environment)


def unregistered() -> list[Hook]:
    """The declared hooks nothing has registered a check for."""
    return [hook for hook in HOOKS.values() if hook.check is None]


def require_all() -> None:
    """Raise RuntimeError naming each declared hook without a check and the module that should register it."""
    missing = unregistered()
    if missing:
        raise RuntimeError("config check hooks without a check (import the module that registers each): " +
                           "; ".join(f"{hook.name} ({hook.what}): {hook.where}" for hook in missing))
