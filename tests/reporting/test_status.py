"""``dspark_hotfix.status()`` and ``status --json``: pending before vLLM is imported, calls and corrections
counted, and exit 3 (with doctor) where vLLM needs nothing. The same records read by doctor, the hooks and the
line are in test_one_truth.py."""

from __future__ import annotations

import json

from tests.cases import REMAP, STOP, SWA
from tests.conftest import (
    STATUS,
    WARMUP,
    last_json,
    run_in_venv,
    run_python,
    startup_dir,
)
from tests.standin.warmup import CHECKPOINT


def test_corrections_and_calls_are_counted():
    rows = last_json(run_python(WARMUP + "\n" + STATUS).stdout)
    assert (rows[SWA.name]["corrections"], rows[REMAP.name]["corrections"]) == (4, 6)
    # every call of a wrapper is counted, the ones whose answer was right unchanged too
    assert (rows[SWA.name]["calls"], rows[REMAP.name]["calls"]) == (4, len(CHECKPOINT))
    assert rows[STOP.name]["calls"] == 1  # the engine groups its KV caches once


def test_status_before_vllm_is_imported_says_pending():
    rows = last_json(run_python(STATUS).stdout)
    assert {(r["state"], r["activated_by"]) for r in rows.values()} == {("pending", "sitecustomize")}


def test_doctor_and_status_exit_3_where_vllm_needs_nothing(venv, fixed_standin):
    path = (startup_dir(venv), fixed_standin)
    doctor = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=path)
    status = run_in_venv(venv, args=("dspark-hotfix", "status", "--json"), path=path)
    assert (doctor.returncode, status.returncode) == (3, 3), doctor.stdout + status.stdout
    for report in (json.loads(doctor.stdout), json.loads(status.stdout)):
        assert report["verdict"] == "removable" and report["schema"] == 2
        assert {p["state"] for p in report["patches"]} == {"not_needed"}
        assert set(report["patches"][0]) == {"name", "target", "state", "needed", "calls", "corrections", "detail"}
