"""Hostile environments, in real subprocesses: interpreter flags, read-only
files, no HOME, no (or a broken) wrapt, other sitecustomize files, two shims.

Already in test_activation.py: ``-S``/``-I`` start cleanly, a shadowed
sitecustomize runs once, one that raises is reported like ``site`` does.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from tests.conftest import (
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    WRAP_DEPTH,
    clean_env,
    copy_of_shim,
    json_lines,
    last_json,
    listing,
    patch_names,
    run_in_env,
    run_python,
    summary_lines,
    warning_lines,
)

WARMUP = f"import sys; sys.path.insert(0, {str(STANDIN)!r}); import warmup, json; print(json.dumps(warmup.run()))\n"


def states(stdout: str) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(stdout).items()}


@pytest.mark.parametrize("flag", ["-S", "-E", "-I"])
def test_flags_that_skip_the_shim_leave_vllm_untouched_and_status_says_so(flag):
    # The code puts the shim and vLLM on sys.path itself, as an embedding application would.
    code = f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(STANDIN)!r}]\n" + IMPORT_ALL + WRAP_DEPTH + STATUS
    proc = run_python(code, flags=(flag,))
    depth, rows = json_lines(proc.stdout)
    assert depth == dict.fromkeys(patch_names(), 0)
    assert {(r["state"], r["detail"]) for r in rows.values()} == {("disabled", "not installed in this process")}
    assert proc.stderr == ""


@pytest.mark.parametrize(("flags", "env"), [((), {"PYTHONSAFEPATH": "1"}), (("-P",), {})], ids=["PYTHONSAFEPATH", "-P"])
def test_safe_path_keeps_the_shim_active(flags, env):
    proc = run_python(IMPORT_ALL + WRAP_DEPTH + STATUS, flags=flags, env=env)
    depth, rows = json_lines(proc.stdout)
    assert depth == dict.fromkeys(patch_names(), 1)
    assert {r["state"] for r in rows.values()} == {"patched"}


@pytest.fixture
def read_only_shim(tmp_path):
    shim = copy_of_shim(tmp_path / "shim")
    for path in [shim, *shim.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    yield shim
    for path in [shim, *shim.rglob("*")]:
        path.chmod(path.stat().st_mode | stat.S_IWUSR)


def test_the_shim_writes_nothing_into_its_own_directory(read_only_shim):
    # Root ignores permissions, so compare listings; -B keeps the interpreter's
    # own bytecode cache out of the comparison: what remains would be the shim's.
    before = listing(read_only_shim)
    proc = run_python(IMPORT_ALL + STATUS + WARMUP, path=(read_only_shim, STANDIN), flags=("-B",))
    assert {r["state"] for r in json_lines(proc.stdout)[0].values()} == {"patched"}
    assert last_json(proc.stdout)["error"] is None
    assert listing(read_only_shim) == before


UNSHARE = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"']


def read_only_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as probe:
        return subprocess.run([*UNSHARE, probe, "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not read_only_mount_works(), reason="needs unshare -m and a bind mount (CAP_SYS_ADMIN)")
def test_the_shim_runs_from_a_read_only_mount(read_only_shim):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(read_only_shim), str(STANDIN)]))
    code = IMPORT_ALL + STATUS + WARMUP + f"open({str(read_only_shim / 'probe')!r}, 'w')"
    before = listing(read_only_shim)
    proc = run_in_env([*UNSHARE, str(read_only_shim), sys.executable, "-c", code], env)  # bytecode writes on
    assert "Read-only file system" in proc.stderr  # the mount is really read-only, even for root
    rows, warmup = json_lines(proc.stdout)
    assert {r["state"] for r in rows.values()} == {"patched"} and warmup["error"] is None
    ours = [line for line in proc.stderr.splitlines() if "dspark_hotfix" in line]
    assert len(ours) == 1 and len(summary_lines(proc.stderr)) == 1  # nothing from the shim but its summary
    assert listing(read_only_shim) == before


@pytest.mark.parametrize("home", [None, "/nonexistent/home"], ids=["unset", "missing-directory"])
def test_no_home_changes_nothing(home):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(STANDIN)]))
    env.pop("HOME", None)
    if home:
        env["HOME"] = home
    proc = run_in_env([sys.executable, "-c", IMPORT_ALL + WRAP_DEPTH + STATUS], env)
    depth, rows = json_lines(proc.stdout)
    assert depth == dict.fromkeys(patch_names(), 1) and {r["state"] for r in rows.values()} == {"patched"}
    assert warning_lines(proc.stderr) == []


@pytest.fixture(params=["venv without wrapt", "wrapt raises ImportError", "wrapt raises RuntimeError"])
def no_wrapt(request, tmp_path):
    """How to run Python where ``import wrapt`` fails: (python, extra path entries)."""
    if request.param == "venv without wrapt":
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        return str(tmp_path / "venv" / "bin" / "python"), ()
    error = request.param.split()[-1]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "wrapt.py").write_text(f"raise {error}('built for another Python')\n")  # names no wrapt
    return sys.executable, (tmp_path / "broken",)


def test_without_wrapt_the_shim_says_so_once_and_leaves_vllm_alone(no_wrapt):
    python, extra = no_wrapt
    path = (*extra, REPO, STANDIN)
    proc = run_python(IMPORT_ALL + WRAP_DEPTH + STATUS + WARMUP, python=python, path=path)
    depth, rows, warmup = json_lines(proc.stdout)
    off = last_json(run_python(WARMUP, python=python, path=path, env={"DSPARK_HOTFIX": "0"}).stdout)
    assert depth == dict.fromkeys(patch_names(), 0)
    assert warmup == off  # vLLM as shipped, crash included
    for row in rows.values():
        assert row["state"] == "failed" and "wrapt" in row["detail"], row
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and "wrapt" in warnings[0] and "vLLM runs unpatched" in warnings[0]


def test_strict_mode_without_wrapt_stops_naming_wrapt_and_the_remedy(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    proc = run_python(IMPORT_ALL, python=str(tmp_path / "venv" / "bin" / "python"),
                      env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode != 0, "strict mode let vLLM run unpatched without wrapt"
    last = proc.stderr.strip().splitlines()[-1]
    assert "HotfixError" in last and "wrapt" in last
    assert re.search(r"install wrapt|DSPARK_HOTFIX=0", last, re.IGNORECASE), f"no remedy named: {last}"


@pytest.fixture
def shadowed(tmp_path):
    def make(body: str):
        other = tmp_path / "image"
        other.mkdir()
        (other / "sitecustomize.py").write_text(body)
        return other

    return make


def test_a_shadowed_sitecustomize_that_imports_vllm_gets_it_patched(shadowed):
    other = shadowed("import vllm.models.deepseek_v4, sys\nsys.stderr.write('image customisation imported vllm\\n')\n")
    proc = run_python(IMPORT_ALL + WRAP_DEPTH + STATUS, path=(REPO, STANDIN, other))
    depth, rows = json_lines(proc.stdout)
    assert "image customisation imported vllm" in proc.stderr
    assert depth == dict.fromkeys(patch_names(), 1) and {r["state"] for r in rows.values()} == {"patched"}


def test_sys_path_entries_a_shadowed_sitecustomize_adds_are_kept(shadowed, tmp_path):
    other = shadowed("import sys\nsys.path.append('/opt/image/extra')\nsys.path.insert(0, '/opt/image/first')\n")
    code = "import sys, json; print(json.dumps(sys.path))"
    with_shim = json.loads(run_python(code, path=(REPO, STANDIN, other), cwd=tmp_path).stdout)
    without = json.loads(run_python(code, path=(STANDIN, other), cwd=tmp_path).stdout)
    assert "/opt/image/extra" in with_shim and "/opt/image/first" in with_shim
    assert [p for p in with_shim if p != str(REPO)] == without


@pytest.mark.parametrize("order", ["repo-first", "copy-first"])
def test_two_copies_of_the_shim_on_the_path_patch_once(tmp_path, order):
    copy = copy_of_shim(tmp_path / "copy")
    shims = (REPO, copy) if order == "repo-first" else (copy, REPO)
    code = IMPORT_ALL + WRAP_DEPTH + STATUS + "import dspark_hotfix; print(json.dumps(dspark_hotfix.__file__))"
    proc = run_python(code, path=(*shims, STANDIN))
    depth, rows = json_lines(proc.stdout)
    package = json.loads(proc.stdout.splitlines()[-1])
    assert depth == dict.fromkeys(patch_names(), 1) and {r["state"] for r in rows.values()} == {"patched"}
    assert len(summary_lines(proc.stderr)) == 1
    assert package.startswith(str(shims[0]))  # the first copy wins; the second only chains
    assert warning_lines(proc.stderr) == [] and "Error in sitecustomize" not in proc.stderr


def test_an_interpreter_that_cannot_import_the_package_is_named_with_the_install_command(tmp_path):
    # The start-up directory on PYTHONPATH, but no package beside it or installed: a
    # wrong interpreter, say. Start-up goes on; the line names the interpreter and the fix.
    lonely = tmp_path / "a" / "b" / "c"
    lonely.mkdir(parents=True)
    shutil.copy(REPO / "dspark_hotfix" / "startup" / "sitecustomize.py", lonely / "sitecustomize.py")
    proc = run_python("print('started')", path=(lonely,))
    assert proc.stdout.strip() == "started"
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"dspark_hotfix: not active: {sys.executable} cannot import the package")
    assert line.endswith(f"install it into this interpreter from a checkout or a wheel built from one: "
                         f"{sys.executable} -m pip install PATH")


RETRIES = """
import json
errors = []
for attempt in range(3):
    try:
        import vllm.models.deepseek_v4.attention
        errors.append(None)
    except Exception as exc:
        errors.append(type(exc).__name__)
