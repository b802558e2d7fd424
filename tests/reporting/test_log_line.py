"""The summary line on stderr: one whole line once every patch is judged, a new whole line on each
later decision, a WARNING where its verdict exits 1, never silenced by a logging config applied
after activation, said again under vLLM's process prefix once vLLM puts one on stderr, and the same
verdict in every process kind (one that imports every target, one that imports only the model's), on
a fixed vLLM only the removable line. On the toy patches, in this process."""

from __future__ import annotations

import dataclasses
import importlib
import logging
import logging.config
import os
import sys

import pytest

import dspark_hotfix
from dspark_hotfix import __version__
from dspark_hotfix.patches import Need
from tests.conftest import STATE_LINE, state_of
from tests.reporting.inprocess import activate, build
from tests.toys import FAREWELL, GREETING, PLANNER, fixed

FIXING = f"fixing: 2 patched ({GREETING.name}, {PLANNER.name}), 1 not_needed"
REMOVABLE = "removable: 3 not_needed"


def test_one_whole_line_once_every_patch_is_judged_and_none_for_later_imports(toys):
    # The planner's module first: the greeting still waits for its module, so no line yet.
    activate(modules=(PLANNER.module,))
    assert toys.summaries() == []
    activate(modules=(GREETING.module, PLANNER.module, "vllm.envs"))
    head = f"dspark_hotfix {__version__} (pid {os.getpid()}) via sitecustomize: "
    assert toys.summaries() == [head + FIXING]
    assert set(toys.states().values()) == {"patched", "not_needed"}


def _raising(answer, /, self, name):
    raise ValueError("a field this shim does not know")


def test_a_later_decision_gives_a_new_whole_line(toys, monkeypatch):
    # The greeting's correction raises once vLLM calls it: the process's state changes, and says so.
    monkeypatch.setattr(
        dspark_hotfix.patches,
        "ALL",
        (dataclasses.replace(GREETING, correction=_raising), FAREWELL, PLANNER),
    )
    activate()
    from vllm.toy_model import Greeter

    Greeter().greet("you")
    Greeter().greet("again")  # said once: nothing new
    assert [state_of(line) for line in toys.summaries()] == [
        FIXING,
        f"problem: 1 patched ({PLANNER.name}), 1 raised ({GREETING.name}), 1 not_needed",
    ]


def levels(text: str) -> list[tuple[str, str]]:
    """Each state line's level and verdict, in order."""
    found = [
        (line.split(" ", 1)[0], line.split("[dspark_hotfix] ", 1)[1])
        for line in text.splitlines()
        if "[dspark_hotfix] " in line
    ]
    return [
        (level, state_of(rest).split(":")[0]) for level, rest in found if STATE_LINE.match(rest)
    ]


def test_a_line_whose_verdict_exits_1_is_a_warning_and_the_others_are_info(toys, monkeypatch):
    # Log pipelines alert on the level: problem and undecided (exit 1) are WARNINGs, fixing INFO.
    monkeypatch.setattr(dspark_hotfix.patches, "ALL", (GREETING, FAREWELL, PLANNER))
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name}")
    activate()
    assert levels(toys.log.getvalue()) == [("WARNING", "problem")]


def test_an_undecided_line_is_a_warning(toys, monkeypatch):
    inconclusive = dataclasses.replace(
        GREETING, probe=lambda vllm_greet: Need(None, "probe inconclusive (toy)")
    )
    monkeypatch.setattr(dspark_hotfix.patches, "ALL", (inconclusive, FAREWELL, PLANNER))
    activate()
    assert levels(toys.log.getvalue()) == [("WARNING", "undecided")]


@pytest.mark.parametrize("edits", ["as shipped", "fixed"])
def test_fixing_and_removable_lines_are_info(toys, monkeypatch, tmp_path, edits):
    if edits == "fixed":
        build(tmp_path, monkeypatch, fixed())
    activate()
    assert levels(toys.log.getvalue()) == [
        ("INFO", "fixing" if edits == "as shipped" else "removable")
    ]


