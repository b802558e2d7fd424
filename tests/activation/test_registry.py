"""The registry's own promises: one registry per process, patches that never
import it, a status() that only reads, and a checkout that exposes nothing else; install() twice, or
after vLLM is imported, patches each target once."""

from __future__ import annotations

import ast
import json
from functools import partial

import pytest

from tests.activation import installs
from tests.activation.children import JUDGED, JUDGED_LINE, UNWRAPPED, USE_LAST, WRAPPED
from tests.child import import_toy_targets
from tests.conftest import (
    REPO,
    STANDIN,
    call_in_child,
    json_lines,
    last_json,
    program,
    run_python,
    state_of,
    summary_lines,
)
from tests.toys import GREETING, TOYS


def test_a_second_activation_waits_for_the_first():
    proc = call_in_child(installs.two_installs_at_once, stand_in_alone=True)
    assert proc.returncode == 0, proc.stderr
    seen, depth, decided = json_lines(proc.stdout)
    # Neither caller returns before every patch is decided: no caller uses vLLM unpatched.
    assert seen == {"vllm-plugin": JUDGED, "api": JUDGED}
    assert len(summary_lines(proc.stderr)) == 1
    assert depth == WRAPPED  # each wrapped once
    # The second caller waits for the first one's decisions instead of making every one again.
    assert decided == sorted(p.name for p in TOYS), decided


def test_no_patch_imports_the_registry():
    # One direction of imports: start-up -> registry -> patches -> corrections.
    for path in sorted((REPO / "dspark_hotfix" / "patches").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else (
                    [f"{node.module}.{a.name}" for a in node.names]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
            )
            assert not [
                n
                for n in names
                if n.split(".")[:2] in (["dspark_hotfix", "registry"], ["dspark_hotfix", "hooks"])
            ], path


def test_status_reads_whatever_happened_to_vllm_since_and_logs_nothing():
    proc = call_in_child(installs.status_after_a_function_is_put_back)
    assert proc.returncode == 0, proc.stderr
    same, states = json.loads(proc.stdout)
    # what status() reads is vLLM's attribute: the function put back is no longer patched
    assert same and states == {**JUDGED, GREETING.name: "failed"}
    assert all(
        line.startswith("INFO ") for line in proc.stderr.splitlines()
    )  # status() itself logs nothing


def test_the_start_up_directory_of_a_checkout_exposes_only_the_shim():
    # `dspark-hotfix path` in a checkout is dspark_hotfix/startup: the package is imported from the
    # checkout without putting it on sys.path, so tests/, bench/, scripts/ and harness/ stay out.
    # The toys come from the checkout, which the child then forgets: what it imports after is the
    # shim's doing.
    code = program(
        USE_LAST,
        partial(forget_checkout, str(REPO)),
        import_toy_targets,
        partial(exposed, str(REPO)),
    )
    startup = REPO / "dspark_hotfix" / "startup"
    found, states, path = last_json(run_python(code, path=(startup, STANDIN), cwd=STANDIN).stdout)
    assert found == {"tests": False, "bench": False, "scripts": False, "harness": False}
    assert states == JUDGED
    assert str(REPO) not in path


def forget_checkout(repo: str) -> None:
    """The checkout off ``sys.path`` again, and the tests' modules forgotten."""
    import sys

    sys.path.remove(repo)
    for name in [m for m in sys.modules if m == "tests" or m.startswith("tests.")]:
        del sys.modules[name]


def exposed(repo: str) -> list[object]:
    """Which of the checkout's other top-level packages this process can import; each patch's state;
    sys.path. (An image's site-packages may hold a ``tests`` of its own: not the checkout's.)"""
    import importlib.util
    import os
    import sys

    import dspark_hotfix

    found = {}
    for name in ("tests", "bench", "scripts", "harness"):
        spec = importlib.util.find_spec(name)
        places = [spec.origin or "", *(spec.submodule_search_locations or ())] if spec else []
        found[name] = any(p.startswith(repo + os.sep) for p in places)
    return [found, {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}, sys.path]


def test_hooks_fire_when_installed_after_vllm_is_imported():
    # The shim's directory is not on PYTHONPATH: no sitecustomize, a late install().
    proc = call_in_child(installs.install_after_vllm, stand_in_alone=True)
    assert proc.returncode == 0, proc.stderr
    depth, rows = json_lines(proc.stdout)[-2:]
    assert depth == WRAPPED  # each target wrapped, once
    assert {n: r["state"] for n, r in rows.items()} == JUDGED
    assert {r["activated_by"] for r in rows.values()} == {"api"}


def test_double_install_is_idempotent():
    proc = call_in_child(installs.install_three_times)
    assert proc.returncode == 0, proc.stderr
    depth, rows = json_lines(proc.stdout)[-2:]
    assert depth == WRAPPED  # each target wrapped, once
    assert len(summary_lines(proc.stderr)) == 1
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}


@pytest.mark.parametrize("install", [False, True], ids=["import again", "import again and install"])
def test_an_interrupt_during_activation_leaves_none_and_the_retry_activates_whole(install):
    proc = call_in_child(installs.activation_interrupted_then_retried, install)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "interrupted"
    rows = last_json(proc.stdout)
    assert {name: row["state"] for name, row in rows.items()} == JUDGED
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [JUDGED_LINE]


def test_a_wrapt_without_the_loader_the_finder_hands_out_is_unusable_and_vllm_imports_as_shipped():
    # The shim's finder would fail every import it hooks: the registry finds the name missing first,
    # says wrapt is not usable, and puts no finder in place.
    proc = call_in_child(installs.wrapt_without_its_chained_loader, stand_in_alone=True)
    assert proc.returncode == 0, proc.stderr
    depth, rows = json_lines(proc.stdout)[-2:]
    assert depth == UNWRAPPED, depth
    assert {r["state"] for r in rows.values()} == {"failed"}, rows
    assert (
        "wrapt is not usable (AttributeError" in proc.stderr
        and "_ImportHookChainedLoader" in proc.stderr
    )
