"""Prime Values against Hugging Face TRL's GRPOTrainer on the same work, on the same machine, one cell after the
other: the same start policy (a run's weights/policy/0, its tensor digest recorded), task, verifier, rollout budget,
loss, optimiser, precision and held-out evaluation (docs/benchmarks.md, "Versus TRL").

    pip install -e '.[peer]'                                       # TRL, pinned (never a core dependency)
    python -m bench.versus_trl --seeds 0,1,2,3,4                    # the README task, 100 steps, 3 cells a seed
    python -m bench.versus_trl --seeds 0 --steps 5 --records /tmp/vt # a smoke, records kept out of the repository
    python -m bench.versus_trl --seeds 0,1,2,3,4 --micro-batch 32   # 4 forward/backwards a step on both sides
    python -m bench.versus_trl --seeds 0,1,2 --cells trl,readme --readme-overrides 'replay.ratio=0.5'
                                                                    # the README cell with a cheaper critic
    python -m bench.versus_trl --report                             # table, ratios and the plot from the records
    python -m bench.versus_trl --smollm --seeds 0                   # the SmolLM2 recipe's step time (minutes a step)
    bash bench/versus_trl_gpu.sh                                    # on a lent GPU: --gpu, vLLM on both sides

Cells (`--cells`, default all of the mode's):
- `trl`: TRL's GRPOTrainer in a process of its own with `--threads` torch threads (default 2), loading the start
  policy with from_pretrained, its prompts the task's training prompts (the project's own text, tokenised without
  special tokens as the project does: checked before training), rewarded by the task's own verifier
  (`task.score_many`), held-out accuracy by the project's `prime_values.rollout.greedy_accuracy` every `eval_every`
  steps from a TrainerCallback whose time is left out of TRL's RL wall;
- `grpo`: `python -m prime_values +experiment=<e> advantage=grpo ...` (the real CLI);
- `readme`: the README run (privileged critic, gae; critic pretraining is part of its command).
Both project cells start RL from the start policy (`policy.model=<start> policy.warm_start.steps=0`: the warm start
loads it, publishes it as version 0 unchanged, checked by digest, and skips SFT). The start policy is made once by a
one-step grpo run of the experiment (`policy.warm_start.seed=0`: every seed starts from the same weights, so the
spread over seeds is RL's own) under `<out>/warm_start/`, reused by a rerun; its SFT time is charged to every cell's
user wall. The order of the cells rotates with the seed (seed S starts with cell S mod 3).

Every setting either side takes comes from one `Work` (`project_overrides`, `trl_arguments`); where the two
systems still differ is written in `DIFFERENCES` and the docs. Walls per cell: `rl_wall_s` (the RL loop with the
held-out evaluations left out: TRL from the end of its step-0 evaluation to its last step's end less the
evaluations between; the project the policy trainer's step_wait_s + train_s summed over its steps), `wall_s` (the
cell's command, evaluations included) and `user_wall_s` (wall_s + the shared SFT), and per step: TRL's generation
(model.generate; `gen_score_s` adds rewards and advantages), forward+loss, backward and optimizer, timed by wrapping
the trainer's methods and by callbacks; the project's policy-trainer train/wait times, timers and the other roles'
compute/wait/io. The load average is recorded at each cell's start and end: figures taken beside other jobs are
provisional.

Records: `bench/records/versus_trl/<label>/<cell>/seed<S>.json` (label `arith`, or `smollm`; `--label` to keep
another set), stamped (bench.common.stamp) with torch, transformers and trl versions; a rerun skips a cell whose
record exists for the same work (`--force` reruns it). `--report` (and the end of every run) prints the table, the
project/TRL ratios per seed and their mean with a t-interval over seeds (a bootstrap only from 8 pairs), and writes
`curve.png` beside the records (held-out accuracy against RL wall seconds).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import common
from bench.common import ROOT

RECORDS = common.RECORDS / "versus_trl"
TRL_VERSION = "1.16.0"  # pyproject's `peer` extra pins it


@dataclass(frozen=True)
class Work:
    """The work both systems do, each setting once (the project's key and TRL's argument it becomes)."""

    experiment: str = "arith"       # +experiment=<this>: the task and the project's recipe
    steps: int = 100                # steps= / max_steps
    prompts: int = 64               # inference.prompts_per_step / unique prompts per optimizer step
    group: int = 2                  # inference.group_size / num_generations
    new_tokens: int = 8             # inference.max_new_tokens / max_completion_length
    temperature: float = 1.0        # inference.temperature / temperature
    lr: float = 1e-4                # policy.lr / learning_rate (constant: policy.lr_decay_steps=0 / "constant")
    clip: float = 0.2               # policy.clip_low, clip_high / epsilon, epsilon_high
    max_grad_norm: float = 1.0      # policy.max_grad_norm / max_grad_norm
    precision: str = "float32"      # policy.dtype / bf16 (bf16-mixed: autocast on both)
    micro_batch: int = 0            # policy.micro_batch_rollouts / per_device_train_batch_size (0 = the whole batch)
    eval_every: int = 10            # eval_every / the callback's period
    cells: tuple = ("trl", "grpo", "readme")
    step_window: tuple = (1, 100)   # the steps whose median step time is reported
    device: str = "cpu"             # every role's device (topology=gpu1, inference=vllm) / TRL's (use_vllm colocated)
    readme_extra: tuple = ()        # the README cell's own overrides (its critic's cost: replay.ratio=0.5, ...)

    @property
    def rollouts_per_step(self) -> int:
        return self.prompts * self.group


ARITH = Work()
SMOLLM = Work(experiment="smollm", steps=12, prompts=16, group=2, new_tokens=96, temperature=0.7, lr=2e-5,
              precision="bf16-mixed", micro_batch=8, eval_every=12, cells=("trl", "grpo"), step_window=(3, 12))
# the same recipe on one GPU (bench/versus_trl_gpu.sh): vLLM generates on both sides (the project's inference=vllm,
# TRL's use_vllm in colocate mode), each side's trainer on the same GPU, a step of 32 x 4 rollouts of up to 256 tokens
GPU = Work(experiment="smollm", steps=30, prompts=32, group=4, new_tokens=256, temperature=0.7, lr=2e-5,
           precision="bf16-mixed", micro_batch=0, eval_every=10, cells=("trl", "grpo"), step_window=(3, 30),
           device="cuda:0")
VLLM_MEMORY = 0.3  # each side's vLLM share of the GPU's memory (the trainer and, for the project, the roles share it)

DIFFERENCES = [
    "schedule: the project is asynchronous (inference generates up to schedule.max_off_policy = 1 step ahead of the "
    "policy trainer, its roles in processes of their own sharing the cores); TRL generates, scores and trains one "
    "after the other in one process",
    "importance ratio: the project's is against the sampler's own logprobs (off by up to one version, and by "
    "numerics); TRL's, with num_iterations = 1 and no gradient accumulation across generations, is exactly 1 "
    "(old logprobs are the detached current ones), so its clip never acts",
    "prompts: the same task's training stream, drawn by different generators (the project per inference chunk, "
    "TRL from one list drawn with the seed, in order): the same distribution, not the same problems",
    "sampling: the project's own sampler (models.sampling, multinomial at the temperature); TRL's model.generate "
    "(do_sample, top_p 1, top_k 0); neither truncates the distribution",
    "extra work per project step: the policy trainer's no-grad forward after each step (direction diagnostic) and "
    "publishing each version to disk for the other roles",
    "threads: TRL's process runs --threads torch threads; the project's roles pick their own (topology=cpu)",
    "evaluation pauses: while the project's trainer evaluates, inference may generate the next chunk (at most one "
    "chunk per evaluation), time the project's RL wall does not count; TRL does nothing during its evaluations",
]


# ----------------------------------------------------------------------------------------- one setting, two sides
def project_overrides(work: Work, cell: str, seed: int, policy_dir: Path | str) -> list[str]:
    """The CLI overrides of a project cell (`python -m prime_values <these> hydra.run.dir=<run>`)."""
    if cell not in ("grpo", "readme"):
        raise ValueError(f"project cell {cell!r}: choose grpo or readme")
    return [f"+experiment={work.experiment}", *(["advantage=grpo"] if cell == "grpo" else []), f"seed={seed}",
            f"policy.model={policy_dir}", "policy.warm_start.steps=0", f"steps={work.steps}",
            f"eval_every={work.eval_every}", "time_budget_min=0", f"inference.prompts_per_step={work.prompts}",
            f"inference.group_size={work.group}", f"inference.max_new_tokens={work.new_tokens}",
            f"inference.temperature={work.temperature}", f"policy.lr={work.lr}", "policy.lr_decay_steps=0",
            "policy.weight_decay=0.0", f"policy.max_grad_norm={work.max_grad_norm}", "policy.trust_region=clip",
            f"policy.clip_low={work.clip}", f"policy.clip_high={work.clip}", "policy.kl_coef=0.0",
            f"policy.dtype={work.precision}", f"policy.micro_batch_rollouts={work.micro_batch}",
            "policy.activation_checkpointing=false", "advantage.grpo_std=false", "advantage.whiten=false",
            "log.plots=false", *device_overrides(work), *(work.readme_extra if cell == "readme" else ())]


def device_overrides(work: Work) -> list[str]:
    """A GPU work's: every role on it (topology=gpu1), vLLM sampling with its share of the memory."""
    if work.device == "cpu":
        return []
    return ["topology=gpu1", f"topology.inference_device={work.device}", f"topology.evaluator_device={work.device}",
            f"topology.policy_trainer_device={work.device}", f"topology.value_trainer_device={work.device}",
            "inference=vllm", f"+inference.vllm_args.gpu_memory_utilization={VLLM_MEMORY}"]


