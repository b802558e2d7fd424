"""``DSPARK_HOTFIX``, the kill switch: the words that turn the shim on and off, unset means on, any other
value turns it off with one warning, and off means nothing is wrapped and nothing is said.

The words are tested on ``dspark_hotfix.enabled()`` in this process; the start-up hook reads the switch as the
interpreter starts, so one of each kind of word, and what off leaves of vLLM, are tested in fresh interpreters."""

from __future__ import annotations

import pytest

import dspark_hotfix
from tests.conftest import REPO, STATUS, child, json_lines
from tests.toys import USE

# Per toy target the toy build has, how many wrappers sit on its plain function in its class's (or module's)
# __dict__: 0 untouched, 1 patched once, -1 no plain function underneath. Needs `import sys`.
DEPTH = """
import json as _json, types as _types
from dspark_hotfix import patches as _patches, state as _state

def _depth(f):
    n = 0
    while hasattr(f, '__wrapped__'):
        f, n = f.__wrapped__, n + 1
    return n if type(f) is _types.FunctionType else -1

_found = {p.name: _state.attribute(sys.modules[p.module], p.qualname)[2]
          for p in _patches.ALL if p.module in sys.modules}
print(_json.dumps({name: _depth(f) for name, f in _found.items() if f is not None}))
"""


@pytest.mark.parametrize("raw", ["0", "off"])
def test_off_means_nothing_is_wrapped_and_nothing_is_said(raw):
    # The model's module first, then the planner's: no hook wraps later either.
    code = USE + "import sys, vllm.toy_model\n" + DEPTH + "import vllm.toy_planner\n" + DEPTH + \
        "print(_json.dumps(sorted(sys.modules)))\n" + STATUS
    proc = child(code, env={"DSPARK_HOTFIX": raw})
    assert proc.returncode == 0, proc.stderr
    first, later, modules, rows = json_lines(proc.stdout)
    assert first == {"toy_greeting": 0}  # vLLM's own plain function
    assert later == {"toy_greeting": 0, "toy_planner": 0}
    assert "wrapt" not in modules
    assert {r["state"] for r in rows.values()} == {"disabled"}  # type: ignore[union-attr]
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
    assert len(lines) == 1 and f"DSPARK_HOTFIX={raw!r}" in lines[0] and lines[0].endswith(": the shim is OFF")


ENABLED = "import dspark_hotfix; print(dspark_hotfix.enabled())\nprint(dspark_hotfix.enabled())\n"


@pytest.mark.parametrize(("raw", "on", "said"),
                         [(" yes ", "True", False), (" no ", "False", False), ("", "True", False),
                          ("maybe", "False", True)],
                         ids=["a true word", "a false word", "blank", "another value"])
def test_the_start_up_hook_reads_the_switch_as_the_package_does(raw, on, said):
    # The start-up hook reads the switch at interpreter start with the package's own reading (switch()): the
    # same answer, and a value not understood said once in the process, not once per reading.
    proc = child(ENABLED, env={"DSPARK_HOTFIX": raw})
    assert proc.stdout.split() == [on, on]
    lines = proc.stderr.splitlines()
    assert len(lines) == said and all(f"DSPARK_HOTFIX={raw!r}" in line and line.endswith(": the shim is OFF")
                                      for line in lines), lines


def test_a_value_not_understood_is_said_at_interpreter_start_where_nothing_else_reads_the_switch():
    # A process that never imports vLLM nor the shim: the start-up hook says it, once.
    proc = child("pass", env={"DSPARK_HOTFIX": "maybe"})
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "DSPARK_HOTFIX='maybe'" in line and line.endswith(": the shim is OFF"), line


def test_the_readme_and_help_say_blank_is_on_and_any_other_value_off_with_the_warnings_words(capsys):
    from dspark_hotfix.cli import main

    (row,) = [line for line in (REPO / "README.md").read_text().splitlines() if line.startswith("| `DSPARK_HOTFIX` |")]
    assert "on (unset or blank)" in row
    assert "Any other value is off too, with one warning ending `: the shim is OFF`" in row
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "DSPARK_HOTFIX 1/true/on/yes, blank or unset: on; 0/false/off/no: off; anything else: off, with one " \
           "warning (the shim is OFF)" in help_text
