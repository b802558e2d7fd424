"""The loader the import watcher hands vLLM's modules, beside other tools that wrap loaders.

Real subprocesses with the stand-in build: each child (a function of
``tests/activation/loaders.py``) imports vLLM the way the tool it mimics does (ddtrace's module
watchdog, wrapt's importer, importlib's lazy loader, an availability check), then reports what the
shim decided.
The coexistence tier (tests/coexist) runs the real tools on real vLLM.
"""

from __future__ import annotations

import subprocess

from tests.activation import loaders
from tests.activation.children import JUDGED
from tests.conftest import call_in_child, last_json, summary_lines
from tests.toys import GREETING


def run(function, *args: object) -> subprocess.CompletedProcess[str]:
    proc = call_in_child(function, *args)
    assert proc.returncode == 0, proc.stderr
    return proc


def states(stdout: str) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(stdout).items()}


def test_a_vllm_spec_found_before_the_import_copies_deepcopies_and_pickles():
    # Availability checks call find_spec("vllm") before vLLM is imported: its loader is the proxy.
    proc = run(loaders.vllm_spec_copied_before_the_import)
    assert proc.stdout.splitlines()[0] == '["ActivatingLoader", true, true, true, true]', (
        proc.stderr
    )
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_the_spec_of_a_hooked_module_found_before_its_import_copies_deepcopies_and_pickles():
    # Once vLLM is imported, wrapt's finder gives each hook target not imported yet (here the toy
    # greeting's module, and prometheus_client) its own proxy loader: copies of those specs too,
    # then the imports.
    proc = run(loaders.hooked_specs_copied_before_their_import, GREETING.module)
    copied = '["_ImportHookChainedLoader", true, true, true, true]'
    assert proc.stdout.splitlines()[:3] == [
        copied,
        copied,
        "True",
    ], proc.stderr  # prometheus_client hooked
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_vllm_executed_from_its_spec_outside_sys_modules_leaves_the_import_after_it_patched():
    # A version probe runs vLLM's package module without importing it: the real import follows.
    proc = run(loaders.vllm_executed_from_its_spec_outside_sys_modules)
    assert proc.stdout.splitlines()[0].startswith("0.23.1rc1"), proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr
    assert len(summary_lines(proc.stderr)) == 1, proc.stderr


def test_the_loaders_are_put_back_only_where_they_still_point_at_the_proxy():
    # A loader wrapped around the proxy has its own object in __loader__ and __spec__.loader
    # while the proxy runs: that is the outer loader's to restore, not the proxy's to overwrite.
    proc = run(loaders.loader_wrapped_around_the_proxy)
    assert proc.stdout.splitlines()[:2] == ["True True", "Outer"], proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr
    # With nothing wrapped around it, the module keeps vLLM's own loader.
    alone = run(loaders.vllms_own_loaders)
    assert alone.stdout.split() == ["SourceFileLoader", "SourceFileLoader"], alone.stderr


def test_a_module_that_refuses_its_loader_assignment_still_imports_patched():
    # A module type whose __loader__ is read-only (the proxy, given at creation): the put-back skips
    # it.
    proc = run(loaders.module_refusing_its_loader)
    assert proc.stdout.splitlines()[0] == "Refusing ActivatingLoader Outer", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_a_loader_wrapped_around_ours_may_set_get_code_on_it_and_vllms_loader_runs_it():
    # ddtrace's watchdog (ddtrace/internal/module.py) assigns get_code on the loader it wraps, to
    # transform the module's code: the assignment must not fail, and must reach vLLM's loader.
    proc = run(loaders.get_code_set_on_the_proxy)
    assert proc.stdout.splitlines()[0] == "['vllm']", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_vllm_imported_through_importlibs_lazy_loader_is_patched():
    proc = run(loaders.vllm_through_the_lazy_loader)
    assert proc.stdout.splitlines()[0] == "SourceFileLoader module", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_a_wrapt_post_import_hook_on_vllm_registered_before_the_import_fires_and_vllm_is_patched():
    # wrapt's own finder goes ahead of the watcher and wraps the proxy in its chained loader.
    proc = run(loaders.wrapt_hook_on_vllm_registered_before_the_import)
    assert proc.stdout.splitlines()[0] == "['SourceFileLoader']", proc.stderr
    assert states(proc.stdout) == JUDGED, proc.stderr


def test_once_the_activation_is_whole_the_watcher_hands_vllms_modules_their_own_loaders():
    # The watcher steps aside after the first import that activates: every later module of vLLM is
    # found and loaded as if the shim were not there (no proxy, no activation to ask on each
    # import).
    proc = run(loaders.loaders_of_vllm_modules_after_activation)
    assert proc.stdout.split() == ["ActivatingLoader", "SourceFileLoader"], proc.stderr
