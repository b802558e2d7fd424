"""The operator contract of the command line: exit codes, one JSON object, help, ``--version``,
``path``."""

from __future__ import annotations

import json
from functools import partial

import pytest

from dspark_hotfix.cli import main
from tests.activation.children import USE_LAST
from tests.child import run_cli
from tests.conftest import (
    REPO,
    STANDIN,
    edited_standin,
    in_fresh_process,
    program,
    run_in_venv,
    run_python,
    startup_dir,
)
from tests.toys import GREETING, module_file

STARTUP = REPO / "dspark_hotfix" / "startup"
FIELDS = {"name", "target", "state", "needed", "calls", "corrections", "detail"}


def cli(*args: str, path=(STARTUP, STANDIN), env: dict[str, str] | None = None):
    """The command line in a child with the start-up directory on its path, on the toy patches:
    forked (tests.conftest.in_fresh_process), or with ``env`` (a start of its own each) a fresh
    interpreter."""
    code = program(USE_LAST, partial(run_cli, *args))
    if env:
        return run_python(code, path=path, env=env, check=False)
    return in_fresh_process(code, path=path, timeout=120)


def exit_code(*argv: str) -> int | str | None:
    """main(argv) in this process (argparse ends a usage error or --help with SystemExit)."""
    try:
        return main(list(argv))
    except SystemExit as exc:
        return exc.code


def test_help_names_the_switches_and_the_exit_codes_in_plain_text(capsys):
    assert exit_code("--help") == 0
    out = capsys.readouterr().out
    for text in (
        "DSPARK_HOTFIX_PATCHES",
        "DSPARK_HOTFIX_STRICT",
        "exit status",
        "3  removable: this vLLM needs none of the patches",
    ):
        assert text in out
    assert "``" not in out and ":func:" not in out


def test_usage_errors_exit_2(capsys):
    assert exit_code("frobnicate") == 2
    assert exit_code("run") == 2
    assert "usage: dspark-hotfix" in capsys.readouterr().err


def test_status_and_doctor_print_one_object_with_the_same_patch_fields():
    status = cli("status", "--json")
    doctor = cli("doctor", "--json")
    assert (status.returncode, doctor.returncode) == (0, 0), status.stdout + doctor.stdout
    s, d = json.loads(status.stdout), json.loads(doctor.stdout)
    for report in (s, d):
        assert report["schema"] == 2 and isinstance(report["pid"], int)
        assert report["activated_by"] == "sitecustomize" and report["verdict"] == "fixing"
        assert all(set(row) == FIELDS for row in report["patches"])
    assert [(r["name"], r["state"]) for r in s["patches"]] == [
        (r["name"], r["state"]) for r in d["patches"]
    ]
    assert all(key == key.lower() and " " not in key for key in d["python"])  # machine keys


def test_status_import_targets_exits_1_when_a_patch_failed(tmp_path):
    # The toy greeting's function with another signature: the patch fails.
    signature = [("def greet(self, name)", "def greet(self, name, title=None)")]
    broken = edited_standin(tmp_path / "standin", {module_file(GREETING): signature})
    proc = cli("status", "--json", path=(STARTUP, broken))
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    assert any(p.startswith(f"{GREETING.name}: unexpected signature") for p in report["problems"])


def test_status_import_targets_exits_1_without_vllm():
    proc = cli("status", path=(STARTUP,))
    assert proc.returncode == 1 and "PROBLEM       vLLM cannot be imported by " in proc.stdout


@pytest.mark.parametrize(
    "env",
    [
        {"DSPARK_HOTFIX_STRICT": "very"},
        {"DSPARK_HOTFIX": "disabled"},
        {"DSPARK_HOTFIX_PATCHES": f"{GREETING.name},-{GREETING.name}"},
    ],
)
def test_doctor_exits_1_on_a_malformed_or_contradicting_switch(env):
    proc = cli("doctor", "--json", env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["problems"], report
    assert len(report["problems"]) == len(set(report["problems"]))  # each said once


def test_path_command_names_a_directory_holding_only_our_sitecustomize(venv):
    directory = startup_dir(venv)
    assert sorted(p.name for p in directory.iterdir() if p.name != "__pycache__") == [
        "sitecustomize.py"
    ]
    assert directory.is_relative_to(venv["purelib"])


def test_version_flag_prints_the_version(venv):
    import dspark_hotfix

    proc = run_in_venv(venv, args=("dspark-hotfix", "--version"))
    assert (proc.returncode, proc.stdout.strip()) == (
        0,
        f"dspark-hotfix {dspark_hotfix.__version__}",
    )