def decorate(stream, prefix: str) -> None:
    """What vLLM's ``decorate_logs`` does to a process's stdout and stderr
    (``vllm.utils.system_utils``, 0.25.0): ``write`` replaced on the stream, so that every line
    written from then on starts with ``prefix``."""
    write = stream.write
    stream.write = lambda text: write(
        "".join(prefix + line for line in text.splitlines(keepends=True))
    )


def test_the_line_is_said_again_under_vllms_prefix_once_vllm_puts_it_on_stderr(toys, monkeypatch):
    # An engine core under the launcher: the targets are imported, and the line said, while its
    # process starts; vLLM then prefixes its stderr, and loads its plugins: the plugin's call says
    # the line again.
    monkeypatch.setattr(
        sys, "stderr", toys.log
    )  # the process's stderr, where the shim's handler writes
    activate()
    decorate(toys.log, "(EngineCore pid=7) ")
    dspark_hotfix.install("vllm-plugin")
    dspark_hotfix.install("vllm-plugin")  # nothing changed since: nothing said
    first, again = toys.log.getvalue().splitlines()
    assert first.startswith("INFO ") and again.startswith("(EngineCore pid=7) INFO ")
    assert again.endswith(f"via sitecustomize: {FIXING}") and first.endswith(
        f"via sitecustomize: {FIXING}"
    )


@pytest.fixture
def logging_restored():
    """dictConfig disables every logger of this process: each gets its own flag back afterwards."""
    manager = logging.Logger.manager
    flags = {
        name: logger.disabled
        for name, logger in manager.loggerDict.items()
        if isinstance(logger, logging.Logger)
    }
    try:
        yield
    finally:
        for name, disabled in flags.items():
            manager.loggerDict[name].disabled = disabled  # type: ignore[union-attr]


def test_a_logging_config_applied_after_activation_does_not_silence_the_summary_line(
    toys, logging_restored
):
    # vLLM applies VLLM_LOGGING_CONFIG_PATH with dictConfig while `import vllm` runs, after the
    # shim activated; dictConfig's default disable_existing_loggers=True would disable its logger.
    dspark_hotfix.install("sitecustomize")
    importlib.import_module("vllm")
    logging.config.dictConfig({"version": 1})
    assert logging.getLogger("dspark_hotfix").disabled
    activate()
    (summary,) = toys.summaries()
    assert summary.endswith(f"via sitecustomize: {FIXING}")


def test_on_a_fixed_vllm_the_removable_line_is_the_only_one(toys, monkeypatch, tmp_path):
    build(tmp_path, monkeypatch, fixed())
    activate()
    assert set(toys.states().values()) == {"not_needed"}
    lines = toys.log.getvalue().splitlines()
    assert len(lines) == len(toys.summaries()) == 1, lines  # no warning, nothing else
    assert [state_of(line) for line in toys.summaries()] == [REMOVABLE]


# Which target modules a process kind imports: an engine core every one, a tensor-parallel worker
# only the model's (never the planner's, as a worker never imports vLLM's KV-cache grouping).
KINDS = {"engine core": (PLANNER.module, GREETING.module), "worker": (GREETING.module,)}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("build_", ["fixed", "as shipped"])
def test_every_process_kind_gives_the_same_verdict(toys, monkeypatch, tmp_path, kind, build_):
    # The stop is everywhere: where vLLM does not import its module, the shim does to judge it, so a
    # worker does not leave it pending.
    if build_ == "fixed":
        build(tmp_path, monkeypatch, fixed())
    activate(modules=KINDS[kind])
    assert [state_of(line) for line in toys.summaries()][-1:] == [
        REMOVABLE if build_ == "fixed" else FIXING
    ]


def test_the_shims_lines_never_reach_the_root_logger():
    # An application's logging.basicConfig puts a handler on the root logger: were the shim's lines
    # to propagate there, every one would be printed twice.
    from dspark_hotfix import state

    seen: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = seen.append  # type: ignore[method-assign, assignment]
    logging.getLogger().addHandler(handler)
    try:
        state.log(logging.WARNING, "a line of the shim's")
    finally:
        logging.getLogger().removeHandler(handler)
    assert seen == []
