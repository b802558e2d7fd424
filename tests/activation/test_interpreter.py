"""The interpreter and host the shim starts in, in real subprocesses: flags that skip it (-S, -E,
-I) or keep it (-P, PYTHONSAFEPATH), read-only files, no HOME, no (or a broken) wrapt, stderr closed
or raising on write, and what start-up imports where vLLM is never imported.

Strict mode without a usable wrapt is in tests/switches/test_strict.py; other sitecustomize files
and two shims are in test_sitecustomize.py.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from functools import partial

import pytest

import dspark_hotfix
from tests.activation.children import AS_SHIPPED, CORRECTED, JUDGED, UNWRAPPED, USE_LAST, WRAPPED
from tests.child import (
    fail,
    import_modules,
    import_toy_targets,
    module_names,
    path_first,
    print_status,
    ran,
    toy_calls,
    use_toys,
    watchers,
    wrap_depths,
)
from tests.conftest import (
    REPO,
    STANDIN,
    clean_env,
    copy_of_shim,
    json_lines,
    last_json,
    listing,
    program,
    run_in_env,
    run_python,
    state_of,
    summary_lines,
    warning_lines,
)
from tests.toys import NAMES

TOYS = (
    use_toys,
    import_toy_targets,
)  # a child's first steps: the toys as its patch set, their targets imported


def states(stdout: str) -> dict[str, str]:
    return {name: row["state"] for name, row in last_json(stdout).items()}


@pytest.mark.parametrize("flag", ["-S", "-E", "-I"])
def test_flags_that_skip_the_shim_leave_vllm_untouched_and_status_says_so(flag):
    # First what start-up did (no watcher, no package of ours); then the code puts the shim and vLLM
    # on sys.path itself, as an embedding application would.
    code = program(
        watchers,
        module_names,
        partial(path_first, [str(REPO), str(STANDIN)]),
        *TOYS,
        wrap_depths,
        print_status,
    )
    proc = run_python(code, flags=(flag,))
    watching, modules, depth, rows = json_lines(proc.stdout)
    assert watching == 0 and "dspark_hotfix" not in modules
    assert depth == UNWRAPPED
    assert {(r["state"], r["detail"]) for r in rows.values()} == {
        ("disabled", "not installed in this process")
    }
    assert proc.stderr == ""


@pytest.mark.parametrize(
    ("flags", "env"), [((), {"PYTHONSAFEPATH": "1"}), (("-P",), {})], ids=["PYTHONSAFEPATH", "-P"]
)
def test_safe_path_keeps_the_shim_active(flags, env):
    proc = run_python(program(*TOYS, wrap_depths, print_status), flags=flags, env=env)
    depth, rows = json_lines(proc.stdout)
    assert depth == WRAPPED
    assert {n: r["state"] for n, r in rows.items()} == JUDGED


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
    # The toys come from the checkout, last on sys.path: the shim is the read-only copy's.
    code = program(USE_LAST, import_toy_targets, print_status, toy_calls)
    proc = run_python(code, path=(read_only_shim, STANDIN), flags=("-B",))
    assert {n: r["state"] for n, r in json_lines(proc.stdout)[0].items()} == JUDGED
    assert last_json(proc.stdout) == CORRECTED
    assert listing(read_only_shim) == before


UNSHARE = [
    "unshare",
    "--mount",
    "--propagation",
    "private",
    "sh",
    "-c",
    'mount --bind "$0" "$0" && mount -o remount,ro,bind "$0" "$0" && exec "$@"',
]


def read_only_mount_works() -> bool:
    if shutil.which("unshare") is None:
        return False
    with tempfile.TemporaryDirectory() as probe:
        return subprocess.run([*UNSHARE, probe, "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(
    not read_only_mount_works(), reason="needs unshare -m and a bind mount (CAP_SYS_ADMIN)"
)
def test_the_shim_runs_from_a_read_only_mount(read_only_shim):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(read_only_shim), str(STANDIN)]))
    code = program(
        USE_LAST,
        import_toy_targets,
        print_status,
        toy_calls,
        partial(write, str(read_only_shim / "probe")),
    )
    before = listing(read_only_shim)
    proc = run_in_env(
        [*UNSHARE, str(read_only_shim), sys.executable, "-c", code], env
    )  # bytecode writes on
    assert "Read-only file system" in proc.stderr  # the mount is really read-only, even for root
    rows, calls = json_lines(proc.stdout)
    assert {n: r["state"] for n, r in rows.items()} == JUDGED and calls == CORRECTED
    ours = [line for line in proc.stderr.splitlines() if "dspark_hotfix" in line]
    assert (
        len(ours) == 1 and len(summary_lines(proc.stderr)) == 1
    )  # nothing from the shim but its summary
    assert listing(read_only_shim) == before


def write(path: str) -> None:
    with open(path, "w"):
        pass


@pytest.mark.parametrize("home", [None, "/nonexistent/home"], ids=["unset", "missing-directory"])
def test_no_home_changes_nothing(home):
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(STANDIN)]))
    env.pop("HOME", None)
    if home:
        env["HOME"] = home
    proc = run_in_env([sys.executable, "-c", program(*TOYS, wrap_depths, print_status)], env)
    depth, rows = json_lines(proc.stdout)
    assert depth == WRAPPED and {n: r["state"] for n, r in rows.items()} == JUDGED
    assert warning_lines(proc.stderr) == []


@pytest.fixture(
    params=["venv without wrapt", "wrapt raises ImportError", "wrapt raises RuntimeError"]
)
def no_wrapt(request, tmp_path):
    """How to run Python where ``import wrapt`` fails: (python, extra path entries)."""
    if request.param == "venv without wrapt":
        return str(request.getfixturevalue("bare_venv") / "bin" / "python"), ()
    error = request.param.split()[-1]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "wrapt.py").write_text(
        program(partial(fail, error, "built for another Python"))
    )  # no wrapt
    return sys.executable, (tmp_path / "broken",)


def test_without_wrapt_the_shim_says_so_once_and_leaves_vllm_alone(no_wrapt):
    python, extra = no_wrapt
    path = (*extra, REPO, STANDIN)
    proc = run_python(
        program(*TOYS, wrap_depths, print_status, toy_calls), python=python, path=path
    )
    depth, rows, calls = json_lines(proc.stdout)
    assert depth == UNWRAPPED
    assert calls == AS_SHIPPED  # the toy build as shipped, its bugs included
    for row in rows.values():
        assert row["state"] == "failed" and "wrapt" in row["detail"], row
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == 1 and "wrapt" in warnings[0] and "vLLM runs unpatched" in warnings[0]
    # The documented alert finds it: the process's last state line says problem.
    assert state_of(summary_lines(proc.stderr)[-1]).startswith(f"problem: {len(NAMES)} failed ("), (
        proc.stderr
    )


@pytest.mark.parametrize("switch", [None, "1"], ids=["unset", "the Dockerfile's 1"])
def test_startup_imports_nothing_heavy_when_vllm_is_never_imported(switch):
    env = {} if switch is None else {"DSPARK_HOTFIX": switch}
    proc = run_python(program(module_names, watchers), path=(REPO,), env=env)
    loaded, watching = json_lines(proc.stdout)
    loaded = set(loaded)
    assert (
        watching == 1 and "sitecustomize" in loaded
    )  # active: the start-up module, and no other of ours
    assert {m for m in loaded if m.startswith("dspark_hotfix")} == set()
    heavy = {"wrapt", "logging", "typing", "inspect", "importlib.abc", "__future__", "dataclasses"}
    assert not loaded & (
        heavy | {"dspark_hotfix.registry", "dspark_hotfix.config", "dspark_hotfix.patches"}
    )


# Values start-up reads itself (blank, 1, 0, padded), and every other: each word in three cases,
# padded, and others.
VALUES = [
    "",
    "  ",
    "1",
    " 1\t",
    "0",
    "0 ",
    *(
        f(w)
        for w in dspark_hotfix.TRUE_WORDS + dspark_hotfix.FALSE_WORDS
        for f in (str.upper, str.title, lambda w: f" {w} ")
    ),
    "2",
    "nein",
    "1 0",
]


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_interpreter_start_reads_every_value_as_the_packages_switch_does(value):
    # Start-up reads blank, 1 and 0 itself (the Dockerfile's and the B arm's: the package does not
    # load); any other value is the package's switch's to read. Either way: watching exactly where
    # the switch is on, and the warning exactly where it has a problem.
    on, problem = dspark_hotfix.switch(dspark_hotfix.ENABLE, value, True, "the shim")
    proc = run_python(program(module_names, watchers), path=(REPO,), env={"DSPARK_HOTFIX": value})
    loaded, watching = json_lines(proc.stdout)
    assert watching == int(on), (value, proc.stderr)
    assert ("dspark_hotfix" in loaded) == (value.strip() not in ("", "1", "0"))
    assert not {"wrapt", "logging", "dspark_hotfix.registry"} & set(loaded)
    assert ("undecided: " in proc.stderr) == bool(problem), proc.stderr


@pytest.mark.parametrize("value", ["", "bogus", "1"])
def test_with_stderr_closed_interpreter_start_goes_on(value):
    # `2>&-` leaves sys.stderr None: a warning about a malformed switch must not end the
    # interpreter.
    env = clean_env(DSPARK_HOTFIX=value, PYTHONPATH=os.pathsep.join((str(REPO), str(STANDIN))))
    code = program(*TOYS, ran)
    proc = subprocess.run(
        ["sh", "-c", f'"{sys.executable}" -c "$0" 2>&-', code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc


@pytest.mark.parametrize("unbuffered", ["", "1"], ids=["buffered", "PYTHONUNBUFFERED=1"])
@pytest.mark.parametrize("stderr", ["writable", "read-only", "broken pipe"])
@pytest.mark.parametrize(
    ("switch", "package", "said"),
    [("disabled", True, "undecided: DSPARK_HOTFIX="), (None, False, "cannot import the package")],
    ids=["malformed switch", "no package"],
)
def test_a_stderr_that_raises_on_write_never_breaks_interpreter_start(
    tmp_path, switch, package, said, stderr, unbuffered
):
    # Each case writes a line on stderr: the malformed switch at start, the package it cannot
    # import when vLLM is. A write that raised there ended every process; a line left in a
    # buffered stderr made its flush at exit fail (exit status 120), which PYTHONUNBUFFERED hid.
    startup = REPO / "dspark_hotfix" / "startup"
    if not package:  # the start-up directory alone: the package is not two directories up
        startup = tmp_path / "a" / "b" / "c"
        startup.mkdir(parents=True)
        shutil.copy(
            REPO / "dspark_hotfix" / "startup" / "sitecustomize.py", startup / "sitecustomize.py"
        )
    env = clean_env(
        PYTHONPATH=os.pathsep.join((str(startup), str(STANDIN))),
        PYTHONUNBUFFERED=unbuffered,
        **({} if switch is None else {"DSPARK_HOTFIX": switch}),
    )
    read, write = os.pipe()
    os.close(read)  # a pipe whose reader has gone: a write raises BrokenPipeError
    with open(os.devnull) if stderr == "read-only" else open(write, "w", closefd=False) as err:
        proc = subprocess.run(
            [sys.executable, "-c", program(partial(import_modules, ["vllm"]), ran)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE if stderr == "writable" else err,
            cwd=tmp_path,  # not the checkout: -c puts the working directory on sys.path
            text=True,
            timeout=60,
        )
    os.close(write)
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc
    if stderr == "writable":
        assert said in proc.stderr, proc.stderr
