"""An activation that is never undone: an interrupt, a fork, a zipped start-up directory, a probe that cannot
tell, a replaced function, a metrics path that cannot make its gauges. Each leaves every needed target
patched (or says why), and the line, ``status()``, doctor and ``/metrics`` say what the process does.

The interrupts are made where they land by the child's own wrapt (its ``register_post_import_hook`` raises
``KeyboardInterrupt`` at a chosen call), never by a branch in the shim.
"""

from __future__ import annotations

import os
import zipfile

import pytest

import dspark_hotfix
from dspark_hotfix import cli
from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST, WRAPPED
from tests.conftest import (
    IMAGE_CUSTOMISATION,
    REPO,
    STANDIN,
    STATUS,
    WRAP_DEPTH,
    child,
    json_lines,
    state_of,
    summary_lines,
)
from tests.toys import GREETING, IMPORT, PLANNER

# The child's wrapt raises KeyboardInterrupt at its AT-th hook registration, once: a Ctrl-C landing there.
INTERRUPT = """
import threading, wrapt
_register, _calls = wrapt.register_post_import_hook, []
def _interrupted(hook, name):
    _calls.append(name)
    if len(_calls) == AT:
        raise KeyboardInterrupt
    return _register(hook, name)
wrapt.register_post_import_hook = _interrupted
"""


def interrupted_at(at: int) -> str:
    return INTERRUPT.replace("AT", str(at))


@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_interrupted_plugin_activation_is_whole_when_the_interrupt_arrives(at):
    # vLLM calls a plugin once per process: an activation undone by the interrupt would never be redone,
    # and every target would run as shipped. Each hook is registered before the interrupt goes on.
    code = USE_LAST + IMPORT + interrupted_at(at) + """
from dspark_hotfix import plugin
try:
    plugin.register()
    print(json.dumps(["not interrupted"]))
except KeyboardInterrupt:
    print(json.dumps(["interrupted"]))
""" + WRAP_DEPTH + STATUS
    proc = child("import json\n" + code, path=(STANDIN,))
    said, depth, rows = json_lines(proc.stdout)
    assert said == ["interrupted"], proc.stderr
    assert depth == WRAPPED  # each target wrapped once: nothing undone, nothing orphaned
    assert {name: row["state"] for name, row in rows.items()} == JUDGED  # type: ignore[union-attr]
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE]


def test_a_thread_waiting_for_an_interrupted_activation_sees_it_whole():
    # The main thread's activation is interrupted while a second thread waits for it in install(): the
    # waiter returns to a whole activation, not to one that was dropped, and a later import is patched.
    code = USE_LAST + IMPORT + """
import json, sys, threading, time, wrapt
import dspark_hotfix
_register, _calls, inside = wrapt.register_post_import_hook, [], threading.Event()
def _interrupted(hook, name):
    _calls.append(name)
    if len(_calls) == 2 and threading.current_thread() is threading.main_thread():
        inside.set()
        time.sleep(0.3)  # the other thread is in install() by now, waiting for this activation
        raise KeyboardInterrupt
    return _register(hook, name)
wrapt.register_post_import_hook = _interrupted
seen = {}
def other():
    inside.wait(5)
    dspark_hotfix.install("api")
    seen["waiter"] = {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}
thread = threading.Thread(target=other)
thread.start()
try:
    dspark_hotfix.install("vllm-plugin")
except KeyboardInterrupt:
    seen["main"] = "interrupted"
thread.join(10)
print(json.dumps(seen))
""" + WRAP_DEPTH
    proc = child(code, path=(STANDIN,))
    seen, depth = json_lines(proc.stdout)
    assert seen == {"main": "interrupted", "waiter": JUDGED}, proc.stderr
    assert depth == WRAPPED


