"""The shim beside ddtrace and OpenTelemetry, on real vLLM 0.25.0 (CPU).

Each tool is installed from PyPI once, into a cached directory of its own
(``pip install --target``, by the real-vLLM venv's Python so that its scripts
run that Python; never into the venv), with the venv's own wrapt so that the
directory does not shadow it. Every combination runs one child that imports
vLLM and the targets of the patches, then reports the shim's ``status()`` and
whether the other tool is at work: ddtrace's module watchdog on
``sys.meta_path`` and its vLLM integration wrapped around vLLM's engine;
OpenTelemetry's ``sitecustomize`` run and its SDK's tracer provider set.

The combinations: the launcher (``dspark-hotfix run``) and the ``PYTHONPATH``
recipe, each with the tool outside and inside it, and the plugin-only install
(the wheel's entry point, loaded by vLLM's plugin loader) under the tool. Both
tools put their own ``sitecustomize`` first on ``PYTHONPATH``; ddtrace's
imports the one it shadows, OpenTelemetry's does not: where it goes first
(the tool inside the launcher or the recipe) the shim is not active, and the
test asserts exactly that (docs/OPERATORS.md gives the orders that work).
All children run at once; nothing reaches the network (exporters off, the
agent address closed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from dspark_hotfix.cli import startup_dir
from scripts.venvs import cache_dir, ensure_venv
from tests import status_shape
from tests.child import import_modules, import_present, load_plugins
from tests.conftest import REPO, clean_env, json_lines, program
from tests.real_vllm.runs import expected

pytestmark = pytest.mark.coexist

VLLM = "0.25.0"
WRAPT = "wrapt==1.17.3"  # the real-vLLM venv's (tests/real_vllm/venvs.py)
# Each patch's state on 0.25.0, as its test module declares it (RELEASED).
EXPECTED = expected(VLLM)


@dataclass(frozen=True)
class Tool:
    name: str
    pins: tuple[str, ...]
    command: str
    env: dict[str, str]
    at_work: Callable[[], dict[str, bool]]  # a child's step: what says the tool is at work in it


def ddtrace_at_work() -> dict[str, bool]:
    import sys

    import vllm
    import vllm.v1.engine.output_processor as output_processor

    return {
        "watchdog": any(type(f).__name__ == "_UniversalModuleWatchdog" for f in sys.meta_path),
        "vllm_integration": getattr(vllm, "_datadog_patch", False),
        "engine_wrapped": hasattr(output_processor.OutputProcessor.process_outputs, "__wrapped__"),
    }


def opentelemetry_at_work() -> dict[str, bool]:
    import sys

    from opentelemetry import trace

    return {
        "sitecustomize": "opentelemetry.instrumentation.auto_instrumentation" in sys.modules,
        "sdk_tracer_provider": (
            type(trace.get_tracer_provider()).__module__.startswith("opentelemetry.sdk")
        ),
    }


def shim_says() -> dict[str, Any] | None:
    """How the shim was activated here and each patch's state; None where its package was never
    imported."""
    import sys

    if "dspark_hotfix" not in sys.modules:
        return None
    import dspark_hotfix

    status = dspark_hotfix.status()
    return {
        "activated_by": status["activated_by"],
        "states": {r["name"]: r["state"] for r in status["patches"]},
    }


DDTRACE = Tool(
    "ddtrace",
    ("ddtrace==4.16.0",),
    "ddtrace-run",
    {
        "DD_TRACE_VLLM_ENABLED": "true",
        "DD_TRACE_AGENT_URL": "http://127.0.0.1:9",
        "DD_INSTRUMENTATION_TELEMETRY_ENABLED": "false",
        "DD_REMOTE_CONFIGURATION_ENABLED": "false",
        "DD_CRASHTRACKING_ENABLED": "false",
    },
    ddtrace_at_work,
)
OPENTELEMETRY = Tool(
    "opentelemetry",
    ("opentelemetry-distro==0.66b1", "opentelemetry-instrumentation==0.66b1"),
    "opentelemetry-instrument",
    {"OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"},
    opentelemetry_at_work,
)
TOOLS = (DDTRACE, OPENTELEMETRY)
ORDERS = (
    "tool-outside-launcher",
    "tool-inside-launcher",
    "tool-outside-pythonpath",
    "tool-inside-pythonpath",
    "plugin-only",
)
# OpenTelemetry's sitecustomize does not import the one it shadows: where it goes first, ours never
# runs.
NOT_ACTIVE = {
    ("opentelemetry", "tool-inside-pythonpath")
}  # (inside the launcher: refused, see the test)


@pytest.fixture(scope="module")
def vllm_python() -> str:
    python, _ = ensure_venv(VLLM)
    return str(python)


def tool_site(tool: Tool, python: str) -> Path:
    """The tool, installed once from PyPI into a cached directory (its scripts run ``python``)."""
    target = cache_dir() / f"coexist-{tool.name}-vllm-{VLLM}"
    stamp = target / ".dspark-hotfix-ready"
    wanted = " ".join((*tool.pins, WRAPT))
    if stamp.exists() and stamp.read_text() == wanted:
        return target
    proc = subprocess.run(
        [
            python,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--upgrade",
            "--target",
            str(target),
            *wanted.split(),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        f"could not install {wanted} from PyPI into {target}:\n{proc.stderr[-3000:]}"
    )
    stamp.write_text(wanted)
    return target


@pytest.fixture(scope="module")
def plugin_site(wheel, tmp_path_factory) -> Path:
    """The wheel alone (no dependencies): its entry point is all that activates the shim."""
    site = tmp_path_factory.mktemp("plugin-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--target",
            str(site),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return site


def argv_and_env(
    tool: Tool, order: str, site: Path, plugins: Path, python: str
) -> tuple[list[str], dict[str, str]]:
    # vLLM imported (and its plugins loaded, where the plugin alone activates), every patch's
    # target, then what the child says: the other tool's work, and the shim's.
    code = program(
        partial(import_modules, ["vllm"]),
        *([load_plugins] if order == "plugin-only" else []),
        partial(import_present, status_shape.target_modules()),
        tool.at_work,
        shim_says,
    )
    env = clean_env(
        **tool.env, PATH=f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=str(site)
    )
    # The launcher runs from the checkout; it takes the checkout off the command's PYTHONPATH.
    launcher = [python, "-m", "dspark_hotfix", "run", "--"]
    launcher_path = f"{site}{os.pathsep}{REPO}"
    if order == "tool-outside-launcher":
        return [tool.command, *launcher, python, "-c", code], dict(env, PYTHONPATH=launcher_path)
    if order == "tool-inside-launcher":
        return [*launcher, tool.command, python, "-c", code], dict(env, PYTHONPATH=launcher_path)
    if order == "tool-outside-pythonpath":  # an entrypoint script of the image's, run by the tool
        script = 'export PYTHONPATH="$1${PYTHONPATH:+:$PYTHONPATH}"; exec "$2" -c "$3"'
        return [tool.command, "sh", "-c", script, "sh", startup_dir(), python, code], env
    if order == "tool-inside-pythonpath":
        return [tool.command, python, "-c", code], dict(
            env, PYTHONPATH=f"{startup_dir()}{os.pathsep}{site}"
        )
    return [tool.command, python, "-c", code], dict(env, PYTHONPATH=f"{plugins}{os.pathsep}{site}")


@pytest.fixture(scope="module")
def outcomes(
    vllm_python, plugin_site, tmp_path_factory
) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """Every combination's child, run at once (one vLLM import each)."""
    sites = {tool.name: tool_site(tool, vllm_python) for tool in TOOLS}
    cwd = tmp_path_factory.mktemp(
        "cwd"
    )  # OpenTelemetry's launcher puts the working directory on PYTHONPATH

    def run(case: tuple[Tool, str]) -> subprocess.CompletedProcess[str]:
        tool, order = case
        argv, env = argv_and_env(tool, order, sites[tool.name], plugin_site, vllm_python)
        return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=600)

    cases = [(tool, order) for tool in TOOLS for order in ORDERS]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        return dict(
            zip([(tool.name, order) for tool, order in cases], pool.map(run, cases), strict=True)
        )


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("tool", [tool.name for tool in TOOLS])
def test_vllm_imports_with_the_shim_and_the_other_tool_both_at_work(outcomes, tool, order):
    proc = outcomes[tool, order]
    if (tool, order) == ("opentelemetry", "tool-inside-launcher"):
        # OpenTelemetry's sitecustomize would go first and chain nobody: the launcher runs nothing,
        # and says which order works.
        assert proc.returncode == 1 and "opentelemetry-instrument" in proc.stderr, proc.stderr[
            -3000:
        ]
        assert "dspark-hotfix run --" in proc.stderr, proc.stderr[-3000:]
        return
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    )
    other, shim = json_lines(proc.stdout)[-2:]
    report = {"other": other, "shim": shim}
    assert all(report["other"].values()), (report, proc.stderr[-3000:])
    if (tool, order) in NOT_ACTIVE:
        # Not active, and silently so today: nothing of the shim was imported or said.
        assert report["shim"] is None, report
        assert "[dspark_hotfix]" not in proc.stderr, proc.stderr[-3000:]
        return
    want = "vllm-plugin" if order == "plugin-only" else "sitecustomize"
    assert report["shim"] == {"activated_by": want, "states": EXPECTED}, (
        report,
        proc.stderr[-3000:],
    )
