"""Activation racing other threads and forks, end to end in real subprocesses.

- a start-up hang: activation under CPython's global import lock while another
  thread imports wrapt (or the registry);
- a half-done activation: a second caller, or a forked child, going on before
  the hooks exist; the plugin registering while another thread is part way
  through an import.

A child that hangs is ended by ``faulthandler`` after ``HANG_AFTER`` seconds
(exit 1, every thread's traceback on stderr), never by CI's own timeout.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST, WRAP_DEPTH, WRAPPED
from tests.conftest import (
    CHILD_TIMEOUT,
    STANDIN,
    STATUS,
    child,
    last_json,
    state_of,
    summary_lines,
)
from tests.toys import GREETING, IMPORT, PLANNER, USE

HANG_AFTER = 8  # seconds before faulthandler ends a hung child


def states(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(proc.stdout).items()}


def slow_import(module: str, thread: str, pause: float = 0.5) -> str:
    """Code that slows the import of ``module`` in the thread named ``thread``: that thread holds the
    module's import lock for ``pause`` seconds, and sets the Event ``inside`` when it starts to."""
    return f"""
import importlib.machinery, sys, threading, time
inside = threading.Event()

class _SlowLoader:
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = module.__spec__.loader = self.loader
        inside.set()
        time.sleep({pause})
        self.loader.exec_module(module)

class _SlowImport:
    def find_spec(self, name, path=None, target=None):
        if name != {module!r} or threading.current_thread().name != {thread!r}:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _SlowLoader(spec.loader)
        return spec

sys.meta_path.insert(0, _SlowImport())
"""


