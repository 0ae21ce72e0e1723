"""Tool environments: plain Python functions become OpenAI tool schemas (from signatures and
docstrings); bad tool-call JSON, unknown tools and tool exceptions go back to the model as
error messages. Sandbox failures are not the model's fault: they end the rollout with an error."""

from __future__ import annotations

import enum
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import anyio

from sandgym.sandboxes.errors import SandboxError

from .decorators import stop
from .environment import MultiTurnEnv
from .state import Message, State

_JSON_TYPES: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object", tuple: "array"}


def _json_schema(tp: Any) -> dict[str, Any]:
    if tp is inspect.Parameter.empty or tp is Any:
        return {}
    origin = get_origin(tp)
    if origin is Literal:
        vals = list(get_args(tp))
        schema: dict[str, Any] = {"enum": vals}
        if all(isinstance(v, str) for v in vals):
            schema["type"] = "string"
        return schema
    if origin in (Union, types.UnionType):
        members = [a for a in get_args(tp) if a is not type(None)]
        if len(members) == 1:
            return _json_schema(members[0])
        return {"anyOf": [_json_schema(a) for a in members]}
    if origin in (list, tuple, Sequence, typing.Sequence):
        args = get_args(tp)
        out: dict[str, Any] = {"type": "array"}
        if args and args[0] is not Ellipsis:
            out["items"] = _json_schema(args[0])
        return out
    if origin in (dict, Mapping, typing.Mapping):
        return {"type": "object"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"enum": [m.value for m in tp]}
    if tp in _JSON_TYPES:
        return {"type": _JSON_TYPES[tp]}
    return {}


