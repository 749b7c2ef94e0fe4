"""The tools of a `verifiers` tool environment, run in-process for ``task=verifiers`` (tasks/verifiers_env.py).

In `verifiers` (0.4, its ``v1`` API) a tool environment is a taskset whose tasks declare **toolsets**:
``Task.toolsets(config)`` (built per rollout) and ``Taskset.toolsets(config)`` (shared by every rollout), each a
``vf.Toolset`` whose ``@vf.tool`` methods are the tools; a toolset typed with its own ``vf.State`` subclass reads and
writes the rollout's state (``self.state``: the stateful tool environments). `verifiers` serves each toolset as an
MCP server and its chat harness loops: sample a reply; run each tool call of it (``<toolset>_<tool>``, or the bare
name when the toolset's ``TOOL_PREFIX`` is None) and append the results as tool messages; sample again; until a reply
without calls -- the answer the rubric scores.

Here the same loop runs in the adapter's seat (``_Interaction.turn``) and the toolsets run in-process: each
``@vf.tool`` method is called directly, with ``setup``/``setup_task`` as the MCP server would run them, and the
rollout's state handed in and taken back around each call as `verifiers`' state channel does (a copy validated into
the toolset's state type; written back when the call changed it). Runtime placement (``ToolsetConfig.runtime``,
``url``) is not used, and a toolset that registers its tools itself (an MCP proxy) is refused.

**The call format.** ``tool_format`` ``hermes``: the policy writes ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` (one block per call, several per reply allowed), what chat templates that render tool calls
with those tags use (Qwen2.5/3, Hermes, SmolLM3); the tool schemas go to the template (``tools=``). ``plain``: a
reply that is one call ``name({...JSON arguments...})`` and nothing else (``lookup({"key": "k7"})``); a reply
``name(...)`` whose name is no tool and whose argument text does not start with ``{`` is an answer, not a call; the
tool list (names, arguments, descriptions) follows the system prompt. ``auto`` picks ``hermes`` when the tokenizer's
chat template writes ``<tool_call>``, else ``plain``: SmolLM2-135M-Instruct's template (the GGUF's
``tokenizer.chat_template``) renders only each message's role and content, so it cannot express a call, and the
embedded character tokenizer has no template.

**Untrusted calls.** A call's text is read by a fixed grammar and ``json.loads``, never evaluated; the arguments are
validated against the tool's signature (pydantic, extra keys refused) before the tool runs. Every failure is one short
error the policy reads as the tool's reply (``ERROR_PREFIX``): a call over ``max_tool_call_chars`` characters, text
that is no call, invalid JSON, arguments that are not an object or do not fit the signature, an unknown tool (the
reply names the tools), a tool that raises, a tool that takes longer than ``tool_timeout`` seconds (an ``async`` tool
is cancelled; a plain function runs in a daemon thread the episode stops waiting for: it cannot be killed, so a tool
that may run long should be async or bound its own work), and calls past ``max_tool_calls`` in one episode. A result
longer than ``max_tool_result_chars`` characters is cut. A call on the episode's last turn is not run (no reply
follows it) and is recorded with ``error: out of turns``.

Each call is recorded as the embedded tools task records them (tasks/tools.py), ``{"turn", "tool", "args",
"result"}`` (arguments and result cut to ``LOGGED_CHARS``), so the row's ``task`` JSON keeps them as ``calls`` and
``prime_values.tools.show`` lists them.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import json
import re
import threading
from dataclasses import dataclass, field
from typing import Any

import pydantic
import pydantic_core
from verifiers.v1 import AssistantMessage, State, ToolCall, ToolMessage
from verifiers.v1.mcp.server import _call_state
from verifiers.v1.mcp.toolset import Toolset
from verifiers.v1.utils.decorators import discover_decorated

FORMATS = ("auto", "hermes", "plain")
ERROR_PREFIX = "error: "
OUT_OF_TURNS = "error: out of turns"  # recorded for a call on the last turn; it is not run
LOGGED_CHARS = 200  # the arguments and result a call's record keeps (the tokens hold the whole exchange)
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,63}")
_OPEN, _CLOSE = "<tool_call>", "</tool_call>"


class ToolSettingsError(ValueError):
    """A tool setting or toolset the adapter cannot use; the message is one line naming the key and the fix."""


@dataclass(frozen=True)
class ToolLimits:
    """What bounds the tool calls of one episode (the ``task.*`` keys of the same names)."""

    tool_format: str = "auto"
    tool_timeout: float = 10.0
    max_tool_calls: int = 16
    max_tool_call_chars: int = 4096
    max_tool_result_chars: int = 4096

    def check(self) -> None:
        if self.tool_format not in FORMATS:
            raise ToolSettingsError(f"task.tool_format={self.tool_format!r} must be one of {', '.join(FORMATS)}")
        if not (isinstance(self.tool_timeout, (int, float)) and 0 < self.tool_timeout <= 3600):
            raise ToolSettingsError(f"task.tool_timeout={self.tool_timeout!r} must be in (0, 3600] seconds")
        for key in ("max_tool_calls", "max_tool_call_chars", "max_tool_result_chars"):
            low = 1 if key == "max_tool_calls" else 16
            if not (isinstance(getattr(self, key), int) and getattr(self, key) >= low):
                raise ToolSettingsError(f"task.{key}={getattr(self, key)!r} must be an integer >= {low}")


def template_format(tokenizer, setting: str) -> str:
    """The call format for this tokenizer: ``setting`` unless ``auto``; ``auto`` is ``hermes`` where the chat
    template writes ``<tool_call>`` (it renders calls in that format), else ``plain``."""
    if setting != "auto":
        return setting
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    return "hermes" if isinstance(template, str) and _OPEN in template and "tool_calls" in template else "plain"


@dataclass
class Call:
    """One call the policy wrote: the tool's name ('' when none could be read), its argument text, and the error
    it already earned while being read (None: it is runnable)."""

    name: str
    arguments: str
    error: str | None = None
    id: str = ""


@dataclass
class Tool:
    """One ``@vf.tool`` method: the name the policy calls it by, its function and its arguments' model."""

    name: str
    fn: Any
    arguments: type[pydantic.BaseModel]
    toolset: Toolset
    description: str = ""

    def schema(self) -> dict:
        """OpenAI-style function schema (what a chat template's ``tools=`` takes)."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": parameters}}

    def signature_line(self) -> str:
        params = ", ".join(f"{name}: {_type_name(f.annotation)}" for name, f in self.arguments.model_fields.items())
        described = f" -- {self.description.splitlines()[0][:160]}" if self.description else ""
        return f"{self.name}({params}){described}"


def _type_name(annotation) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _argument_model(name: str, fn) -> type[pydantic.BaseModel]:
    fields: dict[str, Any] = {}
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        annotation = Any if param.annotation is param.empty else param.annotation
        fields[param.name] = (annotation, ... if param.default is param.empty else param.default)
    return pydantic.create_model(f"{name}_arguments", __config__=pydantic.ConfigDict(extra="forbid"), **fields)


def toolset_tools(toolsets: list[Toolset]) -> dict[str, Tool]:
    """The tools of ``toolsets`` by the name the policy calls them (``<server_name>_<tool>``, or bare)."""
    tools: dict[str, Tool] = {}
    for toolset in toolsets:
        if type(toolset).register is not Toolset.register:
            raise ToolSettingsError(f"toolset {type(toolset).__name__} registers its own MCP handlers (a proxy to "
                                    "another server); task=verifiers runs @vf.tool methods in-process only")
        prefix = toolset.server_name
        for fn in discover_decorated(toolset, "tool"):
            raw = getattr(fn, "tool_name", None) or fn.__name__
            name = f"{prefix}_{raw}" if prefix else raw
            if name in tools:
                raise ToolSettingsError(f"two tools are named {name!r} (toolsets {type(tools[name].toolset).__name__}"
                                        f" and {type(toolset).__name__}); give one toolset a distinct TOOL_PREFIX")
            tools[name] = Tool(name, fn, _argument_model(name, fn), toolset, (fn.__doc__ or "").strip())
    return tools


def declared_toolsets(task, taskset) -> bool:
    """Whether the environment has tools at all (its task class or its taskset declares toolsets)."""
    return bool(type(task).toolsets(task.config)) or bool(taskset.toolsets(taskset.config))


async def open_toolsets(toolsets: list[Toolset], task_data=None) -> None:
    """What the MCP server does before serving: ``setup()``, then (task-scoped ones) ``setup_task(task)``."""
    for toolset in toolsets:
        await toolset.setup()
        if task_data is not None:
            await toolset.setup_task(task_data)


async def close_toolsets(toolsets: list[Toolset]) -> None:
    for toolset in toolsets:
        await toolset._exit_stack.aclose()


def _cut(text: str, most: int) -> str:
    return text if len(text) <= most else f"{text[:most]}... ({len(text)} characters, cut to {most})"


@dataclass
class EpisodeTools:
    """The tools of one seat's episode: how its calls are written, read and run, and the record of each call."""

    tools: dict[str, Tool]
    fmt: str
    limits: ToolLimits
    calls: list = field(default_factory=list)  # {"turn", "tool", "args", "result"} per call, in order
    run_count: int = 0  # calls counted against max_tool_calls

    # ------------------------------------------------------------------ what the policy is shown
    def schemas(self) -> list[dict] | None:
        """The template's ``tools=`` (hermes format), else None."""
        return [t.schema() for t in self.tools.values()] if self.fmt == "hermes" else None

    def listing(self) -> str:
        """The plain format's tool list, appended to the system prompt."""
        if self.fmt != "plain":
            return ""
        lines = [f"Tools: to call one, reply with only name({{JSON arguments}}), e.g. {self._example()}; its result "
                 "comes back. Reply without a call to answer."]
        return "\n".join(lines + [f"- {t.signature_line()}" for t in self.tools.values()])

    def _example(self) -> str:
        tool = next((t for t in self.tools.values() if t.arguments.model_fields), next(iter(self.tools.values())))
        args = {name: "..." for name in list(tool.arguments.model_fields)[:2]}
        return f"{tool.name}({json.dumps(args)})"

    # ------------------------------------------------------------------ reading a reply
    def read(self, text: str, call_prefix: str) -> tuple[AssistantMessage, list[Call]]:
        """The assistant message of a reply and its tool calls (ids ``<call_prefix>-<k>``), read, none evaluated;
        no calls: the reply is an answer."""
        calls = self._hermes(text) if self.fmt == "hermes" else self._plain(text)
        if calls is None:
            return AssistantMessage(content=text), []
        tool_calls = []
        for k, call in enumerate(calls):
            call.id = f"{call_prefix}-{k}"
            tool_calls.append(ToolCall(id=call.id, name=call.name or "?", arguments=call.arguments))
        content = text.split(_OPEN, 1)[0].strip() if self.fmt == "hermes" else text
        return AssistantMessage(content=content or None, tool_calls=tool_calls), calls

    def _plain(self, text: str) -> list[Call] | None:
        stripped = text.strip()
        opened = stripped.find("(", 0, 66)
        if opened < 1 or not _NAME.fullmatch(stripped[:opened]):
            return None
        name, rest = stripped[:opened], stripped[opened + 1:]
        if name not in self.tools and not rest.lstrip().startswith("{"):
            return None  # 'sqrt(4)' is an answer unless a tool is called sqrt
        limit = self.limits.max_tool_call_chars
        if len(stripped) > limit:
            return [Call(name, rest[:LOGGED_CHARS], f"error: the call is over {limit} characters; send a shorter one")]
        if not rest.endswith(")"):
            return [Call(name, rest, f"error: not a call; write {name}({{JSON arguments}}) and nothing else")]
        return [Call(name, rest[:-1])]

    def _hermes(self, text: str) -> list[Call] | None:
        if _OPEN not in text:
            return None
        calls, limit = [], self.limits.max_tool_call_chars
        for block in text.split(_OPEN)[1:]:
            body, closed, _ = block.partition(_CLOSE)
            body = body.strip()
            if len(body) > limit:
                calls.append(Call("", body[:LOGGED_CHARS], f"error: the call is over {limit} characters; send a "
                                                            "shorter one"))
                continue
            if not closed:
                calls.append(Call("", body, f"error: {_OPEN} without {_CLOSE}; close each call"))
                continue
            try:
                wrapper = json.loads(body)
            except (ValueError, RecursionError) as e:
                calls.append(Call("", body, f"error: invalid JSON in the tool call ({_short(e)}); resend it as "
                                            '{"name": ..., "arguments": {...}}'))
                continue
            name = wrapper.get("name") if isinstance(wrapper, dict) else None
            if not isinstance(name, str) or not name:
                calls.append(Call("", body, 'error: a tool call is {"name": ..., "arguments": {...}}; the name is '
                                            "missing"))
                continue
            arguments = wrapper.get("arguments", {})
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            calls.append(Call(name[:64], arguments))
        return calls

    # ------------------------------------------------------------------ running the calls
    async def run(self, calls: list[Call], trace, turn: int, last_turn: bool) -> list[ToolMessage]:
        """Run a reply's calls in order; one tool message per call (none on the last turn: no reply follows)."""
        messages: list[ToolMessage] = []
        over_budget = 0
        for call in calls:
            if last_turn:
                result = OUT_OF_TURNS
            elif self.run_count >= self.limits.max_tool_calls:
                over_budget += 1
                result = (f"error: too many tool calls (at most {self.limits.max_tool_calls} per episode); answer "
                          "without calling")
            else:
                self.run_count += 1
                result = call.error or await self._run(call, trace)
            self.calls.append({"turn": turn, "tool": call.name, "args": call.arguments[:LOGGED_CHARS],
                               "result": result[:LOGGED_CHARS]})
            if not last_turn and over_budget <= 1:  # calls past the budget share one reply
                messages.append(ToolMessage(tool_call_id=call.id, content=result, name=call.name or None))
        return messages

    async def _run(self, call: Call, trace) -> str:
        tool = self.tools.get(call.name)
        if tool is None:
            names = ", ".join(list(self.tools)[:16])
            return f"error: unknown tool {call.name[:64]!r}; the tools are {names}"
        try:
            raw = json.loads(call.arguments) if call.arguments.strip() else {}
        except (ValueError, RecursionError) as e:
            return f"error: invalid JSON in the arguments of {tool.name} ({_short(e)}); resend them as a JSON object"
        if not isinstance(raw, dict):
            return f"error: the arguments of {tool.name} must be a JSON object, not {type(raw).__name__}"
        try:
            parsed = tool.arguments.model_validate(raw)
        except pydantic.ValidationError as e:
            problems = "; ".join(f"{'.'.join(str(x) for x in err['loc']) or 'arguments'}: {err['msg']}"
                                 for err in e.errors()[:3])
            return f"error: bad arguments for {tool.name}: {_cut(problems, 300)}"
        kwargs = {name: getattr(parsed, name) for name in tool.arguments.model_fields}
        try:
            result = await self._call(tool, kwargs, trace)
        except asyncio.TimeoutError:
            return f"error: {tool.name} took longer than {self.limits.tool_timeout:g} s; the call was stopped"
        except Exception as e:  # noqa: BLE001 - a failing tool is the policy's reply, as the MCP server returns it
            return f"error: {tool.name} failed: {type(e).__name__}: {_cut(str(e), 200)}"
        if not isinstance(result, str):
            result = pydantic_core.to_json(result, fallback=str).decode()
        return _cut(result, self.limits.max_tool_result_chars)

    async def _call(self, tool: Tool, kwargs: dict, trace):
        """The tool with the rollout's state as its toolset's ``self.state`` (validated into its type; written back
        when the call changed it), in at most ``tool_timeout`` seconds."""
        toolset = tool.toolset
        synced = toolset._state_cls is not State
        host = pydantic.TypeAdapter(type(trace.state))
        before = toolset._state_adapter.dump_json(
            toolset._state_adapter.validate_json(host.dump_json(trace.state))) if synced else b""
        state = toolset._state_adapter.validate_json(before) if synced else State()
        context = contextvars.copy_context()
        context.run(_call_state.set, state)
        if inspect.iscoroutinefunction(tool.fn):
            job = asyncio.get_running_loop().create_task(tool.fn(**kwargs), context=context)
        else:
            job = _in_daemon_thread(tool.fn, kwargs, context)
        result = await asyncio.wait_for(job, self.limits.tool_timeout)
        if synced:
            after = toolset._state_adapter.dump_json(state)
            if after != before:
                trace.state = host.validate_json(after)
        return result


def _short(error: Exception) -> str:
    return _cut(str(error), 120)


def _in_daemon_thread(fn, kwargs: dict, context: contextvars.Context) -> asyncio.Future:
    """``fn(**kwargs)`` in a daemon thread (one the interpreter does not wait for at exit), as a future of the
    running loop: a call that never returns keeps its thread, not the episode."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        try:
            ok, value = True, context.run(fn, **kwargs)
        except BaseException as e:  # noqa: BLE001 - delivered to the episode as the tool's failure
            ok, value = False, e
        try:
            loop.call_soon_threadsafe(settle, ok, value)
        except RuntimeError:  # the loop is gone: nobody waits for this call any more
            pass

    threading.Thread(target=work, name="verifiers-tool", daemon=True).start()
    return future
