"""What any switch's value does beyond its own meaning: a malformed on/off value warns once and
turns that switch off (fail safe), an unknown patch name warns once and is ignored, huge values are
cut short, and no value is ever evaluated.

Each switch's own values: test_kill_switch.py, test_selection.py, test_strict.py. ``DSPARK_HOTFIX``
is read at interpreter start (the start-up hook), so its cases run in fresh interpreters; the others
in this process."""

from __future__ import annotations

import re

import pytest

from dspark_hotfix import config
from tests.child import import_toy_targets, print_status, shim_enabled, use_toys
from tests.conftest import child, json_lines, program
from tests.reporting.inprocess import AS_SHIPPED, activate
from tests.toys import GREETING, NAMES


def settings(**environ: str) -> config.Settings:
    return config.Settings(NAMES, environ)


def test_switches_warn_once_each_with_values_cut_short():
    s = settings(
        DSPARK_HOTFIX="x" * 120_000,
        DSPARK_HOTFIX_STRICT="y" * 5000,
        DSPARK_HOTFIX_PATCHES="z" * 5000,
    )
    assert len(s.problems) == 2 and all(len(p) < 400 for p in [*s.problems, s.warning])
    assert s.warning is not None and "(5000 characters)" in s.warning
    assert "(120000 characters)" in s.problems[0]


def test_a_huge_switch_value_is_cut_at_interpreter_start_and_not_echoed_whole():
    code = program(use_toys, shim_enabled, import_toy_targets, print_status)
    proc = child(code, env={"DSPARK_HOTFIX": "x" * 120_000})
    assert proc.returncode == 0, proc.stderr[:500]
    enabled, rows = json_lines(proc.stdout)
    assert enabled is False
    assert len(proc.stderr.encode()) < 400, proc.stderr[:500]
    assert "(120000 characters)" in proc.stderr
    assert {row["state"] for row in rows.values()} == {"disabled"}


@pytest.mark.parametrize(
    ("var", "value"),
    [("DSPARK_HOTFIX_STRICT", "very"), ("DSPARK_HOTFIX_PATCHES", f"{GREETING.name},bogus")],
)
def test_malformed_value_warns_once_and_turns_that_switch_off(toys, monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    activate()
    warnings = toys.lines("WARNING")
    assert warnings[0].startswith(f"{var}={value!r}")
    assert len(warnings) == 1  # what the selection leaves off, the state line says
    assert toys.states()[GREETING.name] == "patched"


LOG_LINE = re.compile(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[dspark_hotfix\] ")


PAYLOADS = {
    "python": "__import__('os').system('touch {mark}')",
    "shell": "$(touch {mark}) `touch {mark}`",
    "format": "%(name)s %s {{0.__class__}} {{mark}}",
    "newline": f"1\ndspark_hotfix[1] INFO: {GREETING.name}: patched FORGED",
}


@pytest.mark.parametrize("var", ["DSPARK_HOTFIX_PATCHES", "DSPARK_HOTFIX_STRICT"])
@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_switch_values_are_never_evaluated_and_warn_once_on_one_line(
    toys, monkeypatch, tmp_path, var, payload
):
    mark = tmp_path / "pwned"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(var, PAYLOADS[payload].format(mark=mark))
    activate()
    assert not mark.exists()
    assert toys.states() == AS_SHIPPED  # malformed: the default
    warnings = toys.lines("WARNING")
    assert len(warnings) == 1 and var in warnings[0]
    # Every line the shim wrote is one of its own: no forged line.
    lines = toys.log.getvalue().splitlines()
    assert all(LOG_LINE.match(line) for line in lines) and len(toys.summaries()) == 1, lines


@pytest.mark.parametrize("payload", sorted(PAYLOADS))
def test_the_kill_switchs_value_is_never_evaluated_at_interpreter_start(tmp_path, payload):
    # The start-up hook reads DSPARK_HOTFIX as the interpreter starts: not understood means off,
    # said once on one line of its own.
    mark = tmp_path / "pwned"
    proc = child(
        program(use_toys, import_toy_targets, print_status),
        env={"DSPARK_HOTFIX": PAYLOADS[payload].format(mark=mark)},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert not mark.exists()
    (rows,) = json_lines(proc.stdout)
    assert {row["state"] for row in rows.values()} == {"disabled"}
    (line,) = proc.stderr.splitlines()
    assert line.startswith("WARNING ") and "[dspark_hotfix] dspark_hotfix " in line, line
    assert line.partition("): ")[2].startswith("undecided: DSPARK_HOTFIX="), line
