"""The embedded vision-language policy and its critic: a tiny Qwen2-VL built from a config (no download), the
images of a batch turned into what its forward needs, and sampling with images.

Token layout of a prompt with an image (what the rollout log stores in ``token_ids``, verbatim):
``<|vision_start|> <|image_pad|> x n <|vision_end|>`` then the prompt's characters, where ``n = t·h·w / merge²``
for the image's patch grid ``(t, h, w)`` (``image_tokens``). The image itself is not in the token ids: a row
carries it by content hash (``images``, log.images.ImageStore) and every forward that reads the row gets its
pixels back (``VisionInputs``): the sampler, the policy trainer's recompute (critic_io.rollout_logprobs), the
critic's scoring and training (critic_io.CriticInputs).

Positions are Qwen2-VL's multimodal rotary positions (M-RoPE, three components: time, height, width), computed
here once per batch with ``get_rope_index`` from ``mm_token_type_ids`` (1 on the image placeholders) and passed
explicitly, so the model never keeps them between calls (its own ``rope_deltas`` cache). A text token's three
components are equal; the text after an image continues at the image's largest position + 1, so the sampler's
next position is each row's largest + 1 and the teacher-forced recompute of the same row gives the same one.

The critic is ``Qwen2VLForTokenValue``: the same backbone (vision tower and language model) with a one-output
value head, registered with ``AutoModelForTokenClassification`` so ``models.build`` builds, saves and loads it as
it does the Qwen3 critic."""

from __future__ import annotations

import io
import os

import torch
from PIL import Image, UnidentifiedImageError
from transformers import (
    AutoModelForTokenClassification,
    DynamicCache,
    Qwen2VLConfig,
)
from transformers.modeling_outputs import TokenClassifierOutput
from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel, Qwen2VLPreTrainedModel

from .sampling import Completion, _cache_kwarg, _left_pad
from .tokenizer import build_char_tokenizer

IMAGE_PAD, VISION_START, VISION_END = "<|image_pad|>", "<|vision_start|>", "<|vision_end|>"
VISION_TOKENS = (IMAGE_PAD, VISION_START, VISION_END)  # ids 100, 101, 102 after the character vocabulary

TINY_VL_MODEL = "tiny_vl"
"""policy.model that builds the embedded vision-language policy (conf/policy/tiny_vl.yaml)"""

VL_ARCH: dict = dict(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=192,
    max_position_embeddings=512,
    vision_depth=2,
    vision_dim=32,
    patch_size=8,
)
"""the tiny vision-language policy: 0.16M parameters, a 2-block vision tower over 8-pixel patches (2x2 patches
merged per image token: a 32-pixel square image is 4 tokens)"""

MERGE = 2  # spatial_merge_size: 2x2 patches make one image token
TEMPORAL = 2  # temporal_patch_size: a still image is repeated to 2 frames (Qwen2-VL's convention)


def build_vl_tokenizer():
    """The character tokenizer (models.tokenizer) with the three vision tokens added as special tokens (ids 100-102):
    the project's conventions otherwise (no special tokens added by ``encode``, exact ``decode``)."""
    tokenizer = build_char_tokenizer()
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    return tokenizer


def vision_token_ids(tokenizer) -> dict[str, int]:
    """{'image', 'start', 'end'}: the vision tokens' ids; a ValueError naming the fix for a tokenizer without them."""
    ids = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        raise ValueError(f"the policy's tokenizer has no {', '.join(VISION_TOKENS)} tokens; a vision task needs a "
                         f"vision-language policy: set policy={TINY_VL_MODEL}")
    return dict(zip(("image", "start", "end"), ids))


