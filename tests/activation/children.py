"""What a child process on the toy patches (tests/toys.py) prints, and what the subprocess tests of
activation/, security/ and launcher/ expect of it.

A child's code starts with ``tests.toys.USE`` (REPO on its path), or ``USE_LAST`` where the test puts only
the start-up directory, a venv or the stand-in on its path: REPO then goes last, so the shim still comes
from where the test put it. Either comes before ``import vllm``: the import watcher activates then.
"""

from __future__ import annotations

from tests.conftest import REPO, WRAP_DEPTH
from tests.toys import FAREWELL, GREETING, PLANNER, USE

__all__ = ["WRAP_DEPTH"]  # (conftest's, read from here by the children's tests too)

USE_LAST = f"import sys; sys.path.append({str(REPO)!r})\n" + USE

# Each toy's state once every toy target is imported on the toy build: the greeting and the planner are
# needed, the farewell's target is absent (judged not needed).
JUDGED = {GREETING.name: "patched", FAREWELL.name: "not_needed", PLANNER.name: "patched"}
# The state line of such a process, without its head.
JUDGED_LINE = f"fixing: 2 patched ({GREETING.name}, {PLANNER.name}), 1 not_needed"
# WRAP_DEPTH's answers: each present target wrapped once, or vLLM's own function (the absent one: None).
WRAPPED = {GREETING.name: 1, FAREWELL.name: None, PLANNER.name: 1}
UNWRAPPED = {GREETING.name: 0, FAREWELL.name: None, PLANNER.name: 0}

# Calls every toy target as the toy build's callers would, and prints what they got (an exception: its type).
CALLS = """
import json as _json
from types import SimpleNamespace as _NS
import vllm.toy_model as _model, vllm.toy_planner as _planner

def _call(f, *args):
    try:
        return f(*args)
    except Exception as exc:
        return type(exc).__name__

print(_json.dumps({"greet": _call(_model.Greeter().greet, "ada"),
                   "plan": _call(_planner.plan, _NS(compact=False), [1, 2]),
                   "compact": _call(_planner.plan, _NS(compact=True), [1, 2])}))
"""
# What CALLS prints where the toys are applied, and on the toy build as shipped (or with the shim off).
CORRECTED = {"greet": "hello, ada", "plan": [1, 2], "compact": "HotfixError"}
AS_SHIPPED = {"greet": "helo, ada", "plan": [1, 2], "compact": [1]}
