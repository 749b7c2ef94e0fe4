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

from dataclasses import dataclass, field

import inspect

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


@torch.no_grad()
def _decode(model, prompts, max_new_tokens, temperature, eos_id, pad_id, generator):
    """Returns (tokens [B, T], logprobs [B, T], lengths [B], hit_eos [B]) for one batch, on the CPU."""
    if any(len(p) == 0 for p in prompts):
        raise ValueError("empty prompt: prepend a bos token")
    device = next(model.parameters()).device
    ids, mask = (t.to(device) for t in _left_pad(prompts, pad_id))
    bsz = ids.shape[0]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)
    cache = {_cache_kwarg(model): DynamicCache(config=model.config)}
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1,
                **cache)
    next_pos = positions[:, -1:] + 1
    tokens = torch.full((bsz, max_new_tokens), pad_id, dtype=torch.long, device=device)
    logprobs = torch.zeros((bsz, max_new_tokens), dtype=torch.float32, device=device)
    done = torch.zeros(bsz, dtype=torch.bool, device=device)
    lengths = torch.full((bsz,), max_new_tokens, dtype=torch.long, device=device)
    for t in range(max_new_tokens):
        logits = out.logits[:, -1, :].float()
        if temperature > 0:
            lp = torch.log_softmax(logits / temperature, dim=-1)
            tok = torch.multinomial(lp.exp(), 1, generator=generator).squeeze(-1)
        else:
            lp = torch.log_softmax(logits, dim=-1)
            tok = logits.argmax(-1)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        tokens[:, t] = tok
        logprobs[:, t] = torch.where(done, 0.0, lp.gather(-1, tok[:, None]).squeeze(-1))
        newly = (~done) & (tok == eos_id)
        lengths[newly] = t + 1
        done |= newly
        if bool(done.all()) or t == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones((bsz, 1), dtype=mask.dtype, device=device)], dim=-1)
        out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=next_pos, use_cache=True, **cache)
        next_pos = next_pos + 1
    return tokens.cpu(), logprobs.cpu(), lengths.cpu(), done.cpu()


def _batched(model, prompts, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size):
    was_training = model.training
    model.eval()
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(int(seed))
    results = []
    try:
        for start in range(0, len(prompts), batch_size or len(prompts) or 1):
            chunk = prompts[start:start + (batch_size or len(prompts))]
            tokens, lps, lengths, hit = _decode(model, chunk, max_new_tokens, temperature, eos_id, pad_id, gen)
            for i in range(len(chunk)):
                n = int(lengths[i])
                results.append((tokens[i, :n].tolist(), lps[i, :n].tolist(), "eos" if bool(hit[i]) else "length"))
    finally:
        model.train(was_training)
    return results


def sample(model, prompts: list[list[int]], num_samples: int, max_new_tokens: int, temperature: float,
           eos_id: int, pad_id: int, seed: int, batch_size: int | None = None) -> list[Completion]:
    """``num_samples`` completions per prompt, grouped by prompt (prompt 0's samples first).

    ``temperature <= 0`` decodes greedily (logprobs then at temperature 1).
    ``batch_size`` caps the rows decoded together (default: all ``len(prompts) * num_samples``).
    """
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be >= 1")
    rows = [p for p in prompts for _ in range(num_samples)]
    if not rows:
        return []
    res = _batched(model, rows, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size)
    return [
        Completion(prompt_index=r // num_samples, sample_index=r % num_samples, response_ids=ids,
                   logprobs=lps, stop_reason=reason)
        for r, (ids, lps, reason) in enumerate(res)
    ]


def greedy(model, prompts: list[list[int]], max_new_tokens: int, eos_id: int, pad_id: int,
           batch_size: int | None = None) -> list[list[int]]:
    """Greedy (argmax) responses, eos included when produced, nothing after it."""
    if not prompts:
        return []
    res = _batched(model, prompts, max_new_tokens, 0.0, eos_id, pad_id, 0, batch_size)
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
