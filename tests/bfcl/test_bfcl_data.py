"""BFCL v4 data and glue on the host (no sandbox): the installed bfcl-eval's entries, tool
conversion, the oracle's reading of the ground truth, result shapes and the exporter's
files (read back with BFCL's own loaders)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import require

require("bfcl_eval")

from sandgym.bfcl import data
from sandgym.bfcl.export import export_results, failed_by_category, load_records, sandgym_accuracy
from sandgym.bfcl.imperfect import ImperfectOracle
from sandgym.bfcl.oracle import parse_call, single_turn_calls
from sandgym.bfcl.scoring import model_responses
from sandgym.core.tools import tool_call


def test_every_category_loads_with_aligned_ground_truth() -> None:
    sizes = {c: len(data.load_entries(c)) for c in data.SINGLE_TURN_CATEGORIES + data.MULTI_TURN_CATEGORIES}
    assert sum(sizes[c] for c in data.SINGLE_TURN_CATEGORIES) == 3641
    assert all(sizes[c] == 200 for c in data.MULTI_TURN_CATEGORIES)
    for c in sizes:
        for e in data.load_entries(c):
            assert e.category == c and e.turns and (e.functions or c == "live_irrelevance")
            assert (e.ground_truth is None) == (c in data.RELEVANCE_CATEGORIES)
            if e.multi_turn:
                assert len(e.ground_truth) == len(e.turns)  # one list of calls per turn
    # The prompt side carries BFCL's language hints, the checker side does not.
    java = data.load_entries("simple_java")[0]
    assert "Java 8 SDK syntax" in java.functions[0]["description"]
    assert "Java 8 SDK syntax" not in java.eval_entry["function"][0]["description"]
    assert set(data.UNSCORABLE) <= {e.id for c in data.SINGLE_TURN_CATEGORIES for e in data.load_entries(c)}


def test_categories_accept_groups_and_reject_unknown_names() -> None:
    assert data.categories("multi_turn", data.MULTI_TURN_CATEGORIES) == list(data.MULTI_TURN_CATEGORIES)
    assert data.categories("simple_python,live", data.SINGLE_TURN_CATEGORIES)[:2] == ["simple_python", "live_simple"]
    with pytest.raises(ValueError, match="unknown BFCL category"):
        data.categories(["multi_turn_base"], data.SINGLE_TURN_CATEGORIES)


def test_tools_are_bfcl_conversions_with_dots_replaced() -> None:
    e = next(e for e in data.load_entries("parallel") if "." in e.functions[0]["name"])
    tools = data.openai_tools(e.functions)
    name = tools[0]["function"]["name"]
    assert tools[0]["type"] == "function" and "." not in name and name == e.functions[0]["name"].replace(".", "_")
    assert tools[0]["function"]["parameters"]["type"] == "object"


def test_oracle_reads_first_answers_and_required_parameters() -> None:
    e = next(e for e in data.load_entries("simple_python") if e.id == "simple_python_200")
    (name, args), = single_turn_calls(e)
    # "fuel_efficiency": ["", 25.0] is required: the oracle sends 25.0 rather than leaving it
    # out; the optional "efficiency_reduction": [0, ""] is left out.
    assert name == "calculate_emissions" and args["fuel_efficiency"] == 25.0 and "efficiency_reduction" not in args
    java = next(e for e in data.load_entries("simple_java") if e.id == "simple_java_22")
    (_, jargs), = single_turn_calls(java)
    assert jargs["ids"] == "new ArrayList<>(Arrays.asList(101L, 202L, 303L))"  # parses back to [101, 202, 303]
    fs = data.load_entries("multi_turn_base")[0].functions
    assert parse_call("sort('final_report.pdf')", fs) == ("sort", {"file_name": "final_report.pdf"})
    assert parse_call("mv(source='a', destination='b')", fs) == ("mv", {"source": "a", "destination": "b"})
    with pytest.raises(ValueError):
        parse_call("a.b(c=1)", fs)


def test_model_responses_as_bfcl_records_them() -> None:
    msg = {"role": "assistant", "content": None, "tool_calls": [tool_call("cd", {"folder": "x"}, "c0"), tool_call("ls", {}, "c1")]}
    assert model_responses(msg) == [{"cd": '{"folder": "x"}'}, {"ls": "{}"}]
    assert data.decode_execute(model_responses(msg)) == ["cd(folder='x')", "ls()"]
    assert model_responses({"role": "assistant", "content": "no calls"}) == "no calls"
    with pytest.raises(Exception):  # noqa: B017 - BFCL's own error type (AttributeError today) is no contract
        data.decode_execute("no calls")  # BFCL ends the turn on an answer that does not decode


def test_export_writes_files_bfcl_reads_back(tmp_path: Path) -> None:
    recs = [
        {"example_id": 0, "rollout_index": 0, "reward": 1.0,
         "info": {"id": "simple_python_1", "category": "simple_python", "bfcl_result": [{"f": "{}"}]}},
        {"example_id": 1, "rollout_index": 0, "reward": 0.0,
         "info": {"id": "simple_python_0", "category": "simple_python", "bfcl_result": "text"}},
        {"example_id": 2, "rollout_index": 0, "reward": 0.0, "error": "ModelError: unreachable",
         "info": {"id": "multi_turn_base_3", "category": "multi_turn_base"}},
        {"example_id": 2, "rollout_index": 1, "reward": 1.0,
         "info": {"id": "multi_turn_base_3", "category": "multi_turn_base", "bfcl_result": [[]]}},
    ]  # fmt: skip
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    records = load_records([run])
    assert len(records) == 3  # rollout 0 of each entry
    counts = export_results(records, tmp_path / "bfcl")
    # The failed rollout (its model was unreachable) has no verdict on either side.
    assert counts == {"simple_python": 2}
    assert failed_by_category(records) == {"multi_turn_base": ["multi_turn_base_3"]}
    utils = data.bfcl_module("utils")
    st = tmp_path / "bfcl" / "result" / data.BFCL_MODEL / "non_live" / "BFCL_v4_simple_python_result.json"
    rows = utils.load_file(st, sort_by_id=True)
    assert [r["id"] for r in rows] == ["simple_python_0", "simple_python_1"] and utils.extract_test_category(st) == "simple_python"
    assert not (tmp_path / "bfcl" / "result" / data.BFCL_MODEL / "multi_turn").exists()
    assert sandgym_accuracy(records) == {"simple_python": (1, 2)}
    other = tmp_path / "other"
    other.mkdir()
    (other / "results.jsonl").write_text(json.dumps(recs[0]) + "\n")
    with pytest.raises(ValueError, match="give the runs of one policy"):
        load_records([run, other])


def test_imperfect_policy_spoils_a_fixed_share_deterministically() -> None:
    spoiled = [ImperfectOracle._spoil({"role": "assistant", "content": None, "tool_calls": [tool_call("f", {"x": 1}, "c")]}, None, k, None)
               for k in range(3)]  # type: ignore[arg-type]
    assert spoiled[0]["content"] and "tool_calls" not in spoiled[0]  # a text answer instead
    assert json.loads(spoiled[1]["tool_calls"][0]["function"]["arguments"]) != {"x": 1}
    assert json.loads(spoiled[2]["tool_calls"][0]["function"]["arguments"]) != {"x": 1}
