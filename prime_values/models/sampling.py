"""Batched sampling with per-token logprobs for the HF (transformers) inference backend.

A hand-written KV-cache decode loop (left-padded prompts, explicit position ids), faster than
``generate`` for tiny models and exact about what it returns:

- ``logprobs[i]`` is ``log_softmax(logits / temperature)[token_i]`` in float32: the same number a
  trainer gets by teacher-forcing ``prompt + response`` (right padding, positions ``0..L-1``) and
  taking ``log_softmax(logits / temperature)`` at the response tokens, up to float error.
- No top-k / top-p / repetition penalty: the sampling distribution is exactly ``softmax(logits / T)``.
- ``response_ids`` ends with ``eos_id`` when the model produced it (``stop_reason == "eos"``);
  nothing after the eos is returned. Otherwise ``stop_reason == "length"`` after ``max_new_tokens``.
- The full vocabulary is sampled, so an untrained model may emit ``pad``/``bos``/``unk`` ids inside a
  response; trainers must mask by response length (``policy_mask``), never by ``ids != pad``.
- Deterministic given ``seed`` (a private ``torch.Generator``; the global RNG is not touched) for
  the same inputs, model, batch composition and thread count.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch
from transformers import DynamicCache


@dataclass
class Completion:
    prompt_index: int  # index into the ``prompts`` argument
    response_ids: list[int]  # sampled tokens, eos included when produced
    logprobs: list[float] = field(default_factory=list)  # one per response token
    stop_reason: str = "length"  # "eos" | "length"
    sample_index: int = 0  # 0..num_samples-1 within its prompt's group


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        if p:
            ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p):] = 1
    return ids, mask


def _cache_kwarg(model) -> str:
    """The forward argument that takes the KV cache: 'cache' in newer transformers 5.x, 'past_key_values' in
    older ones (where an unknown 'cache' would be swallowed by **kwargs and every step would see one token)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT (LoRA) wrapper's **kwargs
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


# A row that has produced its eos leaves the batch (its KV cache rows dropped) once at least this share of the
# rows still in the batch has finished: each decode step then costs what the rows still decoding need, not the
# longest reply's whole batch. At most log(B) / log(4/3) compactions per batch, each one copy of the cache.
DROP_FINISHED_SHARE = 0.25


def _prefill(model, prompts, pad_id, device, kwarg, share_prompts):
    """The prompts' forward into the cache (`kwarg`): the last position's logits [B, 1, V], the attention mask and
    each row's next position. With `share_prompts`, what rows share is computed once: the prefix common to every
    row (a chat template's system turn, an instruction) as one row, each distinct prompt's rest once (a group's G
    samples share theirs), then the cache is copied out to the rows. The rest is left-padded after the prefix:
    padding between prefix and prompt is masked out and skipped by the position ids."""
    if not share_prompts:
        ids, mask = (t.to(device) for t in _left_pad(prompts, pad_id))
        positions = (mask.cumsum(-1) - 1).clamp_min(0)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                    **kwarg)
        return out.logits, mask, positions[:, -1:] + 1
    index: dict[tuple, int] = {}
    where = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompts], device=device)
    distinct = list(index)
    shared = len(os.path.commonprefix(distinct)) if len(distinct) > 1 else len(distinct[0])
    shared = min(shared, min(len(p) for p in distinct) - 1)  # every row keeps a token of its own: its logits
    if shared > 0:
        head = torch.tensor([distinct[0][:shared]], device=device)
        model(input_ids=head, position_ids=torch.arange(shared, device=device)[None], use_cache=True,
              logits_to_keep=1, **kwarg)
        next(iter(kwarg.values())).batch_repeat_interleave(len(distinct))
    ids, rest = (t.to(device) for t in _left_pad([list(p[shared:]) for p in distinct], pad_id))
    positions = (shared + rest.cumsum(-1) - 1).clamp_min(0)
    mask = torch.cat([torch.ones((len(distinct), shared), dtype=rest.dtype, device=device), rest], dim=-1)
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                **kwarg)
    if len(distinct) < len(prompts):
        next(iter(kwarg.values())).batch_select_indices(where)
    return out.logits[where], mask[where], positions[where, -1:] + 1


