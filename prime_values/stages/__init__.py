"""A pipeline of stages: an experiment lists them (`stages: [sft, rl, eval]`), each starts from the model the one
before it produced, a finished stage is skipped when the experiment is rerun in the same run directory, and one
stage can run alone (`stage=eval policy.model=<dir>`). See docs/stages.md.

- `sft`  (`stages/sft.py`): supervised fine-tuning -> `<run>/stages/sft/model`;
- `rl`   (the conductor, unchanged): the asynchronous RL run at the run root -> its last `weights/policy/<n>`;
- `eval` (`stages/evaluate.py`): avg@n and pass@k on the task's held-out set -> `<run>/stages/eval/results.json`.

`sft` and `eval` are jobs like the roles (a local subprocess or an sbatch job, per `launcher`); `rl` is the
conductor itself. Each stage is done when `<run>/stages/<name>/done.json` exists, written atomically and last;
it records what the stage started from and its settings, so a rerun redoes a stage whose settings changed
(`rl` resumes when `steps` grew, and refuses to continue from a different model).
"""

from __future__ import annotations

import json
import signal
import sys
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from prime_values.budget import BudgetError, check_run_budget
from prime_values.conductor import conduct, wants_fork_server
from prime_values.config import STAGES, ConfigError, plan, prepare, validate
from prime_values.gguf import GGUFError, is_gguf, prepare as convert_gguf
from prime_values.launch.local import LocalLaunch
from prime_values.launch.zygote import ZygoteClient
from prime_values.rundir import RunDir
from prime_values.stages import evaluate, sft
from prime_values.stages.common import (
    MODEL_STAGES,
    StageFailed,
    StageInterrupted,
    StageStopped,
    mark_done,
    read_done,
    run_stage_job,
)
from prime_values.supervisor import Ending, Outcome

if TYPE_CHECKING:
    from prime_values.config import Config

__all__ = ["STAGES", "plan", "run_stages"]


# --- the pipeline ---------------------------------------------------------------------------------

def _plain(node) -> dict:
    return json.loads(json.dumps(OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else node))


def _task_key(cfg: Config) -> dict:
    """The task settings that change what a stage sees (not how the verifier pool or the cache are run)."""
    return {k: v for k, v in _plain(cfg.task).items() if not k.startswith("verifier_") and k != "data_cache_dir"}


