"""Structured configuration: every knob is a typed dataclass field with its documented default.

The string literal under each field is its documentation (CleanRL style); `docs/configuration.md` is generated
from these docstrings by `python -m prime_values.config` so the docs and the defaults come from one place.
Hydra composes the YAML groups under `conf/` on top of `Config`, so an unknown key or a wrong type fails
at composition time; `validate` adds the checks a type cannot express (allowed names, device counts, sizes).
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import os
import shutil
import subprocess
from dataclasses import MISSING as NO_DEFAULT, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import DictConfig, MISSING, OmegaConf  # noqa: F401  (MISSING re-exported for conf authors)

from prime_values import backends
from prime_values.tasks import make_task
from prime_values.tasks.math import MathDataError, resolve_source
from prime_values.tasks.pool import PromptPool
from prime_values.tasks.reasoning_gym import ANSWER_FORMATS, ReasoningGymError, check_chat_source, check_dataset
from prime_values.tasks.reverse_text import ReverseTextTask


@dataclass
class TinyArch:
    """Architecture of the embedded tiny model (a Qwen3 built from a config, no download). The default has
    3.2M parameters: a 0.8M model (hidden 128, 4 heads, MLP 384) learns the arithmetic task by SFT but gains
    far less from RL in the same number of steps (see docs/benchmarks.md, "Learnability")."""

    hidden_size: int = 256
    """width of the residual stream"""
    num_layers: int = 4
    """number of transformer blocks"""
    num_heads: int = 8
    """attention heads (head_dim x num_heads need not equal hidden_size in Qwen3)"""
    num_kv_heads: int = 4
    """key/value heads (grouped-query attention)"""
    head_dim: int = 32
    """per-head width; >= 32 so vLLM kernels accept the model"""
    intermediate_size: int = 768
    """MLP width"""
    max_position_embeddings: int = 256
    """longest sequence the model accepts (prompt + response, or critic prefix + trace)"""


@dataclass
class WarmStartConfig:
    """Supervised warm start on the task's reference solutions before RL (the `sft` job)."""

    steps: int = 900
    """at most this many SFT optimizer steps before RL starts (0 = start RL from the model as loaded)"""
    target_accuracy: float = 0.3
    """stop SFT early once greedy accuracy on a fixed validation sample of training problems
    (never the held-out set) reaches this (checked every `check_every` steps; 0 = never stop early), so RL starts from a policy that solves some problems but has room to improve"""
    check_every: int = 25
    """SFT steps between validation checks of target_accuracy"""
    batch_size: int = 128
    """problems per SFT step"""
    lr: float = 2e-3
    """SFT learning rate (AdamW)"""
    warmup_steps: int = 10
    """SFT steps of linear learning-rate warm-up (from lr / warmup_steps to lr; 0 = none)"""
    heldout_before: bool = False
    """also evaluate the held-out set with the model as loaded, before SFT (one greedy reply per problem,
    `inference.max_new_tokens`; each problem's outcome in metrics/heldout/before_sft.jsonl), so
    bench/paired_heldout.py reports SFT's gain and RL's gain apart on the same problems"""
    heldout_after: bool = True
    """evaluate the held-out set after SFT (the warm start's `heldout_accuracy`); the policy trainer's step-0
    evaluation measures the same weights, so a run on a slow model may set false and save one evaluation"""


@dataclass
class LoraSettings:
    """LoRA (PEFT) for one trainer: the base stays frozen, only low-rank adapters (and the critic's value head)
    train, and each published version holds only the adapter (docs/lora.md). Needs `pip install
    'prime_values[lora]'` and one trainer process."""

    enabled: bool = False
    """train adapters instead of the full model; versions are adapter-only, adopted in place by inference /
    the evaluator, merged on demand by `python -m prime_values.models.lora merge <version_dir> <out_dir>`"""
    r: int = 8
    """adapter rank"""
    alpha: float = 16.0
    """LoRA scaling numerator: the update is (alpha / r) * B @ A"""
    dropout: float = 0.0
    """dropout on the adapter's input while training (in [0, 1))"""
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                               "up_proj", "down_proj"])
    """names of the linear layers that get adapters (Qwen/Llama naming: attention and MLP projections)"""