def test_an_interrupt_in_a_hook_during_its_modules_import_leaves_the_retried_import_patched():
    # wrapt drops a module's hooks as it runs them; an interrupt in the decision ends the import, and its
    # retry must still meet the hook.
    code = USE_LAST + """
import json, dspark_hotfix
from dspark_hotfix import registry
dspark_hotfix.install("api")
real, done = registry._decide, []
def interrupted(activation, record, module):
    if not done:
        done.append(1)
        raise KeyboardInterrupt
    return real(activation, record, module)
registry._decide = interrupted
try:
    import vllm.toy_model
except KeyboardInterrupt:
    print(json.dumps(["interrupted"]))
registry._decide = real
import vllm.toy_model, vllm.toy_planner
""" + WRAP_DEPTH + STATUS
    proc = child(code, path=(STANDIN,))
    said, depth, rows = json_lines(proc.stdout)
    assert said == ["interrupted"], proc.stderr
    assert depth == WRAPPED
    assert {name: row["state"] for name, row in rows.items()} == JUDGED  # type: ignore[union-attr]


FORK_WHILE_IMPORTING = """
import importlib.machinery, json, os, sys, threading, time
sys.path.append(REPO)
import tests.toys; tests.toys.use()
inside, release = threading.Event(), threading.Event()

class _Held:  # holds the planner's import lock in the importing thread until released
    def __init__(self, loader):
        self.loader = loader
    def create_module(self, spec):
        return self.loader.create_module(spec)
    def exec_module(self, module):
        inside.set()
        release.wait(30)
        self.loader.exec_module(module)

class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name != "vllm.toy_planner" or threading.current_thread().name != "importer":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        spec.loader = _Held(spec.loader)
        return spec

sys.meta_path.insert(0, _Finder())
import vllm.toy_model
import dspark_hotfix.registry  # the shim loaded, as in any vLLM process where its plugin is
importer = threading.Thread(target=lambda: __import__("vllm.toy_planner"), name="importer")
importer.start()
inside.wait(5)
pid = os.fork()
if pid == 0:
    import dspark_hotfix
    dspark_hotfix.install("vllm-plugin")  # a forked worker's plugin load: it must not wait for that import
    rows = {r["name"]: [r["state"], r["detail"]] for r in dspark_hotfix.status()["patches"]}
    print(json.dumps(rows), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
release.set()
importer.join()
"""


def test_a_forked_child_never_waits_for_an_import_a_thread_of_its_parent_was_making():
    # The planner's module is part-way imported by a thread of the parent when it forks: its lock belongs
    # to a thread the child does not have, so waiting for it would hang the child for good.
    proc = child(FORK_WHILE_IMPORTING.replace("REPO", repr(str(REPO))), path=(STANDIN,))
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rows,) = json_lines(proc.stdout)
    assert rows[GREETING.name][0] == "patched", rows  # type: ignore[index]
    state, detail = rows[PLANNER.name]  # type: ignore[index]
    assert state == "pending" and "still being imported" in detail and "fork" in detail, rows


def test_a_zipped_start_up_directory_or_a_directory_named_sitecustomize_ahead_starts_once(tmp_path):
    # chain() must tell our own file in a zip archive (no file there) and a directory that a module beats
    # from a sitecustomize it shadows: else it imports itself again, about 120 times, to a RecursionError.
    archive = tmp_path / "startup.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(REPO / "dspark_hotfix" / "startup" / "sitecustomize.py", "sitecustomize.py")
    (tmp_path / "empty" / "sitecustomize").mkdir(parents=True)
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(IMAGE_CUSTOMISATION)
    code = "import os, sys; print(os.environ.get('IMAGE_SITECUSTOMIZE'), sys.modules['sitecustomize'].__file__)"
    startup = REPO / "dspark_hotfix" / "startup"
    for path in ((archive, image), (tmp_path / "empty", startup, image)):
        proc = child(code, path=path)
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr[-2000:]
        ran, ours = proc.stdout.split()
        assert ran == "ran" and ours.endswith("sitecustomize.py") and str(image) not in ours


