"""A corpus of invalid configs and overrides: each fails before launch with ONE line naming the key and the fix.

Most cases go through `prime_values.__main__.precheck` (what `python -m prime_values` runs before Hydra takes
over; it returns the one-line error or None), a few through the real command to prove exit code 2, one line on
stderr, no traceback and no run directory.

SLURM cases here are the ones decided by the config alone (launcher.nodes / launcher.placement.*, an empty
partition); those that need a cluster (a partition it lacks, a pipeline it cannot hold) are in
tests/launch/test_slurm.py.
Multirun sweeps are prechecked with the first value of each sweep only (`advantage=gae,ppo` passes the
precheck; the `ppo` job fails in the conductor's own validate, after launch).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from prime_values.__main__ import precheck

REPO = Path(__file__).resolve().parents[2]

# (overrides, the key the line must name, a fragment of the fix the line must give)
CORPUS = [
    # typos in keys
    (["policy.lrr=3"], "policy.lrr", "did you mean 'lr'"),
    (["stepz=3"], "stepz", "did you mean 'steps'"),
    (["topology.evaluators=2"], "topology.evaluators=2", "between 1 and topology.inference_workers=1"),
    (["schedule.mode=lock"], "schedule.mode", "async, lockstep"),
    (["schedule.mode=lockstep", "critic.warmup.min_version=2"], "schedule.mode=lockstep", "drop critic.warmup"),
    (["schedule.lockstep_critic_steps=0"], "schedule.lockstep_critic_steps", "must be >= 1"),
    (["topology.inference_workers=2", "topology.evaluators=2", "topology=colocated"], "topology.evaluators=2",
     "needs topology.evaluator=dedicated"),
    (["critic.warmup.min_versoin=2"], "critic.warmup.min_versoin", "did you mean 'min_version'"),
    (["replay.capasity=10"], "replay.capasity", "did you mean 'capacity'"),
    (["+foo=1"], "foo", "remove it"),
    (["+critic.extra_head=true"], "critic.extra_head", "remove it"),
    # each task has its own keys (prime_values/config/task.py)
    (["task.digitz=3"], "task.digitz", "did you mean 'digits'"),
    (["task.dataset=chain_sum"], "task.dataset", "a key of task=reasoning_gym"),
    (["+task.env_id=x"], "task.env_id", "a key of task=verifiers"),
    (["task.name=math"], "task.name=math", "choose the task with task=math"),
    (["task=reverse_text"], "task.min_digits", "set by experiment/arith"),
    # wrong types
    (["policy.lr=fast"], "policy.lr", "could not be converted to Float"),
    (["inference.group_size=1.5"], "inference.group_size", "could not be converted to Integer"),
    (["critic.privileged=maybe"], "critic.privileged", "not a valid bool"),
    (["log.keep_segments=lots"], "log.keep_segments", "could not be converted to Integer"),
    (["seed=abc"], "seed", "could not be converted to Integer"),
    # negative or zero sizes
    (["steps=0"], "steps", "must be >= 1"),
    (["steps=-5"], "steps", "must be >= 1"),
    (["inference.max_new_tokens=0"], "inference.max_new_tokens", "must be >= 1"),
    (["replay.queue_size=-3"], "replay.queue_size", "must be >= 1"),
    (["topology.inference_workers=0"], "topology.inference_workers", "must be >= 1"),
    (["critic.batch_rollouts=0"], "critic.batch_rollouts", "must be >= 1"),
    (["replay.max_reuse=-1"], "replay.max_reuse", "must be >= 0"),
    (["task.train_pool=-1"], "task.train_pool", "must be >= 0"),
    (["policy.micro_batch_rollouts=-2"], "policy.micro_batch_rollouts", "must be >= 0"),
    (["log.keep_weights=0"], "log.keep_weights", "must be >= 1"),
    (["log.keep_segments=-1"], "log.keep_segments", "or null"),
    (["schedule.max_off_policy=-1"], "schedule.max_off_policy", "must be >= 0"),
    (["policy.lr_decay_steps=-1"], "policy.lr_decay_steps", "must be >= 0"),
    # values out of range
    (["policy.lr=-1e-4"], "policy.lr", "must be > 0"),
    (["inference.temperature=0"], "inference.temperature", "must be > 0"),
    (["advantage.gamma=1.5"], "advantage.gamma", "must be in (0, 1]"),
    (["advantage.lambda_value=2"], "advantage.lambda_value", "must be in [0, 1]"),
    (["policy.clip_low=1.5"], "policy.clip_low", "must be < 1"),
    (["critic.warmup.min_explained_variance=2"], "critic.warmup.min_explained_variance", "use a value <= 1"),
    (["critic.value_clip=0.2", "critic.loss=bce"], "critic.value_clip", "set critic.value_clip=0"),
    (["critic.weight_average=1"], "critic.weight_average=1.0", "must be in [0, 1)"),
    (["critic.num_layers=5"], "critic.num_layers=5", "choose 1..4"),
    (["critic.num_layers=-1"], "critic.num_layers=-1", "must be >= 0"),
    # sizes that contradict each other
    (["replay.capacity=32", "replay.min_rollouts=16"], "replay.capacity",
     "raise replay.capacity or lower critic.batch_rollouts"),
    (["replay.min_rollouts=5000"], "replay.min_rollouts", "exceeds replay.capacity"),
    (["advantage=grpo", "inference.group_size=1"], "inference.group_size", "use advantage=gae or tether"),
    # a batch baseline over a batch of one rollout: every advantage 0 (prime_values/config/inference.py)
    (["advantage=batch_loo", "inference.group_size=1", "inference.prompts_per_step=1"],
     "inference.prompts_per_step=1 x inference.group_size=1", "raise inference.prompts_per_step or "
     "inference.group_size so a batch has >= 2 rollouts"),
    (["advantage=batch_mean", "inference.group_size=1", "inference.prompts_per_step=1"],
     "advantage=batch_mean", "use advantage=gae or tether"),
    # launcher.nodes / launcher.placement: SLURM's allocation only, each node index inside it (config/launcher.py)
    (["launcher.nodes=2", "launcher.placement.policy_trainer=[5]"], "launcher.nodes=2",
     "applies to launcher=slurm only (launcher=local runs every role on this one machine); set launcher.nodes=1"),
    (["launcher.placement.policy_trainer=[5]"], "launcher.placement.policy_trainer=[5]",
     "set launcher.placement.policy_trainer=null or use launcher=slurm"),
    (["launcher=slurm", "launcher.nodes=2", "launcher.placement.policy_trainer=[5]"],
     "launcher.placement.policy_trainer=5", "outside the allocation's 0..1; raise launcher.nodes"),
    (["launcher=slurm", "launcher.placement.value_trainer=1"], "launcher.placement.value_trainer=1",
     "outside the allocation's 0..0"),
    (["topology.inference_workers=3"], "topology.inference_workers", "must be divisible"),
    (["critic.max_length=1024"], "critic.max_length", "lower critic.max_length"),
    (["inference.max_new_tokens=300"], "inference.max_new_tokens", "lower it or raise max_position_embeddings"),
    (["policy.arch.num_kv_heads=3"], "policy.arch.num_kv_heads", "must be a multiple"),
    (["critic.template=answer|"], "critic.template", "must contain '{privileged}'"),
    (["critic.template='{privileged:d}|'"], "critic.template", "'{privileged:<3}|' to pad it"),
    # unknown names
    (["task.name=crossword"], "task.name", "choose one of arith"),
    (["task=crossword"], "task/crossword", "available: arith"),
    (["advantage.estimator=ppo"], "advantage.estimator", "choose one of gae, grpo, tether"),
    (["critic.loss=l1"], "critic.loss", "choose one of mse, huber, bce"),
    (["critic.placement=end"], "critic.placement", "choose one of start, response"),
    (["task.ops=+/"], "task.ops", "use characters from '+-*'"),
    (["task.min_digits=3"], "task.min_digits=3", "must be in 0..task.digits (2)"),
    (["task.digits=1", "task.heldout_size=10", "task.train_pool=500"], "task.train_pool=500", "only 90 distinct"),
    # the task's own rules (prime_values/tasks/arith.py check_settings), checked by building it
    (["task.digits=10"], "task.digits=10", "set task.digits (digits per operand) to 1..9"),
    (["task.operands=1"], "task.operands=1", "set task.operands=2 or more"),
    (["task.ops=''"], "task.ops=''", "any of '+-*'"),
    (["task.show_work=true", "task.ops=+*", "task.operands=3"], "task.show_work=true", "task.ops from '+-'"),
    (["task.digits=1", "task.heldout_size=60"], "heldout_size 60", "exceeds half of the 100 possible problems"),
    # the embedded model's token budgets (prime_values/budget.py check_embedded_budget)
    (["critic.max_length=1"], "critic.max_length=1", "raise critic.max_length to >= 18"),
    (["critic.max_length=12"], "critic.max_length=12", "the longest correct replies would be cut"),
    (["policy.arch.max_position_embeddings=12", "critic.max_length=12"], "policy.arch.max_position_embeddings=12",
     "lower inference.max_new_tokens to <= 6"),
    # the stages' rules (prime_values/config/stages.py)
    (["stages=[sft,foo]"], "stages[1]='foo'", "list stages from sft, rl, eval"),
    (["stages=[rl,rl]"], "runs 'rl' twice", "list each stage once"),
    (["stage=train"], "stage='train'", "choose one of sft, rl, eval"),
    (["stages=[]"], "stages is empty", "e.g. stages=[rl,eval]"),
    (["launcher.detach=true", "stages=[rl,eval]"], "launcher.detach=true", "detach `stage=rl`"),
    (["stage=eval"], "stage=eval", "set policy.model=<a from_pretrained directory"),
    (["stages=[eval]"], "stages starting with eval", "set policy.model="),
    (["stages=[sft,rl]"], "sft.data=task", "sft.from_run=<run dir>"),
    (["stages=[sft,rl]", "sft.data=task", "sft.from_run=/x"], "sft.data='task' and sft.from_run='/x'", "keep one"),
    (["stages=[sft,rl]", "sft.from_run=/nonexistent/run"], "sft.from_run='/nonexistent/run'",
     "point it at the run directory"),
    (["stages=[sft,rl]", "sft.data=/nonexistent/sft.jsonl"], "sft.data", "pass a local .jsonl/.parquet path"),
    (["eval.k=[1,16]"], "eval.k contains 16", "raise eval.samples or drop 16"),
    (["launcher.name=k8s"], "launcher.name", "choose one of"),
    (["inference.backend=tgi"], "inference.backend", "choose one of"),
    # unknown group options
    (["topology=ring"], "topology/ring", "available: colocated, cpu, dedicated"),
    (["advantage=ppo"], "advantage/ppo", "available: batch_loo, batch_mean, gae, grpo, linear_mix, reinforce, tether"),
    (["replay=lifo"], "replay/lifo", "available: fifo, recent, uniform"),
    (["critic=huge"], "critic/huge", "available:"),
    # missing paths
    (["policy.model=/nonexistent"], "policy.model", "path of a from_pretrained directory"),
    (["policy.model=tinny"], "policy.model", "or 'tiny'"),
    (["critic.init=/nonexistent"], "critic.init", "the path of a saved critic"),
    (["critic.warm_start.from_run=/nonexistent/run"], "critic.warm_start.from_run", "point it at the run directory"),
    # impossible topologies (the fixture below makes this a machine without CUDA)
    (["topology.inference_device=cuda:3"], "topology.inference_device", "use cpu"),
    (["topology.policy_trainer_device=cuda:0"], "topology.policy_trainer_device", "use cpu"),
    (["topology.evaluator_device=gpu"], "topology.evaluator_device", "use 'cpu', 'auto' or 'cuda:<index>'"),
]


@pytest.fixture(autouse=True)
def no_cuda(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


def test_the_corpus_is_large_and_the_baseline_is_valid():
    assert len(CORPUS) >= 30
    assert len({tuple(overrides) for overrides, *_ in CORPUS}) == len(CORPUS)
    assert precheck(["+experiment=arith"]) is None
    assert precheck(["+experiment=arith", "advantage=grpo", "replay.capacity=8", "replay.min_rollouts=8"]) is None
    for estimator in ("gae", "tether"):  # a group of one: the critic is the baseline (docs/value_functions.md)
        assert precheck(["+experiment=arith", f"advantage={estimator}", "inference.group_size=1"]) is None
    for estimator in ("gae", "tether", "reinforce"):  # a batch of one: the critic's baseline, or none at all
        assert precheck(["+experiment=arith", f"advantage={estimator}", "inference.group_size=1",
                         "inference.prompts_per_step=1"]) is None
    for estimator in ("batch_mean", "batch_loo"):  # two rollouts in a batch: a baseline that is not one's own reward
        assert precheck(["+experiment=arith", f"advantage={estimator}", "inference.group_size=1",
                         "inference.prompts_per_step=2"]) is None
    # launcher=slurm over two nodes, a trainer across both (--cfg job: without this machine's SLURM commands)
    assert precheck(["+experiment=arith", "launcher=slurm", "launcher.nodes=2", "topology.policy_trainer_procs=2",
                     "launcher.placement.policy_trainer=[0,1]", "--cfg", "job"]) is None


@pytest.mark.parametrize("overrides, key, fix", CORPUS, ids=[" ".join(c[0]) for c in CORPUS])
def test_bad_config_fails_before_launch_in_one_line(overrides, key, fix):
    line = precheck(["+experiment=arith", *overrides])
    assert line is not None, f"{overrides} was accepted"
    assert "\n" not in line and "Traceback" not in line, line
    assert key in line, line
    assert fix in line, line


# (experiment, overrides, the key the line must name, a fragment of the fix): the other tasks' rules
OTHER_TASKS = [
    ("reverse_text", ["task.min_chars=0"], "min_chars", "need 1 <= min_chars <= max_chars"),
    ("reverse_text", ["task.alphabet='a|b'"], "alphabet", "other than '|'"),
    ("reverse_text", ["inference.max_new_tokens=8"], "inference.max_new_tokens=8", "raise it above task.max_chars"),
    ("reverse_text", ["critic.max_length=20"], "critic.max_length=20", "raise critic.max_length to >= 35"),
    ("math", ["task.prompt_template=solve"], "task.prompt_template='solve'", "must contain '{question}'"),
    ("arith_chain", ["task.ops=+*"], "task.show_work=true", "task.ops from '+-'"),
    ("arith_work", ["task.operands=1"], "task.operands=1", "set task.operands=2 or more"),
    ("arith", ["task.min_operands=1"], "task.min_operands=1", "0 (off) or in 2..task.operands (2)"),
    ("guess", ["task.min_number=50"], "task.min_number=50", "2..task.max_number (40)"),
    ("guess", ["task.feedback=colour"], "task.feedback", "interval, direction"),
    ("guess", ["inference.max_new_tokens=2"], "inference.max_new_tokens=2", "raise it above 2"),
    ("guess", ["task.max_turns=32", "policy.arch.max_position_embeddings=100", "critic.max_length=100"],
     "task.max_turns", "raise policy.arch.max_position_embeddings"),
    ("guess", ["critic.max_length=30"], "critic.max_length=30", "raise critic.max_length"),
    ("guess", ["inference=vllm"], "task=guess", "use inference=hf"),
    ("tools", ["task.kinds='calc,cook'"], "task.kinds", "calc,look,both,none"),
    ("tools", ["task.kinds=both", "task.max_turns=2"], "task.max_turns=2", "take up to 3 turns"),
    ("tools", ["task.calc_digits=5"], "task.calc_digits=5", "2..task.max_arg_digits (4)"),
    ("tools", ["task.max_call_chars=10"], "task.max_call_chars=10", "must be in 15..256"),
    ("tools", ["task.num_keys=0"], "task.num_keys=0", "must be in 1..10000"),
    ("tools", ["inference.max_new_tokens=8"], "inference.max_new_tokens=8", "raise it above 11"),
    ("tools", ["task.max_turns=32"], "task.max_turns", "raise policy.arch.max_position_embeddings"),
    ("tools", ["critic.max_length=100"], "critic.max_length=100", "raise critic.max_length"),
    ("sudoku", ["inference.max_new_tokens=3"], "inference.max_new_tokens=3", "raise it above 4"),
    ("sudoku", ["task.max_turns=64"], "task.max_turns", "raise policy.arch.max_position_embeddings"),
    ("sudoku", ["critic.max_length=40"], "critic.max_length=40", "raise critic.max_length"),
]


@pytest.mark.parametrize("experiment, overrides, key, fix", OTHER_TASKS,
                         ids=[f"{c[0]} {' '.join(c[1])}" for c in OTHER_TASKS])
def test_other_task_rules_fail_before_launch_in_one_line(experiment, overrides, key, fix):
    line = precheck([f"+experiment={experiment}", *overrides])
    assert line is not None, f"{experiment} {overrides} was accepted"
    assert "\n" not in line and key in line and fix in line, line


def test_every_experiment_is_valid_on_its_own():
    for experiment in ("arith", "arith_work", "arith_chain", "arith_mix", "guess", "tools", "reverse_text", "smollm"):
        assert precheck([f"+experiment={experiment}"]) is None, experiment


def test_the_embedded_budget_counts_the_longest_problem_as_the_char_tokenizer_does():
    """check_embedded_budget's lengths come from the task's settings (max_prompt_chars, max_answer_chars): they are
    the char tokenizer's token counts of the longest problem the task can draw."""
    from omegaconf import OmegaConf

    from prime_values.budget import check_embedded_budget
    from prime_values.config import ArithTaskConfig, ReverseTextTaskConfig, schema
    from prime_values.models.tokenizer import build_char_tokenizer
    from prime_values.tasks import ArithTask, ReverseTextTask

    tokenizer = build_char_tokenizer()

    def count(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False))

    cfg = schema(ArithTaskConfig)
    cfg.task.digits, cfg.task.operands, cfg.task.ops = 3, 3, "+-*"
    task = ArithTask(digits=3, operands=3, ops="+-*")
    longest = task.make_problem([999, 999, 999], ["*", "*"])
    figures = check_embedded_budget(cfg)
    assert figures["longest_prompt"] == count(longest.prompt) == task.max_prompt_chars()
    assert count(longest.answer) <= task.max_answer_chars()
    assert figures["longest_block"] == count(cfg.critic.template.format(privileged="9" * task.max_answer_chars()))
    cfg = OmegaConf.merge(schema(ReverseTextTaskConfig), {"task": {"max_chars": 7}})
    assert check_embedded_budget(cfg)["longest_prompt"] == count(ReverseTextTask(3, 7).make_problem("z" * 7).prompt)
    cfg.policy.model = "/some/model"
    assert check_embedded_budget(cfg) is None  # a real model's budget needs its tokenizer (check_run_budget)


