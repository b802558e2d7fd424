"""Threads, child processes and reloads: every patch applied once, never half.

A serving process imports vLLM from many threads, forks and spawns workers,
and development servers reload modules. (A fork during activation itself is in
test_concurrency.py.)
"""

from __future__ import annotations

import json
import re

import pytest

from tests.activation.children import JUDGED, JUDGED_LINE, UNWRAPPED, USE_LAST, WRAP_DEPTH, WRAPPED
from tests.conftest import (
    REPO,
    json_lines,
    last_json,
    run_python,
    state_of,
    summary_lines,
    warning_lines,
)
from tests.toys import FAREWELL, GREETING, NAMES, PLANNER, TOYS, USE

TARGETS = sorted({p.module for p in TOYS})

STATES = "import dspark_hotfix; print(json.dumps({r['name']: r['state'] for r in dspark_hotfix.status()['patches']}))\n"

# Every thread imports vLLM's package (the first one activates), then half of them one target first,
# every thread every target (in the other order for the odd ones), then a quarter call install() as
# vLLM's plugin loader would, racing the import watcher. The same script is checked without the shim.
# (The package first, as vLLM's targets lie packages deep: a thread executing a target module right
# under ``vllm`` while another activates deadlocks, reported as a product bug.)
THREADS = USE + f"""
import importlib, json, sys, threading
TARGETS = {TARGETS!r}
sys.setswitchinterval(1e-6)
N = 16
barrier = threading.Barrier(N)
errors = []

def worker(k):
    barrier.wait()
    try:
        importlib.import_module("vllm")
        if k % 2 == 0:
            importlib.import_module(TARGETS[k // 2 % len(TARGETS)])
        for name in TARGETS if k % 2 == 0 else reversed(TARGETS):
            importlib.import_module(name)
        if k % 4 == 1:
            import dspark_hotfix
            dspark_hotfix.install(source="vllm-plugin")
    except BaseException as exc:
        errors.append(repr(exc))

threads = [threading.Thread(target=worker, args=(k,)) for k in range(N)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(errors))
"""


@pytest.mark.parametrize("attempt", range(3))
def test_sixteen_threads_importing_at_once_apply_each_patch_exactly_once(attempt):
    proc = run_python(THREADS + WRAP_DEPTH + STATES)
    errors, depth, states = json_lines(proc.stdout)
    assert errors == []
    assert depth == WRAPPED  # Class.__dict__[m].__wrapped__ is the toy build's plain function
    assert states == JUDGED
    # One registry, each patch decided once: one line.
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE], proc.stderr
    assert warning_lines(proc.stderr) == []


def test_the_thread_script_imports_cleanly_without_the_shim():
    # The control: the race itself imports every target without error, and wraps nothing.
    errors, depth = json_lines(run_python(THREADS + WRAP_DEPTH, env={"DSPARK_HOTFIX": "0"}).stdout)
    assert errors == [] and depth == UNWRAPPED


# A pool's worker imports every target, says its wrap depths and states, and greets through the toy build
# (the toy correction's answer where it is patched). The module runs again in spawn and forkserver workers.
CHILDREN = USE + """
import json, multiprocessing as mp, os, sys

def child(_):
    import io, contextlib
    {import_all}
    from vllm.toy_model import Greeter
    import dspark_hotfix
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(WRAP_DEPTH, {{}})
    states = {{r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}}
    return [os.getpid(), json.loads(out.getvalue()), states, Greeter().greet("ada")]

if __name__ == "__main__":
    if {parent_imports}:
        {import_all}
    with mp.get_context({method!r}).Pool(3) as pool:
        print(json.dumps([os.getpid(), pool.map(child, range(6), chunksize=1)]))
"""


def run_children(tmp_path, method: str, parent_imports: bool):
    script = tmp_path / f"children_{method}.py"
    script.write_text(f"WRAP_DEPTH = {WRAP_DEPTH!r}\n" + CHILDREN.format(
        method=method, parent_imports=parent_imports, import_all="import vllm.toy_model, vllm.toy_planner"))
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    parent, results = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc, parent, results


