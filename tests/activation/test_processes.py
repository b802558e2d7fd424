"""Threads, child processes and reloads: every patch applied once, never half.

A serving process imports vLLM from many threads, forks and spawns workers,
and development servers reload modules. (A fork during activation itself is in
test_concurrency.py.) Each child is a function of ``tests/activation/workers.py``,
run in a fresh interpreter by ``tests.conftest.call_in_child``.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.activation import workers
from tests.activation.children import JUDGED, JUDGED_LINE, UNWRAPPED, WRAPPED
from tests.conftest import (
    call_in_child,
    json_lines,
    last_json,
    state_of,
    summary_lines,
    warning_lines,
)
from tests.toys import FAREWELL, GREETING, NAMES, PLANNER, TOYS

TARGETS = sorted({p.module for p in TOYS})
POOL_TIMEOUT = 120  # seconds: a pool starts its workers one after the other


def ran(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )
    return proc


@pytest.mark.parametrize("attempt", range(3))
def test_sixteen_threads_importing_at_once_apply_each_patch_exactly_once(attempt):
    proc = ran(call_in_child(workers.sixteen_threads, TARGETS, True))
    errors, depth, states = json_lines(proc.stdout)
    assert errors == []
    assert depth == WRAPPED  # Class.__dict__[m].__wrapped__ is the toy build's plain function
    assert states == JUDGED
    # One registry, each patch decided once: one line.
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE], proc.stderr
    assert warning_lines(proc.stderr) == []


def test_the_thread_script_imports_cleanly_without_the_shim():
    # The control: the race itself imports every target without error, and wraps nothing.
    errors, depth = json_lines(
        ran(
            call_in_child(workers.sixteen_threads, TARGETS, False, env={"DSPARK_HOTFIX": "0"})
        ).stdout
    )
    assert errors == [] and depth == UNWRAPPED


@pytest.mark.parametrize(
    ("method", "parent_imports"),
    [("fork", True), ("fork", False), ("forkserver", False)],
    ids=["fork-after-patching", "fork-before-vllm", "forkserver"],
)
def test_forked_and_forkserver_children_are_patched_once_each(method, parent_imports):
    proc = ran(call_in_child(workers.pool_of_workers, method, parent_imports, timeout=POOL_TIMEOUT))
    parent, results = last_json(proc.stdout)
    children = {pid for pid, *_ in results}
    assert parent not in children and len(results) == 6
    for _pid, depth, states, greeting in results:
        assert depth == WRAPPED
        assert states == JUDGED
        assert greeting == "hello, ada"  # the child's greeting is corrected
    pids = [
        line.split("(pid ", 1)[1].split(")", 1)[0]
        for line in summary_lines(proc.stderr)
        if state_of(line) == JUDGED_LINE
    ]  # each process's line
    assert len(pids) == len(set(pids)), "patched twice in one process"
    # A fork after patching inherits the wrapper: only the parent says it patched.
    assert set(pids) == ({str(parent)} if parent_imports else {str(p) for p in children})


@pytest.fixture(scope="module")
def reloads() -> list[tuple[set[str], dict, dict]]:
    """After each reload: the toys reloaded so far (those of every module reloaded until then), the
    wrap depths, and status()."""
    lines = json_lines(ran(call_in_child(workers.reloads, TARGETS)).stdout)
    done: set[str] = set()
    out = []
    for target, depth, status in zip(TARGETS, lines[::2], lines[1::2], strict=True):
        done |= {p.name for p in TOYS if p.module == target}
        out.append((set(done), depth, status))
    return out


def test_reload_is_a_stated_limit_the_reloaded_target_runs_as_shipped_never_half_wrapped(reloads):
    # As with wrapt, a reloaded module's functions are new and its hooks have fired: README says so.
    assert [reloaded for reloaded, _, _ in reloads] == [
        {GREETING.name, FAREWELL.name},
        {GREETING.name, FAREWELL.name, PLANNER.name},
    ]
    for reloaded, depth, _ in reloads:
        assert depth == {
            name: UNWRAPPED[name] if name in reloaded else WRAPPED[name] for name in NAMES
        }


def test_after_a_reload_status_says_the_reloaded_targets_patches_failed_not_patched(reloads):
    # status() reads vLLM's attribute: a reloaded target's function is vLLM's own again, and says
    # so. The absent target stays absent: still not needed.
    for reloaded, _, status in reloads:
        states = {row["name"]: row["state"] for row in status["patches"]}
        assert states == {
            name: "failed" if name in reloaded and state == "patched" else state
            for name, state in JUDGED.items()
        }
        assert status["verdict"] == "problem"
        assert all(
            "no longer the shim's wrapper" in row["detail"]
            for row in status["patches"]
            if row["name"] in reloaded and JUDGED[row["name"]] == "patched"
        )


def test_spawn_children_are_each_patched():
    # A tensor-parallel worker: it imports the greeting's module, never the planner's (as vLLM's
    # workers never import its KV-cache grouping); the shim imports it, to judge the everywhere
    # stop.
    proc = ran(call_in_child(workers.spawned_workers, timeout=POOL_TIMEOUT))
    results = last_json(proc.stdout)
    assert len(results) == 8
    assert all(states == list(JUDGED.values()) for _, states in results)
    assert len(summary_lines(proc.stderr)) >= len({pid for pid, _ in results})
