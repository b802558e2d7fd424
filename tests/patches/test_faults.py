"""Fault injection: the shim against vLLM builds that differ from what it expects.

Each fault is a copy of the stand-in build with one edit, run in real
subprocesses (the table is FAULTS in tests/cases.py). Shim on, vLLM must behave
exactly as shim off (``DSPARK_HOTFIX=0``, vLLM as shipped) where the patch could
not be applied, `status` must say why, and each failed patch must log exactly one
warning. Strict, the process must stop naming the patch, its target and the
remedy: tests/switches/test_strict.py.
"""

from __future__ import annotations

import pytest

from tests.cases import ATTENTION, DSPARK, PATCHES, REMAP, SWA
from tests.conftest import (
    IMPORT_ALL,
    REPO,
    STATUS,
    edited_standin,
    last_json,
    run_python,
    warning_lines,
)
from tests.patches.faults import (
    OUTPUTS,
    driver,
    fault,  # noqa: F401  (the fixture: each fault's edited stand-in)
)


def test_vllm_runs_as_shipped_where_a_patch_fails_and_status_says_why(fault):  # noqa: F811
    spec, standin = fault
    code = driver(spec.names)
    on = last_json(run_python(code, path=(REPO, standin)).stdout)
    off = last_json(run_python(code, path=(REPO, standin), env={"DSPARK_HOTFIX": "0"}).stdout)
    for name, why in spec.failed.items():
        for key in OUTPUTS[name]:
            assert on[key] == off[key], f"{name} failed, yet vLLM's {key} changed"
        row = on["status"][name]
        assert why in row["detail"]
        assert row["state"] in (("raised", "failed") if spec.at_call else ("failed",))
    # The patches the fault does not touch still correct vLLM: the comparison above is not vacuous.
    for name in set(PATCHES) - set(spec.failed):
        if name in OUTPUTS and not set(OUTPUTS[name]) & {k for f in spec.failed for k in OUTPUTS[f]}:
            assert on["status"][name]["state"] == "patched"
            assert all(on[key] != off[key] for key in OUTPUTS[name])


def test_each_failed_patch_logs_exactly_one_warning(fault):  # noqa: F811
    spec, standin = fault
    proc = run_python(driver(spec.names), path=(REPO, standin))
    warnings = warning_lines(proc.stderr)
    assert len(warnings) == len(spec.failed), warnings
    for name in spec.failed:
        assert len([w for w in warnings if w.startswith(f"{name}: ")]) == 1, (name, warnings)


@pytest.fixture
def without_dspark(tmp_path):
    """A build without the DSpark draft module (vLLM 0.23/0.24 ship none)."""
    return edited_standin(
        tmp_path / "standin",
        {"vllm/models/deepseek_v4/__init__.py": [
            ("from .nvidia.dspark import DSparkDeepseekV4ForCausalLM", "DSparkDeepseekV4ForCausalLM = None")]},
        remove=(DSPARK,),
    )


def test_missing_target_module_leaves_its_patches_waiting_without_a_warning(without_dspark):
    code = driver({}, draft=False)
    proc = run_python(code, path=(REPO, without_dspark))
    on = last_json(proc.stdout)
    assert on["status"][REMAP.name]["state"] == "pending"  # never imported: nothing failed, nothing to say
    assert "waiting for vllm.models.deepseek_v4.nvidia.dspark" in on["status"][REMAP.name]["detail"]
    assert on["status"][SWA.name]["state"] == on["status"][ATTENTION.name]["state"] == "patched"
    assert warning_lines(proc.stderr) == []
    strict = run_python(code, path=(REPO, without_dspark), env={"DSPARK_HOTFIX_STRICT": "1"})
    assert last_json(strict.stdout)["status"][REMAP.name]["state"] == "pending"


def test_missing_target_module_is_named_by_status_import_targets(without_dspark):
    proc = run_python("from dspark_hotfix.cli import main; raise SystemExit(main(['status']))",
                      path=(REPO, without_dspark), check=False)
    assert proc.returncode == 1
    assert "PROBLEM       cannot import vllm.models.deepseek_v4.nvidia.dspark: ModuleNotFoundError" in proc.stdout


def test_unexpected_signature_warns_and_vllm_runs_unpatched(broken_standin):
    proc = run_python(IMPORT_ALL + STATUS, path=(REPO, broken_standin))
    rows = last_json(proc.stdout)
    assert rows[SWA.name]["state"] == "failed"
    assert "unexpected signature" in rows[SWA.name]["detail"]
    assert rows[ATTENTION.name]["state"] == "patched"
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and SWA.name in warnings[0] and "vLLM runs unpatched" in warnings[0]
