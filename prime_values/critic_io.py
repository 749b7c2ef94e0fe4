"""The critic's view of a rollout, shared by the value evaluator (scoring), the value trainer and the warm start
(training): library code the roles use (docs/design.md §6), built on algo and models; the right-padding functions
(`padded`, `attention_mask`) and sequence packing (`Packing`) serve the policy trainer and the orchestrator too.

The privileged context is folded in as a text block before the whole trace, or between the prompt and the
response (critic.placement); the trace's token ids are kept verbatim, so the policy tokens are the same tokens
in both layouts and values map back exactly (`algo.privileged`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from prime_values import dist
from prime_values.algo.gae import explained_variance, gae
from prime_values.algo.losses import token_logprobs, value_loss, values_from_head
from prime_values.algo.privileged import batch_values_to_policy_layout, critic_layout, truncate_for_critic
from prime_values.trainer import optimizer_step

if TYPE_CHECKING:
    from prime_values.config import Config


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Row indices grouped into lines of at most `capacity` tokens: longest row first, each into the first line
    with room (a new line when none has). Hand-worked, lengths [5, 3, 4, 2], capacity 6: row 0 (5) opens line 0,
    row 2 (4) line 1, row 1 (3) fits neither (5 + 3, 4 + 3 > 6) and opens line 2, row 3 (2) misses line 0 (7)
    and fills line 1 (6): [[0], [2, 3], [1]]."""
    lines: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for k, left in enumerate(room):
            if lengths[i] <= left:
                lines[k].append(i)
                room[k] -= lengths[i]
                break
        else:
            lines.append([i])
            room.append(capacity - lengths[i])
    return lines


PACK_WIDTH = 64  # tokens of a packed line at least: arith's 6-14-token traces share lines 5-10 to one (padding 17%
# -> 6% of the policy batch); a line's attention over 64 positions costs little beside its GEMMs