def _doc_parts(doc: str) -> tuple[str, dict[str, str]]:
    """Summary and per-argument descriptions from a Google-style ("Args:") or reST
    (":param x:") docstring."""
    doc = inspect.cleandoc(doc or "")
    params: dict[str, str] = {}
    for p in re.finditer(r":param\s+(\w+):\s*(.+)", doc):
        params[p.group(1)] = p.group(2).strip()
    lines = doc.splitlines()
    summary_lines: list[str] = []
    section = None
    current = None
    for line in lines:
        stripped = line.strip()
        if re.match(r"^(Args|Arguments|Parameters|Returns|Raises|Examples?)\s*:\s*$", stripped):
            section = stripped.rstrip(":").lower()
            continue
        if section in ("args", "arguments", "parameters"):
            m = re.match(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and not line.startswith(" " * 8):
                current = m.group(1)
                params[current] = m.group(3).strip()
            elif current and stripped:
                params[current] += " " + stripped
        elif section is None and not stripped.startswith(":"):
            summary_lines.append(stripped)
    return " ".join(s for s in summary_lines if s).strip(), params


def tool_schema(func: Callable[..., Any], *, skip: Sequence[str] = (), name: str | None = None) -> dict[str, Any]:
    """The OpenAI `tools` entry for `func`; parameters named in `skip` are hidden."""
    sig = inspect.signature(func)
    try:
        hints = typing.get_type_hints(func)
    except Exception:
        hints = {}
    summary, pdocs = _doc_parts(func.__doc__ or "")
    props: dict[str, Any] = {}
    required: list[str] = []
    for pname, p in sig.parameters.items():
        if pname in skip or pname == "self" or p.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        schema = _json_schema(hints.get(pname, p.annotation))
        if pname in pdocs:
            schema["description"] = pdocs[pname]
        if p.default is inspect.Parameter.empty:
            required.append(pname)
        elif p.default is None or isinstance(p.default, (str, int, float, bool)):
            schema["default"] = p.default
        props[pname] = schema
    return {
        "type": "function",
        "function": {
            "name": name or func.__name__,
            "description": summary,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


def tool_call(name: str, arguments: Mapping[str, Any] | str, call_id: str) -> dict[str, Any]:
    """A tool call in the OpenAI message shape (for policies and tests)."""
    args = arguments if isinstance(arguments, str) else json.dumps(dict(arguments))
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def format_result(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, default=str)
    except TypeError:
        return str(value)


class ToolEnv(MultiTurnEnv):
    """Tools are plain sync or async functions. The rollout stops when the model answers
    without calling a tool (or at `max_turns`)."""

    def __init__(self, tools: Sequence[Callable[..., Any]] = (), *, max_turns: int = 10, max_tool_output: int = 16_000, **kwargs: Any) -> None:
        super().__init__(max_turns=max_turns, **kwargs)
        self.tools: dict[str, Callable[..., Any]] = {}
        self.tool_schemas: list[dict[str, Any]] = []
        self.skipped_args: dict[str, list[str]] = {}
        self.max_tool_output = max_tool_output
        for t in tools:
            self.add_tool(t)

    def add_tool(self, func: Callable[..., Any], args_to_skip: Sequence[str] = (), name: str | None = None) -> None:
        tool_name = name or func.__name__
        self.tools[tool_name] = func
        self.skipped_args[tool_name] = list(args_to_skip)
        self.tool_schemas = [s for s in self.tool_schemas if s["function"]["name"] != tool_name]
        self.tool_schemas.append(tool_schema(func, skip=args_to_skip, name=tool_name))

    def tools_for(self, state: State) -> list[dict[str, Any]] | None:
        return self.tool_schemas or None

    @stop
    def no_tools_called(self, state: State) -> bool:
        if not state.turns:
            return False
        last = state.turns[-1]
        return not last.completion.get("tool_calls") and not last.env_response

    def update_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: list[Message], state: State) -> dict[str, Any]:
        """Hook for hidden per-rollout arguments (see StatefulToolEnv)."""
        return tool_args

    async def prepare_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: list[Message], state: State) -> dict[str, Any]:
        """Async form of `update_tool_args` (for arguments that must be made first, such as
        a sandbox); calls `update_tool_args`."""
        return self.update_tool_args(tool_name, tool_args, messages, state)

    async def env_response(self, messages: list[Message], state: State) -> list[Message]:
        calls = messages[-1].get("tool_calls") or []
        out: list[Message] = []
        for i, call in enumerate(calls):
            call_id = call.get("id") or f"call_{i}"
            content = await self.call_tool(call, messages, state)
            out.append({"role": "tool", "tool_call_id": call_id, "content": content})
        return out

    async def call_tool(self, call: Mapping[str, Any], messages: list[Message], state: State) -> str:
        fn_spec = call.get("function") or {}
        name = fn_spec.get("name") or ""
        raw = fn_spec.get("arguments")
        state.metrics["tool_calls"] = state.metrics.get("tool_calls", 0.0) + 1
        func = self.tools.get(name)
        if func is None:
            self._count_error(state)
            return f"Error: unknown tool {name!r}. Available tools: {', '.join(self.tools) or 'none'}."
        try:
            args = json.loads(raw) if isinstance(raw, str) and raw.strip() else (dict(raw) if isinstance(raw, Mapping) else {})
            if not isinstance(args, dict):
                raise ValueError(f"arguments must be a JSON object, got {type(args).__name__}")
        except (json.JSONDecodeError, ValueError) as exc:
            self._count_error(state)
            return f"Error: could not parse arguments for {name!r} as a JSON object: {exc}. Raw arguments: {str(raw)[:500]!r}"
        hidden = set(self.skipped_args.get(name, []))
        bad = sorted(hidden & set(args))
        if bad:
            self._count_error(state)
            return f"Error: argument(s) {', '.join(bad)} of {name!r} cannot be set by the caller."
        args = await self.prepare_tool_args(name, args, messages, state)
        try:
            inspect.signature(func).bind(**args)
        except TypeError as exc:
            self._count_error(state)
            return f"Error: bad arguments for {name!r}: {exc}"
        t0 = time.perf_counter()
        try:
            if inspect.iscoroutinefunction(func):
                result = await func(**args)
            else:
                result = await anyio.to_thread.run_sync(lambda: func(**args))
        except SandboxError:
            raise  # the sandbox failed, not the model: the rollout ends with an error
        except Exception as exc:
            self._count_error(state)
            return f"Error: {type(exc).__name__}: {exc}"
        finally:
            state.metrics[f"{name}_s"] = state.metrics.get(f"{name}_s", 0.0) + time.perf_counter() - t0
        text = format_result(result)
        if len(text) > self.max_tool_output:
            text = text[: self.max_tool_output] + f"\n[output truncated to {self.max_tool_output} characters]"
        return text

    @staticmethod
    def _count_error(state: State) -> None:
        state.metrics["tool_errors"] = state.metrics.get("tool_errors", 0.0) + 1


class StatefulToolEnv(ToolEnv):
    """Tools with hidden per-rollout arguments (e.g. the sandbox): add them with
    `add_tool(func, args_to_skip=[...])` and fill them in `update_tool_args`. By default a
    hidden argument is looked up by name in `state.scratch`."""

    def update_tool_args(self, tool_name: str, tool_args: dict[str, Any], messages: list[Message], state: State) -> dict[str, Any]:
        for arg in self.skipped_args.get(tool_name, []):
            if arg in state.scratch:
                tool_args[arg] = state.scratch[arg]
        return tool_args
