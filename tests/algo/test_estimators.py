"""The estimator registry (prime_values/algo/estimators.py): every built-in estimator gives the orchestrator's old
numbers bit for bit, linear_mix and tether's leave-one-out group baseline on hand-worked numbers, and an estimator
of one's own named by import path: resolved, checked, and run by a whole pipeline without editing the package."""

from __future__ import annotations

import math
import os
import re
from collections import deque
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from prime_values.algo.estimators import ESTIMATORS, Estimator, Group, Scores, missing_members, register
from prime_values.algo.gae import gae, grpo_advantages, linear_mix_advantages, tether_advantages
from prime_values.config import CHECKS, Config, ConfigError
from prime_values.config.advantage import (
    CRITIC_ESTIMATORS,
    AdvantageConfig,
    estimator_class,
    make_estimator,
    uses_critic,
)
from prime_values.config.derived import derive
from prime_values.roles.orchestrator import (
    batch_metrics,
    batch_rows,
    finish_batch,
    score_group,
    score_groups,
    target_rows,
)
from tests import log_rows, reference_scoring

REPO = Path(__file__).resolve().parents[2]


# The registry is the one list of estimators: the config's groups, its facts and the docs follow it.

def test_every_registered_estimator_has_its_config_group_and_nothing_else_does():
    groups = {p.stem: OmegaConf.load(p).estimator for p in (REPO / "prime_values/conf/advantage").glob("*.yaml")}
    assert set(groups) == set(ESTIMATORS) and all(name == estimator for name, estimator in groups.items())
    assert all(not missing_members(cls) for cls in ESTIMATORS.values())


def test_the_critic_facts_come_from_the_classes():
    assert list(CRITIC_ESTIMATORS) == [n for n, cls in ESTIMATORS.items() if cls.uses_critic]
    assert list(CRITIC_ESTIMATORS) == ["gae", "tether", "linear_mix"]
    cfg = OmegaConf.structured(Config)
    for name in ESTIMATORS:
        cfg.advantage.estimator = name
        assert derive(cfg)["uses_critic"] is uses_critic(name) is (name in CRITIC_ESTIMATORS)


def test_value_functions_doc_lists_every_estimator_with_its_critic():
    """docs/value_functions.md, "Estimators": one table row per registered estimator, `| name | critic |`."""
    text = (REPO / "docs" / "value_functions.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (yes|no) \|", text, flags=re.M))
    assert rows == {name: "yes" if cls.uses_critic else "no" for name, cls in ESTIMATORS.items()}


def test_register_refuses_a_taken_name_a_path_like_name_and_a_class_that_is_no_estimator():
    with pytest.raises(ValueError, match="'gae' is registered already"):
        register("gae")(type("Other", (Estimator,), {}))
    with pytest.raises(ValueError, match="plain identifier"):
        register("my.gae")
    with pytest.raises(ValueError, match="lacks uses_critic, uses_critic_ev, min_group_size, min_batch_size, score"):
        register("nothing")(type("Nothing", (), {}))
    assert "nothing" not in ESTIMATORS


# Bit for bit: the registry path (score_groups -> finish_batch -> batch_rows / target_rows / batch_metrics) against
# the orchestrator's scoring before the registry (tests/reference_scoring.py), on random groups: prompts and replies
# of random lengths, rewards in [0, 1] and {0, 1} (a group of equal rewards among them), traces the critic cut.

def random_groups(seed: int, size: int, critic: bool, n_groups: int = 6):
    g = torch.Generator().manual_seed(seed)
    complete = []
    for k in range(n_groups):
        rollouts, values = [], []
        for i in range(size):
            prompt, reply = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 7, (1,), generator=g))
            n = prompt + reply
            reward = 1.0 if k == 1 else float(torch.randint(0, 2, (1,), generator=g)) if k % 2 else \
                float(torch.rand((), generator=g))
            rid = f"w{k % 2}-{k:06d}-{i:04d}"
            rollouts.append(log_rows.row(
                "rollouts", rollout_id=rid, group_id=f"g{k}", shard=f"w{k % 2}", policy_version=k // 2, reward=reward,
                token_ids=list(range(5, 5 + n)), policy_mask=[0] * prompt + [1] * reply,
                sampling_logprobs=[0.0] * prompt + [-0.5] * reply))
            cut = reply > 1 and bool(torch.rand((), generator=g) < 0.3)
            values.append(log_rows.row(
                "values", rollout_id=rid, critic_version=k, values=torch.randn(n, generator=g).tolist(), cut=cut,
                valued_tokens=n - int(torch.randint(1, reply, (1,), generator=g)) if cut else n,
                bootstrap_value=float(torch.randn((), generator=g)) if cut else 0.0))
        complete.append((rollouts, values if critic else None))
    return complete


