"""Checks that run inside a venv with a real vLLM release, the shim on PYTHONPATH: every patch of
``dspark_hotfix.patches.ALL``, in the state this release needs.

Run only by ``tests/real_vllm/runs.py`` (``released``) with the venv's own pytest, beside
``check_layout.py``. ``EXPECTED_STATES`` is each patch's state here (JSON, from the patches'
declarations: their ``RELEASED``); ``ANSWERS_OUT`` is where the status rows go for each patch's own
real-vLLM tests (tests/patches/test_<name>.py).
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import dspark_hotfix
from dspark_hotfix.patches import ALL, Patch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import grid  # noqa: E402

EXPECTED: dict[str, str] = json.loads(os.environ["EXPECTED_STATES"])
NEEDED = [p.name for p in ALL if EXPECTED[p.name] == "patched"]
# Every target module this release has, as a server imports them: the patches judged on import are
# judged here.
MODULES = tuple(
    m for m in dict.fromkeys(p.module for p in ALL) if importlib.util.find_spec(m) is not None
)
IMPORTS = "".join(f"import {module}\n" for module in MODULES)
for _module in MODULES:
    importlib.import_module(_module)


def rows() -> dict[str, dict]:
    return {row["name"]: row for row in dspark_hotfix.status()["patches"]}


def vllm_function(patch: Patch) -> tuple[Any, Any]:
    """The class (or module) that holds the patch's target, and what it holds under the target's
    name (None where this release has neither)."""
    *owners, name = patch.qualname.split(".")
    owner: Any = sys.modules.get(patch.module)  # None: a module this release lacks
    for part in owners:
        owner = getattr(owner, part, None)
    return owner, None if owner is None else vars(owner).get(name)


def test_shim_is_active_through_pythonpath():
    assert dspark_hotfix.status()["activated_by"] == "sitecustomize"


def test_the_declared_states_cover_every_patch():
    assert set(EXPECTED) == {p.name for p in ALL} == set(rows())


@pytest.mark.parametrize("patch", ALL, ids=[p.name for p in ALL])
def test_each_patch_is_applied_only_where_this_release_needs_it(patch):
    row = rows()[patch.name]
    assert row["state"] == EXPECTED[patch.name], row
    owner, function = vllm_function(patch)
    if function is None:  # gone from this release: the patch said why it is not needed
        assert row["state"] == "not_needed", row
        return
    assert hasattr(function, "__wrapped__") == (row["state"] == "patched"), row
    if row["state"] == "not_needed":
        # The hook ran on the real import, found the target, and called vLLM's own function to
        # decide.
        assert row["detail"].startswith("not needed (vLLM"), row
        where = (
            f"{owner.__module__}.{owner.__qualname__}" if inspect.isclass(owner) else owner.__name__
        )
        assert row["target"] == f"{where}.{patch.qualname.rpartition('.')[2]}"
        assert inspect.isfunction(function), "vLLM's function must not be wrapped"


def test_grid_results_are_identical_with_the_shim_off():
    with_shim = json.loads(json.dumps(grid.results()))
    env = {k: v for k, v in os.environ.items()}
    env["DSPARK_HOTFIX"] = "0"
    proc = subprocess.run(
        [sys.executable, str(HERE / "grid.py")], env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    without = json.loads(proc.stdout.strip().splitlines()[-1])
    assert with_shim == without
    assert len(with_shim) == len(grid.DTYPES) * len(grid.BLOCKS) * (len(grid.COMPRESS) + 1) + len(
        grid.NAMES
    )
    assert all(row["corrections"] == 0 for row in rows().values())


def _run(code_or_args, env_extra: dict, pythonpath: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_HOTFIX")}
    env.update(env_extra, PYTHONPATH=pythonpath)
    command = [
        sys.executable,
        *(["-c", code_or_args] if isinstance(code_or_args, str) else code_or_args),
    ]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_real_vllm_plugin_loader_activates_the_shim(tmp_path):
    # The installed wheel's metadata, reduced to what importlib.metadata reads,
    # next to the package: the shim reachable only through vLLM's plugin loader.
    (tmp_path / "dspark_hotfix").symlink_to(Path(dspark_hotfix.__file__).parent)
    info = tmp_path / "dspark_hotfix-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dspark-hotfix\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\ndspark_hotfix = dspark_hotfix.plugin:register\n"
    )
    code = (
        "import json, sys\nfrom vllm.plugins import load_general_plugins\nload_general_plugins()\n"
        f"{IMPORTS}import dspark_hotfix\n"
        "print(json.dumps(dspark_hotfix.status()))"
    )
    proc = _run(code, {}, str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    status = json.loads(proc.stdout.strip().splitlines()[-1])
    assert status["activated_by"] == "vllm-plugin"
    assert {r["name"]: r["state"] for r in status["patches"]} == EXPECTED
    assert "sitecustomize" not in proc.stderr  # the start-up path was not in play


def test_doctor_on_real_vllm_says_what_this_release_needs(tmp_path):
    proc = _run(["-m", "dspark_hotfix", "doctor", "--json"], {}, os.environ["PYTHONPATH"])
    report = json.loads(proc.stdout)
    # Exit 3 only where the shim is a no-op and removable; 0 where a patch is still needed.
    assert proc.returncode == (0 if NEEDED else 3), proc.stdout
    corrects = any(not p.stops for p in ALL if p.name in NEEDED)
    assert report["verdict"] == ("fixing" if corrects else "guarding" if NEEDED else "removable")
    assert report["sitecustomize"]["ours"]
    assert {p["name"]: p["state"] for p in report["patches"]} == EXPECTED


def test_one_line_says_the_shim_is_removable_only_where_nothing_is_needed():
    # The patches judged everywhere first, as an engine core imports KV-cache grouping before the
    # model.
    first = sorted(MODULES, key=lambda m: not any(p.everywhere for p in ALL if p.module == m))
    proc = _run("".join(f"import {module}\n" for module in first), {}, os.environ["PYTHONPATH"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # One line, which says what this release needs. A probe that runs vLLM's code keeps vLLM's
    # warnings about it out (the hybrid-off conversion warns that the hybrid manager is off).
    assert "Hybrid KV cache manager is disabled" not in proc.stderr + proc.stdout
    ours = [line for line in (proc.stderr + proc.stdout).splitlines() if "dspark_hotfix" in line]
    assert len(ours) == 1 and ours[0].startswith("INFO "), ours
    rest = len(ALL) - len(NEEDED)
    if NEEDED:
        corrects = any(not p.stops for p in ALL if p.name in NEEDED)
        said = (
            f"{'fixing' if corrects else 'guarding'}: {len(NEEDED)} patched ({', '.join(NEEDED)})"
        )
        assert ours[0].endswith(
            f" via sitecustomize: {said}" + (f", {rest} not_needed" if rest else "")
        ), ours
    else:
        assert ours[0].endswith(f" via sitecustomize: removable: {rest} not_needed"), ours


def test_the_status_rows_are_recorded_for_each_patchs_own_tests():
    out = os.environ.get("ANSWERS_OUT")
    if out:
        import vllm

        Path(out).write_text(
            json.dumps({"vllm": vllm.__version__, "status": rows()}, indent=1) + "\n"
        )
    assert set(rows()) == set(EXPECTED)
