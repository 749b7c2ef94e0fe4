"""The root of the schema (`Config`: the run-wide keys and one section per module of this package), its
registration with Hydra, `validate` (each section's rules and checks in turn: `CHECKS`; the checks that need the
code above config run as hooks, prime_values/config/checks.py), `prepare` (the config a run saves), `load_saved`
(a saved one, on the current schema) and `validating_once` (one launch validates each config once)."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from omegaconf import DictConfig, OmegaConf

from prime_values.config.advantage import AdvantageConfig
from prime_values.config.base import ConfigError, check_fields, free, ranged
from prime_values.config.checks import declare, run_check
from prime_values.config.critic import CriticConfig
from prime_values.config.derived import Resolved, resolve
from prime_values.config.inference import InferenceConfig
from prime_values.config.launcher import LauncherConfig
from prime_values.config.log import LogConfig
from prime_values.config.policy import LoraSettings, PolicyConfig, TinyArch
from prime_values.config.replay import ReplayConfig
from prime_values.config.schedule import ScheduleConfig
from prime_values.config.stages import EvalConfig, SFTConfig, check_stages
from prime_values.config.task import TASK_CONFIGS, TASK_NAMES, ArithTaskConfig, TaskConfig, owner_of, unknown_key_hint
from prime_values.config.topology import DEVICE_KEYS, TopologyConfig, resolve_devices
from prime_values.config.wandb import WandbConfig

BUDGET_CHECK = declare("budget", "the embedded model's token budgets: the task's longest prompt and answer fit",
                       "prime_values/budget.py")


@dataclass
class Config:
    seed: int = free(0, "any integer seeds the run")
    """seed of every role's random streams (each role/worker derives its own)"""
    steps: int = ranged(200, ">= 1")
    """policy-trainer steps (= batches = published policy versions after 0)"""
    eval_every: int = ranged(25, ">= 1")
    """policy steps between held-out evaluations (also at the first and last step)"""
    time_budget_min: float = ranged(0.0, (">= 0", " (0 = no budget: all steps run)"))
    """0 = run all `steps`; else the policy trainer's last step is the one after which one more step and the final
    held-out evaluation would end past this many minutes from the run's start (its config.yaml: launch or
    resume), then it evaluates and finishes: `steps` becomes a cap (+experiment=smollm: 30 minutes on 2 cores)"""
    stages: List[str] = field(default_factory=lambda: ["rl"])
    """the experiment's stages in order, from 'sft', 'rl', 'eval'; each starts from the model the one before
    produced; a stage with `<run>/stages/<name>/done.json` is skipped on a rerun (docs/stages.md)"""
    stage: Optional[str] = None
    """run only this stage, starting from policy.model (e.g. stage=eval policy.model=<dir>); null = all stages"""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """the policy model and its training (config/policy.py)"""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """the critic and its training (config/critic.py)"""
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    """the critic's replay buffer (config/replay.py)"""
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    """the advantage estimator (config/advantage.py)"""
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    """roles, devices and processes (config/topology.py)"""
    task: TaskConfig = field(default_factory=ArithTaskConfig)
    """the task; its keys depend on the `task` group's choice (config/task.py)"""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """sampling (config/inference.py)"""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """asynchronous or lockstep (config/schedule.py)"""
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    """local or SLURM jobs (config/launcher.py)"""
    log: LogConfig = field(default_factory=LogConfig)
    """retention and plots (config/log.py)"""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """the sft stage (config/stages.py)"""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """the eval stage (config/stages.py)"""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Weights & Biases (config/wandb.py)"""
    resolved: Resolved = field(default_factory=Resolved, metadata={"derived": True})
    """facts derived from the keys above when the run is prepared (config/derived.py)"""




CONF_DIR = Path(__file__).resolve().parents[1] / "conf"
"""the YAML groups Hydra composes (prime_values/conf, a link to the repository's conf/)"""


def compose(overrides=(), prepared: bool = False, cuda_count: Optional[int] = None) -> DictConfig:
    """The one way to get a config in code: what `python -m prime_values <overrides>` composes (Hydra over
    CONF_DIR on top of the schema; an unknown key or a wrong type raises here); with `prepared`, `prepare`d as a
    run saves it (validated for a machine with `cuda_count` GPUs, None = this one's; derived facts resolved)."""
    from hydra import compose as hydra_compose, initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=list(overrides))
    return prepare(cfg, cuda_count=cuda_count) if prepared else cfg


