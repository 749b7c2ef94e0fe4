"""`schedule.*`: how far the roles run ahead of each other (asynchronous, or the lockstep PPO schedule)."""

from __future__ import annotations

from dataclasses import dataclass

from prime_values.config.base import ConfigError, choice, ranged


@dataclass
class ScheduleConfig:
    max_off_policy: int = ranged(1, (">= 0", " (0 = on-policy)"))
    """a rollout from policy version v is admitted to batch n only while (n - 1) - v <= this (0 = on-policy);
    inference pauses rather than generate what could never be admitted (lockstep: 0 whatever this says, as the
    run's resolved.max_off_policy records)"""
    mode: str = choice("async", "async", "lockstep")
    """'async': every role runs ahead as far as the data allows; 'lockstep': the synchronous PPO schedule with the
    same roles: batch n is generated only after policy version n - 1 is published (max_off_policy = 0), its
    rollouts are scored only by a critic trained on batch n - 1's targets, then the policy trains on batch n
    (docs/benchmarks.md, "Async vs lockstep")"""
    lockstep_critic_steps: int = ranged(4, ">= 1")
    """lockstep: critic optimizer steps on each batch's targets (minibatches of critic.batch_rollouts) before
    the value trainer publishes the one critic version that scores the next batch"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        w = cfg.critic.warmup
        if cfg.schedule.mode == "lockstep" and (w.min_version > 0 or w.min_explained_variance is not None):
            raise ConfigError("schedule.mode=lockstep with critic.warmup: the lockstep schedule already waits for the "
                              "critic each step; drop critic.warmup.min_version / min_explained_variance, or use "
                              "schedule.mode=async")
