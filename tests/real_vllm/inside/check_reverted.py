"""Checks that run inside the vLLM 0.25.0 venv on a copy of vLLM with PR #47716 reverted.

Collected only by ``tests/real_vllm/test_reverted.py``: ``PYTHONPATH`` is the
reverted copy (``tests/real_vllm/revert.py``) first, then the repository, so
this process runs the reported build's code with the shim activated the way an
operator does it. The same vLLM without the shim answers in a subprocess whose
``PYTHONPATH`` holds the copy alone. Set ``REVERTED_OUT`` to record the answers.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import dspark_hotfix
from tests.cases import CORRECTIONS, REMAP, SPECS

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
import revert  # noqa: E402
import runner_answers  # noqa: E402

COPY = Path(os.environ["REVERTED_VLLM"]).resolve()
N, K = runner_answers.TARGET_LAYERS, runner_answers.DRAFT_LAYERS
# What the revert brings back: the corrections are needed.
NEEDED = tuple(p.name for p in CORRECTIONS)
LAYER_NAME = re.compile(r"mtp\.(\d+)\.(.+)")


def _environment(pythonpath: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_HOTFIX") and k != "REVERTED_OUT"}
    env["PYTHONPATH"] = pythonpath
    return env


def _start() -> dict[str, subprocess.Popen[str]]:
    """vLLM's answers without the shim, and ``doctor --json`` with it: started before this
    process imports vLLM, so the three imports of vLLM overlap."""
    commands = {
        "without_shim": ([sys.executable, str(HERE / "runner_answers.py")], str(COPY)),
        "doctor": ([sys.executable, "-m", "dspark_hotfix", "doctor", "--json"], os.environ["PYTHONPATH"]),
    }
    return {
        key: subprocess.Popen(argv, env=_environment(path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for key, (argv, path) in commands.items()
    }


STARTED = _start()
# vLLM's target modules, imported as a server imports them: the shim's hooks run here.
import vllm.models.deepseek_v4.attention  # noqa: E402
import vllm.models.deepseek_v4.nvidia.dspark  # noqa: E402
import vllm.v1.attention.backends.mla.sparse_swa  # noqa: E402, F401


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

    assert Path(vllm.__file__).is_relative_to(COPY), vllm.__file__
    for edit in revert.EDITS:
        module = importlib.import_module("vllm." + edit.path.removesuffix(".py").replace("/", "."))
        assert Path(module.__file__) == COPY / "vllm" / edit.path
        lines = [line.strip() for line in Path(module.__file__).read_text().splitlines()]
        assert edit.line not in lines
        assert edit.replacement is None or edit.replacement in lines
    # Compiled extensions load from the copy (links into the installed package).
    loaded = []
    for library in sorted((COPY / "vllm").glob("*.so")):
        try:
            extension = importlib.import_module("vllm." + library.name.split(".")[0])
        except ImportError:  # some need a CUDA driver: they fail the same way from the installed package
            continue
        assert Path(extension.__file__).parent == COPY / "vllm", extension.__file__
        loaded.append(library.name)
    assert loaded, "no compiled extension of vLLM loaded from the copy"


def test_without_the_shim_the_v2_runner_views_both_caches_at_512_bytes(without_shim):
    assert Path(without_shim["vllm_file"]).is_relative_to(COPY)
    assert not any(without_shim["wrapped"].values()), without_shim["wrapped"]
    assert without_shim["kv_quant_mode"] == {"attention": "NONE", "swa": "NONE"}
    for kind in ("attention", "swa"):
        view = without_shim["views"][kind]
        # Silently strided over the padded 37440-byte pages: what FlashMLA rejects.
        assert view["shape"] == [4, 64, 512], (kind, view)
        assert view["stride"] == [37440, 512, 1], (kind, view)
        assert view["page_bytes"] == 37440


def test_without_the_shim_the_remap_shifts_draft_layers_past_the_target(without_shim):
    remap = without_shim["remap"]
    assert remap["mtp.1.attn.wkv.weight"] == f"model.layers.{N + 1}.attn.wkv.weight"
    shifted = 0
    for name, answer in remap.items():
        match = LAYER_NAME.fullmatch(name)
        if answer and answer.startswith("model.layers.") and match:
            i, rest = match.groups()
            assert answer == f"model.layers.{N + int(i)}.{rest}", (name, answer)
            shifted += 1
    assert shifted == K * 10  # every per-layer name of grid.NAMES


def vllm_function(patch: Any) -> Any:
    """What vLLM's class (or module) holds under the name of the patch's target: the shim's wrapper, if applied."""
    *classes, name = patch.qualname.split(".")
    owner = importlib.import_module(patch.module)
    for cls in classes:
        owner = getattr(owner, cls)
    return vars(owner)[name]