def warm_start_overrides(work: Work) -> list[str]:
    """The one-step grpo run whose weights/policy/0 is every cell's start policy (the experiment's own SFT)."""
    return [f"+experiment={work.experiment}", "advantage=grpo", "steps=1", "eval_every=1", "time_budget_min=0",
            f"inference.prompts_per_step={work.prompts}", f"inference.group_size={work.group}",
            "log.plots=false", "policy.warm_start.seed=0",  # grpo needs the work's groups (the recipe's are of 1)
            *device_overrides(work)]


def trl_arguments(work: Work, seed: int, output_dir: Path | str) -> dict:
    """GRPOConfig's keywords for the same work: one optimizer step = `prompts` x `group` completions, PPO-clip at
    `clip` with no KL (beta 0), token-mean over the batch (loss_type dapo: the sum over the step's completion
    tokens over their count, as the project's ppo_clip_loss; with one process and no accumulation bnpo is the
    same), advantages R - mean(R of the group) unscaled (scale_rewards none = the project's grpo_std=false),
    AdamW (torch) at a constant lr, no weight decay, clip 1.0, no bf16 unless the work says so, no gradient
    checkpointing, nothing reported to a hub; on a GPU, generation by vLLM colocated with the trainer."""
    per_step = work.rollouts_per_step
    micro = work.micro_batch or per_step
    if per_step % micro:
        raise ValueError(f"micro batch {micro} does not divide the {per_step} rollouts of a step")
    return dict(output_dir=str(output_dir), seed=seed, max_steps=work.steps, per_device_train_batch_size=micro,
                gradient_accumulation_steps=per_step // micro, num_generations=work.group,
                max_completion_length=work.new_tokens, temperature=work.temperature, top_p=1.0, top_k=0,
                repetition_penalty=1.0, beta=0.0, num_iterations=1, epsilon=work.clip, epsilon_high=work.clip,
                loss_type="dapo", scale_rewards="none", importance_sampling_level="token",
                mask_truncated_completions=False, learning_rate=work.lr, lr_scheduler_type="constant",
                warmup_steps=0, weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,
                optim="adamw_torch", max_grad_norm=work.max_grad_norm, bf16=work.precision == "bf16-mixed",
                fp16=False, gradient_checkpointing=False, use_cpu=work.device == "cpu", report_to="none",
                save_strategy="no", **({} if work.device == "cpu" else {
                    "use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": VLLM_MEMORY}),
                logging_steps=work.eval_every, disable_tqdm=True, shuffle_dataset=False, remove_unused_columns=False,
                dataloader_num_workers=0, log_completions=False)


