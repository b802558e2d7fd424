"""Threads, child processes and reloads: every patch applied once, never half.

A serving process imports vLLM from many threads, forks and spawns workers,
and development servers reload modules. (A fork during activation itself is in
test_concurrency.py.)
"""

from __future__ import annotations

import json
import re

import pytest

from dspark_hotfix.patches import ALL
from tests.conftest import (
    ALL_PATCHED,
    IMPORT_ALL,
    PATCHES,
    REPO,
    WRAP_DEPTH,
    json_lines,
    last_json,
    run_python,
    state_of,
    summary_lines,
    warning_lines,
)

MODULES = sorted({p.module for p in ALL})
# The stand-in's DeepSeek-V4 modules import each other in a cycle; the others are leaves.
LEAVES = [m for m in MODULES if not m.startswith("vllm.models.deepseek_v4")]

STATES = "import dspark_hotfix; print(json.dumps({r['name']: r['state'] for r in dspark_hotfix.status()['patches']}))\n"

# Half the threads import a leaf target first, all import the DeepSeek-V4
# package (which pulls the other targets in), then every target; a quarter call
# install() as vLLM's plugin loader would, racing the import watcher. Threads
# that enter the stand-in's import cycle at different modules can deadlock in
# Python's own import system, with or without the shim: that order is avoided,
# and the same script is checked without the shim.
THREADS = f"""
import importlib, json, sys, threading
LEAVES, MODULES = {LEAVES!r}, {MODULES!r}
sys.setswitchinterval(1e-6)
N = 16
barrier = threading.Barrier(N)
errors = []

def worker(k):
    barrier.wait()
    try:
        if k % 2 == 0:
            importlib.import_module(LEAVES[k // 2 % len(LEAVES)])
        importlib.import_module("vllm.models.deepseek_v4")
        for name in MODULES:
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
    assert depth == dict.fromkeys(PATCHES, 1)  # Class.__dict__[m].__wrapped__ is vLLM's plain function
    assert states == dict.fromkeys(PATCHES, "patched")
    # One registry, each patch decided once: one line.
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [ALL_PATCHED], proc.stderr
    assert warning_lines(proc.stderr) == []


def test_the_thread_script_imports_cleanly_without_the_shim():
    # Without the shim nothing imports typing or dataclasses before the threads
    # race, and Python 3.11 then sometimes hands a thread a half-initialised
    # typing ("no attribute 'ClassVar'"). The shim's activation imports them
    # under vllm's import lock; here they are imported first.
    preload = "import dataclasses, enum, re, typing\n"
    errors, depth = json_lines(run_python(preload + THREADS + WRAP_DEPTH, env={"DSPARK_HOTFIX": "0"}).stdout)
    assert errors == [] and depth == dict.fromkeys(PATCHES, 0)


CHILDREN = """
import json, multiprocessing as mp, os, sys

def child(_):
    import io, contextlib
    {import_all}
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache
    from types import SimpleNamespace
    import dspark_hotfix
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(WRAP_DEPTH, {{}})
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
    spec = DeepseekV4SWACache().get_kv_cache_spec(config)
    states = {{r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}}
    return [os.getpid(), json.loads(out.getvalue()), states, int(spec.kv_quant_mode)]

if __name__ == "__main__":
    if {parent_imports}:
        {import_all}
    with mp.get_context({method!r}).Pool(3) as pool:
        print(json.dumps([os.getpid(), pool.map(child, range(6), chunksize=1)]))
"""


def run_children(tmp_path, method: str, parent_imports: bool):
    script = tmp_path / f"children_{method}.py"
    script.write_text(f"WRAP_DEPTH = {WRAP_DEPTH!r}\n" + CHILDREN.format(
        method=method, parent_imports=parent_imports, import_all=IMPORT_ALL.strip().replace("\n", "; ")))
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
    for _pid, depth, states, quant_mode in results:
        assert depth == dict.fromkeys(PATCHES, 1)
        assert states == dict.fromkeys(PATCHES, "patched")
        assert quant_mode != 0  # the child's SWA spec is corrected
    pids = [re.search(r"\(pid (\d+)\)", line).group(1) for line in summary_lines(proc.stderr)
            if state_of(line) == ALL_PATCHED]  # each process's line
    assert len(pids) == len(set(pids)), "patched twice in one process"
    # A fork after patching inherits the wrapper: only the parent says it patched.
    assert set(pids) == ({str(parent)} if parent_imports else {str(p) for p in children})


RELOAD = """
import importlib, json, sys
importlib.reload(sys.modules[TARGET])
exec(WRAP_DEPTH)
"""


@pytest.mark.parametrize("target", MODULES)
def test_reload_is_a_stated_limit_the_reloaded_target_runs_as_shipped_never_half_wrapped(target):
    # As with wrapt, a reloaded module's functions are new and its hooks have fired: README says so.
    reloaded = {p.name for p in ALL if p.module == target}
    (depth,) = json_lines(run_python(f"TARGET = {target!r}\nWRAP_DEPTH = {WRAP_DEPTH!r}\n{IMPORT_ALL}" + RELOAD).stdout)
    assert depth == {name: 0 if name in reloaded else 1 for name in PATCHES}


@pytest.mark.parametrize("target", MODULES)
def test_after_a_reload_status_says_the_reloaded_targets_patches_failed_not_patched(target):
    # status() reads vLLM's attribute: a reloaded target's function is vLLM's own again, and says so.
    reloaded = {p.name for p in ALL if p.module == target}
    code = f"import importlib, json, sys\n{IMPORT_ALL}importlib.reload(sys.modules[{target!r}])\n{STATES}"
    states = json_lines(run_python(code).stdout)[-1]
    assert states == {name: "failed" if name in reloaded else "patched" for name in PATCHES}
    status = json_lines(run_python(code.replace(STATES, "import dspark_hotfix; print(json.dumps("
                                                        "dspark_hotfix.status()))\n")).stdout)[-1]
    assert status["verdict"] == "problem"
    assert all("no longer the shim's wrapper" in row["detail"] for row in status["patches"] if row["name"] in reloaded)


def test_spawn_children_are_each_patched():
    code = """
import multiprocessing as mp, json

def child(_):  # a tensor-parallel worker: the runner and the model, not (yet) vLLM's KV-cache grouping
    import dspark_hotfix, vllm.v1.worker.gpu.attn_utils, vllm.models.deepseek_v4.attention, os
    import vllm.models.deepseek_v4.nvidia.dspark, vllm.v1.attention.backends.mla.sparse_swa
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
    # vLLM never imports the stop's module (KV-cache grouping) in a worker; the shim does, to judge it as everywhere.
    expected = ["patched"] * len(PATCHES)
    assert all(states == expected for _, states in results)
    assert len(summary_lines(proc.stderr)) >= len({pid for pid, _ in results})