def register() -> None:
    """Register the schema so `conf/config.yaml` can extend it (`defaults: [prime_values_schema, ...]`), and each
    task's schema as `schema/task/<name>`, which conf/task/<name>.yaml extends."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    store.store(name="prime_values_schema", node=Config(task=TaskConfig()))
    for name, cls in TASK_CONFIGS.items():
        store.store(group="schema/task", name=name, node=cls)


def task_class(cfg) -> type[TaskConfig]:
    """The config class of cfg's task: the one the `task` group chose, else the one task.name names."""
    name = cfg.task.name
    if isinstance(name, str) and (":" in name or "." in name):
        raise ConfigError(f"task.name={name!r} is an import path; name a task class of your own with task=custom "
                          f"task.target={name} (docs/extending.md, \"A task\")")
    chosen = OmegaConf.get_type(cfg.task) if isinstance(cfg.task, DictConfig) else None
    if isinstance(chosen, type) and issubclass(chosen, TaskConfig) and chosen is not TaskConfig:
        own = chosen.__dataclass_fields__["name"].default
        if name != own and name in TASK_NAMES:
            raise ConfigError(f"task.name={name} does not match the task group's choice task={own} (whose keys "
                              f"task.* are); choose the task with task={name} instead of task.name={name}")
        return chosen
    return TASK_CONFIGS.get(name, TaskConfig)


def schema(task: type[TaskConfig] = ArithTaskConfig) -> DictConfig:
    """The whole schema with the keys of `task`, every key at its default."""
    return OmegaConf.structured(Config(task=task()))


def load_saved(path: str | os.PathLike):
    """A run's saved ``config.yaml`` on the current schema: keys added since the run get their defaults (so tools
    can read them and override them), and the derived `resolved` facts the file lacks are derived; a config the
    schema no longer accepts (a key removed since) is returned as written (with the derived facts)."""
    cfg = OmegaConf.load(path)
    name = cfg.get("task", {}).get("name") if isinstance(cfg.get("task"), DictConfig) else None
    task = TASK_CONFIGS.get(name, ArithTaskConfig)
    if name in TASK_CONFIGS:  # a run saved before each task had its own keys holds every task's: keep its own
        own = set(task.__dataclass_fields__)
        for key in [k for k in cfg.task if k not in own and owner_of(str(k))]:
            del cfg.task[key]
    try:
        cfg = OmegaConf.merge(schema(task), cfg)
    except Exception:  # noqa: BLE001 - any schema mismatch: the config as written
        pass
    try:
        return resolve(cfg, only_missing=True)
    except Exception:  # noqa: BLE001 - a config too old or too odd to derive from: as it is
        return cfg


def _no_unknown_keys(node, schema_node, prefix: str = "") -> None:
    """`+key=value` adds keys the schema lacks: each is one line naming it and the keys allowed there."""
    for key in node.keys():
        if key not in schema_node.keys():
            allowed = sorted(str(k) for k in schema_node.keys())
            hint = unknown_key_hint(f"{prefix}{key}", allowed)
            raise ConfigError(f"unknown config key '{prefix}{key}'{hint}; remove it or use one of the keys under "
                              f"'{prefix or '<root>'}': {', '.join(allowed)}")
        if OmegaConf.is_missing(schema_node, key):  # a derived fact (resolved.*): filled when the run is prepared
            continue
        if isinstance(schema_node[key], DictConfig) and isinstance(node[key], DictConfig) and \
                OmegaConf.get_type(schema_node[key]) is not dict:  # a free-form dict (task.env_args) holds any key
            _no_unknown_keys(node[key], schema_node[key], f"{prefix}{key}.")


_validated: Optional[set] = None  # inside `validating_once`: what validate has passed