def tiny_vl_config(tokenizer, attention=None, **arch) -> Qwen2VLConfig:
    """A Qwen2-VL config sized for the tokenizer; `arch` overrides keys of VL_ARCH (unknown keys: TypeError)."""
    unknown = set(arch) - set(VL_ARCH)
    if unknown:
        raise TypeError(f"unknown architecture arguments {sorted(unknown)}; allowed: {sorted(VL_ARCH)}")
    a = {**VL_ARCH, **arch}
    head_dim = a["hidden_size"] // a["num_heads"]
    if head_dim % 16:  # M-RoPE splits head_dim / 2 rotary frequencies 1:1.5:1.5 over time, height and width
        raise ValueError(f"hidden_size / num_heads = {head_dim} must be a multiple of 16 (multimodal rotary sections)")
    half = head_dim // 2
    ids = vision_token_ids(tokenizer)
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer), hidden_size=a["hidden_size"], intermediate_size=a["intermediate_size"],
            num_hidden_layers=a["num_layers"], num_attention_heads=a["num_heads"],
            num_key_value_heads=a["num_kv_heads"], max_position_embeddings=a["max_position_embeddings"],
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                             "mrope_section": [half // 4, 3 * half // 8, half - half // 4 - 3 * half // 8]},
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            bos_token_id=tokenizer.bos_token_id, attention_dropout=0.0, use_cache=True),
        vision_config=dict(depth=a["vision_depth"], embed_dim=a["vision_dim"], hidden_size=a["hidden_size"],
                           num_heads=2, mlp_ratio=2, patch_size=a["patch_size"], spatial_merge_size=MERGE,
                           temporal_patch_size=TEMPORAL),
        image_token_id=ids["image"], vision_start_token_id=ids["start"], vision_end_token_id=ids["end"],
        video_token_id=len(tokenizer),  # no video: an id no token has
        tie_word_embeddings=True,
    )
    if attention is not None:
        cfg._attn_implementation = attention.implementation
    return cfg


def is_vision_config(cfg) -> bool:
    return getattr(cfg, "model_type", None) == "qwen2_vl"


class Qwen2VLForTokenValue(Qwen2VLPreTrainedModel):
    """The vision-language critic: the policy's backbone (vision tower + language model) and a value head, one
    output per position, causal (position t sees tokens <= t and the image placeholders among them)."""

    def __init__(self, config: Qwen2VLConfig):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = Qwen2VLModel(config)
        self.score = torch.nn.Linear(config.text_config.hidden_size, config.num_labels)
        self.post_init()

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, pixel_values=None,
                image_grid_thw=None, mm_token_type_ids=None, use_cache=False, **kwargs) -> TokenClassifierOutput:
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            pixel_values=pixel_values, image_grid_thw=image_grid_thw,
                            mm_token_type_ids=mm_token_type_ids, use_cache=use_cache, **kwargs).last_hidden_state
        return TokenClassifierOutput(logits=self.score(hidden))


AutoModelForTokenClassification.register(Qwen2VLConfig, Qwen2VLForTokenValue, exist_ok=True)


def text_blocks(model):
    """(the module holding the transformer blocks in `.layers`, the config holding num_hidden_layers): a Qwen3
    model's own, a Qwen2-VL model's language model (the vision tower keeps its blocks)."""
    backbone = model.model
    if hasattr(backbone, "language_model"):
        return backbone.language_model, model.config.text_config
    return backbone, model.config


# --- images: PNG bytes -> the model's pixel inputs ------------------------------------------------------------------