def stage_key(name: str, cfg: Config, model: str, upstream: str | None) -> dict:
    """What a finished stage is valid for: its input model and the settings that shape its output."""
    key = {"input": model, "upstream": upstream}
    if name == "sft":
        key.update(sft=_plain(cfg.sft), task=_task_key(cfg), seed=cfg.seed,
                   arch=_plain(cfg.policy.arch) if model == "tiny" else None)
    elif name == "rl":
        key.update(steps=cfg.steps)
    else:
        key.update(eval=_plain(cfg.eval), task=_task_key(cfg), max_new_tokens=cfg.inference.max_new_tokens)
    return key


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _changed(old: dict, new: dict) -> list[str]:
    a, b = _flat(old), _flat(new)
    # a stage done before each task had its own config class recorded every task's keys: this task's count
    a = {k: v for k, v in a.items() if k in b or not k.startswith("task.")}
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def _num(value, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def describe(record: dict) -> str:
    """The one-line account of a finished stage."""
    f = record.get("figures", {})
    if record["stage"] == "sft":
        return (f"model {record['model']}, {f.get('steps')} steps, loss {_num(f.get('loss'))}, held-out accuracy "
                f"{_num(f.get('heldout_accuracy'))}")
    if record["stage"] == "rl":
        return (f"policy {record['model']}, {f.get('policy_steps')} steps, held-out accuracy "
                f"{_num(f.get('first_rl_step_accuracy'))} -> {_num(f.get('final_accuracy'))}")
    return ", ".join(f"{k} {v:.3f}" for k, v in f.items()) + f"; {record.get('results')}"


def _terminate(signum, frame):
    raise KeyboardInterrupt


def run_stages(cfg: Config) -> Outcome:
    """Run the stages of `cfg` in Hydra's output directory. The outcome's result holds each stage's done record;
    a failed stage (its cause printed) ends the pipeline there."""
    from hydra.core.hydra_config import HydraConfig

    try:
        validate(cfg)  # again here: multirun points come through here with their own values
    except ConfigError as error:
        return _bad_config(error)
    run = RunDir(HydraConfig.get().runtime.output_dir)
    # stage jobs (sft, eval) and the rl stage's roles fork from one fork server, started before the model is
    # prepared so its imports overlap the conversion and the token-budget check
    launch = LocalLaunch(ZygoteClient(run.root) if plan(cfg) != ["rl"] and wants_fork_server(cfg) else None)
    try:
        return _run_planned(run, cfg, launch)
    finally:
        launch.close()


def _bad_config(error: Exception) -> Outcome:
    print(f"prime_values: config error: {error}", file=sys.stderr, flush=True)
    return Outcome(Ending.BAD_CONFIG, str(error))


def _run_planned(run: RunDir, cfg: Config, launch: LocalLaunch) -> Outcome:
    try:
        _prepare_model(cfg)
    except (GGUFError, BudgetError) as error:
        return _bad_config(error)
    signal.signal(signal.SIGTERM, _terminate)
    model, upstream, records = cfg.policy.model, None, {}
    try:
        for name in plan(cfg):
            key = stage_key(name, cfg, model, upstream)
            done = read_done(run, name)
            record = None
            if done is not None:
                old = done.get("key", {})
                same_input = (old.get("input"), old.get("upstream")) == (key["input"], key["upstream"])
                if name == "rl" and not same_input:
                    raise StageFailed(f"stage rl already ran in {run.root} from {old.get('input')}, not from {model}; "
                                      "give this experiment a new run directory (hydra.run.dir=...) to start RL from "
                                      "the new model")
                if old == key or (name == "rl" and same_input and old.get("steps", 0) >= key["steps"]):
                    print(f"stage {name}: done ({describe(done)}), skipped", flush=True)
                    record = done
                elif name == "rl":
                    print(f"stage rl: done at {old.get('steps')} steps; steps={key['steps']} asks for more, resuming",
                          flush=True)
                else:
                    print(f"stage {name}: done earlier with other settings ({', '.join(_changed(old, key))}), "
                          "redoing", flush=True)
            if record is None:
                outcome = RUNNERS[name](run, cfg, model, upstream, key, launch)
                if outcome.ending is Ending.DETACHED:  # launcher.detach: a conductor job runs the rl stage
                    return Outcome(Ending.DETACHED, result={name: outcome.result})
                if outcome.failed:  # the rl stage: the conductor printed its cause
                    return Outcome(outcome.ending, outcome.cause, records)
                record = outcome.result
            records[name] = record
            if name in MODEL_STAGES:
                model, upstream = record["model"], f"{name}@{record['finished_at']}"
    except StageFailed as error:
        print(f"prime_values: {error}", file=sys.stderr, flush=True)
        return Outcome(Ending.INTERRUPTED if isinstance(error, StageInterrupted) else Ending.FAILED, str(error),
                       records)
    except StageStopped as stop:
        print(f"prime_values: {stop}", flush=True)
        return Outcome(Ending.STOPPED, str(stop), records)
    if len(plan(cfg)) > 1 or plan(cfg) != ["rl"]:
        print("stages: " + "; ".join(f"{n} done" for n in records), flush=True)
    return Outcome(Ending.FINISHED, result=records)


def _prepare_model(cfg: Config) -> None:
    """Before any job starts: a GGUF policy.model becomes its converted from_pretrained directory (converted once
    into policy.cache_dir, prime_values.gguf), so every stage and role, and `${policy.model}` wherever the config
    interpolates it, see a plain directory; and a local model's token budgets are checked against its tokenizer
    and the task's prompts (prime_values.budget). Bad input raises GGUFError or BudgetError (one line)."""
    if is_gguf(cfg.policy.model):
        cfg.policy.model = convert_gguf(cfg.policy.model, cfg.policy.cache_dir)
        print(f"policy.model: {cfg.policy.model}", flush=True)
    budget = check_run_budget(cfg)
    if budget is not None:
        print(f"token budget: longest prompt {budget['longest_prompt']}, privileged block {budget['longest_block']}, "
              f"prompt + block + inference.max_new_tokens = {budget['full_trace']} (critic.max_length="
              f"{cfg.critic.max_length})", flush=True)


def _run_sft(run, cfg: Config, model, upstream, key, launch) -> Outcome:
    stage_cfg = prepare(cfg)  # as the conductor prepares the rl stage's config
    stage_cfg.policy.model = model
    print(f"stage sft: fine-tuning {model} -> {run.root}/stages/sft/model", flush=True)
    result = run_stage_job(run, stage_cfg, "sft", sft.main, stage_cfg.topology.policy_trainer_device, launch)
    record = mark_done(run, "sft", {"key": key, "model": result["model"], "figures": result["figures"]})
    print(f"stage sft: finished ({describe(record)})", flush=True)
    return Outcome(Ending.FINISHED, result=record)


def _run_rl(run, cfg: Config, model, upstream, key, launch) -> Outcome:
    rl_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    rl_cfg.policy.model = model
    if upstream is not None:
        rl_cfg.policy.warm_start.steps = 0  # the stage before already fine-tuned it
        print(f"stage rl: starts from {model} ({upstream.split('@')[0]} stage; policy.warm_start.steps=0)", flush=True)
    outcome = conduct(rl_cfg, launch)
    if outcome.ending is Ending.DETACHED or outcome.failed:
        return outcome  # detached: the conductor job runs it; a rerun after it finished marks the stage done
    summary = outcome.result
    figures = {k: summary.get(k) for k in ("policy_steps", "warm_start_accuracy", "first_rl_step_accuracy",
                                           "final_accuracy", "final_reward_mean", "final_explained_variance",
                                           "critic_version", "wall_s")}
    record = mark_done(run, "rl", {"key": key, "model": summary["policy_weights"], "figures": figures,
                                   "summary": str(run.report / "summary.json")})
    return Outcome(Ending.FINISHED, result=record)


def _run_eval(run, cfg: Config, model, upstream, key, launch) -> Outcome:
    stage_cfg = prepare(cfg)  # as the conductor prepares the rl stage's config
    stage_cfg.policy.model = model
    results = run_stage_job(run, stage_cfg, "eval", evaluate.main, stage_cfg.topology.inference_device, launch)
    print(evaluate.format_table(results), flush=True)
    path = run.root / "stages" / "eval" / "results.json"
    return Outcome(Ending.FINISHED, result=mark_done(run, "eval", {"key": key, "model": model,
                                                                    "figures": results["metrics"],
                                                                    "results": str(path)}))


RUNNERS = {"sft": _run_sft, "rl": _run_rl, "eval": _run_eval}
