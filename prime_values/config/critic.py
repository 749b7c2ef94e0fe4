"""`critic.*`: the value model, its optimiser, its warm start on Monte-Carlo returns and the policy's warm-up gate."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from prime_values.config.base import ConfigError, choice, free, ranged
from prime_values.config.policy import LoraSettings, path_like

ORACLE_TASKS = ("guess", "tools", "sudoku")
"""the tasks that play games on from any state (`task.continuations`), so critic.oracle_samples can value them"""


def trains_critic(cfg) -> bool:
    """The run trains a critic (a value trainer, critic pretraining): it uses one, and it is not the oracle."""
    return not cfg.critic.get("oracle_samples", 0)


@dataclass
class WarmupConfig:
    min_version: int = ranged(0, ">= 0")
    """the policy's first update waits until values come from at least this critic version (0 = no wait)"""
    min_explained_variance: Optional[float] = free(None, "at most 1: WarmupConfig.check says so in its own words")
    """...and until the critic's explained variance on the last `inference.prompts_per_step` scored groups
    reaches this (null = no condition)"""
    max_rollouts: int = ranged(20000, ">= 0")
    """open the gate anyway after this many warm-up rollouts were scored, with a warning (0 = never)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        ev = cfg.critic.warmup.min_explained_variance
        if ev is not None and ev > 1:
            raise ConfigError(f"critic.warmup.min_explained_variance={ev} can never be reached (explained variance is "
                              "at most 1); use a value <= 1, or null for no condition")


@dataclass
class CriticWarmStartConfig:
    steps: int = ranged(300, ">= 0")
    """critic optimizer steps in the warm-start job, before RL starts, on Monte-Carlo returns (0 = none): the
    critic starts RL already useful"""
    rollouts: int = ranged(2048, ">= 1")
    """rollouts to pretrain on: fresh samples of policy version 0, or the newest of `from_run`'s log"""
    from_run: str = ""
    """an earlier run directory whose rollout log supplies the pretraining rollouts instead of fresh samples
    (offline warm start; its policy may differ from this run's v0, so the critic starts from that policy's
    values)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        from_run = cfg.critic.warm_start.from_run
        if environment and from_run and not (Path(from_run) / "log" / "rollouts").is_dir():
            raise ConfigError(f"critic.warm_start.from_run={from_run!r} has no log/rollouts; point it at the run "
                              "directory of an earlier run (or leave it empty to sample fresh rollouts)")


@dataclass
class CriticConfig:
    init: str = free("policy", "'policy', 'scratch' or the path of a saved critic: CriticConfig.check")
    """'policy': backbone from the warm-started policy, fresh value head; 'scratch': random init from
    policy.arch; anything else: path of a saved critic (AutoModelForTokenClassification)"""
    privileged: bool = True
    """fold the task's privileged context (e.g. the reference answer) into the critic's input"""
    template: str = "answer:{privileged}|"
    """the privileged block's text (where it goes: critic.placement); {privileged} is replaced by the context (a
    format spec pads it: '{privileged:<4}|' left-aligns it in 4 characters)"""
    placement: str = choice("start", "start", "response")
    """where the privileged block goes: 'start' (before the whole trace) or 'response' (after the prompt, right
    before the policy's first token: at a fixed distance from the response whatever the prompt's length)"""
    num_layers: int = ranged(0, ">= 0")
    """transformer blocks of the critic: 0 = as many as its initialisation (the policy's backbone, policy.arch
    or the saved critic); N = keep the first N, a shallower critic that takes more, cheaper steps (the
    embedded arith experiment uses 2 of the policy's 4: docs/value_functions.md)"""
    lr: float = ranged(3e-3, "> 0")
    """critic learning rate (AdamW)"""
    activation_checkpointing: bool = False
    """value trainer: recompute each transformer block's activations in the backward pass instead of keeping
    them (the same gradients, less memory; one more forward pass per block). The critic's precision is policy.dtype"""
    max_grad_norm: float = ranged(1.0, ">= 0")
    """gradient-norm clip per critic step (0 = off)"""
    loss: str = choice("mse", "mse", "huber", "bce")
    """value loss: 'mse', 'huber' or 'bce' (sigmoid head for {0, 1} rewards; values are probabilities)"""
    value_clip: float = free(0.0, ">= 0 and not with bce: CriticConfig.check says both in one line")
    """clip each new prediction to within this of the value recorded at scoring time, PPO-style (the larger
    of clipped and unclipped loss; 0 = off; not with bce)"""
    batch_rollouts: int = ranged(64, ">= 1")
    """rollouts per critic optimizer step, sampled from the replay buffer"""
    publish_every: int = ranged(4, ">= 1")
    """critic optimizer steps between published critic versions"""
    weight_average: float = ranged(0.0, ("in [0, 1)", " (the decay of the critic's weight average); use e.g. 0.95, "
                                                      "or 0 for no average"))
    """decay of an exponential moving average of the critic's weights, updated after every critic step (0 =
    off): published versions (and a colocated evaluator's scores) use the average, training goes on with the
    raw weights; a restart resumes training from the published average"""
    max_length: int = ranged(256, ">= 1")
    """critic context in tokens; longer traces are cut and marked `cut`"""
    pack_sequences: bool = True
    """value trainer, evaluator and critic pretraining: lay the batch's traces end to end in lines of at least 64
    tokens (first-fit decreasing, critic_io.Packing) instead of one right-padded row each; the same values, fewer
    positions computed (docs/benchmarks.md, "Against the machine's peak")"""
    score_batch_rollouts: int = ranged(256, ">= 1")
    """rollouts per scoring forward pass in the evaluator"""
    throttle_s: float = ranged(0.0, ">= 0")
    """sleep after every critic optimizer step (a benchmark knob that simulates a slow critic)"""
    throttle_factor: float = ranged(0.0, ">= 0")
    """sleep this many times each critic optimizer step's own duration after it (9 = a critic 10x slower; a
    benchmark knob that simulates a slow critic whatever the machine)"""
    oracle_samples: int = ranged(0, ">= 0")
    """0 = a learnt critic. K > 0 = the oracle (critic=oracle): no critic is trained (no value trainer, no critic
    pretraining); the evaluator values the state before every policy token of every rollout as the mean reward of
    K games played on from it by the newest policy version it has adopted (Monte-Carlo, the task's
    `continuations`: task=guess, task=tools, task=sudoku), written as critic version 0. The ceiling of what any
    critic of this policy buys (docs/value_functions.md, "The oracle"); K games per state cost about K x the
    rollouts' own sampling"""
    warm_start: CriticWarmStartConfig = field(default_factory=CriticWarmStartConfig)
    """critic pretraining in the warm-start job"""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """hold the policy's first update until the critic is good enough; inference keeps filling the log
    meanwhile (those rollouts train the critic; groups scored before the gate opened never reach a batch)"""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters for the value trainer (critic version 0 is the base; the value head `score` trains fully)"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        critic = cfg.critic
        WarmupConfig.check(cfg, environment)
        if critic.value_clip < 0 or (critic.value_clip > 0 and critic.loss == "bce"):
            raise ConfigError(f"critic.value_clip={critic.value_clip} must be >= 0 and is not defined for "
                              "critic.loss=bce; set critic.value_clip=0")
        CriticWarmStartConfig.check(cfg, environment)
        if critic.oracle_samples:
            if cfg.task.name not in ORACLE_TASKS:
                raise ConfigError(f"critic.oracle_samples={critic.oracle_samples}: task={cfg.task.name} cannot play "
                                  f"games on from a state; the oracle runs on task={' / task='.join(ORACLE_TASKS)} "
                                  "(or set critic.oracle_samples=0 for a learnt critic)")
            if cfg.topology.evaluator != "dedicated":
                raise ConfigError(f"critic.oracle_samples={critic.oracle_samples} needs topology.evaluator=dedicated "
                                  f"(got {cfg.topology.evaluator}): the oracle has no value trainer to colocate with")
        init = critic.init
        if environment and init not in ("policy", "scratch") and not Path(init).expanduser().is_dir() and \
                (path_like(init) or "/" not in init):
            raise ConfigError(f"critic.init={init!r} is neither 'policy', 'scratch' nor an existing directory; use "
                              "'policy', 'scratch' or the path of a saved critic")
        layers, arch_layers = critic.num_layers, cfg.policy.arch.num_layers
        if layers and init in ("policy", "scratch") and cfg.policy.model == "tiny" and layers > arch_layers:
            raise ConfigError(f"critic.num_layers={layers} is more than the {arch_layers} transformer "
                              f"blocks the critic starts from (policy.arch.num_layers); choose 1.."
                              f"{arch_layers}, or 0 for all")
        if critic.privileged:
            try:
                ok = "{privileged" in critic.template and critic.template.format(privileged="") is not None
            except (KeyError, IndexError, ValueError):
                ok = False
            if not ok:
                raise ConfigError(f"critic.template={critic.template!r} must contain '{{privileged}}' and no other "
                                  "'{...}' field; e.g. 'answer:{privileged}|', or '{privileged:<3}|' to pad it to 3 "
                                  "characters (or set critic.privileged=false)")
