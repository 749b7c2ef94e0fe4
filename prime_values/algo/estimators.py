"""Advantage estimators: the `Estimator` protocol, the registry `ESTIMATORS` and the built-in estimators.

An estimator is the whole of one rule for the policy's advantages. The orchestrator asks it two things: `score`,
one complete group of rollouts (rewards, policy masks, group ids, and the critic's values when it uses a critic)
-> per-token advantages and, with a critic, the critic's value targets; and `finish_batch`, the advantages of a
whole policy batch once all its groups are scored (the batch baselines subtract a statistic of the batch there).
Its class attributes tell the config what it needs: a critic (`uses_critic`: the run starts the critic roles),
the critic's running explained variance (`uses_critic_ev`), and how many rollouts a group or a batch must hold.

`ESTIMATORS` maps each name `advantage.estimator=<name>` accepts to its class, in registration order;
`@register("<name>")` adds one. A class of your own needs no registration and no edit of this package:
`advantage.estimator=package.module:Class` names it by import path (prime_values/config/advantage.py resolves it;
docs/extending.md). The formulas live in `prime_values.algo.gae` with their hand-worked tests; the classes here
only choose and combine them.

The config reads this registry before any job starts, on a machine that may never import torch, so this module
imports torch only when a group is scored (inside `score`, through `prime_values.algo.gae`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

if TYPE_CHECKING:
    from torch import Tensor


@dataclass
class Group:
    """One complete group: the G rollouts of one prompt, right-padded to T tokens (the conventions of algo/gae.py)."""

    rewards: Tensor
    """[G] the verifier's reward of each rollout"""
    policy_mask: Tensor
    """[G, T] bool: the tokens that get an advantage (the policy's own tokens; with a critic, those it valued)"""
    group_ids: Tensor
    """[G] which prompt each rollout answers"""
    values: Tensor | None = None
    """[G, T] the critic's V(s_t) at the policy tokens, anything elsewhere (uses_critic; None otherwise)"""
    bootstrap: Tensor | None = None
    """[G] V(s_cut) of a rollout the critic's context cut (read only where `cut`; uses_critic)"""
    cut: Tensor | None = None
    """[G] bool: the critic's context cut the rollout, so GAE bootstraps with V(s_cut) (uses_critic)"""
    critic_ev: float = math.nan
    """the critic's explained variance on the groups scored just before this one (uses_critic_ev; nan: none yet)"""


@dataclass
class Scores:
    """What `Estimator.score` returns for one group."""

    advantages: Tensor
    """[G, T] the policy's advantage at each token, 0 off the policy mask"""
    targets: Tensor | None = None
    """[G, T] the critic's value targets, 0 off the policy mask (an estimator that uses the critic must give them:
    `value_targets` computes the usual ones; None without a critic)"""
    stats: dict[str, Tensor] = field(default_factory=dict)
    """per-rollout figures [G] worth logging: the orchestrator logs `<name>_mean` over each policy batch"""


class Estimator(Protocol):
    """What the orchestrator asks of an advantage estimator. Subclass it to inherit the defaults below; a class
    that does not must define every member itself.

    The orchestrator builds one per run as ``Class(settings, **advantage.estimator_args)``: ``settings`` is the
    config's ``advantage`` section (gamma, lambda_policy, lambda_value, adaptive_alpha and the built-in
    estimators' knobs), the keywords an estimator of your own's (the built-in ones take none).
    """

    uses_critic: ClassVar[bool] = False
    """reads the critic's values (`Group.values`, `bootstrap`, `cut`) and returns value targets; the run starts the
    critic roles (evaluator, value trainer) only for such an estimator"""
    uses_critic_ev: ClassVar[bool] = False
    """reads `Group.critic_ev` (the orchestrator computes it only for such an estimator: one pass over the last
    prompts_per_step scored groups for every group)"""
    min_group_size: ClassVar[int] = 1
    """the fewest rollouts per prompt (inference.group_size) it can work with: 2 for a group mean, whose mean over
    one rollout is the rollout's own reward"""
    min_batch_size: ClassVar[int] = 1
    """the fewest rollouts per policy batch (prompts_per_step x group_size) it can work with: 2 for a batch mean"""

    def __init__(self, settings: Any) -> None:
        self.settings = settings

    def score(self, group: Group) -> Scores:
        """Advantages [G, T] (and, with a critic, value targets [G, T]) of one complete group."""
        ...

    def finish_batch(self, rewards: Tensor, advantages: Tensor, policy_mask: Tensor) -> Tensor:
        """The advantages of one policy batch once all its groups are scored: rewards [B], advantages [B, T] (the
        groups' `score`, right-padded), policy_mask [B, T] -> [B, T]. By default the scored ones, unchanged."""
        return advantages


