"""Python that runs inside sandgym/bfcl sandboxes, as source text.

Three pieces, each calling BFCL's own code:

- The backends of a multi-turn rollout: cells of a persistent REPL in the rollout's sandbox.
  `execute_multi_turn_func_call` (BFCL's) instantiates the entry's classes (file system,
  trading bot, travel API, ...) from the entry's initial config on first use, keeps them in
  that process, and runs each model call with `eval`.
- The single-turn scorer: a persistent REPL shared by the scoring of a session (importing
  BFCL's evaluation runner takes seconds). It runs `_evaluate_single_ast_entry` and
  `_evaluate_single_relevance_entry` of `bfcl_eval.eval_checker.eval_runner` with BFCL's
  handler for the model name: the code path of `bfcl evaluate`, entry by entry. Nothing of
  the model's output is executed there (AST checking compares values). For the default model
  the vendor SDKs its handler never calls get stand-ins instead of imports (SKIPPED_SDKS).
- The multi-turn checker: one fresh process per rollout (`python3 -I`), in a clean pooled
  sandbox, since BFCL's checker runs the model's calls again with `eval`. It calls BFCL's
  `multi_turn_checker` after decoding the result as `_evaluate_single_multi_turn_entry`
  does (that function's module imports every vendor SDK, seconds per process).

Each prints one line `MARK + json` last; everything else on stdout is the model's calls'.
"""

from __future__ import annotations

import json
from typing import Any

from sandgym.core.marked import marked_json

MARK = "@@sandgym-bfcl@@ "


def parse_marked(stdout: str) -> Any:
    """The JSON after the last MARK line, or None when there is none."""
    return marked_json(stdout, MARK)


def _literal(obj: Any) -> str:
    # A JSON document as a Python string literal (JSON text can hold any value safely).
    return repr(json.dumps(obj))


# ---- multi-turn backends (cells of the rollout's REPL) --------------------------------

BACKEND_SETUP = """
import json as _sg_json
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call as _sg_exec
_SG = _sg_json.loads(__CONFIG__)

def _sg_run(calls):
    results, instances = _sg_exec(calls, _SG["initial_config"], _SG["involved_classes"], "sandgym",
                                  _SG["id"], long_context=_SG["long_context"], is_evaL_run=False)
    print(__MARK__ + _sg_json.dumps(results))

_sg_run([])
"""


def backend_setup(entry_id: str, category: str, initial_config: dict[str, Any], involved_classes: list[str]) -> str:
    config = {
        "id": entry_id,
        "initial_config": initial_config,
        "involved_classes": involved_classes,
        # As BFCL's inference: long-context scenarios load extra state.
        "long_context": "long_context" in category or "composite" in category,
    }
    return BACKEND_SETUP.replace("__CONFIG__", _literal(config)).replace("__MARK__", repr(MARK))


def backend_call(calls: list[str]) -> str:
    return f"_sg_run(_sg_json.loads({_literal(calls)}))\n"


# ---- single-turn scorer (cells of a shared REPL) ---------------------------------------

# Vendor SDKs that BFCL's runner imports (constants.model_config imports every model's handler)
# and that the handler of data.BFCL_MODEL (OpenAI's) never calls: 4.5 s of the runner's 8 s of
# imports in sandgym/bfcl (bfcl-eval 2026.3.23, `python3 -X importtime`; anthropic alone 2.3 s).
# The scorer of that model puts stand-ins in their place; a stand-in fails when called, so a
# handler that did need one fails loudly instead of scoring.
SKIPPED_SDKS = ("anthropic", "boto3", "botocore", "cohere", "dashscope", "datamodel_code_generator", "google.genai",
                "mistralai", "qwen_agent", "writerai")

STAND_INS = """
import importlib.abc as _sg_abc, importlib.machinery as _sg_machinery, sys as _sg_sys, types as _sg_types

class _SgStandInType(type):
    # Any attribute is another stand-in (`from anthropic.types import TextBlock`, a class body
    # naming one); calling one says what is missing.
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _sg_stand_in(cls.__qualname__ + "." + name)

    def __call__(cls, *args, **kwargs):
        raise ImportError(cls.__qualname__ + " is not imported by sandgym's BFCL scorer (its model's handler does not use it)")

    def __getitem__(cls, item):
        return cls

def _sg_stand_in(qualname):
    return _SgStandInType(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})

class _SgStandInModule(_sg_types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _sg_stand_in(self.__name__ + "." + name)

class _SgStandIns(_sg_abc.MetaPathFinder, _sg_abc.Loader):
    def __init__(self, names):
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if any(fullname == n or fullname.startswith(n + ".") for n in self.names):
            return _sg_machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _SgStandInModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []

_sg_sys.meta_path.insert(0, _SgStandIns(__SKIPPED__))
"""

