"""`resolved.*`: facts derived from other keys, resolved once when the run is prepared (`resolve`: the conductor,
before it saves the run's config.yaml) and read from there by the roles and tools, so no call site derives them
again (`fact`: the saved one, else derived). `load_saved` derives them for a run saved before they existed."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING, OmegaConf

from prime_values.config.advantage import CRITIC_ESTIMATORS
from prime_values.config.critic import trains_critic
from prime_values.config.topology import pipeline_slots, role_procs


@dataclass
class Resolved:
    """Derived when the run is prepared and saved with it (a value given on the command line is replaced)."""

    uses_critic: bool = MISSING
    """the run has a critic (value trainer, evaluators, critic warm start): advantage.estimator is one whose
    class says `uses_critic` (prime_values/algo/estimators.py: gae, tether, linear_mix, or a user's own)"""
    lockstep: bool = MISSING
    """the lockstep schedule runs: schedule.mode == 'lockstep'"""
    max_off_policy: int = MISSING
    """the staleness bound the run enforces: 0 under lockstep, else schedule.max_off_policy"""
    cpu_processes: int = MISSING
    """the rl stage's processes that compute on the CPU (inference workers, evaluators, trainer ranks; not the
    orchestrator): what topology.threads_per_role=0 splits the machine's cores among"""


def derive(cfg) -> dict:
    """The `resolved` section of `cfg` (every fact from the keys it is derived from)."""
    lockstep = cfg.schedule.mode == "lockstep"
    uses_critic = cfg.advantage.estimator in CRITIC_ESTIMATORS
    slots = pipeline_slots(cfg.topology, uses_critic, trains_critic(cfg))
    cpu = sum(role_procs(cfg.topology, slot.role) for slot in slots
              if slot.role != "orchestrator" and not str(slot.device).startswith("cuda"))
    return {"uses_critic": uses_critic, "lockstep": lockstep,
            "max_off_policy": 0 if lockstep else int(cfg.schedule.max_off_policy), "cpu_processes": cpu}


def _saved(cfg, key: str) -> bool:
    resolved = cfg.get("resolved") if hasattr(cfg, "get") else None
    return resolved is not None and key in resolved and not OmegaConf.is_missing(resolved, key)


def fact(cfg, key: str):
    """resolved.`key` of a prepared (or saved) config, else derived from the keys now (validation runs before the
    facts are resolved): the one read of a fact that works on both."""
    return cfg.resolved[key] if _saved(cfg, key) else derive(cfg)[key]


def resolve(cfg, only_missing: bool = False):
    """Write `derive(cfg)` into cfg.resolved (`only_missing`: keep the facts a saved config already has; derive
    nothing when it has them all)."""
    if only_missing and "resolved" in cfg:
        missing = [k for k in Resolved.__dataclass_fields__ if not _saved(cfg, k)]
        if missing:
            facts = derive(cfg)
            for key in missing:
                cfg.resolved[key] = facts[key]
        return cfg
    cfg.resolved = derive(cfg)
    return cfg