MEMBERS = ("uses_critic", "uses_critic_ev", "min_group_size", "min_batch_size", "score", "finish_batch")
"""the members of `Estimator` the orchestrator and the config use"""


def missing_members(cls: Any) -> list[str]:
    """The members of `Estimator` that `cls` lacks (every one when it is not a class)."""
    if not isinstance(cls, type):
        return list(MEMBERS)
    return [name for name in MEMBERS if not hasattr(cls, name)]


ESTIMATORS: dict[str, type[Estimator]] = {}
"""Every built-in estimator by its name in `advantage.estimator`, in registration order."""


def register(name: str) -> Callable[[type], type]:
    """Class decorator: add the class to ESTIMATORS as `name` (a plain identifier; one class per name)."""
    if not name.isidentifier():
        raise ValueError(f"an estimator's name is a plain identifier (a dotted or ':' name is an import path), "
                         f"got {name!r}")

    def add(cls: type) -> type:
        if ESTIMATORS.get(name, cls) is not cls:
            raise ValueError(f"estimator {name!r} is registered already ({ESTIMATORS[name].__qualname__}); choose "
                             "another name")
        missing = missing_members(cls)
        if missing:
            raise ValueError(f"{cls.__qualname__} is not an Estimator: it lacks {', '.join(missing)}")
        ESTIMATORS[name] = cls
        return cls

    return add


# What the estimators share: λ_policy, and the critic's targets.

def policy_lambda(settings: Any, policy_mask: Tensor) -> float | Tensor:
    """λ of the policy's GAE: advantage.lambda_policy, or per rollout with n policy tokens the length-adaptive
    clamp(1 − 1/(α·n), 0, 1) when advantage.adaptive_alpha = α > 0 (VAPO; `algo.gae.adaptive_lambda`)."""
    if settings.adaptive_alpha > 0:
        from prime_values.algo.gae import adaptive_lambda

        return adaptive_lambda(policy_mask.sum(dim=1), settings.adaptive_alpha)
    return settings.lambda_policy


def value_targets(settings: Any, group: Group) -> Tensor:
    """The critic's value targets, whatever the policy's estimator: the λ-returns G_t = GAE(λ_value).advantages +
    V(s_t) of the critic's own values (docs/design.md §3.1; with γ = λ_value = 1 the reward R at every policy token
    of a rollout the critic saw whole)."""
    from prime_values.algo.gae import gae

    _, returns = gae(group.rewards, group.values, group.policy_mask, settings.gamma, settings.lambda_value,
                     group.bootstrap, group.cut)
    return returns


# The built-in estimators, in the order the config lists them.

@register("gae")
class Gae(Estimator):
    """The pure value advantage (docs/design.md §3.1): GAE with λ_policy over policy tokens, with the critic's values

        δ_k = r_k + γ·V(p_{k+1}) − V(p_k),   A_k = δ_k + γλ·A_{k+1}      (`algo.gae.gae`, tests/algo/test_gae.py)
    """

    uses_critic = True

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import gae

        lam = policy_lambda(self.settings, group.policy_mask)
        advantages, _ = gae(group.rewards, group.values, group.policy_mask, self.settings.gamma, lam,
                            group.bootstrap, group.cut)
        return Scores(advantages, value_targets(self.settings, group))


