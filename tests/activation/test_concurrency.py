"""Activation racing other threads and forks, end to end in real subprocesses.

- a start-up hang: activation under CPython's global import lock while another
  thread imports wrapt (or the registry);
- a half-done activation: a second caller, or a forked child, going on before
  the hooks exist; the plugin registering while another thread is part way
  through an import.

Each child is a function of ``tests/activation/racing.py``, real Python that ruff and mypy check,
run in a fresh interpreter by ``tests.conftest.call_in_child``. A child that hangs is ended there by
``faulthandler``, never by CI's own timeout.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.activation import racing
from tests.activation.children import JUDGED, JUDGED_LINE, WRAPPED
from tests.conftest import CHILD_TIMEOUT, call_in_child, last_json, state_of, summary_lines
from tests.toys import GREETING, PLANNER


def assert_finishes_patched(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"the child hung (or failed); its stderr:\n{proc.stderr}"
    assert {name: row["state"] for name, row in last_json(proc.stdout).items()} == JUDGED, (
        proc.stderr
    )
    assert state_of(summary_lines(proc.stderr)[-1]) == JUDGED_LINE, proc.stderr


# 1. A hang at start-up: activation ran in VllmImportWatcher.find_spec, under the global import
#    lock. One child each is enough: slow_import holds the module lock for the whole window, so the
#    two threads always meet in it (with activation moved back under the import lock, both fail in
#    one run).


def test_first_vllm_import_while_another_thread_imports_wrapt_never_hangs():
    # Activation imports wrapt too. Under the global import lock it waited for wrapt's module lock,
    # while the thread importing wrapt waited for the global import lock: a hang for good.
    assert_finishes_patched(call_in_child(racing.wrapt_imported_in_another_thread))


def test_status_called_in_another_thread_during_the_first_vllm_import_never_hangs():
    assert_finishes_patched(call_in_child(racing.status_asked_in_another_thread))


# 2. A half-done activation: a second caller went on before the hooks existed.


def test_plugin_in_a_second_thread_returns_once_the_hooks_exist_and_its_module_is_patched():
    proc = call_in_child(racing.plugin_registered_in_another_thread, stand_in_alone=True)
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout) == {"wrapped": True, "states": JUDGED}, proc.stderr


def test_a_target_imported_in_another_thread_while_vllms_package_executes_never_hangs():
    # wrapt's finder imports a module's parent package with the import lock held: the second thread
    # held it, waiting for the package, while the package's body waited for it to import a module: a
    # hang for good. The shim's finder hands hooked modules wrapt's loader itself, with the path it
    # is given.
    assert_finishes_patched(
        call_in_child(racing.target_imported_while_the_package_executes, stand_in_alone=True)
    )


@pytest.mark.parametrize("decisions_before_fork", [0, 2])
def test_a_child_forked_during_another_threads_activation_completes_it_whole(decisions_before_fork):
    # The fork does not wait: the child keeps what its parent had done (nothing is ever undone) and
    # completes the rest itself. Each target wrapped once, every patch judged, under the parent's
    # source.
    stall = 0.3
    proc = call_in_child(
        racing.fork_during_activation,
        decisions_before_fork,
        stall,
        stand_in_alone=True,
        timeout=CHILD_TIMEOUT + stall,
    )
    assert proc.returncode == 0, proc.stderr
    source, rows, depth = last_json(proc.stdout)
    assert source == "api", rows
    assert {name: state for name, (state, _) in rows.items()} == JUDGED, rows
    assert depth == WRAPPED


@pytest.mark.parametrize(("module", "patch"), [(p.module, p.name) for p in (PLANNER, GREETING)])
def test_a_module_another_thread_is_part_way_importing_when_the_plugin_registers_is_judged_whole(
    module, patch
):
    # A hook that judged the module then found no function and said not_needed; the patch must be
    # judged on the whole module, and applied where needed.
    proc = call_in_child(
        racing.plugin_registered_while_a_module_is_half_imported, module, stand_in_alone=True
    )
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert rows[patch]["state"] == "patched", rows[patch]
    assert state_of(summary_lines(proc.stderr)[-1]) == JUDGED_LINE


def test_a_child_forked_while_wrapts_lock_is_held_still_imports():
    # A child forked while another thread held wrapt's registration lock hung on its first import.
    # The shim, which put wrapt's finder there, gives the child a fresh one.
    proc = call_in_child(racing.fork_while_wrapts_lock_is_held)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "child 0", proc.stderr
