"""`advantage.*`: how the policy's advantages are estimated: the estimator (a name of the registry
prime_values.algo.estimators.ESTIMATORS, or a class of your own named by import path) and the built-in ones' knobs.

Everything the config knows about an estimator it reads from its class (`estimator_class`): whether the run starts
the critic roles (`uses_critic`), and how many rollouts a group or a batch must hold (InferenceConfig.check).
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator

from omegaconf import DictConfig, OmegaConf

from prime_values.algo.estimators import ESTIMATORS, Estimator, missing_members
from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.importpath import import_class, split


def estimator_class(name: str) -> type[Estimator]:
    """The class `advantage.estimator=<name>` names: a name of ESTIMATORS, or an import path `package.module:Class`
    (or `package.module.Class`, as Hydra's _target_ spells one), imported here. A name that names no estimator
    class is a ConfigError saying which part is wrong and how to fix it."""
    if name in ESTIMATORS:
        return ESTIMATORS[name]
    if split(name) is None:
        near = difflib.get_close_matches(name, list(ESTIMATORS), n=1)
        raise ConfigError(f"advantage.estimator={name!r} is not allowed; choose one of {', '.join(ESTIMATORS)}"
                          + (f" (did you mean {near[0]!r}?)" if near else "")
                          + ", or name a class of your own as package.module:Class (docs/extending.md)")
    try:
        cls = import_class(name, f"advantage.estimator={name!r}")
    except ValueError as error:
        raise ConfigError(str(error)) from None
    missing = missing_members(cls)
    if missing:
        raise ConfigError(f"advantage.estimator={name!r} is not an estimator class (it lacks {', '.join(missing)}); "
                          "subclass prime_values.algo.estimators.Estimator (docs/extending.md)")
    return cls


def uses_critic(name: str) -> bool:
    """Whether estimator `name` reads the critic's values, i.e. whether the run starts the critic roles."""
    return bool(estimator_class(name).uses_critic)


class EstimatorNames:
    """The registered estimators whose class passes `test`, as a read-only collection of names. `name in` it
    answers for an import path as well (resolved by `estimator_class`, which raises the ConfigError of a name that
    names no estimator)."""

    def __init__(self, test) -> None:
        self.test = test

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and bool(self.test(estimator_class(name)))

    def __iter__(self) -> Iterator[str]:
        return (name for name, cls in ESTIMATORS.items() if self.test(cls))

    def __repr__(self) -> str:
        return f"EstimatorNames({', '.join(self)})"


CRITIC_ESTIMATORS = EstimatorNames(lambda cls: cls.uses_critic)
"""the estimators that read the critic's values (the others start no critic roles): `name in CRITIC_ESTIMATORS` is
`uses_critic(name)`"""


def estimator_arguments(advantage) -> dict:
    """advantage.estimator_args as plain keywords, checked against the estimator's constructor (its first
    parameter takes the `advantage` section itself); a ConfigError naming the keys and the fix otherwise."""
    cls = estimator_class(advantage.estimator)
    args = advantage.estimator_args
    args = OmegaConf.to_container(args, resolve=True) if isinstance(args, DictConfig) else dict(args or {})
    try:
        inspect.signature(cls).bind(advantage, **args)
    except TypeError as error:
        params = list(inspect.signature(cls).parameters.values())[1:]
        takes = ", ".join(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or "none"
        raise ConfigError(f"advantage.estimator_args={args} does not fit advantage.estimator="
                          f"{advantage.estimator} ({error}); its keyword arguments: {takes}") from None
    return args


def make_estimator(advantage) -> Estimator:
    """The estimator of a config's `advantage` section: its class built with advantage.estimator_args."""
    return estimator_class(advantage.estimator)(advantage, **estimator_arguments(advantage))


@dataclass
class AdvantageConfig:
    estimator: str = free("gae", "a name of prime_values.algo.estimators.ESTIMATORS or an import path, which the "
                                 "checks resolve (estimator_class)")
    """how rewards (and the critic's values) become advantages: a name registered in
    prime_values.algo.estimators.ESTIMATORS (the list, each with its formula, in docs/value_functions.md,
    "Estimators"; the default 'gae' is the pure value advantage from the critic), or a class of your own as
    package.module:Class (docs/extending.md)"""
    estimator_args: Dict[str, Any] = field(default_factory=dict)
    """keyword arguments of an estimator of your own (on the command line +advantage.estimator_args.scale=2.0);
    the registered estimators take none (their knobs are the keys below)"""
    tether_mode: str = choice("group", "group", "running")
    """tether's weight w: 'group' = clamp(R², 0, 1) of the critic on each group's returns (a group whose returns
    do not vary: the running explained variance below); 'running' = clamp(explained variance on the last
    prompts_per_step scored groups, 0, 1); a group of one gets w = 1 (the value baseline) in both"""
    group_baseline: str = choice("mean", "mean", "leave_one_out")
    """the group baseline b_i of tether and linear_mix: 'mean' = the mean reward of rollout i's group,
    'leave_one_out' = the mean reward of the group's other rollouts (a group of one: its own reward); grpo always
    uses the mean"""
    linear_mix_alpha: float = ranged(0.5, "in [0, 1]")
    """linear_mix: the weight α of the group advantage R − b; the value advantage (GAE) gets 1 − α"""
    grpo_std: bool = False
    """grpo: divide the group-centred reward by the group's reward std (+1e-6)"""
    adaptive_alpha: float = ranged(0.0, ">= 0")
    """length-adaptive λ for the policy: λ_policy = clamp(1 − 1/(α·n), 0, 1) per rollout with n policy tokens
    (VAPO); 0 = use lambda_policy for every rollout"""
    gamma: float = ranged(1.0, ("in (0, 1]", " (1 = undiscounted, the default)"))
    """discount per policy token"""
    lambda_policy: float = ranged(1.0, "in [0, 1]")
    """GAE lambda for the policy's advantages"""
    lambda_value: float = ranged(1.0, "in [0, 1]")
    """GAE lambda for the critic's value targets (1 = Monte-Carlo returns, which never go stale in replay)"""
    whiten: bool = False
    """normalise advantages to zero mean, unit std per batch (value targets stay unwhitened)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        """advantage.estimator names an estimator class (registered, or imported from its path) and
        advantage.estimator_args fit its constructor."""
        estimator_arguments(cfg.advantage)
