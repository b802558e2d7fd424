"""Every vLLM release that carries DeepSeek-V4, judged: the whole release line, not a sample.

The releases are read from the package registry (``scripts.venvs.releases``: every final release
from 0.25.0 on, so a release published later is judged by the same command). Each is installed as
the real tier installs it (``scripts.venvs.ensure_venv``: the releases without a venv of their own
are their wheel alone over 0.33.0's dependencies, seconds and a few hundred MB each). On each,
``inside/release.py`` runs twice, the repository on ``PYTHONPATH``: with the shim as an operator
activates it, and with ``DSPARK_HOTFIX=0`` (vLLM as shipped, every patch judged, none applied). Each
run gives doctor's verdict, each patch's state, and vLLM's own KV-cache grouping of DeepSeek-V4's
specs with the hybrid KV cache manager on and off, viewed by the V2 runner.

The trimmed answers are recorded in ``docs/evidence/releases.json`` (``make records``), from which
``scripts/matrix.py`` writes docs/MATRIX.md's release table and the README's removal rule.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from dspark_hotfix.patches import ALL
from scripts.venvs import ensure_venv, releases
from tests.conftest import REPO, clean_env
from tests.real_vllm import runs
from tests.real_vllm.runs import INSIDE

pytestmark = pytest.mark.real_vllm

EVIDENCE = REPO / "docs" / "evidence" / "releases.json"
ARMS = {"with_shim": {}, "without_shim": {"DSPARK_HOTFIX": "0"}}
STALE = f"{EVIDENCE.relative_to(REPO)} is {runs.RECORDS}"


def judge(version: str, arm: str) -> dict[str, Any]:
    """inside/release.py on ``vllm==version``, one arm: its answer, trimmed to what is recorded."""
    python, _ = ensure_venv(version)
    # vLLM's ModelConfig asks the model hub for what a local checkpoint lacks: offline, at once.
    start = time.monotonic()
    proc = subprocess.run(
        [str(python), str(INSIDE / "release.py")],
        env=clean_env(PYTHONPATH=str(REPO), HF_HUB_OFFLINE="1", **ARMS[arm]),
        cwd=str(REPO),
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = f"{version} {arm}: exited {proc.returncode} after {time.monotonic() - start:.0f} s"
    assert proc.returncode == 0, f"{said}\n{proc.stderr[-4000:]}"
    answer = json.loads(proc.stdout)
    assert answer["errors"] == {}, f"{said}: unexpected failures inside: {answer['errors']}"
    assert answer["vllm"] == version, said
    return {
        "verdict": answer["verdict"],
        "patches": {name: row["state"] for name, row in answer["patches"].items()},
        "needed": [name for name, row in answer["patches"].items() if row["needed"]],
        **{key: cell(answer[key]) for key in ("hybrid_on", "hybrid_off")},
        "draft_quantization": answer["draft_quantization"],
    }


def cell(grouping: dict[str, Any]) -> dict[str, Any]:
    """One grouping as recorded: it succeeds, with the sliding-window layers' view in bytes per
    token, or the error it raised, named by its class and the words before its first colon."""
    if grouping["outcome"] == "error":
        error = grouping["error"]
        return {"error": f"{error['type'].rsplit('.', 1)[-1]}: {error['message'].split(':')[0]}"}
    views = {
        row["view"]["bytes_per_token"]
        for row in grouping["layers"].values()
        if row["kind"] == "swa" and row["view"]
    }
    return {"swa_bytes_per_token": sorted(views)}


@pytest.fixture(scope="module")
def judged() -> dict[str, dict[str, Any]]:
    line = releases()
    for version in line:  # one install at a time, before the runs
        ensure_venv(version)
    pairs = [(version, arm) for version in line for arm in ARMS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores
        found = list(pool.map(lambda pair: judge(*pair), pairs))
    out: dict[str, dict[str, Any]] = {}
    for (version, arm), answer in zip(pairs, found, strict=True):
        out.setdefault(version, {})[arm] = answer
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(out, indent=1) + "\n")
    return out


def test_every_release_is_recorded_as_it_is_judged(judged):
    recorded = json.loads(EVIDENCE.read_text())
    assert list(recorded) == list(judged), STALE  # a release published since, or one withdrawn
    for version, arms in judged.items():
        assert recorded[version] == arms, (version, STALE)
    assert len(judged) >= 12  # 0.25.0 to 0.34.0 at least: the registry answered whole


def test_with_the_shim_deepseek_v4_groups_with_its_layout_or_is_stopped_on_every_release(judged):
    # Hybrid manager on: grouped, every sliding-window view 584 bytes/token. Off: the same, or the
    # stop's HotfixError where this release would lose the layout. Never 512, nor vLLM's own error.
    for version, arms in judged.items():
        shim = arms["with_shim"]
        assert shim["hybrid_on"] == {"swa_bytes_per_token": [584]}, (version, shim)
        assert shim["hybrid_off"] in (
            {"swa_bytes_per_token": [584]},
            {"error": "HotfixError: kv_cache_groups"},
        ), (version, shim)
        stopped = shim["hybrid_off"] != {"swa_bytes_per_token": [584]}
        assert stopped == (shim["patches"]["kv_cache_groups"] == "patched"), (version, shim)


def test_removable_exactly_where_vllm_as_shipped_groups_with_its_layout(judged):
    # What removable promises, held against vLLM as shipped on every release: nothing to fix and
    # nothing to stop, with the hybrid manager on and off.
    for version, arms in judged.items():
        shipped = arms["without_shim"]
        right = shipped["hybrid_on"] == shipped["hybrid_off"] == {"swa_bytes_per_token": [584]}
        assert (arms["with_shim"]["verdict"] == "removable") == right, (version, arms)


def test_every_patch_is_judged_on_every_release_and_the_verdict_follows(judged):
    for version, arms in judged.items():
        shim, shipped = arms["with_shim"], arms["without_shim"]
        assert list(shim["patches"]) == [p.name for p in ALL], version
        assert set(shim["patches"].values()) <= {"patched", "not_needed"}, (version, shim)
        # With the shim off the same patches are needed: judged alike, applied nowhere.
        assert shim["needed"] == [n for n, s in shim["patches"].items() if s == "patched"]
        assert shipped["needed"] == shim["needed"], version
        assert set(shipped["patches"].values()) == {"disabled"}, (version, shipped)
        patched = [p for p in ALL if p.name in shim["needed"]]
        verdict = (
            "fixing"
            if any(not p.stops for p in patched)
            else ("guarding" if patched else "removable")
        )
        assert shim["verdict"] == verdict, (version, shim)


def test_the_draft_quantization_vllm_gives_is_recorded_and_the_shim_leaves_it_as_it_is(judged):
    # vLLM's own SpeculativeConfig, from the checkpoint's config.json: the target is always
    # deepseek_v4_fp8, as is the draft where it is omitted. A draft named explicitly gets fp8 where
    # vLLM does not align it (vllm#51916: 0.27.0 and 0.27.1 then build the draft wrong; see
    # docs/MATRIX.md). No patch touches it: with the shim and without, the same.
    for version, arms in judged.items():
        quantization = arms["with_shim"]["draft_quantization"]
        assert quantization == arms["without_shim"]["draft_quantization"], version
        assert quantization["target"] == quantization["omitted"] == "deepseek_v4_fp8", version
        assert quantization["named"] in ("deepseek_v4_fp8", "fp8"), (version, quantization)


def test_doctor_with_the_model_says_what_a_named_draft_gets_and_where_to_leave_it_unnamed(judged):
    # No patch can tell without the checkpoint's files (vllm#51916 lives in SpeculativeConfig,
    # which reads them): `dspark-hotfix doctor --model DIR` tells, from vLLM's own code.
    for version, arms in judged.items():
        for arm in ARMS:
            quantization = arms[arm]["draft_quantization"]
            said = quantization["doctor"]
            assert said.startswith(
                f"named explicitly, it gets {quantization['named']}; the target,"
                f" {quantization['target']}"
            ), (version, arm, said)
            wrong = quantization["named"] != quantization["target"]
            assert ("leave the draft unnamed" in said) == wrong, (version, arm, said)
