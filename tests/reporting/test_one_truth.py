"""One truth: the hooks, ``status``, ``doctor`` and the summary line read the same records.

Each situation is run in real subprocesses three ways: ``doctor --json``,
``status --json`` and ``dspark_hotfix.status()`` in a process whose
sitecustomize activated the shim and that imported vLLM's targets. They must
name the same state for every patch, and status and doctor must exit alike.
(The launcher's refusals are in tests/launcher/test_launcher.py; the wrapper's own
words in tests/patches/test_wrappers.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import cases
from tests.conftest import (
    FIXED,
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    edited_standin,
    last_json,
    run_python,
    state_of,
    summary_lines,
)

STARTUP = REPO / "dspark_hotfix" / "startup"  # holds only sitecustomize.py
CLI = "import sys; from dspark_hotfix.cli import main; sys.exit(main(sys.argv[1:]))"
SWA, ATTENTION = cases.SWA.name, cases.ATTENTION.name
NO_QUANT_MODE = {"vllm/v1/kv_cache_interface.py": [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]}


def cli(*args: str, path: tuple[Path | str, ...], env: dict[str, str] | None = None):
    return run_python(f"import sys; sys.argv[1:] = {list(args)!r}\n" + CLI, path=path, env=env, check=False)


def report_of(proc) -> dict:
    """The one JSON object a command printed; a traceback instead fails with what it said."""
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}, no JSON\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}") \
            from None


def states(report: dict) -> dict[str, str]:
    return {row["name"]: row["state"] for row in report["patches"]}


def hooks(standin: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    """status() rows in a process whose sitecustomize activated the shim, after vLLM imported every target."""
    return last_json(run_python(IMPORT_ALL + STATUS, path=(REPO, standin), env=env).stdout)


@pytest.fixture
def package_only(tmp_path) -> Path:
    """A directory that makes the package importable without a sitecustomize: the shim is not active."""
    root = tmp_path / "package"
    root.mkdir()
    (root / "dspark_hotfix").symlink_to(REPO / "dspark_hotfix")
    return root


def test_doctor_reports_failed_rows_when_a_probe_raises_and_the_shim_is_not_active(tmp_path, package_only):
    standin = edited_standin(tmp_path / "standin", NO_QUANT_MODE)
    proc = cli("doctor", "--json", path=(package_only, standin))
    report = report_of(proc)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    doctor = states(report)
    assert doctor[ATTENTION] == doctor[SWA] == "failed"
    assert any(problem.startswith(f"{SWA}: ") for problem in report["problems"]), report["problems"]
    assert {name: row["state"] for name, row in hooks(standin).items()} == doctor


def test_an_excluded_patch_whose_target_cannot_be_resolved_is_excluded_everywhere(standins, package_only):
    standin, env = standins["changed signature"], {"DSPARK_HOTFIX_PATCHES": f"-{SWA}"}
    # doctor judges in its own process whether or not the shim is active there.
    doctors = [cli("doctor", "--json", path=(where, standin), env=env) for where in (STARTUP, package_only)]
    status = cli("status", "--json", path=(STARTUP, standin), env=env)
    assert [states(report_of(doctor))[SWA] for doctor in doctors] == ["excluded", "excluded"]
    assert states(report_of(status))[SWA] == hooks(standin, env)[SWA]["state"] == "excluded"
    assert doctors[0].returncode == status.returncode


def test_doctor_with_the_switch_off_says_disabled_and_judges_what_is_needed():
    proc = cli("doctor", "--json", path=(STARTUP, STANDIN), env={"DSPARK_HOTFIX": "0"})
    report = report_of(proc)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    assert set(states(report).values()) == {"disabled"}
    assert all(row["needed"] is True for row in report["patches"]), report["patches"]


def test_plain_status_imports_the_targets_and_reports_the_registrys_decision(standins, package_only):
    buggy = cli("status", "--json", path=(package_only, standins["buggy"]))
    report = report_of(buggy)
    assert buggy.returncode == 0 and report["activated_by"] == "status"
    assert set(states(report).values()) == {"patched"}
    broken = cli("status", "--json", path=(package_only, standins["changed signature"]))
    report = report_of(broken)
    assert broken.returncode == 1 and report["verdict"] == "problem"
    assert states(report)[SWA] == "failed"


def test_a_fixed_vllm_with_the_switch_off_exits_3_in_status_and_doctor(standins):
    path, env = (STARTUP, standins["fixed"]), {"DSPARK_HOTFIX": "0"}
    status = cli("status", "--json", path=path, env=env)
    doctor = cli("doctor", "--json", path=path, env=env)
    assert (status.returncode, doctor.returncode) == (3, 3), status.stdout + doctor.stdout
    assert report_of(status)["verdict"] == report_of(doctor)["verdict"] == "removable"


WORDS = {state: state for state in ("patched", "not_needed", "excluded", "failed", "pending")}  # the line's words


def test_the_summary_line_counts_the_states_that_status_reports(standins):
    proc = run_python(IMPORT_ALL + STATUS, path=(REPO, standins["changed signature"]))
    rows = last_json(proc.stdout)
    assert rows[SWA]["state"] == "failed"
    (summary,) = summary_lines(proc.stderr)
    assert "problem: " in summary and f"failed ({SWA})" in summary
    for state, word in WORDS.items():
        count = sum(row["state"] == state for row in rows.values())
        assert f" {count} {word}" in summary if count else word not in summary, (state, summary)


# The matrix: every situation, three readers, one state per patch.

SWITCHES = {"unset": {}, "off": {"DSPARK_HOTFIX": "0"}, "bogus": {"DSPARK_HOTFIX": "bogus"}}


def expected_exit(switch: str, build: str, excluded: bool) -> int:
    if switch == "bogus":
        return 1  # a malformed switch is a problem wherever it is
    if build == "fixed":
        return 3
    return 0 if switch == "unset" and build == "buggy" and not excluded else 1


@pytest.mark.parametrize("excluded", [False, True], ids=["all", f"-{SWA}"])
@pytest.mark.parametrize("build", ["buggy", "fixed", "changed signature"], ids=lambda k: k.replace(" ", "-"))
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_doctor_status_and_the_hooks_name_the_same_state_and_exit_alike(standins, switch, build, excluded):
    env = {**SWITCHES[switch], **({"DSPARK_HOTFIX_PATCHES": f"-{SWA}"} if excluded else {})}
    path = (STARTUP, standins[build])
    doctor = cli("doctor", "--json", path=path, env=env)
    status = cli("status", "--json", path=path, env=env)
    in_process = {name: row["state"] for name, row in hooks(standins[build], env).items()}
    assert states(report_of(doctor)) == states(report_of(status)) == in_process
    assert doctor.returncode == status.returncode == expected_exit(switch, build, excluded), (
        report_of(doctor)["problems"], report_of(status)["problems"])


def test_doctor_judges_excluded_patches_as_the_hooks_do():
    env = {"DSPARK_HOTFIX_PATCHES": ",".join(f"-{p.name}" for p in cases.SPECS)}
    proc = run_python("from dspark_hotfix.cli import main; raise SystemExit(main(['doctor', '--json']))",
                      env=env, check=False)
    report = __import__("json").loads(proc.stdout)
    rows = {p["name"]: p for p in report["patches"]}
    assert proc.returncode == 1
    assert [rows[spec.name]["needed"] for spec in cases.SPECS] == [True] * len(cases.SPECS)
    assert f"{SWA} is needed but excluded by DSPARK_HOTFIX_PATCHES" in report["problems"]
    hooks = last_json(run_python(IMPORT_ALL + STATUS, env=env).stdout)
    assert {n: r["state"] for n, r in hooks.items()} == {n: r["state"] for n, r in rows.items()}


# Each case below once read two ways in two reporters. Now state.judge is the one reading.
SCRAPED = """
from prometheus_client import generate_latest
def gauges():
    return sorted(l for l in generate_latest().decode().splitlines() if l.startswith("dspark_hotfix_patch_state"))
