"""The machinery's test patches: toys on toy targets in the stand-in (``vllm.toy_model``,
``vllm.toy_planner``).

They are the tests' own. ``dspark_hotfix.patches.ALL`` stays the product's list; a test chooses this
set with :func:`use` in its own process (the ``toys`` fixture), or a child with
``tests.child.use_toys``. The machinery's tests (switches, reporting, activation, wrapping, faults,
processes) run on these, so adding or removing a real patch never touches them. Each real patch has
its own tests in tests/patches/.

- ``GREETING``, a correction: the toy build greets ``helo, NAME``; it returns ``hello, NAME``.
- ``FAREWELL``, a correction whose target the toy build lacks: its ``absent`` probe says it is
  not needed.
- ``PLANNER``, a stop (``everywhere``): the toy build's ``plan`` drops an item when ``compact`` is
  on; it stops such a call with a finding, before the toy function runs.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import dspark_hotfix.patches
from dspark_hotfix.patches import Finding, Need, Patch


def _greet(answer: str, /, self: Any, name: str) -> str:
    return "hello," + answer[len("helo,") :] if answer.startswith("helo,") else answer


def _probe_greeting(vllm_greet: Any) -> Need:
    try:
        answer = vllm_greet(None, "probe")
    except Exception as exc:
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    return Need(answer != _greet(answer, None, "probe"), f"the toy build greets {answer!r}")


def _farewell(answer: str, /, self: Any, name: str) -> str:
    return answer


def _probe_farewell(vllm_farewell: Any) -> Need:
    return Need(False, "not needed (a farewell is always right)")


def _check_plan(config: Any, items: Any) -> None:
    """Stops the toy planner with compact on."""
    if getattr(config, "compact", False):
        raise Finding("the toy planner drops an item when compact is on; turn compact off")


def _probe_plan(vllm_plan: Any) -> Need:
    try:
        kept = vllm_plan(SimpleNamespace(compact=True), [1, 2])
    except Exception as exc:
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    return Need(kept != [1, 2], f"the toy planner keeps {kept!r} of [1, 2] when compact")


GREETING = Patch(
    name="toy_greeting",
    module="vllm.toy_model",
    qualname="Greeter.greet",
    parameters=("self", "name"),
    correction=_greet,
    probe=_probe_greeting,
)
FAREWELL = Patch(
    name="toy_farewell",
    module="vllm.toy_model",
    qualname="Greeter.farewell",
    parameters=("self", "name"),
    correction=_farewell,
    probe=_probe_farewell,
    absent=lambda: Need(False, "not needed (the toy build says no farewell)"),
)
PLANNER = Patch(
    name="toy_planner",
    module="vllm.toy_planner",
    qualname="plan",
    parameters=("config", "items"),
    arguments=_check_plan,
    stops=True,
    probe=_probe_plan,
    everywhere=True,
)
TOYS = (GREETING, FAREWELL, PLANNER)
NAMES = tuple(p.name for p in TOYS)

# Each toy's upstream fix, as edits of its target module in a copy of the stand-in
# (tests.conftest.standin_copy).
FIX = {
    GREETING.name: [('f"helo, {name}"', 'f"hello, {name}"')],
    PLANNER.name: [("list(items)[: -1 if config.compact else None]", "list(items)")],
}


def use() -> None:
    """Make the toys the patch set the registry activates in this process."""
    dspark_hotfix.patches.ALL = TOYS


def module_file(patch: Patch) -> str:
    """The file of ``patch``'s target module inside a copy of the stand-in."""
    return patch.module.replace(".", "/") + ".py"


def fixed(patches: tuple[Patch, ...] = TOYS) -> dict[str, list[tuple[str, str]]]:
    """The stand-in edits that fix each of ``patches`` (keyed by file for
    tests.conftest.edited_standin)."""
    edits: dict[str, list[tuple[str, str]]] = {}
    for patch in patches:
        edits.setdefault(module_file(patch), []).extend(FIX.get(patch.name, []))
    return edits


STANDIN = Path(__file__).resolve().parent / "standin"
