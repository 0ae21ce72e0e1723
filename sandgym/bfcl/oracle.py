"""BFCL ground truth turned back into tool calls, for the oracle policy.

Single-turn possible answers list, per parameter, the values a checker accepts ("" first
means the parameter may be left out); the oracle takes the first. Java and JavaScript
parameters travel as source-code strings, which BFCL's type converters parse back: the
oracle writes candidate literals and keeps the first one that the converter (BFCL's own,
imported on the host) turns back into the expected value. Multi-turn ground truth is a list
of Python call strings per turn, parsed with `ast` (positional arguments are named from the
function doc's parameter order).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from typing import Any

from .data import Entry, bfcl_module, language

Call = tuple[str, dict[str, Any]]


def _first(options: Any) -> Any:
    if not isinstance(options, list) or not options:
        return options
    return _concrete(options[0])


def _concrete(value: Any) -> Any:
    """A possible-answer value with every nested option list resolved to its first option
    (nested keys whose first option is "" are left out)."""
    if isinstance(value, dict):
        return {k: _first(opts) for k, opts in value.items() if not (isinstance(opts, list) and opts and opts[0] == "")}
    if isinstance(value, list):
        return [_concrete(v) for v in value]
    return value


def openai_name(name: str) -> str:
    return re.sub(r"\.", "_", name)


def _param_types(entry: Entry, func_name: str) -> dict[str, dict[str, Any]]:
    for f in entry.eval_entry.get("function") or []:
        if f["name"] == func_name:
            return f["parameters"]["properties"]
    return {}


# ---- Java / JavaScript literals ------------------------------------------------------


def _scalar(v: Any, quote: bool) -> list[str]:
    if isinstance(v, bool):
        return ["true" if v else "false"]
    if isinstance(v, int):
        return [str(v), f"{v}L", f"{v}f", f"{v}n", f"{float(v)}"]
    if isinstance(v, float):
        return [repr(v), f"{v}f", f"{int(v)}" if v.is_integer() else repr(v)]
    if isinstance(v, str):
        return [f'"{v}"', v] if quote else [v, f'"{v}"']
    return [json.dumps(v)]


def _java_candidates(v: Any, java_type: str, nested: str | None) -> list[str]:
    if isinstance(v, list):
        elem_type = {"String": "String", "integer": "int", "long": "long", "float": "float", "double": "double",
                     "boolean": "boolean", "char": "char"}.get(nested or "", "Object")  # fmt: skip
        out = []
        # Elements in each style: plain, quoted strings, or with the nested type's suffix.
        suffix = {"long": "L", "float": "f"}.get(nested or "", "")
        for quote in (True, False):
            elems = [_scalar(x, quote)[0] + (suffix if isinstance(x, (int, float)) and not isinstance(x, bool) else "") for x in v]
            out.append(f"new ArrayList<>(Arrays.asList({', '.join(elems)}))")
            out.append(f"new {elem_type}[]{{{', '.join(elems)}}}")
        return out
    if isinstance(v, dict):
        puts = " ".join(f'put("{k}", {_scalar(x, True)[0]});' for k, x in v.items())
        return [f"new HashMap<String, Object>() {{{{ {puts} }}}}"]
    return _scalar(v, False)


def _js_candidates(v: Any, js_type: str, nested: str | None) -> list[str]:
    def lit(x: Any, quote: bool = True) -> str:
        if isinstance(x, list):
            return "[" + ", ".join(lit(e, quote) for e in x) + "]"
        if isinstance(x, dict):
            return "{" + ", ".join(f"{k}: {lit(e, quote)}" for k, e in x.items()) + "}"
        return _scalar(x, quote)[0]

    if isinstance(v, (list, dict)):
        return [lit(v, True), lit(v, False)]
    return _scalar(v, False)


def _source_literal(options: list[Any], spec: dict[str, Any], lang: str) -> Any:
    """The string a Java/JavaScript function call passes: the first candidate literal, for the
    first option, that BFCL's type converter parses back to that option."""
    t = spec.get("type", "String")
    nested = (spec.get("items") or {}).get("type")
    make: Callable[[Any, str, str | None], list[str]]  # (value, type, nested type) -> literals
    if lang == "java":
        conv = bfcl_module("eval_checker.ast_eval.type_convertor.java_type_converter").java_type_converter
        make, nested_arg = _java_candidates, nested if t in ("Array", "ArrayList") else None
    else:
        conv = bfcl_module("eval_checker.ast_eval.type_convertor.js_type_converter").js_type_converter
        make, nested_arg = _js_candidates, nested if t == "array" else None
    values = [_concrete(o) for o in options if o != ""] or [""]
    for v in values:
        for c in make(v, t, nested):
            try:
                back = conv(c, t, nested_arg) if nested_arg else conv(c, t)
            except Exception:
                continue
            if back == v:
                return c
    return make(values[0], t, nested)[0]  # no literal parses back: BFCL cannot score this one 1


def _required(entry: Entry, func_name: str) -> set[str]:
    for f in entry.eval_entry.get("function") or []:
        if f["name"] == func_name:
            return set(f["parameters"].get("required") or [])
    return set()


def _options_to_send(entry: Entry, func_name: str, params: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """Per parameter, the options worth sending, or none to leave it out: "" among the options
    means "may be left out", which the checker honours only for a parameter that is not
    required (a required one gets its first real option)."""
    types, required = _param_types(entry, func_name), _required(entry, func_name)
    out = {}
    for k, opts in params.items():
        real = [o for o in opts if o != ""] if isinstance(opts, list) else [opts]
        if isinstance(opts, list) and "" in opts and (k not in required or k not in types):
            continue
        out[k] = real
    return out


def single_turn_calls(entry: Entry) -> list[Call]:
    """The tool calls of the first possible answer (names as the model sees them)."""
    lang = language(entry.category)
    calls: list[Call] = []
    for answer in entry.ground_truth or []:
        (name, params), = answer.items()
        options = _options_to_send(entry, name, params)
        if lang == "python":
            # An empty option list accepts nothing: BFCL cannot score such an entry 1.
            args = {k: _concrete(opts[0]) if opts else [] for k, opts in options.items()}
        else:
            types = _param_types(entry, name)
            args = {k: _source_literal(opts, types.get(k, {}), lang) for k, opts in options.items()}
        calls.append((openai_name(name), args))
    return calls


def relevance_call(entry: Entry) -> Call:
    """Relevance entries have no ground truth: any call counts, so call the first function
    with no arguments."""
    return (openai_name(entry.functions[0]["name"]), {})


def parse_call(text: str, functions: list[dict[str, Any]]) -> Call:
    """A ground-truth call string such as "mv(source='a', destination='b')" as a tool call."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        doc = next((f for f in functions if f["name"] == name), None)
        if doc is None:
            raise ValueError(f"{name} takes positional arguments but has no function doc")
        order = list(doc["parameters"]["properties"])
        for i, a in enumerate(node.args):
            args[order[i]] = ast.literal_eval(a)
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"**kwargs in ground truth call {text!r}")
        args[kw.arg] = ast.literal_eval(kw.value)
    return openai_name(name), args


def all_functions(entry: Entry) -> list[dict[str, Any]]:
    out = list(entry.functions)
    for docs in entry.missed_function.values():
        out.extend(docs)
    return out
