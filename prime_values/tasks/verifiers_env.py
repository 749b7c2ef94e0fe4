"""``task=verifiers``: an environment of the `verifiers` package, rolled out in-process against our sampler.

`verifiers` (PyPI ``verifiers``, PRIME-RL's environment standard; written against its ``verifiers.v1`` API,
0.4.x) describes an environment as a **taskset** (tasks: a prompt, optional system prompt, any extra data
fields, ``@vf.reward`` / ``@vf.metric`` / ``@vf.stop`` methods: the rubric) plus an **Env** whose
``run(task, agents)`` drives the agents: ``SingleAgentEnv`` lets its one seat answer the prompt once; a
multi-turn Env opens ``agents.<seat>.interaction(task)`` and alternates ``segment = await
interaction.turn(message)`` with its own logic (a game engine, a simulated user, a checker), ending the
exchange when it is done; ``finalize(task, episode)`` may record more rewards.

Inside `verifiers` a seat is a *harness program* launched in a runtime box that calls an OpenAI-style endpoint
through an interception server. Here the policy is an HF model sampled in-process, so this adapter keeps the
environment's own logic and replaces only the seats: ``Env.setup``/``run``/``finalize`` run unchanged on the
environment object ``verifiers`` loads (``vf.load_environment``), but every seat is an in-process agent whose
``turn`` renders the conversation to token ids, asks a shared **turn batcher** for a completion, and records
the exchange as a real ``vf.Trace`` (message nodes with token ids, the sampled mask and logprobs). When the
exchange ends the task's rubric scores that trace (``Task.score``, exactly as `verifiers` does; rewards that
need a runtime box are skipped), so the reward is the trace's weighted reward sum.

Many episodes run concurrently on one asyncio loop; the batcher waits until every live episode is either
waiting for a completion or finished, then samples all waiting prompts in one batched decode
(``prime_values.models.sampling.sample``): a group of ``group_size`` rollouts of ``prompts_per_step`` prompts
costs one decode call per turn, not one per rollout.

Token layout (what the rollout record and the critic see): the trace is one flat token list; the policy's
sampled tokens are kept verbatim (``policy_mask`` 1, their sampling logprobs); everything else -- the system
and user prompt, every environment message, chat-template scaffolding -- has ``policy_mask`` 0, logprob 0.
Rendering: a tokenizer with a chat template renders messages with it (each new environment message is the
suffix the template adds after the conversation so far, plus the generation prompt); a tokenizer without one
(the embedded character tokenizer) uses plain text: a system prompt and a newline, then each user/tool message's
text as is (the sampled eos separates turns).

Every place that samples and scores runs episodes through ``rollout`` (``rollout.sample_and_score``;
the inference role's ``generate_rows``): RL rollouts, the held-out evaluation (policy trainer ``eval_every``,
warm start, ``sft`` stage; greedy: ``temperature`` 0), the critic warm start's samples of policy v0 (their
environment tokens have ``policy_mask`` 0) and the ``eval`` stage's avg@k / pass@k (a sample is correct when its
episode's reward is at least 1). ``score_many`` scores a single reply without the environment's ``run``, which
is right for a single-turn environment only.

An episode whose environment raises is one rollout with ``stop_reason`` ``error`` and reward 0 (a failure before
any policy turn keeps only the prompt, every token masked), so a group always holds ``group_size`` rollouts.

Tool environments (a taskset whose tasks declare ``vf.Toolset`` s: ``@vf.tool`` methods, with or without a
``vf.State`` of their own) run as `verifiers`' chat harness runs them: a seat's turn samples a reply; while the
reply calls tools, each call runs in-process (bounded: tasks/verifiers_tools.py), its result is appended as a tool
message (``policy_mask`` 0) and the policy replies again; a reply without calls ends the turn. Every reply counts
against ``task.max_turns``; the task's ``@vf.stop`` hooks (over the trace and the state the tools write) are read
before each reply. The policy writes calls in the chat template's own ``<tool_call>`` format where the template
renders one, else in the plain format ``name({...})`` (SmolLM2-135M's template and the embedded tokenizer); the
rollout records each call (``ToolRollout.calls``: the row's ``task`` JSON ``calls``, listed by
``prime_values.tools.show``).

Not supported here: tool-using harness programs (bash, code execution, MCP servers a harness starts itself), a
toolset that registers its own MCP handlers (a proxy), toolset runtime placement, rewards that need the runtime box,
image content. Config keys: ``task.env_id``, ``task.env_args`` (the taskset's config), ``task.env_class``,
``task.max_turns``, ``task.privileged_field``, ``task.env_pool``, ``task.heldout_size``, ``task.seed``; for tool
environments ``task.tool_format``, ``task.tool_timeout``, ``task.max_tool_calls``, ``task.max_tool_call_chars``,
``task.max_tool_result_chars``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.util
import inspect
import itertools
import json
import logging
import os
from dataclasses import dataclass, field

from prime_values.rollout import EnvRollout

from .arith import Problem
from .tools import ToolRollout

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'prime_values[verifiers]' (or pip install -e '.[verifiers]' in a checkout)"


class VerifiersUnavailable(ValueError):
    """`verifiers` is missing, or the environment cannot be found; the message is one line saying how to fix it."""


def _module_name(env_id: str) -> str:
    """The module `verifiers` imports for an environment id: hub ids are ``owner/name[@version]`` and install as
    ``name``; dashes become underscores."""
    return env_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()


def require_verifiers() -> None:
    if importlib.util.find_spec("verifiers") is None:
        raise VerifiersUnavailable(f"task.name=verifiers needs the verifiers package: {INSTALL_HINT}")


def check_env_id(env_id: str, env_class: str = "") -> None:
    """Cheap pre-launch check (no import of `verifiers`): the package is installed and the environment's module
    can be found (installed, or a built-in taskset)."""
    require_verifiers()
    if not isinstance(env_id, str) or not env_id.strip():
        raise VerifiersUnavailable("task.env_id is empty; name a verifiers environment (an installed environment "
                                   "package such as 'reverse-text', or a built-in taskset)")
    root = importlib.util.find_spec("verifiers").submodule_search_locations
    for key, value, kind in (("task.env_id", env_id, "tasksets"), ("task.env_class", env_class, "envs")):
        if not value:
            continue
        module = _module_name(value)
        builtin = any(os.path.isdir(os.path.join(r, "v1", kind, module)) for r in root or [])
        try:
            found = builtin or importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise VerifiersUnavailable(f"{key}={value!r}: no module {module!r} is installed and it is not a built-in "
                                       f"verifiers {kind[:-1]}; install the environment (e.g. prime env install "
                                       f"{value}) or fix the id")


@contextlib.contextmanager
def _reported(error_type, where: str = ""):
    """A tool setting or toolset the adapter refuses, as the one-line error the config reports."""
    try:
        yield
    except error_type as e:
        raise VerifiersUnavailable(f"{where}{e}") from None


# ---------------------------------------------------------------------------------------------- rendering
class Renderer:
    """Messages -> token ids, incrementally: sampled tokens are never re-tokenised. A tool environment's episode
    passes its ``EpisodeTools``: the hermes format renders calls and ``tools=`` through the chat template, the plain
    format appends the tool list to the system prompt."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))

    @staticmethod
    def _wire(message, calls: bool) -> dict:
        wire = {"role": message.role, "content": _text(message.content)}
        if calls and getattr(message, "tool_calls", None):
            wire["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                  for c in message.tool_calls]
        if calls and message.role == "tool":
            wire.update(tool_call_id=message.tool_call_id, name=message.name or "")
        return wire

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def _conversation(self, messages: list, tools) -> list[dict]:
        hermes = tools is not None and tools.fmt == "hermes"
        wire = [self._wire(m, hermes) for m in messages]
        listing = tools.listing() if tools is not None else ""
        if listing and wire:
            if wire[0]["role"] == "system":
                wire[0]["content"] = f"{wire[0]['content']}\n{listing}"
            else:
                wire.insert(0, {"role": "system", "content": listing})
        return wire

    def delta(self, history: list, new: list, tools=None) -> list[int]:
        """Token ids that follow ``history`` (already rendered, last one possibly a sampled reply) when ``new``
        messages arrive, ending with the generation prompt for the next policy turn."""
        if self.chat:
            extra = {"tools": tools.schemas()} if tools is not None and tools.fmt == "hermes" else {}
            full = self.tokenizer.apply_chat_template(self._conversation(history + new, tools), tokenize=False,
                                                      add_generation_prompt=True, **extra)
            if not history:
                return self._encode(full)
            before = self.tokenizer.apply_chat_template(self._conversation(history, tools), tokenize=False, **extra)
            common = len(os.path.commonprefix([before, full]))
            return self._encode(full[common:])
        parts = []
        listing = tools.listing() if tools is not None and not history else ""
        if listing and not (new and new[0].role == "system"):
            parts.append(listing + "\n")
        for i, m in enumerate(new):
            text = _text(m.content)
            if m.role == "system":
                parts.append(f"{text}\n{listing}\n" if listing and i == 0 else text + "\n")
            else:
                parts.append(text)
        return self._encode("".join(parts))


def _arguments(text: str):
    """A call's arguments as templates render them: the JSON object when they parse as one, else the text."""
    try:
        value = json.loads(text) if len(text) <= 65536 else None
    except (ValueError, RecursionError):
        value = None
    return value if isinstance(value, dict) else text


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(getattr(part, "text", "") or "" for part in content)


# ---------------------------------------------------------------------------------------------- sampling
class TurnBatcher:
    """Collects the next-turn prompts of concurrently running episodes and samples them in one batched decode
    once every live episode is waiting (or done)."""

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float, seed: int,
                 batch_size: int | None = None):
        self.model, self.tokenizer = model, tokenizer
        self.max_new_tokens, self.temperature, self.seed = max_new_tokens, temperature, seed
        self.batch_size = batch_size  # rows decoded together (None: every waiting prompt at once)
        self.live = 0
        self.calls = 0
        self._pending: list[tuple[list[int], int, asyncio.Future]] = []

    def enter(self) -> None:
        self.live += 1

    def leave(self) -> None:
        self.live -= 1
        self._maybe_flush()

    async def generate(self, prompt_ids: list[int], max_new_tokens: int):
        future = asyncio.get_running_loop().create_future()
        self._pending.append((prompt_ids, max_new_tokens, future))
        self._maybe_flush()
        return await future

    def _maybe_flush(self) -> None:
        if not self._pending or len(self._pending) < self.live:
            return
        from prime_values.models.sampling import sample

        pending, self._pending = self._pending, []
        # one decode per distinct cap (turns near the context limit get a smaller one)
        for cap in sorted({cap for _, cap, _ in pending}):
            batch = [(ids, future) for ids, c, future in pending if c == cap]
            try:
                completions = sample(self.model, [ids for ids, _ in batch], num_samples=1, max_new_tokens=cap,
                                     temperature=self.temperature, eos_id=self.tokenizer.eos_token_id,
                                     pad_id=self.tokenizer.pad_token_id, seed=self.seed + self.calls,
                                     batch_size=self.batch_size)
            except Exception as error:  # noqa: BLE001 - every waiting episode sees the failure
                for _, future in batch:
                    future.set_exception(error)
                continue
            finally:
                self.calls += 1
            for (_, future), completion in zip(batch, completions):
                future.set_result(completion)


