"""A task of one's own, named by import path (`task=custom task.target=package.module:Class`): built with its
keywords and the keys every task has, checked when it is loaded (a misspelt module, class or keyword, a missing
method: one line naming the key and the fix, before any job starts), a reward of one's own as a built-in task with
another score_many, and a whole pipeline run with both a task and an estimator from a package outside the
repository."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from prime_values.__main__ import precheck
from prime_values.config import Config, ConfigError
from prime_values.config.task import CustomTaskConfig
from prime_values.tasks import TASKS, ArithTask, make_task, user_task_class

USER_MODULE = '''
import random

from prime_values.algo.estimators import Estimator, Scores
from prime_values.algo.gae import per_token
from prime_values.tasks import ArithTask, Problem


class Successor:
    """'next 41:' -> '42', for n in 0..top; the critic may see the answer."""

    def __init__(self, top=999, heldout_size=200, seed=1234):
        if heldout_size > (top + 1) // 2:
            raise ValueError(f"task.heldout_size={heldout_size} is more than half of the {top + 1} problems; "
                             "lower it or raise +task.args.top")
        numbers = random.Random(seed).sample(range(top + 1), top + 1)
        self.top, self.held = top, set(numbers[:heldout_size])
        self.train = numbers[heldout_size:]

    def problem(self, n):
        return Problem(prompt_id=f"next:{n}", prompt=f"next {n}:", answer=str(n + 1), privileged=str(n + 1))

    def sample(self, rng, n):               # training problems, never a held-out one
        return [self.problem(rng.choice(self.train)) for _ in range(n)]

    def heldout(self):
        return [self.problem(n) for n in sorted(self.held)]

    def is_heldout(self, problem):
        return int(problem.answer) - 1 in self.held

    def score_many(self, problems, texts):  # the reward: bounded work per reply, never evaluating it
        return [1.0 if t[:8].strip() == p.answer else 0.0 for p, t in zip(problems, texts)]

    def max_answer_chars(self):
        return len(str(self.top + 1))

    def describe(self):
        return {"name": "successor", "top": self.top, "heldout_size": len(self.held)}

    def solution(self, problem):            # what the warm start trains on
        return problem.answer


class LenientArith(ArithTask):
    """arith with another reward: 1 for the answer, 0.5 for a reply with the answer's first digit."""

    def score_many(self, problems, texts):
        exact = super().score_many(problems, texts)
        return [e or (0.5 if t.strip()[:1] == p.answer[:1] else 0.0) for e, p, t in zip(exact, problems, texts)]


class SignedReward(Estimator):
    """A_i = +scale on every policy token of a rollout whose reward is 1, -scale otherwise; no critic."""

    def __init__(self, settings, scale=1.0):
        super().__init__(settings)
        self.scale = scale

    def score(self, group):
        return Scores(per_token(self.scale * (2.0 * (group.rewards >= 1).float() - 1.0), group.policy_mask))


class NoScore(Successor):
    score_many = None


class NoTarget:
    sample = heldout = is_heldout = score_many = max_answer_chars = describe = Successor.sample


class NoCommonKeys(Successor):
    def __init__(self, top=999):
        super().__init__(top, 10, 0)


class Broken(Successor):
    def __init__(self, heldout_size=200, seed=1234):
        {}["oops"]


class TurnTaking(Successor):
    def rollout(self, model, tokenizer, problems, num_samples, max_new_tokens, temperature, seed, batch_size=None):
        raise NotImplementedError


def not_a_class():
    pass
