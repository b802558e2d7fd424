"""What a child process on the toy patches (tests/toys.py) prints, and what the subprocess tests of
activation/, security/ and launcher/ expect of it.

A child's program (``tests.conftest.program``) starts with ``tests.child.use_toys`` (REPO on its
path), or ``USE_LAST`` where the test puts only the start-up directory, a venv or the stand-in on
its path: REPO then goes last, so the shim still comes from where the test put it. Either comes
before ``import vllm``: the import watcher activates then.
"""

from __future__ import annotations

from functools import partial

from tests.child import use_toys
from tests.conftest import REPO
from tests.toys import FAREWELL, GREETING, PLANNER

USE_LAST = partial(use_toys, str(REPO))

# Each toy's state once every toy target is imported on the toy build: the greeting and the planner
# are needed, the farewell's target is absent (judged not needed).
JUDGED = {GREETING.name: "patched", FAREWELL.name: "not_needed", PLANNER.name: "patched"}
# The state line of such a process, without its head.
JUDGED_LINE = f"fixing: 2 patched ({GREETING.name}, {PLANNER.name}), 1 not_needed"
# tests.child.wrap_depths's answers: each present target wrapped once, or vLLM's own function (the
# absent one: None).
WRAPPED = {GREETING.name: 1, FAREWELL.name: None, PLANNER.name: 1}
UNWRAPPED = {GREETING.name: 0, FAREWELL.name: None, PLANNER.name: 0}

# What tests.child.toy_calls returns where the toys are applied, and on the toy build as shipped (or
# the shim off).
CORRECTED = {"greet": "hello, ada", "plan": [1, 2], "compact": "HotfixError"}
AS_SHIPPED = {"greet": "helo, ada", "plan": [1, 2], "compact": [1]}
