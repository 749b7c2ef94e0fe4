"""Structured configuration: every knob is a typed dataclass field with its documented default and its rules.

One module per section (`policy`, `critic`, `replay`, `advantage`, `topology`, `task`, `inference`, `schedule`,
`launcher`, `log`, `stages`, `wandb`; `root` holds `Config`); the string literal under each field is its
documentation (CleanRL style), and `docs/configuration.md` is generated from them (`python -m prime_values.config`).
A field's rules sit beside it as metadata (`base.choice`, `base.ranged`), checked generically; each section's
cross-field checks are a `check(cfg, environment)` beside its fields. Hydra composes the YAML groups under `conf/`
on top of `Config` (and of the task's own class, `task.py`), so an unknown key or a wrong type fails at
composition time; `validate` runs every rule and check (`CHECKS` in root.py: the sections', the task's, the
embedded model's token budgets, the stages'), and `prepare` makes the config a run saves. The facts derived from
the keys (`derived.py`) are resolved once when the run is prepared and saved with it.

This package is the bottom layer: it imports nothing of prime_values outside it but the estimator registry
(prime_values.algo.estimators) and prime_values.importpath, which import nothing of prime_values themselves. The
checks that need the code above it (a task built, a data set or GGUF file found, the SLURM layout, the embedded
model's token budgets) are hooks (`checks.py`): declared here where they run, registered by the modules that know
how, all of them imported by prime_values.launch.checks.
"""

from omegaconf import MISSING  # re-exported for conf authors

from prime_values.config.advantage import AdvantageConfig
from prime_values.config.base import ConfigError, check_fields, choice, free, ranged
from prime_values.config.checks import HOOKS, register_check
from prime_values.config.critic import CriticConfig, CriticWarmStartConfig, WarmupConfig
from prime_values.config.derived import Resolved, derive, resolve
from prime_values.config.docs import DOC_HEADER, configuration_doc, field_docs, markdown_reference
from prime_values.config.inference import InferenceConfig
from prime_values.config.launcher import LauncherConfig
from prime_values.config.log import LogConfig
from prime_values.config.policy import LoraSettings, PolicyConfig, TinyArch, WarmStartConfig
from prime_values.config.replay import ReplayConfig
from prime_values.config.root import (
    CHECKS,
    CONF_DIR,
    Config,
    compose,
    load_saved,
    prepare,
    register,
    schema,
    task_class,
    validate,
    validating_once,
)
from prime_values.config.schedule import ScheduleConfig
from prime_values.config.stages import STAGES, EvalConfig, SFTConfig, check_stages, plan
from prime_values.config.task import (
                                      TASK_CONFIGS,
                                      ArithTaskConfig,
                                      MathTaskConfig,
                                      ReasoningGymTaskConfig,
                                      ReverseTextTaskConfig,
                                      TaskConfig,
                                      VerifiersTaskConfig,
)
from prime_values.config.topology import TopologyConfig
from prime_values.config.wandb import WANDB_MODES, WandbConfig, check_wandb

__all__ = ["AdvantageConfig", "ArithTaskConfig", "CHECKS", "CONF_DIR", "HOOKS", "Config", "ConfigError", "CriticConfig",
           "CriticWarmStartConfig", "DOC_HEADER", "EvalConfig", "InferenceConfig", "LauncherConfig", "LogConfig",
           "LoraSettings", "MISSING", "MathTaskConfig", "PolicyConfig", "ReasoningGymTaskConfig", "ReplayConfig",
           "Resolved", "ReverseTextTaskConfig", "SFTConfig", "STAGES", "ScheduleConfig", "TASK_CONFIGS", "TaskConfig",
           "TinyArch", "TopologyConfig", "VerifiersTaskConfig", "WANDB_MODES", "WandbConfig", "WarmStartConfig",
           "WarmupConfig", "check_fields", "check_stages", "check_wandb", "choice", "compose",
           "configuration_doc", "derive",
           "field_docs", "free", "load_saved", "markdown_reference", "plan", "prepare", "ranged", "register",
           "register_check", "resolve", "schema", "task_class", "validate", "validating_once"]
