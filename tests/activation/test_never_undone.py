"""An activation that is never undone: an interrupt, a fork, a zipped start-up directory, a probe
that cannot tell, a replaced function, a metrics path that cannot make its gauges. Each leaves every
needed target patched (or says why), and the line, ``status()``, doctor and ``/metrics`` say what
the process does.

The interrupts are made where they land by the child's own wrapt (its ``register_post_import_hook``
raises ``KeyboardInterrupt`` at a chosen call), never by a branch in the shim. Each child is a
function of ``tests/activation/interrupts.py``.
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from functools import partial

import pytest

import dspark_hotfix
from dspark_hotfix import cli
from tests.activation import interrupts
from tests.activation.children import JUDGED, JUDGED_LINE, WRAPPED
from tests.child import environ
from tests.conftest import (
    IMAGE_CUSTOMISATION,
    REPO,
    call_in_child,
    child,
    json_lines,
    program,
    state_of,
    summary_lines,
)
from tests.toys import GREETING, PLANNER


def in_child(function, *args: object) -> subprocess.CompletedProcess[str]:
    """``function`` of tests/activation/interrupts.py in a fresh interpreter, the stand-in alone on
    its path."""
    return call_in_child(function, *args, stand_in_alone=True)


@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_interrupted_plugin_activation_is_whole_when_the_interrupt_arrives(at):
    # vLLM calls a plugin once per process: an activation undone by the interrupt would never be
    # redone, and every target would run as shipped. Each hook is registered before the interrupt
    # goes on.
    proc = in_child(interrupts.plugin_interrupted, at)
    said, depth, rows = json_lines(proc.stdout)
    assert said == ["interrupted"], proc.stderr
    assert depth == WRAPPED  # each target wrapped once: nothing undone, nothing orphaned
    assert {name: row["state"] for name, row in rows.items()} == JUDGED
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE]


def test_a_thread_waiting_for_an_interrupted_activation_sees_it_whole():
    # The main thread's activation is interrupted while a second thread waits for it in install():
    # the waiter returns to a whole activation, not to one that was dropped, and a later import is
    # patched.
    proc = in_child(interrupts.waiter_of_an_interrupted_activation)
    seen, depth = json_lines(proc.stdout)
    assert seen == {"main": "interrupted", "waiter": JUDGED}, proc.stderr
    assert depth == WRAPPED


def test_an_interrupt_in_a_hook_during_its_modules_import_leaves_the_retried_import_patched():
    # wrapt drops a module's hooks as it runs them; an interrupt in the decision ends the import,
    # and its retry must still meet the hook.
    proc = in_child(interrupts.hook_interrupted_during_its_modules_import)
    said, depth, rows = json_lines(proc.stdout)
    assert said == ["interrupted"], proc.stderr
    assert depth == WRAPPED
    assert {name: row["state"] for name, row in rows.items()} == JUDGED


def test_a_forked_child_never_waits_for_an_import_a_thread_of_its_parent_was_making():
    # The planner's module is part-way imported by a thread of the parent when it forks: its lock
    # belongs to a thread the child does not have, so waiting for it would hang the child for good.
    proc = in_child(interrupts.fork_while_a_thread_imports)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (rows,) = json_lines(proc.stdout)
    assert rows[GREETING.name][0] == "patched", rows
    state, detail = rows[PLANNER.name]
    assert state == "pending" and detail == f"waiting for {PLANNER.module}", rows


def test_a_zipped_start_up_directory_or_a_directory_named_sitecustomize_ahead_starts_once(tmp_path):
    # chain() must tell our own file in a zip archive (no file there) and a directory that a module
    # beats from a sitecustomize it shadows: else it imports itself again, about 120 times, to a
    # RecursionError.
    archive = tmp_path / "startup.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        zipped.write(REPO / "dspark_hotfix" / "startup" / "sitecustomize.py", "sitecustomize.py")
    (tmp_path / "empty" / "sitecustomize").mkdir(parents=True)
    image = tmp_path / "image"
    image.mkdir()
    (image / "sitecustomize.py").write_text(IMAGE_CUSTOMISATION)
    code = program(partial(environ, "IMAGE_SITECUSTOMIZE"), sitecustomize_file)
    startup = REPO / "dspark_hotfix" / "startup"
    for path in ((archive, image), (tmp_path / "empty", startup, image)):
        proc = child(code, path=path)
        assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr[-2000:]
        ran, ours = json_lines(proc.stdout)
        assert ran == "ran" and ours.endswith("sitecustomize.py") and str(image) not in ours


def sitecustomize_file() -> str:
    import sys

    return sys.modules["sitecustomize"].__file__ or ""


def test_a_probe_that_cannot_tell_leaves_vllm_as_shipped_and_the_verdict_undecided(shim, capsys):
    # The toy build's greet reads an attribute its probe's stand-in lacks: the probe cannot tell.
    # The patch is not applied as if it were needed, and doctor's gate does not pass.
    build = shim(
        (GREETING,),
        {"vllm/toy_model.py": [('return f"helo, {name}"', 'return f"helo, {name}{self.mark}"')]},
    )
    dspark_hotfix.install("api")
    import vllm.toy_model

    row = build.status()[GREETING.name]
    assert (row["state"], row["needed"]) == ("undecided", None) and "probe inconclusive" in row[
        "detail"
    ], row
    assert not hasattr(vars(vllm.toy_model.Greeter)["greet"], "__wrapped__")
    assert dspark_hotfix.status()["verdict"] == "undecided"
    (warning,) = build.lines("WARNING")
    assert warning.startswith(f"{GREETING.name}: cannot patch ") and warning.endswith(
        "vLLM runs unpatched"
    )
    capsys.readouterr()
    assert cli.main(["status"]) == 1


def test_metrics_agree_with_status_after_an_interrupted_activation_and_a_whole_one():
    # The scrape-time collector reads the one activation: an interrupt never leaves it bound to
    # records that are not the process's.
    pytest.importorskip("prometheus_client")
    proc = in_child(interrupts.metrics_after_an_interrupted_activation_and_a_whole_one)
    ((gauges, states),) = json_lines(proc.stdout)
    assert gauges == states == JUDGED, proc.stderr


def test_a_function_replaced_after_the_line_is_said_by_status_and_metrics_as_the_docs_say(toys):
    # The line follows every decision; a function another tool puts over a patched target later is a
    # reading, not a decision: status, doctor and /metrics say failed, and the docs say where to
    # look.
    dspark_hotfix.install("api")
    import vllm.toy_model

    greet = vars(vllm.toy_model.Greeter)["greet"]
    vllm.toy_model.Greeter.greet = greet.__wrapped__  # another tool's own method, over the wrapper
    assert toys.status()[GREETING.name]["state"] == "failed"
    assert dspark_hotfix.status()["verdict"] == "problem"
    readme = " ".join(
        (REPO / "README.md").read_text().split()
    )  # the sentence as read, across its line breaks
    assert "A function another tool replaces after the line" in readme


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_a_whole_activation_is_patched_as_its_parent_without_activating():
    # vLLM sets its plugins-loaded flag before it calls a plugin, and a forked child inherits it:
    # the child never activates again, so it must run with what its parent did.
    proc = in_child(interrupts.fork_after_a_whole_activation)
    ((depth, states),) = json_lines(proc.stdout)
    assert depth == WRAPPED and states == JUDGED, proc.stderr
