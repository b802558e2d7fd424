"""How a patch is wrapped around vLLM's function, on the toy patches (tests/toys.py) in this
process: the wrapper takes vLLM's arguments as vLLM's function does (whatever their names), calls
vLLM once, with what the arguments step gives, and passes its answer through the correction; a step
that raises gives what vLLM gave, said once; a finding stops vLLM worded as the finding. And a
target module this vLLM lacks: judged where the registry imports it (``everywhere``), else left
waiting without a word, while ``dspark-hotfix status`` names it."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

import dspark_hotfix
from dspark_hotfix import HotfixError, cli
from dspark_hotfix.patches import Finding, Need
from tests import toys as toy_patches
from tests.conftest import edited_standin

GREETING, PLANNER = toy_patches.GREETING, toy_patches.PLANNER


def test_wrappers_take_vllms_arguments_the_way_vllms_functions_do(toys):
    # Keyword calls bind as on vLLM's function, and a wrong call fails the same way.
    dspark_hotfix.install()
    from vllm.toy_model import Greeter
    from vllm.toy_planner import plan

    assert toys.states()[GREETING.name] == toys.states()[PLANNER.name] == "patched"
    assert list(inspect.signature(Greeter.__dict__["greet"]).parameters) == ["self", "name"]
    assert Greeter().greet(name="ada") == Greeter().greet("ada") == "hello, ada"
    with pytest.raises(TypeError, match="unexpected keyword argument 'nom'"):
        Greeter().greet(nom="ada")
    compact_off = SimpleNamespace(compact=False)
    assert plan(config=compact_off, items=[1, 2]) == plan(compact_off, [1, 2]) == [1, 2]


@pytest.mark.parametrize(
    "parameters",
    [("self", "name"), ("self", "result"), ("self", "vllm"), ("self", "returned"), ("a", "b", "c")],
)
def test_a_wrapper_binds_arguments_as_vllms_function_whatever_their_names(parameters):
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Need, Patch

    namespace: dict = {}
    exec(f"def target({', '.join(parameters)}):\n    return ({', '.join(parameters)},)", namespace)

    def correction(answer, /, *args, **kwargs):
        assert answer == tuple(args) + tuple(kwargs.values())
        return (*answer, "corrected")

    patch = Patch(
        "echo",
        "nowhere",
        "target",
        parameters,
        probe=lambda function: Need(True, ""),
        correction=correction,
    )
    wrapper = registry._wrap(
        registry.Activation("test"), registry.Record(patch), namespace["target"]
    )
    values = list(range(len(parameters)))
    assert wrapper(*values) == (*values, "corrected")
    assert wrapper(**dict(zip(parameters, values, strict=True))) == (*values, "corrected")
    assert wrapper.__wrapped__ is namespace["target"]  # type: ignore[attr-defined]


# Spies standing for vLLM's toy functions: the one patch is a toy with its steps changed.


def greeter(monkeypatch, **changes: Any) -> tuple[list, Any]:
    """The toy greeting patch (with ``changes``) as the one patch, installed on a spy standing for
    vLLM's ``Greeter.greet``: it greets as the toy build does and raises KeyError for ``"bad"``
    (vLLM's own error). Returns the names vLLM was called with (the probe's left out) and a greeter.
    """
    from vllm import toy_model

    calls: list = []

    def greet(self, name):
        calls.append(name)
        if name == "bad":
            raise KeyError(name)
        return f"helo, {name}"

    monkeypatch.setattr(toy_model.Greeter, "greet", greet)
    monkeypatch.setattr(dspark_hotfix.patches, "ALL", (dataclasses.replace(GREETING, **changes),))
    dspark_hotfix.install()  # its module is imported: the hook judges it at once
    calls.clear()
    return calls, toy_model.Greeter()


def planner(monkeypatch, **changes: Any) -> tuple[list, ModuleType]:
    """The same for the toy stop (with ``changes``) on a spy standing for vLLM's ``plan``. Returns
    the items vLLM was called with and the module, whose ``plan`` vLLM's callers look up when they
    call it."""
    from vllm import toy_planner

    calls: list = []

    def plan(config, items):
        calls.append(list(items))
        return list(items)[: -1 if config.compact else None]

    monkeypatch.setattr(toy_planner, "plan", plan)
    monkeypatch.setattr(dspark_hotfix.patches, "ALL", (dataclasses.replace(PLANNER, **changes),))
    dspark_hotfix.install()
    calls.clear()
    return calls, toy_planner


def test_the_wrapper_calls_vllm_once_and_passes_its_answer_through_the_correction(
    toys, monkeypatch
):
    seen: list = []

    correct = GREETING.correction

    def correction(answer, /, self, name):
        seen.append(answer)
        return correct(answer, self, name)

    calls, greeting = greeter(monkeypatch, correction=correction)
    assert greeting.greet("ada") == "hello, ada"
    assert calls == ["ada"] and seen == ["helo, ada"]
    assert toys.status()[GREETING.name]["corrections"] == 1


@pytest.mark.parametrize("keywords", [False, True], ids=["positional", "keywords"])
def test_an_arguments_step_calls_vllm_with_the_arguments_it_gives_and_none_keeps_them(
    toys, monkeypatch, keywords
):
    # A repair of the call: vLLM's function runs once, with what the step gave, where it gave
    # anything.
    def arguments(self, name):
        return None if name == "ada" else ((self,), {"name": name.lower()})

    calls, greeting = greeter(
        monkeypatch, arguments=arguments, correction=lambda answer, /, self, name: answer
    )
    call = (lambda name: greeting.greet(name=name)) if keywords else greeting.greet
    assert [call("ada"), call("BOB")] == ["helo, ada", "helo, bob"]
    assert calls == ["ada", "bob"]
    row = toys.status()[GREETING.name]
    assert (row["state"], row["calls"], row["corrections"]) == ("patched", 2, 1)


def test_vllms_own_error_passes_through_and_no_correction_runs(toys, monkeypatch):
    seen: list = []
    calls, greeting = greeter(
        monkeypatch, correction=lambda answer, /, self, name: seen.append(answer)
    )
    with pytest.raises(KeyError, match="bad"):
        greeting.greet("bad")
    assert calls == ["bad"] and seen == [] and toys.lines("WARNING") == []


def broken(*args: Any, **kwargs: Any) -> None:
    raise ValueError("no layout")


def test_a_correction_that_raises_gives_vllms_answer_and_says_so_once(toys, monkeypatch):
    calls, greeting = greeter(monkeypatch, correction=broken)
    assert [greeting.greet("ada") for _ in range(2)] == ["helo, ada"] * 2 and calls == ["ada"] * 2
    (warning,) = toys.lines("WARNING")
    assert warning.startswith(f"{GREETING.name}: correction raised ValueError: no layout"), warning
    assert toys.states()[GREETING.name] == "raised"


def test_an_arguments_step_that_raises_gives_vllms_answer_and_says_so_once(toys, monkeypatch):
    calls, module = planner(monkeypatch, arguments=broken)
    compact = SimpleNamespace(compact=True)
    assert [module.plan(compact, [1, 2]) for _ in range(2)] == [[1]] * 2 and calls == [[1, 2]] * 2
    (warning,) = toys.lines("WARNING")
    assert warning.startswith(f"{PLANNER.name}: arguments step raised ValueError: no layout"), (
        warning
    )


def finds(*args: Any, **kwargs: Any) -> None:
    raise Finding("views too narrow")


@pytest.mark.parametrize("kind", ["arguments", "correction"])
def test_a_finding_stops_vllm_worded_as_the_finding(toys, monkeypatch, kind):
    """A stop's arguments step finds before vLLM's function runs (it never runs); a correction after
    it ran."""
    if kind == "arguments":
        calls, module = planner(monkeypatch, arguments=finds)
        name, call = PLANNER.name, lambda: module.plan(SimpleNamespace(compact=True), [1, 2])
    else:
        calls, greeting = greeter(monkeypatch, correction=finds)
        name, call = GREETING.name, lambda: greeting.greet("ada")
    with pytest.raises(HotfixError, match=rf"^{name}: views too narrow$") as stopped:
        call()
    assert " raised " not in str(stopped.value)
    assert calls == ([] if kind == "arguments" else ["ada"])


# A target module this vLLM lacks (an older release that ships no such module, say).


def without(monkeypatch, tmp_path, patch) -> None:
    """The stand-in without ``patch``'s target module, first on ``sys.path``."""
    build = edited_standin(tmp_path / "standin", {}, remove=(toy_patches.module_file(patch),))
    monkeypatch.syspath_prepend(str(build))


