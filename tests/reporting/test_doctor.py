"""``dspark-hotfix doctor`` on the start-up paths it reports: which sitecustomize ran, what it
chained, what failed, and output that stays short whatever the environment holds."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from tests.conftest import REPO, STANDIN, clean_env, copy_of_shim, run_in_env

STARTUP = REPO / "dspark_hotfix" / "startup"


def doctor(cwd: Path, path: tuple[Path | str, ...], *flags: str, **env: str):
    full = clean_env(PYTHONPATH=os.pathsep.join(str(p) for p in path), **env)
    return run_in_env([sys.executable, "-m", "dspark_hotfix", "doctor", *flags], full, cwd=cwd)


def image(root: Path, body: str) -> Path:
    """A directory holding the image's own sitecustomize.py."""
    root.mkdir()
    (root / "sitecustomize.py").write_text(body)
    return root


def test_doctor_names_the_image_sitecustomize_behind_a_second_copy_of_the_shim(tmp_path):
    # Two copies on PYTHONPATH: ours chains the second, which chains the image's; what that copy
    # chained is what start-up ran, and doctor names it, and asks for one copy.
    first, second = copy_of_shim(tmp_path / "first"), copy_of_shim(tmp_path / "second")
    theirs = image(tmp_path / "image", "import sys; sys.stderr.write('image sitecustomize ran\\n')\n")
    path = (first, second, theirs, STANDIN)
    text, js = doctor(tmp_path, path), doctor(tmp_path, path, "--json")
    assert text.returncode == js.returncode == 0, text.stdout
    assert js.stderr.count("image sitecustomize ran") == 1
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("sitecustomize ")]
    assert line == f"sitecustomize ours ({first / 'sitecustomize.py'}), chained {theirs / 'sitecustomize.py'}"
    warnings = json.loads(js.stdout)["warnings"]
    assert [w for w in warnings if "copies" in w] == [
        f"PYTHONPATH has 2 copies of the shim's start-up directory ({first}, {second}): keep one"]


def test_doctor_warns_of_an_image_sitecustomize_that_fails_where_only_the_plugin_activates(tmp_path):
    # No sitecustomize of ours: site imports the image's, which raises; site drops it and goes on.
    broken = image(tmp_path / "image", "raise RuntimeError('image customisation broke')\n")
    package = tmp_path / "package"
    shutil.copytree(REPO / "dspark_hotfix", package / "dspark_hotfix", ignore=shutil.ignore_patterns("__pycache__"))
    proc = doctor(tmp_path, (broken, STANDIN, package), "--json")
    report = json.loads(proc.stdout)
    assert "Error in sitecustomize" in proc.stderr and report["sitecustomize"]["file"] is None
    assert report["sitecustomize"]["failed"] == str(broken / "sitecustomize.py")
    assert f"{broken / 'sitecustomize.py'} is on sys.path but start-up did not import it: it failed, in every " \
           "process (site printed why on stderr)" in report["warnings"], report["warnings"]


def test_doctor_says_nothing_failed_where_no_sitecustomize_is_on_the_path(tmp_path):
    package = tmp_path / "package"
    shutil.copytree(REPO / "dspark_hotfix", package / "dspark_hotfix", ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "sitecustomize.py").write_text("")  # in the working directory: -m puts it on sys.path after start-up
    report = json.loads(doctor(tmp_path, (STANDIN, package), "--json").stdout)
    assert report["sitecustomize"]["failed"] is None and not any("failed" in w for w in report["warnings"])


def test_doctor_output_stays_short_with_hundreds_of_entries_in_every_variable(tmp_path):
    env = {"VLLM_PLUGINS": ",".join(" " * i + "dspark_hotfix" for i in range(1, 301)),
           "DSPARK_HOTFIX_PATCHES": ",".join(f"no_such_patch_{i}" for i in range(2000))}
    path = (STARTUP, STANDIN, *(f"relative/{i}" for i in range(300)))
    text, js = doctor(tmp_path, path, **env), doctor(tmp_path, path, "--json", **env)
    assert text.returncode == js.returncode == 1  # the spaced entries keep vLLM from loading the plugin
    assert len(text.stdout) < 6000 and len(js.stdout) < 8000, (len(text.stdout), len(js.stdout))
    report = json.loads(js.stdout)
    (spaced,) = [p for p in report["problems"] if p.startswith("VLLM_PLUGINS=")]
    assert "'  dspark_hotfix', '   dspark_hotfix', ... (297 more) with the spaces" in spaced
    (relative,) = [w for w in report["warnings"] if "relative" in w]
    assert relative.endswith("'relative/0', 'relative/1', 'relative/2', ... (297 more)")
    assert len(report["pythonpath"]) == 21 and report["pythonpath"][-1] == "... (282 more)"
    assert report["switches"]["patches"].endswith(f"... ({len(env['DSPARK_HOTFIX_PATCHES'])} characters)")