"""


def shown(gauges: list[str], patch: str) -> list[str]:
    """The states a patch's gauge shows at 1."""
    return [g.split('state="')[1].split('"')[0] for g in gauges if f'patch="{patch}"' in g and g.endswith(" 1.0")]


def test_a_reloaded_target_reads_failed_in_status_and_on_metrics_alike():
    code = ("import importlib, json, prometheus_client, vllm\n" + IMPORT_ALL + SCRAPED +
            "import dspark_hotfix, vllm.v1.attention.backends.mla.sparse_swa as swa\n"
            "importlib.reload(swa)\n"
            "s = dspark_hotfix.status()\n"
            "print(json.dumps([{r['name']: r['state'] for r in s['patches']}, s['verdict'], gauges()]))\n")
    rows, verdict, gauges = last_json(run_python(code).stdout)
    assert rows[SWA] == "failed" and verdict == "problem"
    assert shown(gauges, SWA) == ["failed"]


def test_an_inconclusive_probe_gives_one_verdict_in_status_and_in_the_commands(tmp_path):
    # vLLM answers the probe with no spec: its probe cannot tell, so with the shim off it is undecided.
    swa = "vllm/v1/attention/backends/mla/sparse_swa.py"
    no_spec = ("        uses_fp8_ds_mla = ", "        return None\n        uses_fp8_ds_mla = ")
    edits = {**FIXED, swa: [*FIXED[swa], no_spec]}
    standin = edited_standin(tmp_path / "standin", edits)
    env = {"DSPARK_HOTFIX": "0"}
    status = report_of(cli("status", "--json", path=(STARTUP, standin), env=env))
    doctor = report_of(cli("doctor", "--json", path=(STARTUP, standin), env=env))
    code = IMPORT_ALL + "import json, dspark_hotfix\nprint(json.dumps(dspark_hotfix.status()))"
    in_process = last_json(run_python(code, path=(REPO, standin), env=env).stdout)
    assert next(p for p in status["patches"] if p["name"] == SWA)["needed"] is None, status["patches"]
    assert status["verdict"] == doctor["verdict"] == in_process["verdict"] == "undecided"
    assert status["exit_code"] == doctor["exit_code"] == in_process["exit_code"] == 1


