"""``dspark_hotfix.status()`` and ``status --json``: pending before vLLM is imported, calls and
corrections counted, and exit 3 (with doctor) where vLLM needs nothing. The same records read by
doctor, the hooks and the line are in test_one_truth.py. On the toy patches, in this process."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

import dspark_hotfix
from tests.reporting.inprocess import activate, as_if_started, build, report, startup_module
from tests.toys import GREETING, PLANNER, fixed, module_file

# A build whose greeting is right for one name: the wrapper's calls then count one the correction
# leaves alone.
SOMETIMES_RIGHT = {
    module_file(GREETING): [
        (
            'return f"helo, {name}"',
            'return f"hello, {name}" if name == "right" else f"helo, {name}"',
        )
    ]
}


def test_corrections_and_calls_are_counted(toys, monkeypatch, tmp_path):
    build(tmp_path, monkeypatch, SOMETIMES_RIGHT)
    activate()
    from vllm.toy_model import Greeter
    from vllm.toy_planner import plan

    greetings = [Greeter().greet(name) for name in ("ann", "right", "bob")]
    assert greetings == ["hello, ann", "hello, right", "hello, bob"]
    for _ in range(4):
        plan(SimpleNamespace(compact=False), [1, 2])
    rows = toys.status()
    # every call of a wrapper is counted, the ones whose answer was right unchanged too
    assert (rows[GREETING.name]["calls"], rows[GREETING.name]["corrections"]) == (3, 2)
    assert (rows[PLANNER.name]["calls"], rows[PLANNER.name]["corrections"]) == (
        4,
        0,
    )  # a stop corrects nothing


def test_status_before_vllm_is_imported_says_pending(toys):
    # As a process whose start-up hook watches for vLLM: nothing activated yet.
    watcher = startup_module().VllmImportWatcher("sitecustomize")
    sys.meta_path.insert(0, watcher)  # (the fixture takes it off again)
    rows = dspark_hotfix.status()
    assert rows["activated_by"] == "sitecustomize"
    assert {row["state"] for row in rows["patches"]} == {"pending"}
    # Activated, and vLLM not imported yet: still pending, each row saying what it waits for.
    dspark_hotfix.install("sitecustomize")
    assert {(r["state"], r["detail"]) for r in toys.status().values()} == {
        ("pending", f"waiting for {GREETING.module}"),
        ("pending", f"waiting for {PLANNER.module}"),
    }


@pytest.mark.parametrize("name", ["status", "doctor"])
def test_doctor_and_status_exit_3_where_vllm_needs_nothing(
    toys, monkeypatch, capsys, tmp_path, name
):
    build(tmp_path, monkeypatch, fixed())
    as_if_started(monkeypatch)
    code, out = report(capsys, name)
    assert code == 3, out
    assert out["verdict"] == "removable" and out["schema"] == 2
    assert {p["state"] for p in out["patches"]} == {"not_needed"}
    assert set(out["patches"][0]) == {
        "name",
        "target",
        "state",
        "needed",
        "calls",
        "corrections",
        "detail",
    }


def test_a_tool_whose_wrapper_raises_on_look_up_over_a_patched_target_is_read_as_failed(toys):
    # status() walks __wrapped__ down from vLLM's attribute to find the shim's wrapper; a proxy that
    # raises on that look-up ends the walk: the target is no longer known to call the wrapper, and
    # status() still answers.
    activate()
    from vllm.toy_model import Greeter

    class Raising:
        def __getattr__(self, name):
            raise RuntimeError(f"no {name} here")

    Greeter.greet = Raising()
    assert toys.status()[GREETING.name]["state"] == "failed"
    assert dspark_hotfix.status()["verdict"] == "problem"
