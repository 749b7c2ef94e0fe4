"""`wandb.*`: forwarding every role's metrics to Weights & Biases (prime_values/wandb_sink.py)."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Optional

from prime_values.config.base import ConfigError, check_fields, choice, ranged

WANDB_MODES = ("disabled", "offline", "online")


@dataclass
class WandbConfig:
    """Weights & Biases: the conductor forwards every role's metrics (`metrics/<role>.jsonl`) to one W&B run per
    experiment, keys prefixed by role (`policy_trainer/loss`), x-axis `policy_step` (prime_values/wandb_sink.py)."""

    mode: str = choice("disabled", *WANDB_MODES)
    """'disabled', 'offline' (files under <run>/wandb/; upload later with `wandb sync`) or 'online' (falls back
    to offline, with one log line, when there is no API key: WANDB_API_KEY or `wandb login`); offline and
    online need the wandb extra: pip install 'prime_values[wandb]'"""
    project: str = "prime_values"
    """W&B project"""
    entity: Optional[str] = None
    """W&B entity (user or team; null = your default entity)"""
    group: Optional[str] = None
    """W&B group (null = in a Hydra multirun the sweep directory's name, so a sweep's points group together;
    none for a single run)"""
    name: Optional[str] = None
    """W&B run name (null = the sweep point's overrides in a multirun, else the run directory's name)"""
    tags: list = field(default_factory=list)
    """W&B tags, e.g. [arith, baseline]"""
    poll_s: float = ranged(5.0, "> 0")
    """seconds between forwarding rounds (the last metrics are forwarded when the run ends)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        mode = cfg.wandb.mode
        if mode != "disabled" and importlib.util.find_spec("wandb") is None:
            raise ConfigError(f"wandb.mode={mode} needs the wandb package: pip install 'prime_values[wandb]' (or "
                              "pip install -e '.[wandb]' in a checkout), or set wandb.mode=disabled")


def check_wandb(cfg) -> None:
    """Before launch: `wandb.*` keeps its rules and, if mode is not `disabled`, wandb is installed (the forwarder:
    prime_values/wandb_sink.py). Raises ConfigError with one line saying what to do."""
    check_fields(cfg.wandb, WandbConfig, "wandb.")
    WandbConfig.check(cfg, environment=True)
