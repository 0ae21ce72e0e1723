"""Batching: multi-turn rollouts -> one sequence with a loss mask -> packed micro-batches."""

from __future__ import annotations

import pytest
import torch

from sandgym.core.state import State, Turn, TurnTokens
from sandgym.train.batch import (
    MissingTokensError,
    PrefixMismatchError,
    Sequence,
    pack,
    plan_packing,
    shared_prefix_len,
    state_to_sequence,
    states_to_sequences,
)


def _turn(prompt_ids: list[int], completion_ids: list[int], lps: list[float] | None = None) -> Turn:
    return Turn(
        prompt=[],
        completion={"role": "assistant", "content": ""},
        tokens=TurnTokens(
            prompt_ids=prompt_ids,
            completion_ids=completion_ids,
            completion_logprobs=lps if lps is not None else [-0.1 * (i + 1) for i in range(len(completion_ids))],
        ),
    )


def _three_turn_state() -> State:
    # turn 0: prompt [1,2,3] -> completion [10,11]
    # turn 1: prompt extends with tool tokens [4,5] -> completion [12]
    # turn 2: prompt extends with env tokens [6] -> completion [13,14,15]
    t0 = _turn([1, 2, 3], [10, 11])
    t1 = _turn([1, 2, 3, 10, 11, 4, 5], [12])
    t2 = _turn([1, 2, 3, 10, 11, 4, 5, 12, 6], [13, 14, 15])
    return State(id="r1", turns=[t0, t1, t2], reward=1.0, advantage=0.5)


def test_multiturn_sequence_and_mask() -> None:
    seq = state_to_sequence(_three_turn_state())
    assert seq.input_ids == [1, 2, 3, 10, 11, 4, 5, 12, 6, 13, 14, 15]
    assert seq.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1, 0, 1, 1, 1]
    # Server logprobs land on exactly the completion tokens, 0 elsewhere.
    assert seq.inference_logprobs == pytest.approx([0, 0, 0, -0.1, -0.2, 0, 0, -0.1, 0, -0.1, -0.2, -0.3])
    assert seq.advantage == 0.5 and seq.num_loss_tokens == 6


def test_prefix_mismatch_names_the_turn() -> None:
    st = _three_turn_state()
    # A template that re-renders turn 1's completion differently (12 -> 99) breaks turn 2.
    st.turns[2].tokens.prompt_ids[7] = 99  # type: ignore[union-attr]
    with pytest.raises(PrefixMismatchError, match=r"turn 2's prompt_ids do not extend turn 1's.*first difference at token 7"):
        state_to_sequence(st)
    st = _three_turn_state()
    st.turns[1].tokens.prompt_ids = [1, 2, 3, 10]  # type: ignore[union-attr]  # shorter than history
    with pytest.raises(PrefixMismatchError, match="turn 1"):
        state_to_sequence(st)


def test_missing_tokens_and_logprob_length() -> None:
    st = _three_turn_state()
    st.turns[1].tokens = None
    with pytest.raises(MissingTokensError, match="turn 1 has no token ids"):
        state_to_sequence(st)
    st = _three_turn_state()
    st.turns[0].tokens.completion_logprobs = [-1.0]  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 completion ids but 1 logprobs"):
        state_to_sequence(st)
    st = _three_turn_state()
    st.advantage = None
    with pytest.raises(ValueError, match="advantage is not set"):
        state_to_sequence(st)


def test_states_to_sequences_skips_errored_rollouts() -> None:
    ok = _three_turn_state()
    bad = _three_turn_state()
    bad.error = "sandbox died"
    empty = State(id="e", turns=[_turn([1], [])], advantage=0.0)
    seqs = states_to_sequences([ok, bad, empty])
    assert [s.rollout_id for s in seqs] == ["r1"]


def test_plan_packing_respects_budget() -> None:
    lengths = [7, 3, 5, 2, 9, 4, 12]
    bins = plan_packing(lengths, 10)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        total = sum(lengths[i] for i in b)
        assert total <= 10 or len(b) == 1  # an over-long sequence sits alone
    assert any(b == [6] for b in bins)


def test_pack_cu_seqlens_positions_targets() -> None:
    s1 = state_to_sequence(_three_turn_state())  # 12 tokens
    st2 = State(id="r2", turns=[_turn([7, 8], [20, 21, 22])], advantage=-1.0)
    s2 = state_to_sequence(st2)  # 5 tokens
    mbs = pack([s1, s2], max_tokens=64)
    assert len(mbs) == 1
    mb = mbs[0]
    assert mb.input_ids.shape == (1, 17)  # no padding
    assert mb.cu_seqlens.tolist() == [0, 12, 17] and mb.cu_seqlens.dtype == torch.int32
    assert mb.max_seqlen == 12
    assert mb.position_ids[0].tolist() == list(range(12)) + list(range(5))
    # Targets are next tokens within each sequence; the last position of each has none.
    assert mb.targets.tolist()[:12] == s1.input_ids[1:] + [0]
    assert mb.targets.tolist()[12:] == [8, 20, 21, 22, 0]
    # Predicting-position mask: position t is trained iff token t+1 is a completion token.
    assert mb.mask.tolist()[:12] == [float(x) for x in s1.loss_mask[1:]] + [0.0]
    assert mb.mask.tolist()[12:] == [0.0, 1.0, 1.0, 1.0, 0.0]
    assert mb.advantages.tolist() == [0.5] * 12 + [-1.0] * 5
    assert mb.seq_index.tolist() == [0] * 12 + [1] * 5
    assert mb.inference_logprobs.tolist()[12:] == pytest.approx([0.0, -0.1, -0.2, -0.3, 0.0])
    # Total loss tokens are preserved by packing.
    assert float(mb.mask.sum()) == s1.num_loss_tokens + s2.num_loss_tokens