print(json.dumps(errors))
"""


@pytest.mark.parametrize("wrapt_body", [None, "# a wrapt without register_post_import_hook\n__version__ = '0'\n"],
                         ids=["no wrapt", "wrapt without the hook API"])
def test_strict_mode_without_a_usable_wrapt_fails_every_retry_and_status_names_why(tmp_path, wrapt_body):
    # A retried import must not load vLLM unpatched, and a wrapt that is not the one the shim knows is
    # as unusable as none: strict mode stops, status() says failed (not pending) and why.
    if wrapt_body is None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
        python, extra = str(tmp_path / "venv" / "bin" / "python"), ()
    else:
        (tmp_path / "odd").mkdir()
        (tmp_path / "odd" / "wrapt.py").write_text(wrapt_body)
        python, extra = sys.executable, (tmp_path / "odd",)
    path = (*extra, REPO, STANDIN)
    proc = run_python(RETRIES, python=python, path=path, env={"DSPARK_HOTFIX_STRICT": "1"})
    assert json_lines(proc.stdout)[-1] == ["HotfixError"] * 3, proc.stderr
    rows = last_json(run_python("import vllm.models.deepseek_v4.attention\n" + STATUS, python=python, path=path).stdout)
    assert {row["state"] for row in rows.values()} == {"failed"}
    assert all("wrapt is not usable" in row["detail"] for row in rows.values()), rows
