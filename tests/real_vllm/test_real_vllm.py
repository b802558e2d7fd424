"""The real-vLLM tier: the shim against vLLM releases from PyPI, on the CPU.

For each release a cached venv gets ``vllm==X`` (tests/real_vllm/venvs.py), and
``inside/check_real_vllm.py`` and ``inside/check_layout.py`` run there under that venv's pytest with
the shim activated the way an operator does it: the repository on ``PYTHONPATH``
(``tests/real_vllm/runs.py``: one run per release and session, which each patch's own real-vLLM
tests read too). Every patch must be in the state its test module declares for the release
(``RELEASED``). Beside it, a short script there copies and pickles the specs wrapt's hooks hand out.
This tier never skips: if PyPI cannot be reached, it fails and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
from functools import partial
from typing import Any

import pytest

from dspark_hotfix.patches import ALL
from scripts.venvs import VERSIONS, ensure_venv
from tests.child import wrapt_version
from tests.conftest import REPO, clean_env, json_lines, program
from tests.real_vllm import runs

pytestmark = pytest.mark.real_vllm

EVIDENCE = REPO / "docs" / "evidence" / "kv_views.json"
# Need the V2 runner's "auto" rule, which releases from 0.29.0 on no longer have.
RESHAPE = {"test_v2_runner_reshape_gives_512_before_and_584_after_the_correction"}


@pytest.mark.parametrize("version", VERSIONS)
def test_shim_on_real_vllm(version):
    python, _ = ensure_venv(version)
    # Each release runs with one end of the supported wrapt range (venvs.WRAPT).
    wrapt = json.loads(
        subprocess.run(
            [str(python), "-c", program(wrapt_version)], capture_output=True, text=True, check=True
        ).stdout
    )
    assert wrapt == "1.17.3" if version == "0.25.0" else wrapt.startswith("2."), wrapt
    run = runs.released(version)
    print(run["report"])
    assert run["returncode"] == 0, run["report"]
    assert run["answers"]["vllm"] == version, run["report"]

    if version == "0.25.0":
        # The crash path must really have run on vLLM's own reshape here.
        assert not run["skipped"], run["skipped"]
        recorded = run["views"]
        if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
            EVIDENCE.write_text(json.dumps(recorded, indent=2) + "\n")
        committed = json.loads(EVIDENCE.read_text())
        assert committed["vllm"] == version
        assert committed["views"] == recorded["views"], "docs/evidence/kv_views.json is stale"
    else:
        assert set(run["skipped"]) <= RESHAPE, run["skipped"]


def loader_specs() -> list[Any]:
    """Once vLLM is imported, the spec of each module the shim still waits for (find_spec imports
    the parent package, which imports the other targets) has wrapt's proxy loader: whether it
    copies, deep-copies and pickles; then each patch's state."""
    import copy
    import importlib
    import importlib.util
    import pickle
    import sys

    import vllm  # noqa: F401

    import dspark_hotfix
    from dspark_hotfix.patches import ALL

    rows: list[Any] = []
    for name in ["prometheus_client", *dict.fromkeys(p.module for p in ALL)]:
        if "." in name:
            importlib.import_module(name.rpartition(".")[0])
        if (
            name not in sys.modules and importlib.util.find_spec(name) is not None
        ):  # (some releases lack one)
            spec = importlib.util.find_spec(name)
            assert spec is not None
            copies = [
                copy.copy(spec),
                copy.deepcopy(spec),
                pickle.loads(pickle.dumps(spec)),
                copy.copy(spec.loader),
            ]
            rows.append(
                [name, type(spec.loader).__name__]
                + [
                    (c.loader if hasattr(c, "loader") else c).get_filename(name) == spec.origin
                    for c in copies
                ]
            )
            importlib.import_module(name)
    return [*rows, {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}]


@pytest.mark.parametrize("version", VERSIONS)
def test_a_hooked_modules_spec_copies_and_pickles_and_the_module_is_judged(version):
    python, _ = ensure_venv(version)  # wrapt 1.17.3 on 0.25.0, the newest 2.x on 0.33.0
    proc = subprocess.run(
        [str(python), "-c", program(loader_specs)],
        env=clean_env(PYTHONPATH=str(REPO)),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ((*rows, states),) = json_lines(proc.stdout)
    # Importing each target's package imports every target on these releases: prometheus_client is
    # left.
    assert rows == [["prometheus_client", "_ImportHookChainedLoader", True, True, True, True]], (
        proc.stderr[-3000:]
    )
    assert states == runs.expected(version)


def import_first(module: str) -> dict[str, Any]:
    """``module`` imported as the process's first of vLLM's, then what ``vllm.env_override`` sets
    up in vLLM's package before any of its modules runs."""
    import importlib

    try:
        importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return {"module": None}
    import torch._inductor.config

    return {"module": module, "compile_threads": torch._inductor.config.compile_threads}


def test_a_target_imported_first_leaves_vllms_set_up_as_with_the_shim_off():
    # A process whose first import of vLLM is a target module: the import system runs vLLM's
    # package first, and the shim must not run the target ahead of it. On the newest release,
    # which has every target module (two fresh vLLM imports per module).
    version = VERSIONS[-1]
    found = {}
    for module in sorted({patch.module for patch in ALL}):
        arms = {}
        for switch in ("1", "0"):
            code = program(partial(import_first, module))
            proc = runs.in_venv(version, code, env={"DSPARK_HOTFIX": switch})
            assert proc.returncode == 0, (module, switch, proc.stderr[-3000:])
            arms[switch] = json_lines(proc.stdout)[-1]
        found[module] = arms
        assert arms["1"] == arms["0"], (module, arms)
    assert any(arms["1"]["module"] for arms in found.values()), found
