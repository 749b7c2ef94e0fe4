"""Rollouts that carry images: the tiny vision-language policy, the counting task, the content-addressed image store,
and every forward that reads a rollout getting that rollout's image (the sampler, the policy trainer's recompute,
the critic's scoring and training, the warm start's SFT)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
import torch

from prime_values.config import ConfigError
from prime_values.critic_io import CriticInputs, critic_step, rollout_logprobs
from prime_values.log import SegmentWriter, read_segment
from prime_values.log.images import ImageError, ImageStore, image_digest
from prime_values.models import build_critic, load_critic, load_policy, save_model
from prime_values.models.build import build_tiny_vl_policy
from prime_values.models.vision import attach_image_store, build_vl_tokenizer, image_tokens, tiny_vl_config
from prime_values.roles.inference import env_rows
from prime_values.supervised import sft_batch, sft_loss
from prime_values.tasks import make_task
from prime_values.tasks.vision import VisionTask, check_settings
from tests.e2e_helpers import compose


class CriticSettings:  # the critic section's keys CriticInputs.of reads: privileged, the answer before the trace
    template, privileged, max_length, placement, pack_sequences = "{privileged}|", True, 256, "start", False


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A run directory holding policy and critic version 0 of the tiny VL model and one chunk of vision rollouts
    (3 problems x 2 samples) whose images are in the run's store: what the trainers and the evaluator read."""
    root = tmp_path_factory.mktemp("vision_run")
    tokenizer = build_vl_tokenizer()
    policy = build_tiny_vl_policy(tokenizer, seed=0)
    task = VisionTask(heldout_size=16)
    problems = [p for p in task.sample(random.Random(3), 40) if p.answer in "13"]
    problems = [next(p for p in problems if p.answer == "1"), next(p for p in problems if p.answer == "3")]
    rollouts = task.rollout(policy, tokenizer, problems, num_samples=2, max_new_tokens=4, temperature=1.0, seed=5)
    store = ImageStore(root / "log" / "images")
    rows = env_rows(problems, rollouts, 0, "w0", 0, store)
    save_model(policy, tokenizer, root / "weights" / "policy" / "0")
    critic = build_critic(root / "weights" / "policy" / "0", tokenizer, seed=1, depth=1)
    save_model(critic, tokenizer, root / "weights" / "critic" / "0")
    return {"root": root, "tokenizer": tokenizer, "task": task, "problems": problems, "rollouts": rollouts,
            "rows": rows, "store": store}


def policy_logprobs(run, rows) -> torch.Tensor:
    policy = load_policy(run["root"] / "weights" / "policy" / "0")  # finds the run's images by itself
    return rollout_logprobs(policy, rows, run["tokenizer"].pad_token_id, "cpu", 1.0, pack=False)


def sampled(rollout) -> torch.Tensor:
    return torch.tensor(rollout.logprobs)


def recomputed(logprobs: torch.Tensor, rollouts) -> list[torch.Tensor]:
    return [logprobs[b, : len(r.token_ids)] for b, r in enumerate(rollouts)]


# --- the model ------------------------------------------------------------------------------------------------------

def test_the_tiny_vl_policy_saves_and_loads_and_reads_its_image_as_four_tokens(run):
    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    assert type(policy).__name__ == "Qwen2VLForConditionalGeneration"
    assert policy.config.text_config.hidden_size == 64 and policy.config.text_config.num_hidden_layers == 2
    assert policy.config.vision_config.depth == 2 and policy.config.vision_config.patch_size == 8
    png = run["task"].image(run["problems"][0])
    assert image_tokens(policy.config, png) == 4  # 32 px: a 4x4 patch grid, 2x2 patches per token
    critic = load_critic(run["root"] / "weights" / "critic" / "0")
    assert type(critic).__name__ == "Qwen2VLForTokenValue" and critic.config.text_config.num_hidden_layers == 1


def test_a_text_only_tokenizer_is_refused_in_one_sentence():
    from prime_values.models import build_char_tokenizer

    with pytest.raises(ValueError, match="set policy=tiny_vl"):
        tiny_vl_config(build_char_tokenizer())


# --- the policy trainer's recompute reads the rollout's own image --------------------------------------------------

def test_the_trainers_logprobs_equal_the_samplers_with_the_image(run):
    logprobs = policy_logprobs(run, run["rows"])
    for rollout, row_logprobs in zip(run["rollouts"], recomputed(logprobs, run["rollouts"])):
        mask = torch.tensor(rollout.policy_mask, dtype=torch.bool)
        torch.testing.assert_close(row_logprobs[mask], sampled(rollout)[mask], atol=1e-5, rtol=0)


def test_an_image_swapped_between_rollouts_changes_the_logprobs(run):
    rows = run["rows"]
    assert rows[0]["images"] == rows[1]["images"] != rows[2]["images"]  # one image per group, stored once
    swapped = [{**row, "images": rows[(b + 2) % len(rows)]["images"]} for b, row in enumerate(rows)]
    logprobs = policy_logprobs(run, swapped)
    gaps = []
    for rollout, row_logprobs in zip(run["rollouts"], recomputed(logprobs, run["rollouts"])):
        mask = torch.tensor(rollout.policy_mask, dtype=torch.bool)
        gaps.append(float((row_logprobs.detach()[mask] - sampled(rollout)[mask]).abs().max()))
    assert min(gaps) > 1e-4, f"the recompute did not read the image it was given: {gaps}"