def test_a_probe_that_cannot_tell_leaves_vllm_as_shipped_and_the_verdict_undecided(shim, capsys):
    # The toy build's greet reads an attribute its probe's stand-in lacks: the probe cannot tell. The patch is
    # not applied as if it were needed, and doctor's gate does not pass.
    build = shim((GREETING,), {"vllm/toy_model.py": [('return f"helo, {name}"', 'return f"helo, {name}{self.mark}"')]})
    dspark_hotfix.install("api")
    import vllm.toy_model

    row = build.status()[GREETING.name]
    assert (row["state"], row["needed"]) == ("undecided", None) and "probe inconclusive" in row["detail"], row
    assert not hasattr(vars(vllm.toy_model.Greeter)["greet"], "__wrapped__")
    assert dspark_hotfix.status()["verdict"] == "undecided"
    (warning,) = build.lines("WARNING")
    assert warning.startswith(f"{GREETING.name}: cannot patch ") and warning.endswith("vLLM runs unpatched")
    capsys.readouterr()
    assert cli.main(["status"]) == 1


def test_metrics_agree_with_status_after_an_interrupted_activation_and_a_whole_one():
    # The scrape-time collector reads the one activation: an interrupt never leaves it bound to records that
    # are not the process's.
    pytest.importorskip("prometheus_client")
    code = USE_LAST + IMPORT + "import prometheus_client\n" + interrupted_at(3) + """
import json, dspark_hotfix
try:
    dspark_hotfix.install("api")
except KeyboardInterrupt:
    pass
dspark_hotfix.install("api")
text = prometheus_client.generate_latest().decode()
gauges = {}
for line in text.splitlines():
    if line.startswith("dspark_hotfix_patch_state{") and line.endswith(" 1.0"):
        labels = dict(part.split("=") for part in line[line.index("{") + 1:line.index("}")].split(","))
        gauges[labels["patch"].strip('"')] = labels["state"].strip('"')
print(json.dumps([gauges, {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}]))
"""
    proc = child(code, path=(STANDIN,))
    (gauges, states), = json_lines(proc.stdout)
    assert gauges == states == JUDGED, proc.stderr


def test_a_function_replaced_after_the_line_is_said_by_status_and_metrics_as_the_docs_say(toys):
    # The line follows every decision; a function another tool puts over a patched target later is a
    # reading, not a decision: status, doctor and /metrics say failed, and the docs say where to look.
    dspark_hotfix.install("api")
    import vllm.toy_model

    greet = vars(vllm.toy_model.Greeter)["greet"]
    vllm.toy_model.Greeter.greet = greet.__wrapped__  # another tool's own method, over the wrapper
    assert toys.status()[GREETING.name]["state"] == "failed"
    assert dspark_hotfix.status()["verdict"] == "problem"
    readme = (REPO / "README.md").read_text()
    assert "A function another tool replaces after the line" in readme


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_a_whole_activation_is_patched_as_its_parent_without_activating():
    # vLLM sets its plugins-loaded flag before it calls a plugin, and a forked child inherits it: the child
    # never activates again, so it must run with what its parent did.
    code = USE_LAST + IMPORT + """
import json, os, dspark_hotfix
dspark_hotfix.install("vllm-plugin")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    import io, contextlib
    depth = io.StringIO()
    with contextlib.redirect_stdout(depth):
        exec(WRAP)
    os.write(w, json.dumps([json.loads(depth.getvalue()),
                            {p["name"]: p["state"] for p in dspark_hotfix.status()["patches"]}]).encode())
    os._exit(0)
os.close(w)
print(os.fdopen(r).read())
os.waitpid(pid, 0)
""".replace("WRAP", repr(WRAP_DEPTH))
    proc = child(code, path=(STANDIN,))
    (depth, states), = json_lines(proc.stdout)
    assert depth == WRAPPED and states == JUDGED, proc.stderr
