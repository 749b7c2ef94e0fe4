"""The orchestrator's scoring as it was before the estimator registry (prime_values/roles/orchestrator.py at commit
5e31f64, with algo.gae's batch_baseline_advantages of that commit), frozen: groups as nested dicts, one branch per
estimator. tests/algo/test_estimators.py checks that the registry's estimators give the same advantages, value targets,
batch rows and metrics, bit for bit."""

from __future__ import annotations

import math
import time
from collections import deque

import torch

from prime_values.algo.ev import ev_sums
from prime_values.algo.gae import (
    adaptive_lambda,
    advantages_and_targets,
    explained_variance,
    group_mean_baseline,
    grpo_advantages,
    tether_advantages,
    whiten,
)
from prime_values.critic_io import padded

BATCH_BASELINES = ("batch_mean", "batch_loo", "reinforce")


def batch_baseline_advantages(rewards, policy_mask, baseline: str):
    assert baseline in BATCH_BASELINES, f"baseline {baseline!r} is not one of {BATCH_BASELINES}"
    if baseline == "reinforce":
        advantage = rewards
    else:
        one_group = torch.zeros(rewards.shape, dtype=torch.long, device=rewards.device)
        advantage = rewards - group_mean_baseline(rewards, one_group, leave_one_out=baseline == "batch_loo")
    mask = policy_mask.bool()
    per_token = advantage[:, None].expand(mask.shape)
    return torch.where(mask, per_token, torch.zeros_like(per_token))


def score_group(rollouts: list[dict], values: list[dict] | None, cfg, critic_ev: float | None = None
                ) -> dict[str, torch.Tensor]:
    """Per-token advantages [G, T] and value targets [G, T] of one complete group (docs/design.md §3).

    `critic_ev`: the critic's recent explained variance, used by advantage=tether: the weight of every group with
    tether_mode=running, of a group whose returns do not vary with tether_mode=group (None: weight 0 there)."""
    adv_cfg = cfg.advantage
    mask = padded(rollouts, "policy_mask", torch.bool)
    rewards = torch.tensor([r["reward"] for r in rollouts], dtype=torch.float32)
    group_ids = torch.zeros(len(rollouts), dtype=torch.long)  # one group per call
    if values is None and adv_cfg.estimator in BATCH_BASELINES:  # the baseline needs the whole batch: `baselined`
        return {"advantages": batch_baseline_advantages(rewards, mask, "reinforce"), "targets": None, "values": None,
                "mask": mask}
    if values is None:  # grpo: the group mean is the baseline, no critic involved
        advantages = grpo_advantages(rewards, group_ids, mask, normalize_std=adv_cfg.grpo_std)
        return {"advantages": advantages, "targets": None, "values": None, "mask": mask}
    v = padded(values, "values", torch.float32, length=mask.shape[1])
    # a trace the critic's context cut: GAE runs over the tokens it saw and bootstraps with V(s_cut); the
    # tokens after the cut get no advantage (no value exists for them). A generation cap is never a cut.
    cut = torch.tensor([bool(x["cut"]) for x in values])
    valued = torch.tensor([x["valued_tokens"] for x in values])
    mask = mask & (torch.arange(mask.shape[1])[None, :] < valued[:, None])
    ends = {"bootstrap": torch.tensor([x["bootstrap_value"] for x in values], dtype=torch.float32), "cut": cut}
    lambda_policy = adaptive_lambda(mask.sum(dim=1), adv_cfg.adaptive_alpha) if adv_cfg.adaptive_alpha > 0 \
        else adv_cfg.lambda_policy
    advantages, targets = advantages_and_targets(rewards, v, mask, gamma=adv_cfg.gamma, lambda_policy=lambda_policy,
                                                 lambda_value=adv_cfg.lambda_value, **ends)
    scored = {"advantages": advantages, "targets": targets, "values": v, "mask": mask}
    if adv_cfg.estimator == "tether":
        scored["advantages"], weight = tether_advantages(rewards, v, group_ids, mask, mode=adv_cfg.tether_mode,
                                                         critic_ev=critic_ev, gamma=adv_cfg.gamma, lam=lambda_policy,
                                                         **ends)
        scored["tether_weight"] = weight
    return scored


def score_groups(complete: list[tuple[list[dict], list[dict] | None]], cfg, recent: deque):
    """Score complete groups in order, yielding {"rollouts", "values", "scored"} each; a group with values joins
    `recent` (the critic's latest scored groups) after it is scored. advantage=tether gets the critic's explained
    variance on `recent` as it was before the group: the weight of every group with tether_mode=running, and with
    tether_mode=group the weight of a group whose returns do not vary (docs/value_functions.md, "Estimators")."""
    tether = cfg.advantage.estimator == "tether"
    for group_rollouts, group_values in complete:
        # nothing scored yet: undefined (nan), which tether reads as weight 0 (the group mean)
        critic_ev = (recent_explained_variance(recent) if recent else math.nan) if tether else None
        group = {"rollouts": group_rollouts, "values": group_values,
                 "scored": score_group(group_rollouts, group_values, cfg, critic_ev)}
        if group_values is not None:
            recent.append(group)
        yield group


def baselined(groups: list[dict], estimator: str) -> list[dict]:
    """The groups of one policy batch with a batch-wide baseline (advantage=batch_mean / batch_loo / reinforce)
    replacing their raw-reward advantages; the groups of any other estimator unchanged."""
    if estimator not in BATCH_BASELINES:
        return groups
    rewards = torch.tensor([r["reward"] for g in groups for r in g["rollouts"]], dtype=torch.float32)
    advantages = batch_baseline_advantages(rewards, _cat(groups, "mask"), estimator)
    out, b = [], 0
    for g in groups:
        n, width = len(g["rollouts"]), g["scored"]["mask"].shape[1]
        out.append({**g, "scored": {**g["scored"], "advantages": advantages[b: b + n, :width]}})
        b += n
    return out


