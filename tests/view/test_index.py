"""The offset index of a results file, and what the viewer makes of one record: columns read
without parsing turns agree with a full parse, the index is kept next to the file and reused,
extended when the file grows, rebuilt when it is rewritten; a torn last line waits; long
fields are cut with their full length noted; tool results carry their flags."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from sandgym.core.evaluation import record_of
from sandgym.core.sandbox_env import exec_flags, format_exec
from sandgym.core.state import State, Turn, TurnTokens
from sandgym.run_folder import RecordLog
from sandgym.sandboxes.result import ExecResult
from sandgym.view.index import JsonlIndex
from sandgym.view.runs import STRING_LIMIT, path_key, query, record_view, rollout_columns, text_at


def state(i: int, *, reward: float = 0.0, error_kind: str | None = None, length: bool = False, text: str = "hi") -> State:
    call = {"id": f"c{i}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "echo '], \"reward\": 9'"})}}
    tool = format_exec(ExecResult(exit_code=2, stdout_bytes=b'"finish_reason": fake', stderr_bytes=b"oops"), timeout=5)
    turns = [Turn(prompt=[{"role": "user", "content": "q"}], completion={"role": "assistant", "content": text, "tool_calls": [call]},
                  env_response=[{"role": "tool", "tool_call_id": f"c{i}", "content": tool}], finish_reason="tool_calls",
                  tokens=TurnTokens(prompt_ids=[1, 2, 3], completion_ids=[4, 5], completion_logprobs=[-0.1, -2.0])),
             Turn(prompt=[{"role": "user", "content": "q"}], completion={"role": "assistant", "content": "done"},
                  finish_reason="length" if length else "stop")]
    s = State(env="e", example_id=i // 2, rollout_index=i % 2, prompt=[{"role": "user", "content": "q"}], turns=turns,
              completion=[t.completion for t in turns], reward=reward, metrics={"m": reward}, info={"reward": 5, "turns": []},
              stop_reason="truncated" if length else "no_tools_called", usage={"completion_tokens": 7})
    if error_kind:
        s.fail(f"{error_kind}: it broke\nsecond line", error_kind)
    return s


def write(path: Path, states: list[State]) -> None:
    log = RecordLog(path)
    for s in states:
        log.append(record_of(s))
    log.close()


def full(line: bytes) -> dict[str, Any]:
    """The columns by a full parse: what the fast path must agree with."""
    return rollout_columns(b" " + line)  # a leading space defeats the head pattern: the whole line is parsed


def test_columns_without_parsing_turns_match_a_full_parse(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(0, reward=1.0), state(1, error_kind="sandbox"), state(2, length=True), state(3, reward=0.5)])
    for line in path.read_bytes().splitlines():
        fast, slow = rollout_columns(line), full(line)
        assert fast == {**slow, "bytes": slow["bytes"] - 1}
    cols = [rollout_columns(line) for line in path.read_bytes().splitlines()]
    assert [c["turns"] for c in cols] == [2, 2, 2, 2]
    assert [c["truncated"] for c in cols] == [False, False, True, False]
    assert cols[1]["error_kind"] == "sandbox" and cols[1]["error"] == "sandbox: it broke"
    assert cols[0]["reward"] == 1.0 and cols[3]["example_id"] == 1 and cols[3]["rollout_index"] == 1


def test_index_kept_next_to_the_file_reused_and_extended(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(i) for i in range(6)])
    seen: list[bytes] = []

    def counting(line: bytes) -> dict[str, Any]:
        seen.append(line)
        return rollout_columns(line)

    ix = JsonlIndex(path, counting, name="t")
    ix.refresh(None)
    assert len(ix) == 6 and len(seen) == 6 and ix.index_path.is_file()
    assert json.loads(ix.read_line(4))["example_id"] == 2
    again = JsonlIndex(path, counting, name="t")
    again.refresh(None)
    assert len(again) == 6 and len(seen) == 6  # read from the saved index, not the file
    write(path, [state(i) for i in range(6, 9)])  # the run goes on (RecordLog reopens and appends)
    again.refresh(None)
    assert len(again) == 9 and len(seen) == 9 and [r["example_id"] for r in again.rows][-3:] == [3, 3, 4]
    other = JsonlIndex(path, counting, name="another extractor")
    other.refresh(None)
    assert len(other) == 9 and len(seen) == 18  # another extractor's columns: not reused


def test_a_rewritten_file_is_indexed_anew_and_a_torn_line_waits(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(i, reward=1.0) for i in range(4)])
    ix = JsonlIndex(path, rollout_columns, name="t")
    ix.refresh(None)
    assert len(ix) == 4
    tmp = tmp_path / "new.jsonl"
    write(tmp, [state(i, reward=0.25) for i in range(3)])
    os.replace(tmp, path)  # what a resume that repairs the file does
    fresh = JsonlIndex(path, rollout_columns, name="t")
    fresh.refresh(None)
    ix.refresh(None)
    for x in (fresh, ix):
        assert len(x) == 3 and {r["reward"] for r in x.rows} == {0.25}
    line = json.dumps(record_of(state(9))).encode()
    with open(path, "ab") as f:
        f.write(line[:100])  # a writer killed mid-line
    ix.refresh(None)
    assert len(ix) == 3
    with open(path, "ab") as f:
        f.write(line[100:] + b"\n")
    ix.refresh(None)
    assert len(ix) == 4 and ix.rows[-1]["example_id"] == 4


def test_a_line_longer_than_a_read_chunk(tmp_path: Path, monkeypatch: Any) -> None:
    import sandgym.view.index as index

    monkeypatch.setattr(index, "CHUNK", 1000)
    path = tmp_path / "results.jsonl"
    write(path, [state(0), state(1, text="x" * 10_000), state(2)])
    ix = JsonlIndex(path, rollout_columns, name="t", persist=False)
    ix.refresh(None)
    assert len(ix) == 3 and ix.rows[1]["bytes"] > 10_000
    assert [json.loads(ix.read_line(i))["example_id"] for i in range(3)] == [0, 0, 1]


def test_head_reads_the_first_lines_directly(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(0), state(1)])
    with open(path, "ab") as f:
        f.write(b"\n" + json.dumps(record_of(state(2))).encode() + b"\n" + b'{"torn": ')
    ix = JsonlIndex(path, rollout_columns, name="t", persist=False)
    head = ix.head(10)
    assert [json.loads(line)["example_id"] for _, _, line in head] == [0, 0, 1]  # the blank and the torn line left out
    data = path.read_bytes()
    assert all(data[a:b] == line + b"\n" for a, b, line in head)
    ix.refresh(None)
    assert [ix.span(i) for i in range(3)] == [(a, b) for a, b, _ in head]


def test_query_filters_sorts_and_pages(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(0, reward=1.0), state(1, error_kind="model"), state(2, length=True, reward=0.5), state(3, error_kind="sandbox")])
    ix = JsonlIndex(path, rollout_columns, name="t")
    ix.refresh(None)
    rows = ix.rows
    assert [r["n"] for r in query(rows, error_kind="model")["rows"]] == [1]
    assert [r["n"] for r in query(rows, error_kind="any")["rows"]] == [1, 3]
    assert [r["n"] for r in query(rows, error_kind="none")["rows"]] == [0, 2]
    assert [r["n"] for r in query(rows, truncated=True)["rows"]] == [2]
    assert query(rows, min_turns=2)["matched"] == 4 and query(rows, min_turns=3)["matched"] == 0
    assert [r["n"] for r in query(rows, sort="reward", desc=True)["rows"]][:2] == [0, 2]
    page = query(rows, offset=1, limit=2)
    assert page["matched"] == 4 and [r["n"] for r in page["rows"]] == [1, 2]
    assert query(rows)["error_kinds"] == {"none": 2, "model": 1, "sandbox": 1}


def test_record_view_cuts_long_fields_and_flags_tool_results() -> None:
    big = "y" * (STRING_LIMIT * 3 + 5)
    rec = record_of(state(0, text=big))
    view = record_view(json.loads(json.dumps(rec)))
    where = ["turns", 0, "completion", "content"]
    assert view["turns"][0]["completion"]["content"] == big[:STRING_LIMIT]
    assert view["truncated"][path_key(where)] == len(big)
    assert text_at(rec, where, STRING_LIMIT, 10)["value"] == big[STRING_LIMIT:STRING_LIMIT + 10]
    assert view["turns"][1]["prompt"] == [] and view["turns"][1]["prompt_messages"] == 1  # the conversation again: dropped
    assert view["turns"][0]["tokens"]["prompt_ids"] == [] and view["turns"][0]["tokens"]["prompt_len"] == 3
    flags = view["turns"][0]["env_response"][0]["flags"]
    assert flags == {"exit_code": 2, "stderr": True}


def test_exec_flags_read_back_format_exec() -> None:
    cases = [
        (ExecResult(exit_code=0, stdout_bytes=b"ok"), {}),
        (ExecResult(exit_code=3, stdout_bytes=b"a", stderr_bytes=b"b"), {"exit_code": 3, "stderr": True}),
        (ExecResult(exit_code=-1, timed_out=True, truncated=True), {"timed_out": True, "timeout_s": 2.5, "truncated": True}),
        (ExecResult(exit_code=137, oom_killed=True), {"oom_killed": True}),
    ]
    for result, flags in cases:
        assert exec_flags(format_exec(result, timeout=2.5)) == flags


def test_a_damaged_saved_index_is_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    write(path, [state(i, reward=0.5) for i in range(5)])
    JsonlIndex(path, rollout_columns, name="t").refresh(None)
    saved = path.with_name("results.jsonl.index")
    header, *chunks = saved.read_text().splitlines()
    saved.write_text(header + "\n" + chunks[0][: len(chunks[0]) // 2] + "\n")  # cut short (a full disk, a crash)
    ix = JsonlIndex(path, rollout_columns, name="t")
    ix.refresh(None)
    assert len(ix) == 5 and [r["example_id"] for r in ix.rows] == [0, 0, 1, 1, 2] and {r["reward"] for r in ix.rows} == {0.5}
