"""The registry's own promises: one registry per process, patches that never
import it, a status() that only reads, and a checkout that exposes nothing else; install() twice, or
after vLLM is imported, patches each target once."""

from __future__ import annotations

import ast
import json

import pytest

from tests.cases import SWA
from tests.conftest import (
    ALL_PATCHED,
    IMPORT_ALL,
    PATCHES,
    REPO,
    STANDIN,
    STATUS,
    WRAP_DEPTH,
    json_lines,
    last_json,
    run_python,
    state_of,
    summary_lines,
)

RACE = f"""
import json, sys, threading, time
# no sitecustomize: a late install()
{IMPORT_ALL}sys.path.append({str(REPO)!r})
import wrapt
register = wrapt.register_post_import_hook
def slow(hook, name):  # widen the window between the first hook and the last
    time.sleep(0.05)
    return register(hook, name)
wrapt.register_post_import_hook = slow
import dspark_hotfix
barrier = threading.Barrier(2)
seen = {{}}
def install(source):  # vLLM's plugin loader and an application's own call, at once
    barrier.wait()
    dspark_hotfix.install(source=source)
    seen[source] = [r["state"] for r in dspark_hotfix.status()["patches"]]  # what it returns to
threads = [threading.Thread(target=install, args=(s,)) for s in ("vllm-plugin", "api")]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(seen))
exec(WRAP_DEPTH)
"""


def test_a_second_activation_waits_for_the_first():
    proc = run_python(f"WRAP_DEPTH = {WRAP_DEPTH!r}\n" + RACE, path=(STANDIN,))
    seen, depth = json_lines(proc.stdout)
    # Neither caller returns before every hook is registered and decided: no caller uses vLLM unpatched.
    assert seen == {"vllm-plugin": ["patched"] * len(PATCHES), "api": ["patched"] * len(PATCHES)}
    assert len(summary_lines(proc.stderr)) == 1
    assert depth == dict.fromkeys(PATCHES, 1)  # each wrapped once


def test_no_patch_imports_the_registry():
    # One direction of imports: start-up -> registry -> patches -> corrections.
    for path in sorted((REPO / "dspark_hotfix" / "patches").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[:2] in (["dspark_hotfix", "registry"],
                                                                 ["dspark_hotfix", "hooks"])], path


def test_status_reads_whatever_happened_to_vllm_since_and_logs_nothing():
    code = """
import json, dspark_hotfix
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache as S
S.get_kv_cache_spec = S.get_kv_cache_spec.__wrapped__  # somebody else put vLLM's function back
first = dspark_hotfix.status()
print(json.dumps([first == dspark_hotfix.status(), [r["state"] for r in first["patches"]]]))
"""
    proc = run_python(IMPORT_ALL + code)
    same, states = json.loads(proc.stdout)
    # what status() reads is vLLM's attribute: the function put back is no longer patched
    assert same and states == ["failed" if name == SWA.name else "patched" for name in PATCHES]
    assert all(line.startswith("INFO ") for line in proc.stderr.splitlines())  # status() itself logs nothing


def test_the_start_up_directory_of_a_checkout_exposes_only_the_shim():
    # `dspark-hotfix path` in a checkout is dspark_hotfix/startup: the package is imported
    # from the checkout without putting it on sys.path, so tests/, bench/, scripts/ and harness/ stay out.
    code = IMPORT_ALL + """
import importlib, json, sys
import dspark_hotfix
found = {}
for name in ("tests", "bench", "scripts", "harness"):
    try:
        importlib.import_module(name)
        found[name] = True
    except ImportError:
        found[name] = False
print(json.dumps([found, {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}, sys.path]))
"""
    startup = REPO / "dspark_hotfix" / "startup"
    found, states, path = json.loads(run_python(code, path=(startup, STANDIN), cwd=STANDIN).stdout)
    assert found == {"tests": False, "bench": False, "scripts": False, "harness": False}
    assert states == dict.fromkeys(PATCHES, "patched")
    assert str(REPO) not in path


def test_hooks_fire_when_installed_after_vllm_is_imported():
    # The shim's directory is not on PYTHONPATH: no sitecustomize, a late install().
    code = IMPORT_ALL + "import dspark_hotfix; dspark_hotfix.install()\n" + WRAP_DEPTH + STATUS
    proc = run_python(f"import sys; sys.path.append({str(REPO)!r})\n" + code, path=(STANDIN,))
    depth, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert depth == dict.fromkeys(PATCHES, 1)  # each target wrapped, once
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"api"}


def test_double_install_is_idempotent():
    code = IMPORT_ALL + "import dspark_hotfix\nfor _ in range(3): dspark_hotfix.install(source='vllm-plugin')\n"
    proc = run_python(code + WRAP_DEPTH + STATUS)
    depth, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert depth == dict.fromkeys(PATCHES, 1)  # each target wrapped, once
    assert len(summary_lines(proc.stderr)) == 1
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}


INTERRUPTED = """
import json, wrapt
real, calls = wrapt.register_post_import_hook, []
def interrupted(hook, name):  # Ctrl-C lands while the shim registers its third hook
    calls.append(name)
    if len(calls) == 3:
        raise KeyboardInterrupt
    return real(hook, name)
wrapt.register_post_import_hook = interrupted
try:
    import vllm
except KeyboardInterrupt:
    print("interrupted")
wrapt.register_post_import_hook = real
"""


@pytest.mark.parametrize("retry", ["import vllm\n", "import vllm, dspark_hotfix\ndspark_hotfix.install()\n"])
def test_an_interrupt_during_activation_leaves_none_and_the_retry_activates_whole(retry):
    proc = run_python(INTERRUPTED + retry + IMPORT_ALL + STATUS)
    assert proc.stdout.splitlines()[0] == "interrupted"
    rows = last_json(proc.stdout)
    assert {name: row["state"] for name, row in rows.items()} == dict.fromkeys(rows, "patched")  # type: ignore[union-attr]
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [ALL_PATCHED]
