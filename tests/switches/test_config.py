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
def test_any_other_value_turns_the_shim_off_with_one_warning(raw):
    # An A/B whose B arm is silently patched is worse than none: not understood means off.
    proc = run_python(ENABLED + "\nprint(dspark_hotfix.enabled())", env={"DSPARK_HOTFIX": raw})
    assert proc.stdout.split() == ["False", "False"]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and f"DSPARK_HOTFIX={raw!r}" in lines[0] and "OFF" in lines[0]


def settings(**environ: str) -> config.Settings:
    return config.Settings(NAMES, environ)


def test_strict_is_off_by_default_and_on_for_true_words_only():
    assert settings().strict is False
    assert settings(DSPARK_HOTFIX_STRICT="Yes").strict is True
    s = settings(DSPARK_HOTFIX_STRICT="very")
    assert s.strict is False and s.problems == [
        "DSPARK_HOTFIX_STRICT='very' is not one of 1/true/on/yes/0/false/off/no: strict mode is off"]


def test_selection_of_names_is_case_insensitive():
    assert config.parse_selection("SWA_KV_CACHE_SPEC, Remap_DSpark_Name", NAMES) == (
        frozenset({"swa_kv_cache_spec", "remap_dspark_name"}), None)


def test_selection_by_exclusion_keeps_the_rest():
    assert config.parse_selection("-remap_dspark_name", NAMES) == (frozenset(NAMES) - {"remap_dspark_name"}, None)


def test_a_name_both_selected_and_excluded_is_excluded():
    selected, problem = config.parse_selection("swa_kv_cache_spec,-swa_kv_cache_spec,-swa_kv_cache_spec", NAMES)
    assert (selected, problem) == (frozenset(), None)


def test_selection_with_unknown_name_warns_and_ignores_it():
    selected, problem = config.parse_selection("swa_kv_cache_spec,bogus", NAMES)
    assert selected == {"swa_kv_cache_spec"}
    assert problem is not None and "1 unknown name ignored ('bogus'; known: " in problem


def test_selection_of_only_unknown_names_keeps_every_patch_on():
    selected, problem = config.parse_selection("bogus", NAMES)
    assert selected == frozenset(NAMES) and problem is not None


def test_empty_selection_means_all():
    assert config.parse_selection(" , ", NAMES) == (frozenset(NAMES), None)


def test_thousands_of_unknown_names_give_one_short_warning():
    raw = ",".join(f"name{i}" for i in range(2000)) + ",kv-view-guard,-kv-view-guard"
    selected, problem = config.parse_selection(raw, NAMES)
    assert selected == frozenset(NAMES) and problem is not None
    assert problem.startswith("DSPARK_HOTFIX_PATCHES: 2001 unknown names ignored ('name0', 'name1', 'name2', ...;")
    assert len(problem) < 300


def test_switches_warn_once_each_with_values_cut_short():
    s = settings(DSPARK_HOTFIX="x" * 120_000, DSPARK_HOTFIX_STRICT="y" * 5000, DSPARK_HOTFIX_PATCHES="z" * 5000)
    assert len(s.problems) == 3 and all(len(p) < 400 for p in s.problems)
    assert "(120000 characters)" in s.problems[0]


def test_a_huge_switch_value_is_cut_at_interpreter_start():
    proc = run_python(ENABLED, env={"DSPARK_HOTFIX": "x" * 120_000})
    assert proc.stdout.strip() == "False" and len(proc.stderr) < 400 and "(120000 characters)" in proc.stderr