@torch.no_grad()
def _decode(model, prompts, max_new_tokens, temperature, eos_id, pad_id, generator, drop_finished=True,
            share_prompts=True):
    """Returns (tokens [B, T], logprobs [B, T], lengths [B], hit_eos [B]) for one batch, on the CPU.
    `drop_finished`: finished rows leave the batch (DROP_FINISHED_SHARE); `share_prompts`: what the prompts share
    is computed once (`_prefill`). False for either: the path that computes every row whole."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: prepend a bos token")
    device = next(model.parameters()).device
    bsz = len(prompts)
    cache = DynamicCache(config=model.config)
    kwarg = {_cache_kwarg(model): cache}
    logits, mask, next_pos = _prefill(model, prompts, pad_id, device, kwarg, share_prompts)
    out = SimpleNamespace(logits=logits)
    tokens = torch.full((bsz, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((bsz, max_new_tokens), dtype=torch.float32, device=device)
    hit_eos = torch.zeros(bsz, dtype=torch.bool, device=device)
    lengths = torch.full((bsz,), max_new_tokens, dtype=torch.long, device=device)
    rows = torch.arange(bsz, device=device)  # the batch row of each row still in the decode
    done = torch.zeros(bsz, dtype=torch.bool, device=device)  # of the rows still in the decode
    for t in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()
        if temperature > 0:
            lp = torch.log_softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(-1)
        else:
            lp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens[rows, t] = tok
        logprobs[rows, t] = torch.where(done, 0.0, lp.gather(-1, tok[:, None]).squeeze(-1))
        newly = (~done) & (tok == eos_id)
        lengths[rows[newly]] = t + 1
        hit_eos[rows[newly]] = True
        done |= newly
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        if drop_finished and int(done.sum()) >= DROP_FINISHED_SHARE * len(rows):
            keep = (~done).nonzero().squeeze(-1)
            cache.batch_select_indices(keep)
            rows, mask, next_pos, tok, done = rows[keep], mask[keep], next_pos[keep], tok[keep], done[keep]
        mask = torch.cat([mask, torch.ones((len(rows), 1), dtype=mask.dtype, device=device)], dim=-1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, use_cache=True, **kwarg)
        next_pos = next_pos + 1
    return tokens.cpu(), logprobs.cpu(), lengths.cpu(), hit_eos.cpu()


def _batched(model, prompts, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size, drop_finished=True,
             share_prompts=True):
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(int(seed))
    results = []
    try:
        for start in range(0, len(prompts), batch_size or len(prompts) or 1):
            chunk = prompts[start:start + (batch_size or len(prompts))]
            tokens, lps, lengths, hit = _decode(model, chunk, max_new_tokens, temperature, eos_id, pad_id, gen,
                                                drop_finished, share_prompts)
            for i in range(len(chunk)):
                n = int(lengths[i])
                results.append((tokens[i, :n].tolist(), lps[i, :n].tolist(), "eos" if bool(hit[i]) else "length"))
    finally:
        model.train(was_training)
    return results


def sample(model, prompts: list[list[int]], num_samples: int, max_new_tokens: int, temperature: float,
           eos_id: int, pad_id: int, seed: int, batch_size: int | None = None,
           drop_finished: bool | None = None, share_prompts: bool = True) -> list[Completion]:
    """``num_samples`` completions per prompt, grouped by prompt (prompt 0's samples first).

    ``temperature <= 0`` decodes greedily (logprobs then at temperature 1).
    ``batch_size`` caps the rows decoded together (default: all ``len(prompts) * num_samples``).
    ``drop_finished``: a finished row leaves the batch; the default (None) does so when decoding greedily, where
    the replies are the same either way; at temperature > 0 a dropped row would change what the generator draws
    for the others, so a seed's samples would not be what they were. ``share_prompts``: the prefix every row
    shares and each prompt's rest are computed once (``_prefill``; it draws nothing). False for both is the path
    that computes every row whole, for comparisons.
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    if drop_finished is None:
        drop_finished = temperature <= 0
    rows = [p for p in prompts for _ in range(num_samples)]
    if not rows:
        return []
    res = _batched(model, rows, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size, drop_finished,
                   share_prompts)
    return [
        Completion(prompt_index=r // num_samples, sample_index=r % num_samples, response_ids=ids,
                   logprobs=lps, stop_reason=reason)
        for r, (ids, lps, reason) in enumerate(res)
    ]


def greedy(model, prompts: list[list[int]], max_new_tokens: int, eos_id: int, pad_id: int,
           batch_size: int | None = None, drop_finished: bool = True, share_prompts: bool = True) -> list[list[int]]:
    """Greedy (argmax) responses, eos included when produced, nothing after it."""
    if not prompts:
        return []
    res = _batched(model, prompts, max_new_tokens, 0.0, eos_id, pad_id, 0, batch_size, drop_finished, share_prompts)
    return [ids for ids, _, _ in res]


def teacher_forced_logprobs(model, prompts: list[list[int]], responses: list[list[int]], temperature: float,
                            pad_id: int) -> list[list[float]]:
    """Reference recompute (what a trainer does): right-padded prompt+response, one forward pass,
    ``log_softmax(logits / temperature)`` at each response token. Used by tests and studies."""
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).logits.float().cpu()
    lp = torch.log_softmax(logits[:, :-1] / (temperature if temperature > 0 else 1.0), dim=-1)
    lp = lp.gather(-1, ids[:, 1:, None]).squeeze(-1)
    return [lp[i, len(p) - 1:len(p) - 1 + len(r)].tolist() for i, (p, r) in enumerate(zip(prompts, responses))]
