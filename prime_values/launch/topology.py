"""Processes and GPUs of a role's job, from the topology (used by the local and the SLURM launch alike; standard
library only, like the rest of the launch package's base)."""

from __future__ import annotations


def role_procs(topology, role: str) -> int:
    """Processes of a role's job: topology.<role>_procs for the trainers (FSDP2, prime_values.dist), else 1."""
    return int(topology.get(f"{role}_procs", 1)) if role in ("policy_trainer", "value_trainer") else 1


def role_gpus(topology, role: str) -> int:
    """GPUs of a role's job on a GPU device: one per process, and an inference worker's topology.inference_tp."""
    return int(topology.get("inference_tp", 1)) if role == "inference" else role_procs(topology, role)