@register("grpo")
class Grpo(Estimator):
    """The group-mean baseline, no critic: A_i = R_i − mean_g(R) on every policy token, divided by the group's
    reward std (+1e-6) with advantage.grpo_std (`algo.gae.grpo_advantages`)."""

    min_group_size = 2

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import grpo_advantages

        return Scores(grpo_advantages(group.rewards, group.group_ids, group.policy_mask,
                                      normalize_std=self.settings.grpo_std))


@register("tether")
class Tether(Estimator):
    """A baseline blended between the group's baseline b and the critic by how accurate the critic is:
    Ṽ_t = w·V(s_t) + (1 − w)·b, then GAE with Ṽ; w per advantage.tether_mode, b per advantage.group_baseline
    (`algo.gae.tether_advantages`). Logs each rollout's w as `tether_weight`."""

    uses_critic = True
    uses_critic_ev = True

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import tether_advantages

        s = self.settings
        advantages, weight = tether_advantages(
            group.rewards, group.values, group.group_ids, group.policy_mask, mode=s.tether_mode,
            critic_ev=group.critic_ev, gamma=s.gamma, lam=policy_lambda(s, group.policy_mask),
            bootstrap=group.bootstrap, cut=group.cut, leave_one_out=s.group_baseline == "leave_one_out")
        return Scores(advantages, value_targets(s, group), {"tether_weight": weight})


@register("linear_mix")
class LinearMix(Estimator):
    """A fixed convex blend of the group advantage and the value advantage, α = advantage.linear_mix_alpha:

        A_t = α·(R_i − b_i) + (1 − α)·GAE_t      b_i per advantage.group_baseline  (`algo.gae.linear_mix_advantages`)

    A group of one would leave only (1 − α)·GAE: it needs groups of two or more (use gae at G = 1)."""

    uses_critic = True
    min_group_size = 2

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import linear_mix_advantages

        s = self.settings
        advantages = linear_mix_advantages(
            group.rewards, group.values, group.group_ids, group.policy_mask, alpha=s.linear_mix_alpha,
            gamma=s.gamma, lam=policy_lambda(s, group.policy_mask), bootstrap=group.bootstrap, cut=group.cut,
            leave_one_out=s.group_baseline == "leave_one_out")
        return Scores(advantages, value_targets(s, group))


@register("batch_mean")
class BatchMean(Estimator):
    """A control without a critic, at any group size: A_i = R_i − (1/B)·Σ_j R_j over the B rollouts of the policy
    batch (`algo.gae.batch_mean_advantages`). Each group is scored R_i (REINFORCE); the batch subtracts its mean."""

    min_batch_size = 2

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import per_token

        return Scores(per_token(group.rewards, group.policy_mask))

    def finish_batch(self, rewards: Tensor, advantages: Tensor, policy_mask: Tensor) -> Tensor:
        from prime_values.algo.gae import batch_mean_advantages

        return batch_mean_advantages(rewards, policy_mask)


@register("batch_loo")
class BatchLeaveOneOut(BatchMean):
    """A control without a critic, at any group size: A_i = R_i − (1/(B−1))·Σ_{j≠i} R_j, the mean reward of the
    batch's other rollouts (`algo.gae.batch_mean_advantages`, leave-one-out)."""

    def finish_batch(self, rewards: Tensor, advantages: Tensor, policy_mask: Tensor) -> Tensor:
        from prime_values.algo.gae import batch_mean_advantages

        return batch_mean_advantages(rewards, policy_mask, leave_one_out=True)


@register("reinforce")
class Reinforce(Estimator):
    """A control without a critic or a baseline: A_i = R_i on every policy token (REINFORCE)."""

    def score(self, group: Group) -> Scores:
        from prime_values.algo.gae import per_token

        return Scores(per_token(group.rewards, group.policy_mask))
