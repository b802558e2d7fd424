"""One truth: the hooks, ``status``, ``doctor``, the summary line and ``/metrics`` read the same
records.

Each situation is read three ways, one after another in this process, each reader starting afresh
(``restart``): ``doctor --json`` (where ours started the process), ``status --json`` (where nothing
activated the shim before it), and ``dspark_hotfix.status()`` in a process whose start-up hook
activated the shim and that imported vLLM's targets. They must name the same state for every patch,
and status and doctor must exit alike. On the toy patches. (The launcher's refusals are in
tests/launcher/test_launcher.py; the wrapper's own words in tests/patches/test_wrappers.py.)
"""

from __future__ import annotations

import dataclasses
import functools
import importlib

import pytest

import dspark_hotfix
from tests.conftest import state_of
from tests.reporting.inprocess import (
    AS_SHIPPED,
    activate,
    as_if_started,
    build,
    report,
    restart,
    states,
)
from tests.reporting.test_metrics import scrape
from tests.toys import FAREWELL, FIX, GREETING, NAMES, PLANNER, fixed, module_file

SIGNATURE = {module_file(GREETING): [("def greet(self, name)", "def greet(self, name, title='')")]}
BUILDS = {"as shipped": {}, "fixed": fixed(), "changed signature": SIGNATURE}


def hooks(toys) -> dict[str, str]:
    """The states in a process whose start-up hook activated the shim, after vLLM imported every
    target."""
    activate()
    return toys.states()


def test_doctor_reports_failed_rows_when_a_target_cannot_be_patched_and_the_shim_is_not_active(
    toys, monkeypatch, capsys, tmp_path
):
    build(tmp_path, monkeypatch, SIGNATURE)
    code, out = report(capsys, "doctor")
    assert code == 1 and out["verdict"] == "problem"
    doctor = states(out)
    assert doctor[GREETING.name] == "failed"
    assert any(problem.startswith(f"{GREETING.name}: ") for problem in out["problems"]), out[
        "problems"
    ]
    restart()
    assert hooks(toys) == doctor


def test_an_excluded_patch_whose_target_cannot_be_resolved_is_excluded_everywhere(
    toys, monkeypatch, capsys, tmp_path
):
    build(tmp_path, monkeypatch, SIGNATURE)
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name}")
    # doctor judges in its own process whether or not the shim is active there.
    alone = report(capsys, "doctor")
    restart()
    activate()
    after_hooks = report(capsys, "doctor")
    restart()
    status = report(capsys, "status")
    restart()
    assert [states(out)[GREETING.name] for _, out in (alone, after_hooks)] == [
        "excluded",
        "excluded",
    ]
    assert states(status[1])[GREETING.name] == hooks(toys)[GREETING.name] == "excluded"
    assert alone[0] == after_hooks[0] == status[0]


def test_doctor_with_the_switch_off_says_disabled_and_judges_what_is_needed(
    toys, monkeypatch, capsys
):
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    code, out = report(capsys, "doctor")
    assert code == 1 and out["verdict"] == "problem"
    assert set(states(out).values()) == {"disabled"}
    assert {row["name"]: row["needed"] for row in out["patches"]} == {
        GREETING.name: True,
        FAREWELL.name: False,
        PLANNER.name: True,
    }


def test_plain_status_imports_the_targets_and_reports_the_registrys_decision(
    toys, monkeypatch, capsys, tmp_path
):
    code, out = report(capsys, "status")
    assert code == 0 and out["activated_by"] == "status"
    assert states(out) == AS_SHIPPED
    restart()
    build(tmp_path, monkeypatch, SIGNATURE)
    code, out = report(capsys, "status")
    assert code == 1 and out["verdict"] == "problem"
    assert states(out)[GREETING.name] == "failed"


def test_a_fixed_vllm_with_the_switch_off_exits_3_in_status_and_doctor(
    toys, monkeypatch, capsys, tmp_path
):
    build(tmp_path, monkeypatch, fixed())
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    as_if_started(monkeypatch)
    status = report(capsys, "status")
    restart()
    doctor = report(capsys, "doctor")
    assert (status[0], doctor[0]) == (3, 3), (status, doctor)
    assert status[1]["verdict"] == doctor[1]["verdict"] == "removable"


WORDS = {
    state: state for state in ("patched", "not_needed", "excluded", "failed", "pending")
}  # the line's words


def test_the_summary_line_counts_the_states_that_status_reports(toys, monkeypatch, tmp_path):
    build(tmp_path, monkeypatch, SIGNATURE)
    rows = hooks(toys)
    assert rows[GREETING.name] == "failed"
    (summary,) = toys.summaries()
    assert "problem: " in summary and f"failed ({GREETING.name})" in summary
    for state, word in WORDS.items():
        count = sum(each == state for each in rows.values())
        assert f" {count} {word}" in summary if count else word not in summary, (state, summary)


# The matrix: every situation, three readers, one state per patch.

SWITCHES = {"unset": {}, "off": {"DSPARK_HOTFIX": "0"}, "bogus": {"DSPARK_HOTFIX": "bogus"}}


def expected_exit(switch: str, build: str, excluded: bool) -> int:
    if switch == "bogus":
        return 1  # a malformed switch is a problem wherever it is
    if build == "fixed":
        return 3
    return 0 if switch == "unset" and build == "as shipped" and not excluded else 1


