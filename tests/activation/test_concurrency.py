"""Activation hazards, end to end in real subprocesses.

- a start-up hang: activation under CPython's global import lock while another
  thread imports wrapt (or the registry);
- a half-done activation: a second caller, or a forked child, going on before
  the hooks exist;
- ``VLLM_PLUGINS`` entries with spaces, which vLLM does not strip;
- doctor naming the wrong chained sitecustomize, and the shim booting twice
  through an alias of its start-up directory;
- warnings that stay short whatever the switches hold.

A child that hangs is ended by ``faulthandler`` after ``HANG_AFTER`` seconds
(exit 1, every thread's traceback on stderr), never by CI's own timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.conftest import (
    ALL_PATCHED,
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    WRAP_DEPTH,
    child,
    clean_env,
    last_json,
    patch_names,
    state_of,
    summary_lines,
    warning_lines,
)

STARTUP = REPO / "dspark_hotfix" / "startup"
HANG_AFTER = 8  # seconds before faulthandler ends a hung child
RUNS = 5
ALL_INSTALLED = dict.fromkeys(patch_names(), "patched")


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


def repeat(code: str, runs: int = RUNS) -> list[subprocess.CompletedProcess[str]]:
    """``code`` in ``runs`` children at once (each ends itself after HANG_AFTER seconds if it hangs)."""
    guarded = f"import faulthandler; faulthandler.dump_traceback_later({HANG_AFTER}, exit=True)\n" + code
    with ThreadPoolExecutor(max_workers=runs) as pool:
        return list(pool.map(lambda _: child(guarded), range(runs)))


def assert_every_run_finishes_patched(procs: list[subprocess.CompletedProcess[str]]) -> None:
    hung = [p for p in procs if p.returncode != 0]
    assert not hung, f"{len(hung)} of {len(procs)} runs hung (or failed); the first one's stderr:\n{hung[0].stderr}"
    for proc in procs:
        assert states(proc) == ALL_INSTALLED, proc.stderr
        assert state_of(summary_lines(proc.stderr)[-1]) == ALL_PATCHED, proc.stderr


# 1. A hang at start-up: activation ran in VllmImportWatcher.find_spec, under the global import lock.

def test_first_deepseek_v4_import_while_another_thread_imports_wrapt_never_hangs():
    # Another library imports wrapt in a second thread while vLLM imports DeepSeek-V4 in the main one:
    # activation imports wrapt too. Under the global import lock it waited for wrapt's module lock, while
    # the thread importing wrapt waited for the global import lock: a hang for good.
    code = slow_import("wrapt", "second") + """
barrier = threading.Barrier(2)

def second():
    barrier.wait()
    import wrapt  # noqa

worker = threading.Thread(target=second, name="second")
worker.start()
barrier.wait()
inside.wait(5)  # the second thread holds wrapt's module lock
import vllm.models.deepseek_v4.attention  # the first DeepSeek-V4 import: activation
worker.join()
""" + IMPORT_ALL + STATUS
    assert_every_run_finishes_patched(repeat(code))


def test_status_called_in_another_thread_during_the_first_deepseek_v4_import_never_hangs():
    # A health check asks status() (which imports the registry) while the model loads.
    code = slow_import("dspark_hotfix.registry", "second") + """
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
import vllm.models.deepseek_v4.attention
worker.join()
assert seen == [2], seen
""" + IMPORT_ALL + STATUS
    assert_every_run_finishes_patched(repeat(code))


# 2. A half-done activation: a second caller went on before the hooks existed.

LATE = f"""
import json, os, sys, threading, time
import vllm.v1.core.kv_cache_utils, vllm.models.deepseek_v4.attention  # no sitecustomize: vLLM is imported, then
# the shim is installed
sys.path.append({str(REPO)!r})
"""


def test_plugin_in_a_second_thread_returns_only_once_the_hooks_exist_and_the_runner_it_imports_is_patched():
    # The main thread activates (slowed down in its import of wrapt); meanwhile vLLM's plugin loader calls
    # register() in another thread, which then imports a target's module (the V2 runner's attn_utils)
    # and uses its target at once: it must find it patched.
    code = LATE + slow_import("wrapt", "MainThread") + """
import dspark_hotfix, dspark_hotfix.plugin
seen = {}

def plugin_loader():
    inside.wait(5)  # the main thread's activation is under way
    dspark_hotfix.plugin.register()
    from vllm.v1.worker.gpu import attn_utils
    seen["wrapped"] = hasattr(attn_utils._reshape_kv_cache, "__wrapped__")
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
    assert seen == {"wrapped": True, "states": ALL_INSTALLED}, proc.stderr