SCORER_SETUP = """
import json as _sg_json, os as _sg_os
# BFCL's handlers make an API client when built; scoring never calls it.
_sg_os.environ.setdefault("OPENAI_API_KEY", "unused-by-scoring")
from importlib.metadata import version as _sg_version
from bfcl_eval.constants.enums import Language as _SgLanguage, ReturnFormat as _SgFormat
from bfcl_eval.eval_checker import eval_runner as _sg_runner
_SG_HANDLERS = {}

def _sg_trim(v, n=1500):
    s = v if isinstance(v, str) else _sg_json.dumps(v, default=str)
    return s if len(s) <= n else s[:n] + "..."

def _sg_score(req):
    model, cat = req["model"], req["category"]
    h = _SG_HANDLERS.get(model)
    if h is None:
        h = _SG_HANDLERS[model] = _sg_runner.get_handler(model.replace("_", "/"))
    if cat in ("irrelevance", "live_irrelevance", "live_relevance"):
        out = _sg_runner._evaluate_single_relevance_entry(h, req["id"], req["result"], req["entry"], model, cat)
    else:
        if "javascript" in cat:
            lang, fmt = _SgLanguage.JAVASCRIPT, _SgFormat.JAVASCRIPT
        elif "java" in cat:
            lang, fmt = _SgLanguage.JAVA, _SgFormat.JAVA
        else:
            lang, fmt = _SgLanguage.PYTHON, _SgFormat.PYTHON
        out = _sg_runner._evaluate_single_ast_entry(h, req["id"], req["result"], req["possible_answer"], req["entry"],
                                                    model, cat, language=lang, return_format=fmt, has_tool_call_tag=False)
    print(__MARK__ + _sg_json.dumps({"valid": bool(out["valid"]), "error_type": out.get("error_type"),
                                     "error": _sg_trim(out.get("error", ""))}))

print(__MARK__ + _sg_json.dumps({"bfcl_version": _sg_version("bfcl-eval")}))
"""


def scorer_setup(skipped: tuple[str, ...] = ()) -> str:
    """The scorer's set-up cell; `skipped`: SDKs (of SKIPPED_SDKS) given stand-ins first."""
    stand_ins = STAND_INS.replace("__SKIPPED__", repr(tuple(skipped))) if skipped else ""
    return stand_ins + SCORER_SETUP.replace("__MARK__", repr(MARK))


def scorer_call(request: dict[str, Any]) -> str:
    return f"_sg_score(_sg_json.loads({_literal(request)}))\n"


# ---- multi-turn checker (a fresh process per rollout) -----------------------------------

MULTI_TURN_CHECK = """
import json, sys
from importlib.metadata import version
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
from bfcl_eval.model_handler.utils import convert_to_function_call

MARK = __MARK__

def trim(v, n=1500):
    s = v if isinstance(v, str) else json.dumps(v, default=str)
    return s if len(s) <= n else s[:n] + "..."

def check(req):
    result, truth, entry = req["result"], req["ground_truth"], req["entry"]
    # As eval_runner._evaluate_single_multi_turn_entry:
    if type(result) != list:
        return {"valid": False, "error_type": "multi_turn:inference_error", "error": "result is not a list"}
    if len(result) != len(truth):
        return {"valid": False, "error_type": "multi_turn:force_terminated",
                "error": f"{len(result)} result turns for {len(truth)} ground-truth turns"}
    decoded = []
    for turn in result:
        steps = []
        for item in turn:
            try:
                calls = convert_to_function_call(item)  # the FC handlers' decode_execute
                if is_empty_execute_response(calls):
                    continue
                steps.append(calls)
            except Exception:
                continue
        decoded.append(steps)
    out = multi_turn_checker(decoded, truth, entry, req["category"], req["model"])
    return {"valid": bool(out["valid"]), "error_type": out.get("error_type"), "error": trim(out.get("error_message", ""))}

req = json.load(sys.stdin)
out = check(req)
out["bfcl_version"] = version("bfcl-eval")
print(MARK + json.dumps(out))
"""


def multi_turn_check_program() -> str:
    return MULTI_TURN_CHECK.replace("__MARK__", repr(MARK))