@pytest.mark.parametrize("excluded", [False, True], ids=["all", f"-{GREETING.name}"])
@pytest.mark.parametrize("build_", sorted(BUILDS), ids=lambda k: k.replace(" ", "-"))
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_doctor_status_and_the_hooks_name_the_same_state_and_exit_alike(
    toys, monkeypatch, capsys, tmp_path, switch, build_, excluded
):
    for name, value in {
        **SWITCHES[switch],
        **({"DSPARK_HOTFIX_PATCHES": f"-{GREETING.name}"} if excluded else {}),
    }.items():
        monkeypatch.setenv(name, value)
    if BUILDS[build_]:
        build(tmp_path, monkeypatch, BUILDS[build_])
    as_if_started(monkeypatch)
    # doctor where ours started the process: the start-up hook activated the shim as vLLM was
    # imported.
    dspark_hotfix.install("sitecustomize")
    doctor = report(capsys, "doctor")
    restart()
    status = report(capsys, "status")
    restart()
    in_process = hooks(toys)
    assert states(doctor[1]) == states(status[1]) == in_process
    assert doctor[0] == status[0] == expected_exit(switch, build_, excluded), (
        doctor[1]["problems"],
        status[1]["problems"],
    )


def test_doctor_judges_excluded_patches_as_the_hooks_do(toys, monkeypatch, capsys):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name},-{PLANNER.name}")
    code, out = report(capsys, "doctor")
    rows = {p["name"]: p for p in out["patches"]}
    assert code == 1
    assert [rows[name]["needed"] for name in (GREETING.name, PLANNER.name)] == [True, True]
    assert f"{GREETING.name} is needed but excluded by DSPARK_HOTFIX_PATCHES" in out["problems"]
    restart()
    assert hooks(toys) == {n: r["state"] for n, r in rows.items()}


# Each case below once read two ways in two reporters. Now state.judge is the one reading.


def test_a_reloaded_target_reads_failed_in_status_and_on_metrics_alike(toys):
    import prometheus_client  # noqa: F401  (vLLM imports it)

    activate()
    importlib.reload(importlib.import_module(GREETING.module))
    status = dspark_hotfix.status()
    assert states(status)[GREETING.name] == "failed" and status["verdict"] == "problem"
    assert scrape().current()[GREETING.name] == "failed"


def test_an_inconclusive_probe_gives_one_verdict_in_status_and_in_the_commands(
    toys, monkeypatch, capsys, tmp_path
):
    # The toy build greets through an attribute the probe's stand-in lacks: its probe cannot tell,
    # so with the shim off it is undecided.
    inconclusive = [('return f"helo, {name}"', 'return f"{self.salutation}, {name}"')]
    build(
        tmp_path,
        monkeypatch,
        {module_file(GREETING): inconclusive, module_file(PLANNER): FIX[PLANNER.name]},
    )
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    as_if_started(monkeypatch)
    status = report(capsys, "status")[1]
    restart()
    doctor = report(capsys, "doctor")[1]
    restart()
    activate()
    in_process = dspark_hotfix.status()
    assert next(p for p in status["patches"] if p["name"] == GREETING.name)["needed"] is None, (
        status["patches"]
    )
    assert status["verdict"] == doctor["verdict"] == in_process["verdict"] == "undecided"
    assert status["exit_code"] == doctor["exit_code"] == in_process["exit_code"] == 1


def _raising(answer, /, self, name):
    raise ValueError("a field this shim does not know")


def test_a_correction_that_raises_reads_raised_in_the_row_the_line_and_the_gauges(
    toys, monkeypatch
):
    monkeypatch.setattr(
        dspark_hotfix.patches,
        "ALL",
        (dataclasses.replace(GREETING, correction=_raising), FAREWELL, PLANNER),
    )
    import prometheus_client  # noqa: F401

    activate()
    from vllm.toy_model import Greeter

    assert Greeter().greet("you") == "helo, you"  # vLLM's own answer went on
    status = dspark_hotfix.status()
    row = next(r for r in status["patches"] if r["name"] == GREETING.name)
    assert row["state"] == "raised" and "ValueError: a field this shim" in row["detail"], row
    assert status["verdict"] == "problem" and status["exit_code"] == 1
    assert state_of(toys.summaries()[-1]).startswith(f"problem: {len(NAMES) - 2} patched ("), (
        toys.summaries()
    )
    assert f"1 raised ({GREETING.name})" in toys.summaries()[-1]
    assert scrape().current()[GREETING.name] == "raised"


def test_a_patched_function_another_tool_wraps_again_still_reads_patched(toys):
    activate()
    from vllm.toy_model import Greeter

    ours = Greeter.greet
    Greeter.greet = functools.wraps(ours)(lambda *a, **k: ours(*a, **k))  # a tracer's wrapper
    greeting = Greeter().greet("you")
    status = dspark_hotfix.status()
    row = next(r for r in status["patches"] if r["name"] == GREETING.name)
    assert greeting == "hello, you"  # the correction still runs under the other wrapper
    assert (row["state"], row["corrections"], status["verdict"], status["exit_code"]) == (
        "patched",
        1,
        "fixing",
        0,
    )
