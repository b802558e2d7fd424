"""``DSPARK_HOTFIX``, the kill switch: the words that turn the shim on and off, unset means on, any other
value turns it off with one warning, and off means nothing is wrapped and nothing is said."""

from __future__ import annotations

import pytest

from tests.conftest import (
    IMPORT_ALL,
    PATCHES,
    STATUS,
    WRAP_DEPTH,
    run_python,
)


def test_off_means_nothing_is_wrapped_and_nothing_is_said():
    proc = run_python(IMPORT_ALL + WRAP_DEPTH + STATUS, env={"DSPARK_HOTFIX": "0"})
    depth, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert depth == dict.fromkeys(PATCHES, 0)  # each target vLLM's own plain function
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert proc.stderr == ""
    assert "wrapt" not in run_python(IMPORT_ALL + "import sys; print(sorted(sys.modules))",
                                     env={"DSPARK_HOTFIX": "off"}).stdout


ENABLED = "import dspark_hotfix; print(dspark_hotfix.enabled())"


@pytest.mark.parametrize("raw", ["1", "true", "ON", " yes "])
def test_true_words_turn_the_shim_on_silently(raw):
    proc = run_python(ENABLED, env={"DSPARK_HOTFIX": raw})
    assert (proc.stdout.strip(), proc.stderr) == ("True", "")


@pytest.mark.parametrize("raw", ["0", "false", "Off", " no "])
def test_false_words_turn_the_shim_off_silently(raw):
    proc = run_python(ENABLED, env={"DSPARK_HOTFIX": raw})
    assert (proc.stdout.strip(), proc.stderr) == ("False", "")


def test_unset_means_on():
    assert run_python(ENABLED).stdout.strip() == "True"


@pytest.mark.parametrize("raw", ["disabled", "enable", "2", "", "  "])
def test_any_other_value_turns_the_shim_off_with_one_warning(raw):
    # An A/B whose B arm is silently patched is worse than none: not understood means off.
    proc = run_python(ENABLED + "\nprint(dspark_hotfix.enabled())", env={"DSPARK_HOTFIX": raw})
    assert proc.stdout.split() == ["False", "False"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"DSPARK_HOTFIX={raw!r}" in lines[0] and "OFF" in lines[0]
