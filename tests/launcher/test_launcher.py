"""``dspark-hotfix run``: it starts a command only where the shim will be active in it, and
says why not elsewhere. Every case but the reading of CPython's options runs the real launcher and
the real command, and the command says itself whether the shim is active in it (a watcher of ours on
sys.meta_path)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from dspark_hotfix import __version__
from dspark_hotfix.cli import interpreter_options
from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST
from tests.child import import_toy_targets, print_status, ran, sys_path, watchers
from tests.conftest import (
    REPO,
    STANDIN,
    clean_env,
    json_lines,
    program,
    run_in_env,
    run_in_venv,
    startup_dir,
    state_of,
    summary_lines,
)

STARTUP = REPO / "dspark_hotfix" / "startup"
# A command's code, or a script's or module's body: prints how many of the shim's watchers are
# active in it.
PROBE = program(watchers)


def launch(cwd: Path, *command: str, env: dict[str, str] | None = None):
    """``python -m dspark_hotfix run -- command...`` from ``cwd``, the package importable from the
    checkout."""
    return run_in_env(
        [sys.executable, "-m", "dspark_hotfix", "run", "--", *command],
        env or clean_env(PYTHONPATH=str(REPO)),
        cwd=cwd,
    )


# Each: the words after `python`, the options CPython reads there, the option that keeps the shim
# out.
OPTIONS = [
    (["-c", PROBE], [], None),
    (["-Bc", PROBE], ["-B"], None),
    (["-um", "probe"], ["-u"], None),
    (["-X", "dev", "-c", PROBE], ["-X", "dev"], None),
    (["-Ximporttime", "-W", "ignore", "-c", PROBE], ["-Ximporttime", "-W", "ignore"], None),
    (["-X", "dev", "-I", "-c", PROBE], ["-X", "dev", "-I"], "-I"),
    (["-W", "ignore", "-S", "-c", PROBE], ["-W", "ignore", "-S"], "-S"),
    (["-IBc", PROBE], ["-IB"], "-I"),
    (["-sE", "-m", "probe"], ["-sE"], "-E"),
    (
        ["--check-hash-based-pycs", "always", "-I", "-c", PROBE],
        ["--check-hash-based-pycs", "always", "-I"],
        "-I",
    ),
]


@pytest.mark.parametrize(
    ("args", "options"),
    [case[:2] for case in OPTIONS],
    ids=[" ".join(c[1]) or "none" for c in OPTIONS],
)
def test_run_reads_the_options_cpython_reads_before_the_command(args, options):
    assert interpreter_options(args) == options


# End to end, one case per way CPython starts with them: a command (with a joined flag), a module
# with an option, an option with its own argument; and each option that keeps the shim out. The
# launcher asks the command's interpreter with the options read above, so the other cases differ
# only in the reading.
CASES = [OPTIONS[i] for i in (0, 2, 3, 5, 6, 8)]


@pytest.mark.parametrize(
    ("args", "options", "kept_out_by"), CASES, ids=[" ".join(c[1]) or "none" for c in CASES]
)
def test_run_starts_a_python_command_only_where_the_shim_is_active_in_it(
    tmp_path, args, options, kept_out_by
):
    # That -I, -S and -E keep the shim out of an interpreter they start is
    # tests/activation/test_interpreter.py's
    # test_flags_that_skip_the_shim_leave_vllm_untouched_and_status_says_so; here, that the launcher
    # reads them.
    (tmp_path / "probe.py").write_text(PROBE)
    proc = launch(tmp_path, sys.executable, *args)
    if kept_out_by is None:
        assert proc.returncode == 0 and proc.stdout == "1\n", proc.stderr
        assert f"({' '.join([sys.executable, *options])} starts it)" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 1 and proc.stdout == "", proc.stderr
        (line,) = proc.stderr.splitlines()
        assert line.startswith(
            "dspark-hotfix run: the shim would not be active in "
            f"{' '.join([sys.executable, *options])} (the interpreter of "
        ), line
        assert f"): {kept_out_by}: " in line and line.endswith(
            " start it without " + ("-S" if kept_out_by == "-S" else "that option")
        )
        assert "pip install" not in line  # the package is installed: the option keeps it out


def test_run_of_a_script_reads_the_options_of_its_shebang(tmp_path):
    script = tmp_path / "serve"
    script.write_text(f"#!{sys.executable} -Es\n{PROBE}")
    script.chmod(0o755)
    proc = launch(tmp_path, str(script))
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert (
        f"would not be active in {sys.executable} -Es (the interpreter of {script}): -E: "
        in proc.stderr
    )


def test_run_names_the_install_command_only_where_the_interpreter_lacks_the_shim(
    tmp_path, bare_venv
):
    # A venv without wrapt: the checkout's sitecustomize finds the package, wrapt is missing.
    python = str(bare_venv / "bin" / "python")
    proc = launch(tmp_path, python, "-c", PROBE)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert (
        f"No module named 'wrapt'; install it there from the wheel you built: {python} -m pip"
        f" install dspark_hotfix-{__version__}-py3-none-any.whl" in proc.stderr
    )
    isolated = launch(tmp_path, python, "-I", "-c", PROBE)
    assert isolated.returncode == 1 and "-I: it ignores PYTHONPATH" in isolated.stderr
    assert "pip install" not in isolated.stderr  # installing would not help while -I stays


def test_run_says_when_the_switch_turns_the_hotfix_off_in_the_command(tmp_path):
    command = [
        sys.executable,
        "-m",
        "dspark_hotfix",
        "run",
        "--",
        sys.executable,
        "-c",
        program(ran),
    ]
    for switch, said in ((None, ""), ("0", "; DSPARK_HOTFIX='0' turns the hotfix off in it")):
        env = clean_env(PYTHONPATH=str(REPO), **({"DSPARK_HOTFIX": switch} if switch else {}))
        proc = run_in_env(command, env, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
        (line,) = [line for line in proc.stderr.splitlines() if ": running " in line]
        assert line.endswith(f"starts it{said})"), line


def test_each_exit_of_run_before_the_command_runs_is_in_its_help_as_it_happens(tmp_path):
    help_text = run_in_env(
        [sys.executable, "-m", "dspark_hotfix", "run", "--help"],
        clean_env(PYTHONPATH=str(REPO)),
        cwd=tmp_path,
    ).stdout
    listed = dict(
        re.findall(r"^  (\d+) +(.+)$", help_text.partition("exit status of run:")[2], re.MULTILINE)
    )
    garbage = (
        tmp_path / "not-a-program"
    )  # executable, but neither a binary nor a script: exec refuses it
    garbage.write_bytes(b"\x00\x01\x02")
    garbage.chmod(0o755)
    refusing = (
        tmp_path / "opentelemetry-instrument"
    )  # a wrapper that would start the command without the shim
    refusing.write_text("#!/bin/sh\nexit 0\n")
    refusing.chmod(0o755)
    env = clean_env(PYTHONPATH=str(REPO), PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    happened = {
        "usage error": run_in_env(
            [sys.executable, "-m", "dspark_hotfix", "run"], env, cwd=tmp_path
        ),
        "not active": launch(tmp_path, "opentelemetry-instrument", "vllm", "serve", env=env),
        "cannot be run": launch(tmp_path, str(garbage), env=env),
        "not found": launch(tmp_path, "dspark-hotfix-no-such-command-4711", env=env),
    }
    said = {
        why: (str(proc.returncode), listed.get(str(proc.returncode), ""))
        for why, proc in happened.items()
    }
    assert said == {
        "usage error": ("2", "usage error"),
        "not active": ("1", "the shim would not be active in it (the reason is said)"),
        "cannot be run": ("126", "it cannot be run"),
        "not found": ("127", "command not found"),
    }, said
    assert sorted(listed) == sorted(code for code, _ in said.values()), listed


def test_run_of_a_command_that_does_not_exist_exits_127(tmp_path):
    proc = launch(tmp_path, "dspark-hotfix-no-such-command-4711")
    assert proc.returncode == 127
    assert "dspark-hotfix-no-such-command-4711: command not found" in proc.stderr
    assert "nothing checked" not in proc.stderr


def test_run_patches_the_command_it_execs_from_a_venv_with_only_the_wheel(venv):
    # The launcher puts the start-up directory first on PYTHONPATH, keeps only the
    # absolute entries already there (an empty one would put the cwd on sys.path), checks
    # the command's interpreter, says so in one line on stderr, and execs the command.
    # The toys from the checkout, last on sys.path: the shim is the wheel's.
    code = program(USE_LAST, import_toy_targets, print_status, sys_path)
    proc = run_in_venv(
        venv,
        args=("dspark-hotfix", "run", "--", "python", "-c", code),
        path=("", STANDIN, "relative/dir"),
    )
    assert proc.returncode == 0, proc.stderr
    rows, path = json_lines(proc.stdout)
    assert {n: r["state"] for n, r in rows.items()} == JUDGED
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}
    banner, *lines = proc.stderr.splitlines()  # then the state lines: the last is the whole state
    assert (
        banner.startswith("dspark_hotfix ")
        and f"PYTHONPATH={startup_dir(venv)}:{STANDIN} " in banner
    )
    assert len(summary_lines("\n".join(lines))) == len(lines) and state_of(lines[-1]).endswith(
        JUDGED_LINE
    )
    assert "relative/dir" not in path


def test_run_names_the_interpreter_and_the_install_command_where_the_hotfix_is_missing(
    venv, bare_venv
):
    python = bare_venv / "bin" / "python"
    proc = run_in_venv(venv, args=("dspark-hotfix", "run", "--", str(python), "-c", program(ran)))
    assert proc.returncode == 1 and "ran" not in proc.stdout
    assert f"{python} (the interpreter of" in proc.stderr
    assert f"{python} -m pip install dspark_hotfix-{__version__}-py3-none-any.whl" in proc.stderr


def test_run_of_a_script_behind_env_reads_the_python_that_env_finds(tmp_path):
    python = Path(sys.executable)
    script = tmp_path / "serve"
    script.write_text(f"#!/usr/bin/env {python.name}\n{PROBE}")
    script.chmod(0o755)
    proc = launch(
        tmp_path,
        str(script),
        env=clean_env(PYTHONPATH=str(REPO), PATH=f"{python.parent}:/usr/bin:/bin"),
    )
    assert proc.returncode == 0 and proc.stdout == "1\n", proc.stderr
    assert f"({python} starts it)" in proc.stderr, proc.stderr


def test_run_never_says_python_starts_it_where_env_clears_the_environment(tmp_path):
    script = tmp_path / "serve"
    script.write_text(f"#!/usr/bin/env -S -i {sys.executable}\n{PROBE}")
    script.chmod(0o755)
    proc = launch(tmp_path, str(script))
    assert proc.stdout == "0\n", proc.stderr  # what the launcher cannot change
    assert (
        "starts it" not in proc.stderr
        and f"cannot tell whether {script} starts Python" in proc.stderr
    )


def test_run_refuses_opentelemetry_instrument_started_by_python_as_by_its_own_name(tmp_path):
    tool = tmp_path / "opentelemetry-instrument"
    tool.write_text(f"#!{sys.executable}\n{program()}")
    proc = launch(tmp_path, sys.executable, str(tool), sys.executable, "-c", PROBE)
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert "opentelemetry-instrument puts its own sitecustomize ahead of ours" in proc.stderr