@contextlib.contextmanager
def validating_once():
    """Inside (one launch: `python -m prime_values`), `validate` passes at once a config it has validated already
    with the same `cuda_count` and `environment`: the command line's precheck, each stage and the
    conductor validate the one config once, a multirun point or a changed config (a converted GGUF policy.model,
    the model an sft stage made) again."""
    global _validated
    outer, _validated = _validated, set() if _validated is None else _validated
    try:
        yield
    finally:
        _validated = outer


def _validation_key(cfg, cuda_count: Optional[int], environment: bool) -> Optional[str]:
    """What makes two validations the same: the keys (interpolations resolved, resolved.* left out), cuda_count
    and environment; None when the keys cannot be resolved here (then it validates)."""
    try:
        plain = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(cfg)
        plain.pop("resolved", None)
        return json.dumps([plain, cuda_count, environment], sort_keys=True, default=str)
    except Exception:  # noqa: BLE001 - an interpolation this process cannot resolve: no shortcut, validate it
        return None


def validate(cfg, cuda_count: Optional[int] = None, environment: bool = True) -> None:
    """Checks a type cannot express. Raises ConfigError with one sentence naming the key and what is allowed.
    `environment=False` (`--cfg job`, composing for another machine) leaves out the checks of this machine: the
    SLURM commands, installed backends and extras, data sets, directories, CUDA devices; they belong to the launch.
    The checks that need the code above config run as hooks (prime_values/config/checks.py: each imported by the
    module name it declares where nothing registered it yet); inside `validating_once` a config passes once."""
    key = _validation_key(cfg, cuda_count, environment) if _validated is not None else None
    if key is not None and key in _validated:
        return
    task = task_class(cfg)
    if isinstance(cfg, DictConfig):
        _no_unknown_keys(cfg, schema(task))
    check_fields(cfg, Config, sections={"task": task})
    for check in CHECKS:
        check(cfg, environment)
    TopologyConfig.check_devices(cfg, cuda_count, environment)
    if key is not None:
        _validated.add(key)


def prepare(cfg, cuda_count: Optional[int] = None) -> DictConfig:
    """The config a run's jobs read, made the one way every caller needs it (the conductor for the rl stage, the
    sft and eval stages, the tests): `validate`d (a multirun point arrives here with its own values), a plain copy
    with every interpolation resolved, 'auto' devices replaced (for `cuda_count` GPUs, default: this machine's;
    an all-CPU config never imports torch), and the derived facts (resolved.*) filled, once: the roles and tools
    read them from the file the caller saves it to (the run's or the stage's config.yaml)."""
    validate(cfg, cuda_count)
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    if any(cfg.topology[key] == "auto" for key in DEVICE_KEYS):
        if cuda_count is None:
            import torch

            cuda_count = torch.cuda.device_count()
        resolve_devices(cfg.topology, cuda_count)
    return resolve(cfg)


def _check_task(cfg, environment: bool) -> None:
    task_class(cfg).check(cfg, environment)


def _check_budget(cfg, environment: bool) -> None:
    """The embedded model's token budgets (the `budget` hook, prime_values/budget.py; a local model's are checked
    once its tokenizer is at hand, before the jobs start)."""
    run_check(BUDGET_CHECK, cfg, environment)


def _check_lora(cfg, environment: bool) -> None:
    for role, trainer in (("policy", "policy_trainer"), ("critic", "value_trainer")):
        LoraSettings.check(cfg, role, trainer, environment)


# Every cross-field check, in the order validate runs them (after every field's own rules): each section's, the
# task's own rules, the embedded model's token budgets, the stages'. Nothing is validated outside this tuple; the
# checks that need the code above config run from within them as hooks (prime_values/config/checks.py).
CHECKS = (LauncherConfig.check, CriticConfig.check, PolicyConfig.check, PolicyConfig.check_attention,
          TinyArch.check, AdvantageConfig.check, InferenceConfig.check, ReplayConfig.check, _check_task, _check_budget,
          _check_lora, ScheduleConfig.check, TopologyConfig.check, EvalConfig.check, WandbConfig.check, check_stages,
          SFTConfig.check)


