"""`topology.*`: which role runs where and in how many processes; the device checks of this machine; what the
keys say of the rl stage's role jobs (`pipeline_slots`, `role_procs`, `role_gpus`: the launch names and starts
them, prime_values.launch.topology) and the 'auto' devices resolved (`resolve_devices`)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import NamedTuple, Optional

from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.config.policy import ROLE_DEVICES

DEVICE = "'cpu', 'auto' or 'cuda:<index>' of this machine: TopologyConfig.check_devices"

DEVICE_KEYS = tuple(f"{role}_device" for role in ROLE_DEVICES)
"""topology's device keys, in the order 'auto' devices take GPUs (`resolve_devices`)"""


def role_procs(topology, role: str) -> int:
    """Processes of a role's job: topology.<role>_procs for the trainers (FSDP2, prime_values.dist), else 1."""
    return int(topology.get(f"{role}_procs", 1)) if role in ("policy_trainer", "value_trainer") else 1


def role_gpus(topology, role: str) -> int:
    """GPUs of a role's job on a GPU device: one per process, and an inference worker's topology.inference_tp."""
    return int(topology.get("inference_tp", 1)) if role == "inference" else role_procs(topology, role)


class RoleSlot(NamedTuple):
    """One role job of the rl stage as the keys give it: its role (prime_values.roles.ENTRYPOINTS), its device, and
    the worker's or evaluator's index (None for the others)."""

    role: str
    device: str
    index: Optional[int] = None


def pipeline_slots(topology, with_critic: bool, value_trainer: bool = True) -> list[RoleSlot]:
    """Every role job the rl stage runs at once (the warm start runs before them), in start order
    (prime_values.launch.topology.pipeline_roles names them). `value_trainer`: False for the oracle critic
    (critic.oracle_samples: evaluators, no value trainer)."""
    slots = [RoleSlot("inference", topology.inference_device, w) for w in range(topology.inference_workers)]
    if with_critic and topology.evaluator == "dedicated":
        slots += [RoleSlot("evaluator", topology.evaluator_device, i) for i in range(topology.evaluators)]
    slots += [RoleSlot("orchestrator", "cpu"), RoleSlot("policy_trainer", topology.policy_trainer_device)]
    if with_critic and value_trainer:
        slots.append(RoleSlot("value_trainer", topology.value_trainer_device))
    return slots


def resolve_devices(topology, cuda_count: int) -> None:
    """Replace 'auto' devices in place: one GPU per role in a fixed order while GPUs last, else the CPU (a
    trainer with N processes takes N consecutive GPUs, or the CPU when fewer than N are left)."""
    next_gpu = 0
    for key in DEVICE_KEYS:
        if topology[key] != "auto":
            continue
        if key == "evaluator_device" and topology.evaluator == "colocated":
            topology[key] = "cpu"  # unused: the evaluator is served inside the value trainer
            continue
        need = role_gpus(topology, key.removesuffix("_device"))
        if next_gpu + need <= cuda_count:
            topology[key] = f"cuda:{next_gpu}"
            next_gpu += need
        else:
            topology[key] = "cpu"


