"""Counting shapes in a picture: ``"count red:"`` under a small drawn image -> ``"3"``.

Each problem is a scene drawn with PIL on a white square of ``size`` pixels, split into a 4x4 grid of cells: each
cell holds at most one shape (a disc or a square, never touching another), so the count is never ambiguous. The
scene has ``count`` red shapes, uniform in ``0..max_count``, and ``others`` shapes of another colour (blue or
green), uniform in ``0..distractors``: problems of several difficulties in one stream (more shapes, more
distractors). The answer is the number of red shapes; the critic's privileged text is that answer.

A scene is the problem (``meta['scene']``), so its image is drawn again wherever it is needed (``image``), the
same PNG bytes in every process; ``prompt_id`` hashes the scene. The held-out set is drawn once from ``seed``; the
training stream never yields a held-out scene.

The policy reads the image through a vision-language model (policy=tiny_vl, or a Qwen2-VL checkpoint such as
policy=qwen2_vl_2b): ``rollout`` samples each prompt with its image -- through the transformers model
(``models.vision.sample_with_images``) or an inference backend that samples with images itself
(``sample_images``: inference=vllm, backends/vllm.py) -- and returns ``VisionRollout``s, which carry the PNG bytes
the inference role stores in the run's image store (log/images.py) and refers to by hash. ``score`` is an exact
match of the count (surrounding whitespace and a trailing ``<eos>`` ignored), O(answer length).

Bad input is one sentence naming what to change, raised before anything is sampled or stored (``check_image``,
``check_policy``): an image that does not decode, an image larger than the policy's image processor reads whole
(its ``max_pixels``, which would otherwise be downscaled without a word), and a text-only policy.
"""

from __future__ import annotations

import functools
import hashlib
import io
import random
from dataclasses import dataclass, field

from PIL import Image, ImageDraw

from prime_values.rollout import EnvRollout

from .arith import Problem, strip_eos

PROMPT = "count red:"
CELLS = 4  # the image is a CELLS x CELLS grid of cells, one shape at most in each
COLOURS = {"red": (220, 30, 30), "blue": (30, 60, 220), "green": (30, 160, 50)}
SIZES = (32, 48, 64)


def check_settings(max_count: int, distractors: int, size: int) -> None:
    """The task's rules (the constructor and the config check call this): ValueError naming the `task.*` key."""
    if not 1 <= max_count <= 9:
        raise ValueError(f"task.max_count={max_count} must be in 1..9 (a one-digit answer); set task.max_count")
    if not 0 <= distractors <= CELLS * CELLS - max_count:
        raise ValueError(f"task.distractors={distractors} must be in 0..{CELLS * CELLS - max_count} (a {CELLS}x{CELLS} "
                         f"grid holds {CELLS * CELLS} shapes, task.max_count={max_count} of them red); lower it")
    if size not in SIZES:
        raise ValueError(f"task.size={size} must be one of {', '.join(map(str, SIZES))} pixels (a multiple of the "
                         "16-pixel image token of policy=tiny_vl); set task.size")


def max_pixels(config) -> int:
    """The most pixels an image may have and still be read whole by the policy's image processor
    (``models.vision.image_processor``: Qwen2-VL's ``max_pixels``, its ``size['longest_edge']``); the processor would
    downscale a larger one before the vision tower without a word, so the policy would count shapes in a picture
    other than the one the task drew and stored."""
    from prime_values.models.vision import image_processor

    size = image_processor(config).size
    return int(size["longest_edge"] if isinstance(size, dict) else size.longest_edge)


