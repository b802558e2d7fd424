"""The real-vLLM tier for the hybrid-off path: DeepSeek-V4 with the hybrid KV cache manager on and
off.

For each release of ``venvs.VERSIONS``, and for 0.25.0 with every patch's ``REVERT`` applied
(``runs.REVERTED``: the reported build's code), ``inside/hybrid_off.py`` runs once without the shim
(``DSPARK_HOTFIX=0``) and once with it (the repository on ``PYTHONPATH``, as an operator activates
it), each time having vLLM's own KV-cache grouping group the representative model's specs with the
hybrid manager on and off and building the V2 runner's views on the CPU (``runs.hybrid_off``: once
per session, which each patch's own real-vLLM tests read too). Released 0.25.0 loses the
``fp8_ds_mla`` layout with the manager off (512 bytes/token): with the shim, no grouping that goes
through views it under 584, and with the manager on the shim changes nothing. 0.33.0 raises its own
``TypeError`` with the manager off, with the shim or without. Every patch is in the state its test
module declares. What stops the hybrid-off engine, and with which words, is that patch's to test
(tests/patches/). The answers are recorded in ``docs/evidence/hybrid-off.json``
(``DSPARK_HOTFIX_UPDATE_EVIDENCE=1`` writes it). This tier never skips: if a venv cannot be built,
it fails and says so.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from scripts.venvs import VERSIONS
from tests.conftest import REPO
from tests.real_vllm import runs
from tests.real_vllm.runs import REVERTED, REVERTED_VERSION

pytestmark = pytest.mark.real_vllm

EVIDENCE = REPO / "docs" / "evidence" / "hybrid-off.json"
LABELS = (*VERSIONS, REVERTED)
ARMS = ("without_shim", "with_shim")
# How each release's hybrid-off grouping treats DeepSeek-V4 (measured:
# docs/evidence/hybrid-off.json).
LOSES_LAYOUT, RAISES = "loses the fp8_ds_mla layout", "raises its own TypeError"
BEHAVIOUR = {"0.25.0": LOSES_LAYOUT, "0.33.0": RAISES}
STALE = f"{EVIDENCE.relative_to(REPO)} is {runs.RECORDS}"
# The evidence's key for a build: the reverted one without its space.
KEY = {label: label.replace(" ", "-") for label in LABELS}


def layers(result: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {name: row for name, row in result["layers"].items() if row["kind"] == kind}


def bytes_per_token(result: dict[str, Any], kind: str) -> set[int]:
    return {row["view"]["bytes_per_token"] for row in layers(result, kind).values()}


def status_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert result["status"] is not None, "dspark_hotfix was not importable in the arm"
    return result["status"]["patches"]


def wrapped(result: dict[str, Any]) -> list[str]:
    """vLLM's functions the arm reports, by its key, that carry a wrapper."""
    return [
        key for key, value in result.items() if isinstance(value, dict) and value.get("wrapped")
    ]


def assert_hybrid_on_views_584(result: dict[str, Any]) -> None:
    on = result["hybrid_on"]
    assert on["outcome"] == "ok", on
    assert on["specs_rebuilt"] == [], on["specs_rebuilt"]
    swa, states = layers(on, "swa"), layers(on, "state")
    assert len(swa) == 7 and len(states) == 3, on["layers"]
    assert {(r["spec"], r["kv_quant_mode"], r["block_size"]) for r in swa.values()} == {
        ("SlidingWindowMLASpec", "FP8_PER_TENSOR", 64)
    }, swa
    assert bytes_per_token(on, "swa") == bytes_per_token(on, "attn") == {584}, on["layers"]
    # The compressor states keep the block sizes their kernels take (4 for C4, 8 for C128).
    assert sorted(r["block_size"] for r in states.values()) == [4, 4, 8], states
    assert sorted(r["view"]["slots_per_block"] for r in states.values()) == [4, 4, 8], states


def assert_never_narrow(result: dict[str, Any]) -> None:
    """With the shim, no grouping that went through gives an fp8_ds_mla view under 584
    bytes/token."""
    for key in ("hybrid_on", "hybrid_off"):
        if result[key]["outcome"] == "ok":
            for kind in ("swa", "attn"):
                assert bytes_per_token(result[key], kind) == {584}, (key, result[key]["layers"])