def target_rows(rollouts, values, scored) -> list[dict]:
    now = time.time()
    return [{
        "rollout_id": r["rollout_id"], "group_id": r["group_id"], "policy_version": r["policy_version"],
        "critic_version": v["critic_version"], "token_ids": r["token_ids"], "policy_mask": r["policy_mask"],
        "privileged": r["privileged"], "reward": r["reward"], "values": v["values"],
        "value_targets": scored["targets"][b, : len(r["token_ids"])].tolist(), "token_digest": v["token_digest"],
        "created_at": now, "images": r.get("images") or [],  # schema 4: the rollout's images (none here)
    } for b, (r, v) in enumerate(zip(rollouts, values))]


def batch_rows(step: int, groups: list[dict], whiten_advantages: bool) -> list[dict]:
    """The rows of batch `step`: every rollout of the admitted groups with its advantages."""
    rollouts = [r for g in groups for r in g["rollouts"]]
    length = max(len(r["token_ids"]) for r in rollouts)
    advantages = torch.zeros((len(rollouts), length))
    mask = torch.zeros((len(rollouts), length), dtype=torch.bool)
    b = 0
    for g in groups:
        a, m = g["scored"]["advantages"], g["scored"]["mask"]
        advantages[b: b + len(a), : a.shape[1]] = a
        mask[b: b + len(a), : m.shape[1]] = m
        b += len(a)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    with_critic = groups[0]["values"] is not None
    critic_versions = [v["critic_version"] for g in groups for v in g["values"]] if with_critic \
        else [-1] * len(rollouts)
    return [{
        "step": step, "rollout_id": r["rollout_id"], "policy_version": r["policy_version"],
        "critic_version": critic_versions[b], "token_ids": r["token_ids"], "policy_mask": r["policy_mask"],
        "sampling_logprobs": r["sampling_logprobs"], "advantages": advantages[b, : len(r["token_ids"])].tolist(),
        "reward": r["reward"], "images": r.get("images") or [],  # schema 4
    } for b, r in enumerate(rollouts)]


def _cat(groups: list[dict], key: str) -> torch.Tensor:
    """One scored field of several groups, right-padded to a common width: [sum G, T]."""
    width = max(g["scored"]["mask"].shape[1] for g in groups)
    return torch.cat([torch.nn.functional.pad(g["scored"][key], (0, width - g["scored"][key].shape[1]))
                      for g in groups])


def recent_explained_variance(recent: deque) -> float:
    """The critic's explained variance on the last scored groups (values at scoring time vs their targets)."""
    groups = list(recent)
    return explained_variance(_cat(groups, "values"), _cat(groups, "targets"), _cat(groups, "mask"))


def batch_metrics(step: int, groups: list[dict], newest_critic: int | None = None,
                  provenance=None) -> dict:
    """Policy-side and critic-health figures of one batch (docs/design.md §3): reward, off-policy lag, advantage
    statistics, and, with a critic, explained variance on fresh rollouts, mean value vs mean return at the
    first policy token, and how many critic versions behind the newest the values were scored."""
    rewards = [r["reward"] for g in groups for r in g["rollouts"]]
    versions = [r["policy_version"] for g in groups for r in g["rollouts"]]
    mask, advantages = _cat(groups, "mask"), _cat(groups, "advantages")
    a = advantages[mask]
    out = {"step": step, "reward_mean": sum(rewards) / len(rewards),
           "off_policy_mean": sum((step - 1) - v for v in versions) / len(versions),
           "off_policy_max": max((step - 1) - v for v in versions),
           "advantage_mean": a.mean().item(), "advantage_std": a.std().item() if a.numel() > 1 else 0.0,
           "advantage_abs_mean": a.abs().mean().item(), "advantage_positive": (a > 0).float().mean().item()}
    sized = [[r["reward"] for r in g["rollouts"]] for g in groups if len(g["rollouts"]) > 1]
    if sized:  # groups whose rewards are all equal: a group-mean baseline gives them advantage 0
        out["groups_equal_reward"] = sum(max(r) == min(r) for r in sized) / len(sized)
    if groups[0]["values"] is not None:
        values, targets = _cat(groups, "values"), _cat(groups, "targets")
        first = mask.float().argmax(dim=1)  # the first policy token of each rollout
        rows = torch.arange(len(first))
        # values were predicted before the critic trained on these rollouts: a fresh-data measurement
        out["critic_explained_variance"] = explained_variance(values, targets, mask)
        out["critic_ev_sums"] = ev_sums(values, targets, mask)  # pooled over the run's last batches in the report
        out["value_first_mean"] = values[rows, first].mean().item()
        out["return_first_mean"] = targets[rows, first].mean().item()
        if "tether_weight" in groups[0]["scored"]:
            out["tether_weight_mean"] = torch.cat([g["scored"]["tether_weight"] for g in groups]).mean().item()
        critic_versions = [v["critic_version"] for g in groups for v in g["values"]]
        out["critic_version_mean"] = sum(critic_versions) / len(critic_versions)
        if newest_critic is not None:
            lags = [newest_critic - v for v in critic_versions]
            out["critic_version_lag_mean"], out["critic_version_lag_max"] = sum(lags) / len(lags), max(lags)
        seen = [provenance.trained_on(v) for v in critic_versions] if provenance else []
        stale = [(step - 1) - s for s in seen if s is not None]
        if stale:  # policy versions between what the critic had trained on and the policy being updated
            out["value_staleness_mean"], out["value_staleness_max"] = sum(stale) / len(stale), max(stale)
    return out
