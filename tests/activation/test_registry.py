"""The registry's own promises: one registry per process, patches that never
import it, a status() that only reads, and a checkout that exposes nothing else; install() twice, or
after vLLM is imported, patches each target once."""

from __future__ import annotations

import ast
import json

import pytest

from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST, WRAP_DEPTH, WRAPPED
from tests.conftest import (
    REPO,
    STANDIN,
    STATUS,
    json_lines,
    last_json,
    run_python,
    state_of,
    summary_lines,
)
from tests.toys import GREETING, IMPORT, USE

RACE = f"""
import json, sys, threading, time
# no sitecustomize: a late install()
{IMPORT}{USE_LAST}
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
    seen[source] = {{r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}}  # what it returns to
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
    assert seen == {"vllm-plugin": JUDGED, "api": JUDGED}
    assert len(summary_lines(proc.stderr)) == 1
    assert depth == WRAPPED  # each wrapped once


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
from vllm.toy_model import Greeter
Greeter.greet = Greeter.greet.__wrapped__  # somebody else put the toy build's function back
first = dspark_hotfix.status()
print(json.dumps([first == dspark_hotfix.status(), {r["name"]: r["state"] for r in first["patches"]}]))
"""
    proc = run_python(USE + IMPORT + code)
    same, states = json.loads(proc.stdout)
    # what status() reads is vLLM's attribute: the function put back is no longer patched
    assert same and states == {**JUDGED, GREETING.name: "failed"}
    assert all(line.startswith("INFO ") for line in proc.stderr.splitlines())  # status() itself logs nothing


def test_the_start_up_directory_of_a_checkout_exposes_only_the_shim():
    # `dspark-hotfix path` in a checkout is dspark_hotfix/startup: the package is imported
    # from the checkout without putting it on sys.path, so tests/, bench/, scripts/ and harness/ stay out.
    # The toys come from the checkout, which the child then forgets: what it imports after is the shim's doing.
    code = f"import sys; sys.path.insert(0, {str(REPO)!r})\n" + USE + """
sys.path.remove(REPO)
for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
    del sys.modules[name]
""".replace("REPO", repr(str(REPO))) + IMPORT + """
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
    assert states == JUDGED
    assert str(REPO) not in path


def test_hooks_fire_when_installed_after_vllm_is_imported():
    # The shim's directory is not on PYTHONPATH: no sitecustomize, a late install().
    code = IMPORT + USE_LAST + "import dspark_hotfix; dspark_hotfix.install()\n" + WRAP_DEPTH + STATUS
    proc = run_python(code, path=(STANDIN,))
    depth, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert depth == WRAPPED  # each target wrapped, once
    assert {n: r["state"] for n, r in rows.items()} == JUDGED
    assert {r["activated_by"] for r in rows.values()} == {"api"}


def test_double_install_is_idempotent():
    code = USE + IMPORT + "import dspark_hotfix\nfor _ in range(3): dspark_hotfix.install(source='vllm-plugin')\n"
    proc = run_python(code + WRAP_DEPTH + STATUS)
    depth, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert depth == WRAPPED  # each target wrapped, once
    assert len(summary_lines(proc.stderr)) == 1
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}


INTERRUPTED = USE + """
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
    proc = run_python(INTERRUPTED + retry + IMPORT + STATUS)
    assert proc.stdout.splitlines()[0] == "interrupted"
    rows = last_json(proc.stdout)
    assert {name: row["state"] for name, row in rows.items()} == JUDGED  # type: ignore[union-attr]
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE]
