"""What any switch's value does beyond its own meaning: a malformed value warns once and keeps the default
(fail safe), huge values are cut short, and no value is ever evaluated.

Each switch's own values: test_kill_switch.py, test_selection.py, test_strict.py."""

from __future__ import annotations

import re
import subprocess

import pytest

from dspark_hotfix import config
from tests.cases import CORRECTIONS, SWA
from tests.conftest import (
    IMPORT_ALL,
    STATUS,
    child,
    last_json,
    run_python,
    summary_lines,
    warning_lines,
)

NAMES = tuple(p.name for p in CORRECTIONS)
ENABLED = "import dspark_hotfix; print(dspark_hotfix.enabled())"


def settings(**environ: str) -> config.Settings:
    return config.Settings(NAMES, environ)


def test_switches_warn_once_each_with_values_cut_short():
    s = settings(DSPARK_HOTFIX="x" * 120_000, DSPARK_HOTFIX_STRICT="y" * 5000, DSPARK_HOTFIX_PATCHES="z" * 5000)
    assert len(s.problems) == 2 and all(len(p) < 400 for p in [*s.problems, s.unknown])
    assert "(120000 characters)" in s.problems[0] and "(5000 characters)" in s.unknown


def test_a_huge_switch_value_is_cut_at_interpreter_start():
    proc = run_python(ENABLED, env={"DSPARK_HOTFIX": "x" * 120_000})
    assert proc.stdout.strip() == "False" and len(proc.stderr) < 400 and "(120000 characters)" in proc.stderr


@pytest.mark.parametrize(
    ("var", "value"),
    [("DSPARK_HOTFIX_STRICT", "very"), ("DSPARK_HOTFIX_PATCHES", f"{SWA.name},bogus")],
)
def test_malformed_value_warns_once_and_uses_the_default(var, value):
    proc = run_python(IMPORT_ALL + STATUS, env={var: value})
    warnings = warning_lines(proc.stderr)
    assert warnings[0].startswith(var) and repr(value.split(",")[-1]) in warnings[0]
    assert len(warnings) == 1  # what the selection leaves off, the state line says
    assert last_json(proc.stdout)[SWA.name]["state"] == "patched"


def states(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(proc.stdout).items()}


def test_a_huge_switch_value_is_not_echoed_whole():
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX": "x" * 120_000})
    assert proc.returncode == 0, proc.stderr[:500]
    assert len(proc.stderr.encode()) < 400, proc.stderr[:500]
    assert "120000 characters" in proc.stderr
    assert set(states(proc).values()) == {"disabled"}


LOG_LINE = re.compile(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[dspark_hotfix\] ")
SWITCHES = ("DSPARK_HOTFIX", "DSPARK_HOTFIX_PATCHES", "DSPARK_HOTFIX_STRICT")


PAYLOADS = {
    "python": "__import__('os').system('touch {mark}')",
    "shell": "$(touch {mark}) `touch {mark}`",
    "format": "%(name)s %s {{0.__class__}} {{mark}}",
    "newline": f"1\ndspark_hotfix[1] INFO: {SWA.name}: patched FORGED",
}


@pytest.mark.parametrize("var", SWITCHES)
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_switch_values_are_never_evaluated_and_warn_once_on_one_line(tmp_path, var, payload):
    mark = tmp_path / "pwned"
    value = PAYLOADS[payload].format(mark=mark)
    proc = run_python(IMPORT_ALL + STATUS, env={var: value}, cwd=tmp_path)
    assert not mark.exists()
    states = {r["state"] for r in last_json(proc.stdout).values()}
    if var == "DSPARK_HOTFIX":  # not understood: off, said once on one line of its own
        assert states == {"disabled"}
        assert len(proc.stderr.splitlines()) == 1 and proc.stderr.startswith("dspark_hotfix: DSPARK_HOTFIX=")
        return
    assert states == {"patched"}  # malformed: the default
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and var in warnings[0]
    # Every stderr line is one of the shim's own: no forged line.
    lines = proc.stderr.splitlines()
    assert all(LOG_LINE.match(line) for line in lines) and len(summary_lines(proc.stderr)) == 1, proc.stderr