class Packing:
    """Rows of `lengths` tokens laid end to end in lines `width` wide (at least the longest row; default
    PACK_WIDTH) by `first_fit_decreasing`, so a forward computes `computed` = lines x width positions instead of
    rows x the longest, `counted` of them real.

    The model sees the packed `[R, C]` ids with `position_ids` (each row's own 0..n-1; a line's padding continues
    its last row's positions) and no attention mask: transformers then attends within each row only
    (masking_utils.find_packed_sequence_indices), the same logits as the right-padded batch up to float error.
    `pack` lays a right-padded `[B, L, ...]` tensor into lines, `unpack` reads a `[R, C, ...]` output back into
    `[B, L, ...]` (0 beyond each row's length); both keep gradients."""

    def __init__(self, lengths: list[int], width: int | None = None):
        self.lengths = torch.tensor(lengths)
        self.width = max(width or PACK_WIDTH, max(lengths))
        lines = first_fit_decreasing(list(lengths), self.width)
        line_of, offset = torch.zeros(len(lengths), dtype=torch.long), torch.zeros(len(lengths), dtype=torch.long)
        self.position_ids = torch.zeros((len(lines), self.width), dtype=torch.long)
        for k, rows in enumerate(lines):
            used = 0
            for i in rows:
                line_of[i], offset[i] = k, used
                self.position_ids[k, used: used + lengths[i]] = torch.arange(lengths[i])
                used += lengths[i]
            if used < self.width:  # padding continues the line's last row: no new row for the mask to find
                last = self.position_ids[k, used - 1]
                self.position_ids[k, used:] = last + 1 + torch.arange(self.width - used)
        self.longest = int(self.lengths.max())
        self.valid = torch.arange(self.longest)[None, :] < self.lengths[:, None]  # [B, L]
        self.flat = ((line_of * self.width + offset)[:, None] + torch.arange(self.longest)[None, :])[self.valid]
        self.computed, self.counted = len(lines) * self.width, int(self.lengths.sum())
        self.lines = len(lines)

    @classmethod
    def gainful(cls, lengths: list[int]) -> "Packing | None":
        """The packing of `lengths`, or None where it would compute no fewer positions than right padding (a few
        rows, or rows too long to share a line)."""
        packing = cls(lengths)
        return packing if packing.computed < len(lengths) * packing.longest else None

    def pack(self, x: torch.Tensor, fill=0) -> torch.Tensor:
        x = x[:, : self.longest]
        out = torch.full((self.lines * self.width, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
        out = out.index_put((self.flat.to(x.device),), x[self.valid.to(x.device)])
        return out.reshape(self.lines, self.width, *x.shape[2:])

    def unpack(self, y: torch.Tensor, length: int | None = None) -> torch.Tensor:
        flat = y.reshape(self.lines * self.width, *y.shape[2:])
        out = torch.zeros((len(self.lengths), self.longest, *y.shape[2:]), dtype=y.dtype, device=y.device)
        out = out.index_put((self.valid.to(y.device),), flat[self.flat.to(y.device)])
        if length is not None and length > self.longest:
            out = torch.nn.functional.pad(out, (0, 0) * (y.dim() - 2) + (0, length - self.longest))
        return out

    def forward(self, model, ids: torch.Tensor, pad_id: int):
        """`model` on the packed lines of right-padded `ids` [B, L]: its output's logits read back to [B, L, ...]."""
        out = model(input_ids=self.pack(ids, pad_id), position_ids=self.position_ids.to(ids.device), use_cache=False)
        return self.unpack(out.logits, ids.shape[1])


def reads_images(model) -> bool:
    """A vision-language policy or critic (models/vision.py, a Qwen2-VL): its forward takes the rows' images."""
    return getattr(getattr(model, "config", None), "model_type", None) == "qwen2_vl"


def rollout_logprobs(model, rows: list[dict], pad_id: int, device: str, temperature: float,
                     pack: bool) -> torch.Tensor:
    """[B, T] log pi(token_t | x_{<t}) of every token of `rows` at `temperature` (algo.losses.token_logprobs: 0 at
    position 0 and beyond each row), the model run on the right-padded rows or, with `pack`, on their packed lines
    (`Packing`; each row starts with a prompt token, so no row's policy token reads another row's logits).

    Rows with images (their `images` column: content hashes) run on the right-padded rows with the images read
    back from the model's image store and their multimodal positions (models.vision.VisionInputs), the same inputs
    the sampler had; a vision policy is never packed (the config refuses policy.pack_sequences with it)."""
    ids = padded(rows, "token_ids", torch.long, fill=pad_id).to(device)
    if reads_images(model):
        from prime_values.models.vision import VisionInputs, reply_logits

        mask = attention_mask(rows).to(device)
        images = VisionInputs.of_rows(model, ids, mask, rows)
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False, **images.kwargs).logits.float()
        return token_logprobs(reply_logits(model.config, logits), ids, temperature)
    packing = Packing.gainful([len(row["token_ids"]) for row in rows]) if pack else None
    if packing is None:
        logits = model(input_ids=ids, attention_mask=attention_mask(rows).to(device), use_cache=False).logits.float()
        return token_logprobs(logits, ids, temperature)
    lines = packing.pack(ids, pad_id)
    logits = model(input_ids=lines, position_ids=packing.position_ids.to(device), use_cache=False).logits.float()
    logprobs = packing.unpack(token_logprobs(logits, lines, temperature), ids.shape[1])
    return torch.nn.functional.pad(logprobs[:, 1:], (1, 0))


class CriticInputs:
    """A right-padded critic batch built from rollout rows (dicts with token_ids, policy_mask, privileged, and
    images for a vision task: the trace keeps its image placeholders, so the critic reads the image at the same
    place in either layout; `values` hands it the pixels)."""

    def __init__(self, rows: list[dict], tokenizer, template: str, privileged: bool, max_length: int,
                 device: str = "cpu", placement: str = "start", pack: bool = False):
        pad_id = self.pad_id = tokenizer.pad_token_id
        self.pack = pack
        self.rows = rows
        sequences, prefix_lens, self.cut, self.valued_tokens = [], [], [], []
        for row in rows:
            prefix = tokenizer.encode(template.format(privileged=row["privileged"]), add_special_tokens=False) \
                if privileged else []
            ids, _ = critic_layout(list(row["token_ids"]), list(row["policy_mask"]), prefix, placement)
            ids, cut = truncate_for_critic(ids, max_length)
            sequences.append(ids)
            prefix_lens.append(len(prefix))
            self.cut.append(cut)
            self.valued_tokens.append(len(ids) - len(prefix) if cut else len(row["token_ids"]))
        length = max(map(len, sequences))
        trace_length = max(len(row["token_ids"]) for row in rows)
        self.input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
        self.attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        self.policy_mask = torch.zeros((len(rows), trace_length), dtype=torch.bool)
        for b, (ids, row) in enumerate(zip(sequences, rows)):
            self.input_ids[b, : len(ids)] = torch.tensor(ids)
            self.attention_mask[b, : len(ids)] = 1
            self.policy_mask[b, : len(row["policy_mask"])] = torch.tensor(list(row["policy_mask"])) > 0
            # a cut trace keeps the tokens inside the critic's context: j < len(ids) - prefix; the state after
            # the last of them (position len(ids) - 1) is V(s_cut), the bootstrap value
            self.policy_mask[b, self.valued_tokens[b]:] = False
        self.prefix_lens = torch.tensor(prefix_lens)
        self.input_ids, self.attention_mask = self.input_ids.to(device), self.attention_mask.to(device)
        self.policy_mask, self.prefix_lens = self.policy_mask.to(device), self.prefix_lens.to(device)

    @classmethod
    def of(cls, rows: list[dict], tokenizer, ccfg, device: str = "cpu") -> "CriticInputs":
        """The batch as the `critic` config lays it out (template, privileged, max_length, placement, packing: off
        for a section without pack_sequences)."""
        return cls(rows, tokenizer, ccfg.template, ccfg.privileged, ccfg.max_length, device, ccfg.placement,
                   getattr(ccfg, "pack_sequences", False))

    def values(self, critic, head: str = "mse") -> torch.Tensor:
        """[B, T] values in the policy's layout (0 where the policy did not sample the token). `head` is
        critic.loss: with 'bce' the head's logits become probabilities; `head=None` returns the raw output."""
        from prime_values.models import critic_values
        from prime_values.models.vision import VisionInputs

        vision = reads_images(critic)
        packing = Packing.gainful(self.attention_mask.sum(dim=1).tolist()) if self.pack and not vision else None
        if vision:  # the rows' images, read back by hash, at their placeholders (models.vision.VisionInputs)
            self.tokens_computed = self.input_ids.numel()
            images = VisionInputs.of_rows(critic, self.input_ids, self.attention_mask, self.rows)
            critic_out = critic_values(critic, self.input_ids, self.attention_mask, **images.kwargs)
        elif packing is not None:  # the same values from the packed lines (`Packing`), fewer positions computed
            self.tokens_computed = packing.computed
            critic_out = packing.forward(critic, self.input_ids, self.pad_id).squeeze(-1).float()
        else:
            self.tokens_computed = self.input_ids.numel()
            critic_out = critic_values(critic, self.input_ids, self.attention_mask)  # [B, L]
        last = self.attention_mask.sum(dim=1) - 1
        self.raw_bootstrap = critic_out[torch.arange(len(last)), last]  # the head's V(s_cut): meaningful where cut
        self.bootstrap = self.raw_bootstrap if head is None else values_from_head(self.raw_bootstrap, head)
        raw = batch_values_to_policy_layout(critic_out, self.prefix_lens, self.policy_mask)
        return raw if head is None else torch.where(self.policy_mask, values_from_head(raw, head), raw)


def padded(rows: list[dict], key: str, dtype: torch.dtype, length: int | None = None, fill=0) -> torch.Tensor:
    """Right-pad a list column of rows into a [B, T] tensor (`fill` beyond each row's length)."""
    length = length or max(len(row[key]) for row in rows)
    out = torch.full((len(rows), length), fill, dtype=dtype)
    for b, row in enumerate(rows):
        values = row[key]
        if len(values):
            out[b, : len(values)] = torch.as_tensor(list(values), dtype=dtype)
    return out


def attention_mask(rows: list[dict]) -> torch.Tensor:
    """[B, T] 1 on each row's tokens, 0 on the right padding."""
    lengths = torch.tensor([len(row["token_ids"]) for row in rows])
    return (torch.arange(int(lengths.max()))[None, :] < lengths[:, None]).long()


def value_targets(rows: list[dict], inputs: CriticInputs, values: torch.Tensor, cfg: Config) -> torch.Tensor:
    """[B, T] value targets of `rows` for the critic whose `values` (policy layout, after the head) `inputs` holds.

    advantage.lambda_value = 1: the stored targets (Monte-Carlo returns, or V(s_cut) for a cut trace). Below 1:
    the λ-returns recomputed from these values with the same ends as the orchestrator's (`score_group`): a trace
    the critic's context cut bootstraps with this critic's V(s_cut) (`inputs.raw_bootstrap`) instead of taking the
    reward, which lies beyond the cut. Call after `inputs.values(...)` (it sets `inputs.raw_bootstrap`)."""
    adv = cfg.advantage
    device = values.device
    if adv.lambda_value >= 1:
        return padded(rows, "value_targets", torch.float32, length=values.shape[1]).to(device)
    rewards = torch.tensor([r["reward"] for r in rows], dtype=torch.float32, device=device)
    bootstrap = values_from_head(inputs.raw_bootstrap.detach().float(), cfg.critic.loss)
    cut = torch.tensor(inputs.cut, dtype=torch.bool, device=device)
    _, targets = gae(rewards, values.detach(), inputs.policy_mask, adv.gamma, adv.lambda_value, bootstrap, cut)
    return targets


def critic_step(critic, optimizer, rows: list[dict], tokenizer, cfg: Config, device: str, real: bool = True) -> dict:
    """One critic optimizer step on replay rows (targets rows: token ids, mask, reward, values, value_targets):
    the trainers' step (`trainer.optimizer_step`: critic.max_grad_norm clips, `grad_norm` reported). With several
    processes `rows` is this rank's share and `real` whether it is one (`dist.share`: a stand-in counts no tokens).

    With advantage.lambda_value < 1 the stored targets mixed in the values of the critic that scored the
    rollout; they are recomputed here with the current critic's values of the same forward (`value_targets`:
    a cut trace bootstraps with V(s_cut), as the orchestrator's targets do), so old replay data does not pull the
    critic back toward its past self. With lambda_value = 1 they are Monte-Carlo returns."""
    ccfg = cfg.critic

    def backward() -> dict:
        inputs = CriticInputs.of(rows, tokenizer, ccfg, device)
        raw = inputs.values(critic, head=None)
        values = values_from_head(raw, ccfg.loss).where(inputs.policy_mask, torch.zeros_like(raw))
        targets = value_targets(rows, inputs, values, cfg)
        clip = {}
        if ccfg.value_clip > 0 and "values" in rows[0]:  # pretraining rows were never scored: nothing to clip to
            old = padded(rows, "values", torch.float32, length=values.shape[1]).to(device)
            clip = {"old_values": old, "clip_range": ccfg.value_clip}
        loss, stats = value_loss(raw, targets, inputs.policy_mask, kind=ccfg.loss, with_stats=True, **clip)
        tokens = inputs.policy_mask.sum().item() * real  # this rank's valued tokens (after any critic cut)
        total = dist.all_reduce_sum({"tokens": float(tokens)})["tokens"]  # the batch's, over every rank
        (loss * dist.loss_scale(tokens, total, dist.current().world)).backward()
        return dist.token_mean({"value_loss": loss.item(), "value_clip_fraction": stats["clip_fraction"],
                "train_explained_variance": explained_variance(values.detach(), targets, inputs.policy_mask),
                "value_mean": values.detach()[inputs.policy_mask].mean().item(),
                "target_mean": targets[inputs.policy_mask].mean().item()}, tokens)
    return optimizer_step(critic, optimizer, backward, ccfg.max_grad_norm)