def image_processor(config):
    """Qwen2-VL's image processor from its class defaults, with the patch grid of the model's vision tower; images
    are resized only to a multiple of patch x merge pixels (32 for the tiny policy)."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    vision = config.vision_config
    unit = vision.patch_size * vision.spatial_merge_size
    return Qwen2VLImageProcessorPil(patch_size=vision.patch_size, merge_size=vision.spatial_merge_size,
                                    temporal_patch_size=vision.temporal_patch_size,
                                    size={"shortest_edge": unit * unit, "longest_edge": 256 * 256})


def decode_png(png: bytes, where: str):
    """PNG bytes as an RGB PIL image; a ValueError naming `where` when they do not decode."""
    try:
        with Image.open(io.BytesIO(png)) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as error:
        raise ValueError(f"image {where} does not decode as a PNG ({error}); delete it and regenerate the "
                         "rollouts that refer to it") from None


def image_tokens(config, png: bytes) -> int:
    """How many <|image_pad|> tokens the image takes in a prompt (t·h·w / merge² of its patch grid)."""
    grid = image_processor(config)(images=[decode_png(png, "in memory")], return_tensors="pt")["image_grid_thw"]
    return int(grid.prod()) // config.vision_config.spatial_merge_size ** 2


def prompt_ids(tokenizer, config, png: bytes, text: str) -> list[int]:
    """The token ids of a prompt with one image before its text (the layout of the module doc)."""
    ids = vision_token_ids(tokenizer)
    return [ids["start"]] + [ids["image"]] * image_tokens(config, png) + [ids["end"]] + \
        tokenizer.encode(text, add_special_tokens=False)


IMAGE_STORE_ATTR = "pv_image_store"


def attach_image_store(model, store) -> None:
    """`model` resolves the image hashes of the rows it is given through `store` (log.images.ImageStore)."""
    setattr(model, IMAGE_STORE_ATTR, store)


def attach_run_images(model, path: str | os.PathLike) -> None:
    """A model loaded from a run's published weights (`<run>/weights/<kind>/<version>`) reads the images its rows
    refer to from that run's image store (`<run>/log/images`): the policy trainer's, the evaluator's and the value
    trainer's models find the images the inference workers wrote without being told. Elsewhere nothing is
    attached (`attach_image_store` then, or rows carry no images)."""
    from prime_values.log.images import ImageStore, run_of_weights

    run = run_of_weights(path)
    if run is not None:
        attach_image_store(model, ImageStore(run / "log" / "images"))


def image_store_of(model):
    store = getattr(model, IMAGE_STORE_ATTR, None)
    if store is None:
        raise ValueError("these rollouts refer to images, but the model has no image store: load it from the run's "
                         "weights (models.load_policy / load_critic) or give it one with "
                         "models.vision.attach_image_store")
    return store


class VisionInputs:
    """The image inputs of a right-padded batch `ids` [B, L] whose rows carry `images` (PNG bytes per row, in the
    order of their placeholders): pixel values, patch grids, the image-token types and the M-RoPE positions
    [3, B, L] (what `model(input_ids=ids, attention_mask=mask, **inputs.kwargs)` needs)."""

    def __init__(self, model, ids: torch.Tensor, mask: torch.Tensor, images: list[list[bytes]],
                 names: list[str] | None = None, files: list[list[str]] | None = None):
        config = model.config
        image_id = config.image_token_id
        pngs = [(png, f"{files[b][k]} (rollout {names[b]})" if files and names else
                 f"of rollout {names[b]}" if names else f"of row {b}")
                for b, row in enumerate(images) for k, png in enumerate(row)]
        self.mm_token_type_ids = (ids == image_id).int() * mask.int()
        processed = image_processor(config)(images=[decode_png(png, where) for png, where in pngs],
                                            return_tensors="pt") if pngs else None
        merge = config.vision_config.spatial_merge_size ** 2
        for b, row in enumerate(images):  # each row's placeholders are its own images' tokens, or nothing fits
            expected = sum(image_tokens(config, png) for png in row)
            placed = int(self.mm_token_type_ids[b].sum())
            if placed != expected:
                why = "its images were dropped on the way here" if not row else "they belong to another rollout"
                raise ValueError(f"rollout {(names or [b] * len(images))[b]} has {placed} image tokens but its "
                                 f"{len(row)} image(s) take {expected}: {why}; every row must carry its own "
                                 "`images` (log/records.py)")
        device = ids.device
        self.pixel_values = processed["pixel_values"].to(device) if processed else None
        self.image_grid_thw = processed["image_grid_thw"].to(device) if processed else None
        backbone = model.get_base_model().model if hasattr(model, "get_base_model") else model.model
        if processed is None:
            self.position_ids = None
        else:
            assert int(self.image_grid_thw.prod(-1).sum()) // merge == int(self.mm_token_type_ids.sum())
            self.position_ids, _ = backbone.get_rope_index(ids, self.mm_token_type_ids, self.image_grid_thw,
                                                           attention_mask=mask)

    @property
    def kwargs(self) -> dict:
        if self.pixel_values is None:
            return {}
        return {"pixel_values": self.pixel_values, "image_grid_thw": self.image_grid_thw,
                "mm_token_type_ids": self.mm_token_type_ids, "position_ids": self.position_ids}

    @classmethod
    def of_rows(cls, model, ids: torch.Tensor, mask: torch.Tensor, rows: list[dict]) -> "VisionInputs":
        """The inputs of log rows whose `images` column holds content hashes, read from the model's image store
        (`attach_run_images`)."""
        store = image_store_of(model) if any(row.get("images") for row in rows) else None
        images = [[store.get(digest) for digest in row.get("images") or ()] for row in rows]
        files = [[str(store.path(digest)) for digest in row.get("images") or ()] for row in rows]
        return cls(model, ids, mask, images, [row.get("rollout_id", str(b)) for b, row in enumerate(rows)], files)


def reply_logits(config, logits: torch.Tensor) -> torch.Tensor:
    """`logits` [..., V] with the vision tokens' at BANNED_LOGIT: the policy never writes an image placeholder (one
    in a reply would be taken for an image's place), so its distribution is the softmax over the other tokens, in
    the sampler and in every recompute alike. Finite, so a prompt's own placeholders (policy_mask 0) get a finite
    logprob that no loss multiplies into a NaN; exp(BANNED_LOGIT) is 0 in float32, as exp(-inf) is."""
    banned = [config.image_token_id, config.vision_start_token_id, config.vision_end_token_id]
    return logits.index_fill(-1, torch.tensor(banned, device=logits.device), BANNED_LOGIT)


BANNED_LOGIT = -1e4


def has_images(rows: list[dict]) -> bool:
    return any(row.get("images") for row in rows)


# --- sampling with images (the hf backend's decode loop, models/sampling.py, with pixel inputs) --------------------

@torch.no_grad()
def sample_with_images(model, prompts: list[list[int]], images: list[list[bytes]], num_samples: int,
                       max_new_tokens: int, temperature: float, eos_id: int, pad_id: int, seed: int):
    """``num_samples`` completions per prompt (``models.sampling.Completion``, grouped by prompt), each prompt read
    with its images: the same contract as ``models.sampling.sample`` (``logprobs[i] = log_softmax(logits /
    temperature)[token_i]`` in float32, what ``critic_io.rollout_logprobs`` recomputes on ``prompt + response``
    with the same images; greedy below temperature 0), left-padded prompts with explicit M-RoPE positions."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    rows = [p for p in prompts for _ in range(num_samples)]
    row_images = [imgs for imgs in images for _ in range(num_samples)]
    if not rows:
        return []
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(int(seed))
    try:
        ids, mask = (t.to(device) for t in _left_pad(rows, pad_id))
        vision = VisionInputs(model, ids, mask, row_images)
        positions = vision.position_ids if vision.position_ids is not None else \
            (mask.cumsum(-1) - 1).clamp_min(0)[None].expand(3, -1, -1)
        cache = DynamicCache(config=model.config.text_config)
        kwarg = {_cache_kwarg(model): cache}
        out = model(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1, **kwarg,
                    **{**vision.kwargs, "position_ids": positions})
        next_pos = positions.max(dim=-1).values.max(dim=0).values[:, None] + 1  # [B, 1]
        bsz = len(rows)
        tokens = torch.full((bsz, max_new_tokens), pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((bsz, max_new_tokens), dtype=torch.float32, device=device)
        lengths = torch.full((bsz,), max_new_tokens, dtype=torch.long, device=device)
        done = torch.zeros(bsz, dtype=torch.bool, device=device)
        for t in range(max_new_tokens):
            logits = reply_logits(model.config, out.logits[:, -1, :].float())
            lp = torch.log_softmax(logits / (temperature if temperature > 0 else 1.0), dim=-1)
            tok = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(-1) if temperature > 0 \
                else logits.argmax(-1)
            tok = torch.where(done, torch.full_like(tok, pad_id), tok)
            tokens[:, t] = tok
            logprobs[:, t] = torch.where(done, 0.0, lp.gather(-1, tok[:, None]).squeeze(-1))
            newly = (~done) & (tok == eos_id)
            lengths[newly] = t + 1
            done |= newly
            if bool(done.all()) or t == max_new_tokens - 1:
                break
            mask = torch.cat([mask, torch.ones((bsz, 1), dtype=mask.dtype, device=device)], dim=-1)
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos[None].expand(3, -1, -1),
                        use_cache=True, **kwarg)
            next_pos = next_pos + 1
    finally:
        model.train(was_training)
    tokens, logprobs, lengths, done = tokens.cpu(), logprobs.cpu(), lengths.cpu(), done.cpu()
    return [Completion(prompt_index=r // num_samples, sample_index=r % num_samples,
                       response_ids=tokens[r, : int(lengths[r])].tolist(),
                       logprobs=logprobs[r, : int(lengths[r])].tolist(),
                       stop_reason="eos" if bool(done[r]) else "length")
            for r in range(bsz)]


__all__ = ["IMAGE_PAD", "TINY_VL_MODEL", "VL_ARCH", "VisionInputs", "Qwen2VLForTokenValue", "attach_image_store",
           "attach_run_images", "build_vl_tokenizer", "has_images", "image_tokens", "is_vision_config", "prompt_ids",
           "sample_with_images", "text_blocks", "tiny_vl_config"]
