"""``DSPARK_HOTFIX_PATCHES``: selecting and excluding patches by name, unknown names warned about once
(and briefly, however many), and a needed patch the selection leaves off warned about."""

from __future__ import annotations

import json
import subprocess

from dspark_hotfix import config
from tests.conftest import (
    ENGINE_CORE_FIRST,
    FIXED,
    IMPORT_ALL,
    PATCHES,
    REPO,
    STANDIN,
    STATUS,
    TARGETS,
    child,
    edited_standin,
    last_json,
    patch_names,
    run_python,
    warning_lines,
)


def test_selection_patches_only_the_named_patch_and_its_guard():
    rows = last_json(run_python(TARGETS + STATUS, env={"DSPARK_HOTFIX_PATCHES": "swa_kv_cache_spec"}).stdout)
    assert rows["swa_kv_cache_spec"]["state"] == rows["kv_view_guard"]["state"] == "patched"
    assert {rows[n]["state"] for n in PATCHES if n not in ("swa_kv_cache_spec", "kv_view_guard")} == {"excluded"}


STARTUP = REPO / "dspark_hotfix" / "startup"


def test_selecting_only_the_hybrid_off_stop_brings_its_guard_and_status_exits_0(tmp_path):
    # A build like vLLM 0.25.0: the reported bug fixed, the hybrid-off grouping not.
    released = edited_standin(tmp_path / "standin", {k: v for k, v in FIXED.items() if "kv_cache_utils" not in k})
    proc = run_python("import sys; from dspark_hotfix.cli import main; sys.exit(main(['status', '--json']))",
                      path=(STARTUP, released), env={"DSPARK_HOTFIX_PATCHES": "kv_cache_groups"}, check=False)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (0, "guarding"), report["problems"]
    assert {r["name"]: r["state"] for r in report["patches"]}["kv_view_guard"] == "patched"


def test_an_unknown_name_is_a_warning_in_status_not_a_problem():
    proc = run_python("import sys; from dspark_hotfix.cli import main; sys.exit(main(['status']))",
                      path=(STARTUP, STANDIN), env={"DSPARK_HOTFIX_PATCHES": "-swa_kv_cache_spc"}, check=False)
    assert proc.returncode == 0 and "WARNING       DSPARK_HOTFIX_PATCHES: 1 unknown name ignored" in proc.stdout


def test_exclusion_leaves_the_excluded_patch_alone():
    rows = last_json(run_python(TARGETS + STATUS, env={"DSPARK_HOTFIX_PATCHES": "-remap_dspark_name"}).stdout)
    assert rows["remap_dspark_name"]["state"] == "excluded"
    assert rows["swa_kv_cache_spec"]["state"] == "patched"


def test_a_needed_patch_the_selection_leaves_off_is_warned_about_when_it_is_decided_after_the_first_line():
    proc = run_python(ENGINE_CORE_FIRST + "import vllm.v1.worker.gpu.attn_utils\n",
                      env={"DSPARK_HOTFIX_PATCHES": "-kv_view_guard"})
    lines = [line.split("] ", 1)[1] for line in proc.stderr.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("dspark_hotfix "))
    assert lines[first].endswith("1 pending (kv_view_guard until vllm.v1.worker.gpu.attn_utils is imported)")
    assert lines[-1].endswith("problem: 5 patched (remap_dspark_name, attention_kv_cache_spec, swa_kv_cache_spec, "
                              "kv_cache_groups, draft_load_coverage), 1 excluded (kv_view_guard)")


ALL_INSTALLED = dict.fromkeys(patch_names(), "patched")


def states(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(proc.stdout).items()}


# Bounded warnings, in processes that import the targets.

def test_two_thousand_unknown_patch_names_give_one_short_warning():
    names = ",".join(f"no_such_patch_{i}" for i in range(2000))
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": names})
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = warning_lines(proc.stderr)
    assert len(warnings) <= 1 and all(len(w) < 300 for w in warnings), (len(warnings), warnings[:3])
    assert len(proc.stderr) < 1000
    assert states(proc) == ALL_INSTALLED  # a typo never turns the fix off


def test_a_name_both_selected_and_excluded_gives_one_warning():
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": "kv-view-guard,-kv-view-guard"})
    assert proc.returncode == 0, proc.stderr
    assert len(warning_lines(proc.stderr)) == 1, proc.stderr


NAMES = ("remap_dspark_name", "attention_kv_cache_spec", "swa_kv_cache_spec")


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