def test_rollouts_whose_images_were_dropped_are_refused_not_recomputed_blind(run):
    dropped = [{**row, "images": []} for row in run["rows"]]
    with pytest.raises(ValueError, match=r"rollout w0-000000-0000 has 4 image tokens but .* take 0"):
        policy_logprobs(run, dropped)


def test_the_batches_stream_carries_the_images_to_the_policy_trainer(run, tmp_path):
    """The orchestrator's batch rows keep each rollout's image hashes (roles/orchestrator.batch_rows)."""
    from prime_values.roles.orchestrator import batch_rows, target_rows

    class Group:  # the fields of a ScoredGroup batch_rows and target_rows read
        rollouts = run["rows"]
        advantages = torch.zeros(len(run["rows"]), 20)
        mask = torch.zeros(len(run["rows"]), 20, dtype=torch.bool)
        targets = torch.zeros(len(run["rows"]), 20)
        critic_versions = [0] * len(run["rows"])
        values = [{"critic_version": 0, "values": [], "token_digest": 0}] * len(run["rows"])

    batch = batch_rows(1, [Group], whiten_advantages=False)
    assert [r["images"] for r in batch] == [r["images"] for r in run["rows"]]
    assert [r["images"] for r in target_rows(Group)] == [r["images"] for r in run["rows"]]
    with SegmentWriter(tmp_path / "batches", "main", "batches") as writer:
        writer.append(batch)
    table = read_segment(next((tmp_path / "batches" / "main").glob("*.arrow")), "batches")
    assert table.column("images").to_pylist() == [r["images"] for r in run["rows"]]


# --- the critic reads the image and the answer --------------------------------------------------------------------

def test_the_critic_scores_every_state_with_the_image_and_the_answer(run):
    critic = load_critic(run["root"] / "weights" / "critic" / "0")
    tokenizer, rows = run["tokenizer"], run["rows"]
    with torch.no_grad():
        inputs = CriticInputs.of(rows, tokenizer, CriticSettings)
        values = inputs.values(critic, "mse")
        other = CriticInputs.of([{**row, "images": rows[(b + 2) % len(rows)]["images"]} for b, row in enumerate(rows)],
                                tokenizer, CriticSettings).values(critic, "mse")
    prefix = tokenizer.encode(CriticSettings.template.format(privileged=rows[0]["privileged"]))
    assert inputs.input_ids[0, : len(prefix)].tolist() == prefix  # the answer, then the trace with its image
    image_id = critic.config.image_token_id
    assert int((inputs.input_ids[0] == image_id).sum()) == 4
    mask = inputs.policy_mask
    assert bool((values[mask] != 0).all()) and bool((values[~mask] == 0).all())  # every policy token's state
    assert float((values - other)[mask].abs().min()) > 1e-5, "the critic's values do not depend on the image"


# --- the value trainer's step reads the image --------------------------------------------------------------------

def critic_after_one_step(run, rows, cfg):
    """The critic version 0 of the run after one critic_step on `rows` (the value trainer's step), and its stats."""
    torch.manual_seed(0)
    critic = load_critic(run["root"] / "weights" / "critic" / "0").train()
    optimizer = torch.optim.AdamW(critic.parameters(), lr=cfg.critic.lr)
    stats = critic_step(critic, optimizer, rows, run["tokenizer"], cfg, "cpu")
    return critic, stats


def test_the_value_trainers_step_trains_the_critic_on_the_rollouts_images(run):
    cfg = compose(["+experiment=vision"])
    rows = [{**row, "value_targets": [row["reward"]] * len(row["token_ids"])} for row in run["rows"]]
    before = load_critic(run["root"] / "weights" / "critic" / "0").state_dict()
    critic, stats = critic_after_one_step(run, rows, cfg)
    assert stats["value_loss"] > 0 and stats["grad_norm"] > 0
    after = critic.state_dict()
    tower = [k for k in before if k.startswith("model.visual.")]
    assert tower and all(not torch.equal(before[k], after[k]) for k in tower[:4]), \
        "the vision tower got no gradient: the critic's step did not read the pixels"
    swapped = [{**row, "images": rows[(b + 2) % len(rows)]["images"]} for b, row in enumerate(rows)]
    other, _ = critic_after_one_step(run, swapped, cfg)
    head = "score.weight"
    assert float((after[head] - other.state_dict()[head]).abs().max()) > 0, \
        "the step is the same with another rollout's image"
    with pytest.raises(ValueError, match="image tokens but its 0 image"):
        critic_after_one_step(run, [{**row, "images": []} for row in rows], cfg)


# --- the warm start's SFT reads the image ----------------------------------------------------------------------