def test_pack_splits_over_budget() -> None:
    seqs = [state_to_sequence(State(id=str(i), turns=[_turn([1, 2], [3] * n)], advantage=1.0)) for i, n in enumerate([6, 6, 6])]
    mbs = pack(seqs, max_tokens=16)
    assert len(mbs) == 2
    assert all(mb.num_tokens <= 16 for mb in mbs)
    assert sorted(i for mb in mbs for i in mb.seq_indices) == [0, 1, 2]


def test_split_on_mismatch_starts_a_sequence_where_the_context_changed() -> None:
    from sandgym.train.batch import state_to_branches

    st = _three_turn_state()
    # Turn 2 was rendered from messages by a template that dropped turn 1's completion (12):
    # the model saw [.., 5, 6] there, not [.., 5, 12, 6].
    st.turns[2].tokens.prompt_ids = [1, 2, 3, 10, 11, 4, 5, 6]  # type: ignore[union-attr]
    with pytest.raises(PrefixMismatchError, match="sent as messages.*re-rendered"):
        state_to_sequence(st)
    first, second = state_to_branches(st)
    assert first.input_ids == [1, 2, 3, 10, 11, 4, 5, 12] and first.loss_mask == [0, 0, 0, 1, 1, 0, 0, 1]
    # The second sequence is turn 2's own prompt (what the model saw) + its completion.
    assert second.input_ids == [1, 2, 3, 10, 11, 4, 5, 6, 13, 14, 15] and second.num_loss_tokens == 3
    assert first.advantage == second.advantage == 0.5
    assert len(states_to_sequences([st], split_on_mismatch=True)) == 2
    assert [len(state_to_branches(_three_turn_state()))] == [1]  # extending turns: one sequence


def test_mismatch_on_a_token_in_turn_blames_the_server() -> None:
    st = _three_turn_state()
    st.turns[2].token_in = True
    st.turns[2].tokens.prompt_ids[7] = 99  # type: ignore[union-attr]
    with pytest.raises(PrefixMismatchError, match="turn 2 .*sent as token ids.*server changed the ids"):
        state_to_sequence(st)


def _seq(ids: list[int], trained_from: int, advantage: float = 1.0) -> Sequence:
    mask = [0] * trained_from + [1] * (len(ids) - trained_from)
    return Sequence(ids, mask, [-0.5 * m for m in mask], advantage)


def test_shared_prefix_stops_before_the_first_trained_token_and_leaves_each_sequence_a_token() -> None:
    common = list(range(100, 140))  # 40 shared tokens
    a = _seq(common + [1, 2, 3, 4], trained_from=42)
    b = _seq(common + [5, 6, 7], trained_from=43)
    assert shared_prefix_len([a, b]) == 40  # where they differ
    # A trained token at 30: the prefix's last position (29) would predict it, so it ends at 29.
    c = _seq(common + [8, 9], trained_from=30)
    assert shared_prefix_len([a, b, c]) == 29
    assert shared_prefix_len([a, _seq(common, trained_from=40)]) == 39  # one token of its own
    assert shared_prefix_len([a]) == 0  # nothing to share with
    assert shared_prefix_len([a, _seq(common[:10] + [0] * 30, trained_from=40)]) == 0  # < MIN_SHARED_PREFIX


def test_pack_with_a_shared_prefix_keeps_every_trained_position() -> None:
    common = list(range(100, 140))
    seqs = [_seq(common + [i] * (5 + i), trained_from=41, advantage=float(i)) for i in range(4)]
    (plain,) = pack(seqs, max_tokens=1000)
    (mb,) = pack(seqs, max_tokens=1000, share_prefix=True)
    assert mb.prefix_len == 40 and mb.num_tokens == plain.num_tokens - 3 * 40
    assert mb.cu_seqlens.tolist()[:2] == [0, 40]
    lens = [len(s) - 40 for s in seqs]
    assert mb.cu_seqlens.tolist()[2:] == [40 + sum(lens[: i + 1]) for i in range(4)]
    # Each sequence's rest keeps its own positions (after the prefix), targets and masks.
    assert mb.position_ids[0].tolist() == list(range(40)) + [p for n in lens for p in range(40, 40 + n)]
    assert float(mb.mask[:40].sum()) == 0.0 and float(mb.mask.sum()) == float(plain.mask.sum())
    assert mb.targets.tolist()[40 : 40 + lens[0]] == seqs[0].input_ids[41:] + [0]
    assert sorted(mb.advantages[mb.mask > 0].tolist()) == sorted(plain.advantages[plain.mask > 0].tolist())
    # The budget counts the prefix once: 4 sequences of 45-48 tokens fit in 40 + 4 x 8.
    assert len(pack(seqs, max_tokens=40 + 30, share_prefix=True)) == 1 and len(pack(seqs, max_tokens=70)) == 4
