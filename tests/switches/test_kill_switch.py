"""``DSPARK_HOTFIX``, the kill switch: the words that turn the shim on and off, unset means on, any
other value turns it off with one warning, and off means nothing is wrapped and nothing is said.

The words are tested on ``dspark_hotfix.enabled()`` in this process; the start-up hook reads the
switch as the interpreter starts, so one of each kind of word, and what off leaves of vLLM, are
tested in fresh interpreters."""

from __future__ import annotations

import re
from functools import partial

import pytest

import dspark_hotfix
from tests.child import (
    import_modules,
    module_names,
    print_status,
    shim_enabled,
    use_toys,
    wrap_depths,
)
from tests.conftest import REPO, child, json_lines, program
from tests.toys import FAREWELL, GREETING, PLANNER

# The README's log alert: a [dspark_hotfix] line whose verdict exits 1.
ALERT = re.compile(r"\[dspark_hotfix\] .*: (problem|undecided): ")


@pytest.mark.parametrize("raw", ["0", "off"])
def test_off_means_nothing_is_wrapped_and_nothing_is_said(raw):
    # The model's module first, then the planner's: no hook wraps later either.
    code = program(
        use_toys,
        partial(import_modules, ["vllm.toy_model"]),
        wrap_depths,
        partial(import_modules, ["vllm.toy_planner"]),
        wrap_depths,
        module_names,
        print_status,
    )
    proc = child(code, env={"DSPARK_HOTFIX": raw})
    assert proc.returncode == 0, proc.stderr
    first, later, modules, rows = json_lines(proc.stdout)
    assert first == {GREETING.name: 0, FAREWELL.name: None}  # vLLM's own plain function
    assert later == {GREETING.name: 0, FAREWELL.name: None, PLANNER.name: 0}
    assert "wrapt" not in modules
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert proc.stderr == ""


@pytest.fixture
def switch(monkeypatch):
    """Set ``DSPARK_HOTFIX`` (None: unset) for a fresh reading of it in this process."""

    def set_to(raw: str | None) -> None:
        if raw is None:
            monkeypatch.delenv("DSPARK_HOTFIX", raising=False)
        else:
            monkeypatch.setenv("DSPARK_HOTFIX", raw)
        monkeypatch.setattr(dspark_hotfix, "_enabled", None)

    return set_to


@pytest.mark.parametrize("raw", ["1", "true", "ON", " yes "])
def test_true_words_turn_the_shim_on_silently(switch, capsys, raw):
    switch(raw)
    assert dspark_hotfix.enabled() is True
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("raw", ["0", "false", "Off", " no "])
def test_false_words_turn_the_shim_off_silently(switch, capsys, raw):
    switch(raw)
    assert dspark_hotfix.enabled() is False
    assert capsys.readouterr().err == ""


def test_unset_means_on(switch):
    switch(None)
    assert dspark_hotfix.enabled() is True


@pytest.mark.parametrize("raw", ["", "  "])
def test_blank_means_unset_on_and_silent(switch, capsys, raw):
    # A blank templated variable is a value nobody chose: the default, as unset.
    switch(raw)
    assert [dspark_hotfix.enabled(), dspark_hotfix.enabled()] == [True, True]
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("raw", ["disabled", "enable", "2"])
def test_any_other_value_turns_the_shim_off_with_one_warning(switch, capsys, raw):
    # An A/B whose B arm is silently patched is worse than none: not understood means off.
    switch(raw)
    assert [dspark_hotfix.enabled(), dspark_hotfix.enabled()] == [False, False]
    lines = capsys.readouterr().err.splitlines()
    assert (
        len(lines) == 1
        and f"DSPARK_HOTFIX={raw!r}" in lines[0]
        and lines[0].endswith(": the shim is OFF")
    )
    # The documented log alert (a [dspark_hotfix] line whose verdict exits 1) sees it, as `status`
    # says it.
    assert ALERT.search(lines[0]) and lines[0].startswith("WARNING "), lines[0]
    assert dspark_hotfix.status()["verdict"] == "undecided"


@pytest.mark.parametrize(
    ("raw", "on", "said"),
    [(" yes ", True, False), (" no ", False, False), ("", True, False), ("maybe", False, True)],
    ids=["a true word", "a false word", "blank", "another value"],
)
def test_the_start_up_hook_reads_the_switch_as_the_package_does(raw, on, said):
    # The start-up hook reads blank, 1 and 0 itself and hands any other value to the package's own
    # reading (switch()): the same answer, and a value not understood said once in the process, not
    # once per reading.
    proc = child(program(shim_enabled, shim_enabled), env={"DSPARK_HOTFIX": raw})
    assert json_lines(proc.stdout) == [on, on]
    lines = proc.stderr.splitlines()
    assert len(lines) == said and all(
        f"DSPARK_HOTFIX={raw!r}" in line and line.endswith(": the shim is OFF") for line in lines
    ), lines


def test_a_value_not_understood_is_said_at_interpreter_start_where_nothing_else_reads_the_switch():
    # A process that never imports vLLM nor the shim: the start-up hook says it, once.
    proc = child(program(), env={"DSPARK_HOTFIX": "maybe"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "DSPARK_HOTFIX='maybe'" in line and line.endswith(": the shim is OFF"), line


def test_the_readme_and_help_say_blank_is_on_and_any_other_value_off_with_the_warnings_words(
    capsys,
):
    from dspark_hotfix.cli import main

    (row,) = [
        line
        for line in (REPO / "README.md").read_text().splitlines()
        if line.startswith("| `DSPARK_HOTFIX` |")
    ]
    assert "on (unset or blank)" in row
    assert "Any other value is off too, with one warning ending `: the shim is OFF`" in row
    readme = (REPO / "README.md").read_text()
    assert "`[dspark_hotfix]` line contains `: problem: ` or `: undecided: `" in readme
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "DSPARK_HOTFIX 1/true/on/yes, blank or unset: on; 0/false/off/no: off; anything else: off,"
        " with one warning (the shim is OFF)" in help_text
    )
