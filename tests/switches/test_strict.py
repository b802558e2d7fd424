"""``DSPARK_HOTFIX_STRICT``: off by default, on for true words only; strict, a patch that cannot be
applied (a toy target renamed or with another signature, no or an unusable wrapt) stops the process
naming the patch, its target and a remedy that exists, every retried import is refused, and a
correction that raises stops vLLM.

On the toy patches, in this process; where the interpreter has no wrapt, in one. Each real patch's
faults in strict mode: tests/patches/test_every_patch.py."""

from __future__ import annotations

import dataclasses
import importlib
import re
import sys
import types

import pytest

import dspark_hotfix
from dspark_hotfix import HotfixError, config
from dspark_hotfix.startup.sitecustomize import VllmImportWatcher
from tests.child import print_status, use_toys
from tests.conftest import REPO, json_lines, program, run_python
from tests.reporting.inprocess import activate, build, strict
from tests.toys import FAREWELL, GREETING, NAMES, PLANNER, module_file


def settings(**environ: str) -> config.Settings:
    return config.Settings(NAMES, environ)


def test_strict_is_off_by_default_and_on_for_true_words_only():
    assert settings().strict is False
    assert settings(DSPARK_HOTFIX_STRICT="Yes").strict is True
    s = settings(DSPARK_HOTFIX_STRICT="very")
    assert s.strict is False and s.problems == [
        "DSPARK_HOTFIX_STRICT='very' is not one of 1/true/on/yes/0/false/off/no: strict mode is OFF"
    ]


def test_the_readme_and_help_say_what_strict_stops_and_what_another_value_does(capsys):
    # what the tests here hold: what cannot be applied and what raises stops vLLM; another value is
    # off, and said
    from dspark_hotfix.cli import main

    readme = (REPO / "README.md").read_text().splitlines()
    (row,) = [line for line in readme if line.startswith(f"| `{config.STRICT}` |")]
    assert "a patch that cannot be applied, or a correction that raises, stops vLLM" in row, row
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        f"{config.STRICT} 1/true/on/yes: a patch that cannot be applied, or a correction that"
        " raises, stops vLLM; blank, unset or 0/false/off/no: off; anything else: off, with one"
        " warning" in help_text
    ), help_text


