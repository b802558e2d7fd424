"""The switches: values accepted, defaults, and the complaint for a bad value."""

from __future__ import annotations

import pytest

from dspark_hotfix import config

NAMES = ("remap_dspark_name", "attention_kv_cache_spec", "swa_kv_cache_spec")


@pytest.mark.parametrize("raw", ["1", "true", "ON", " yes "])
def test_enable_accepts_true_words(raw):
    assert config.Settings({"DSPARK_HOTFIX": raw}).enabled is True


@pytest.mark.parametrize("raw", ["0", "false", "Off", "no"])
def test_enable_accepts_false_words(raw):
    s = config.Settings({"DSPARK_HOTFIX": raw})
    assert s.enabled is False and s.problems == []


def test_enabled_by_default_and_not_strict():
    s = config.Settings({})
    assert (s.enabled, s.strict, s.level, s.problems) == (True, False, "INFO", [])


def test_malformed_flag_keeps_default_and_names_variable_and_values():
    s = config.Settings({"DSPARK_HOTFIX": "maybe", "DSPARK_HOTFIX_STRICT": "2"})
    assert s.enabled is True and s.strict is False
    assert len(s.problems) == 2
    assert "DSPARK_HOTFIX='maybe'" in s.problems[0] and "0/false/off/no" in s.problems[0]
    assert "DSPARK_HOTFIX_STRICT='2'" in s.problems[1]


def test_log_level_names_and_malformed_level():
    assert config.Settings({"DSPARK_HOTFIX_LOG": "debug"}).level == "DEBUG"
    assert config.Settings({"DSPARK_HOTFIX_LOG": "warn"}).level == "WARNING"
    s = config.Settings({"DSPARK_HOTFIX_LOG": "loud"})
    assert s.level == "INFO" and "DSPARK_HOTFIX_LOG='loud'" in s.problems[0]


def test_selection_of_names():
    selected, problems = config.parse_selection("swa_kv_cache_spec, remap_dspark_name", NAMES)
    assert selected == {"swa_kv_cache_spec", "remap_dspark_name"} and problems == []


def test_selection_by_exclusion_keeps_the_rest():
    selected, problems = config.parse_selection("-remap_dspark_name", NAMES)
    assert selected == {"attention_kv_cache_spec", "swa_kv_cache_spec"} and problems == []


def test_selection_with_unknown_name_warns_and_ignores_it():
    selected, problems = config.parse_selection("swa_kv_cache_spec,nope", NAMES)
    assert selected == {"swa_kv_cache_spec"}
    assert len(problems) == 1 and "'nope'" in problems[0] and "remap_dspark_name" in problems[0]


def test_selection_of_only_unknown_names_falls_back_to_all():
    selected, problems = config.parse_selection("typo", NAMES)
    assert selected == set(NAMES) and len(problems) == 1


def test_empty_selection_means_all():
    assert config.parse_selection(" ", NAMES) == (frozenset(NAMES), [])
