"""The interrupt sweep (test_interrupt_sweep.py, tests/activation/sweep.py) on the stand-in with the
real patches: on every activation path, each point interrupted once, then the process does what it
would do next. Wherever the interrupt landed, the real patches end applied as in a process never
interrupted, and every reader says so. ``make test`` sweeps the start of each of the shim's
functions here (``sweep``); every point (``sweep_long``, ``make sweep``) is about 3,300 points a
path (3,324 on the start-up hook's engine-core path), each a forked process: several times the toys'
sweep.
"""

from __future__ import annotations

import pytest

from dspark_hotfix import patches
from tests.activation.test_interrupt_sweep import PATHS, before_install, swept


@pytest.mark.sweep
@pytest.mark.parametrize(("path", "kind"), PATHS)
def test_on_the_stand_in_an_interrupt_at_the_start_of_any_shim_function_leaves_the_patches_applied(
    path, kind
):
    assert_stand_in(path, *swept(path, kind, False, modules=stand_in_modules()))


@pytest.mark.sweep_long
@pytest.mark.parametrize(("path", "kind"), PATHS)
def test_on_the_stand_in_an_interrupt_at_any_point_leaves_the_real_patches_applied(path, kind):
    assert_stand_in(path, *swept(path, kind, False, every=True, modules=stand_in_modules()))


def stand_in_modules() -> list[str]:
    """The real patches' targets as an engine imports them: the model's through its package (vLLM's
    model registry imports ``vllm.models.deepseek_v4``, whose ``__init__`` imports the DSpark draft:
    a retried import of the draft's module alone would meet that cycle half-done, with or without
    the shim), then the others, each once, those judged everywhere last (a worker never imports
    them)."""
    package = "vllm.models.deepseek_v4"
    targets = dict.fromkeys(p.module for p in sorted(patches.ALL, key=lambda p: p.everywhere))
    return [package, *(m for m in targets if not m.startswith(f"{package}."))]


def assert_stand_in(path: str, whole: dict, failed: list, points: int) -> None:
    assert whole["status_line"] in ("fixing", "guarding") and whole["line"].startswith(
        whole["status_line"]
    ), whole
    assert set(whole["status"].values()) <= {"patched", "not_needed"}, whole
    assert whole["doctor"] == [whole["status_line"], whole["status"]], whole
    assert whole["multiprocess"] == whole["single"] == whole["status"], whole
    failed = [f for f in failed if f not in before_install(path, failed)]
    assert failed == [], f"{len(failed)} of {points} points: {failed[:3]}"
