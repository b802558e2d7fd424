"""``DSPARK_HOTFIX_PATCHES``: selecting and excluding patches by name, unknown names warned about once
(and briefly, however many), and a needed patch the selection leaves off warned about."""

from __future__ import annotations

import json
import subprocess

from dspark_hotfix import config
from tests.cases import CORRECTIONS, PATCHES, REMAP, STOP, SWA, module_file
from tests.conftest import (
    ENGINE_CORE_FIRST,
    FIXED,
    IMPORT_ALL,
    REPO,
    RUNNER,
    STANDIN,
    STATUS,
    child,
    edited_standin,
    last_json,
    run_python,
    warning_lines,
)


def test_selection_patches_only_the_named_patch():
    rows = last_json(run_python(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": SWA.name}).stdout)
    assert rows[SWA.name]["state"] == "patched"
    assert {rows[n]["state"] for n in PATCHES if n != SWA.name} == {"excluded"}


STARTUP = REPO / "dspark_hotfix" / "startup"


def test_selecting_only_the_hybrid_off_stop_on_a_release_like_build_exits_0(tmp_path):
    # A build like vLLM 0.25.0: the reported bug fixed, the hybrid-off grouping not.
    released = edited_standin(tmp_path / "standin", {k: v for k, v in FIXED.items() if k != module_file(STOP)})
    proc = run_python("import sys; from dspark_hotfix.cli import main; sys.exit(main(['status', '--json']))",
                      path=(STARTUP, released), env={"DSPARK_HOTFIX_PATCHES": STOP.name}, check=False)
    report = json.loads(proc.stdout)
    assert (proc.returncode, report["verdict"]) == (0, "guarding"), report["problems"]
    assert {r["name"]: r["state"] for r in report["patches"]}[STOP.name] == "patched"


def test_an_unknown_name_is_a_warning_in_status_not_a_problem():
    proc = run_python("import sys; from dspark_hotfix.cli import main; sys.exit(main(['status']))",
                      path=(STARTUP, STANDIN), env={"DSPARK_HOTFIX_PATCHES": "-swa_kv_cache_spc"}, check=False)
    assert proc.returncode == 0 and "WARNING       DSPARK_HOTFIX_PATCHES: 1 unknown name ignored" in proc.stdout


def test_exclusion_leaves_the_excluded_patch_alone():
    rows = last_json(run_python(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": f"-{REMAP.name}"}).stdout)
    assert rows[REMAP.name]["state"] == "excluded"
    assert rows[SWA.name]["state"] == "patched"


def test_a_needed_patch_the_selection_leaves_off_makes_the_line_a_problem():
    proc = run_python(ENGINE_CORE_FIRST + f"import {RUNNER}\n", env={"DSPARK_HOTFIX_PATCHES": f"-{SWA.name}"})
    (line,) = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if "dspark_hotfix " in line]
    patched = [name for name in PATCHES if name != SWA.name]
    assert line.endswith(f"problem: {len(patched)} patched ({', '.join(patched)}), 1 excluded ({SWA.name})"), line


ALL_INSTALLED = dict.fromkeys(PATCHES, "patched")


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
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": "kv-cache-groups,-kv-cache-groups"})
    assert proc.returncode == 0, proc.stderr
    assert len(warning_lines(proc.stderr)) == 1, proc.stderr


NAMES = tuple(p.name for p in CORRECTIONS)


def test_selection_of_names_is_case_insensitive():
    assert config.parse_selection(f"{SWA.name.upper()}, {REMAP.name.title()}", NAMES) == (
        frozenset({SWA.name, REMAP.name}), None)


def test_selection_by_exclusion_keeps_the_rest():
    assert config.parse_selection(f"-{REMAP.name}", NAMES) == (frozenset(NAMES) - {REMAP.name}, None)


def test_a_name_both_selected_and_excluded_is_excluded():
    selected, problem = config.parse_selection(f"{SWA.name},-{SWA.name},-{SWA.name}", NAMES)
    assert (selected, problem) == (frozenset(), None)


def test_selection_with_unknown_name_warns_and_ignores_it():
    selected, problem = config.parse_selection(f"{SWA.name},bogus", NAMES)
    assert selected == {SWA.name}
    assert problem is not None and "1 unknown name ignored ('bogus'; known: " in problem


def test_selection_of_only_unknown_names_keeps_every_patch_on():
    selected, problem = config.parse_selection("bogus", NAMES)
    assert selected == frozenset(NAMES) and problem is not None


def test_empty_selection_means_all():
    assert config.parse_selection(" , ", NAMES) == (frozenset(NAMES), None)


def test_thousands_of_unknown_names_give_one_short_warning():
    raw = ",".join(f"name{i}" for i in range(2000)) + ",kv-cache-groups,-kv-cache-groups"
    selected, problem = config.parse_selection(raw, NAMES)
    assert selected == frozenset(NAMES) and problem is not None
    assert problem.startswith("DSPARK_HOTFIX_PATCHES: 2001 unknown names ignored ('name0', 'name1', 'name2', ...;")
    assert len(problem) < 300