def tensor_digest(model_dir: Path | str) -> str:
    """SHA-256 (16 hex digits) over a from_pretrained directory's tensors: names, dtypes, shapes and bytes, in name
    order (the same weights saved twice give the same digest, whatever the file's metadata)."""
    import torch
    from safetensors.torch import load_file

    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).glob("*.safetensors")):
        tensors = load_file(str(path))
        for name in sorted(tensors):
            t = tensors[name].contiguous()
            digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
            digest.update(t.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for name in ("torch", "transformers", "trl", "accelerate", "datasets"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def environment(threads: int | None = None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT),
           "TOKENIZERS_PARALLELISM": "false"}
    if threads:
        env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
    return env


# -------------------------------------------------------------------------------------------- the start policy
def warm_start(work: Work, out: Path) -> dict:
    """The start policy (made unless `<out>/warm_start/<experiment>/weights/policy/0` exists) and what it cost."""
    run = out / "warm_start" / work.experiment
    policy = run / "weights" / "policy" / "0"
    wall = None
    if not (policy / "config.json").is_file():
        if run.exists():
            import shutil
            shutil.rmtree(run)
        command = [sys.executable, "-m", "prime_values", *warm_start_overrides(work), f"hydra.run.dir={run}"]
        print("warm start:", " ".join(command[1:]), flush=True)
        began = time.time()
        subprocess.run(command, cwd=ROOT, env=environment(), check=True)
        wall = time.time() - began
    warm = {k: v for m in common.metrics(run, "warm_start") for k, v in m.items()}
    return {"policy": str(policy), "digest": tensor_digest(policy), "sft_s": warm.get("sft_s"),
            "sft_steps": warm.get("sft_step"), "sft_heldout_accuracy": warm.get("heldout_accuracy"),
            "warm_start_run_wall_s": wall, "command": ["python", "-m", "prime_values", *warm_start_overrides(work)]}


# ------------------------------------------------------------------------------------------------ project cells
def project_cell(work: Work, cell: str, seed: int, start: dict, out: Path) -> dict:
    from bench.readme_run import record as run_record

    run = out / work.experiment / cell / f"seed{seed}"
    if run.exists():  # a cell cut off: run it again from the start
        import shutil
        shutil.rmtree(run)
    overrides = project_overrides(work, cell, seed, start["policy"])
    command = [sys.executable, "-m", "prime_values", *overrides, f"hydra.run.dir={run}"]
    load_start, began = load(), time.time()
    subprocess.run(command, cwd=ROOT, env=environment(), check=True)
    wall = time.time() - began
    load_end = load()
    base = run_record(run, cell, seed, wall)
    trainer = [m for m in common.metrics(run, "policy_trainer")]
    steps = [m for m in trainer if "train_s" in m]
    evals = [m for m in trainer if "heldout_accuracy" in m]
    # the RL loop, evaluations left out: the trainer's wait for each batch plus its step, summed (each wait starts
    # after the evaluation before it)
    elapsed, curve, at = 0.0, [], {}
    for m in steps:
        elapsed += m["step_wait_s"] + m["train_s"]
        at[m["step"]] = elapsed
    curve = [[m["step"], round(at.get(m["step"], 0.0), 3), m["heldout_accuracy"]] for m in evals]
    window = [m for m in steps if work.step_window[0] <= m["step"] <= work.step_window[1]]
    inference = [m for role, rows in metrics_by_role(run).items() if role.startswith("inference") for m in rows
                 if "gen_s" in m]
    orchestrator = [m for m in common.metrics(run, "orchestrator") if "time" in m]
    digest = tensor_digest(run / "weights" / "policy" / "0")
    per_step = {"train_s": median([m["train_s"] for m in window]),
                "step_wait_s": median([m["step_wait_s"] for m in window]),
                "step_s": median([m["train_s"] + m["step_wait_s"] for m in window]),
                "inference_gen_s": median([m["gen_s"] for m in inference]),
                "inference_chunks": len(inference), "orchestrator_records": len(orchestrator)}
    return {**base, "system": "prime_values", "cell": cell, "command": ["python", "-m", "prime_values", *overrides],
            "wall_s": wall, "rl_wall_s": round(elapsed, 3), "curve": curve, "per_step": per_step,
            "evals_s": sum(m.get("heldout_s", 0.0) for m in evals),
            "start_accuracy": evals[0]["heldout_accuracy"] if evals else None,
            "final_accuracy": evals[-1]["heldout_accuracy"] if evals else None,
            "start_digest": digest, "start_digest_matches": digest == start["digest"],
            "load_avg_start": load_start, "load_avg_end": load_end}


def metrics_by_role(run: Path) -> dict[str, list[dict]]:
    return {p.stem: common.metrics(run, p.stem) for p in sorted((run / "metrics").glob("*.jsonl"))}


# ----------------------------------------------------------------------------------------------------- TRL cell
def trl_cell(work: Work, seed: int, start: dict, out: Path, threads: int) -> dict:
    """TRL in a process of its own (its threads set before torch starts), its record back through a file."""
    result = out / work.experiment / "trl" / f"seed{seed}.json"
    result.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    spec = {"work": dataclasses.asdict(work), "seed": seed, "policy": start["policy"], "threads": threads,
            "output_dir": str(out / work.experiment / "trl" / f"seed{seed}"), "result": str(result)}
    command = [sys.executable, "-m", "bench.versus_trl", "--trl-cell", json.dumps(spec)]
    load_start, began = load(), time.time()
    subprocess.run(command, cwd=ROOT, env=environment(threads), check=True)
    wall = time.time() - began
    rec = json.loads(result.read_text())
    return {**rec, "wall_s": wall, "load_avg_start": load_start, "load_avg_end": load(),
            "command": ["python", "-m", "bench.versus_trl", "--trl-cell", "<spec>"], "spec": spec}


def run_trl(spec: dict) -> dict:
    """The TRL cell's body (in its own process): GRPOTrainer on the work, timed, evaluated by the project."""
    import torch

    threads = spec["threads"]
    torch.set_num_threads(threads)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from prime_values.rollout import encode_prompts, greedy_accuracy
    from prime_values.tasks import make_task
    from prime_values.tasks.pool import training_prompts

    work = Work(**{k: tuple(v) if isinstance(v, list) else v for k, v in spec["work"].items()})
    seed, policy = spec["seed"], spec["policy"]
    cfg = common.compose(project_overrides(work, "grpo", seed, policy))  # the project's task, exactly
    task = make_task(**cfg.task)
    heldout = task.heldout()
    pool = training_prompts(task, cfg.task.train_pool, cfg.task.seed)
    problems = pool.sample(random.Random(f"versus-trl-{seed}"), work.steps * work.prompts)
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "problem": list(range(len(problems)))})

    def verifier(prompts, completions, problem, **_):
        return [float(r) for r in task.score_many([problems[i] for i in problem], completions)]

    bf16 = work.precision == "bf16-mixed"
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32, attn_implementation="sdpa")
    tokenizer = AutoTokenizer.from_pretrained(policy)
    if tokenizer.pad_token_id is None:  # as the project's ensure_pad_token
        tokenizer.pad_token = tokenizer.unk_token if tokenizer.unk_token is not None and \
            tokenizer.unk_token_id != tokenizer.eos_token_id else tokenizer.eos_token
    args = GRPOConfig(**trl_arguments(work, seed, spec["output_dir"]))

    clock = {"evals": [], "eval_s": 0.0, "steps": [], "t0": None, "end": None}
    parts = {"generate_s": 0.0, "gen_score_s": 0.0, "forward_loss_s": 0.0, "backward_s": 0.0, "optimizer_s": 0.0}

    def timed(fn, key):
        def wrapper(*a, **k):
            began = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                parts[key] += time.perf_counter() - began
        return wrapper

    def evaluate(trainer_model, step: int) -> None:
        began = time.perf_counter()
        was_training = trainer_model.training
        context = torch.autocast(torch.device(work.device).type, dtype=torch.bfloat16) if bf16 else _null()
        with context:
            accuracy = greedy_accuracy(trainer_model.eval(), tokenizer, task, heldout, work.new_tokens)
        trainer_model.train(was_training)
        took = time.perf_counter() - began
        clock["eval_s"] += took
        rl = 0.0 if clock["t0"] is None else time.perf_counter() - clock["t0"] - clock["eval_s"]
        clock["evals"].append([step, round(rl, 3), accuracy, round(took, 3)])
        print(f"trl: step {step} held-out {accuracy:.3f} (rl {rl:.1f} s, eval {took:.1f} s)", flush=True)

    class Clock(TrainerCallback):
        def on_train_begin(self, a, state, control, model=None, **kw):
            evaluate(model, 0)
            clock["eval_s"] = 0.0
            clock["evals"][-1][1] = 0.0
            clock["t0"] = time.perf_counter()

        def on_step_begin(self, a, state, control, **kw):
            clock["step_began"] = time.perf_counter()
            clock["parts_before"] = dict(parts)

        def on_pre_optimizer_step(self, a, state, control, **kw):
            clock["opt_began"] = time.perf_counter()

        def on_optimizer_step(self, a, state, control, **kw):
            parts["optimizer_s"] += time.perf_counter() - clock["opt_began"]

        def on_step_end(self, a, state, control, model=None, **kw):
            now = time.perf_counter()
            row = {"step": state.global_step, "step_s": now - clock["step_began"],
                   **{k: parts[k] - clock["parts_before"][k] for k in parts}}
            clock["steps"].append(row)
            clock["end"] = now
            if state.global_step % work.eval_every == 0 or state.global_step == work.steps:
                evaluate(model, state.global_step)

    trainer = GRPOTrainer(model=model, reward_funcs=verifier, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[Clock()])
    # the prompts TRL generates from are the project's own tokens (no special tokens added)
    sample = [p.prompt for p in problems[:64]]
    if trainer.processing_class(text=sample)["input_ids"] != encode_prompts(tokenizer, problems[:64]):
        raise SystemExit("TRL tokenises the prompts differently from the project (special tokens?)")
    trainer._generate_single_turn = timed(trainer._generate_single_turn, "generate_s")
    trainer._generate_and_score_completions = timed(trainer._generate_and_score_completions, "gen_score_s")
    trainer.compute_loss = timed(trainer.compute_loss, "forward_loss_s")
    trainer.accelerator.backward = timed(trainer.accelerator.backward, "backward_s")
    began = time.time()
    trainer.train()
    train_call_s = time.time() - began
    rl_wall = clock["end"] - clock["t0"] - sum(e[3] for e in clock["evals"][1:] if e[0] < work.steps)
    window = [s for s in clock["steps"] if work.step_window[0] <= s["step"] <= work.step_window[1]]
    per_step = {k: median([s[k] for s in window]) for k in ("step_s", *parts)}
    per_step["other_s"] = per_step["step_s"] - sum(per_step[k] for k in ("gen_score_s", "forward_loss_s",
                                                                          "backward_s", "optimizer_s"))
    evals = clock["evals"]
    record = {"system": "trl", "cell": "trl", "seed": seed, "threads": threads,
              "torch_threads": torch.get_num_threads(), "rl_wall_s": round(rl_wall, 3), "train_call_s": train_call_s,
              "evals_s": sum(e[3] for e in evals),
              "curve": [e[:3] for e in evals], "per_step": per_step, "steps_timed": clock["steps"],
              "start_accuracy": evals[0][2], "final_accuracy": evals[-1][2], "gain": evals[-1][2] - evals[0][2],
              "start_digest": tensor_digest(policy), "trl_arguments": trl_arguments(work, seed, spec["output_dir"]),
              "policy_steps": trainer.state.global_step}
    Path(spec["result"]).write_text(json.dumps(record, default=str))
    return record