# Toy builds the toy patches do not expect: the edits, the patch that cannot be applied, and what it
# says.
FAULTS = {
    "class renamed": (
        {module_file(GREETING): [("class Greeter:", "class Welcomer:")]},
        GREETING,
        "vllm.toy_model has no class Greeter",
    ),
    "method renamed": (
        {module_file(GREETING): [("def greet(self, name)", "def salute(self, name)")]},
        GREETING,
        "Greeter defines no greet",
    ),
    "signature changed": (
        {module_file(GREETING): [("def greet(self, name)", "def greet(self, name, title='')")]},
        GREETING,
        "unexpected signature Greeter.greet(self, name, title)",
    ),
    "function renamed": (
        {module_file(PLANNER): [("def plan(", "def schedule(")]},
        PLANNER,
        "vllm.toy_planner defines no plan",
    ),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_strict_mode_stops_the_import_naming_patch_target_and_remedy(
    toys, monkeypatch, tmp_path, fault
):
    edits, patch, detail = FAULTS[fault]
    build(tmp_path, monkeypatch, edits)
    strict(monkeypatch)
    dspark_hotfix.install("sitecustomize")
    with pytest.raises(HotfixError) as stopped:
        importlib.import_module(patch.module)
    message = str(stopped.value)
    assert message.startswith(f"{patch.name}: cannot patch {patch.module}.{patch.qualname}: "), (
        message
    )
    assert detail in message
    assert f"DSPARK_HOTFIX_PATCHES=-{patch.name}" in message


def test_strict_remedy_names_only_commands_that_exist(toys, monkeypatch, tmp_path, capsys):
    edits, patch, _ = FAULTS["signature changed"]
    build(tmp_path, monkeypatch, edits)
    strict(monkeypatch)
    dspark_hotfix.install("sitecustomize")
    with pytest.raises(HotfixError) as stopped:
        importlib.import_module(patch.module)
    commands = re.findall(r"`dspark-hotfix ([a-z-]+)[^`]*`", str(stopped.value))
    assert commands, str(stopped.value)
    from dspark_hotfix.cli import main

    for command in commands:
        with pytest.raises(SystemExit) as helped:
            main([command, "--help"])
        assert helped.value.code == 0, (
            f"the remedy names `dspark-hotfix {command}`, which does not exist"
        )


def test_strict_mode_refuses_every_retried_import_of_a_broken_target(toys, monkeypatch, tmp_path):
    build(tmp_path, monkeypatch, FAULTS["signature changed"][0])
    strict(monkeypatch)
    dspark_hotfix.install("sitecustomize")
    errors: list[str | None] = []
    for _ in range(2):
        try:
            importlib.import_module(GREETING.module)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
        else:
            errors.append(None)
    first, retry = errors
    assert first is not None and first.startswith(f"HotfixError: {GREETING.name}: "), first
    assert retry == first


def _raising(answer, /, self, name):
    raise ValueError("a field this shim does not know")


def test_a_correction_that_raises_stops_vllm_in_strict_mode(toys, monkeypatch):
    # Without strict mode vLLM's own answer goes on (tests/reporting/test_one_truth.py); strict, the
    # call fails.
    monkeypatch.setattr(
        dspark_hotfix.patches,
        "ALL",
        (dataclasses.replace(GREETING, correction=_raising), FAREWELL, PLANNER),
    )
    strict(monkeypatch)
    activate()
    from vllm.toy_model import Greeter

    with pytest.raises(HotfixError) as stopped:
        Greeter().greet("you")
    assert str(stopped.value).startswith(
        f"{GREETING.name}: correction raised ValueError: a field this shim does "
        f"not know in {GREETING.module}.{GREETING.qualname}; "
    )
    assert isinstance(stopped.value.__cause__, ValueError)
    assert toys.states()[GREETING.name] == "raised"


# Where wrapt cannot be used: a wrapt that is not the one the shim knows, in this process; none at
# all, in an interpreter without it.


def test_strict_mode_with_an_unusable_wrapt_fails_every_retry_and_status_names_why(
    toys, monkeypatch
):
    # A retried import must not load vLLM unpatched: the start-up hook activates again at each
    # import of vllm that did not complete. A wrapt that is not the one the shim knows is as
    # unusable as none: strict mode stops, status() says failed (not pending) and why.
    monkeypatch.setitem(
        sys.modules, "wrapt", types.ModuleType("wrapt")
    )  # no register_post_import_hook
    strict(monkeypatch)
    monkeypatch.setattr(sys, "meta_path", [VllmImportWatcher("sitecustomize"), *sys.meta_path])
    errors = []
    for _ in range(3):
        try:
            importlib.import_module(GREETING.module)
        except Exception as exc:
            errors.append(exc)
    assert [type(exc).__name__ for exc in errors] == ["HotfixError"] * 3
    assert all("wrapt" in str(exc) and "install wrapt" in str(exc) for exc in errors), errors
    assert "vllm" not in sys.modules
    rows = toys.status()
    assert {row["state"] for row in rows.values()} == {"failed"}
    assert all("wrapt is not usable" in row["detail"] for row in rows.values()), rows


def import_three_times() -> list[str | None]:
    """What each of three imports of the toy model's module raised (None: nothing)."""
    errors: list[str | None] = []
    for _ in range(3):
        try:
            import vllm.toy_model  # noqa: F401

            errors.append(None)
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
    return errors


def test_strict_mode_without_wrapt_stops_every_import_naming_wrapt_and_the_remedy(bare_venv):
    code = program(use_toys, import_three_times, print_status)
    proc = run_python(
        code, python=str(bare_venv / "bin" / "python"), env={"DSPARK_HOTFIX_STRICT": "1"}
    )
    errors, rows = json_lines(proc.stdout)
    assert len(errors) == 3 and len(set(errors)) == 1, errors
    message = errors[0]
    assert message.startswith("HotfixError: not active: wrapt is not usable"), message
    assert re.search(r"install wrapt|DSPARK_HOTFIX=0", message, re.IGNORECASE), (
        f"no remedy named: {message}"
    )
    assert {row["state"] for row in rows.values()} == {"failed"}


def test_strict_mode_stops_where_a_patch_the_shim_imports_everywhere_cannot_be_applied(
    toys, monkeypatch, tmp_path
):
    # Once every other patch is judged, the shim imports an everywhere patch's module itself; a
    # patch there that cannot be applied stops vLLM in strict mode as anywhere else.
    build(tmp_path, monkeypatch, {module_file(PLANNER): [("def plan(", "def arrange(")]})
    strict(monkeypatch)
    dspark_hotfix.install("sitecustomize")
    with pytest.raises(HotfixError) as stopped:
        importlib.import_module(GREETING.module)
    message = str(stopped.value)
    assert message.startswith(
        f"{PLANNER.name}: cannot patch {PLANNER.module}.{PLANNER.qualname}: "
    ), message
    assert "vllm.toy_planner defines no plan" in message, message