@pytest.mark.parametrize("strict", [None, "1"], ids=["default", "strict"])
def test_a_missing_module_of_a_patch_not_judged_everywhere_leaves_it_waiting_without_a_warning(
    toys, monkeypatch, tmp_path, strict
):
    # Never imported: nothing failed, nothing to say, strict or not.
    without(monkeypatch, tmp_path, GREETING)
    if strict:
        monkeypatch.setenv("DSPARK_HOTFIX_STRICT", strict)
    dspark_hotfix.install()
    importlib.import_module(PLANNER.module)
    rows = toys.status()
    for patch in [p for p in toy_patches.TOYS if p.module == GREETING.module]:
        assert rows[patch.name]["state"] == "pending", rows[patch.name]
        assert f"waiting for {GREETING.module}" in rows[patch.name]["detail"]
    assert rows[PLANNER.name]["state"] == "patched"
    assert toys.lines("WARNING") == []


@pytest.mark.parametrize(
    "absent",
    [None, lambda: Need(False, "not needed (the toy build plans elsewhere)")],
    ids=["cannot tell", "absence is fine"],
)
def test_a_missing_module_of_an_everywhere_patch_is_judged_once_the_others_are(
    toys, monkeypatch, tmp_path, absent
):
    # not_needed with the patch's reason where its absence means the bug cannot happen; a problem,
    # said, where the patch cannot tell. Either way the line is said.
    without(monkeypatch, tmp_path, PLANNER)
    monkeypatch.setattr(
        dspark_hotfix.patches, "ALL", (GREETING, dataclasses.replace(PLANNER, absent=absent))
    )
    dspark_hotfix.install()
    importlib.import_module(GREETING.module)
    row = toys.status()[PLANNER.name]
    assert row["state"] == ("not_needed" if absent else "failed"), row
    assert row["detail"] == (
        absent().detail if absent else f"this vLLM defines no plan in {PLANNER.module}"
    ), row
    (line,) = toys.summaries()
    assert line.endswith(
        "fixing: 1 patched (toy_greeting), 1 not_needed"
        if absent
        else "problem: 1 patched (toy_greeting), 1 failed (toy_planner)"
    ), line
    assert len(toys.lines("WARNING")) == (0 if absent else 1)  # the failure