def same(a, b) -> bool:
    """Equal, nan equal to nan (an undefined explained variance)."""
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return isinstance(b, float) and math.isnan(b)
    return a == b


SETTINGS = [
    ("gae", {}), ("gae", {"gamma": 0.9, "lambda_policy": 0.7, "lambda_value": 0.8}), ("gae", {"adaptive_alpha": 0.5}),
    ("tether", {}), ("tether", {"tether_mode": "running"}),
    ("tether", {"gamma": 0.95, "lambda_policy": 0.6, "lambda_value": 0.9, "adaptive_alpha": 0.3}),
    ("grpo", {}), ("grpo", {"grpo_std": True}),
    ("batch_mean", {}), ("batch_loo", {}), ("reinforce", {}), ("batch_loo", {"whiten": True}),
]


# every setting at groups of 1 and 3, but grpo at 3 only: it needs groups of two or more (a config error)
CASES = [(e, s, size) for e, s in SETTINGS for size in (1, 3) if not (e == "grpo" and size == 1)]


@pytest.mark.parametrize("estimator, settings, size", CASES,
                         ids=[f"{e}-{'-'.join(s) or 'default'}-{size}" for e, s, size in CASES])
def test_the_registry_gives_the_old_advantages_targets_rows_and_metrics_bit_for_bit(estimator, settings, size):
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator = estimator
    for key, value in settings.items():
        cfg.advantage[key] = value
    scorer = make_estimator(cfg.advantage)
    complete = random_groups(seed=len(settings) + size, size=size, critic=scorer.uses_critic)
    old = list(reference_scoring.score_groups(complete, cfg, deque(maxlen=4)))
    new = list(score_groups(complete, scorer, deque(maxlen=4)))
    for before, now in zip(old, new, strict=True):
        scored = before["scored"]
        assert torch.equal(scored["mask"], now.mask) and torch.equal(scored["advantages"], now.advantages)
        assert (scored["targets"] is None and now.targets is None) or torch.equal(scored["targets"], now.targets)
        assert ("tether_weight" in scored) == ("tether_weight" in now.stats)
        assert "tether_weight" not in scored or torch.equal(scored["tether_weight"], now.stats["tether_weight"])
        if now.values is not None:
            old_rows = reference_scoring.target_rows(before["rollouts"], before["values"], scored)
            assert same([{**r, "created_at": 0} for r in old_rows],
                        [{**r, "created_at": 0} for r in target_rows(now)])
    old_batch, new_batch = reference_scoring.baselined(old, estimator), finish_batch(new, scorer)
    assert same(reference_scoring.batch_rows(3, old_batch, cfg.advantage.whiten),
                batch_rows(3, new_batch, cfg.advantage.whiten))
    assert same(reference_scoring.batch_metrics(3, old_batch, newest_critic=9),
                batch_metrics(3, new_batch, newest_critic=9))


# linear_mix: A_t = α·(R_i − b_i) + (1 − α)·GAE_t (prime_values/algo/gae.py, linear_mix_advantages)

MIX_MASK = torch.tensor([[0, 0, 1, 1, 1]] * 2, dtype=torch.bool)  # two prompt tokens, three policy tokens
MIX_VALUES = torch.tensor([[9, 9, .25, .5, .75], [9, 9, .5, .25, 0]])
MIX_REWARDS = torch.tensor([1.0, 0.0])


def test_linear_mix_hand_worked():
    # γ = λ = 1: GAE_t = R − V_t:  a: 1 − (.25, .5, .75) = (.75, .5, .25);  b: 0 − (.5, .25, 0) = (−.5, −.25, 0)
    # group mean b = .5: R − b = +.5 (a), −.5 (b)
    # α = .25:  a: .25·.5 + .75·(.75, .5, .25) = .125 + (.5625, .375, .1875) = (.6875, .5, .3125)
    #           b: .25·(−.5) + .75·(−.5, −.25, 0) = −.125 + (−.375, −.1875, 0) = (−.5, −.3125, −.125)
    out = linear_mix_advantages(MIX_REWARDS, MIX_VALUES, [0, 0], MIX_MASK, alpha=0.25)
    assert torch.equal(out, torch.tensor([[0, 0, .6875, .5, .3125], [0, 0, -.5, -.3125, -.125]]))


