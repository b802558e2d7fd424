"""The wheel, installed into a fresh venv: both activation paths, doctor, Dockerfile.

The way autowrapt tests itself: build the wheel, install it where nothing else
of ours is, and run real subprocesses from there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_hotfix import __version__
from tests.conftest import (
    ALL_PATCHED,
    IMAGE_CUSTOMISATION,
    STANDIN,
    STATUS,
    last_json,
    run_in_venv,
    startup_dir,
    state_of,
    summary_lines,
)

TARGETS = "import vllm.v1.core.kv_cache_utils, vllm.models.deepseek_v4.attention, vllm.v1.worker.gpu.attn_utils\n"
PLUGINS = "import vllm.plugins; vllm.plugins.load_general_plugins()\n"


def test_a_fresh_install_gets_the_newest_wrapt_2_while_the_suite_runs_the_dockerfiles(venv):
    # Both ends of the supported range are exercised: this venv (every test in this
    # file) gets pip's choice, the newest 2.x; the rest of the suite runs on the wrapt
    # the Dockerfile installs where an image has none.
    import re

    from tests.conftest import REPO

    fresh = run_in_venv(venv, "import wrapt; print(wrapt.__version__)").stdout.strip()
    assert fresh.startswith("2."), fresh
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert pinned and f"wrapt=={pinned[1]}" in (REPO / "requirements-dev.txt").read_text().split()
    import wrapt

    assert wrapt.__version__ == pinned[1]


def test_installing_the_wheel_leaves_the_images_sitecustomize_alone(venv):
    assert (venv["purelib"] / "sitecustomize.py").read_text() == IMAGE_CUSTOMISATION


def test_path_command_names_a_directory_holding_only_our_sitecustomize(venv):
    directory = startup_dir(venv)
    assert sorted(p.name for p in directory.iterdir() if p.name != "__pycache__") == ["sitecustomize.py"]
    assert directory.is_relative_to(venv["purelib"])


def test_sitecustomize_path_from_the_wheel_patches_and_chains_the_image_one(venv):
    proc = run_in_venv(venv, TARGETS + STATUS + "\nimport os; print(os.environ.get('IMAGE_SITECUSTOMIZE'))",
               path=(startup_dir(venv), STANDIN))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.splitlines()[-2])
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    assert proc.stdout.splitlines()[-1] == "ran"


def test_plugin_entry_point_patches_when_vllm_loads_plugins(venv):
    proc = run_in_venv(venv, TARGETS + PLUGINS + STATUS, path=(STANDIN,))
    assert proc.returncode == 0, proc.stderr
    rows = last_json(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"vllm-plugin"}


def test_plugin_loaded_before_the_targets_patches_them_on_import(venv):
    proc = run_in_venv(venv, "import vllm\n" + PLUGINS + TARGETS + STATUS, path=(STANDIN,))
    assert {r["state"] for r in last_json(proc.stdout).values()} == {"patched"}, proc.stderr


@pytest.mark.parametrize(("env", "why"), [({"VLLM_PLUGINS": "someone_else"}, "not installed"),
                                          ({"DSPARK_HOTFIX": "0"}, "DSPARK_HOTFIX='0' turns the shim off")])
def test_plugin_honours_vllm_plugins_and_the_switch(venv, env, why):
    proc = run_in_venv(venv, TARGETS + PLUGINS + STATUS, path=(STANDIN,), **env)
    rows = last_json(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert all(why in r["detail"] for r in rows.values())
    assert proc.stderr == ""


def test_both_paths_share_one_installer(venv):
    proc = run_in_venv(venv, TARGETS + PLUGINS + STATUS, path=(startup_dir(venv), STANDIN))
    rows = last_json(proc.stdout)
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    assert [state_of(line) for line in summary_lines(proc.stderr)][-1] == ALL_PATCHED  # one activation's lines
    assert len({line.split(" via ")[1] for line in summary_lines(proc.stderr)}) == len(summary_lines(proc.stderr))


def test_doctor_json_against_the_standin_says_needed_and_active(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=(startup_dir(venv), STANDIN))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert (report["schema"], report["verdict"], report["exit_code"]) == (2, "fixing", 0)
    assert report["sitecustomize"]["ours"] and report["plugin"]["visible"]
    assert report["sitecustomize"]["chained"]["file"].startswith(str(venv["purelib"]))
    assert {p["name"]: p["needed"] for p in report["patches"]} == {
        "remap_dspark_name": True, "attention_kv_cache_spec": True, "swa_kv_cache_spec": True,
        "kv_cache_groups": True, "draft_load_coverage": True, "kv_view_guard": True,
    }
    swa = next(p for p in report["patches"] if p["name"] == "swa_kv_cache_spec")
    assert swa["detail"] == "needed (vLLM returns 512 bytes/token for fp8_ds_mla; shim gives 584)"


def test_doctor_fails_when_the_fix_is_needed_but_switched_off(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor"), path=(startup_dir(venv), STANDIN), DSPARK_HOTFIX="0")
    assert proc.returncode == 1
    assert ("PROBLEM       remap_dspark_name, attention_kv_cache_spec, swa_kv_cache_spec, kv_cache_groups, "
            "draft_load_coverage, kv_view_guard needed but DSPARK_HOTFIX='0' turns the shim off") in proc.stdout


def test_doctor_fails_without_any_activation_path(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=(STANDIN,), VLLM_PLUGINS="")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    assert any(p.startswith("no activation path") for p in report["problems"])


def test_doctor_fails_without_vllm(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"))
    assert proc.returncode == 1
    assert f"vLLM cannot be imported by {venv['python']}" in json.loads(proc.stdout)["problems"][0]


def test_version_flag_prints_the_version(venv):
    import dspark_hotfix

    proc = run_in_venv(venv, args=("dspark-hotfix", "--version"))
    assert (proc.returncode, proc.stdout.strip()) == (0, f"dspark-hotfix {dspark_hotfix.__version__}")


def test_run_patches_the_command_it_execs_from_a_venv_with_only_the_wheel(venv):
    # The launcher puts the start-up directory first on PYTHONPATH, keeps only the
    # absolute entries already there (an empty one would put the cwd on sys.path), checks
    # the command's interpreter, says so in one line on stderr, and execs the command.
    code = TARGETS + STATUS + "import sys; print(json.dumps(sys.path))"
    proc = run_in_venv(venv, args=("dspark-hotfix", "run", "--", "python", "-c", code),
                       path=("", STANDIN, "relative/dir"))
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout.splitlines()[-2])
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    banner, *lines = proc.stderr.splitlines()  # then the state lines: the last is the whole state
    assert banner.startswith("dspark_hotfix ") and f"PYTHONPATH={startup_dir(venv)}:{STANDIN} " in banner
    assert len(summary_lines("\n".join(lines))) == len(lines) and state_of(lines[-1]).endswith(ALL_PATCHED)
    assert "relative/dir" not in json.loads(proc.stdout.splitlines()[-1])


def test_run_names_the_interpreter_and_the_install_command_where_the_hotfix_is_missing(venv, tmp_path):
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    proc = run_in_venv(venv, args=("dspark-hotfix", "run", "--", str(bare / "bin" / "python"), "-c", "print('ran')"))
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert f"{bare / 'bin' / 'python'} (the interpreter of" in proc.stderr
    assert f"{bare / 'bin' / 'python'} -m pip install dspark_hotfix-{__version__}-py3-none-any.whl" in proc.stderr


def test_doctor_and_status_exit_3_where_vllm_needs_nothing(venv, fixed_standin):
    path = (startup_dir(venv), fixed_standin)
    doctor = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=path)
    status = run_in_venv(venv, args=("dspark-hotfix", "status", "--import-targets", "--json"), path=path)
    assert (doctor.returncode, status.returncode) == (3, 3), doctor.stdout + status.stdout
    for report in (json.loads(doctor.stdout), json.loads(status.stdout)):
        assert report["verdict"] == "removable" and report["schema"] == 2
        assert {p["state"] for p in report["patches"]} == {"not_needed"}
        assert set(report["patches"][0]) == {"name", "target", "state", "needed", "calls", "corrections", "detail"}


def checkout_copy(root: Path, umask: int, mtime: int) -> Path:
    """The tracked files of this working tree, as another clone would have them: its umask, its file times."""
    from tests.conftest import REPO

    tracked = ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    files = subprocess.run(tracked, check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, files):
        source, copy = REPO / name, root / name
        if source.is_symlink() or not source.is_file():
            continue
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(source.read_bytes())
        copy.chmod((0o777 if os.access(source, os.X_OK) else 0o666) & ~umask)
        os.utime(copy, (mtime, mtime))
    return root


def test_make_dist_builds_the_same_bytes_twice_and_lists_their_sums(tmp_path):
    import hashlib
    import time

    from tests.conftest import REPO

    epoch = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], check=True, capture_output=True,
                           text=True).stdout.strip()
    built = []
    for n, (umask, mtime) in enumerate(((0o022, int(time.time())), (0o002, 1_000_000_000))):
        tree = checkout_copy(tmp_path / f"clone{n}", umask, mtime)
        out = tmp_path / f"dist{n}"
        proc = subprocess.run([sys.executable, str(tree / "scripts" / "dist.py"), str(out)], cwd=tree,
                              env={**os.environ, "SOURCE_DATE_EPOCH": epoch}, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        built.append({p.name: p.read_bytes() for p in out.iterdir()})
    first, second = built
    assert sorted(first) == ["SHA256SUMS", f"dspark_hotfix-{__version__}-py3-none-any.whl",
                             f"dspark_hotfix-{__version__}.tar.gz"]
    assert first == second  # byte for byte, the sums included
    sums = dict(line.split("  ")[::-1] for line in first["SHA256SUMS"].decode().splitlines())
    assert sums == {name: hashlib.sha256(data).hexdigest() for name, data in first.items() if name != "SHA256SUMS"}