@pytest.mark.parametrize("version", VERSIONS)
def test_without_the_shim(version):
    if version not in BEHAVIOUR:
        pytest.fail(
            f"no expectation for vLLM {version}: run tests/real_vllm/inside/hybrid_off.py there and"
            " add it to BEHAVIOUR"
        )
    result = runs.hybrid_off(version, "without_shim")
    print(f"vllm=={version} without the shim: {result['seconds']} s")
    assert result["vllm"] == version
    status = status_of(result)
    assert not result["status"]["enabled"] and {row["state"] for row in status.values()} == {
        "disabled"
    }, status
    assert wrapped(result) == []
    assert_hybrid_on_views_584(result)
    off = result["hybrid_off"]
    if BEHAVIOUR[version] == LOSES_LAYOUT:
        # The reported error's view, on released vLLM: every SWA cache rebuilt as full attention
        # without its layout, viewed at 512 bytes/token, and every compressor state at the
        # full-attention block size.
        assert off["outcome"] == "ok", off
        assert [(g["block_size"], g["layers"]) for g in off["groups"]] == [(256, 13)], off["groups"]
        swa, states = layers(off, "swa"), layers(off, "state")
        assert {(r["spec"], r["kv_quant_mode"], r["block_size"]) for r in swa.values()} == {
            ("MLAAttentionSpec", "NONE", 256)
        }, swa
        assert bytes_per_token(off, "swa") == {512}, swa
        assert {(r["block_size"], r["view"]["slots_per_block"]) for r in states.values()} == {
            (256, 256)
        }, states
        assert sorted(off["specs_rebuilt"]) == sorted([*swa, *states]), off["specs_rebuilt"]
        assert bytes_per_token(off, "attn") == {584}, off[
            "layers"
        ]  # the compressed MLA caches keep theirs
        assert "Hybrid KV cache manager is disabled" in result["stderr"]
    else:
        assert off["outcome"] == "error", off
        assert (
            off["error"]["type"] == "builtins.TypeError"
            and "bounded_replay" in off["error"]["message"]
        ), off
    merge = result["merge"]
    assert (merge["spec"], merge["input_kv_quant_mode"], merge["kv_quant_mode"]) == (
        "SlidingWindowMLASpec",
        "FP8_PER_TENSOR",
        "NONE",
    ), merge
    if BEHAVIOUR[version] == LOSES_LAYOUT:  # the V2 runner's "auto" rule: NONE views at 512
        assert merge["view"]["bytes_per_token"] == 512, merge


@pytest.mark.parametrize("version", VERSIONS)
def test_with_the_shim(version):
    if version not in BEHAVIOUR:
        pytest.fail(
            f"no expectation for vLLM {version}: run tests/real_vllm/inside/hybrid_off.py there and"
            " add it to BEHAVIOUR"
        )
    result, without = (
        runs.hybrid_off(version, "with_shim"),
        runs.hybrid_off(version, "without_shim"),
    )
    print(f"vllm=={version} with the shim: {result['seconds']} s")
    assert result["vllm"] == version
    status = status_of(result)
    assert result["status"]["activated_by"] == "sitecustomize", result["status"]
    assert {name: row["state"] for name, row in status.items()} == runs.expected(version)
    # With the manager on the shim passes everything through: the same groups, the same views.
    assert_hybrid_on_views_584(result)
    assert result["hybrid_on"] == without["hybrid_on"]
    assert_never_narrow(result)
    if "patched" not in runs.expected(version).values():
        # Nothing applied: the hybrid-off path is left as vLLM leaves it, word for word.
        assert wrapped(result) == []
        assert result["hybrid_off"] == without["hybrid_off"]
    # A merged SWA spec loses kv_quant_mode in every release; no path measured views it
    # (hybrid-off.md), and the shim leaves it as vLLM makes it.
    assert result["merge"] == without["merge"]


