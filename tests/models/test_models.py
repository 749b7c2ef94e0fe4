"""Tokenizer, tiny policy/critic building and reloading, sampling logprobs and determinism."""

import pytest
import torch

from prime_values.models import (
    build_char_tokenizer,
    build_critic,
    build_tiny_policy,
    critic_values,
    greedy,
    keep_layers,
    load_critic,
    load_policy,
    sample,
    sampling,
    save_model,
    teacher_forced_logprobs,
)

SMALL = dict(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128)


@pytest.fixture(scope="module")
def tok():
    return build_char_tokenizer()


@pytest.fixture(scope="module")
def policy_dir(tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("policy")
    save_model(build_tiny_policy(tok, seed=0, **SMALL), tok, d)
    return d


def test_tokenizer_round_trip(tok):
    text = "12+34=46\n  a~Z{}|\\\"'`"
    ids = tok.encode(text)
    assert len(ids) == len(text)
    assert tok.eos_token_id not in ids and tok.bos_token_id not in ids and tok.pad_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert tok.decode(ids + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == text
    assert len(tok) <= 128
    assert len({tok.pad_token_id, tok.eos_token_id, tok.bos_token_id}) == 3


def test_tokenizer_reloads_with_autotokenizer(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    text = "7*8-9=47 \n"
    assert tok2.encode(text) == tok.encode(text)
    assert tok2.decode(tok.encode(text), skip_special_tokens=True) == text
    assert (tok2.pad_token_id, tok2.eos_token_id, tok2.bos_token_id) == (tok.pad_token_id, tok.eos_token_id,
                                                                         tok.bos_token_id)


def test_policy_save_reload_identical_logits(tok, policy_dir):
    from transformers import AutoModelForCausalLM

    model = build_tiny_policy(tok, seed=0, **SMALL).eval()  # same seed -> same weights as policy_dir
    reloaded = AutoModelForCausalLM.from_pretrained(policy_dir).eval()
    x = torch.randint(4, len(tok), (3, 11))
    with torch.no_grad():
        assert torch.equal(model(x).logits, reloaded(x).logits)
        assert torch.equal(load_policy(policy_dir)(x).logits, model(x).logits)
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(policy_dir).encode("12+3=") == tok.encode("12+3=")
    other = build_tiny_policy(tok, seed=1, **SMALL)
    assert not torch.equal(other.model.embed_tokens.weight, model.model.embed_tokens.weight)


def test_default_policy_is_about_a_million_params(tok):
    n = sum(p.numel() for p in build_tiny_policy(tok, seed=0).parameters())
    assert 0.4e6 < n < 2e6


def test_critic_from_policy_shares_backbone(tok, policy_dir, tmp_path):
    policy = load_policy(policy_dir)
    critic = build_critic(policy_dir, tok, seed=3)
    assert critic.config.num_labels == 1
    ps, cs = policy.model.state_dict(), critic.model.state_dict()
    assert ps.keys() == cs.keys()
    assert all(torch.equal(ps[k], cs[k]) for k in ps)
    x = torch.randint(4, len(tok), (2, 9))
    mask = torch.ones_like(x)
    critic.eval()
    with torch.no_grad():
        v = critic_values(critic, x, mask)
        assert v.shape == (2, 9)
        # causal: values at a position do not depend on later tokens. Same shapes, and later tokens reach earlier
        # positions only through attention weights that are exactly 0 (exp(-inf)), so the same float32 operations:
        # equal in practice; 1e-6 is a margin of tens of ulp for values of this init (|v| < 0.1), while a leak of a
        # later token moves a value by that token's whole contribution
        x2 = x.clone()
        x2[:, 5:] = 7
        assert torch.allclose(critic_values(critic, x2, mask)[:, :5], v[:, :5], atol=1e-6)
    save_model(critic, tok, tmp_path)
    with torch.no_grad():  # the same weights (safetensors is exact) and inputs: the same numbers, 1e-6 a margin
        assert torch.allclose(critic_values(load_critic(tmp_path), x, mask), v, atol=1e-6)
    fresh = build_critic(None, tok, seed=3, **SMALL)
    assert not torch.equal(fresh.model.embed_tokens.weight, critic.model.embed_tokens.weight)


def test_shallow_critic_keeps_the_first_blocks_and_round_trips(tok, policy_dir, tmp_path):
    """critic.num_layers: the first N blocks of the policy's backbone, the same embeddings; from_pretrained
    loads the saved shallower critic with the same values; asking for more blocks than exist is one error."""
    policy = load_policy(policy_dir)
    critic = build_critic(policy_dir, tok, seed=3, depth=1)
    assert len(critic.model.layers) == critic.config.num_hidden_layers == 1
    assert torch.equal(critic.model.layers[0].mlp.up_proj.weight, policy.model.layers[0].mlp.up_proj.weight)
    assert torch.equal(critic.model.embed_tokens.weight, policy.model.embed_tokens.weight)
    full = build_critic(policy_dir, tok, seed=3)
    x, mask = torch.randint(4, len(tok), (2, 9)), torch.ones(2, 9, dtype=torch.long)
    critic.eval()
    with torch.no_grad():
        v = critic_values(critic, x, mask)
        assert not torch.allclose(v, critic_values(full.eval(), x, mask))  # one block fewer: other values
        save_model(critic, tok, tmp_path)
        loaded = load_critic(tmp_path)
        assert len(loaded.model.layers) == 1
        assert torch.allclose(critic_values(loaded, x, mask), v, atol=1e-6)
    assert keep_layers(full, 0) is full and len(full.model.layers) == 2  # 0 = all
    with pytest.raises(ValueError, match="critic.num_layers=3.*2 transformer blocks"):
        keep_layers(full, 3)
    scratch = build_critic(None, tok, seed=3, depth=1, **SMALL)
    assert len(scratch.model.layers) == 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sample_logprobs_match_teacher_forcing(tok, policy_dir, temperature):
    model = load_policy(policy_dir)
    prompts = [tok.encode(s) for s in ["12+34=", "5+7=", "123*45-6=", "9="]]
    comps = sample(model, prompts, num_samples=3, max_new_tokens=10, temperature=temperature,
                   eos_id=tok.eos_token_id, pad_id=tok.pad_token_id, seed=0)
    assert [c.prompt_index for c in comps] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    ref = teacher_forced_logprobs(model, [prompts[c.prompt_index] for c in comps],
                                  [c.response_ids for c in comps], temperature, tok.pad_token_id)
    for c, r in zip(comps, ref):
        assert len(c.logprobs) == len(c.response_ids) >= 1
        # KV-cached decoding vs one full forward: other shapes, the same math. A GEMM of inner dimension K rounds an
        # output by at most K eps32 of the sum of its |terms|; 2 blocks of K <= 128 give 2 * 128 * 1.19e-7 = 3e-5 of
        # logits that are O(1) or less for this init (typically sqrt(K) eps32, ~1e-6). A temperature or position
        # error moves logprobs by > 1e-2
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(r), atol=1e-4)
        assert all(lp <= 0 for lp in c.logprobs)
    # same seed -> same samples; a different seed -> different samples
    again = sample(model, prompts, 3, 10, temperature, tok.eos_token_id, tok.pad_token_id, seed=0)
    assert [c.response_ids for c in again] == [c.response_ids for c in comps]
    other = sample(model, prompts, 3, 10, temperature, tok.eos_token_id, tok.pad_token_id, seed=1)
    assert [c.response_ids for c in other] != [c.response_ids for c in comps]


def _biased(model, token_id, bias):
    """Add ``bias`` to one token's logit via a forward hook on the LM head."""
    vec = torch.zeros(model.config.vocab_size)
    vec[token_id] = bias
    return model.lm_head.register_forward_hook(lambda mod, inp, out: out + vec)


def test_stop_reasons_and_truncation_after_eos(tok, policy_dir):
    model = load_policy(policy_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = [tok.encode("1+1="), tok.encode("22+33=")]
    handle = _biased(model, eos, -1e4)  # eos can never be sampled -> every response runs to the cap
    try:
        comps = sample(model, prompts, 4, 6, 1.0, eos, pad, seed=0)
        assert all(c.stop_reason == "length" and len(c.response_ids) == 6 and eos not in c.response_ids
                   for c in comps)
    finally:
        handle.remove()
    handle = _biased(model, eos, 1e4)  # eos is certain -> a one-token response
    try:
        comps = sample(model, prompts, 4, 6, 1.0, eos, pad, seed=0)
        assert all(c.stop_reason == "eos" and c.response_ids == [eos] for c in comps)
        assert all(abs(c.logprobs[0]) < 1e-4 for c in comps)  # log(1 - ~exp(-1e4)): 0 in float32
    finally:
        handle.remove()
    handle = _biased(model, eos, 3.0)  # mixed lengths within one batch
    try:
        mixed = sample(model, prompts, 16, 12, 1.0, eos, pad, seed=2)
        ref = teacher_forced_logprobs(model, [prompts[c.prompt_index] for c in mixed],
                                      [c.response_ids for c in mixed], 1.0, pad)
    finally:
        handle.remove()
    assert {c.stop_reason for c in mixed} == {"eos", "length"}
    assert len({len(c.response_ids) for c in mixed}) > 2
    for c, r in zip(mixed, ref):
        assert (c.stop_reason == "eos") == (c.response_ids[-1] == eos)
        assert eos not in c.response_ids[:-1]
        assert c.stop_reason == "eos" or len(c.response_ids) == 12
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(r), atol=1e-4)  # as in the test above


def test_greedy_is_deterministic_and_batch_independent(tok, policy_dir):
    model = load_policy(policy_dir)
    prompts = [tok.encode(s) for s in ["12+34=", "5+7=", "99*99=", "1="]]
    a = greedy(model, prompts, 8, tok.eos_token_id, tok.pad_token_id)
    b = greedy(model, prompts, 8, tok.eos_token_id, tok.pad_token_id)
    assert a == b
    singles = [greedy(model, [p], 8, tok.eos_token_id, tok.pad_token_id)[0] for p in prompts]
    assert singles == a  # left padding does not change greedy results
    assert greedy(model, prompts, 8, tok.eos_token_id, tok.pad_token_id, batch_size=3) == a
    # greedy == temperature-0 sampling
    comps = sample(model, prompts, 1, 8, 0.0, tok.eos_token_id, tok.pad_token_id, seed=5)
    assert [c.response_ids for c in comps] == a


def test_finished_rows_leave_the_batch_and_change_no_result(tok, policy_dir):
    """A row that has produced its eos leaves the decode batch (sampling.DROP_FINISHED_SHARE): later forwards see
    fewer rows, and the greedy replies and their logprobs are those of the path that decodes every row to the end."""
    model = load_policy(policy_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = [tok.encode(s) for s in ["12+34=", "5+7=", "99*99=", "1=", "3-2=", "45+6=", "7*8=", "100-1="]] * 4
    rows_seen: list[int] = []

    def eos_at_every_7th_position(mod, args, kwargs, out):  # replies end at lengths set by their prompt's length
        rows_seen.append(kwargs["input_ids"].shape[0])
        out.logits[:, -1, eos] += 1e4 * (kwargs["position_ids"][:, -1] % 7 == 0)

    handle = model.register_forward_hook(eos_at_every_7th_position, with_kwargs=True)
    try:
        old = sample(model, prompts, 1, 12, 0.0, eos, pad, seed=0, drop_finished=False, share_prompts=False)
        rows_seen.clear()
        new = sample(model, prompts, 1, 12, 0.0, eos, pad, seed=0, share_prompts=False)
    finally:
        handle.remove()
    assert len({len(c.response_ids) for c in old}) > 2, [len(c.response_ids) for c in old]
    assert [c.response_ids for c in new] == [c.response_ids for c in old]
    assert [c.stop_reason for c in new] == [c.stop_reason for c in old]
    for a, b in zip(new, old):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    assert rows_seen[0] == len(prompts) and rows_seen[-1] < len(prompts), rows_seen
    assert rows_seen == sorted(rows_seen, reverse=True)
    # each decode step holds the rows still decoding and fewer finished ones than DROP_FINISHED_SHARE of it
    needed = sum(len(c.response_ids) - 1 for c in old)
    assert sum(rows_seen[1:]) < needed / (1 - sampling.DROP_FINISHED_SHARE), (rows_seen, needed)


def test_what_the_prompts_share_is_computed_once(tok, policy_dir):
    """share_prompts: the prefix common to every row is one row's forward, each distinct prompt's rest one more
    (a group's samples share it), and the cache is copied out to the rows. Greedy replies and logprobs are those of
    the path that computes every row whole; sampled logprobs are those of teacher forcing."""
    model = load_policy(policy_dir)
    eos, pad = tok.eos_token_id, tok.pad_token_id
    prompts = [tok.encode(s) for s in ["Q: 12+34=", "Q: 5+7=", "Q: 99*99=", "Q: 1="]]
    head = tok.encode("Q: ")
    assert all(p[:len(head)] == head for p in prompts) and len({p[len(head)] for p in prompts}) > 1
    shared = len(head)  # the prefix every prompt shares, and no more
    rows_seen: list[tuple[int, int]] = []
    handle = model.register_forward_pre_hook(
        lambda mod, args, kwargs: rows_seen.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True)
    try:
        whole = sample(model, prompts, 3, 8, 0.0, eos, pad, seed=0, share_prompts=False)
        assert rows_seen[0] == (12, max(len(p) for p in prompts)), rows_seen
        rows_seen.clear()
        once = sample(model, prompts, 3, 8, 0.0, eos, pad, seed=0)
        assert rows_seen[0] == (1, shared) and rows_seen[1] == (4, max(len(p) for p in prompts) - shared), rows_seen
        assert rows_seen[2][0] == 12, rows_seen  # the decode holds every row
        sampled = sample(model, prompts, 3, 8, 1.0, eos, pad, seed=0)
    finally:
        handle.remove()
    assert [c.response_ids for c in once] == [c.response_ids for c in whole]
    for a, b in zip(once, whole):
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4)
    ref = teacher_forced_logprobs(model, [prompts[c.prompt_index] for c in sampled],
                                  [c.response_ids for c in sampled], 1.0, pad)
    for c, r in zip(sampled, ref):
        assert torch.allclose(torch.tensor(c.logprobs), torch.tensor(r), atol=1e-4)  # as in the tests above
    assert greedy(model, [prompts[0]] * 2, 8, eos, pad) == [whole[0].response_ids] * 2  # one distinct prompt