def test_a_run_without_a_critic_is_not_held_to_critic_max_length():
    assert precheck(["+experiment=arith", "advantage=grpo", "critic.max_length=1"]) is None


def test_from_run_without_a_rollout_log(tmp_path):
    line = precheck(["+experiment=arith", f"critic.warm_start.from_run={tmp_path}"])
    assert line is not None and "critic.warm_start.from_run" in line and "has no log/rollouts" in line


@pytest.mark.xfail(strict=True, reason="prime_values.__main__.explain: a Hydra grammar error names the input, not "
                                       "the key (e.g. \"no viable alternative at input '[1,2'\")")
def test_override_syntax_error_names_the_key():
    line = precheck(["+experiment=arith", "policy.lr=[1,2"])
    assert line is not None and "\n" not in line
    assert "policy.lr" in line


def test_slurm_without_partition():
    line = precheck(["+experiment=arith", "launcher=slurm", "launcher.partition="])
    assert line is not None and "launcher.partition" in line and "unknown config key" not in line, line



@pytest.mark.parametrize("overrides, key", [
    (["replay.capasity=10"], "replay.capasity"),
    (["topology.inference_device=cuda:3"], "topology.inference_device"),
    (["schedule.max_off_policy=-1"], "schedule.max_off_policy"),
    (["task.digits=10"], "task.digits=10"),
    (["launcher.nodes=2", "launcher.placement.policy_trainer=[5]"], "launcher.nodes=2"),
    (["advantage=batch_loo", "inference.group_size=1", "inference.prompts_per_step=1"],
     "inference.prompts_per_step=1 x inference.group_size=1"),
])
def test_real_command_exits_2_with_one_line_and_no_run_dir(tmp_path, overrides, key):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "prime_values", "+experiment=arith", *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("prime_values: config error: ") and key in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not run_dir.exists() and not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()
