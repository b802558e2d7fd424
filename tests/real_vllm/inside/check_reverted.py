"""Checks that run inside the vLLM 0.25.0 venv on a copy of vLLM with every patch's ``REVERT``
applied.

Run only by ``tests/real_vllm/runs.py`` (``reverted``): ``PYTHONPATH`` is the reverted copy
(``tests/real_vllm/revert.py``) first, then the repository, so this process runs the reported
build's code with the shim activated the way an operator does it. The same vLLM without the shim
answers in a subprocess whose ``PYTHONPATH`` holds the copy alone. ``REVERT_EDITS`` (JSON) are the
edits the copy carries, ``EXPECTED_STATES`` (JSON) each patch's state here, both from the patches'
declarations. ``ANSWERS_OUT`` is where vLLM's answers with and without the shim go, for each patch's
own real-vLLM tests (tests/patches/test_<name>.py) and the evidence
(docs/evidence/reverted-0.25.0.json).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import dspark_hotfix
from dspark_hotfix.patches import ALL, Patch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import runner_answers  # noqa: E402

COPY = Path(os.environ["REVERTED_VLLM"]).resolve()
EDITS: list[dict[str, Any]] = json.loads(os.environ["REVERT_EDITS"])
EXPECTED: dict[str, str] = json.loads(os.environ["EXPECTED_STATES"])
PATCHED = [p for p in ALL if EXPECTED[p.name] == "patched"]


def _environment(pythonpath: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DSPARK_HOTFIX") and k != "ANSWERS_OUT"
    }
    env["PYTHONPATH"] = pythonpath
    return env


def _start() -> dict[str, subprocess.Popen[str]]:
    """vLLM's answers without the shim, and ``doctor --json`` with it: started before this
    process imports vLLM, so the three imports of vLLM overlap."""
    commands = {
        "without_shim": ([sys.executable, str(HERE / "runner_answers.py")], str(COPY)),
        "doctor": (
            [sys.executable, "-m", "dspark_hotfix", "doctor", "--json"],
            os.environ["PYTHONPATH"],
        ),
    }
    return {
        key: subprocess.Popen(
            argv, env=_environment(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for key, (argv, path) in commands.items()
    }


STARTED = _start()
# Every target module, imported as a server imports them: the shim's hooks run here.
for _module in dict.fromkeys(p.module for p in ALL):
    if importlib.util.find_spec(_module) is not None:  # (a patch's module some releases lack)
        importlib.import_module(_module)


def status() -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """``dspark_hotfix.status()`` as (process fields, rows by patch name)."""
    raw = dspark_hotfix.status()
    assert raw["schema"] == 2, raw
    return raw, {row["name"]: row for row in raw["patches"]}


@pytest.fixture(scope="module")
def subprocesses() -> dict[str, subprocess.CompletedProcess[str]]:
    done = {}
    for key, proc in STARTED.items():
        out, err = proc.communicate(timeout=600)
        done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return done


@pytest.fixture(scope="module")
def without_shim(subprocesses) -> dict[str, Any]:
    proc = subprocesses["without_shim"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "dspark_hotfix" not in proc.stderr  # nothing of the shim ran there
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def with_shim() -> dict[str, Any]:
    return runner_answers.answers()


def test_the_copy_shadows_the_installed_vllm_and_carries_the_reverted_lines():
    import vllm

    assert EDITS, "no patch declares a line to revert"
    assert Path(vllm.__file__).is_relative_to(COPY), vllm.__file__
    for edit in EDITS:
        module = importlib.import_module(
            "vllm." + edit["path"].removesuffix(".py").replace("/", ".")
        )
        assert module.__file__ is not None and Path(module.__file__) == COPY / "vllm" / edit["path"]
        lines = [line.strip() for line in Path(module.__file__).read_text().splitlines()]
        assert edit["line"] not in lines
        assert edit["replacement"] is None or edit["replacement"] in lines
    # Compiled extensions load from the copy (links into the installed package).
    loaded = []
    for library in sorted((COPY / "vllm").glob("*.so")):
        try:
            extension = importlib.import_module("vllm." + library.name.split(".")[0])
        except (
            ImportError
        ):  # some need a CUDA driver: they fail the same way from the installed package
            continue
        assert (
            extension.__file__ is not None and Path(extension.__file__).parent == COPY / "vllm"
        ), extension.__file__
        loaded.append(library.name)
    assert loaded, "no compiled extension of vLLM loaded from the copy"


def vllm_function(patch: Patch) -> Any:
    """What vLLM's class (or module) holds under the name of the patch's target: the shim's wrapper,
    if applied."""
    *classes, name = patch.qualname.split(".")
    owner: Any = importlib.import_module(patch.module)
    for cls in classes:
        owner = getattr(owner, cls)
    return vars(owner)[name]


def test_every_patch_is_in_its_declared_state_and_the_needed_ones_are_installed():
    fields, rows = status()
    assert fields["activated_by"] == "sitecustomize"
    assert {name: row["state"] for name, row in rows.items()} == EXPECTED
    assert [p for p in PATCHED if not hasattr(vllm_function(p), "__wrapped__")] == []
    # Each patch a REVERT edit brings back is needed here.
    assert any(not p.stops for p in PATCHED), "the revert re-creates no defect a correction repairs"
    for patch in PATCHED:
        assert rows[patch.name]["needed"] is True, rows[
            patch.name
        ]  # the probe's verdict on vLLM's own function


def test_without_the_shim_nothing_is_wrapped(without_shim):
    assert Path(without_shim["vllm_file"]).is_relative_to(COPY)
    assert not any(without_shim["wrapped"].values()), without_shim["wrapped"]


def test_with_the_shim_vllms_crash_path_is_wrapped_exactly_where_a_patch_applies(
    with_shim, without_shim
):
    assert with_shim["vllm_file"] == without_shim["vllm_file"]
    # The patched targets are wrapped; the rest of the path (the V2 runner's reshape) is vLLM's own.
    targets = {p.qualname for p in PATCHED}
    assert with_shim["wrapped"] == {name: name in targets for name in with_shim["wrapped"]}
    assert any(with_shim["wrapped"].values()), with_shim["wrapped"]


def test_the_answers_are_recorded_for_each_patchs_own_tests(with_shim, without_shim):
    before = {name: row["corrections"] for name, row in status()[1].items()}
    again = runner_answers.answers()  # one more round: what each patch corrects in it
    after = {name: row["corrections"] for name, row in status()[1].items()}
    assert again == with_shim
    answers = {
        "vllm": with_shim["vllm"],
        "torch": torch.__version__,
        "with_shim": with_shim,
        "without_shim": without_shim,
        "corrections": {name: after[name] - before[name] for name in after},
        "status": status()[1],
    }
    out = os.environ.get("ANSWERS_OUT")
    if out:
        Path(out).write_text(json.dumps(answers, indent=1) + "\n")
    assert all(after[p.name] > 0 for p in PATCHED if not p.stops), after


def test_doctor_says_the_fix_is_active_where_needed(subprocesses):
    proc = subprocesses["doctor"]
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (report["schema"], report["verdict"]) == (2, "fixing"), report
    rows = {row["name"]: row for row in report["patches"]}
    for patch in PATCHED:
        assert rows[patch.name]["needed"] is True, rows[patch.name]