'''


@pytest.fixture
def user_package(outside_package):
    """A package `pv_user_rl` outside the repository (USER_MODULE), importable here and, with the returned root on
    PYTHONPATH, in a subprocess."""
    return outside_package("pv_user_rl", USER_MODULE)


def custom(*overrides: str) -> str | None:
    return precheck(["+experiment=embedded", "task=custom", *overrides])


def test_a_task_of_ones_own_is_built_with_its_keywords_and_the_keys_every_task_has(user_package):
    import random

    task = make_task("custom", target="pv_user_rl:Successor", args={"top": 20}, heldout_size=5, seed=3,
                     train_pool=0)
    assert type(task).__name__ == "Successor" and task.top == 20 and len(task.heldout()) == 5
    again = make_task("custom", target="pv_user_rl.Successor", args={"top": 20}, heldout_size=5, seed=3)
    assert [p.prompt for p in again.heldout()] == [p.prompt for p in task.heldout()]  # the same in every process
    assert not any(task.is_heldout(p) for p in task.sample(random.Random(0), 200))
    assert custom("task.target=pv_user_rl:Successor", "+task.args.top=20", "task.heldout_size=5") is None
    assert custom("task.target=pv_user_rl:Successor", "task.heldout_size=10", "task.train_pool=50") is None


def test_a_role_builds_the_task_from_the_saved_config(user_package, tmp_path):
    """A role reads the run's config.yaml and calls make_task(**cfg.task): the same task as the config check."""
    from tests.e2e_helpers import compose

    cfg = compose(["+experiment=embedded", "task=custom", "task.target=pv_user_rl:Successor", "+task.args.top=30",
                   "task.heldout_size=4"])
    (tmp_path / "config.yaml").write_text(OmegaConf.to_yaml(cfg))
    task = make_task(**OmegaConf.load(tmp_path / "config.yaml").task)
    assert (type(task).__name__, task.top, len(task.heldout())) == ("Successor", 30, 4)


def test_a_reward_of_ones_own_is_a_built_in_task_with_another_score_many(user_package):
    task = make_task("custom", target="pv_user_rl:LenientArith", args={"digits": 1}, heldout_size=10, seed=0)
    assert isinstance(task, ArithTask) and task.digits == 1
    p = task.make_problem([7, 8], ["+"])
    assert task.score_many([p, p, p], ["15", "19", "3"]) == [1.0, 0.5, 0.0]
    assert custom("task.target=pv_user_rl:LenientArith", "+task.args.digits=1", "task.heldout_size=10") is None


@pytest.mark.parametrize("overrides, message", [
    (["task.target=pv_user_rl:Sucessor"],
     "task.target='pv_user_rl:Sucessor': module 'pv_user_rl' has no 'Sucessor'; did you mean pv_user_rl:Successor?"),
    (["task.target=pv_user_lr:Successor"],
     "task.target='pv_user_lr:Successor': module 'pv_user_lr' does not import (No module named 'pv_user_lr'); "
     "install its package or put its directory on PYTHONPATH"),
    (["task.target=pv_user_rl:Successor", "+task.args.tpo=20"],
     "task.args={'tpo': 20} does not fit task.target=pv_user_rl:Successor (got an unexpected keyword argument "
     "'tpo'); its keyword arguments: top"),
    (["task.target=pv_user_rl:NoScore"],
     "task.target='pv_user_rl:NoScore' is not a task class: it lacks score_many; add it"),
    (["task.target=pv_user_rl:NoTarget"],
     "task.target='pv_user_rl:NoTarget' is not a task class: it lacks solution or demonstration; add it"),
    (["task.target=pv_user_rl:not_a_class"], "task.target='pv_user_rl:not_a_class' is a function, not a class"),
    (["task.target=pv_user_rl:NoCommonKeys"],
     "task.target=pv_user_rl:NoCommonKeys: its constructor takes no heldout_size or seed; every task takes "
     "heldout_size and seed (task.heldout_size, task.seed), so add them to its keywords"),
    (["task.target=pv_user_rl:Successor", "+task.args.seed=3"],
     "task.args.seed is a key every task has; set task.seed=3 instead"),
    (["task.target=pv_user_rl:Successor", "+task.args.top=99", "task.heldout_size=80"],
     "task.heldout_size=80 is more than half of the 100 problems; lower it or raise +task.args.top"),
    (["task.target=pv_user_rl:Broken"],
     "task.target=pv_user_rl:Broken: building it with {'heldout_size': 200, 'seed': 1234} raised KeyError: 'oops'; "
     "fix the class or task.args"),
    (["task.target=pv_user_rl"], "task.target='pv_user_rl' is not an import path; name your task class as "
                                 "package.module:Class"),
    (["task.target=arith"], "task.target='arith' is a built-in task; choose it with task=arith"),
    ([], "task.target is empty; name your task class as task.target=package.module:Class"),
])
def test_a_wrong_task_is_one_sentence_naming_the_key_and_the_fix_before_launch(user_package, overrides, message):
    line = custom(*overrides)
    assert line is not None and "\n" not in line and message in line, line


def test_an_import_path_in_task_name_says_how_to_name_a_task_of_ones_own():
    line = precheck(["+experiment=arith", "task.name=pv_user_rl:Successor"])
    assert line == ("task.name='pv_user_rl:Successor' is an import path; name a task class of your own with "
                    "task=custom task.target=pv_user_rl:Successor (docs/extending.md, \"A task\")"), line


def test_a_task_that_plays_its_own_turns_needs_the_transformers_backend(user_package):
    cfg = OmegaConf.structured(Config(task=CustomTaskConfig()))
    cfg.task.target = "pv_user_rl:TurnTaking"
    CustomTaskConfig.check(cfg, environment=False)  # inference=hf
    cfg.inference.backend = "vllm"
    with pytest.raises(ConfigError, match="task.target=pv_user_rl:TurnTaking plays its own turns .*; use "
                                          "inference=hf with it"):
        CustomTaskConfig.check(cfg, environment=False)
    cfg.task.target = "pv_user_rl:Successor"  # one reply per rollout: any backend
    CustomTaskConfig.check(cfg, environment=False)


def test_the_built_in_tasks_are_still_the_registry_and_custom_is_the_one_by_import_path():
    assert list(TASKS) == ["arith", "guess", "tools", "reverse_text", "math", "reasoning_gym", "verifiers", "vision",
                           "sudoku", "custom"]
    assert user_task_class("prime_values.tasks.arith:ArithTask") is ArithTask  # a built-in class, by its path too


@pytest.mark.slow
def test_a_pipeline_runs_a_task_and_an_estimator_of_ones_own_from_a_package_outside_the_repository(user_package,
                                                                                                  tmp_path):
    """The warm start trains on Successor's solutions, inference samples its problems and scores them with its
    score_many, the policy trainer evaluates its held-out set, and the orchestrator scores with SignedReward:
    every process imports the package from PYTHONPATH."""
    from prime_values.monitor import read_metrics
    from tests.e2e_helpers import REPO, SMALL, env_for_runs, stream_table

    run_dir = tmp_path / "run"
    # SMALL's configuration on the embedded experiment (arith's sets keys only arith has), with a warm start of its
    # own: SFT on Successor's solutions until half of a validation sample is solved (75 steps, 4 s on 2 cores), so
    # the sampled rewards hold both 0 and 1
    base = [o for o in SMALL if o not in ("+experiment=arith", "task.digits=1")]
    overrides = ["+experiment=embedded", *base, "task=custom", "task.target=pv_user_rl:Successor",
                 "+task.args.top=99", "policy.warm_start.steps=300", "policy.warm_start.lr=3e-3",
                 "policy.warm_start.check_every=25", "policy.warm_start.target_accuracy=0.5",
                 "advantage.estimator=pv_user_rl:SignedReward", "+advantage.estimator_args.scale=2.0", "steps=3"]
    path = os.pathsep.join(p for p in (str(user_package), os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run([sys.executable, "-m", "prime_values", *overrides, f"hydra.run.dir={run_dir}"],
                            cwd=REPO, env=env_for_runs({"PYTHONPATH": path}), capture_output=True, text=True,
                            timeout=int(os.environ.get("PV_TEST_RUN_TIMEOUT", "400")))
    assert result.returncode == 0, result.stderr[-3000:]
    assert {p.name for p in (run_dir / "jobs").iterdir()} == {"warm_start", "inference0", "orchestrator",
                                                              "policy_trainer"}
    warm = [m["heldout_accuracy"] for m in read_metrics(run_dir / "metrics" / "warm_start.jsonl")
            if "heldout_accuracy" in m]
    assert warm and warm[-1] > 0, f"the warm start did not learn Successor's solutions: held-out accuracy {warm}"
    evaluations = [m for m in read_metrics(run_dir / "metrics" / "policy_trainer.jsonl") if "heldout_accuracy" in m]
    assert evaluations, "the policy trainer did not evaluate Successor's held-out set"

    import pv_user_rl

    scorer = pv_user_rl.Successor(top=99, heldout_size=16)
    rollouts = stream_table(run_dir, "rollouts").to_pylist()
    assert rollouts
    for r in rollouts:  # Successor's problems, scored by Successor.score_many
        task = json.loads(r["task"])
        n = re.fullmatch(r"next (\d+):", task["prompt"])
        assert n and task["answer"] == r["privileged"] == str(int(n.group(1)) + 1), task
        problem = scorer.problem(int(n.group(1)))
        assert r["reward"] == scorer.score_many([problem], [task["response"]])[0], (r["reward"], task)
    batches = stream_table(run_dir, "batches").to_pylist()
    assert sorted({r["step"] for r in batches}) == [1, 2, 3]
    assert {r["reward"] for r in batches} == {0.0, 1.0}, "the batches' rewards do not hold both 0 and 1"
    for r in batches:  # A = ±2 on every policy token by the reward, 0 elsewhere: the orchestrator ran SignedReward
        want = 2.0 if r["reward"] >= 1 else -2.0
        assert r["advantages"] == pytest.approx([want if m else 0.0 for m in r["policy_mask"]], abs=1e-6)