def test_the_sft_batch_lays_out_the_image_as_the_rollouts_do_and_its_loss_reads_the_pixels(run):
    tokenizer, task, problems = run["tokenizer"], run["task"], run["problems"]
    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    ids, mask, labels, images = sft_batch(tokenizer, task, problems, policy.config)
    for b, (problem, rollout) in enumerate(zip(problems, run["rollouts"][::2])):
        prompt = [t for t, m in zip(rollout.token_ids, rollout.policy_mask) if not m]
        assert ids[b, : len(prompt)].tolist() == prompt  # the placeholders, then "count red:", as sampled
        assert images[b] == [task.image(problem)]
        answer = tokenizer.encode(problem.answer) + [tokenizer.eos_token_id]
        assert [t for t in labels[b].tolist() if t != -100] == answer  # only the count and eos are learned
    loss, metrics = sft_loss(policy, ids, mask, labels, images)
    assert loss.requires_grad and 0 < metrics["loss"] < 10
    other, _ = sft_loss(policy, ids, mask, labels, images[::-1])
    assert abs(float(other.detach()) - float(loss.detach())) > 1e-6, "the SFT loss does not depend on the image"
    with pytest.raises(ValueError, match="sft_batch needs the policy's config"):
        sft_batch(tokenizer, task, problems)


# --- the image store ------------------------------------------------------------------------------------------------

def test_images_are_stored_once_by_content_and_the_log_stays_readable_with_pyarrow(run, tmp_path):
    store, rows = run["store"], run["rows"]
    files = sorted(store.root.rglob("*.png"))
    assert len(files) == 2 and {f.stem for f in files} == {h for row in rows for h in row["images"]}
    png = run["task"].image(run["problems"][0])
    assert image_digest(png) == rows[0]["images"][0] and store.put(png) == rows[0]["images"][0]
    assert len(sorted(store.root.rglob("*.png"))) == 2 and not list(store.root.rglob(".*"))
    with SegmentWriter(tmp_path / "rollouts", "w0", "rollouts") as writer:
        writer.append(rows)
    path = next((tmp_path / "rollouts" / "w0").glob("*.arrow"))
    table = pa.ipc.open_file(pa.OSFile(str(path))).read_all()  # plain pyarrow, no Prime Values
    assert table.column("images").to_pylist() == [row["images"] for row in rows]


def test_a_missing_or_corrupt_image_is_one_sentence_naming_the_file(tmp_path, run):
    store = ImageStore(tmp_path / "images")
    digest = store.put(run["task"].image(run["problems"][0]))
    store.path(digest).write_bytes(b"\x89PNG not really")
    with pytest.raises(ImageError, match=rf"image {store.path(digest)} is corrupt: .*delete it"):
        store.get(digest)
    store.path(digest).unlink()
    with pytest.raises(ImageError, match=rf"image {store.path(digest)} is missing"):
        store.get(digest)


def test_a_model_outside_a_run_must_be_given_its_image_store(run):
    policy = build_tiny_vl_policy(run["tokenizer"], seed=0)
    with pytest.raises(ValueError, match="the model has no image store"):
        rollout_logprobs(policy, run["rows"], 0, "cpu", 1.0, pack=False)
    attach_image_store(policy, run["store"])
    assert rollout_logprobs(policy, run["rows"], 0, "cpu", 1.0, pack=False).shape[0] == len(run["rows"])


# --- the task -------------------------------------------------------------------------------------------------------

def test_the_task_draws_the_same_image_in_every_process_and_scores_the_count():
    task = make_task("vision", heldout_size=30, seed=7)
    again = VisionTask(heldout_size=30, seed=7)
    assert [task.image(p) for p in task.heldout()] == [again.image(p) for p in again.heldout()]
    train = task.sample(random.Random(0), 200)
    assert not any(task.is_heldout(p) for p in train)
    assert {p.answer for p in train} == {"0", "1", "2", "3"}  # several difficulties in one stream
    problem = train[0]
    assert problem.privileged == problem.answer
    assert task.score_many([problem] * 3, [problem.answer, f" {problem.answer}<eos>", "9"]) == [1.0, 1.0, 0.0]
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(task.image(problem))).convert("RGB")
    reds = sum(1 for x in range(4) for y in range(4) if image.getpixel((x * 8 + 4, y * 8 + 4)) == (220, 30, 30))
    assert str(reds) == problem.answer


@pytest.mark.parametrize("kwargs, key", [({"max_count": 0}, "task.max_count"),
                                         ({"distractors": 15}, "task.distractors"), ({"size": 40}, "task.size")])
def test_bad_task_settings_name_their_key(kwargs, key):
    with pytest.raises(ValueError, match=key):
        check_settings(**{"max_count": 3, "distractors": 2, "size": 32, **kwargs})


# --- what the pipeline refuses, in one sentence ---------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["task=vision"], "policy.model=tiny .*cannot see; set policy=tiny_vl"),
    (["task=vision", "policy=tiny_vl", "policy.pack_sequences=true"], "set policy.pack_sequences=false"),
    (["task=vision", "policy=tiny_vl", "inference=vllm"], "use inference=hf"),
    (["task=arith", "policy=tiny_vl"], "policy.model=tiny_vl is the vision-language policy of task=vision"),
])
def test_what_the_pipeline_cannot_run_yet_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(["+experiment=embedded", *overrides])
