"""The same tests for every patch of ``dspark_hotfix.patches.ALL``, read from its declarations in
its own test module (tests/patches/__init__.py says what each declares).

Each runs the shim in this process on a stand-in build (the ``standin_shim`` fixture): the reported
build, that build with the patch's upstream fix or with every fix, and that build with each fault
the patch declares. Where a patch cannot be applied, vLLM runs as shipped, ``status`` says why and
one warning says it; in strict mode the shim stops vLLM naming the patch. Nothing here names a
patch: adding one is its module, its entry in ``ALL``, its test module and its stand-in edit.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import dspark_hotfix
from dspark_hotfix import HotfixError, registry
from dspark_hotfix.patches import ALL, Patch
from dspark_hotfix.state import STATES
from tests.patches import RELEASES, Fault, Revert, declared, fixed_edits

EVERYWHERE = [p for p in ALL if p.everywhere]
# Each fault a patch declares, by the fault's name: a fault two patches declare is one build both
# meet.
FAULTS = [(patch, name, fault) for patch in ALL for name, fault in declared(patch).FAULTS.items()]
FAULT_IDS = [f"{patch.name}-{name.replace(' ', '-')}" for patch, name, _ in FAULTS]


def ids(patch: Patch) -> str:
    return patch.name


def import_targets(patches: tuple[Patch, ...] | list[Patch] = ALL) -> None:
    """Import the patches' target modules, as vLLM does; with the shim installed each hook judges
    its patch."""
    for patch in patches:
        importlib.import_module(patch.module)


def held(patch: Patch) -> tuple[type | types.ModuleType, str, Any]:
    """The owner of vLLM's function that ``patch`` targets, its name, and what the owner holds under
    it now."""
    *owners, name = patch.qualname.split(".")
    owner = sys.modules[patch.module]
    for part in owners:
        owner = getattr(owner, part)
    return owner, name, vars(owner)[name]


def wrapped_in(patch: Patch) -> list[str]:
    """The functions of ``patch``'s target module that a wrapper of the shim now stands for (another
    patch's target on the same module aside): empty where vLLM's module is as shipped, whatever the
    fault renamed."""
    module = sys.modules[patch.module]
    others = {p.qualname for p in ALL if p.module == patch.module and p is not patch}
    members = [(name, value) for name, value in vars(module).items() if inspect.isfunction(value)]
    for name, value in vars(module).items():
        if inspect.isclass(value) and value.__module__ == module.__name__:
            members += [(f"{name}.{attr}", member) for attr, member in vars(value).items()]
    return [
        qualname
        for qualname, member in members
        if qualname not in others
        and getattr(getattr(member, "__code__", None), "co_filename", None) == registry.__file__
    ]


def sharing(name: str) -> list[Patch]:
    """The patches that declare the fault ``name``: the ones expected to fail on it."""
    return [patch for patch, fault_name, _ in FAULTS if fault_name == name]


# The declarations.


@pytest.mark.parametrize("patch", ALL, ids=ids)
def test_each_patch_has_its_test_module_with_its_declarations(patch):
    # The one pinned expectation: every other test reads the patches from ALL and these
    # declarations.
    module = declared(patch)
    assert module.PATCH is patch
    assert module.FIX and all(
        isinstance(old, str) and isinstance(new, str) for old, new in module.FIX
    )
    assert all(isinstance(fault, Fault) for fault in module.FAULTS.values())
    assert set(module.RELEASED) == set(RELEASES) and set(module.RELEASED.values()) <= set(STATES)
    assert isinstance(module.REVERT, tuple) and all(
        isinstance(edit, Revert) for edit in module.REVERT
    )
    # A fault met when vLLM calls the function needs vLLM's call: exercise() makes it.
    assert callable(getattr(module, "exercise", None)) or not any(
        f.at_call for f in module.FAULTS.values()
    )


def test_no_test_module_declares_a_patch_that_is_not_in_all():
    # Removing a patch removes its test module too: none is left behind declaring it.
    declaring = [
        module
        for module in (
            importlib.import_module(f"tests.patches.{path.stem}")
            for path in sorted(Path(__file__).parent.glob("test_*.py"))
        )
        if hasattr(module, "PATCH")
    ]
    assert sorted(module.PATCH.name for module in declaring) == sorted(p.name for p in ALL)


def test_a_fault_two_patches_declare_is_the_same_build_for_both():
    # A fault is a build: each patch that declares it says what it sees there, on the same edits.
    by_name: dict[str, Fault] = {}
    for patch, name, fault in FAULTS:
        first = by_name.setdefault(name, fault)
        assert (first.edits, first.remove) == (
            fault.edits,
            fault.remove,
        ), f"{patch.name} declares another {name!r}"


# The stand-in as shipped: the reported build.


@pytest.mark.parametrize("patch", ALL, ids=ids)
def test_the_reported_build_gets_the_patch_once_its_module_is_imported(standin_shim, patch):
    shim = standin_shim()
    dspark_hotfix.install()
    import_targets([patch])
    row = shim.status()[patch.name]
    assert (row["state"], row["needed"]) == ("patched", True), row
    if hasattr(
        declared(patch), "exercise"
    ):  # vLLM's call goes through the wrapper: what at-call faults rely on
        declared(patch).exercise()
        assert shim.status()[patch.name]["calls"] >= 1


@pytest.mark.parametrize("patch", EVERYWHERE, ids=ids)
def test_an_everywhere_patch_is_judged_where_vllm_imports_only_the_other_targets(
    standin_shim, patch
):
    # A tensor-parallel worker may never import the patch's module: the registry does, once the rest
    # is judged. The shim activates after vLLM's imports here (as `status` does), so nothing but the
    # registry imports it.
    shim = standin_shim()
    import_targets([p for p in ALL if p.module != patch.module])
    assert patch.module not in sys.modules  # else the registry had nothing to import
    dspark_hotfix.install()
    row = shim.status()[patch.name]
    assert (row["state"], row["needed"]) == ("patched", True), row


# The stand-in with upstream fixes.


@pytest.mark.parametrize("patch", ALL, ids=ids)
def test_with_its_upstream_fix_the_patch_is_not_needed_and_vllm_is_untouched(standin_shim, patch):
    shim = standin_shim(fixed_edits([patch]))  # raises where an edit of FIX no longer applies
    dspark_hotfix.install()
    import_targets([patch])
    assert shim.status()[patch.name]["state"] == "not_needed"
    function = held(patch)[2]
    assert inspect.isfunction(function) and not hasattr(function, "__wrapped__")


def test_with_every_upstream_fix_every_patch_is_not_needed_and_the_shim_removable(standin_shim):
    shim = standin_shim(fixed_edits(ALL))
    dspark_hotfix.install()
    import_targets()
    assert set(shim.states().values()) == {"not_needed"}, shim.states()
    assert dspark_hotfix.status()["verdict"] == "removable"


# The stand-in with each fault a patch declares.


@pytest.mark.parametrize(("patch", "name", "fault"), FAULTS, ids=FAULT_IDS)
def test_where_a_fault_stops_the_patch_vllm_runs_as_shipped_and_status_and_one_warning_say_why(
    standin_shim, patch, name, fault
):
    shim = standin_shim(fault.edits, fault.remove)
    dspark_hotfix.install()
    import_targets()
    if (
        fault.at_call
    ):  # the correction fails once vLLM calls the function: vLLM's own answer, each time
        answers = [declared(patch).exercise() for _ in range(2)]
        owner, attribute, wrapper = held(patch)
        setattr(owner, attribute, wrapper.__wrapped__)
        try:
            shipped = declared(patch).exercise()
        finally:
            setattr(owner, attribute, wrapper)
        assert answers == [shipped] * 2
    else:  # nothing of vLLM's module wraps: every call is vLLM's as shipped
        assert wrapped_in(patch) == []
    row = shim.status()[patch.name]
    assert row["state"] in (("raised", "failed") if fault.at_call else (fault.state,)), row
    assert fault.detail in row["detail"]
    warnings = shim.lines("WARNING")
    (warning,) = [line for line in warnings if line.startswith(f"{patch.name}: ")]
    assert fault.at_call or warning.endswith("; vLLM runs unpatched"), warning
    assert all(line.startswith(tuple(f"{p.name}: " for p in sharing(name))) for line in warnings), (
        warnings
    )
    # The patches this fault leaves alone are still applied: the shim was at work in this very
    # build.
    others = {p.name: shim.states()[p.name] for p in ALL if p not in sharing(name)}
    assert set(others.values()) <= {"patched"}, others


@pytest.mark.parametrize(("patch", "name", "fault"), FAULTS, ids=FAULT_IDS)
def test_in_strict_mode_each_fault_stops_vllm_naming_the_patch_its_target_and_the_remedy(
    standin_shim, monkeypatch, patch, name, fault
):
    standin_shim(fault.edits, fault.remove)
    monkeypatch.setenv("DSPARK_HOTFIX_STRICT", "1")
    # This patch alone is selected: a fault two patches meet stops vLLM at the first one it imports.
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", patch.name)
    dspark_hotfix.install()
    if fault.at_call:  # applied at import; vLLM's call meets the failure
        import_targets([patch])
        meet = declared(patch).exercise
    else:

        def meet():
            import_targets([patch])

    with pytest.raises(HotfixError) as stopped:
        meet()
    message = str(stopped.value)
    assert (
        message.startswith(f"{patch.name}: ") and f"{patch.module}.{patch.qualname}" in message
    ), message
    assert f"DSPARK_HOTFIX_PATCHES=-{patch.name}" in message, message