class _null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


# -------------------------------------------------------------------------------------------------- the grid
def same_work(work: dict | None) -> dict | None:
    """What makes two records' work the same (which cells ran beside it does not; a record made before
    `readme_extra` existed had none)."""
    return None if work is None else {k: v for k, v in work.items()
                                      if k != "cells" and not (k == "readme_extra" and not v)}


def record_path(records: Path, label: str, cell: str, seed: int) -> Path:
    return records / label / cell / f"seed{seed}.json"


def run_grid(work: Work, seeds: list[int], cells: list[str], label: str, records: Path, out: Path, threads: int,
             force: bool) -> None:
    start = warm_start(work, out)
    print(f"start policy {start['policy']} (digest {start['digest']}, SFT {start['sft_s'] or 0:.0f} s)", flush=True)
    for seed in seeds:
        order = [cells[(seed + i) % len(cells)] for i in range(len(cells))]
        for cell in order:
            path = record_path(records, label, cell, seed)
            old = common.read_json(path)
            if old is not None and not force:
                if same_work(old.get("work")) != same_work(json.loads(json.dumps(dataclasses.asdict(work)))):
                    raise SystemExit(f"{path} holds other work; use another --label or --force")
                print(f"{label} {cell} seed {seed}: recorded already (--force reruns it)", flush=True)
                continue
            print(f"{label} {cell} seed {seed}: running", flush=True)
            rec = trl_cell(work, seed, start, out, threads) if cell == "trl" else \
                project_cell(work, cell, seed, start, out)
            rec.update(label=label, seed=seed, work=dataclasses.asdict(work), start_policy=start,
                       user_wall_s=rec["wall_s"] + (start["sft_s"] or 0.0), **versions(),
                       gain=(rec["final_accuracy"] or 0) - (rec["start_accuracy"] or 0),
                       differences=DIFFERENCES)
            rec["start_digest_matches"] = rec["start_digest"] == start["digest"]
            rec.setdefault("threads", "each role its own (topology=cpu)")
            common.write_record(path, {**rec, "command_line": common.command_line("versus_trl")})
            print(f"{label} {cell} seed {seed}: RL wall {rec['rl_wall_s']:.1f} s, wall {rec['wall_s']:.1f} s, "
                  f"held-out {rec['start_accuracy']:.3f} -> {rec['final_accuracy']:.3f}; load "
                  f"{rec['load_avg_start']} -> {rec['load_avg_end']}", flush=True)