def test_every_patch_is_installed_and_says_needed():
    fields, rows = status()
    wrapped = {p.name: vllm_function(p) for p in CORRECTIONS}
    assert {name for name, function in wrapped.items() if hasattr(function, "__wrapped__")} == set(wrapped)
    assert fields["activated_by"] == "sitecustomize"
    for name in NEEDED:
        row = rows[name]
        assert row["state"] == "patched", row
        assert row["needed"] is True, row  # the probe's verdict on vLLM's own method


def test_with_the_shim_the_v2_runner_views_both_caches_at_584_bytes(with_shim, without_shim):
    assert with_shim["vllm_file"] == without_shim["vllm_file"]
    # The corrections' targets are wrapped; the V2 runner's reshape, which views their specs, is vLLM's own.
    assert with_shim["wrapped"] == {**dict.fromkeys(with_shim["wrapped"], True), "_reshape_kv_cache": False}
    for kind in ("attention", "swa"):
        view = with_shim["views"][kind]
        assert view["shape"] == [4, 64, 584], (kind, view)
        assert view["stride"] == [37440, 584, 1], (kind, view)
        assert view["page_bytes"] == without_shim["views"][kind]["page_bytes"]
    record(with_shim, without_shim)


def test_with_the_shim_the_remap_is_positional_and_leaves_head_weights_alone(with_shim, without_shim):
    moved = kept = 0
    for name, before in without_shim["remap"].items():
        after = with_shim["remap"][name]
        match = LAYER_NAME.fullmatch(name)
        if before and before.startswith("model.layers.") and match:
            i, rest = match.groups()
            assert after == f"model.layers.{i}.{rest}", (name, before, after)
            moved += 1
        else:
            assert after == before, (name, before, after)
            kept += bool(before and before.startswith("model."))
    assert moved == K * 10
    assert kept >= 7, "the head weights (norm, hc_head_*, markov_head, main_proj, main_norm) were not exercised"


def test_corrections_are_counted():
    before = {name: row["corrections"] for name, row in status()[1].items()}
    runner_answers.answers()  # each spec method once, the remap once per name of grid.NAMES
    after = {name: row["corrections"] for name, row in status()[1].items()}
    for spec in SPECS:
        assert after[spec.name] == before[spec.name] + 1, spec.name
    assert after[REMAP.name] == before[REMAP.name] + K * 10
    assert all(after[p.name] > 0 for p in CORRECTIONS), after


def test_doctor_says_the_fix_is_active_where_needed(subprocesses):
    proc = subprocesses["doctor"]
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (report["schema"], report["verdict"]) == (2, "fixing"), report
    rows = {row["name"]: row for row in report["patches"]}
    for name in NEEDED:
        assert rows[name]["needed"] is True, rows[name]


def record(with_shim: dict[str, Any], without_shim: dict[str, Any]) -> None:
    """Write what both arms answered to ``REVERTED_OUT``, if set (docs/evidence/reverted-0.25.0.json)."""
    out = os.environ.get("REVERTED_OUT")
    if not out:
        return
    names = ("mtp.1.attn.wkv.weight", "mtp.2.norm.weight", "mtp.0.main_proj.weight", "mtp.2.markov_head.w1.weight")
    arms = (("reverted", without_shim), ("with_shim", with_shim))
    Path(out).write_text(json.dumps({
        "source": "vLLM 0.25.0 with PR #47716 reverted (tests/real_vllm/revert.py), on CPU: vLLM's own spec "
                  "methods and V2 runner reshape (_reshape_kv_cache), its DSpark remap for a draft of 3 layers "
                  "over 43; reverted = without the shim, with_shim = the repository on PYTHONPATH after the copy",
        "vllm": with_shim["vllm"], "torch": torch.__version__,
        "views": {f"{kind}_{arm}": answers["views"][kind] for kind in ("attention", "swa") for arm, answers in arms},
        "remap": {name: {arm: answers["remap"][name] for arm, answers in arms} for name in names},
    }, indent=2) + "\n")
