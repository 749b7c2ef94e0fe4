"""bench/versus_trl.py sets the same work on both sides: the project's composed config and TRL's GRPOConfig
arguments say the same budget, sampling, loss, optimiser and precision (no TRL training runs here)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.common import compose
from bench.versus_trl import ARITH, GPU, SMOLLM, project_overrides, same_work, trl_arguments, warm_start_overrides


@pytest.mark.parametrize("work", [ARITH, SMOLLM, GPU, dataclasses.replace(ARITH, micro_batch=32)],
                         ids=["arith", "smollm", "gpu", "arith-micro-batches"])
@pytest.mark.parametrize("cell", ["grpo", "readme"])
def test_both_sides_are_set_to_the_same_work(work, cell, tmp_path):
    if cell not in work.cells:
        return
    cfg = compose(project_overrides(work, cell, 3, tmp_path / "policy0"))
    args = trl_arguments(work, 3, tmp_path / "trl")
    # the start policy and the seed
    assert cfg.policy.model == str(tmp_path / "policy0") and cfg.policy.warm_start.steps == 0
    assert cfg.seed == 3 == args["seed"]
    # the rollout budget: steps x prompts x group, the same sampling
    assert cfg.steps == work.steps == args["max_steps"]
    assert cfg.inference.prompts_per_step * cfg.inference.group_size == work.rollouts_per_step
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == work.rollouts_per_step
    assert cfg.inference.group_size == args["num_generations"] == work.group
    assert cfg.inference.max_new_tokens == args["max_completion_length"] == work.new_tokens
    assert cfg.inference.temperature == args["temperature"] == work.temperature
    assert args["top_p"] == 1.0 and args["top_k"] == 0 and args["repetition_penalty"] == 1.0
    # the loss: PPO-clip at the same epsilon both sides, no KL, token-mean over the batch, one pass per batch
    assert cfg.policy.trust_region == "clip"
    assert cfg.policy.clip_low == cfg.policy.clip_high == args["epsilon"] == args["epsilon_high"] == work.clip
    assert cfg.policy.kl_coef == 0 == args["beta"]
    assert args["loss_type"] == "dapo" and args["num_iterations"] == 1
    assert args["importance_sampling_level"] == "token" and not args["mask_truncated_completions"]
    if cell == "grpo":  # R - mean(R of the group), unscaled, not whitened
        assert cfg.advantage.estimator == "grpo" and not cfg.advantage.grpo_std and not cfg.advantage.whiten
        assert args["scale_rewards"] == "none"
    # the optimiser: AdamW, constant lr, no weight decay, the same clip
    assert cfg.policy.lr == args["learning_rate"] == work.lr
    assert cfg.policy.lr_decay_steps == 0 and args["lr_scheduler_type"] == "constant" and args["warmup_steps"] == 0
    assert cfg.policy.weight_decay == 0 == args["weight_decay"]
    assert cfg.policy.max_grad_norm == args["max_grad_norm"] == work.max_grad_norm
    assert (args["optim"], args["adam_beta1"], args["adam_beta2"], args["adam_epsilon"]) == \
        ("adamw_torch", 0.9, 0.999, 1e-8)  # torch.optim.AdamW's defaults, the policy trainer's optimiser
    # precision and memory: fp32 (or bf16 autocast) on both, no checkpointing
    assert cfg.policy.dtype == work.precision
    assert args["bf16"] == (work.precision == "bf16-mixed") and not args["fp16"]
    assert not cfg.policy.activation_checkpointing and not args["gradient_checkpointing"]
    assert cfg.policy.micro_batch_rollouts == work.micro_batch
    # the held-out evaluation's period, nothing sent anywhere
    assert cfg.eval_every == work.eval_every and args["report_to"] == "none"
    # the device: every role and TRL on it; vLLM samples on both sides of a GPU work
    roles = ("inference_device", "evaluator_device", "policy_trainer_device", "value_trainer_device")
    assert {cfg.topology[r] for r in roles} == {work.device}
    assert args["use_cpu"] == (work.device == "cpu")
    assert (cfg.inference.backend == "vllm") == args.get("use_vllm", False) == (work.device != "cpu")


def test_the_readme_cell_s_own_overrides_reach_it_alone(tmp_path):
    work = dataclasses.replace(ARITH, readme_extra=("replay.ratio=0.5",))
    readme = compose(project_overrides(work, "readme", 0, tmp_path / "policy0"))
    grpo = compose(project_overrides(work, "grpo", 0, tmp_path / "policy0"))
    assert readme.replay.ratio == 0.5 and grpo.replay.ratio == compose(["+experiment=arith"]).replay.ratio != 0.5
    # a record of the default work (made before the key existed) is the same work; one with overrides is not
    default = json.loads(json.dumps(dataclasses.asdict(ARITH)))
    assert same_work({k: v for k, v in default.items() if k != "readme_extra"}) == same_work(default)
    assert same_work(json.loads(json.dumps(dataclasses.asdict(work)))) != same_work(default)


@pytest.mark.parametrize("work", [ARITH, SMOLLM, GPU], ids=["arith", "smollm", "gpu"])
def test_the_start_policy_s_one_step_run_has_groups_grpo_can_use(work):
    cfg = compose(warm_start_overrides(work))  # the SmolLM2 recipe samples groups of 1: grpo refuses them
    assert cfg.advantage.estimator == "grpo" and cfg.inference.group_size == work.group >= 2
    assert cfg.inference.prompts_per_step == work.prompts and cfg.steps == 1


def test_trl_takes_the_arguments_as_given(tmp_path):
    """GRPOConfig accepts every argument and keeps what the comparison depends on (TRL is in the test extra, at
    the peer extra's version)."""
    from trl import GRPOConfig

    names = {f.name for f in dataclasses.fields(GRPOConfig)}
    assert not set(trl_arguments(GPU, 0, tmp_path / "trl")) - names, "the GPU work names no argument TRL lacks"

    for work in (ARITH, SMOLLM):
        given = trl_arguments(work, 0, tmp_path / "trl")
        config = GRPOConfig(**given)
        for key in ("num_generations", "max_completion_length", "temperature", "beta", "epsilon", "epsilon_high",
                    "loss_type", "scale_rewards", "learning_rate", "max_grad_norm", "weight_decay", "bf16",
                    "gradient_checkpointing", "num_iterations", "per_device_train_batch_size",
                    "gradient_accumulation_steps", "max_steps"):
            assert getattr(config, key) == given[key], key
        assert getattr(config.lr_scheduler_type, "value", config.lr_scheduler_type) == "constant"
        assert not getattr(config, "activation_checkpointing", False)  # transformers 5's name for it
        # one generation per optimizer step: TRL's importance ratio is exactly 1
        assert config.steps_per_generation == given["gradient_accumulation_steps"]


def test_trl_sees_the_project_s_prompt_tokens():
    """The tiny model's tokenizer adds no special token when TRL calls it on the text, so TRL generates from the
    very token ids the project's sampler gets (rollout.encode_prompts)."""
    from prime_values.models.tokenizer import build_char_tokenizer
    from prime_values.rollout import encode_prompts
    from prime_values.tasks import make_task

    task = make_task(**compose(["+experiment=arith"]).task)
    problems = task.heldout()[:16]
    tokenizer = build_char_tokenizer()
    assert tokenizer(text=[p.prompt for p in problems])["input_ids"] == encode_prompts(tokenizer, problems)


def test_which_cells_ran_is_not_part_of_the_work():
    import dataclasses

    assert same_work(dataclasses.asdict(ARITH)) == same_work(dataclasses.asdict(dataclasses.replace(ARITH,
                                                                                                     cells=("trl",))))
    assert same_work(dataclasses.asdict(ARITH)) != same_work(dataclasses.asdict(dataclasses.replace(ARITH, steps=5)))
