"""The package's line limits, as ``scripts/loc`` counts them on code laid out by ``ruff format``."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from importlib.machinery import SourceFileLoader
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def loc_script():
    # A script without .py: loaded by its path.
    loader = SourceFileLoader("loc", str(REPO / "scripts" / "loc"))
    spec = importlib.util.spec_from_loader("loc", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_package_stays_within_its_limits():
    loc = loc_script()
    found = loc.limits(loc.counts(str(REPO)))
    assert [limit for _, _, limit in found] == [1236, 590, 370]
    assert all(count <= limit for _, count, limit in found), found


def test_a_new_patch_module_is_counted_apart_and_the_command_line_outside_the_runtime():
    loc = loc_script()
    modules = loc.counts(str(REPO))
    runtime = loc.limits(modules)[0][1]
    with_new = loc.limits({**modules, "patches/new_patch.py": 500, "cli.py": modules["cli.py"] + 1})
    assert with_new[0][1] == runtime
    assert with_new[2][1] == loc.limits(modules)[2][1] + 1
    # A patch the limit was set on still counts in the runtime (fp8_ds_mla.py: shared, never
    # removed with one patch).
    grown = loc.limits({**modules, "patches/fp8_ds_mla.py": modules["registry.py"]})
    assert grown[0][1] == runtime - modules["patches/fp8_ds_mla.py"] + modules["registry.py"]


def test_the_script_exits_1_and_names_the_limit_a_count_is_over(tmp_path):
    loc = loc_script()
    machinery = loc.limits(loc.counts(str(REPO)))[1][1]
    shutil.copytree(REPO / "dspark_hotfix", tmp_path / "dspark_hotfix")
    registry = tmp_path / "dspark_hotfix" / "registry.py"
    padding = "".join(f"PADDING_{i} = {i}\n" for i in range(loc.MACHINERY_LIMIT - machinery + 1))
    registry.write_text(registry.read_text() + padding)
    script = [sys.executable, str(REPO / "scripts" / "loc")]
    assert subprocess.run([*script, str(REPO)], capture_output=True).returncode == 0
    over = subprocess.run([*script, str(tmp_path)], capture_output=True, text=True)
    assert over.returncode == 1
    assert "machinery (limit 590, OVER)" in over.stdout, over.stdout