# ---------------------------------------------------------------------------------------------- seats
@dataclass
class Exchange:
    """One seat's rollout of one episode: the flat token trace, its masks and the vf trace it came from."""

    token_ids: list[int] = field(default_factory=list)
    policy_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    turns: int = 0
    last_stop: str = "eos"  # the sampler's stop reason of the last policy turn
    trace: object = None
    tools: object = None  # the episode's EpisodeTools (verifiers_tools.py) in a tool environment, else None


class _Interaction:
    """What ``agents.<seat>.interaction(task)`` yields: ``turn(message)`` runs one policy turn."""

    def __init__(self, seat: "_Seat", task):
        import verifiers.v1 as vf
        from verifiers.v1.state import state_cls

        self.seat, self.task = seat, task
        self.trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key,
                                                hash=task.hash),
                              agent=vf.AgentInfo(config=seat.config, name=seat.name, trainable=seat.trainable),
                              state=state_cls(type(task))())
        self.exchange = Exchange(trace=self.trace)
        self.history: list = []
        self._started = self._over = self._closed = False
        self._toolsets: list = []  # the task-scoped toolsets this interaction set up (closed with it)

    async def _tools(self):
        """The episode's tools, set up at its first turn (``None`` outside a tool environment)."""
        runner = self.seat.runner
        if self.exchange.tools is not None or runner is None or not runner.has_tools:
            return self.exchange.tools
        from . import verifiers_tools as vt

        self._toolsets = list(type(self.task).toolsets(self.task.config))
        await vt.open_toolsets(self._toolsets, self.task.data)
        tools = vt.toolset_tools(self._toolsets + runner.shared_toolsets)
        fmt = vt.template_format(runner.tokenizer, runner.limits.tool_format)
        self.exchange.tools = vt.EpisodeTools(tools, fmt, runner.limits)
        return self.exchange.tools

    def _append(self, message, ids: list[int], sampled: bool, logprobs=()) -> None:
        from verifiers.v1.graph import MessageNode

        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled, token_ids=list(ids),
                                            mask=[sampled] * len(ids), logprobs=list(logprobs)))
        self.history.append(message)
        ex = self.exchange
        ex.token_ids += ids
        ex.policy_mask += [1 if sampled else 0] * len(ids)
        ex.logprobs += list(logprobs) if sampled else [0.0] * len(ids)

    async def _stopped(self) -> str | None:
        """The first task ``@vf.stop`` hook (over the trace) that fires, by name."""
        for fn in self.task.hooks("stop"):
            params = set(inspect.signature(fn).parameters)
            if not params <= {"task", "trace"}:
                continue  # request/response stops belong to the harness wire, which is not used here
            result = fn(**{k: v for k, v in {"task": self.task.data, "trace": self.trace}.items() if k in params})
            if inspect.isawaitable(result):
                result = await result
            if result:
                return fn.__name__
        return None

    async def turn(self, message=None):
        import verifiers.v1 as vf
        from verifiers.v1.agent import Segment
        from verifiers.v1.dialects.chat import parse_message

        if self._closed:
            raise RuntimeError("this interaction is closed")
        if self._over:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        data = self.task.data
        prompted = not self._started and data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        new: list = []
        if not self._started:
            self._started = True
            if data.system_prompt:
                new.append(vf.SystemMessage(content=data.system_prompt))
            if data.prompt is not None:
                new += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
        if isinstance(message, str):
            new.append(vf.UserMessage(content=message))
        elif message is not None:
            new += [parse_message(m) if isinstance(m, dict) else m for m in message]
        runner = self.seat.runner
        tools = await self._tools()
        limit = self.seat.config.max_turns or runner.max_turns
        segment: list = []  # this turn's replies and tool results, what the Segment carries
        while True:  # one policy turn, then, while its reply calls tools, their results and another policy turn
            reason = self.trace.stop_condition or (await self._stopped() if self.exchange.turns else None)
            if reason is None and self.exchange.turns >= limit:
                reason = "max_turns"
            ids = runner.renderer.delta(self.history, new, tools)
            room = runner.max_context - len(self.exchange.token_ids) - len(ids)
            if reason is None and room < 1:
                reason = "max_total_tokens"
                self.exchange.last_stop = "length"
            if reason is not None:
                self.trace.stop(reason)
                if segment:  # a limit between tool rounds: this turn's replies stand, the next turn ends the exchange
                    for m in new:  # tool results no policy turn reads: in the trace, without tokens
                        self._append(m, [], sampled=False)
                    return Segment(messages=segment)
                self._over = True
                return Segment(messages=[], terminated=True)
            for i, m in enumerate(new):  # the delta rides on the last new message (concatenation is what counts)
                self._append(m, ids if i == len(new) - 1 else [], sampled=False)
            completion = await runner.batcher.generate(list(self.exchange.token_ids),
                                                       min(runner.max_new_tokens, room))
            response = list(completion.response_ids)
            text = runner.tokenizer.decode(response, skip_special_tokens=True)
            reply, calls = (tools.read(text, f"call-{self.exchange.turns + 1}") if tools is not None
                            else (vf.AssistantMessage(content=text), []))
            self._append(reply, response, sampled=True, logprobs=[float(x) for x in completion.logprobs])
            self.exchange.turns += 1
            self.exchange.last_stop = completion.stop_reason
            segment.append(reply)
            if not calls:
                return Segment(messages=segment)
            new = await tools.run(calls, self.trace, self.exchange.turns, last_turn=self.exchange.turns >= limit)
            segment += new

    async def close(self):
        if self._closed:
            return self.trace
        self._closed = True
        if self.trace.stop_condition is None:
            self.trace.stop("agent_completed")
        self.trace.ok = not self.trace.errors
        try:
            await self.task.score(self.trace)  # the rubric: @vf.metric / @vf.reward (and judges) of the task
        finally:
            if self._toolsets:
                from .verifiers_tools import close_toolsets

                await close_toolsets(self._toolsets)
        self.seat.finished(self)
        return self.trace