@pytest.mark.parametrize(
    ("method", "parent_imports"),
    [("fork", True), ("fork", False), ("forkserver", False)],
    ids=["fork-after-patching", "fork-before-vllm", "forkserver"],
)
def test_forked_and_forkserver_children_are_patched_once_each(tmp_path, method, parent_imports):
    proc, parent, results = run_children(tmp_path, method, parent_imports)
    children = {pid for pid, *_ in results}
    assert parent not in children and len(results) == 6
    for _pid, depth, states, greeting in results:
        assert depth == WRAPPED
        assert states == JUDGED
        assert greeting == "hello, ada"  # the child's greeting is corrected
    pids = [re.search(r"\(pid (\d+)\)", line).group(1) for line in summary_lines(proc.stderr)
            if state_of(line) == JUDGED_LINE]  # each process's line
    assert len(pids) == len(set(pids)), "patched twice in one process"
    # A fork after patching inherits the wrapper: only the parent says it patched.
    assert set(pids) == ({str(parent)} if parent_imports else {str(p) for p in children})


# Each target module reloaded in turn, in one process: after each reload, the wrap depths and status().
RELOADS = USE + "import importlib, json, sys\nimport vllm.toy_model, vllm.toy_planner\n" + f"""
for target in {TARGETS!r}:
    importlib.reload(sys.modules[target])
    exec({WRAP_DEPTH!r})
    import dspark_hotfix
    print(json.dumps(dspark_hotfix.status()))
"""


@pytest.fixture(scope="module")
def reloads() -> list[tuple[set[str], dict, dict]]:
    """After each reload: the toys reloaded so far (those of every module reloaded until then), the wrap
    depths, and status()."""
    lines = json_lines(run_python(RELOADS).stdout)
    done: set[str] = set()
    out = []
    for target, depth, status in zip(TARGETS, lines[::2], lines[1::2], strict=True):
        done |= {p.name for p in TOYS if p.module == target}
        out.append((set(done), depth, status))
    return out


def test_reload_is_a_stated_limit_the_reloaded_target_runs_as_shipped_never_half_wrapped(reloads):
    # As with wrapt, a reloaded module's functions are new and its hooks have fired: README says so.
    assert [reloaded for reloaded, _, _ in reloads] == [{GREETING.name, FAREWELL.name},
                                                          {GREETING.name, FAREWELL.name, PLANNER.name}]
    for reloaded, depth, _ in reloads:
        assert depth == {name: UNWRAPPED[name] if name in reloaded else WRAPPED[name] for name in NAMES}


def test_after_a_reload_status_says_the_reloaded_targets_patches_failed_not_patched(reloads):
    # status() reads vLLM's attribute: a reloaded target's function is vLLM's own again, and says so. The
    # absent target stays absent: still not needed.
    for reloaded, _, status in reloads:
        states = {row["name"]: row["state"] for row in status["patches"]}
        assert states == {name: "failed" if name in reloaded and state == "patched" else state
                          for name, state in JUDGED.items()}
        assert status["verdict"] == "problem"
        assert all("no longer the shim's wrapper" in row["detail"] for row in status["patches"]
                   if row["name"] in reloaded and JUDGED[row["name"]] == "patched")


def test_spawn_children_are_each_patched():
    # A tensor-parallel worker: it imports the greeting's module, never the planner's (as vLLM's workers
    # never import its KV-cache grouping); the shim imports it, to judge the everywhere stop.
    code = USE_LAST + """
import multiprocessing as mp, json

def child(_):
    import dspark_hotfix, vllm.toy_model, os
    return os.getpid(), [r['state'] for r in dspark_hotfix.status()['patches']]

if __name__ == '__main__':
    with mp.get_context('spawn').Pool(8) as pool:
        print(json.dumps(pool.map(child, range(8), chunksize=1)))
"""
    script = REPO / ".pytest_cache" / "spawn_children.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(code)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    results = last_json(proc.stdout)
    assert len(results) == 8
    assert all(states == list(JUDGED.values()) for _, states in results)
    assert len(summary_lines(proc.stderr)) >= len({pid for pid, _ in results})