# -------------------------------------------------------------------------------------------------- the report
def load_records(records: Path, label: str) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for path in sorted((records / label).glob("*/seed*.json")):
        rec = json.loads(path.read_text())
        out.setdefault(rec["cell"], {})[rec["seed"]] = rec
    return out


def ratio_summary(values: list[float]) -> str:
    from bench.budget_stats import BOOTSTRAP_MIN_PAIRS, paired_bootstrap, t_interval

    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f} (one seed)"
    mean, lo, hi = t_interval(values)
    text = f"{mean:.2f} [{lo:.2f}, {hi:.2f}] (t, {len(values)} seeds)"
    if len(values) >= BOOTSTRAP_MIN_PAIRS:
        _, blo, bhi = paired_bootstrap(values)
        text += f"; bootstrap [{blo:.2f}, {bhi:.2f}]"
    return text


def report(records: Path, label: str) -> None:
    by_cell = load_records(records, label)
    if not by_cell:
        print(f"no records under {records / label}")
        return
    print("| cell | seed | RL wall s | wall s | user wall s | held-out start -> final (gain) | per step s | load "
          "start -> end |")
    print("|---|---|---|---|---|---|---|---|")
    for cell, seeds in by_cell.items():
        for seed, r in sorted(seeds.items()):
            ps = r["per_step"]
            if r["system"] == "trl":
                step = (f"{ps['step_s']:.3f} (gen {ps['generate_s']:.3f}, +score {ps['gen_score_s']:.3f}, fwd+loss "
                        f"{ps['forward_loss_s']:.3f}, bwd {ps['backward_s']:.3f}, opt {ps['optimizer_s']:.3f})")
            else:
                step = (f"{ps['step_s']:.3f} (train {ps['train_s']:.3f}, wait {ps['step_wait_s']:.3f}; inference "
                        f"chunk {ps['inference_gen_s'] or 0:.3f})")
            print(f"| {cell} | {seed} | {r['rl_wall_s']:.1f} | {r['wall_s']:.1f} | {r['user_wall_s']:.1f} | "
                  f"{r['start_accuracy']:.3f} -> {r['final_accuracy']:.3f} ({r['gain']:+.3f}) | {step} | "
                  f"{r['load_avg_start'][0]} -> {r['load_avg_end'][0]} |")
    trl = by_cell.get("trl", {})
    for cell, seeds in by_cell.items():
        if cell == "trl":
            continue
        paired = sorted(set(seeds) & set(trl))
        for key in ("rl_wall_s", "user_wall_s"):
            ratios = [seeds[s][key] / trl[s][key] for s in paired]
            print(f"{cell} / trl, {key}: per seed " + ", ".join(f"{s}: {x:.2f}" for s, x in zip(paired, ratios))
                  + f"; mean {ratio_summary(ratios)}")
        gains = [seeds[s]["gain"] - trl[s]["gain"] for s in paired]
        if gains:
            print(f"{cell} - trl, held-out gain: " + ", ".join(f"{s}: {g:+.3f}" for s, g in zip(paired, gains)))
    plot(by_cell, records / label / "curve.png")


