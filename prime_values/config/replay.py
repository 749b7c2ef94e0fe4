"""`replay.*`: the critic's replay buffer."""

from __future__ import annotations

from dataclasses import dataclass

from prime_values.config.advantage import CRITIC_ESTIMATORS
from prime_values.config.base import ConfigError, choice, ranged


@dataclass
class ReplayConfig:
    name: str = "uniform"
    """name of the replay preset (informational)"""
    queue_size: int = ranged(4096, ">= 1")
    """bounded ingest queue between the log and the buffer; when full the oldest rollout is dropped (counted)"""
    capacity: int = ranged(2048, ">= 1")
    """replay buffer capacity in rollouts; the oldest is evicted first"""
    sampling: str = choice("uniform", "uniform", "fifo", "recent")
    """how critic batches are drawn from the buffer: 'uniform' (random, without replacement within a batch),
    'fifo' (passes from oldest to newest) or 'recent' (weight 2^(-rank/recent_half_life), rank 0 = newest)"""
    recent_half_life: float = ranged(256.0, ">= 0")
    """'recent' sampling: rollouts this many insertions old weigh half as much as the newest (0 = newest first)"""
    max_reuse: int = ranged(4, ">= 0")
    """a rollout leaves the buffer after this many samplings (0 = unlimited)"""
    max_age: int = ranged(0, ">= 0")
    """a rollout more than this many policy versions behind the newest seen leaves the buffer (0 = unlimited)"""
    min_rollouts: int = ranged(128, ">= 1")
    """rollouts in the buffer before the first critic step"""
    ratio: float = ranged(1.0, ">= 0")
    """replay ratio: critic rollouts trained per new rollout ingested (schedule.mode=async). A critic step of
    critic.batch_rollouts runs only while the rollouts trained so far, with it, stay within ratio x the rollouts
    ingested since the value trainer started, so the critic takes ratio x inference.prompts_per_step x
    group_size / batch_rollouts steps per policy step and waits otherwise (the cores go to the roles on the
    policy's path). 0 = unbounded: a step whenever the buffer holds replay.min_rollouts"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        replay = cfg.replay
        if replay.min_rollouts > replay.capacity:
            raise ConfigError(f"replay.min_rollouts={replay.min_rollouts} exceeds replay.capacity="
                              f"{replay.capacity}; the critic would never start training")
        if cfg.advantage.estimator in CRITIC_ESTIMATORS and replay.capacity < cfg.critic.batch_rollouts:
            raise ConfigError(f"replay.capacity={replay.capacity} is smaller than one critic batch "
                              f"(critic.batch_rollouts={cfg.critic.batch_rollouts}); raise replay.capacity or lower "
                              "critic.batch_rollouts")
