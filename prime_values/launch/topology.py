"""Processes and GPUs of a role's job, from the topology (used by the local and the SLURM launch alike; standard
library only, like the rest of the launch package's base)."""

from __future__ import annotations

from typing import NamedTuple

from prime_values.roles import evaluator_name


def role_procs(topology, role: str) -> int:
    """Processes of a role's job: topology.<role>_procs for the trainers (FSDP2, prime_values.dist), else 1."""
    return int(topology.get(f"{role}_procs", 1)) if role in ("policy_trainer", "value_trainer") else 1


def role_gpus(topology, role: str) -> int:
    """GPUs of a role's job on a GPU device: one per process, and an inference worker's topology.inference_tp."""
    return int(topology.get("inference_tp", 1)) if role == "inference" else role_procs(topology, role)


class RoleSpec(NamedTuple):
    """One role job of the rl stage: its job name, its role (prime_values.roles.ENTRYPOINTS), device, arguments."""

    name: str
    role: str
    device: str
    args: tuple = ()


def pipeline_roles(topology, with_critic: bool, value_trainer: bool = True) -> list[RoleSpec]:
    """Every role job the rl stage runs at once (the warm start runs before them), in start order: the one list
    the supervisor starts and the SLURM allocation is sized for. `value_trainer`: False for the oracle critic
    (critic.oracle_samples: evaluators, no value trainer)."""
    roles = [RoleSpec(f"inference{w}", "inference", topology.inference_device, (w,))
             for w in range(topology.inference_workers)]
    if with_critic and topology.evaluator == "dedicated":
        roles += [RoleSpec(evaluator_name(i), "evaluator", topology.evaluator_device, (i,))
                  for i in range(topology.evaluators)]
    roles += [RoleSpec("orchestrator", "orchestrator", "cpu"),
              RoleSpec("policy_trainer", "policy_trainer", topology.policy_trainer_device)]
    if with_critic and value_trainer:
        roles.append(RoleSpec("value_trainer", "value_trainer", topology.value_trainer_device))
    return roles