def plot(by_cell: dict[str, dict[int, dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = {"trl": "TRL GRPOTrainer", "grpo": "prime_values advantage=grpo",
             "readme": "prime_values README run (critic, gae)"}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, (cell, seeds) in enumerate(by_cell.items()):
        color = f"C{i}"
        for j, (_, r) in enumerate(sorted(seeds.items())):
            xs = [c[1] for c in r["curve"]]
            ys = [c[2] for c in r["curve"]]
            ax.plot(xs, ys, marker="o", ms=3, color=color, alpha=0.8,
                    label=f"{names.get(cell, cell)}" if j == 0 else None)
    first = next(iter(next(iter(by_cell.values())).values()))
    ax.set_xlabel("RL wall seconds (held-out evaluations left out)")
    ax.set_ylabel("held-out greedy accuracy")
    work = first["work"]
    ax.set_title(f"{work['experiment']}: {work['prompts']} x {work['group']} rollouts a step, {first['cpu']}",
                 fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"plot: {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common.add_seeds(ap, "0")
    ap.add_argument("--smollm", action="store_true", help="the SmolLM2 recipe's step-time comparison (SMOLLM)")
    ap.add_argument("--gpu", action="store_true", help="the SmolLM2 recipe on one GPU, vLLM on both sides (GPU; "
                                                       "bench/versus_trl_gpu.sh)")
    ap.add_argument("--steps", type=int, default=None, help="policy steps (default: the mode's)")
    ap.add_argument("--eval-every", type=int, default=None, help="held-out evaluation period (default: the mode's)")
    ap.add_argument("--cells", default=None, help="comma-separated, of trl, grpo, readme (default: the mode's)")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="rollouts per forward/backward on both sides (policy.micro_batch_rollouts; TRL's "
                         "per_device_train_batch_size with gradient accumulation); default: the mode's")
    ap.add_argument("--readme-overrides", default=None,
                    help="space-separated overrides of the readme cell only (what its critic costs: "
                         "'replay.ratio=0.5'); the records go to their own label")
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the TRL cell (default 2)")
    ap.add_argument("--label", default=None, help="records' folder (default: arith, smollm, or the mode's with "
                                                  "non-default steps)")
    ap.add_argument("--records", type=Path, default=RECORDS, help=f"where records go (default {RECORDS})")
    ap.add_argument("--out", type=Path, default=Path("/tmp/versus_trl"), help="run directories (default "
                                                                                "/tmp/versus_trl)")
    ap.add_argument("--force", action="store_true", help="rerun cells whose record exists")
    ap.add_argument("--report", action="store_true", help="only the table, ratios and plot from the records")
    ap.add_argument("--trl-cell", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.trl_cell:
        run_trl(json.loads(args.trl_cell))
        return 0
    if args.smollm and args.gpu:
        ap.error("--smollm and --gpu are two modes: choose one")
    work = GPU if args.gpu else SMOLLM if args.smollm else ARITH
    changes = {k: v for k, v in (("steps", args.steps), ("eval_every", args.eval_every),
                                 ("micro_batch", args.micro_batch)) if v is not None}
    if args.cells:
        changes["cells"] = tuple(args.cells.split(","))
    if args.readme_overrides:
        changes["readme_extra"] = tuple(args.readme_overrides.split())
    if "steps" in changes:
        changes["step_window"] = (min(work.step_window[0], changes["steps"]), changes["steps"])
    work = dataclasses.replace(work, **changes)
    if unknown := [c for c in work.cells if c not in ("trl", "grpo", "readme")]:
        ap.error(f"--cells {','.join(unknown)}: choose from trl, grpo, readme")
    mode = "smollm_gpu" if args.gpu else work.experiment
    label = args.label or (mode if not changes.keys() - {"cells"} else
                           f"{mode}_steps{work.steps}" + (f"_mb{work.micro_batch}" if "micro_batch" in changes else "")
                           + "".join(f"_{o.replace('=', '')}" for o in work.readme_extra))
    if not args.report:
        run_grid(work, args.seeds, list(work.cells), label, args.records, args.out, args.threads, args.force)
    report(args.records, label)
    return 0


if __name__ == "__main__":
    sys.exit(main())
