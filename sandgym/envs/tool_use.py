"""tool_use: an agentic tool-use evaluation with checkable answers.

A small fictional catalogue (items with prices and weights, orders with ship dates and
transit times) sits behind tools: `search`, `lookup`, `calculator`, `convert_units`,
`date_add`, `days_between`. Each task needs several calls chained (find an item, read its
record, compute, convert). Tasks, data and answers are generated from a seed, so the
evaluation is deterministic. The model answers in `<answer>...</answer>`; the rubric checks
it (numbers to 0.01, dates exactly). The oracle follows each task's recorded plan through
the same tool calls a model would make.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import math
import operator
import random
from collections.abc import Callable
from typing import Any

from sandgym.core.environment import Environment
from sandgym.core.parsers import XMLParser
from sandgym.core.rubric import Rubric
from sandgym.core.state import Message, State
from sandgym.core.tools import ToolEnv, tool_call

SYSTEM_PROMPT = (
    "You are an assistant with tools for a shop's catalogue and orders. Use the tools to find "
    "the facts and compute the result; do not guess. When you are done, reply without a tool "
    "call and put only the final answer inside <answer></answer> tags."
)

_ADJ = ["Amber", "Brisk", "Cobalt", "Dusky", "Ember", "Frosty", "Gilded", "Hollow", "Ivory", "Jade", "Keen", "Lunar"]
_NOUN = ["Kettle", "Lantern", "Satchel", "Trowel", "Compass", "Blanket", "Skillet", "Thermos", "Hammock", "Easel"]

# ---- the catalogue -------------------------------------------------------------------


def build_catalogue(seed: int = 0, n_items: int = 40, n_orders: int = 80) -> dict[str, dict[str, Any]]:
    rng = random.Random(seed)
    store: dict[str, dict[str, Any]] = {}
    names = rng.sample([f"{a} {n}" for a in _ADJ for n in _NOUN], n_items)
    for i, name in enumerate(names):
        store[f"SKU-{100 + i}"] = {
            "type": "item",
            "name": name,
            "price_usd": round(rng.uniform(3, 250), 2),
            "weight_lb": round(rng.uniform(0.2, 40), 2),
        }
    skus = [k for k in store]
    start = dt.date(2024, 1, 1)
    for i in range(n_orders):
        store[f"ORD-{5000 + i}"] = {
            "type": "order",
            "sku": rng.choice(skus),
            "quantity": rng.randint(1, 12),
            "shipped": (start + dt.timedelta(days=rng.randint(0, 400))).isoformat(),
            "transit_days": rng.randint(1, 21),
        }
    return store


# ---- tools (pure functions over the catalogue) ------------------------------------------

_OPS: dict[type[ast.AST], Callable[..., float]] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow, ast.USub: operator.neg, ast.UAdd: operator.pos}
_FUNCS: dict[str, Callable[..., float]] = {"round": round, "abs": abs, "min": min, "max": max, "sqrt": math.sqrt}


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 100:
            raise ValueError("exponent too large")
        return _OPS[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
        return _FUNCS[node.func.id](*[_eval(a) for a in node.args])
    raise ValueError(f"unsupported expression element: {ast.dump(node)[:80]}")


def calculator(expression: str) -> float:
    """Evaluate an arithmetic expression: numbers, + - * / // % **, parentheses, and
    round(), abs(), min(), max(), sqrt().

    Args:
        expression: The expression, e.g. "3 * (2.5 + 4)".
    """
    value = _eval(ast.parse(expression, mode="eval"))
    return round(float(value), 10)


_UNITS: dict[str, tuple[str, float]] = {
    "kg": ("mass", 1.0), "g": ("mass", 1e-3), "lb": ("mass", 0.45359237), "oz": ("mass", 0.028349523125),
    "m": ("length", 1.0), "km": ("length", 1000.0), "cm": ("length", 0.01), "mi": ("length", 1609.344), "ft": ("length", 0.3048), "in": ("length", 0.0254),
    "l": ("volume", 1.0), "ml": ("volume", 1e-3), "gal": ("volume", 3.785411784),
}


def convert_units(value: float, from_unit: str, to_unit: str) -> float:
    """Convert a quantity between units of mass (kg, g, lb, oz), length (m, km, cm, mi, ft,
    in), volume (l, ml, gal) or temperature (C, F).

    Args:
        value: The quantity to convert.
        from_unit: Unit of `value`.
        to_unit: Unit wanted.
    """
    f, t = from_unit.strip(), to_unit.strip()
    if {f.upper(), t.upper()} <= {"C", "F"}:
        c = value if f.upper() == "C" else (value - 32) * 5 / 9
        return round(c if t.upper() == "C" else c * 9 / 5 + 32, 6)
    fl, tl = f.lower(), t.lower()
    if fl not in _UNITS or tl not in _UNITS:
        raise ValueError(f"unknown unit; known: {', '.join(_UNITS)}, C, F")
    if _UNITS[fl][0] != _UNITS[tl][0]:
        raise ValueError(f"cannot convert {_UNITS[fl][0]} to {_UNITS[tl][0]}")
    return round(value * _UNITS[fl][1] / _UNITS[tl][1], 6)


def date_add(date: str, days: int) -> str:
    """The date `days` days after `date` (negative goes back).

    Args:
        date: A date as YYYY-MM-DD.
        days: Number of days to add.
    """
    return (dt.date.fromisoformat(date) + dt.timedelta(days=int(days))).isoformat()


def days_between(start: str, end: str) -> int:
    """Days from `start` to `end` (negative when `end` is earlier).

    Args:
        start: A date as YYYY-MM-DD.
        end: A date as YYYY-MM-DD.
    """
    return (dt.date.fromisoformat(end) - dt.date.fromisoformat(start)).days


def make_store_tools(store: dict[str, dict[str, Any]]) -> list[Any]:
    def lookup(key: str) -> dict[str, Any]:
        """Read one record of the catalogue by its key (an item "SKU-..." or an order "ORD-...").

        Args:
            key: The record key.
        """
        rec = store.get(key.strip().upper())
        if rec is None:
            raise KeyError(f"no record {key!r}")
        return {"key": key.strip().upper(), **rec}

    def search(query: str) -> list[dict[str, str]]:
        """Find items whose name contains `query` (case-insensitive); returns keys and names.

        Args:
            query: Part of an item name.
        """
        q = query.strip().lower()
        return [{"key": k, "name": v["name"]} for k, v in store.items() if v["type"] == "item" and q in v["name"].lower()][:10]

    return [search, lookup]


# ---- tasks ---------------------------------------------------------------------------


def _fmt(x: float) -> str:
    return f"{x:.2f}"


def make_tasks(store: dict[str, dict[str, Any]], n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed + 1)
    items = [k for k, v in store.items() if v["type"] == "item"]
    orders = [k for k, v in store.items() if v["type"] == "order"]
    rows = []
    kinds = ["item_weight_kg", "order_total", "arrival_date", "days_between_orders", "order_weight_kg"]
    for i in range(n):
        kind = kinds[i % len(kinds)]
        plan: list[tuple[str, dict[str, Any]]] = []
        if kind == "item_weight_kg":
            sku = rng.choice(items)
            it = store[sku]
            q = f"How many kilograms does one {it['name']} weigh? Give the number rounded to 2 decimals."
            kg = convert_units(it["weight_lb"], "lb", "kg")
            plan = [("search", {"query": it["name"]}), ("lookup", {"key": sku}), ("convert_units", {"value": it["weight_lb"], "from_unit": "lb", "to_unit": "kg"})]
            answer = _fmt(kg)
        elif kind == "order_total":
            o = rng.choice(orders)
            od = store[o]
            it = store[od["sku"]]
            q = f"What is the total price in USD of order {o} (quantity times unit price)? Round to 2 decimals."
            total = calculator(f"{od['quantity']} * {it['price_usd']}")
            plan = [("lookup", {"key": o}), ("lookup", {"key": od["sku"]}), ("calculator", {"expression": f"{od['quantity']} * {it['price_usd']}"})]
            answer = _fmt(total)
        elif kind == "arrival_date":
            o = rng.choice(orders)
            od = store[o]
            q = f"Order {o} spends its transit days in transit after its ship date. On which date does it arrive? Answer as YYYY-MM-DD."
            plan = [("lookup", {"key": o}), ("date_add", {"date": od["shipped"], "days": od["transit_days"]})]
            answer = date_add(od["shipped"], od["transit_days"])
        elif kind == "days_between_orders":
            a, b = rng.sample(orders, 2)
            q = f"How many days after order {a} was shipped was order {b} shipped? (Negative if earlier.)"
            plan = [("lookup", {"key": a}), ("lookup", {"key": b}), ("days_between", {"start": store[a]["shipped"], "end": store[b]["shipped"]})]
            answer = str(days_between(store[a]["shipped"], store[b]["shipped"]))
        else:
            o = rng.choice(orders)
            od = store[o]
            it = store[od["sku"]]
            q = f"What is the total shipping weight in kilograms of order {o}? Round to 2 decimals."
            lb = calculator(f"{od['quantity']} * {it['weight_lb']}")
            plan = [("lookup", {"key": o}), ("lookup", {"key": od["sku"]}), ("calculator", {"expression": f"{od['quantity']} * {it['weight_lb']}"}),
                    ("convert_units", {"value": lb, "from_unit": "lb", "to_unit": "kg"})]
            answer = _fmt(convert_units(lb, "lb", "kg"))
        rows.append({
            "example_id": i,
            "question": q,
            "answer": answer,
            # The plan is JSON text: its argument shapes differ per step (one Arrow type).
            "info": {"kind": kind, "plan": json.dumps(plan)},
        })
    return rows


def answers_match(given: str | None, expected: str) -> bool:
    if given is None:
        return False
    given = given.strip().strip("$ ").replace(",", "")
    if given == expected:
        return True
    try:
        return abs(float(given.split()[0]) - float(expected)) <= 0.01 + 1e-9
    except (ValueError, IndexError):
        return False


class ToolUseEnv(ToolEnv):
    async def oracle_response(self, messages: list[Message], state: State) -> Message:
        plan = json.loads(state.info["plan"])
        step = sum(1 for m in messages if m.get("role") == "assistant")
        if step < len(plan):
            name, args = plan[step]
            return {"role": "assistant", "content": None, "tool_calls": [tool_call(name, args, f"call_{state.id[:8]}_{step}")]}
        return {"role": "assistant", "content": f"<answer>{state.answer}</answer>"}


def load_environment(num_tasks: int = 100, seed: int = 0, max_turns: int = 12, **kwargs: Any) -> Environment:
    store = build_catalogue(seed)
    rows = make_tasks(store, num_tasks, seed)
    parser = XMLParser(["answer"], answer_field="answer")

    def correct_answer(completion: list[Message], answer: str) -> float:
        return 1.0 if answers_match(parser.parse_answer(completion), answer) else 0.0

    def num_tool_calls(state: State) -> float:
        return float(state.metrics.get("tool_calls", 0.0))

    rubric = Rubric([correct_answer, parser.get_format_reward_func(), num_tool_calls], [1.0, 0.0, 0.0], parser=parser)
    tools = [*make_store_tools(store), calculator, convert_units, date_add, days_between]
    return ToolUseEnv(tools=tools, eval_dataset=rows, system_prompt=SYSTEM_PROMPT, parser=parser, rubric=rubric, max_turns=max_turns, name="tool_use", **kwargs)