def guarded(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a child that ends itself after HANG_AFTER seconds if it hangs. One child is enough:
    slow_import holds the module lock for the whole window, so the two threads always meet in it."""
    return child(f"import faulthandler; faulthandler.dump_traceback_later({HANG_AFTER}, exit=True)\n" + code)


def assert_finishes_patched(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"the child hung (or failed); its stderr:\n{proc.stderr}"
    assert states(proc) == JUDGED, proc.stderr
    assert state_of(summary_lines(proc.stderr)[-1]) == JUDGED_LINE, proc.stderr


# 1. A hang at start-up: activation ran in VllmImportWatcher.find_spec, under the global import lock.

def test_first_vllm_import_while_another_thread_imports_wrapt_never_hangs():
    # Another library imports wrapt in a second thread while vLLM's first module is imported in the main one:
    # activation imports wrapt too. Under the global import lock it waited for wrapt's module lock, while
    # the thread importing wrapt waited for the global import lock: a hang for good.
    code = USE + slow_import("wrapt", "second") + """
barrier = threading.Barrier(2)

def second():
    barrier.wait()
    import wrapt  # noqa

worker = threading.Thread(target=second, name="second")
worker.start()
barrier.wait()
inside.wait(5)  # the second thread holds wrapt's module lock
import vllm.toy_model  # the first import of vLLM: activation
worker.join()
""" + IMPORT + STATUS
    assert_finishes_patched(guarded(code))


def test_status_called_in_another_thread_during_the_first_vllm_import_never_hangs():
    # A health check asks status() (which imports the registry) while the model loads.
    code = USE + slow_import("dspark_hotfix.registry", "second") + """
import dspark_hotfix
barrier = threading.Barrier(2)
seen = []

def second():
    barrier.wait()
    seen.append(dspark_hotfix.status()["schema"])

worker = threading.Thread(target=second, name="second")
worker.start()
barrier.wait()
inside.wait(5)  # the second thread holds the registry's module lock
import vllm.toy_model
worker.join()
assert seen == [2], seen
""" + IMPORT + STATUS
    assert_finishes_patched(guarded(code))


# 2. A half-done activation: a second caller went on before the hooks existed.

LATE = """
import json, os, sys, threading, time
import vllm.toy_planner  # no sitecustomize: vLLM is imported, then the shim is installed
""" + USE_LAST


def test_plugin_in_a_second_thread_returns_only_once_the_hooks_exist_and_the_module_it_imports_is_patched():
    # The main thread activates (slowed down in its import of wrapt); meanwhile vLLM's plugin loader calls
    # register() in another thread, which then imports a target's module (the toy greeting's)
    # and uses its target at once: it must find it patched.
    code = LATE + slow_import("wrapt", "MainThread") + """
import dspark_hotfix, dspark_hotfix.plugin
seen = {}

def plugin_loader():
    inside.wait(5)  # the main thread's activation is under way
    dspark_hotfix.plugin.register()
    from vllm import toy_model
    seen["wrapped"] = hasattr(toy_model.Greeter.greet, "__wrapped__")
    seen["states"] = {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}

worker = threading.Thread(target=plugin_loader)
worker.start()
dspark_hotfix.install()
worker.join()
print(json.dumps(seen))
"""
    proc = child(code, path=(STANDIN,))
    assert proc.returncode == 0, proc.stderr
    seen = last_json(proc.stdout)
    assert seen == {"wrapped": True, "states": JUDGED}, proc.stderr


def fork_during_activation(hooks_before_fork: int, stall: float = 0.3) -> subprocess.CompletedProcess[str]:
    """A thread activates (every hook registration slowed down); the main thread forks once
    ``hooks_before_fork`` hooks are registered (and fired: every target module is imported). The child
    calls install() itself and writes its status and wrap depths to the parent, which prints them."""
    code = LATE + f"""
import io, contextlib
import vllm.toy_model
import wrapt
parent, inside, calls = os.getpid(), threading.Event(), []
register = wrapt.register_post_import_hook

def slow(hook, name):
    calls.append(name)
    if os.getpid() == parent and len(calls) == {hooks_before_fork + 1}:
        inside.set()
        time.sleep({stall})
    return register(hook, name)

wrapt.register_post_import_hook = slow
import dspark_hotfix, dspark_hotfix.registry
activating = threading.Thread(target=dspark_hotfix.install, kwargs={{"source": "api"}})
activating.start()
inside.wait(5)
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        s = dspark_hotfix.status()
        depth = io.StringIO()
        with contextlib.redirect_stdout(depth):
            exec({WRAP_DEPTH!r})
        report = [s["activated_by"], {{p["name"]: [p["state"], p["detail"]] for p in s["patches"]}},
                  json.loads(depth.getvalue())]
        os.write(w, json.dumps(report).encode())
    finally:
        os._exit(0)
os.close(w)
with os.fdopen(r) as f:
    report = f.read()
os.waitpid(pid, 0)
activating.join()
print(report)
"""
    return child(code, path=(STANDIN,), timeout=CHILD_TIMEOUT + stall)


@pytest.mark.parametrize("hooks_before_fork", [0, 2])
def test_a_child_forked_during_another_threads_activation_completes_it_whole(hooks_before_fork):
    # The fork does not wait: the child keeps what its parent had done (nothing is ever undone) and
    # completes the rest itself. Each target wrapped once, every patch judged, under the parent's source.
    proc = fork_during_activation(hooks_before_fork)
    assert proc.returncode == 0, proc.stderr
    source, rows, depth = last_json(proc.stdout)
    assert source == "api", rows
    assert {name: state for name, (state, _) in rows.items()} == JUDGED, rows
    assert depth == WRAPPED


@pytest.mark.parametrize(("module", "patch"), [(p.module, p.name) for p in (PLANNER, GREETING)])
def test_a_module_another_thread_is_part_way_importing_when_the_plugin_registers_is_judged_whole(module, patch):
    # vLLM's plugin loader calls register() while another thread is still executing a target's module:
    # a hook that judged it then found no function and said not_needed; the patch must be judged on the
    # whole module, and applied where needed.
    code = """
import json, sys, threading
import vllm  # vLLM first, then its plugin loader: no sitecustomize
""" + USE_LAST + slow_import(module, "second", pause=1.0) + f"""
import dspark_hotfix, dspark_hotfix.plugin
worker = threading.Thread(target=lambda: __import__({module!r}), name="second")
worker.start()
inside.wait(5)  # the other thread holds the module's import lock, its body not yet run
dspark_hotfix.plugin.register()
worker.join()
""" + IMPORT + STATUS
    proc = child(code, path=(STANDIN,))
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert rows[patch]["state"] == "patched", rows[patch]
    assert state_of(summary_lines(proc.stderr)[-1]) == JUDGED_LINE


def test_a_child_forked_while_wrapts_lock_is_held_still_imports():
    # wrapt's import finder takes its registration lock on every import, and wrapt does not renew it
    # after a fork: a child forked while another thread held it hung on its first import. The shim,
    # which put that finder there, gives the child a fresh one.
    code = USE + IMPORT + """
import os, threading, time, wrapt.importer
held = threading.Event()

def hold():
    with wrapt.importer._post_import_hooks_lock:
        held.set()
        time.sleep(2)

threading.Thread(target=hold).start()
held.wait(5)
pid = os.fork()
if pid == 0:
    import xml.dom.minidom  # noqa: F401  (any module not imported yet)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""
    proc = child(f"import faulthandler; faulthandler.dump_traceback_later({HANG_AFTER}, exit=True)\n" + code)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == "child 0", proc.stderr