def test_reverted_vllm_views_512_without_the_shim_and_never_narrow_with_it():
    """0.25.0 with every REVERT applied (the reported build's specs): without the shim both managers
    view 512; with it every patch is in its declared state and no grouping that goes through views
    under 584."""
    result, without = (
        runs.hybrid_off(REVERTED, "with_shim"),
        runs.hybrid_off(REVERTED, "without_shim"),
    )
    print(
        f"vllm=={REVERTED_VERSION} reverted: {without['seconds']} s without the shim,"
        f" {result['seconds']} s with it"
    )
    for answer in (result, without):
        assert answer["vllm"] == REVERTED_VERSION
        assert "-reverted-" in answer["vllm_file"], answer[
            "vllm_file"
        ]  # the shadow copy, not the venv's package
    assert {row["state"] for row in status_of(without).values()} == {"disabled"}, status_of(without)
    on, off = without["hybrid_on"], without["hybrid_off"]
    assert on["outcome"] == off["outcome"] == "ok", (on, off)
    assert bytes_per_token(on, "swa") == bytes_per_token(off, "swa") == {512}, (
        on["layers"],
        off["layers"],
    )
    assert bytes_per_token(on, "attn") == {512}, on["layers"]

    assert {name: row["state"] for name, row in status_of(result).items()} == runs.expected(
        REVERTED
    )
    assert_hybrid_on_views_584(result)  # the corrections' work
    assert_never_narrow(result)


# What a rerun need not reproduce: paths, times, the log, the torch build, the arm's own failures
# (none).
VOLATILE = ("vllm_file", "seconds", "stderr", "torch", "errors")


def deterministic(result: dict[str, Any]) -> dict[str, Any]:
    """What a rerun must reproduce: vLLM's answers, the shim's decisions; not the shim's wording
    (the patches' own tests check its words)."""

    def error(e: dict[str, Any] | None) -> dict[str, Any] | None:
        if e is None or not e["type"].startswith("dspark_hotfix."):
            return e
        return {"type": e["type"], "patch": e["message"].split(":", 1)[0]}

    out: dict[str, Any] = {key: value for key, value in result.items() if key not in VOLATILE}
    for key in ("hybrid_on", "hybrid_off"):
        out[key] = dict(result[key], error=error(result[key].get("error")))
    out["merge"] = dict(result["merge"], view_error=error(result["merge"].get("view_error")))
    status = result["status"]
    out["status"] = status and {
        name: [row["state"], row["needed"]] for name, row in status["patches"].items()
    }
    return out


def test_evidence_records_the_matrix():
    recorded: dict[str, Any] = {
        "about": (
            "DeepSeek-V4's KV caches with vLLM's hybrid KV cache manager on and off, measured on"
            " the CPU with vLLM's own code by tests/real_vllm/inside/hybrid_off.py (4 target"
            " layers with compress ratios 0, 4, 128, 0 and 3 DSpark draft layers, block size 256,"
            " fp8_ds_mla); bytes_per_token is the last dimension's bytes of the V2 runner's view."
            " Arms: without_shim (DSPARK_HOTFIX=0), with_shim (the repository on PYTHONPATH);"
            f" {KEY[REVERTED]}: vLLM {REVERTED_VERSION} with PR #47716 reverted."
        ),
        "recorded_by": "tests/real_vllm/test_hybrid_off.py (DSPARK_HOTFIX_UPDATE_EVIDENCE=1)",
        "versions": {
            KEY[label]: {
                arm: {
                    k: v
                    for k, v in runs.hybrid_off(label, arm).items()
                    if k not in ("vllm_file", "seconds", "stderr")
                }
                for arm in ARMS
            }
            for label in LABELS
        },
    }
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(recorded, indent=1) + "\n")
    assert EVIDENCE.is_file(), STALE
    committed = json.loads(EVIDENCE.read_text())
    assert set(committed["versions"]) == set(KEY.values()), STALE
    for label in LABELS:
        assert set(committed["versions"][KEY[label]]) == set(ARMS), STALE
        for arm in ARMS:
            was, now = (
                deterministic(record["versions"][KEY[label]][arm])
                for record in (committed, recorded)
            )
            stale = f"{STALE} ({label}, {arm})"
            if runs.history(
                was["status"], len(was["status"])
            ):  # a patch removed since: the others' states hold
                assert {name: was["status"][name] for name in now["status"]} == now["status"], stale
            else:
                assert was == now, stale
