"""Helpers of the in-process tests of switches/ and reporting/: the shim in this very process, on
the toy patches (the ``toys`` fixture of tests/conftest.py), driven as an operator's process drives
it."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

import dspark_hotfix
from dspark_hotfix import cli
from tests.conftest import REPO, edited_standin, forget
from tests.toys import FAREWELL, GREETING, PLANNER, TOYS

STARTUP = REPO / "dspark_hotfix" / "startup"  # holds only sitecustomize.py
TOY_MODULES = tuple(dict.fromkeys(p.module for p in TOYS))  # vllm.toy_model, vllm.toy_planner


def activate(source: str = "sitecustomize", modules: tuple[str, ...] = TOY_MODULES) -> None:
    """A process the shim runs in: installed by ``source``, then vLLM imports ``modules`` (its
    targets)."""
    dspark_hotfix.install(source)
    for module in modules:
        importlib.import_module(module)


def build(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    edits: dict[str, list[tuple[str, str]]],
    name: str = "standin",
) -> Path:
    """A copy of the stand-in with ``edits``, ahead of the stand-in on ``sys.path`` (after the
    fixture's)."""
    copy = edited_standin(tmp_path / name, edits)
    monkeypatch.syspath_prepend(str(copy))
    return copy


def command(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``dspark-hotfix ARGV`` in this process: its exit code and what it printed on stdout."""
    capsys.readouterr()
    code = cli.main(list(argv))
    return code, capsys.readouterr().out


def report(capsys: pytest.CaptureFixture[str], name: str) -> tuple[int, dict[str, Any]]:
    """``dspark-hotfix NAME --json`` (status or doctor) in this process: its exit code and its
    report."""
    code, out = command(capsys, name, "--json")
    return code, json.loads(out)


def states(report: dict[str, Any]) -> dict[str, str]:
    return {row["name"]: row["state"] for row in report["patches"]}


def restart() -> None:
    """This process as a fresh one would start, for the next reader of the same test
    (tests.conftest.forget): without undoing its patch set, its ``sys.path`` or the switches."""
    forget()


def strict(monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict mode."""
    monkeypatch.setenv("DSPARK_HOTFIX_STRICT", "1")


def startup_module() -> Any:
    """The start-up hook's module, loaded under another name: its ``start()`` does not run."""
    spec = importlib.util.spec_from_file_location(
        "dspark_hotfix_startup_copy", STARTUP / "sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_if_started(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as if ours had been its ``sitecustomize`` (chaining none): doctor then finds an
    activation path whatever the test environment installs. Start-up itself is tested in
    subprocesses."""
    monkeypatch.setitem(sys.modules, "sitecustomize", startup_module())


# The toys' states on the stand-in as shipped: the greeting and the planner needed, the farewell
# absent.
AS_SHIPPED = {GREETING.name: "patched", FAREWELL.name: "not_needed", PLANNER.name: "patched"}
