"""The role jobs of the rl stage, named (used by the local and the SLURM launch alike): the config says which roles
run where and in how many processes (prime_values/config/topology.py: `pipeline_slots`, `role_procs`, `role_gpus`),
this module gives each its job name and arguments. Like the rest of the launch package's base it imports the
standard library only at the top: the config's names are imported where they are first used."""

from __future__ import annotations

from typing import NamedTuple

from prime_values.roles import evaluator_name

FROM_CONFIG = ("role_gpus", "role_procs")
"""names read from here that are the config's (`__getattr__` imports them when first read)"""


def __getattr__(name: str):
    if name in FROM_CONFIG:
        from prime_values.config import topology  # the config package (omegaconf): only where it is read

        return getattr(topology, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class RoleSpec(NamedTuple):
    """One role job of the rl stage: its job name, its role (prime_values.roles.ENTRYPOINTS), device, arguments."""

    name: str
    role: str
    device: str
    args: tuple = ()


def _name(role: str, index: int | None) -> str:
    if role == "inference":
        return f"inference{index}"
    return evaluator_name(index) if role == "evaluator" else role


def pipeline_roles(topology, with_critic: bool, value_trainer: bool = True) -> list[RoleSpec]:
    """Every role job the rl stage runs at once (the warm start runs before them), in start order: the one list
    the supervisor starts and the SLURM allocation is sized for. `value_trainer`: False for the oracle critic
    (critic.oracle_samples: evaluators, no value trainer)."""
    from prime_values.config.topology import pipeline_slots  # which roles the keys give (the config package)

    return [RoleSpec(_name(slot.role, slot.index), slot.role, slot.device, () if slot.index is None else (slot.index,))
            for slot in pipeline_slots(topology, with_critic, value_trainer)]