def test_linear_mix_with_a_leave_one_out_group_baseline_hand_worked():
    # R = (1, 0, 0), one policy token each with V = .5: GAE = R − V = (.5, −.5, −.5)
    # leave-one-out b = (mean of 0, 0; of 1, 0; of 1, 0) = (0, .5, .5): R − b = (1, −.5, −.5)
    # α = .5: A = .5·(1, −.5, −.5) + .5·(.5, −.5, −.5) = (.75, −.5, −.5)   (the plain mean 1/3 would give .5833...)
    mask = torch.tensor([[0, 1]] * 3, dtype=torch.bool)
    values = torch.tensor([[9, .5]] * 3)
    out = linear_mix_advantages(torch.tensor([1.0, 0, 0]), values, [4, 4, 4], mask, alpha=0.5, leave_one_out=True)
    assert torch.equal(out, torch.tensor([[0, .75], [0, -.5], [0, -.5]]))


@pytest.mark.parametrize("seed", range(3))
def test_linear_mix_is_the_group_advantage_at_alpha_one_and_gae_at_alpha_zero(seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(6, 9, generator=g) < 0.7
    rewards, values = torch.rand(6, generator=g), torch.randn(6, 9, generator=g)
    groups, cut, bootstrap = torch.tensor([0, 0, 0, 1, 1, 1]), torch.rand(6, generator=g) < 0.3, torch.randn(6)
    ends = dict(gamma=0.9, lam=0.8, bootstrap=bootstrap, cut=cut)
    assert torch.equal(linear_mix_advantages(rewards, values, groups, mask, alpha=1.0, **ends),
                       grpo_advantages(rewards, groups, mask))
    assert torch.equal(linear_mix_advantages(rewards, values, groups, mask, alpha=0.0, **ends),
                       gae(rewards, values, mask, 0.9, 0.8, bootstrap, cut)[0])


def test_linear_mix_through_the_config():
    # the hand-worked group above, scored by the orchestrator with advantage=linear_mix linear_mix_alpha=0.25
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.linear_mix_alpha = "linear_mix", 0.25
    rollouts = [log_rows.row("rollouts", rollout_id=r, group_id="g", reward=float(r == "a"), token_ids=[5, 6, 7, 8, 2],
                             policy_mask=[0, 0, 1, 1, 1]) for r in ("a", "b")]
    values = [log_rows.row("values", rollout_id=r, values=v, valued_tokens=5)
              for r, v in zip("ab", MIX_VALUES.tolist())]
    scored = score_group(rollouts, values, make_estimator(cfg.advantage))
    assert torch.equal(scored.advantages, torch.tensor([[0, 0, .6875, .5, .3125], [0, 0, -.5, -.3125, -.125]]))
    assert torch.equal(scored.targets, torch.tensor([[0, 0, 1., 1, 1], [0, 0, 0, 0, 0]]))  # λ_value = 1: R


# tether with group_baseline=leave_one_out: Ṽ_t = w·V(s_t) + (1 − w)·b_i, b_i the mean reward of i's group's others

LOO_MASK = torch.tensor([[0, 1, 1]] * 3, dtype=torch.bool)
LOO_VALUES = torch.tensor([[9, .5, .75], [9, .5, .25], [9, 0, .5]])
LOO_REWARDS = torch.tensor([1.0, 0.0, 0.0])
# w = .5 (running mode, critic_ev .5); leave-one-out b = (0, .5, .5); γ = λ = 1: A_t = R − Ṽ_t
#   a: Ṽ = .5·(.5, .75) + .5·0  = (.25, .375)  →  A = 1 − Ṽ = (.75, .625)
#   b: Ṽ = .5·(.5, .25) + .5·.5 = (.5, .375)   →  A = 0 − Ṽ = (−.5, −.375)
#   c: Ṽ = .5·(0, .5)   + .5·.5 = (.25, .5)    →  A = 0 − Ṽ = (−.25, −.5)
LOO_WANT = torch.tensor([[0, .75, .625], [0, -.5, -.375], [0, -.25, -.5]])


def test_tether_with_a_leave_one_out_group_baseline_hand_worked():
    advantages, weight = tether_advantages(LOO_REWARDS, LOO_VALUES, [0, 0, 0], LOO_MASK, mode="running",
                                           critic_ev=0.5, leave_one_out=True)
    assert torch.equal(weight, torch.full((3,), 0.5)) and torch.equal(advantages, LOO_WANT)
    # w = 0 (a useless critic): the leave-one-out advantage R − b = (1, −.5, −.5), RLOO
    rloo, _ = tether_advantages(LOO_REWARDS, LOO_VALUES, [0, 0, 0], LOO_MASK, mode="running", critic_ev=-1.0,
                                leave_one_out=True)
    assert torch.equal(rloo, torch.tensor([[0, 1., 1], [0, -.5, -.5], [0, -.5, -.5]]))


def test_tether_leave_one_out_through_the_config():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.tether_mode, cfg.advantage.group_baseline = "tether", "running", \
        "leave_one_out"
    rollouts = [log_rows.row("rollouts", rollout_id=r, group_id="g", reward=reward, token_ids=[5, 7, 2],
                             policy_mask=[0, 1, 1]) for r, reward in zip("abc", LOO_REWARDS.tolist())]
    values = [log_rows.row("values", rollout_id=r, values=v, valued_tokens=3)
              for r, v in zip("abc", LOO_VALUES.tolist())]
    scored = score_group(rollouts, values, make_estimator(cfg.advantage), critic_ev=0.5)
    assert torch.equal(scored.advantages, LOO_WANT) and scored.stats["tether_weight"].tolist() == [0.5] * 3


# Config rules of the new keys and of the estimators' needs.

def precheck(*overrides: str) -> str | None:
    from prime_values.__main__ import precheck as check

    return check(["+experiment=arith", *overrides])


def test_the_estimators_needs_and_the_new_keys_are_checked_before_launch():
    assert precheck("advantage=linear_mix") is None
    assert precheck("advantage=tether", "advantage.group_baseline=leave_one_out") is None
    line = precheck("advantage=linear_mix", "inference.group_size=1")
    assert line.startswith("inference.group_size=1 must be >= 2 for advantage=linear_mix") and \
        "use advantage=gae or tether" in line, line
    assert "advantage.linear_mix_alpha=1.5 must be in [0, 1]" in precheck("advantage.linear_mix_alpha=1.5")
    assert "advantage.group_baseline='median' is not allowed; choose one of mean, leave_one_out" in \
        precheck("advantage.group_baseline=median")
    assert "(did you mean 'tether'?)" in precheck("advantage.estimator=tehter")


def test_estimator_args_must_fit_the_constructor():
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator_args = {"scale": 2.0}
    with pytest.raises(ConfigError, match=r"advantage.estimator_args=\{'scale': 2.0\} does not fit advantage.estimator"
                                          r"=gae \(.*\); its keyword arguments: none"):
        AdvantageConfig.check(cfg, environment=False)


# An estimator of one's own, named by import path.

USER_MODULE = '''
    """Advantage estimators of one's own (docs/extending.md)."""

    from prime_values.algo.estimators import Estimator, Gae, Scores
    from prime_values.algo.gae import per_token


    class CentredReward(Estimator):
        """A_i = scale·(R_i − centre) on every policy token of rollout i; no critic."""

        def __init__(self, settings, scale=1.0, centre=0.5):
            super().__init__(settings)
            self.scale, self.centre = scale, centre

        def score(self, group):
            return Scores(per_token(self.scale * (group.rewards - self.centre), group.policy_mask))


    class HalfGae(Gae):
        """Half the pure value advantage: it reads the critic, so the run starts the critic roles."""

        def score(self, group):
            scores = super().score(group)
            return Scores(0.5 * scores.advantages, scores.targets)


    def not_a_class():
        pass
'''


@pytest.fixture
def user_package(outside_package):
    """A package `pv_user_estimators` outside the repository (USER_MODULE), importable here and, with the returned
    root on PYTHONPATH, in a subprocess."""
    return outside_package("pv_user_estimators", USER_MODULE)


def test_an_estimator_of_ones_own_by_import_path(user_package):
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.estimator_args = "pv_user_estimators:CentredReward", {"scale": 2.0}
    AdvantageConfig.check(cfg, environment=False)
    assert estimator_class("pv_user_estimators.CentredReward") is estimator_class("pv_user_estimators:CentredReward")
    assert derive(cfg)["uses_critic"] is False
    rows = [log_rows.row("rollouts", rollout_id=r, group_id="g", reward=reward, token_ids=[5, 7, 2],
                         policy_mask=[0, 1, 1]) for r, reward in (("a", 1.0), ("b", 0.0))]
    scored = score_group(rows, None, make_estimator(cfg.advantage))
    assert torch.equal(scored.advantages, torch.tensor([[0, 1., 1], [0, -1, -1]]))  # 2·(1 − .5), 2·(0 − .5)
    cfg.advantage.estimator, cfg.advantage.estimator_args = "pv_user_estimators:HalfGae", {}
    assert derive(cfg)["uses_critic"] is True and "pv_user_estimators:HalfGae" in CRITIC_ESTIMATORS


@pytest.mark.parametrize("name, message", [
    ("pv_user_estimators:CentredRewrd", "advantage.estimator='pv_user_estimators:CentredRewrd': module "
     "'pv_user_estimators' has no 'CentredRewrd'; did you mean pv_user_estimators:CentredReward?"),
    ("pv_user_estimatros:CentredReward", "advantage.estimator='pv_user_estimatros:CentredReward': module "
     "'pv_user_estimatros' does not import (No module named 'pv_user_estimatros'); install its package or put its "
     "directory on PYTHONPATH"),
    ("pv_user_estimators:not_a_class", "advantage.estimator='pv_user_estimators:not_a_class' is not an estimator "
     "class (it lacks uses_critic, uses_critic_ev, min_group_size, min_batch_size, score, finish_batch); subclass "
     "prime_values.algo.estimators.Estimator"),
])
def test_a_wrong_import_path_is_one_sentence_naming_the_key_and_the_fix(user_package, name, message):
    line = precheck(f"advantage.estimator={name}")
    assert line is not None and "\n" not in line and message in line, line


def test_a_wrong_keyword_of_ones_own_estimator_names_the_ones_it_takes(user_package):
    cfg = OmegaConf.structured(Config)
    cfg.advantage.estimator, cfg.advantage.estimator_args = "pv_user_estimators:CentredReward", {"sclae": 2.0}
    with pytest.raises(ConfigError, match="got an unexpected keyword argument 'sclae'.*its keyword arguments: scale, "
                                          "centre"):
        AdvantageConfig.check(cfg, environment=False)


def test_an_estimator_must_give_one_advantage_per_token_and_the_critics_targets():
    class Short(Estimator):
        def score(self, group: Group) -> Scores:
            return Scores(group.rewards[:, None])

    class NoTargets(Estimator):
        uses_critic = True

        def score(self, group: Group) -> Scores:
            return Scores(torch.zeros(group.policy_mask.shape))

    rows = [log_rows.row("rollouts", rollout_id="a", group_id="g", reward=1.0, token_ids=[5, 7, 2],
                         policy_mask=[0, 1, 1])]
    with pytest.raises(ValueError, match=r"advantages of shape \(1, 1\) for a group of shape \(1, 3\)"):
        score_group(rows, None, Short(None))
    values = [log_rows.row("values", rollout_id="a", values=[0, .5, .5], valued_tokens=3)]
    with pytest.raises(ValueError, match="uses the critic but returned no value targets"):
        score_group(rows, values, NoTargets(None))


@pytest.mark.slow
def test_a_pipeline_runs_an_estimator_of_ones_own_from_a_package_outside_the_repository(user_package, tmp_path):
    from tests.e2e_helpers import run_pipeline, stream_table

    run_dir = tmp_path / "run"
    path = os.pathsep.join(p for p in (str(user_package), os.environ.get("PYTHONPATH")) if p)
    result = run_pipeline(run_dir, "advantage.estimator=pv_user_estimators:CentredReward",
                          "+advantage.estimator_args.scale=2.0", "steps=3", env={"PYTHONPATH": path})
    assert result.returncode == 0, result.stderr[-3000:]
    # no critic roles: CentredReward.uses_critic is False
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"}
    rows = stream_table(run_dir, "batches").to_pylist()
    assert sorted({r["step"] for r in rows}) == [1, 2, 3]
    for r in rows:  # A = 2·(R − 0.5) on every policy token, 0 elsewhere: the orchestrator ran CentredReward
        want = 2.0 * (float(torch.tensor(r["reward"], dtype=torch.float32)) - 0.5)
        assert r["advantages"] == pytest.approx([want if m else 0.0 for m in r["policy_mask"]], abs=1e-6)


@pytest.mark.skipif(AdvantageConfig.check not in CHECKS,
                    reason="prime_values/config/root.py's CHECKS does not list AdvantageConfig.check yet")
def test_a_wrong_keyword_is_caught_before_launch(user_package):
    line = precheck("advantage.estimator=pv_user_estimators:CentredReward", "+advantage.estimator_args.sclae=2.0")
    assert line is not None and "advantage.estimator_args={'sclae': 2.0} does not fit" in line, line
