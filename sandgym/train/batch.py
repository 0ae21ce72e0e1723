"""Rollouts -> training sequences -> packed micro-batches.

Every number here comes from the token ids the inference server returned (`Turn.tokens`);
text is never re-tokenized. A multi-turn rollout becomes one sequence: turn i's prompt must
extend turn i-1's prompt + completion, and the tokens it adds (tool results, environment and
user messages, chat-template glue) get loss mask 0; each turn's completion gets mask 1.

Layout: one interleaved sequence per rollout, not one sequence per turn. With token-in
(core/tokens.py) turn i's prompt *is* turn i-1's prompt + completion + the new messages' ids,
so the interleaved sequence is exactly what the model saw and produced at every turn, and each
token is trained once (per-turn sequences repeat the history: quadratic in turns). A prompt
that does not extend the last turn means the model saw a different context (a server that
re-rendered the chat: a template that drops earlier `<think>` blocks, text that does not
survive decode -> encode; an environment that rewrote its history). That is an error naming
the turn by default; `split_on_mismatch` starts a new sequence there instead, so each
sequence is still what the model saw (the per-turn layout, paid only where needed).

Sequences are packed without padding into micro-batches of at most `max_tokens` tokens (one
row, `cu_seqlens` offsets, position ids restarting at 0 for each sequence), ready for varlen
attention. With `share_prefix`, the prefix that every sequence of a micro-batch starts with
(an environment's tools block and system prompt, a group's question) is in the row once, at
its start (`MicroBatch.prefix_len`); each sequence keeps only the rest and attends to that
prefix as if it were its own (attention.varlen_causal_attention). The logprobs and gradients
are those of the unshared row; the tokens run through the model are fewer (in the pycalc
learning gate about 2.5x: a 285-token tools block in every ~455-token rollout).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sandgym.core.state import State


class PrefixMismatchError(ValueError):
    """Turn i's prompt does not extend turn i-1's prompt + completion token ids."""


class MissingTokensError(ValueError):
    """A rollout has turns without token ids (the server did not return them)."""


@dataclass
class Sequence:
    """One rollout flattened to one token sequence."""

    input_ids: list[int]
    loss_mask: list[int]  # 1 on model-generated tokens, 0 on prompt/tool/env tokens
    inference_logprobs: list[float]  # server logprobs on mask-1 tokens, 0.0 elsewhere
    advantage: float
    reward: float = 0.0
    rollout_id: str = ""
    has_inference_logprobs: bool = True

    def __len__(self) -> int:
        return len(self.input_ids)

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)


def _first_mismatch(a: list[int], b: list[int]) -> int:
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _mismatch_text(state: State, i: int, ids: list[int], p: list[int], token_in: bool) -> str:
    at = _first_mismatch(ids, p)
    where = (
        f"rollout {state.id}: turn {i}'s prompt_ids do not extend turn {i - 1}'s prompt_ids + completion_ids "
        f"(first difference at token {at}: previous has {ids[at] if at < len(ids) else '<end>'}, turn {i} has "
        f"{p[at] if at < len(p) else '<end>'}; lengths {len(ids)} vs {len(p)}). "
    )
    if token_in:
        return where + (
            f"Turn {i} was sent as token ids extending turn {i - 1}, but the server reports a different prompt: "
            "the server changed the ids it was given."
        )
    return where + (
        f"Turn {i} was sent as messages and the server's chat template re-rendered earlier turns differently from "
        "what the model generated. Send token ids (OpenAIClient token_in, a server with /v1/chat/completions/tokens) "
        "or train such rollouts with env.on_prefix_mismatch = 'split'."
    )


def state_to_sequence(state: State, advantage: float | None = None) -> Sequence:
    """Flatten a (multi-turn) rollout into one sequence with a loss mask.

    Raises PrefixMismatchError naming the turn when a chat template re-renders earlier turns
    differently (e.g. strips reasoning, or re-tokenizes the assistant message), since training
    on such a rollout would assign the model's logprobs to tokens it never produced.
    """
    if not state.turns:
        raise MissingTokensError(f"rollout {state.id}: no turns")
    adv = state.advantage if advantage is None else advantage
    if adv is None:
        raise ValueError(f"rollout {state.id}: advantage is not set (score the group first)")
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    have_lps = True
    for i, turn in enumerate(state.turns):
        tok = turn.tokens
        if tok is None:
            raise MissingTokensError(
                f"rollout {state.id}: turn {i} has no token ids; the inference server must return "
                "prompt and completion token ids (vLLM: return_token_ids)"
            )
        if i == 0:
            ids.extend(tok.prompt_ids)
            mask.extend([0] * len(tok.prompt_ids))
            lps.extend([0.0] * len(tok.prompt_ids))
        else:
            p = tok.prompt_ids
            if len(p) < len(ids) or p[: len(ids)] != ids:
                raise PrefixMismatchError(_mismatch_text(state, i, ids, p, turn.token_in))
            extra = p[len(ids) :]
            ids.extend(extra)
            mask.extend([0] * len(extra))
            lps.extend([0.0] * len(extra))
        comp = tok.completion_ids
        clp = tok.completion_logprobs
        if clp and len(clp) != len(comp):
            raise ValueError(
                f"rollout {state.id}: turn {i} has {len(comp)} completion ids but {len(clp)} logprobs"
            )
        if not clp:
            have_lps = False
        ids.extend(comp)
        mask.extend([1] * len(comp))
        lps.extend(clp if clp else [0.0] * len(comp))
    return Sequence(
        input_ids=ids,
        loss_mask=mask,
        inference_logprobs=[float(x) for x in lps],
        advantage=float(adv),
        reward=float(state.reward),
        rollout_id=state.id,
        has_inference_logprobs=have_lps,
    )


def state_to_branches(state: State, advantage: float | None = None) -> list[Sequence]:
    """A rollout as one sequence per run of turns that extend each other: a turn whose prompt
    does not extend the last turn's prompt + completion starts a new sequence holding that
    prompt (what the model saw then) and the turns that follow it. One sequence when every
    turn extends the last (always with token-in)."""
    runs: list[list[int]] = [[]]
    ids: list[int] = []
    for i, turn in enumerate(state.turns):
        tok = turn.tokens
        if tok is not None and i > 0:
            p = tok.prompt_ids
            if len(p) < len(ids) or p[: len(ids)] != ids:
                runs.append([])
                ids = []
        runs[-1].append(i)
        if tok is not None:  # (a turn without ids fails in state_to_sequence, named)
            ids = list(tok.prompt_ids) + list(tok.completion_ids)
    out = []
    for run in runs:
        part = state.model_copy(update={"turns": [state.turns[i] for i in run]})
        out.append(state_to_sequence(part, advantage))
    return out


@dataclass
class MicroBatch:
    """Packed sequences in one row. Per-token tensors are aligned to *predicting* positions:
    entry t describes the prediction of token t+1 from tokens <= t of the same sequence."""

    input_ids: torch.Tensor  # (1, T) long
    position_ids: torch.Tensor  # (1, T) long, restarting at 0 per sequence
    cu_seqlens: torch.Tensor  # (N+1,) int32
    max_seqlen: int
    targets: torch.Tensor  # (T,) long: next token (0 where none)
    mask: torch.Tensor  # (T,) float: 1 where the target is a model-generated token
    advantages: torch.Tensor  # (T,) float
    inference_logprobs: torch.Tensor  # (T,) float
    seq_index: torch.Tensor  # (T,) long: index of the sequence in the whole step
    seq_indices: list[int] = field(default_factory=list)
    # Tokens at the start of the row that every sequence in it shares (0: none). They are
    # cu_seqlens' first segment; every later segment is one sequence's rest, attending to them.
    prefix_len: int = 0

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def to(self, device: torch.device | str) -> MicroBatch:
        d = torch.device(device)
        return MicroBatch(
            input_ids=self.input_ids.to(d),
            position_ids=self.position_ids.to(d),
            cu_seqlens=self.cu_seqlens.to(d),
            max_seqlen=self.max_seqlen,
            targets=self.targets.to(d),
            mask=self.mask.to(d),
            advantages=self.advantages.to(d),
            inference_logprobs=self.inference_logprobs.to(d),
            seq_index=self.seq_index.to(d),
            seq_indices=list(self.seq_indices),
            prefix_len=self.prefix_len,
        )


def plan_packing(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """First-fit decreasing: groups of sequence indices whose lengths sum to <= max_tokens.
    A sequence longer than the budget gets a group of its own (it cannot be split without
    changing what attention sees)."""
    if max_tokens <= 0:
        raise ValueError("max_tokens must be positive")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = lengths[i]
        for b, r in enumerate(room):
            if n <= r:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(max(max_tokens - n, 0))
    for group in bins:
        group.sort()  # keep step order inside a micro-batch (deterministic, readable)
    return bins


# A shorter shared prefix is not worth a segment of its own.
MIN_SHARED_PREFIX = 16


def shared_prefix_len(seqs: list[Sequence]) -> int:
    """How many leading tokens every one of `seqs` shares that can be computed once: at most
    up to the token before each sequence's first trained token (the prefix's last position
    predicts each sequence's own next token, which must not be a trained one), leaving every
    sequence at least one token of its own. 0 for fewer than two sequences or under
    MIN_SHARED_PREFIX tokens."""
    if len(seqs) < 2:
        return 0
    first = seqs[0].input_ids
    n = len(first) - 1
    for s in seqs:
        trained = s.loss_mask.index(1) if 1 in s.loss_mask else len(s)
        n = min(n, len(s) - 1, trained - 1)
    for s in seqs[1:]:
        ids = s.input_ids
        i = 0
        while i < n and ids[i] == first[i]:
            i += 1
        n = i
    return n if n >= MIN_SHARED_PREFIX else 0


def pack(seqs: list[Sequence], max_tokens: int, share_prefix: bool = False) -> list[MicroBatch]:
    """Pack sequences into micro-batches of at most `max_tokens` tokens, no padding; with
    `share_prefix`, each micro-batch holds the prefix its sequences share once (the module
    docstring). The budget counts the tokens in the row."""
    shared = shared_prefix_len(seqs) if share_prefix else 0
    if shared >= max_tokens:
        shared = 0  # no room left beside it
    out: list[MicroBatch] = []
    for group in plan_packing([len(s) - shared for s in seqs], max_tokens - shared):
        # Sequences of one micro-batch may share more than the whole step does (a group's question).
        p = shared_prefix_len([seqs[gi] for gi in group]) if share_prefix else 0
        head = seqs[group[0]].input_ids[:p]
        ids: list[int] = list(head)
        pos: list[int] = list(range(p))
        # The prefix trains nothing: its last position predicts each sequence's own next token.
        tgt: list[int] = head[1:] + [0] if p else []
        msk: list[float] = [0.0] * p
        adv: list[float] = [0.0] * p
        ilp: list[float] = [0.0] * p
        sidx: list[int] = [group[0]] * p
        cu = [0, p] if p else [0]
        for gi in group:
            s = seqs[gi]
            n = len(s)
            ids.extend(s.input_ids[p:])
            pos.extend(range(p, n))
            tgt.extend(s.input_ids[p + 1 :] + [0])
            msk.extend([float(m) for m in s.loss_mask[p + 1 :]] + [0.0])
            adv.extend([s.advantage] * (n - p))
            ilp.extend(s.inference_logprobs[p + 1 :] + [0.0])
            sidx.extend([gi] * (n - p))
            cu.append(cu[-1] + n - p)
        out.append(
            MicroBatch(
                input_ids=torch.tensor([ids], dtype=torch.long),
                position_ids=torch.tensor([pos], dtype=torch.long),
                cu_seqlens=torch.tensor(cu, dtype=torch.int32),
                max_seqlen=max([p] + [len(seqs[gi]) - p for gi in group]),
                targets=torch.tensor(tgt, dtype=torch.long),
                mask=torch.tensor(msk, dtype=torch.float32),
                advantages=torch.tensor(adv, dtype=torch.float32),
                inference_logprobs=torch.tensor(ilp, dtype=torch.float32),
                seq_index=torch.tensor(sidx, dtype=torch.long),
                seq_indices=list(group),
                prefix_len=p,
            )
        )
    return out


def states_to_sequences(states: list[State], skip_errors: bool = True, split_on_mismatch: bool = False) -> list[Sequence]:
    """Sequences for the rollouts that can be trained on. Rollouts marked with an error or
    without completion tokens are skipped when `skip_errors` (they carry no signal); a
    prefix mismatch raises (naming the turn), or with `split_on_mismatch` starts a new
    sequence at that turn (state_to_branches)."""
    out: list[Sequence] = []
    for st in states:
        if skip_errors and (st.error is not None or not st.has_tokens):
            continue
        for seq in state_to_branches(st) if split_on_mismatch else [state_to_sequence(st)]:
            if seq.num_loss_tokens > 0:
                out.append(seq)
    return out