@dataclass
class PolicyConfig:
    model: str = "tiny"
    """'tiny' builds the embedded model from `arch`; a GGUF file (a path ending in .gguf, or '<package>:<file>.gguf'
    for one an installed package ships, e.g. policy=smollm2_135m) is converted once into a from_pretrained directory
    under `cache_dir` before any job starts (docs/real_model.md); anything else is a path/name for from_pretrained"""
    cache_dir: str = ""
    """where GGUF conversions are kept (policy.model=*.gguf), reused by every role, stage and later run; '' =
    $PRIME_VALUES_CACHE, else ~/.cache/prime_values"""
    arch: TinyArch = field(default_factory=TinyArch)
    """architecture of the embedded model (used when model='tiny'; the critic reuses it)"""
    attn_implementation: str = "auto"
    """attention kernel of every transformers model, policy and critic, in every role and stage: 'auto' =
    'flash_attention_2' when flash-attn is importable, the model runs on CUDA and dtype computes in bf16 (bfloat16,
    bf16-mixed, or auto on CUDA), else 'sdpa' (each role logs its choice and why); or 'sdpa', 'eager',
    'flash_attention_2' (pip install flash-attn, CUDA devices and a bf16 dtype)"""
    dtype: str = "float32"
    """precision of the policy and the critic in every role (their one precision key): 'float32'; 'bf16-mixed'
    (fp32 weights, which are the optimizer's master copy, every forward under bf16 autocast, the critic's value
    head and all losses in fp32; under FSDP2 bf16 all-gathers and fp32 gradient reduction); 'bfloat16' (pure
    bf16 weights and compute: half the memory, but AdamW drops updates under ~1/256 of a weight, so small learning
    rates may stall); 'auto' = bf16-mixed on a CUDA device, float32 elsewhere (each role logs what it resolved)"""
    activation_checkpointing: bool = False
    """policy trainer: recompute each transformer block's activations in the backward pass instead of keeping
    them (the same gradients, less memory; costs one more forward pass per block, ~1/3 more compute)"""
    lr: float = 1e-4
    """policy learning rate (AdamW)"""
    lr_decay_steps: int = 0
    """the last this many policy steps decay the learning rate linearly toward 0 (step s of N steps uses
    lr * min(1, (N - s + 1) / (lr_decay_steps + 1))); 0 = constant"""
    weight_decay: float = 0.0
    """AdamW weight decay"""
    max_grad_norm: float = 1.0
    """gradient-norm clip per step (0 = off)"""
    clip_low: float = 0.2
    """PPO ratio clip below: ratios under 1 - clip_low stop contributing gradient"""
    clip_high: float = 0.2
    """PPO ratio clip above: ratios over 1 + clip_high stop contributing gradient"""
    trust_region: str = "clip"
    """'clip': PPO ratio clipping (clip_low/clip_high); 'prob_diff': no gradient for tokens whose probability
    moved more than prob_diff_high up (A > 0) or prob_diff_low down (A < 0) from the sampling policy"""
    prob_diff_low: float = 0.2
    """prob_diff trust region: largest probability drop below the sampling policy that still gets a push down"""
    prob_diff_high: float = 0.2
    """prob_diff trust region: largest probability rise above the sampling policy that still gets a push up"""
    kl_coef: float = 0.0
    """weight of the k3 KL estimate to the sampling policy (0 = off)"""
    micro_batch_rollouts: int = 0
    """rollouts per forward/backward micro-batch (0 = the whole batch at once)"""
    warm_start: WarmStartConfig = field(default_factory=WarmStartConfig)
    """supervised warm start before RL"""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters for the policy trainer (version 0, the warm start's full model, is the base)"""


@dataclass
class WarmupConfig:
    min_version: int = 0
    """the policy's first update waits until values come from at least this critic version (0 = no wait)"""
    min_explained_variance: Optional[float] = None
    """...and until the critic's explained variance on the last `inference.prompts_per_step` scored groups
    reaches this (null = no condition)"""
    max_rollouts: int = 20000
    """open the gate anyway after this many warm-up rollouts were scored, with a warning (0 = never)"""


@dataclass
class CriticWarmStartConfig:
    steps: int = 300
    """critic optimizer steps in the warm-start job, before RL starts, on Monte-Carlo returns (0 = none): the
    critic starts RL already useful"""
    rollouts: int = 2048
    """rollouts to pretrain on: fresh samples of policy version 0, or the newest of `from_run`'s log"""
    from_run: str = ""
    """an earlier run directory whose rollout log supplies the pretraining rollouts instead of fresh samples
    (offline warm start; its policy may differ from this run's v0, so the critic starts from that policy's
    values)"""


@dataclass
class CriticConfig:
    init: str = "policy"
    """'policy': backbone from the warm-started policy, fresh value head; 'scratch': random init from
    policy.arch; anything else: path of a saved critic (AutoModelForTokenClassification)"""
    privileged: bool = True
    """fold the task's privileged context (e.g. the reference answer) into the critic's input"""
    template: str = "answer:{privileged}|"
    """the privileged block's text (where it goes: critic.placement); {privileged} is replaced by the context (a
    format spec pads it: '{privileged:<4}|' left-aligns it in 4 characters)"""
    placement: str = "start"
    """where the privileged block goes: 'start' (before the whole trace) or 'response' (after the prompt, right
    before the policy's first token: at a fixed distance from the response whatever the prompt's length)"""
    num_layers: int = 0
    """transformer blocks of the critic: 0 = as many as its initialisation (the policy's backbone, policy.arch
    or the saved critic); N = keep the first N, a shallower critic that takes more, cheaper steps (the
    embedded arith experiment uses 2 of the policy's 4: docs/value_functions.md)"""
    lr: float = 3e-3
    """critic learning rate (AdamW)"""
    activation_checkpointing: bool = False
    """value trainer: recompute each transformer block's activations in the backward pass instead of keeping
    them (the same gradients, less memory; one more forward pass per block). The critic's precision is policy.dtype"""
    max_grad_norm: float = 1.0
    """gradient-norm clip per critic step (0 = off)"""
    loss: str = "mse"
    """value loss: 'mse', 'huber' or 'bce' (sigmoid head for {0, 1} rewards; values are probabilities)"""
    value_clip: float = 0.0
    """clip each new prediction to within this of the value recorded at scoring time, PPO-style (the larger
    of clipped and unclipped loss; 0 = off; not with bce)"""
    batch_rollouts: int = 64
    """rollouts per critic optimizer step, sampled from the replay buffer"""
    publish_every: int = 4
    """critic optimizer steps between published critic versions"""
    weight_average: float = 0.0
    """decay of an exponential moving average of the critic's weights, updated after every critic step (0 =
    off): published versions (and a colocated evaluator's scores) use the average, training goes on with the
    raw weights; a restart resumes training from the published average"""
    max_length: int = 256
    """critic context in tokens; longer traces are cut and marked `cut`"""
    score_batch_rollouts: int = 256
    """rollouts per scoring forward pass in the evaluator"""
    throttle_s: float = 0.0
    """sleep after every critic optimizer step (a benchmark knob that simulates a slow critic)"""
    throttle_factor: float = 0.0
    """sleep this many times each critic optimizer step's own duration after it (9 = a critic 10x slower; a
    benchmark knob that simulates a slow critic whatever the machine)"""
    warm_start: CriticWarmStartConfig = field(default_factory=CriticWarmStartConfig)
    """critic pretraining in the warm-start job"""
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    """hold the policy's first update until the critic is good enough; inference keeps filling the log
    meanwhile (those rollouts train the critic; groups scored before the gate opened never reach a batch)"""
    lora: LoraSettings = field(default_factory=LoraSettings)
    """LoRA adapters for the value trainer (critic version 0 is the base; the value head `score` trains fully)"""


@dataclass
class ReplayConfig:
    name: str = "uniform"
    """name of the replay preset (informational)"""
    queue_size: int = 4096
    """bounded ingest queue between the log and the buffer; when full the oldest rollout is dropped (counted)"""
    capacity: int = 2048
    """replay buffer capacity in rollouts; the oldest is evicted first"""
    sampling: str = "uniform"
    """how critic batches are drawn from the buffer: 'uniform' (random, without replacement within a batch),
    'fifo' (passes from oldest to newest) or 'recent' (weight 2^(-rank/recent_half_life), rank 0 = newest)"""
    recent_half_life: float = 256.0
    """'recent' sampling: rollouts this many insertions old weigh half as much as the newest (0 = newest first)"""
    max_reuse: int = 4
    """a rollout leaves the buffer after this many samplings (0 = unlimited)"""
    max_age: int = 0
    """a rollout more than this many policy versions behind the newest seen leaves the buffer (0 = unlimited)"""
    min_rollouts: int = 128
    """rollouts in the buffer before the first critic step"""


@dataclass
class AdvantageConfig:
    estimator: str = "gae"
    """'gae' (pure value advantage from the critic), 'grpo' (group-mean baseline, no critic) or 'tether'
    (baseline w·V + (1−w)·group mean, w = how accurate the critic is; see docs/value_functions.md)"""
    tether_mode: str = "group"
    """tether's weight w: 'group' = clamp(R², 0, 1) of the critic on each group's returns (a group whose returns
    do not vary: the running explained variance below); 'running' = clamp(explained variance on the last
    prompts_per_step scored groups, 0, 1); a group of one gets w = 1 (the value baseline) in both"""
    grpo_std: bool = False
    """grpo: divide the group-centred reward by the group's reward std (+1e-6)"""
    adaptive_alpha: float = 0.0
    """length-adaptive λ for the policy: λ_policy = clamp(1 − 1/(α·n), 0, 1) per rollout with n policy tokens
    (VAPO); 0 = use lambda_policy for every rollout"""
    gamma: float = 1.0
    """discount per policy token"""
    lambda_policy: float = 1.0
    """GAE lambda for the policy's advantages"""
    lambda_value: float = 1.0
    """GAE lambda for the critic's value targets (1 = Monte-Carlo returns, which never go stale in replay)"""
    whiten: bool = False
    """normalise advantages to zero mean, unit std per batch (value targets stay unwhitened)"""


@dataclass
class TopologyConfig:
    name: str = "cpu"
    """name of the topology preset (informational)"""
    evaluator: str = "dedicated"
    """'dedicated': the value evaluator is its own job; 'colocated': it is served inside the value trainer"""
    evaluators: int = 1
    """dedicated evaluator jobs: evaluator k scores the rollouts of inference workers w with w % evaluators == k
    and writes values shard e<k> (at most inference_workers; 1 when colocated)"""
    inference_workers: int = 1
    """inference jobs, each with its own log shard and slice of the prompt stream"""
    inference_device: str = "cpu"
    """device of each inference worker: 'cpu', 'cuda:<i>', or 'auto' (a GPU per role while GPUs last, else CPU)"""
    inference_tp: int = 1
    """tensor-parallel ranks of each inference worker (inference=vllm only): that many GPUs, consecutive from
    inference_device (cuda:2 with 2 uses cuda:2 and cuda:3; on SLURM the job asks for that many GPUs)"""
    evaluator_device: str = "cpu"
    """device of the dedicated value evaluator"""
    policy_trainer_device: str = "cpu"
    """device of the policy trainer"""
    value_trainer_device: str = "cpu"
    """device of the value trainer (and of the evaluator when colocated)"""
    threads_per_role: int = 1
    """torch CPU threads per role (roles share the machine's cores)"""
    policy_trainer_procs: int = 1
    """processes of the policy trainer: > 1 trains with torch.distributed + FSDP2, one process per GPU (GPUs
    consecutive from policy_trainer_device: cuda:2 with 2 processes uses cuda:2 and cuda:3; on SLURM the job
    asks for that many GPUs and tasks), or gloo processes sharing the CPU; rank 0 reads batches and publishes"""
    value_trainer_procs: int = 1
    """processes of the value trainer, as policy_trainer_procs (> 1 needs evaluator=dedicated)"""


@dataclass
class TaskConfig:
    name: str = "arith"
    """task: 'arith' (procedural arithmetic, verified exactly), 'reverse_text' (reverse a generated string, partial
    credit), 'math' (GSM8K/MATH-style data, math-verify), 'reasoning_gym' (problems a reasoning-gym generator
    makes offline, final answer checked by math-verify) or 'verifiers' (an environment of the `verifiers` package)"""
    digits: int = 2
    """digits per operand (each operand uniform in [0, 10**digits))"""
    min_digits: int = 0
    """arith: 0 = off; else each operand draws its digit count uniformly from min_digits..digits first, so every
    difficulty comes in equal shares (1..digits: one-digit problems as common as the longest ones)"""
    operands: int = 2
    """numbers per problem"""
    ops: str = "+"
    """operators drawn from, any of '+-*'"""
    show_work: bool = False
    """arith: the answer is every running result left to right, comma-separated ('12+34+56=' -> '46,102'),
    and the privileged critic sees that worked solution (needs operands >= 3 to matter; ops from '+-')"""
    heldout_size: int = 200
    """size of the fixed held-out evaluation set (never trained on)"""
    train_pool: int = 0
    """0 = every RL prompt drawn fresh from the task's training stream; N = RL prompts (inference and the critic's
    warm-start rollouts) come from a fixed pool of N distinct training problems drawn once with task.seed, visited
    again and again like a dataset's epochs (the supervised warm start keeps the stream)"""
    seed: int = 1234
    """seed of the held-out set (the training stream uses the run seed)"""
    data: str = ""
    """math: local .jsonl/.json/.parquet/.csv file or directory, or a hub dataset name (e.g. openai/gsm8k)"""
    split: str = "train"
    """math: split of a hub dataset (a local file is its own split)"""
    data_config: Optional[str] = None
    """math: hub dataset config name ('main' for openai/gsm8k)"""
    heldout_data: Optional[str] = None
    """math: separate held-out source (default: heldout_size prompts carved out of data)"""
    heldout_split: str = "test"
    """math: split of heldout_data when it is a hub name"""
    prompt_template: str = "{question}\nPlease reason step by step, and put your final answer within \\boxed{}."
    """math, reasoning_gym: policy prompt; {question} is replaced, other braces are literal"""
    privileged_solution: bool = True
    """math, reasoning_gym: the critic also sees the reference solution (reasoning_gym: the generator's steps or
    expression, where its metadata has them), not only the reference answer"""
    max_response_chars: int = 1024
    """math, reasoning_gym: what task.max_answer_chars() reports (generation-budget hint)"""
    verifier_workers: int = 2
    """math, reasoning_gym: math-verify worker processes"""
    verifier_timeout_s: float = 3.0
    """math, reasoning_gym: per-check limit (fractions fine); +1 s grace, then the worker is killed and replaced"""
    verifier_batch_timeout_s: float = 60.0
    """math, reasoning_gym: total deadline of one score_many batch; unfinished checks score 0"""
    verifier_max_chars: int = 4096
    """math, reasoning_gym: responses are cut to their last N characters before checking"""
    verifier_memory_mb: Optional[int] = 4096
    """math, reasoning_gym: address-space limit per verifier worker (null: none)"""
    data_cache_dir: Optional[str] = None
    """math: HF datasets cache directory (default: HF_HOME)"""
    dataset: str = ""
    """reasoning_gym: the generator's name in reasoning_gym.factory.DATASETS (chain_sum, basic_arithmetic,
    gsm_symbolic, ...); an unknown name fails before any job starts, listing the close matches"""
    dataset_args: Dict[str, Any] = field(default_factory=dict)
    """reasoning_gym: the generator's config fields, e.g. {min_terms: 2, max_terms: 2, min_digits: 1,
    max_digits: 2} for chain_sum"""
    dataset_size: int = 5000
    """reasoning_gym: problems generated (with task.seed); the distinct questions, minus the held-out ones, are
    the training pool"""
    answer_format: str = "boxed"
    """reasoning_gym: where the reward reads the final answer: 'boxed' (the last \\boxed{...}) or 'answer_line'
    (the last line 'Answer: ...'); say the same in task.prompt_template. No final answer: reward 0"""
    chat: bool = True
    """reasoning_gym: render the prompt with task.chat_tokenizer's chat template (one user turn plus the
    generation prompt); false: the template text as it is"""
    chat_tokenizer: str = ""
    """reasoning_gym: tokenizer whose chat template renders prompts (a from_pretrained directory or hub id;
    conf/task/reasoning_gym.yaml sets it to ${policy.model})"""
    min_chars: int = 3
    """reverse_text: shortest generated string"""
    max_chars: int = 6
    """reverse_text: longest generated string (the answer is as long; keep inference.max_new_tokens > it)"""
    alphabet: str = "abcdefghijklmnopqrstuvwxyz"
    """reverse_text: characters the strings are drawn from (printable, no spaces, no '|')"""
    env_id: str = ""
    """verifiers: the environment (taskset) id as `verifiers` resolves it: an importable module exporting its
    Taskset subclass via __all__ (an installed environment package: 'reverse-text'; 'owner/name@version' installs
    as 'name') or a built-in taskset"""
    env_args: Dict[str, Any] = field(default_factory=dict)
    """verifiers: the taskset's config fields (its TasksetConfig), e.g. {dataset_split: train}"""
    env_class: str = ""
    """verifiers: an explicit Env id, e.g. 'user-sim' (default: the Env the taskset's module exports, else the
    single-agent env)"""
    max_turns: int = 8
    """verifiers: most policy turns per rollout (an agent's own max_turns, when set, is used instead)"""
    privileged_field: str = "answer"
    """verifiers: the task-data field the critic may see (e.g. the reference answer); empty or absent: nothing"""
    env_pool: int = 4096
    """verifiers: tasks read from an infinite taskset (bounded ones are read whole) before the held-out split"""


@dataclass
class InferenceConfig:
    backend: str = "hf"
    """'hf' (transformers, any device), 'vllm' (vLLM's offline engine, versions adopted in place; the optional
    extra prime_values[vllm]; docs/inference.md; fails before launch when vLLM is not installed), or 'auto' (vllm
    where it imports, hf otherwise; each inference worker logs the choice and the reason in one line)"""
    dtype: str = "float32"
    """vllm: the engine's dtype; float32 gives the logprobs the fp32 trainer recomputes, bfloat16 / float16 are
    faster on a GPU ('auto': vLLM's choice, which downcasts fp32 checkpoints)"""
    vllm_args: Dict[str, Any] = field(default_factory=dict)
    """vllm: extra keyword arguments of vllm.LLM, e.g. {gpu_memory_utilization: 0.3, max_model_len: 4096,
    enforce_eager: true} (a CPU engine's KV cache defaults to kv_cache_memory_bytes=1 GiB)"""
    group_size: int = 8
    """completions sampled per prompt (one group); >= 1, and >= 2 for advantage=grpo (gae and tether baseline a
    group of one with the critic)"""
    prompts_per_step: int = 16
    """prompts per policy step across all workers; a batch has prompts_per_step x group_size rollouts"""
    temperature: float = 1.0
    """sampling temperature (the policy trainer recomputes logprobs at the same temperature)"""
    max_new_tokens: int = 8
    """generation cap; a rollout that hits it ends with stop_reason 'length' and is scored as is"""


@dataclass
class ScheduleConfig:
    max_off_policy: int = 1
    """a rollout from policy version v is admitted to batch n only while (n - 1) - v <= this (0 = on-policy);
    inference pauses rather than generate what could never be admitted"""
    mode: str = "async"
    """'async': every role runs ahead as far as the data allows; 'lockstep': the synchronous PPO schedule with the
    same roles: batch n is generated only after policy version n - 1 is published (max_off_policy = 0), its
    rollouts are scored only by a critic trained on batch n - 1's targets, then the policy trains on batch n
    (docs/benchmarks.md, "Async vs lockstep")"""
    lockstep_critic_steps: int = 4
    """lockstep: critic optimizer steps on each batch's targets (minibatches of critic.batch_rollouts) before
    the value trainer publishes the one critic version that scores the next batch"""


@dataclass
class LauncherConfig:
    name: str = "local"
    """'local': every role a subprocess of this machine; 'slurm': the rl stage is one sbatch job sized for every
    role at once (it starts whole or not at all), whose conductor runs each role as an srun step of it"""
    poll_s: float = 0.5
    """how often the conductor checks jobs and refreshes progress"""
    stop_grace_s: float = 30.0
    """after the stop file is written, how long roles get to finish before they are cancelled"""
    timeout_min: int = 120
    """wall-clock limit of every role job"""
    max_restarts: int = 5
    """the restart budget, a rate: a role that fails (crash, kill, node failure, preemption) is resubmitted at once
    from its state in the run directory, up to this many times per role within any restart_window_s; one more
    failure in that window fails the run (0 = fail the run at the first failure)"""
    restart_window_s: Optional[float] = 3600.0
    """the window of the restart budget in seconds: restarts older than this no longer count (null = the whole run,
    i.e. at most max_restarts restarts per role per run)"""
    restart_backoff_s: float = 2.0
    """a failed role is restarted at once; one that fails again before it came up (no heartbeat since its start: a
    crash loop) waits this long before its next restart, doubled for each further such failure (at most 60 s)"""
    fork_server: bool = True
    """local: fork every role job from one process that has imported torch and transformers already (a restarted
    role is working in about a second instead of paying 5-15 s of imports); false = a fresh Python process each"""
    detach: bool = False
    """submit a conductor job that runs the roles (restarts, stop, summary) and return at once; follow the run
    with `python -m prime_values.status <run_dir>`, stop it with `... status <run_dir> --stop` (rl stage only)"""
    partition: Optional[str] = None
    """slurm: partition (null = the cluster's default)"""
    account: Optional[str] = None
    """slurm: account to charge"""
    qos: Optional[str] = None
    """slurm: quality of service"""
    constraint: Optional[str] = None
    """slurm: node feature constraint"""
    extra_sbatch: dict = field(default_factory=dict)
    """slurm: further #SBATCH options, e.g. {mail-type: END, exclusive: true} (true = a bare flag)"""
    setup: list = field(default_factory=list)
    """slurm: shell lines run before the role starts, e.g. ['module load cuda/12.4']"""
    cpus_per_task: int = 1
    """slurm: CPUs per role process, for sizing the pipeline's allocation when launcher.cpus is null, and per job of
    the sft/eval stages (threads within a role: topology.threads_per_role)"""
    cpus: Optional[int] = None
    """slurm: CPUs of the pipeline's allocation, shared by its roles (null = cpus_per_task per role process plus one
    for the conductor); a pipeline no node of the partition can hold fails before submission, in one line"""
    mem_gb: Optional[int] = None
    """slurm: memory of the pipeline's allocation and of each stage job (null = the cluster's default per CPU)"""


@dataclass
class LogConfig:
    keep_segments: Optional[int] = None
    """retention: keep at most this many segments per shard once every consumer has passed them (null = all)"""
    max_age_s: Optional[float] = None
    """retention: delete passed segments older than this (null = never)"""
    durable_rename: bool = False
    """also fsync the log directory after publishing each segment, so it survives a power loss (slower appends;
    visibility is atomic either way)"""
    keep_weights: int = 3
    """published weight versions kept per model (version 0 is always kept)"""
    optimizer_state_every: int = 1
    """the trainers save their optimizer state inside every Nth published version (`optimizer.pt`), so a restarted
    trainer resumes its Adam moments; a restart from a version without one starts a fresh optimizer (0 = never)"""
    plots: bool = True
    """draw the report's PNG plots (report/*.png) at the end of a run; false writes report/summary.json and
    summary.md without them (~5 s less per run on 2 cores: many short runs, tests), and
    `python -m prime_values.report <run>` draws them later"""


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
    min_reward: float = 1.0
    """from_run: keep rollouts whose reward is at least this"""
    steps: int = 100
    """SFT optimizer steps (batches drawn with replacement from the examples)"""
    batch_size: int = 32
    """examples per SFT step"""
    lr: float = 1e-5
    """SFT learning rate (AdamW, linear warm-up over warmup_steps, then constant)"""
    warmup_steps: int = 10
    """steps of linear learning-rate warm-up"""
    max_length: int = 1024
    """examples longer than this many tokens (prompt + response + eos) are dropped and counted"""
    target_accuracy: float = 0.0
    """stop early once greedy accuracy on val_size fixed training problems of the task (never held-out ones)
    reaches this, checked every check_every steps (0 = run all steps)"""
    check_every: int = 25
    """SFT steps between target_accuracy checks"""
    val_size: int = 64
    """training problems in the target_accuracy check"""


@dataclass
class EvalConfig:
    """The `eval` stage: avg@n and unbiased pass@k (Chen et al. 2021) on the task's held-out set."""

    samples: int = 8
    """n: completions sampled per held-out prompt"""
    k: List[int] = field(default_factory=lambda: [1, 4, 8])
    """the k of each pass@k reported (each <= samples)"""
    temperature: float = 1.0
    """sampling temperature (0 = greedy; then samples should be 1)"""
    max_new_tokens: int = 0
    """generation cap per completion (0 = inference.max_new_tokens)"""
    batch_size: int = 256
    """completions decoded together"""


@dataclass
class WandbConfig:
    """Weights & Biases: the conductor forwards every role's metrics (`metrics/<role>.jsonl`) to one W&B run per
    experiment, keys prefixed by role (`policy_trainer/loss`), x-axis `policy_step` (prime_values/wandb_sink.py)."""

    mode: str = "disabled"
    """'disabled', 'offline' (files under <run>/wandb/; upload later with `wandb sync`) or 'online' (falls back
    to offline, with one log line, when there is no API key: WANDB_API_KEY or `wandb login`); offline and
    online need the wandb extra: pip install 'prime_values[wandb]'"""
    project: str = "prime_values"
    """W&B project"""
    entity: Optional[str] = None
    """W&B entity (user or team; null = your default entity)"""
    group: Optional[str] = None
    """W&B group (null = in a Hydra multirun the sweep directory's name, so a sweep's points group together;
    none for a single run)"""
    name: Optional[str] = None
    """W&B run name (null = the sweep point's overrides in a multirun, else the run directory's name)"""
    tags: list = field(default_factory=list)
    """W&B tags, e.g. [arith, baseline]"""
    poll_s: float = 5.0
    """seconds between forwarding rounds (the last metrics are forwarded when the run ends)"""


@dataclass
class Config:
    seed: int = 0
    """seed of every role's random streams (each role/worker derives its own)"""
    steps: int = 200
    """policy-trainer steps (= batches = published policy versions after 0)"""
    eval_every: int = 25
    """policy steps between held-out evaluations (also at the first and last step)"""
    time_budget_min: float = 0.0
    """0 = run all `steps`; else the policy trainer's last step is the one after which one more step and the final
    held-out evaluation would end past this many minutes from the run's start (its config.yaml: launch or
    resume), then it evaluates and finishes: `steps` becomes a cap (+experiment=smollm: 30 minutes on 2 cores)"""
    stages: List[str] = field(default_factory=lambda: ["rl"])
    """the experiment's stages in order, from 'sft', 'rl', 'eval'; each starts from the model the one before
    produced; a stage with `<run>/stages/<name>/done.json` is skipped on a rerun (docs/stages.md)"""
    stage: Optional[str] = None
    """run only this stage, starting from policy.model (e.g. stage=eval policy.model=<dir>); null = all stages"""
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    advantage: AdvantageConfig = field(default_factory=AdvantageConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    log: LogConfig = field(default_factory=LogConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)


def register() -> None:
    """Register the schema so `conf/config.yaml` can extend it (`defaults: [prime_values_schema, ...]`)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="prime_values_schema", node=Config)


# --- semantic validation ---------------------------------------------------------------------------

ALLOWED = {
    "policy.attn_implementation": ("auto", "sdpa", "eager", "flash_attention_2"),
    "policy.dtype": ("float32", "bfloat16", "bf16-mixed", "auto"),
    "advantage.estimator": ("gae", "grpo", "tether"),
    "advantage.tether_mode": ("group", "running"),
    "policy.trust_region": ("clip", "prob_diff"),
    "topology.evaluator": ("dedicated", "colocated"),
    "schedule.mode": ("async", "lockstep"),
    "inference.backend": ("hf", "vllm", "auto"),
    "inference.dtype": ("auto", "float32", "bfloat16", "float16"),
    "launcher.name": ("local", "slurm"),
    "replay.sampling": ("uniform", "fifo", "recent"),
    "critic.loss": ("mse", "huber", "bce"),
    "critic.placement": ("start", "response"),
    "task.name": ("arith", "reverse_text", "math", "reasoning_gym", "verifiers"),
}


def load_saved(path: str | os.PathLike):
    """A run's saved ``config.yaml`` on the current schema: keys added since the run get their defaults (so tools
    can read them and override them); a config the schema no longer accepts (a key removed since) is returned
    as written."""
    cfg = OmegaConf.load(path)
    try:
        return OmegaConf.merge(OmegaConf.structured(Config), cfg)
    except Exception:  # noqa: BLE001 - any schema mismatch: the config as written
        return cfg


class ConfigError(ValueError):
    """A user-caused configuration problem; the message is one sentence naming the key and the fix."""


def _get(cfg, dotted: str):
    node = cfg
    for part in dotted.split("."):
        node = node[part]
    return node


def _check_device(key: str, device: str, cuda_count: int) -> None:
    if device in ("cpu", "auto"):
        return
    if device.startswith("cuda:") and device[5:].isdigit():
        index = int(device[5:])
        if index < cuda_count:
            return
        have = f"cuda:0..cuda:{cuda_count - 1}" if cuda_count else "no CUDA device"
        raise ConfigError(f"{key}={device} asks for a GPU that does not exist (this machine has {have}); "
                          f"use cpu" + (f" or one of cuda:0..cuda:{cuda_count - 1}" if cuda_count else ""))
    raise ConfigError(f"{key}={device!r} is not a device; use 'cpu', 'auto' or 'cuda:<index>'")


def _check_slurm(launcher) -> None:
    """launcher=slurm: the client commands exist, and a partition is named or the cluster has a default one."""
    if launcher.partition is not None and not str(launcher.partition).strip():
        raise ConfigError("launcher.partition is empty; name a partition (sinfo lists them) or set it to null for "
                          "the cluster's default")
    if shutil.which("sbatch") is None or shutil.which("sinfo") is None:
        raise ConfigError("launcher=slurm needs the SLURM client commands (sbatch, sinfo) on this machine; run on a "
                          "login node, or try launchers/local_slurm/start.sh")
    listed = subprocess.run(["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=30).stdout.split()
    names = [p.rstrip("*") for p in listed]
    if launcher.partition is None and not any(p.endswith("*") for p in listed):
        raise ConfigError(f"launcher.partition is null but the cluster has no default partition; set "
                          f"launcher.partition to one of: {', '.join(names) or '(sinfo lists none)'}")
    if launcher.partition is not None and names and launcher.partition not in names:
        raise ConfigError(f"launcher.partition={launcher.partition!r} is not a partition of this cluster; "
                          f"choose one of: {', '.join(names)}")


def _check_backend(cfg) -> None:
    """inference.backend: installed (one line saying how to install it), and what it can serve."""
    name, tp = cfg.inference.backend, cfg.topology.inference_tp
    problem = backends.missing(name)
    if problem:
        raise ConfigError(problem)
    if name == "auto":  # what the workers will pick (they check that vLLM really imports, and log the choice)
        name, why = backends.choose(cfg, try_import=False)
        if tp > 1 and name != "vllm":
            raise ConfigError(f"topology.inference_tp={tp} needs vLLM, but inference=auto picks hf here ({why}); "
                              "set topology.inference_tp=1 or install vLLM")
    if tp < 1 or (tp > 1 and name != "vllm"):
        raise ConfigError(f"topology.inference_tp={tp} must be >= 1, and > 1 only with inference=vllm (the hf "
                          "backend runs on one device)")
    if name == "vllm" and cfg.task.name == "verifiers":
        raise ConfigError("task=verifiers rolls out its episodes through the transformers model; use inference=hf "
                          "with it (inference=vllm samples single-turn replies)")


WANDB_MODES = ("disabled", "offline", "online")


def check_wandb(cfg) -> None:
    """Before launch: `wandb.mode` is allowed and, if it is not `disabled`, wandb is installed (the forwarder:
    prime_values/wandb_sink.py). Raises ConfigError with one line saying what to do."""
    mode = cfg.wandb.mode
    if mode not in WANDB_MODES:
        raise ConfigError(f"wandb.mode={mode!r} is not allowed; choose one of {', '.join(WANDB_MODES)}")
    if mode != "disabled" and importlib.util.find_spec("wandb") is None:
        raise ConfigError(f"wandb.mode={mode} needs the wandb package: pip install 'prime_values[wandb]' (or pip "
                          "install -e '.[wandb]' in a checkout), or set wandb.mode=disabled")
    if cfg.wandb.poll_s <= 0:
        raise ConfigError(f"wandb.poll_s={cfg.wandb.poll_s} must be > 0")


def validate(cfg, cuda_count: Optional[int] = None, environment: bool = True) -> None:
    """Checks a type cannot express. Raises ConfigError with one sentence naming the key and what is allowed.
    `environment=False` (`--cfg job`, composing for another machine) leaves out the checks of this machine: the
    SLURM commands, installed backends and extras, data sets, directories, CUDA devices; they belong to the launch."""
    def no_unknown_keys(node, schema, prefix: str = "") -> None:  # `+key=value` adds keys the schema lacks
        for key in node.keys():
            if key not in schema:
                allowed = sorted(str(k) for k in schema.keys())
                near = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                raise ConfigError(f"unknown config key '{prefix}{key}'{hint}; remove it or use one of the keys under "
                                  f"'{prefix or '<root>'}': {', '.join(allowed)}")
            if isinstance(schema[key], DictConfig) and isinstance(node[key], DictConfig) and \
                    OmegaConf.get_type(schema[key]) is not dict:  # a free-form dict (task.env_args) holds any key
                no_unknown_keys(node[key], schema[key], f"{prefix}{key}.")

    if isinstance(cfg, DictConfig):
        no_unknown_keys(cfg, OmegaConf.structured(Config))
    for key, allowed in ALLOWED.items():
        value = _get(cfg, key)
        if value not in allowed:
            raise ConfigError(f"{key}={value!r} is not allowed; choose one of {', '.join(allowed)}")
    positive = ["steps", "eval_every", "inference.group_size", "inference.prompts_per_step",
                "inference.max_new_tokens", "topology.inference_workers", "topology.threads_per_role",
                "critic.batch_rollouts", "critic.publish_every", "critic.max_length", "critic.score_batch_rollouts",
                "replay.queue_size", "replay.capacity", "replay.min_rollouts", "task.digits", "task.operands",
                "task.heldout_size", "topology.policy_trainer_procs", "topology.value_trainer_procs",
                "schedule.lockstep_critic_steps",
                "policy.warm_start.batch_size", "policy.warm_start.check_every",
                "critic.warm_start.rollouts", "launcher.timeout_min", "log.keep_weights", "policy.arch.hidden_size",
                "policy.arch.num_layers", "policy.arch.num_heads", "policy.arch.num_kv_heads", "policy.arch.head_dim",
                "policy.arch.intermediate_size", "policy.arch.max_position_embeddings"]
    for key in positive:
        if _get(cfg, key) < 1:
            raise ConfigError(f"{key}={_get(cfg, key)} must be >= 1")
    non_negative = ["replay.max_reuse", "replay.max_age", "replay.recent_half_life", "policy.micro_batch_rollouts",
                    "task.train_pool",
                    "policy.warm_start.steps", "critic.warm_start.steps", "critic.warmup.min_version",
                    "critic.warmup.max_rollouts", "critic.throttle_s", "policy.weight_decay", "policy.max_grad_norm",
                    "critic.max_grad_norm", "policy.clip_low", "policy.clip_high", "policy.prob_diff_low",
                    "policy.prob_diff_high", "policy.kl_coef", "advantage.adaptive_alpha", "launcher.stop_grace_s",
                    "launcher.max_restarts", "launcher.restart_backoff_s", "log.optimizer_state_every",
                    "policy.warm_start.warmup_steps",
                    "critic.throttle_factor", "critic.num_layers", "policy.lr_decay_steps"]
    for key in non_negative:
        if _get(cfg, key) < 0:
            raise ConfigError(f"{key}={_get(cfg, key)} must be >= 0")
    window = cfg.launcher.restart_window_s
    if window is not None and window <= 0:
        raise ConfigError(f"launcher.restart_window_s={window} must be > 0 (seconds), or null to count restarts over "
                          "the whole run")
    if cfg.time_budget_min < 0:
        raise ConfigError(f"time_budget_min={cfg.time_budget_min} must be >= 0 (0 = no budget: all steps run)")
    for key in ("log.keep_segments", "log.max_age_s"):
        if _get(cfg, key) is not None and _get(cfg, key) < 0:
            raise ConfigError(f"{key}={_get(cfg, key)} must be >= 0, or null to disable this retention rule")
    for key in ("policy.lr", "critic.lr", "policy.warm_start.lr", "launcher.poll_s"):
        if _get(cfg, key) <= 0:
            raise ConfigError(f"{key}={_get(cfg, key)} must be > 0")
    if cfg.schedule.max_off_policy < 0:
        raise ConfigError(f"schedule.max_off_policy={cfg.schedule.max_off_policy} must be >= 0 (0 = on-policy)")
    if not 0 < cfg.advantage.gamma <= 1:
        raise ConfigError(f"advantage.gamma={cfg.advantage.gamma} must be in (0, 1] (1 = undiscounted, the default)")
    for key in ("advantage.lambda_policy", "advantage.lambda_value", "policy.warm_start.target_accuracy"):
        if not 0 <= _get(cfg, key) <= 1:
            raise ConfigError(f"{key}={_get(cfg, key)} must be in [0, 1]")
    if cfg.policy.clip_low >= 1:
        raise ConfigError(f"policy.clip_low={cfg.policy.clip_low} must be < 1 (the ratio clip is [1 - clip_low, "
                          "1 + clip_high]); use e.g. 0.2")
    ev = cfg.critic.warmup.min_explained_variance
    if ev is not None and ev > 1:
        raise ConfigError(f"critic.warmup.min_explained_variance={ev} can never be reached (explained variance is "
                          "at most 1); use a value <= 1, or null for no condition")
    if cfg.critic.value_clip < 0 or (cfg.critic.value_clip > 0 and cfg.critic.loss == "bce"):
        raise ConfigError(f"critic.value_clip={cfg.critic.value_clip} must be >= 0 and is not defined for "
                          "critic.loss=bce; set critic.value_clip=0")
    if not 0 <= cfg.critic.weight_average < 1:
        raise ConfigError(f"critic.weight_average={cfg.critic.weight_average} must be in [0, 1) (the decay of "
                          "the critic's weight average); use e.g. 0.95, or 0 for no average")
    if cfg.launcher.cpus is not None and cfg.launcher.cpus < 1:
        raise ConfigError(f"launcher.cpus={cfg.launcher.cpus} must be >= 1, or null to size the allocation from "
                          "launcher.cpus_per_task")
    if cfg.launcher.name == "slurm" and environment:
        _check_slurm(cfg.launcher)
        from prime_values.launch.slurm import fit_problem, pipeline_request

        problem = fit_problem(pipeline_request(cfg), cfg.launcher.partition)  # a node can hold the whole pipeline
        if problem:
            raise ConfigError(problem)
    from_run = cfg.critic.warm_start.from_run
    if environment and from_run and not (Path(from_run) / "log" / "rollouts").is_dir():
        raise ConfigError(f"critic.warm_start.from_run={from_run!r} has no log/rollouts; point it at the run "
                          "directory of an earlier run (or leave it empty to sample fresh rollouts)")

    def path_like(value: str) -> bool:
        return value.startswith(("/", "./", "../", "~")) or value in (".", "..")

    model = cfg.policy.model
    from prime_values.gguf import GGUFError, check_source as check_gguf, is_gguf

    if is_gguf(model):
        if environment:
            try:
                check_gguf(model, cfg.policy.cache_dir)
            except GGUFError as error:
                raise ConfigError(str(error)) from None
    elif environment and model != "tiny" and not Path(model).expanduser().is_dir() and \
            (path_like(model) or "/" not in model):
        raise ConfigError(f"policy.model={model!r} is neither 'tiny' nor an existing directory; give the path of a "
                          "from_pretrained directory, a hub id like 'Qwen/Qwen3-0.6B', or 'tiny'")
    init = cfg.critic.init
    if environment and init not in ("policy", "scratch") and not Path(init).expanduser().is_dir() and \
            (path_like(init) or "/" not in init):
        raise ConfigError(f"critic.init={init!r} is neither 'policy', 'scratch' nor an existing directory; use "
                          "'policy', 'scratch' or the path of a saved critic")
    layers = cfg.critic.num_layers
    if layers and init in ("policy", "scratch") and model == "tiny" and layers > cfg.policy.arch.num_layers:
        raise ConfigError(f"critic.num_layers={layers} is more than the {cfg.policy.arch.num_layers} transformer "
                          f"blocks the critic starts from (policy.arch.num_layers); choose 1.."
                          f"{cfg.policy.arch.num_layers}, or 0 for all")
    if cfg.critic.privileged:
        try:
            ok = "{privileged" in cfg.critic.template and cfg.critic.template.format(privileged="") is not None
        except (KeyError, IndexError, ValueError):
            ok = False
        if not ok:
            raise ConfigError(f"critic.template={cfg.critic.template!r} must contain '{{privileged}}' and no other "
                              "'{...}' field; e.g. 'answer:{privileged}|', or '{privileged:<3}|' to pad it to 3 "
                              "characters (or set critic.privileged=false)")
    if cfg.policy.attn_implementation == "flash_attention_2" and environment:
        if importlib.util.find_spec("flash_attn") is None:
            raise ConfigError("policy.attn_implementation=flash_attention_2 but flash-attn is not installed: pip "
                              "install flash-attn, or use policy.attn_implementation=auto (sdpa without it)")
        if cfg.policy.dtype == "float32":
            raise ConfigError("policy.attn_implementation=flash_attention_2 needs policy.dtype=bfloat16 or bf16-mixed "
                              "(or auto on CUDA; flash-attn has no float32 kernels), or use "
                              "policy.attn_implementation=auto")
        on_cpu = [f"topology.{r}_device" for r in ("inference", "evaluator", "policy_trainer", "value_trainer")
                  if _get(cfg, f"topology.{r}_device") == "cpu" and not (r == "evaluator" and
                                                                         cfg.topology.evaluator == "colocated")]
        if on_cpu:
            raise ConfigError(f"policy.attn_implementation=flash_attention_2 needs CUDA devices, but {on_cpu[0]}=cpu; "
                              "use policy.attn_implementation=auto (flash where it can run, sdpa elsewhere)")
    arch = cfg.policy.arch
    if arch.num_heads % arch.num_kv_heads:
        raise ConfigError(f"policy.arch.num_heads={arch.num_heads} must be a multiple of policy.arch.num_kv_heads="
                          f"{arch.num_kv_heads} (grouped-query attention)")
    if model == "tiny":
        if cfg.inference.max_new_tokens >= arch.max_position_embeddings:
            raise ConfigError(f"inference.max_new_tokens={cfg.inference.max_new_tokens} leaves no room for the prompt "
                              f"in policy.arch.max_position_embeddings={arch.max_position_embeddings}; lower it or "
                              "raise max_position_embeddings")
        if init in ("policy", "scratch") and cfg.critic.max_length > arch.max_position_embeddings:
            raise ConfigError(f"critic.max_length={cfg.critic.max_length} exceeds policy.arch.max_position_embeddings="
                              f"{arch.max_position_embeddings}, the critic's longest input; lower critic.max_length")
    if cfg.inference.temperature <= 0:
        raise ConfigError(f"inference.temperature={cfg.inference.temperature} must be > 0")
    if cfg.inference.group_size < 2 and cfg.advantage.estimator == "grpo":
        raise ConfigError(f"inference.group_size={cfg.inference.group_size} must be >= 2 for advantage=grpo (a group "
                          "mean of one is the reward: every advantage would be 0); raise inference.group_size or use "
                          "advantage=gae or tether, whose critic baselines a group of one")
    if environment:
        _check_backend(cfg)
    workers = cfg.topology.inference_workers
    if cfg.inference.prompts_per_step % workers:
        raise ConfigError(f"inference.prompts_per_step={cfg.inference.prompts_per_step} must be divisible by "
                          f"topology.inference_workers={workers} (each worker owns an equal slice)")
    if cfg.replay.min_rollouts > cfg.replay.capacity:
        raise ConfigError(f"replay.min_rollouts={cfg.replay.min_rollouts} exceeds replay.capacity="
                          f"{cfg.replay.capacity}; the critic would never start training")
    if cfg.advantage.estimator != "grpo" and cfg.replay.capacity < cfg.critic.batch_rollouts:
        raise ConfigError(f"replay.capacity={cfg.replay.capacity} is smaller than one critic batch "
                          f"(critic.batch_rollouts={cfg.critic.batch_rollouts}); raise replay.capacity or lower "
                          "critic.batch_rollouts")
    if cfg.task.name == "math" and environment:
        if importlib.util.find_spec("math_verify") is None or importlib.util.find_spec("datasets") is None:
            raise ConfigError("task.name=math needs math-verify and datasets: pip install 'prime_values[math]' "
                              "(or pip install -e '.[math]' in a checkout)")
        for key in ("data", "heldout_data"):
            if key == "data" or cfg.task[key]:
                try:
                    resolve_source(cfg.task[key], f"task.{key}", cfg.task.data_cache_dir)
                except MathDataError as error:
                    raise ConfigError(str(error)) from None
    if cfg.task.name == "reasoning_gym":
        if importlib.util.find_spec("math_verify") is None:
            raise ConfigError("task.name=reasoning_gym needs math-verify: pip install 'prime_values[reasoning_gym]' "
                              "(or pip install -e '.[reasoning_gym]' in a checkout)")
        try:
            check_dataset(cfg.task.dataset)
        except ReasoningGymError as error:
            raise ConfigError(str(error)) from None
        if cfg.task.answer_format not in ANSWER_FORMATS:
            raise ConfigError(f"task.answer_format={cfg.task.answer_format!r} is not allowed; choose one of "
                              f"{', '.join(ANSWER_FORMATS)}")
        if "{question}" not in cfg.task.prompt_template:
            raise ConfigError(f"task.prompt_template={cfg.task.prompt_template!r} must contain '{{question}}'")
        if cfg.task.dataset_size <= cfg.task.heldout_size:
            raise ConfigError(f"task.dataset_size={cfg.task.dataset_size} must exceed task.heldout_size="
                              f"{cfg.task.heldout_size}: the held-out problems are carved out of the generated ones")
        if cfg.task.chat and not cfg.task.chat_tokenizer:
            raise ConfigError("task.chat=true needs task.chat_tokenizer (the policy's tokenizer, ${policy.model}); "
                              "or set task.chat=false")
        if cfg.task.chat:
            try:
                check_chat_source(cfg.task.chat_tokenizer)
            except ReasoningGymError as error:
                raise ConfigError(str(error)) from None
    if cfg.task.name == "reverse_text":
        try:
            ReverseTextTask(cfg.task.min_chars, cfg.task.max_chars, cfg.task.alphabet, cfg.task.heldout_size,
                            cfg.task.seed)
        except ValueError as error:
            raise ConfigError(f"task (reverse_text): {error}") from None
        if cfg.inference.max_new_tokens <= cfg.task.max_chars:
            raise ConfigError(f"inference.max_new_tokens={cfg.inference.max_new_tokens} cannot hold a "
                              f"{cfg.task.max_chars}-character answer and its eos; raise it above task.max_chars")
    if cfg.task.name == "verifiers" and environment:
        from prime_values.tasks.verifiers_env import VerifiersUnavailable, check_env_id

        try:
            check_env_id(cfg.task.env_id, cfg.task.env_class)
        except VerifiersUnavailable as error:
            raise ConfigError(str(error)) from None
        for key in ("max_turns", "env_pool"):
            if cfg.task[key] < 1:
                raise ConfigError(f"task.{key}={cfg.task[key]} must be >= 1")
    if cfg.task.name == "arith" and cfg.task.show_work and "*" in cfg.task.ops:
        raise ConfigError(f"task.show_work=true needs task.ops from '+-' (got {cfg.task.ops!r}): running results "
                          "are left to right")
    if cfg.task.name == "arith" and not 0 <= cfg.task.min_digits <= cfg.task.digits:
        raise ConfigError(f"task.min_digits={cfg.task.min_digits} must be in 0..task.digits ({cfg.task.digits}); "
                          "0 draws operands uniformly from [0, 10**digits)")
    for bad in set(cfg.task.ops) - set("+-*"):
        raise ConfigError(f"task.ops={cfg.task.ops!r} contains {bad!r}; use characters from '+-*'")
    if cfg.task.train_pool and cfg.task.name in ("arith", "reverse_text"):  # cheap to draw here, before any job
        try:
            PromptPool(make_task(**cfg.task), cfg.task.train_pool, cfg.task.seed)
        except ValueError as error:
            raise ConfigError(f"task ({cfg.task.name}): {error}") from None
    for role, trainer in (("policy", "policy_trainer"), ("critic", "value_trainer")):
        lora = getattr(cfg, role).lora
        if not lora.enabled:
            continue
        if lora.r < 1 or lora.alpha <= 0 or not 0 <= lora.dropout < 1 or not lora.target_modules:
            raise ConfigError(f"{role}.lora needs r >= 1, alpha > 0, 0 <= dropout < 1 and some target_modules (got "
                              f"r={lora.r}, alpha={lora.alpha}, dropout={lora.dropout}, "
                              f"target_modules={list(lora.target_modules)})")
        if _get(cfg, f"topology.{trainer}_procs") > 1:
            raise ConfigError(f"{role}.lora.enabled=true runs in one process; set topology.{trainer}_procs=1 "
                              f"(LoRA with FSDP is not supported yet)")
        if environment and importlib.util.find_spec("peft") is None:
            raise ConfigError(f"{role}.lora.enabled=true needs peft: pip install 'prime_values[lora]' "
                              "(or pip install -e '.[lora]' in a checkout)")
    w = cfg.critic.warmup
    if cfg.schedule.mode == "lockstep" and (w.min_version > 0 or w.min_explained_variance is not None):
        raise ConfigError("schedule.mode=lockstep with critic.warmup: the lockstep schedule already waits for the critic "
                          "each step; drop critic.warmup.min_version / min_explained_variance, or use schedule.mode=async")
    topo = cfg.topology
    if topo.evaluators < 1 or topo.evaluators > topo.inference_workers:
        raise ConfigError(f"topology.evaluators={topo.evaluators} must be between 1 and topology.inference_workers="
                          f"{topo.inference_workers} (each evaluator scores the rollouts of its own inference workers)")
    if topo.evaluators > 1 and topo.evaluator == "colocated":
        raise ConfigError(f"topology.evaluators={topo.evaluators} needs topology.evaluator=dedicated (a colocated "
                          "evaluator is one scorer inside the value trainer)")
    if cfg.topology.value_trainer_procs > 1 and cfg.topology.evaluator == "colocated":
        raise ConfigError(f"topology.value_trainer_procs={cfg.topology.value_trainer_procs} needs "
                          "topology.evaluator=dedicated (a colocated evaluator scores inside one process)")
    check_wandb(cfg)
    if cuda_count is None and os.environ.get("PRIME_VALUES_CUDA_COUNT", "").isdigit():
        cuda_count = int(os.environ["PRIME_VALUES_CUDA_COUNT"])  # compose for another machine (e.g. --cfg job)
    if cuda_count is None and not environment:
        cuda_count = 1 << 16  # composing for another machine (PRIME_VALUES_CUDA_COUNT unset): any device may exist
    devices = [_get(cfg, f"topology.{role}_device") for role in ("inference", "evaluator", "policy_trainer",
                                                                  "value_trainer")]
    if cuda_count is None and any(d != "cpu" for d in devices):  # an all-CPU run never imports torch here (~2.5 s)
        import torch

        cuda_count = torch.cuda.device_count()
    if cfg.launcher.name == "slurm" or cuda_count is None:
        cuda_count = 1 << 16  # every SLURM job gets its own GPUs (as many as its processes): any index is job-local;
        # or every device is the CPU, and no index is checked
    for role in ("inference", "evaluator", "policy_trainer", "value_trainer"):
        key = f"topology.{role}_device"
        _check_device(key, _get(cfg, key), cuda_count)
    for role, key in (("policy_trainer", "topology.policy_trainer_procs"),
                      ("value_trainer", "topology.value_trainer_procs"), ("inference", "topology.inference_tp")):
        device = _get(cfg, f"topology.{role}_device")
        procs = _get(cfg, key)
        if procs > 1 and device.startswith("cuda:") and int(device[5:]) + procs > cuda_count:
            first = int(device[5:])
            raise ConfigError(f"{key}={procs} needs one GPU per process (rank), cuda:{first}..cuda:{first + procs - 1} from "
                              f"topology.{role}_device={device}, but this machine has "
                              f"{f'cuda:0..cuda:{cuda_count - 1}' if cuda_count else 'no CUDA device'}; lower {key} "
                              f"or start from a lower device")


# --- docs from docstrings --------------------------------------------------------------------------

def field_docs(cls) -> dict[str, str]:
    """The string literal under each dataclass field, by field name."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body
    docs = {}
    for stmt, nxt in zip(body, body[1:]):
        if isinstance(stmt, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[stmt.target.id] = " ".join(str(nxt.value.value).split())
    return docs


def markdown_reference(cls=Config, prefix: str = "") -> list[str]:
    lines = []
    docs = field_docs(cls)
    nested = []
    for f in fields(cls):
        default = f.default_factory() if f.default_factory is not NO_DEFAULT else f.default
        if is_dataclass(default):
            nested.append((f.name, type(default)))
            continue
        lines.append(f"| `{prefix}{f.name}` | `{default!r}` | {docs.get(f.name, '')} |")
    for name, sub in nested:
        lines += markdown_reference(sub, f"{prefix}{name}.")
    return lines


DOC_HEADER = """# Configuration reference

Generated from the dataclass docstrings in `prime_values/config.py` by
`python -m prime_values.config > docs/configuration.md` (a test checks it is current). Groups under `conf/`
choose presets; any key can be overridden on the command line, e.g.
`python -m prime_values +experiment=arith policy.lr=5e-4 topology=colocated`.

| key | default | meaning |
|---|---|---|"""


def configuration_doc() -> str:
    return DOC_HEADER + "\n" + "\n".join(markdown_reference()) + "\n"


if __name__ == "__main__":
    print(configuration_doc(), end="")
