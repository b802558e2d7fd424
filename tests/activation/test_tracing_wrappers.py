"""The launcher and doctor beside tracing wrappers that install a sitecustomize of their own,
with the real packages from PyPI: ``opentelemetry-instrument`` (puts its own first and chains
nothing) and ``ddtrace-run`` (puts its own first and chains the one it shadows).

Each command says whether the shim is active in it (a watcher of ours on sys.meta_path) and
whether the tool is (its start-up module imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest

from scripts.venvs import cache_dir
from tests.cache import unavailable
from tests.child import run_cli, use_toys
from tests.conftest import REPO, STANDIN, clean_env, program, run_in_env

STARTUP = REPO / "dspark_hotfix" / "startup"
TOOLS = ("opentelemetry-distro==0.66b1", "opentelemetry-instrumentation==0.66b1", "ddtrace==4.16.0")
OFFLINE = (
    "NewConnectionError",
    "Temporary failure in name resolution",
    "Network is unreachable",
    "Max retries exceeded",
)


def active() -> dict[str, bool]:
    """Whether the shim (its watcher on sys.meta_path) and each tool (its start-up module) is active
    here."""
    import sys

    return {
        "shim": any(type(f).__name__ == "VllmImportWatcher" for f in sys.meta_path),
        "otel": "opentelemetry.instrumentation.auto_instrumentation" in sys.modules,
        "ddtrace": "ddtrace.bootstrap.sitecustomize" in sys.modules or "ddtrace" in sys.modules,
    }


PROBE = program(active)


@pytest.fixture(scope="module")
def tools() -> Path:
    """The tools installed once into a cached directory (``pip install --target``), for this
    interpreter."""
    target = cache_dir() / f"tracing-tools-py{sys.version_info.major}{sys.version_info.minor}"
    stamp = target / ".dspark-hotfix-ready"
    # pip writes the tools' scripts (ddtrace-run, opentelemetry-instrument) for the interpreter that
    # installs them: another one (a venv since removed) reinstalls them
    wanted = f"{' '.join(TOOLS)} for {sys.executable}"
    if not (stamp.exists() and stamp.read_text() == wanted):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--upgrade",
                "--target",
                str(target),
                *TOOLS,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0 and any(word in proc.stdout + proc.stderr for word in OFFLINE):
            unavailable(
                f"the package registry is unreachable: {proc.stderr.strip().splitlines()[-1]}"
            )
        assert proc.returncode == 0, proc.stderr[-3000:]
        stamp.write_text(wanted)
    return target


def env(tools: Path, *path: Path | str) -> dict[str, str]:
    """The tools' scripts first on PATH, then this interpreter's directory (the wrappers exec
    `python`)."""
    return clean_env(
        PATH=os.pathsep.join(
            [str(tools / "bin"), os.path.dirname(sys.executable), os.environ["PATH"]]
        ),
        PYTHONPATH=os.pathsep.join(str(p) for p in (*path, tools)),
        OTEL_TRACES_EXPORTER="none",
        OTEL_METRICS_EXPORTER="none",
        OTEL_LOGS_EXPORTER="none",
        DD_TRACE_ENABLED="false",
        DD_INSTRUMENTATION_TELEMETRY_ENABLED="false",
        DD_REMOTE_CONFIGURATION_ENABLED="false",
    )


LAUNCHER = ("python", "-m", "dspark_hotfix", "run", "--")
# `dspark-hotfix doctor --json` on the toy patches (REPO is on the child's path).
DOCTOR = ("python", "-c", program(use_toys, partial(run_cli, "doctor", "--json")))


def test_run_refuses_to_start_opentelemetry_instrument_and_names_the_order_that_works(
    tools, tmp_path
):
    # What the launcher would give it: ours first on PYTHONPATH. OpenTelemetry puts its own ahead.
    truth = run_in_env(
        ["opentelemetry-instrument", "python", "-c", PROBE], env(tools, STARTUP, REPO), cwd=tmp_path
    )
    assert truth.returncode == 0 and json.loads(truth.stdout) == {
        "shim": False,
        "otel": True,
        "ddtrace": False,
    }, truth.stderr[-2000:]
    proc = run_in_env(
        [*LAUNCHER, "opentelemetry-instrument", "python", "-c", PROBE],
        env(tools, REPO),
        cwd=tmp_path,
    )
    assert proc.returncode == 1 and proc.stdout == "", proc.stderr
    assert (
        proc.stderr
        == "dspark-hotfix run: opentelemetry-instrument puts its own sitecustomize ahead of ours"
        " and "
        "does not run ours, so the shim would not be active in what it starts; start it the other "
        "way round: opentelemetry-instrument [its options] dspark-hotfix run -- COMMAND\n"
    )
    # The order it names: both active.
    works = run_in_env(
        ["opentelemetry-instrument", *LAUNCHER, "python", "-c", PROBE],
        env(tools, REPO),
        cwd=tmp_path,
    )
    assert works.returncode == 0 and json.loads(works.stdout) == {
        "shim": True,
        "otel": True,
        "ddtrace": False,
    }, works.stderr[-2000:]


@pytest.mark.parametrize("order", ["inside", "outside"])
def test_ddtrace_run_chains_ours_so_both_orders_start_both(tools, tmp_path, order):
    command = (
        [*LAUNCHER, "ddtrace-run", "python", "-c", PROBE]
        if order == "inside"
        else ["ddtrace-run", *LAUNCHER, "python", "-c", PROBE]
    )
    proc = run_in_env(command, env(tools, REPO), cwd=tmp_path)
    assert proc.returncode == 0 and json.loads(proc.stdout) == {
        "shim": True,
        "otel": False,
        "ddtrace": True,
    }, proc.stderr[-2000:]
    assert " starts it)" in proc.stderr


def test_doctor_names_a_sitecustomize_that_runs_ahead_of_ours_and_does_not_chain_it(
    tools, tmp_path
):
    # The PYTHONPATH recipe, then opentelemetry-instrument around the command: its sitecustomize
    # comes first.
    proc = run_in_env(
        ["opentelemetry-instrument", *DOCTOR], env(tools, STARTUP, STANDIN, REPO), cwd=tmp_path
    )
    report = json.loads(proc.stdout)
    theirs = report["sitecustomize"]["file"]
    assert theirs.endswith("opentelemetry/instrumentation/auto_instrumentation/sitecustomize.py"), (
        report
    )
    assert report["sitecustomize"]["ahead"] == str(STARTUP / "sitecustomize.py")
    said = [
        p
        for p in report["problems"] + report["warnings"]
        if p.startswith(f"{theirs} runs ahead of ours")
    ]
    assert said == [
        f"{theirs} runs ahead of ours ({STARTUP / 'sitecustomize.py'}) and does not chain it, so"
        " ours does not run: start `dspark-hotfix run` inside the tool's wrapper, which puts ours"
        " first and chains theirs (opentelemetry-instrument dspark-hotfix run -- COMMAND)"
    ]
    # A problem where nothing else activates the shim (no plugin entry point visible here), else a
    # warning.
    assert (said[0] in report["problems"]) == (not report["plugin"]["active"])
    assert proc.returncode == (1 if said[0] in report["problems"] else 0)
    # In the order that works, doctor finds ours and nothing ahead of it.
    works = run_in_env(
        ["opentelemetry-instrument", *LAUNCHER, *DOCTOR], env(tools, STANDIN, REPO), cwd=tmp_path
    )
    site = json.loads(works.stdout)["sitecustomize"]
    assert site["ours"] and site["ahead"] is None and site["chained"]["file"] == theirs, site
