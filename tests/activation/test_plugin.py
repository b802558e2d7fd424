"""The vLLM plugin path: the ``vllm.general_plugins`` entry point of the installed wheel, in real
subprocesses: loaded by vLLM's loader, honouring ``VLLM_PLUGINS`` and the switch, sharing one
installer with the sitecustomize path, and entries with a space (which vLLM does not strip).

The plugin in a second thread, or registering while another thread is part way through an import, is
in test_concurrency.py."""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from pathlib import Path

import pytest

from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST
from tests.child import import_modules, import_toy_targets, load_plugins, package_file, print_status
from tests.conftest import (
    STANDIN,
    clean_env,
    json_lines,
    last_json,
    program,
    run_in_venv,
    startup_dir,
    state_of,
    summary_lines,
)

# VLLM_PLUGINS with a space: vLLM does not strip its entries.

SPACED = "other, dspark_hotfix"
# The toys from the checkout, put last on the child's path (USE_LAST): the package is the wheel's,
# in the venv.
PLUGINS = program(USE_LAST, import_toy_targets, load_plugins, print_status)


def in_venv(venv: dict, *args: str, path: tuple[Path | str, ...] = (STANDIN,), **env: str):
    full = clean_env(**env)
    full["PATH"] = f"{venv['bin']}{os.pathsep}{full.get('PATH', '')}"
    full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run(
        list(args), env=full, capture_output=True, text=True, timeout=120, cwd=str(venv["root"])
    )


def test_doctor_reports_a_plugin_entry_with_a_space_as_a_problem_naming_it(venv):
    proc = in_venv(venv, "dspark-hotfix", "doctor", "--json", VLLM_PLUGINS=SPACED)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stdout
    assert report["plugin"]["visible"] and not report["plugin"]["allowed"]
    assert any(
        f"VLLM_PLUGINS={SPACED!r}" in p and "' dspark_hotfix'" in p for p in report["problems"]
    ), report["problems"]


def test_the_standins_plugin_loader_does_not_load_a_plugin_entry_with_a_space(venv):
    proc = in_venv(venv, str(venv["python"]), "-c", PLUGINS, VLLM_PLUGINS=SPACED)
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"disabled"}, (
        rows
    )  # as vLLM 0.25.0 does: not loaded
    assert all(r["detail"] == "not installed in this process" for r in rows.values())


def test_plugin_entry_point_patches_when_vllm_loads_plugins(venv):
    proc = run_in_venv(
        venv,
        program(USE_LAST, import_toy_targets, load_plugins, print_status, package_file),
        path=(STANDIN,),
    )
    assert proc.returncode == 0, proc.stderr
    rows, package = json_lines(proc.stdout)
    assert {n: r["state"] for n, r in rows.items()} == JUDGED
    assert package.startswith(str(venv["purelib"]))  # the wheel's package, not the checkout's
    assert {r["activated_by"] for r in rows.values()} == {"vllm-plugin"}


def test_plugin_loaded_before_the_targets_patches_them_on_import(venv):
    code = program(
        USE_LAST, partial(import_modules, ["vllm"]), load_plugins, import_toy_targets, print_status
    )
    proc = run_in_venv(venv, code, path=(STANDIN,))
    assert {n: r["state"] for n, r in last_json(proc.stdout).items()} == JUDGED, proc.stderr


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"VLLM_PLUGINS": "someone_else"}, "not installed"),
        ({"DSPARK_HOTFIX": "0"}, "DSPARK_HOTFIX='0' turns the shim off"),
    ],
)
def test_plugin_honours_vllm_plugins_and_the_switch(venv, env, why):
    proc = run_in_venv(venv, PLUGINS, path=(STANDIN,), **env)
    rows = last_json(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert all(why in r["detail"] for r in rows.values())
    assert proc.stderr == ""


def test_both_paths_share_one_installer(venv):
    proc = run_in_venv(venv, PLUGINS, path=(startup_dir(venv), STANDIN))
    rows = last_json(proc.stdout)
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    assert [state_of(line) for line in summary_lines(proc.stderr)][
        -1
    ] == JUDGED_LINE  # one activation's lines
    assert len({line.split(" via ")[1] for line in summary_lines(proc.stderr)}) == len(
        summary_lines(proc.stderr)
    )