@dataclass
class TopologyConfig:
    name: str = "cpu"
    """name of the topology preset (informational)"""
    evaluator: str = choice("dedicated", "dedicated", "colocated")
    """'dedicated': the value evaluator is its own job; 'colocated': it is served inside the value trainer"""
    evaluators: int = free(1, "1..inference_workers: TopologyConfig.check")
    """dedicated evaluator jobs: evaluator k scores the rollouts of inference workers w with w % evaluators == k
    and writes values shard e<k> (at most inference_workers; 1 when colocated)"""
    inference_workers: int = ranged(1, ">= 1")
    """inference jobs, each with its own log shard and slice of the prompt stream"""
    inference_device: str = free("cpu", DEVICE)
    """device of each inference worker: 'cpu', 'cuda:<i>', or 'auto' (a GPU per role while GPUs last, else CPU)"""
    inference_tp: int = free(1, ">= 1, and > 1 only with vLLM: InferenceConfig.check_backend")
    """tensor-parallel ranks of each inference worker (inference=vllm only): that many GPUs, consecutive from
    inference_device (cuda:2 with 2 uses cuda:2 and cuda:3; on SLURM the job asks for that many GPUs)"""
    evaluator_device: str = free("cpu", DEVICE)
    """device of the dedicated value evaluator"""
    policy_trainer_device: str = free("cpu", DEVICE)
    """device of the policy trainer"""
    value_trainer_device: str = free("cpu", DEVICE)
    """device of the value trainer (and of the evaluator when colocated)"""
    threads_per_role: int = ranged(0, ">= 0")
    """torch CPU threads of each role process; 0 = auto: OMP_NUM_THREADS when set, a SLURM step's own CPUs
    (SLURM_CPUS_PER_TASK), else the machine's usable cores split evenly among the run's model processes
    (resolved.cpu_processes), at least 1 each (launch.role_threads): the budgets then sum to the cores the roles
    share wherever there are as many cores as processes (on 2 cores the 4 processes of the embedded run get 1 each)"""
    policy_trainer_threads: int = ranged(0, ">= 0")
    """torch CPU threads of each policy trainer process; 0 = as threads_per_role. Where the policy trainer computes
    nearly all the time and the other roles mostly wait (a real model on a few cores: recipes/smollm.md), it may take
    more than an even share"""
    lend_idle_cores: bool = True
    """with the local launcher, every role on the CPU and the threads left to auto (no OMP_NUM_THREADS,
    threads_per_role and policy_trainer_threads 0) and one policy trainer process: an inference worker lends its
    cores while it waits, and the policy trainer borrows them before each micro-batch, keeping them to the step's
    end (launch/cores.py: never more threads than the cores no other role is computing on). false: the static split
    of threads_per_role"""
    solo_threads_slowdown: float = ranged(3.0, ">= 0")
    """the warm start runs alone with every core's thread (launch.solo_threads), but where other processes share the
    cores one descheduled thread stalls the whole OpenMP team at every barrier; so it times its SFT and critic
    pretraining steps and tries half the threads for 8 steps after each phase's first 8, and again whenever the
    median of its recent steps is this many times the reference (the median at that thread count so far), keeping
    whichever count is faster (below every core it tries more again after 64 steps, after up to 256 while such trials
    lose; monitor.ThreadTuner). 0 = keep every core's thread; a value near 1 takes noise for a slowdown:
    TopologyConfig.check wants 0 or at least 1.5"""
    policy_trainer_procs: int = ranged(1, ">= 1")
    """processes of the policy trainer: > 1 trains with torch.distributed + FSDP2, one process per GPU (GPUs
    consecutive from policy_trainer_device: cuda:2 with 2 processes uses cuda:2 and cuda:3; on SLURM the job
    asks for that many GPUs and tasks), or gloo processes sharing the CPU; rank 0 reads batches and publishes"""
    value_trainer_procs: int = ranged(1, ">= 1")
    """processes of the value trainer, as policy_trainer_procs (> 1 needs evaluator=dedicated)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        topo = cfg.topology
        if topo.evaluators < 1 or topo.evaluators > topo.inference_workers:
            raise ConfigError(f"topology.evaluators={topo.evaluators} must be between 1 and topology.inference_workers="
                              f"{topo.inference_workers} (each evaluator scores the rollouts of its own inference "
                              "workers)")
        if topo.evaluators > 1 and topo.evaluator == "colocated":
            raise ConfigError(f"topology.evaluators={topo.evaluators} needs topology.evaluator=dedicated (a colocated "
                              "evaluator is one scorer inside the value trainer)")
        if 0 < topo.solo_threads_slowdown < 1.5:
            raise ConfigError(f"topology.solo_threads_slowdown={topo.solo_threads_slowdown:g} must be 0 (keep every "
                              "core's thread) or at least 1.5 (a step that many times slower than the first ones; "
                              "closer to 1, noise would change the threads)")
        if topo.value_trainer_procs > 1 and topo.evaluator == "colocated":
            raise ConfigError(f"topology.value_trainer_procs={topo.value_trainer_procs} needs "
                              "topology.evaluator=dedicated (a colocated evaluator scores inside one process)")

    @staticmethod
    def check_devices(cfg, cuda_count: Optional[int], environment: bool) -> None:
        """Every role's device exists on this machine (`cuda_count` GPUs: None = count them when a role asks for
        a GPU), with a GPU per process of a multi-process role."""
        topo = cfg.topology
        if cuda_count is None and os.environ.get("PRIME_VALUES_CUDA_COUNT", "").isdigit():
            cuda_count = int(os.environ["PRIME_VALUES_CUDA_COUNT"])  # compose for another machine (e.g. --cfg job)
        if cuda_count is None and not environment:
            cuda_count = 1 << 16  # composing for another machine (PRIME_VALUES_CUDA_COUNT unset): any device may exist
        if cuda_count is None and any(topo[f"{r}_device"] != "cpu" for r in ROLE_DEVICES):
            import torch  # an all-CPU run never imports torch here (~2.5 s)

            cuda_count = torch.cuda.device_count()
        if cfg.launcher.name == "slurm" or cuda_count is None:
            cuda_count = 1 << 16  # every SLURM job gets its own GPUs (as many as its processes): any index is
            # job-local; or every device is the CPU, and no index is checked
        for role in ROLE_DEVICES:
            _check_device(f"topology.{role}_device", topo[f"{role}_device"], cuda_count)
        for role, key in (("policy_trainer", "policy_trainer_procs"), ("value_trainer", "value_trainer_procs"),
                          ("inference", "inference_tp")):
            device, procs = topo[f"{role}_device"], topo[key]
            if procs > 1 and device.startswith("cuda:") and int(device[5:]) + procs > cuda_count:
                first = int(device[5:])
                raise ConfigError(f"topology.{key}={procs} needs one GPU per process (rank), cuda:{first}..cuda:"
                                  f"{first + procs - 1} from topology.{role}_device={device}, but this machine has "
                                  f"{f'cuda:0..cuda:{cuda_count - 1}' if cuda_count else 'no CUDA device'}; lower "
                                  f"topology.{key} or start from a lower device")


def _check_device(key: str, device: str, cuda_count: int) -> None:
    if device in ("cpu", "auto"):
        return
    if device.startswith("cuda:") and device[5:].isdigit():
        index = int(device[5:])
        if index < cuda_count:
            return
        have = f"cuda:0..cuda:{cuda_count - 1}" if cuda_count else "no CUDA device"
        raise ConfigError(f"{key}={device} asks for a GPU that does not exist (this machine has {have}); "
                          f"use cpu" + (f" or one of cuda:0..cuda:{cuda_count - 1}" if cuda_count else ""))
    raise ConfigError(f"{key}={device!r} is not a device; use 'cpu', 'auto' or 'cuda:<index>'")
