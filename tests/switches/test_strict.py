"""``DSPARK_HOTFIX_STRICT``: off by default, on for true words only; strict, a patch that cannot be applied
(a changed signature, every fault of tests/cases.py, no or an unusable wrapt, a draft left unloaded)
stops the process naming the patch, its target and a remedy that exists, and every retried import is refused.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from dspark_hotfix import config
from tests.cases import ATTENTION, CORRECTIONS, FAULTS, SWA
from tests.conftest import (
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    edited_standin,
    json_lines,
    last_json,
    run_python,
)
from tests.patches.faults import (
    driver,
    fault,  # noqa: F401  (the fixture: each fault's edited stand-in)
)


def test_strict_mode_stops_the_import_naming_patch_target_and_remedy(broken_standin):
    proc = run_python(IMPORT_ALL, path=(REPO, broken_standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"dspark_hotfix.registry.HotfixError: {SWA.name}: cannot patch ")
    assert "DeepseekV4SWACache.get_kv_cache_spec" in last and f"DSPARK_HOTFIX_PATCHES=-{SWA.name}" in last


def test_strict_mode_without_wrapt_stops_naming_wrapt_and_the_remedy(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    proc = run_python(IMPORT_ALL, python=str(tmp_path / "venv" / "bin" / "python"),
                      env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode != 0, "strict mode let vLLM run unpatched without wrapt"
    last = proc.stderr.strip().splitlines()[-1]
    assert "HotfixError" in last and "wrapt" in last
    assert re.search(r"install wrapt|DSPARK_HOTFIX=0", last, re.IGNORECASE), f"no remedy named: {last}"


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


NAMES = tuple(p.name for p in CORRECTIONS)


def settings(**environ: str) -> config.Settings:
    return config.Settings(NAMES, environ)


def test_strict_is_off_by_default_and_on_for_true_words_only():
    assert settings().strict is False
    assert settings(DSPARK_HOTFIX_STRICT="Yes").strict is True
    s = settings(DSPARK_HOTFIX_STRICT="very")
    assert s.strict is False and s.problems == [
        "DSPARK_HOTFIX_STRICT='very' is not one of 1/true/on/yes/0/false/off/no: strict mode is off"]


def test_strict_mode_stops_naming_the_patch_its_target_and_the_remedy(fault):  # noqa: F811
    spec, standin = fault
    proc = run_python(driver(spec.names), path=(REPO, standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode != 0 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dspark_hotfix.registry.HotfixError: ")
    named = [name for name in spec.failed if f"HotfixError: {name}: " in last]
    assert len(named) == 1, last
    from dspark_hotfix.patches import ALL

    target = next(p for p in ALL if p.name == named[0]).target
    assert target in last, f"the message does not name the target {target}: {last}"
    assert f"DSPARK_HOTFIX_PATCHES=-{named[0]}" in last, f"the message names no remedy: {last}"


def test_strict_remedy_names_only_commands_that_exist(tmp_path):
    spec = FAULTS["attention signature changed"]
    standin = edited_standin(tmp_path / "standin", spec.edits)
    proc = run_python(driver(spec.names), path=(REPO, standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    message = proc.stderr.strip().splitlines()[-1]
    assert f"DSPARK_HOTFIX_PATCHES=-{ATTENTION.name}" in message
    for command in re.findall(r"`dspark-hotfix ([a-z-]+)[^`]*`", message):
        help_run = run_python(f"import sys; sys.argv = ['dspark-hotfix', {command!r}, '--help']\n"
                              "from dspark_hotfix.cli import main; main()", path=(REPO,), check=False)
        assert help_run.returncode == 0, f"the remedy names `dspark-hotfix {command}`, which does not exist"


RETRY = """
import json
errors = []
for attempt in range(2):
    try:
        import vllm.v1.attention.backends.mla.sparse_swa
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    else:
        errors.append(None)
print(json.dumps(errors))
"""


def test_strict_mode_refuses_every_retried_import_of_a_broken_target(standins):
    proc = run_python(RETRY, path=(REPO, standins["changed signature"]), env={"DSPARK_HOTFIX_STRICT": "1"})
    first, retry = last_json(proc.stdout)
    assert first is not None and first.startswith(f"HotfixError: {SWA.name}: "), first
    assert retry == first
