"""`stages`, `stage`, `sft.*` and `eval.*`: which stages run, and the settings of the sft and eval stages
(stages: [sft, rl, eval]; docs/stages.md). Their rules (`check_stages`, `SFTConfig.check`, `EvalConfig.check`)
are config checks like every section's (root.CHECKS); whether sft.data can be found is the `sft.data` hook
(prime_values/tasks/checks.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from prime_values.config.base import ConfigError, free, ranged
from prime_values.config.checks import declare, run_check

STAGES = ("sft", "rl", "eval")

SFT_DATA_CHECK = declare("sft.data", "sft.data (a file, directory or hub dataset name) can be found",
                         "prime_values/tasks/checks.py")


def plan(cfg) -> list[str]:
    """The stages this command runs, in order."""
    return [cfg.stage] if cfg.get("stage") else list(cfg.stages)


def check_stages(cfg, environment: bool) -> None:
    """Stage names, what the first stage starts from, and launcher.detach (one rl stage only)."""
    names = list(cfg.stages)
    for i, name in enumerate(names):
        if name not in STAGES:
            raise ConfigError(f"stages[{i}]={name!r} is not a stage; list stages from {', '.join(STAGES)}, e.g. "
                              "stages=[sft,rl,eval]")
    for name in set(names):
        if names.count(name) > 1:
            raise ConfigError(f"stages={names} runs {name!r} twice; list each stage once")
    if cfg.stage is not None and cfg.stage not in STAGES:
        raise ConfigError(f"stage={cfg.stage!r} is not a stage; choose one of {', '.join(STAGES)} (or leave stage "
                          f"unset to run stages={names})")
    if not names and cfg.stage is None:
        raise ConfigError("stages is empty; list at least one of sft, rl, eval, e.g. stages=[rl,eval]")
    run = plan(cfg)
    if cfg.launcher.detach and run != ["rl"]:
        raise ConfigError(f"launcher.detach=true detaches the rl stage only, but this runs stages {run}; run them "
                          "attached, or detach `stage=rl` and run the others after it")
    if run[0] == "eval" and cfg.policy.model == "tiny":
        how = "stage=eval" if cfg.stage else "stages starting with eval"
        raise ConfigError(f"{how} evaluates policy.model, which is 'tiny' (an untrained model); set policy.model=<a "
                          "from_pretrained directory, e.g. <run>/weights/policy/<step> or <run>/stages/sft/model>")


@dataclass
class SFTConfig:
    """The `sft` stage (stages: [sft, ...]): supervised fine-tuning of policy.model into
    `<run>/stages/sft/model`, which the next stage starts from."""

    data: str = ""
    """'task': the task's own reference solutions; else a local .jsonl/.json/.parquet/.csv file or directory,
    or a hub dataset name, whose rows have prompt + completion (or response) columns, or question/problem rows
    in the math task's formats (GSM8K, MATH); set this or from_run"""
    split: str = "train"
    """split of a hub dataset in `data` (a local file is its own split)"""
    data_config: Optional[str] = None
    """hub dataset config name of `data` ('main' for openai/gsm8k)"""
    from_run: str = ""
    """an earlier run directory whose rollout log supplies the examples instead: its rollouts with reward >=
    min_reward (rejection sampling; each distinct prompt + response once)"""
    min_reward: float = free(1.0, "rewards are the task's own scale: any threshold selects some rollouts")
    """from_run: keep rollouts whose reward is at least this"""
    steps: int = ranged(100, ">= 1")
    """SFT optimizer steps (batches drawn with replacement from the examples)"""
    batch_size: int = ranged(32, ">= 1")
    """examples per SFT step"""
    lr: float = ranged(1e-5, "> 0")
    """SFT learning rate (AdamW, linear warm-up over warmup_steps, then constant)"""
    warmup_steps: int = ranged(10, ">= 0")
    """steps of linear learning-rate warm-up"""
    max_length: int = ranged(1024, ">= 1")
    """examples longer than this many tokens (prompt + response + eos) are dropped and counted"""
    target_accuracy: float = ranged(0.0, ("in [0, 1]", " (0 = run all sft.steps)"))
    """stop early once greedy accuracy on val_size fixed training problems of the task (never held-out ones)
    reaches this, checked every check_every steps (0 = run all steps)"""
    check_every: int = ranged(25, ">= 1")
    """SFT steps between target_accuracy checks"""
    val_size: int = ranged(64, ">= 1")
    """training problems in the target_accuracy check"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        """When the sft stage runs: one data source, and it exists here (cheap: no data set is loaded)."""
        sft = cfg.sft
        if "sft" not in plan(cfg):
            return
        if sft.data and sft.from_run:
            raise ConfigError(f"sft.data={sft.data!r} and sft.from_run={sft.from_run!r} are both set; keep one")
        if not sft.data and not sft.from_run:
            raise ConfigError("the sft stage has no data: set sft.data=task (the task's reference solutions), "
                              "sft.data=<.jsonl/.parquet file or hub dataset name>, or sft.from_run=<run dir> "
                              "(with sft.min_reward)")
        if not environment:
            return
        if sft.from_run:
            if not (Path(sft.from_run).expanduser() / "log" / "rollouts").is_dir():
                raise ConfigError(f"sft.from_run={sft.from_run!r} has no log/rollouts; point it at the run directory "
                                  "of an earlier run")
        elif sft.data != "task":
            run_check(SFT_DATA_CHECK, cfg, environment)  # found as the math task finds its data


@dataclass
class EvalConfig:
    """The `eval` stage: avg@n and unbiased pass@k (Chen et al. 2021) on the task's held-out set."""

    samples: int = ranged(8, ">= 1")
    """n: completions sampled per held-out prompt"""
    k: List[int] = field(default_factory=lambda: [1, 4, 8])
    """the k of each pass@k reported (each <= samples)"""
    temperature: float = ranged(1.0, (">= 0", " (0 = greedy)"))
    """sampling temperature (0 = greedy; then samples should be 1)"""
    max_new_tokens: int = ranged(0, ">= 0")
    """generation cap per completion (0 = inference.max_new_tokens)"""
    batch_size: int = ranged(256, ">= 1")
    """completions decoded together"""

    @staticmethod
    def check(cfg, environment: bool) -> None:
        ev = cfg.eval
        if not list(ev.k):
            raise ConfigError("eval.k is empty; list the k of each pass@k, e.g. eval.k=[1,4,8]")
        for k in ev.k:
            if not 1 <= k <= ev.samples:
                raise ConfigError(f"eval.k contains {k}, but pass@k needs 1 <= k <= eval.samples={ev.samples}; raise "
                                  f"eval.samples or drop {k}")