class _Seat:
    """An in-process stand-in for ``vf.Agent``: the surface ``Env.run`` uses (``run``, ``interaction``,
    ``trainable``, ``config``, ``name``)."""

    def __init__(self, runner: "_EpisodeRunner", name: str, config, episode):
        self.runner, self.name, self.config, self.episode = runner, name, config, episode
        self.trainable = True

    def finished(self, interaction: _Interaction) -> None:
        self.episode.traces.append(interaction.trace)
        self.runner.exchanges.append(interaction.exchange)

    async def run(self, task, **_):
        async with self.interaction(task) as interaction:
            await interaction.turn()
        return interaction.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task, **_):
        interaction = _Interaction(self, task)
        try:
            yield interaction
        finally:
            await interaction.close()


class _EpisodeRunner:
    def __init__(self, env, renderer, tokenizer, batcher, max_turns, max_new_tokens, max_context,
                 has_tools: bool = False, limits=None, shared_toolsets: list | None = None):
        self.env, self.renderer, self.tokenizer, self.batcher = env, renderer, tokenizer, batcher
        self.max_turns, self.max_new_tokens, self.max_context = max_turns, max_new_tokens, max_context
        self.has_tools, self.limits = has_tools, limits  # a tool environment: its ToolLimits
        self.shared_toolsets = shared_toolsets or []  # the taskset's toolsets, set up once for all episodes
        self.exchanges: list[Exchange] = []

    async def run(self, prompt_index: int, task) -> EnvRollout:
        import verifiers.v1 as vf

        episode = vf.Episode(env=vf.EnvInfo(id=self.env.config.env_id),
                             task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash))
        agents = vf.Agents(self.env.config, lambda name, spec: _Seat(self, name, spec, episode))
        error = None
        self.batcher.enter()
        try:
            await self.env.setup(agents)
            await self.env.run(task, agents)
            await self.env.finalize(task, episode)
        except Exception as e:  # noqa: BLE001 - an environment failure is this rollout's outcome, not a crash
            error = f"{type(e).__name__}: {e}"
            log.warning("verifiers episode of task %s failed: %s", task.key[:12], error)
        finally:
            self.batcher.leave()
        mine = [ex for ex in self.exchanges if ex.trace in episode.traces and ex.trace.agent.trainable]
        if not mine:  # still one row, so the group stays complete: the prompt alone, nothing to train on
            data, initial = task.data, []
            if data.system_prompt:
                initial.append(vf.SystemMessage(content=data.system_prompt))
            if data.prompt is not None:
                initial += [vf.UserMessage(content=data.prompt)] if isinstance(data.prompt, str) else list(data.prompt)
            ids = self.renderer.delta([], initial) or [self.tokenizer.eos_token_id]
            return EnvRollout(prompt_index, ids, [0] * len(ids), [0.0] * len(ids), 0.0, "error", "",
                              error=error or "the environment ran no trainable seat")
        if len(mine) > 1:
            log.warning("episode has %d trainable traces; the first is the rollout", len(mine))
        ex = mine[0]
        trace = ex.trace
        stop = "error" if error else ("length" if ex.last_stop == "length" else "env_done" if ex.turns > 1 else "eos")
        replies = [self.tokenizer.decode(n.token_ids, skip_special_tokens=True) for n in trace.nodes if n.sampled]
        rollout = EnvRollout(prompt_index, ex.token_ids, ex.policy_mask, ex.logprobs,
                             0.0 if error else float(trace.reward), stop, "\n".join(replies), turns=ex.turns,
                             rewards={k: (r.value if r is not None else None) for k, r in trace.rewards.items()},
                             error=error)
        if not self.has_tools:
            return rollout
        return ToolRollout(**vars(rollout), calls=list(ex.tools.calls) if ex.tools is not None else [])