def test_a_correction_that_raises_reads_raised_in_the_row_the_line_and_the_gauges():
    code = ("import json, prometheus_client, types, vllm\n" + IMPORT_ALL + SCRAPED +
            f"import dspark_hotfix, dspark_hotfix.patches.{cases.ATTENTION.name} as patch\n"
            "def drifted(*args):\n    raise ValueError('a spec field this shim does not know')\n"
            "patch.fp8_ds_mla_spec = drifted\n"
            "from vllm.models.deepseek_v4.attention import DeepseekV4Attention as A\n"
            "config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=256))\n"
            "spec = A(compress_ratio=4).get_kv_cache_spec(config)\n"
            "s = dspark_hotfix.status()\n"
            f"row = next(r for r in s['patches'] if r['name'] == {ATTENTION!r})\n"
            "print(json.dumps([row, s['verdict'], s['exit_code'], spec.head_size, gauges()]))\n")
    proc = run_python(code)
    row, verdict, code_, head_size, gauges = last_json(proc.stdout)
    assert head_size == 512  # vLLM's own answer went on
    assert row["state"] == "raised" and "ValueError: a spec field" in row["detail"], row
    assert verdict == "problem" and code_ == 1
    assert state_of(summary_lines(proc.stderr)[-1]).startswith(f"problem: {len(cases.PATCHES) - 1} patched ("), \
        summary_lines(proc.stderr)
    assert f"1 raised ({ATTENTION})" in summary_lines(proc.stderr)[-1]
    assert shown(gauges, ATTENTION) == ["raised"]


def test_a_patched_function_another_tool_wraps_again_still_reads_patched():
    code = ("import functools, json, types, vllm\n" + IMPORT_ALL +
            "import dspark_hotfix\n"
            "from vllm.models.deepseek_v4.attention import DeepseekV4Attention as A\n"
            "ours = A.get_kv_cache_spec\n"
            "A.get_kv_cache_spec = functools.wraps(ours)(lambda *a, **k: ours(*a, **k))  # a tracer's wrapper\n"
            "config = types.SimpleNamespace(cache_config=types.SimpleNamespace(block_size=256))\n"
            "spec = A(compress_ratio=4).get_kv_cache_spec(config)\n"
            "s = dspark_hotfix.status()\n"
            f"row = next(r for r in s['patches'] if r['name'] == {ATTENTION!r})\n"
            "print(json.dumps([row, s['verdict'], s['exit_code'], spec.alignment]))\n")
    row, verdict, code_, alignment = last_json(run_python(code).stdout)
    assert alignment == 576  # the correction still runs under the other wrapper
    assert (row["state"], row["corrections"], verdict, code_) == ("patched", 1, "fixing", 0), row
