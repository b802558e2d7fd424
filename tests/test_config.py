"""The switches: values accepted, defaults, and what a bad value does (fail safe)."""

from __future__ import annotations

import pytest

from dspark_hotfix import config
from tests.conftest import run_python

NAMES = ("remap_dspark_name", "attention_kv_cache_spec", "swa_kv_cache_spec")
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
def test_any_other_value_turns_the_shim_off_with_one_warning_whatever_the_log_level(raw):
    # An A/B whose B arm is silently patched is worse than none: not understood means off.
    proc = run_python(ENABLED + "\nprint(dspark_hotfix.enabled())", env={"DSPARK_HOTFIX": raw,
                                                                       "DSPARK_HOTFIX_LOG": "ERROR"})
    assert proc.stdout.split() == ["False", "False"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"DSPARK_HOTFIX={raw!r}" in lines[0] and "OFF" in lines[0]


def test_strict_is_off_by_default_and_on_for_true_words_only():
    assert config.Settings({}).strict is False
    assert config.Settings({"DSPARK_HOTFIX_STRICT": "Yes"}).strict is True
    s = config.Settings({"DSPARK_HOTFIX_STRICT": "very"})
    assert s.strict is False and "DSPARK_HOTFIX_STRICT='very'" in s.problems[0]


def test_log_level_names_and_malformed_level():
    assert config.Settings({"DSPARK_HOTFIX_LOG": "debug"}).level == "DEBUG"
    s = config.Settings({"DSPARK_HOTFIX_LOG": "loud"})
    assert s.level == "INFO" and "DSPARK_HOTFIX_LOG='loud'" in s.problems[0]


def test_selection_of_names_is_case_insensitive():
    assert config.parse_selection("SWA_KV_CACHE_SPEC, Remap_DSpark_Name", NAMES) == (
        frozenset({"swa_kv_cache_spec", "remap_dspark_name"}), [])


def test_selection_by_exclusion_keeps_the_rest():
    selected, problems = config.parse_selection("-remap_dspark_name", NAMES)
    assert selected == frozenset(NAMES) - {"remap_dspark_name"} and problems == []


def test_a_name_both_selected_and_excluded_is_excluded_and_said_so():
    selected, problems = config.parse_selection("swa_kv_cache_spec,-swa_kv_cache_spec", NAMES)
    assert selected == frozenset()
    assert len(problems) == 1 and "both selects and excludes 'swa_kv_cache_spec'" in problems[0]


def test_selection_with_unknown_name_warns_and_ignores_it():
    selected, problems = config.parse_selection("swa_kv_cache_spec,bogus", NAMES)
    assert selected == {"swa_kv_cache_spec"}
    assert len(problems) == 1 and "'bogus'" in problems[0]


def test_selection_of_only_unknown_names_keeps_every_patch_on():
    selected, problems = config.parse_selection("bogus", NAMES)
    assert selected == frozenset(NAMES) and len(problems) == 1


def test_empty_selection_means_all():
    assert config.parse_selection(" , ", NAMES) == (frozenset(NAMES), [])