# ---------------------------------------------------------------------------------------------- the task
def _quiet_verifiers() -> None:
    """verifiers warns about harness programs it would launch; the adapter launches none."""
    logging.getLogger("verifiers").setLevel(logging.ERROR)


class VerifiersTask:
    """A `verifiers` environment as a prime_values task (see the module docstring)."""

    name = "verifiers"
    multi_turn_capable = True

    def __init__(self, env_id: str = "", env_args: dict | None = None, env_class: str = "", max_turns: int = 8,
                 privileged_field: str = "answer", env_pool: int = 4096, heldout_size: int = 200,
                 seed: int = 1234, tool_format: str = "auto", tool_timeout: float = 10.0, max_tool_calls: int = 16,
                 max_tool_call_chars: int = 4096, max_tool_result_chars: int = 4096, **other):
        check_env_id(env_id, env_class)
        _quiet_verifiers()
        import verifiers.v1 as vf

        from . import verifiers_tools as vt

        self.tool_limits = vt.ToolLimits(tool_format, tool_timeout, max_tool_calls, max_tool_call_chars,
                                         max_tool_result_chars)
        with _reported(vt.ToolSettingsError):
            self.tool_limits.check()

        self.env_id, self.env_class = env_id, env_class
        if env_args is not None and not isinstance(env_args, dict):  # an OmegaConf node from the run config
            from omegaconf import OmegaConf

            env_args = OmegaConf.to_container(env_args, resolve=True)
        self.env_args = dict(env_args or {})
        self.max_turns, self.privileged_field = max_turns, privileged_field
        self.heldout_size, self.seed = heldout_size, seed
        config = vf.resolve_env_config({"id": env_class or "", "taskset": {"id": env_id, **self.env_args}})
        self.env = vf.load_environment(config)
        taskset = self.env.taskset
        tasks = list(itertools.islice(iter(taskset), env_pool) if not taskset.bounded else taskset)
        if not tasks:
            raise VerifiersUnavailable(f"task.env_id={env_id!r}: the taskset yields no tasks")
        self.has_tools = vt.declared_toolsets(tasks[0], taskset)
        if self.has_tools:  # the tools can be run in-process: each is a @vf.tool method, their names are distinct
            with _reported(vt.ToolSettingsError, f"task.env_id={env_id!r}: "):
                vt.toolset_tools(list(type(tasks[0]).toolsets(tasks[0].config)) +
                                 list(taskset.toolsets(taskset.config)))
        problems, seen = [], set()
        for t in tasks:
            p = self._problem(t)
            if p.prompt_id not in seen:
                seen.add(p.prompt_id)
                problems.append(p)
        ordered = sorted(problems, key=lambda p: hashlib.sha1(f"{seed}:{p.prompt_id}".encode()).hexdigest())
        if heldout_size >= len(ordered):
            raise VerifiersUnavailable(f"task.heldout_size={heldout_size} leaves no training tasks: task.env_id="
                                       f"{env_id!r} has {len(ordered)} distinct tasks; lower task.heldout_size")
        self._heldout = ordered[:heldout_size]
        self._heldout_ids = frozenset(p.prompt_id for p in self._heldout)
        self._train = [p for p in problems if p.prompt_id not in self._heldout_ids]

    def _problem(self, task) -> Problem:
        data = task.data
        privileged = getattr(data, self.privileged_field, None) if self.privileged_field else None
        if privileged is None and self.privileged_field and data.model_extra:
            privileged = data.model_extra.get(self.privileged_field)
        privileged = "" if privileged is None else str(privileged)
        prompt = data.prompt_text if data.prompt is not None else ""
        return Problem(prompt_id=f"vf:{self.env_id}:{task.key[:16]}", prompt=prompt, answer=privileged,
                       privileged=privileged, meta={"vf_task": task})

    # ------------------------------------------------------------------ problems
    def sample(self, rng, n: int) -> list[Problem]:
        return [rng.choice(self._train) for _ in range(n)]

    def heldout(self) -> list[Problem]:
        return list(self._heldout)

    def is_heldout(self, problem: Problem) -> bool:
        return problem.prompt_id in self._heldout_ids

    # ------------------------------------------------------------------ rollouts
    def rollout(self, model, tokenizer, problems: list[Problem], num_samples: int, max_new_tokens: int,
                temperature: float, seed: int, max_context: int | None = None,
                batch_size: int | None = None) -> list[EnvRollout]:
        """``num_samples`` episodes per problem (grouped by problem, like ``sample``), run concurrently through
        the environment's own ``run``; one batched decode per turn. ``max_new_tokens`` caps each policy turn,
        ``max_context`` the whole trace (default: the model's ``max_position_embeddings``); ``temperature <= 0``
        decodes greedily (what the held-out evaluation uses); ``batch_size`` caps the rows one decode holds."""
        if max_context is None:
            max_context = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        renderer = Renderer(tokenizer)
        batcher = TurnBatcher(model, tokenizer, max_new_tokens, temperature, seed, batch_size)
        runner = _EpisodeRunner(self.env, renderer, tokenizer, batcher, self.max_turns, max_new_tokens, max_context,
                                self.has_tools, self.tool_limits)

        async def all_episodes():
            if self.has_tools:  # the taskset's toolsets: set up once, shared by every episode of this call
                from .verifiers_tools import close_toolsets, open_toolsets

                taskset = self.env.taskset
                runner.shared_toolsets = list(taskset.toolsets(taskset.config))
                await open_toolsets(runner.shared_toolsets)
            try:
                jobs = [runner.run(i, p.meta["vf_task"]) for i, p in enumerate(problems) for _ in range(num_samples)]
                return await asyncio.gather(*jobs)
            finally:
                if runner.shared_toolsets:
                    await close_toolsets(runner.shared_toolsets)

        return list(asyncio.run(all_episodes()))

    # ------------------------------------------------------------------ single-reply scoring
    def score_many(self, problems: list[Problem], texts: list[str]) -> list[float]:
        """The rubric on a one-reply conversation (prompt, then ``text`` as the assistant's answer), without the
        environment's ``run``/``finalize``: right for a single-turn environment only. Nothing in a run scores
        rollouts this way (every sampler -- inference, held-out evaluation, critic warm start, the eval stage --
        runs episodes through ``rollout``); it serves ``score`` and checks by hand."""
        import verifiers.v1 as vf

        async def one(problem: Problem, text: str) -> float:
            seat = _Seat(None, "agent", vf.AgentConfig(), vf.Episode(task=vf.TraceTask(type="x", data=problem.meta[
                "vf_task"].data)))
            seat.finished = lambda interaction: None
            interaction = _Interaction(seat, problem.meta["vf_task"])
            data = interaction.task.data
            if data.system_prompt:
                interaction._append(vf.SystemMessage(content=data.system_prompt), [], sampled=False)
            if data.prompt is not None:
                interaction._append(vf.UserMessage(content=data.prompt) if isinstance(data.prompt, str)
                                    else data.prompt[-1], [], sampled=False)
            interaction._append(vf.AssistantMessage(content=text), [], sampled=True)
            try:
                trace = await interaction.close()
            except Exception as e:  # noqa: BLE001 - a failing rubric scores 0
                log.warning("verifiers rubric failed: %s: %s", type(e).__name__, e)
                return 0.0
            return float(trace.reward)

        async def all_scores():
            return await asyncio.gather(*(one(p, t) for p, t in zip(problems, texts)))

        return list(asyncio.run(all_scores()))

    def score(self, problem: Problem, response_text: str) -> float:
        return self.score_many([problem], [response_text])[0]

    def solution(self, problem: Problem) -> str:
        raise NotImplementedError("task=verifiers has no reference solutions for a supervised warm start; set "
                                  "policy.warm_start.steps=0 (or give sft.data a dataset)")

    def max_answer_chars(self) -> int:
        return 256

    def describe(self) -> dict:
        return {"name": self.name, "env_id": self.env_id, "env_class": self.env_class or type(self.env).__name__,
                "env_args": self.env_args, "max_turns": self.max_turns, "privileged_field": self.privileged_field,
                "tools": self.has_tools,
                "heldout_size": len(self._heldout), "train_tasks": len(self._train), "seed": self.seed,
                "prompt_example": self._heldout[0].prompt if self._heldout else None}
