"""Token-in multi-turn: the next turn's prompt as token ids, never a re-rendered chat.

A rollout's turn k+1 is sent to the server as

    turn k's prompt ids + turn k's completion ids + the ids of only the new messages

so the context the model sees is, by construction, everything it saw and produced before.
Text that would not survive decode -> chat template -> encode (bytes that are not UTF-8, BPE
merges the model did not make, a template that drops earlier `<think>` blocks) never gets the
chance to change.

The new messages' ids are rendered as a suffix of the chat template around a stand-in
assistant message (as prime-rl's verifiers client does), which works with any template and any
server that renders chats (vLLM's `/tokenize`, sandgym's OpenAIServer):

    base = render([stand_in])                  (no generation prompt)
    full = render([stand_in, *new_messages])   (with the generation prompt)
    tail = what `base` ends with after the stand-in's content: the end-of-turn token(s) and any
           glue (Qwen2.5's "\n" after <|im_end|>); found as the common end of two renders
           whose stand-ins differ only in content
    suffix = full[len(base) - len(glue):]      (glue = tail minus the end-of-turn tokens the
                                                completion ended with)

A completion that did not end with the end-of-turn token (cut by `max_tokens`, stopped by a
custom stop id), or a template whose `base` is not a prefix of `full`, cannot be bridged: the
caller sends messages instead. For a prefix-preserving template (sandgym.models.tiny's) the
suffix equals `apply_chat_template(messages, suffix_from=k)`.
"""

from __future__ import annotations

from collections.abc import Sequence

from .state import Message, State

# Two assistant messages differing only in their content: the common end of their renders is
# what the template writes after an assistant message (end-of-turn + glue).
STAND_IN: Message = {"role": "assistant", "content": "x"}
STAND_IN_OTHER: Message = {"role": "assistant", "content": "y"}


def continuation(state: State | None, messages: Sequence[Message]) -> tuple[list[int], list[Message]] | None:
    """(token prefix, new messages) when `messages` continue the state's last turn: they
    start with that turn's prompt and completion, and the server returned both id lists. The
    prefix is that turn's prompt ids + completion ids. None: send messages (first turn, an
    environment that rewrote its history, a server that returns no ids, a completion cut by
    `max_tokens`)."""
    if state is None or not state.turns:
        return None
    last = state.turns[-1]
    tok = last.tokens
    if tok is None or not tok.prompt_ids or not tok.completion_ids or last.finish_reason == "length":
        return None
    k = len(last.prompt)
    if len(messages) <= k + 1 or list(messages[:k]) != list(last.prompt) or messages[k] != last.completion:
        return None
    return list(tok.prompt_ids) + list(tok.completion_ids), [dict(m) for m in messages[k + 1 :]]


def turn_tail(base: Sequence[int], other: Sequence[int]) -> list[int]:
    """The common end of the renders of STAND_IN and STAND_IN_OTHER: the tokens a template
    writes after an assistant message's content."""
    n = 0
    while n < min(len(base), len(other)) and base[len(base) - 1 - n] == other[len(other) - 1 - n]:
        n += 1
    return list(base[len(base) - n :])


def bridge(base: Sequence[int], tail: Sequence[int], full: Sequence[int], completion: Sequence[int]) -> list[int] | None:
    """The ids that follow `completion` when the new messages are appended (see the module
    doc): `full` past `base`, preceded by the glue the completion did not produce. None when
    the completion does not end with the template's end-of-turn tokens or `base` is not a
    prefix of `full`."""
    n = len(base)
    if n == 0 or len(full) <= n or list(full[:n]) != list(base):
        return None
    ended = next((j for j in range(min(len(tail), len(completion)), 0, -1) if list(completion[-j:]) == list(tail[:j])), 0)
    if ended == 0:
        return None
    glue = len(tail) - ended
    return list(full[n - glue :])
