"""The H200 end-to-end evidence: the figures in docs/evidence/e2e-h200.json are what
harness/e2e_h200.py computes."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from harness import e2e_h200
from harness.common import REPO as ROOT


@pytest.fixture(scope="module")
def e2e():
    return e2e_h200


def _engine(variant, rates, cache_files=10, counts=1339, ok=True):
    return {
        "variant": variant,
        "cache_files_before": cache_files,
        "ok": ok,
        "timed": [{"output_tok_per_s": r} for r in rates],
        "spec_metrics_timed": {"vllm:spec_decode_num_accepted_tokens": counts},
        "sample_output_token_ids": [[1, 2, 3]],
    }


def test_the_ratio_takes_medians_of_warm_engines_and_says_whether_both_arms_did_the_same_work(e2e):
    runs = [
        _engine("fixed", [10.0], cache_files=0),  # compiled every kernel: left out
        _engine("bug", [], ok=False),
        _engine("baseline", [100.0, 1.0, 120.0]),
        _engine("fixed", [90.0, 110.0]),
    ]
    ratio = e2e._ratio(runs)
    assert ratio["rates"] == {"fixed": [90.0, 110.0], "baseline": [100.0, 1.0, 120.0]}
    assert (ratio["median_fixed"], ratio["median_baseline"], ratio["fixed_over_baseline"]) == (
        100.0,
        100.0,
        1.0,
    )
    assert ratio["same_work"] is True
    assert e2e._ratio([*runs, _engine("baseline", [100.0], counts=1338)])["same_work"] is False
    assert "fixed_over_baseline" not in e2e._ratio(runs[:3])


def test_the_committed_evidence_holds_the_ratio_its_own_runs_give(e2e):
    data = json.loads((ROOT / "docs" / "evidence" / "e2e-h200.json").read_text())
    runs = [run for session in data["sessions"] for run in session["runs"]]
    assert data["ratio"] == e2e._ratio(runs)
    assert data["ratio"]["same_work"] is True
    bug = [run for run in runs if run["variant"] == "bug" and run.get("cache_files_before")]
    assert any("RuntimeError: kv must have shape" in (run["root_cause"] or "") for run in bug)
    fixed = [run for run in runs if run["variant"] == "fixed" and run.get("timed")]
    assert fixed and all(any("3 patched" in line for line in run["shim_lines"]) for run in fixed)


def test_the_jit_cache_comes_back_in_parts_and_fills_an_empty_cache(e2e, tmp_path, monkeypatch):
    device = tmp_path / "device"
    (device / "cache" / "triton" / "k").mkdir(parents=True)
    payload = os.urandom(64 * 1024)
    (device / "cache" / "triton" / "k" / "kernel.cubin").write_bytes(payload)
    monkeypatch.setattr(e2e, "DEVICE_ROOT", device)
    monkeypatch.setattr(e2e, "CACHE_PART", 4096)
    monkeypatch.setattr(e2e, "CACHE_MAX_PARTS", 10**6)
    out = tmp_path / "out"
    out.mkdir()
    exported = e2e._export_cache(out)
    assert exported["parts"] > 1 and len(list(out.iterdir())) == exported["parts"]
    (device / "cache-parts").mkdir()
    for part in out.iterdir():
        (device / "cache-parts" / part.name).write_bytes(part.read_bytes())
    assert e2e._restore_cache() == {"parts": 0}  # the cache is not empty: left alone
    shutil.rmtree(device / "cache")
    assert e2e._restore_cache()["parts"] == exported["parts"]
    assert (device / "cache" / "triton" / "k" / "kernel.cubin").read_bytes() == payload


def test_h200_hybrid_off_dies_with_the_reported_error_without_the_shim_and_stops_early_with_it():
    runs = ROOT / "docs" / "evidence" / "hybrid-off-h200"
    base = json.loads((runs / "call31-02-baseline-hma-off.json").read_text())
    shim = json.loads((runs / "call31-01-shim-hma-off.json").read_text())
    assert (
        base["hybrid_off"]
        and shim["hybrid_off"]
        and base["vllm_version"] == shim["vllm_version"] == "0.25.0"
    )
    assert not base["shim_loaded"] and shim["shim_loaded"]
    assert (
        base["root_cause"]
        == "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
    )
    assert shim["root_cause"].startswith(
        "dspark_hotfix.registry.HotfixError: kv_cache_groups: DeepSeek-V4's "
        "fp8_ds_mla KV caches (9 layers, e.g. model.layers.0.attn.swa_cache) need"
    )
    # The stop comes at KV-cache grouping: no KV cache allocated, FlashMLA never reached.
    log = (runs / "call31-01-shim-hma-off.log").read_text()
    assert (
        "get_kv_cache_groups(vllm_config, merged_kv_cache_specs)" in log
    )  # vLLM's call, in the traceback
    assert "RuntimeError: kv must have shape" not in log


def test_on_the_h200_the_stop_leaves_a_hybrid_on_engine_generating_what_vllm_generates():
    runs = ROOT / "docs" / "evidence" / "hybrid-off-h200"
    shim = json.loads((runs / "call32-01-shim.json").read_text())
    base = json.loads((runs / "call32-02-baseline.json").read_text())
    assert (
        shim["shim_loaded"]
        and not base["shim_loaded"]
        and not shim["hybrid_off"]
        and not base["hybrid_off"]
    )
    assert shim["exit_code"] == base["exit_code"] == 0 and shim["ok"] and base["ok"]
    assert [t["output_ids_sha256"] for t in shim["timed"]] == [
        t["output_ids_sha256"] for t in base["timed"]
    ]
    assert shim["spec_metrics_timed"] == base["spec_metrics_timed"]
    assert shim["spec_metrics_timed"]["vllm:spec_decode_num_accepted_tokens"] == 1339
    assert "1 patched, 4 not needed" in shim["shim_lines"][0]
