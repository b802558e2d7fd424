"""Interrupt-proof by construction: each activation path interrupted once at every point of the
shim's work in turn (tests/activation/sweep.py), then the process does what it would do next.
Wherever the interrupt landed, every needed target ends wrapped exactly once, vLLM's functions
answer as patched, and the last line, ``status()``, doctor and ``/metrics`` (multiprocess files and
the live registry) say what a process that was never interrupted says.

The fast tier sweeps the start of each of the shim's functions on the toys; the slow tier (``sweep``
marker, in ``make test``) sweeps every point on the toys, the main thread alone and with a second
thread waiting. The stand-in with the real patches has a file of its own
(test_interrupt_sweep_stand_in.py), so that the slow tier's two workers share the sweeps.
"""

from __future__ import annotations

import pytest

from tests.activation import sweep
from tests.activation.children import CORRECTED, JUDGED, JUDGED_LINE, WRAPPED
from tests.conftest import call_in_child, json_lines

PATHS = [("sitecustomize", kind) for kind in sweep.KINDS] + [
    ("install", "engine_core"),
    ("plugin", "engine_core"),
]
TIMINGS = {"alone": False, "waiting": True}


def swept(
    path: str,
    kind: str,
    waiting: bool,
    every: bool = False,
    modules: list[str] | None = None,
) -> tuple[dict, list, int]:
    proc = call_in_child(
        sweep.sweep,
        path,
        kind,
        waiting,
        every,
        modules,
        stand_in_alone=path != "sitecustomize",
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole, *failed, points = json_lines(proc.stdout)
    return whole, failed, points


def before_install(path: str, failed: list[dict]) -> list[dict]:
    """The plugin path's points before ``install()`` has run a statement (the package's and the
    plugin module's start, then ``register``'s and ``install``'s): nothing of the shim has happened,
    the process is as if vLLM's loader had been interrupted before it called the plugin, and vLLM
    never calls it again. Left as shipped: the shim is not installed there, and every reader says so
    (from ``install``'s ``try`` on, an interrupt finds the activation finished first)."""
    return [
        f
        for f in failed
        if path == "plugin"
        and "rows" in f
        and {r["detail"] for r in f["rows"]} == {"not installed in this process"}
    ]


def assert_whole(whole: dict) -> None:
    """The uninterrupted run: what a patched process says and does."""
    assert whole["depths"] == WRAPPED and whole["calls"] == CORRECTED, whole
    assert (
        whole["status"] == JUDGED
        and whole["line"] == JUDGED_LINE
        and whole["status_line"] == "fixing"
    ), whole
    assert whole["doctor"] == ["fixing", JUDGED], whole
    assert whole["multiprocess"] == whole["single"] == JUDGED, whole


@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize(("path", "kind"), PATHS)
def test_an_interrupt_at_the_start_of_any_of_the_shims_functions_leaves_the_process_patched(
    path, kind, timing
):
    whole, failed, points = swept(path, kind, TIMINGS[timing])
    assert_whole(whole)
    assert points > 50, points  # the sweep reached the shim's work
    failed = [f for f in failed if f not in before_install(path, failed)]
    assert failed == [], f"{len(failed)} of {points} points: {failed[:3]}"


@pytest.mark.sweep
@pytest.mark.parametrize("timing", TIMINGS)
@pytest.mark.parametrize(("path", "kind"), PATHS)
def test_an_interrupt_at_any_point_leaves_the_process_patched(path, kind, timing):
    whole, failed, points = swept(path, kind, TIMINGS[timing], every=True)
    assert_whole(whole)
    failed = [f for f in failed if f not in before_install(path, failed)]
    assert failed == [], f"{len(failed)} of {points} points: {failed[:3]}"
