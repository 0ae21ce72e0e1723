"""Rollout records -> training sequences, from token ids when the record has them and from
text (rendered with a local tokenizer's chat template) when it does not.

A text trajectory (e.g. `sandgym eval --policy oracle` records: messages, no ids) is laid out
exactly as a token-in rollout of the same conversation would be (core/tokens.py):

    prompt ids      = render(prompt, tools, generation prompt)
    completion ids  = the assistant message as the model would generate it: its rendering
                      after the generation prompt, up to and including the end-of-turn token
    new messages    = the chat-template suffix for the tool/user messages that follow (the
                      same bridge rendering the client sends), then the next completion ...

so supervised warm-up and RL train on the same token sequences. Loss mask: 1 on completion
tokens, 0 on prompts, tool results and template glue.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from typing import Any

from sandgym.core.state import Message, State
from sandgym.core.tokens import STAND_IN, STAND_IN_OTHER, bridge, turn_tail
from sandgym.train.batch import Sequence, state_to_sequence


class RenderError(ValueError):
    """A trajectory the tokenizer's chat template cannot lay out as token-in turns."""


class ChatRenderer:
    """A tokenizer's chat template as token ids, with the tool schemas of one trajectory."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tok = tokenizer
        self.tools = tools or None
        self.base = self.ids([STAND_IN], False)
        self.tail = turn_tail(self.base, self.ids([STAND_IN_OTHER], False))
        if not self.tail:
            raise RenderError("the chat template writes nothing after an assistant message (no end-of-turn token)")

    def ids(self, messages: Seq[Message], add_generation_prompt: bool) -> list[int]:
        kwargs: dict[str, Any] = {"add_generation_prompt": add_generation_prompt, "tokenize": False}
        if self.tools:
            kwargs["tools"] = self.tools
        text = self.tok.apply_chat_template(list(messages), **kwargs)
        return list(self.tok(text, add_special_tokens=False)["input_ids"])

    def completion(self, context: Seq[Message], message: Message) -> list[int]:
        """`message` (an assistant turn) as generated after `context`: its tokens after the
        generation prompt, ending with the end-of-turn token (the glue after it belongs to
        whatever comes next)."""
        pre = self.ids(context, True)
        full = self.ids([*context, message], False)
        glue = len(self.tail) - 1
        if full[: len(pre)] != pre or len(full) - glue <= len(pre):
            raise RenderError("the chat template does not render an assistant turn as a continuation of its generation prompt")
        return full[len(pre) : len(full) - glue]

    def suffix(self, new: Seq[Message], completion: Seq[int]) -> list[int]:
        out = bridge(self.base, self.tail, self.ids([STAND_IN, *new], True), completion)
        if out is None:
            raise RenderError("the chat template cannot render new messages as a suffix of the conversation")
        return out


def render_state(state: State, tokenizer: Any) -> tuple[list[int], list[int]]:
    """(input ids, loss mask) of a text trajectory in the token-in layout (module doc)."""
    if not state.turns:
        raise RenderError(f"rollout {state.id}: no turns")
    r = ChatRenderer(tokenizer, state.tools)
    context: list[Message] = list(state.prompt)
    ids = r.ids(context, True)
    mask = [0] * len(ids)
    for i, turn in enumerate(state.turns):
        comp = r.completion(context, turn.completion)
        ids += comp
        mask += [1] * len(comp)
        context.append(turn.completion)
        if turn.env_response:
            if i == len(state.turns) - 1:
                break  # nothing generated after the last environment response: not trained
            suf = r.suffix(turn.env_response, comp)
            ids += suf
            mask += [0] * len(suf)
            context.extend(turn.env_response)
    return ids, mask


def record_to_sequence(record: dict[str, Any] | State, tokenizer: Any) -> Sequence:
    """One supervised sequence from an eval record: its own token ids when every turn has
    them (what the model produced, never re-tokenized), else the text rendered by
    `render_state`. Advantage 1, no inference logprobs."""
    state = record if isinstance(record, State) else State.model_validate(record)
    if state.has_tokens and all(t.tokens and t.tokens.prompt_ids for t in state.turns):
        seq = state_to_sequence(state, advantage=1.0)
        seq.inference_logprobs = [0.0] * len(seq.input_ids)
        seq.has_inference_logprobs = False
        return seq
    ids, mask = render_state(state, tokenizer)
    return Sequence(
        input_ids=ids,
        loss_mask=mask,
        inference_logprobs=[0.0] * len(ids),
        advantage=1.0,
        reward=float(state.reward),
        rollout_id=state.id,
        has_inference_logprobs=False,
    )