def check_image(png: bytes, config, where: str, key: str = "task.size") -> None:
    """`png` decodes as an image and fits the policy's image processor (``max_pixels``): else one ValueError naming
    the image (`where`) and the fix (`key`, the setting that makes the task's images smaller)."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            image.load()
            width, height = image.size
    except Exception as error:  # noqa: BLE001 - PIL raises several kinds for bytes that are not an image
        raise ValueError(f"image {where} does not decode as an image ({type(error).__name__}: {error}); the task "
                         "must give PNG bytes (VisionTask.image)") from None
    limit = max_pixels(config)
    if width * height > limit:
        raise ValueError(f"image {where} is {width}x{height} = {width * height} pixels, more than the policy's image "
                         f"processor reads whole (max_pixels = {limit}, models.vision.image_processor); make the "
                         f"task's images smaller ({key})")


def check_policy(tokenizer, config) -> None:
    """The policy can read images: a Qwen2-VL config (models.vision.is_vision_config) and a tokenizer with the vision
    tokens; else one ValueError naming policy.model."""
    from prime_values.models.vision import is_vision_config, vision_token_ids

    if not is_vision_config(config):
        kind = getattr(config, "model_type", type(config).__name__)
        raise ValueError(f"task=vision reads images, but the policy is a text-only model (model_type {kind!r}); set "
                         "policy.model to a Qwen2-VL model: policy=tiny_vl (embedded) or policy=qwen2_vl_2b")
    vision_token_ids(tokenizer)  # a tokenizer without the vision tokens: one sentence naming policy=tiny_vl


@dataclass
class VisionRollout(EnvRollout):
    """A scored single reply to a prompt with images: the PNG bytes of its images, in the order of their
    placeholders in ``token_ids`` (the inference role stores them and records their hashes)."""

    images: list[bytes] = field(default_factory=list)


class VisionTask:
    name = "vision"
    rollout_takes_backend = True
    """``rollout`` takes the inference backend itself (hf or vllm: ``_image_sampler``), not only a transformers model"""

    def __init__(self, max_count: int = 3, distractors: int = 2, size: int = 32, heldout_size: int = 200,
                 seed: int = 1234):
        check_settings(max_count, distractors, size)
        self.max_count, self.distractors, self.size = max_count, distractors, size
        self.heldout_size, self.seed = heldout_size, seed
        self._tag = f"vision-c{max_count}-d{distractors}-s{size}"
        rng = random.Random(f"{self._tag}-heldout-{seed}")
        held: dict[str, Problem] = {}
        while len(held) < heldout_size:
            problem = self._draw(rng)
            held.setdefault(problem.prompt_id, problem)
        self._heldout = list(held.values())

    # ------------------------------------------------------------------ problems
    def _draw(self, rng: random.Random) -> Problem:
        count, others = rng.randint(0, self.max_count), rng.randint(0, self.distractors)
        cells = rng.sample(range(CELLS * CELLS), count + others)
        scene = tuple(sorted((cell, "red" if k < count else rng.choice(("blue", "green")),
                              rng.choice(("disc", "square"))) for k, cell in enumerate(cells)))
        pid = f"{self._tag}:{hashlib.sha1(repr(scene).encode()).hexdigest()[:12]}"
        return Problem(prompt_id=pid, prompt=PROMPT, answer=str(count), privileged=str(count),
                       meta={"scene": scene})

    def sample(self, rng: random.Random, n: int) -> list[Problem]:
        held = {p.prompt_id for p in self._heldout}
        out: list[Problem] = []
        while len(out) < n:
            problem = self._draw(rng)
            if problem.prompt_id not in held:
                out.append(problem)
        return out

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return problem.prompt_id in {p.prompt_id for p in self._heldout}

    def image(self, problem: Problem) -> bytes:
        """The problem's picture as PNG bytes (the same bytes in every process)."""
        image = Image.new("RGB", (self.size, self.size), (255, 255, 255))
        draw = ImageDraw.Draw(image)
        cell = self.size // CELLS
        margin = max(1, cell // 6)
        for index, colour, shape in problem.meta["scene"]:
            x, y = (index % CELLS) * cell, (index // CELLS) * cell
            box = (x + margin, y + margin, x + cell - margin - 1, y + cell - margin - 1)
            (draw.ellipse if shape == "disc" else draw.rectangle)(box, fill=COLOURS[colour])
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")  # no timestamp or text chunk: the same bytes for the same pixels
        return buffer.getvalue()

    # ------------------------------------------------------------------ verifier
    def score(self, problem: Problem, response_text: str) -> float:
        if not isinstance(response_text, str) or len(response_text) > 16:
            return 0.0
        return 1.0 if strip_eos(response_text) == problem.answer else 0.0

    def score_many(self, problems: list, texts: list[str]) -> list[float]:
        return [self.score(p, t) for p, t in zip(problems, texts)]

    def max_answer_chars(self) -> int:
        return 1

    def solution(self, problem: Problem) -> str:
        return problem.answer

    def describe(self) -> dict:
        return {"name": self.name, "max_count": self.max_count, "distractors": self.distractors, "size": self.size,
                "heldout_size": self.heldout_size, "seed": self.seed, "prompt": PROMPT}

    # ------------------------------------------------------------------ rollouts with images
    def prompt_ids(self, tokenizer, config, problem: Problem) -> tuple[list[int], bytes]:
        """The prompt's token ids (image placeholders, then the text) and the image's PNG bytes; the policy and the
        image checked first (``check_policy``, ``check_image``: one sentence each)."""
        from prime_values.models.vision import prompt_ids

        check_policy(tokenizer, config)
        png = self.image(problem)
        check_image(png, config, f"of problem {problem.prompt_id}")
        return prompt_ids(tokenizer, config, png, problem.prompt), png

    def rollout(self, model, tokenizer, problems, num_samples: int, max_new_tokens: int, temperature: float,
                seed: int, batch_size: int | None = None) -> list[VisionRollout]:
        """``num_samples`` scored replies per problem, each sampled with the problem's image (grouped by problem).
        ``model``: a transformers model, an hf backend (its model), or a backend that samples with images itself
        (``sample_images`` and ``config``: backends/vllm.py), which gets the same prompt ids and PNG bytes. Every
        prompt is laid out and checked before anything is sampled."""
        sample, config = _image_sampler(model)
        laid_out = [self.prompt_ids(tokenizer, config, p) for p in problems]
        step = max(1, (batch_size or len(problems) * num_samples) // num_samples)
        out: list[VisionRollout] = []
        for begin in range(0, len(problems), step):
            chunk = laid_out[begin: begin + step]
            completions = sample([ids for ids, _ in chunk], [[png] for _, png in chunk], num_samples, max_new_tokens,
                                 temperature, tokenizer.eos_token_id, tokenizer.pad_token_id, seed + begin)
            texts = tokenizer.batch_decode([c.response_ids for c in completions], skip_special_tokens=True)
            rewards = self.score_many([problems[begin + c.prompt_index] for c in completions], texts)
            for c, text, reward in zip(completions, texts, rewards):
                prompt, png = chunk[c.prompt_index]
                out.append(VisionRollout(begin + c.prompt_index, prompt + c.response_ids,
                                         [0] * len(prompt) + [1] * len(c.response_ids),
                                         [0.0] * len(prompt) + list(c.logprobs), float(reward), c.stop_reason, text,
                                         turns=1, images=[png]))
        return out


def _image_sampler(policy):
    """(sample(prompts, images, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed), the model config)
    of what ``VisionTask.rollout`` was given: a backend's own ``sample_images``, else the hf decode loop with images
    (``models.vision.sample_with_images``) on the transformers model (an hf backend's, or the model itself)."""
    from prime_values.models.vision import sample_with_images

    if hasattr(policy, "sample_images"):  # inference=vllm: the engine reads the images (backends/vllm.py)
        return policy.sample_images, policy.config
    if hasattr(policy, "sample") and hasattr(policy, "policy"):  # an hf backend (backends/hf.py): its model
        policy = policy.model
    return functools.partial(sample_with_images, policy), policy.config
