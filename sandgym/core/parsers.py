"""Parsers: pull the answer out of a completion (plain, `<think>`, XML fields, fenced code,
`\\boxed{}`). `parse_answer` takes a completion (messages or text) and reads the last
assistant message, like verifiers' parsers."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from .state import Message


def last_assistant_text(completion: Sequence[Message] | str) -> str:
    if isinstance(completion, str):
        return completion
    for msg in reversed(list(completion)):
        if msg.get("role") == "assistant":
            return content_text(msg.get("content"))
    return ""


def content_text(content: Any) -> str:
    """Message content as text (string content or a list of text parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


class Parser:
    """Identity parser: the answer is the last assistant message's text."""

    def parse(self, text: str) -> Any:
        return text

    def parse_answer(self, completion: Sequence[Message] | str) -> str | None:
        text = last_assistant_text(completion)
        return text.strip() or None

    def format_ok(self, completion: Sequence[Message] | str) -> bool:
        return self.parse_answer(completion) is not None

    def get_format_reward_func(self) -> Callable[..., float]:
        def format_reward(completion: Sequence[Message] | str) -> float:
            return 1.0 if self.format_ok(completion) else 0.0

        return format_reward


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


class ThinkParser(Parser):
    """Drops `<think>...</think>` reasoning; the answer is what follows it. A completion that
    opened `<think>` and never closed it has no answer."""

    def __init__(self, extract: Callable[[str], str | None] | None = None) -> None:
        self.extract = extract

    def parse(self, text: str) -> str | None:
        if "<think>" in text and "</think>" not in text:
            return None
        if "</think>" in text:
            text = text.rsplit("</think>", 1)[1]
        text = _THINK.sub("", text).strip()
        return self.extract(text) if self.extract else (text or None)

    def parse_answer(self, completion: Sequence[Message] | str) -> str | None:
        return self.parse(last_assistant_text(completion))

    def format_ok(self, completion: Sequence[Message] | str) -> bool:
        text = last_assistant_text(completion)
        return text.count("<think>") == 1 and text.count("</think>") == 1 and self.parse(text) is not None


class XMLParser(Parser):
    """Fields as `<name>...</name>`. `answer_field` is what `parse_answer` returns. A field may
    list alternatives: ("code", "answer") accepts either tag."""

    def __init__(self, fields: Sequence[str | Sequence[str]] = ("think", "answer"), answer_field: str = "answer") -> None:
        self.fields: list[tuple[str, ...]] = [(f,) if isinstance(f, str) else tuple(f) for f in fields]
        self.answer_field = answer_field

    def parse(self, text: str) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for alts in self.fields:
            value = None
            for tag in alts:
                found = re.findall(rf"<{re.escape(tag)}>\s*(.*?)\s*</{re.escape(tag)}>", text, re.DOTALL)
                if found:
                    value = found[-1]
                    break
            out[alts[0]] = value
        return out

    def parse_answer(self, completion: Sequence[Message] | str) -> str | None:
        return self.parse(last_assistant_text(completion)).get(self.answer_field)

    def format_ok(self, completion: Sequence[Message] | str) -> bool:
        parsed = self.parse(last_assistant_text(completion))
        return parsed.get(self.answer_field) is not None

    def format(self, **fields: str) -> str:
        return "\n".join(f"<{k}>\n{v}\n</{k}>" for k, v in fields.items())


_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


class CodeBlockParser(Parser):
    """The last fenced code block (preferring `language` when one is tagged with it). Text with
    no fence but an unterminated opening fence yields what follows it."""

    def __init__(self, language: str | None = "python") -> None:
        self.language = language

    def parse(self, text: str) -> str | None:
        blocks = _FENCE.findall(text)
        if blocks:
            if self.language:
                tagged = [b for lang, b in blocks if lang.lower() in (self.language, "py" if self.language == "python" else self.language)]
                if tagged:
                    return tagged[-1]
            return blocks[-1][1]
        m = re.search(r"```[^\n]*\n(.*)$", text, re.DOTALL)  # truncated completion
        return m.group(1) if m else None

    def parse_answer(self, completion: Sequence[Message] | str) -> str | None:
        return self.parse(last_assistant_text(completion))


class BoxedParser(Parser):
    """The content of the last `\\boxed{...}` (nested braces allowed)."""

    def parse(self, text: str) -> str | None:
        start = text.rfind("\\boxed{")
        if start < 0:
            return None
        i = start + len("\\boxed{")
        depth = 1
        for j in range(i, len(text)):
            if text[j] == "{":
                depth += 1
            elif text[j] == "}":
                depth -= 1
                if depth == 0:
                    return text[i:j].strip()
        return None

    def parse_answer(self, completion: Sequence[Message] | str) -> str | None:
        return self.parse(last_assistant_text(completion))