def fork_during_activation(hooks_before_fork: int) -> subprocess.CompletedProcess[str]:
    """A thread activates (every hook registration slowed down); the main thread forks once
    ``hooks_before_fork`` hooks are registered (and fired: every target module is imported). The child
    calls install() itself and writes its status and wrap depths to the parent, which prints them."""
    code = LATE + f"""
import io, contextlib
import vllm.v1.worker.gpu.attn_utils
import wrapt
parent, inside, calls = os.getpid(), threading.Event(), []
register = wrapt.register_post_import_hook

def slow(hook, name):
    calls.append(name)
    if os.getpid() == parent and len(calls) == {hooks_before_fork + 1}:
        inside.set()
        time.sleep(0.3)
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
        dspark_hotfix.install(source="child")
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
    return child(code, path=(STANDIN,))


@pytest.mark.parametrize("hooks_before_fork", [0, 2])
def test_a_fork_during_activation_waits_for_it_and_the_child_inherits_it_whole(hooks_before_fork):
    # The fork waits for the other thread's activation: the child never sees half of one (nor the
    # import locks of a thread it does not have), and its own install() finds the whole one.
    proc = fork_during_activation(hooks_before_fork)
    assert proc.returncode == 0, proc.stderr
    source, rows, depth = last_json(proc.stdout)
    assert source == "api", rows
    assert {name: state for name, (state, _) in rows.items()} == ALL_INSTALLED, rows
    assert depth == dict.fromkeys(patch_names(), 1)


# 3. VLLM_PLUGINS with a space: vLLM does not strip its entries.

SPACED = "other, dspark_hotfix"


def in_venv(venv: dict, *args: str, path: tuple[Path | str, ...] = (STANDIN,), **env: str):
    full = clean_env(**env)
    full["PATH"] = f"{venv['bin']}{os.pathsep}{full.get('PATH', '')}"
    full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    return subprocess.run(list(args), env=full, capture_output=True, text=True, timeout=120, cwd=str(venv["root"]))


def test_doctor_reports_a_plugin_entry_with_a_space_as_a_problem_naming_it(venv):
    proc = in_venv(venv, "dspark-hotfix", "doctor", "--json", VLLM_PLUGINS=SPACED)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stdout
    assert report["plugin"]["visible"] and not report["plugin"]["allowed"]
    assert any(f"VLLM_PLUGINS={SPACED!r}" in p and "' dspark_hotfix'" in p for p in report["problems"]), \
        report["problems"]


def test_the_standins_plugin_loader_does_not_load_a_plugin_entry_with_a_space(venv):
    code = ("import vllm.v1.core.kv_cache_utils, vllm.models.deepseek_v4.attention, vllm.v1.worker.gpu.attn_utils\n"
            "import vllm.plugins; vllm.plugins.load_general_plugins()\n" + STATUS)
    proc = in_venv(venv, str(venv["python"]), "-c", code, VLLM_PLUGINS=SPACED)
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"disabled"}, rows  # as vLLM 0.25.0 does: not loaded
    assert all(r["detail"] == "not installed in this process" for r in rows.values())


# 4. doctor names the sitecustomize that chain() imported at start-up, and ours boots once.

DOCTOR = "from dspark_hotfix import cli; raise SystemExit(cli.main(['doctor', '--json']))"


def ours(file: str | None) -> bool:
    return file is not None and os.path.realpath(file) == os.path.realpath(STARTUP / "sitecustomize.py")


def test_doctor_run_from_a_checkout_root_does_not_name_its_own_root_sitecustomize():
    # The checkout root holds sitecustomize.py (a link to ours); `-m` puts the working directory on sys.path
    # after start-up, when nothing chains any more.
    proc = child(args=("-m", "dspark_hotfix", "doctor", "--json"), path=(STARTUP, STANDIN), cwd=REPO)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any("working directory" in w for w in report["warnings"]), report["warnings"]
    assert str(REPO / "sitecustomize.py") not in json.dumps(report["sitecustomize"])
    chained = report["sitecustomize"]["chained"]
    assert chained is None or not str(chained.get("file")).startswith(str(REPO)), chained


def test_doctor_reports_an_image_sitecustomize_that_fails_at_every_start(tmp_path):
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text("raise RuntimeError('image customisation broke')\n")
    proc = child(DOCTOR, path=(STARTUP, image, STANDIN), cwd=tmp_path)
    report = json.loads(proc.stdout)
    assert "Error in sitecustomize" in proc.stderr  # said at start-up, as site says it
    assert report["sitecustomize"]["ours"]
    assert any("failed" in w and "RuntimeError: image customisation broke" in w for w in report["warnings"]), \
        report["warnings"]


def test_the_start_up_directory_through_a_link_and_its_real_path_boots_ours_once(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(STARTUP, target_is_directory=True)
    code = (IMPORT_ALL + STATUS + "import os, sys; print(json.dumps([os.environ['PYTHONPATH'], "
            "sum(type(f).__name__ == 'VllmImportWatcher' for f in sys.meta_path)]))")
    proc = child(args=("-m", "dspark_hotfix", "run", "--", sys.executable, "-v", "-c", code), path=(link, STANDIN),
                 cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    launched_path, watchers = last_json(proc.stdout)
    entries = launched_path.split(os.pathsep)
    assert [e for e in entries if os.path.realpath(e) == os.path.realpath(STARTUP)] == [str(STARTUP)], entries
    # `python -v` says each module it executes: our sitecustomize once, no second copy chained through the link.
    assert len([line for line in proc.stderr.splitlines() if line.startswith("import 'sitecustomize' ")]) == 1
    assert watchers == 1
    rows = json.loads(proc.stdout.splitlines()[-2])
    assert {name: row["state"] for name, row in rows.items()} == ALL_INSTALLED
    assert len(summary_lines(proc.stderr)) == 1


def test_the_checkout_root_and_the_start_up_directory_both_on_pythonpath_boot_ours_once():
    # `dspark-hotfix run` from an environment whose PYTHONPATH holds the checkout root (a documented way to
    # deploy it): the launcher puts the start-up directory first and keeps the root.
    proc = child(args=("-m", "dspark_hotfix", "run", "--", sys.executable, "-v", "-c", DOCTOR), path=(REPO, STANDIN),
                 cwd=STANDIN)
    report = json.loads(proc.stdout)
    assert not ours((report["sitecustomize"]["chained"] or {}).get("file")), report["sitecustomize"]
    assert len([line for line in proc.stderr.splitlines() if line.startswith("import 'sitecustomize' ")]) == 1


# 5. Bounded warnings, in processes that import the targets.

def test_two_thousand_unknown_patch_names_give_one_short_warning():
    names = ",".join(f"no_such_patch_{i}" for i in range(2000))
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": names})
    assert proc.returncode == 0, proc.stderr[-2000:]
    warnings = warning_lines(proc.stderr)
    assert len(warnings) <= 1 and all(len(w) < 300 for w in warnings), (len(warnings), warnings[:3])
    assert len(proc.stderr) < 1000
    assert states(proc) == ALL_INSTALLED  # a typo never turns the fix off


def test_a_name_both_selected_and_excluded_gives_one_warning():
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX_PATCHES": "kv-view-guard,-kv-view-guard"})
    assert proc.returncode == 0, proc.stderr
    assert len(warning_lines(proc.stderr)) == 1, proc.stderr


def test_a_huge_switch_value_is_not_echoed_whole():
    proc = child(IMPORT_ALL + STATUS, env={"DSPARK_HOTFIX": "x" * 120_000})
    assert proc.returncode == 0, proc.stderr[:500]
    assert len(proc.stderr.encode()) < 400, proc.stderr[:500]
    assert "120000 characters" in proc.stderr
    assert set(states(proc).values()) == {"disabled"}


@pytest.mark.parametrize(("module", "patch"), [("vllm.v1.core.kv_cache_utils", "kv_cache_groups"),
                                               ("vllm.v1.worker.gpu.attn_utils", "kv_view_guard")])
def test_a_module_another_thread_is_part_way_importing_when_the_plugin_registers_is_judged_whole(module, patch):
    # vLLM's plugin loader calls register() while another thread is still executing a target's module:
    # a hook that judged it then found no function and said not_needed; the patch must be judged on the
    # whole module, and applied where needed.
    code = f"""
import json, sys, threading
import vllm  # vLLM first, then its plugin loader: no sitecustomize
sys.path.append({str(REPO)!r})
""" + slow_import(module, "second", pause=1.0) + f"""
import dspark_hotfix, dspark_hotfix.plugin
worker = threading.Thread(target=lambda: __import__({module!r}), name="second")
worker.start()
inside.wait(5)  # the other thread holds the module's import lock, its body not yet run
dspark_hotfix.plugin.register()
worker.join()
""" + IMPORT_ALL + STATUS
    proc = child(code, path=(STANDIN,))
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert rows[patch]["state"] == "patched", rows[patch]
    assert state_of(summary_lines(proc.stderr)[-1]) == ALL_PATCHED


def test_a_child_forked_while_wrapts_lock_is_held_still_imports():
    # wrapt's import finder takes its registration lock on every import, and wrapt does not renew it
    # after a fork: a child forked while another thread held it hung on its first import. The shim,
    # which put that finder there, gives the child a fresh one.
    code = IMPORT_ALL + """
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