def test_an_everywhere_patch_whose_module_fails_to_import_waits(toys, monkeypatch, tmp_path):
    # Its module is there but raises: vLLM's own error to meet; the patch waits for a good import.
    broken = [("def plan", "raise ImportError('broken')\ndef plan")]
    build = edited_standin(tmp_path / "standin", {toy_patches.module_file(PLANNER): broken})
    monkeypatch.syspath_prepend(str(build))
    dspark_hotfix.install()
    importlib.import_module(GREETING.module)
    assert toys.status()[PLANNER.name]["state"] == "pending"
    assert toys.lines("WARNING") == []


def test_dspark_hotfix_status_names_a_target_module_it_cannot_import(
    toys, monkeypatch, tmp_path, capsys
):
    # One that is there but fails (a module this vLLM lacks is its patches' to judge: see above).
    broken = [("def plan", "raise ImportError('broken')\ndef plan")]
    monkeypatch.syspath_prepend(
        str(edited_standin(tmp_path / "standin", {toy_patches.module_file(PLANNER): broken}))
    )
    monkeypatch.delenv(
        "PROMETHEUS_MULTIPROC_DIR", raising=False
    )  # `status` drops it from os.environ
    assert cli.main(["status"]) == 1
    out = capsys.readouterr().out
    assert f"PROBLEM       cannot import {PLANNER.module}: ImportError: broken" in out, out


def test_an_arguments_step_that_cannot_take_a_call_vllm_takes_is_refused_before_wrapping(
    toys, monkeypatch
):
    # vLLM's plan(config, items) takes both by position or by keyword; a step that takes them by
    # position alone would raise on a keyword call, after the wrapper is in place.
    def positional_only(config, items, /):
        return None

    calls, module = planner(monkeypatch, arguments=positional_only)
    row = toys.status()[PLANNER.name]
    assert row["state"] == "failed", row
    assert "takes calls its arguments step(config, items, /) does not" in row["detail"], row
    assert module.plan(SimpleNamespace(compact=False), items=[1, 2]) == [1, 2]
    assert calls == [[1, 2]]  # vLLM's own function, unwrapped
