"""The hybrid KV cache manager off, on the stand-in: the kv_cache_groups stop, its words, and its backstop."""

from __future__ import annotations

from tests.conftest import (
    FIXED,
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    edited_standin,
    last_json,
    run_python,
    summary_lines,
)

OFF = f"import sys; sys.path.insert(0, {str(STANDIN)!r}); import warmup, json; print(json.dumps(warmup.run(False)))"
CONNECTOR = """
from types import SimpleNamespace as NS
import json, dspark_hotfix
from vllm.v1.core import kv_cache_utils
from vllm.models.deepseek_v4.attention import DeepseekV4Attention
config = NS(cache_config=NS(block_size=256, cache_dtype="fp8_ds_mla"))
attn = DeepseekV4Attention(compress_ratio=4)
specs = {"model.layers.0.attn.swa_cache": attn.swa_cache.get_kv_cache_spec(config)}
off = NS(scheduler_config=NS(disable_hybrid_kv_cache_manager=True), kv_transfer_config=NS(kv_connector="NixlConnector"))
try:
    kv_cache_utils.get_kv_cache_groups(off, specs)
    print(json.dumps(None))
except Exception as exc:
    print(json.dumps(f"{type(exc).__name__}: {exc}"))
"""


def test_without_the_shim_the_hybrid_off_path_dies_with_the_reported_error():
    report = last_json(run_python(OFF, env={"DSPARK_HOTFIX": "0"}).stdout)
    assert report["error"] == "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
    assert report["views"]["draft.0.swa"]["shape"] == [4, 256, 512]


def test_with_the_shim_it_stops_at_kv_cache_grouping_naming_the_cause_and_what_helps():
    report = last_json(run_python(OFF).stdout)
    error = report["error"]
    assert error.startswith("HotfixError: kv_cache_groups: DeepSeek-V4's fp8_ds_mla KV caches (5 layers, ")
    assert "need vLLM's hybrid KV cache manager, and it is off: --disable-hybrid-kv-cache-manager was given" in error
    assert "leave the hybrid manager on" in error and "no vLLM release up to 0.33.0 runs DeepSeek-V4" in error
    assert "PR #47716" not in error  # a release with it fails the same way
    assert report["views"] == {}  # stopped before any view was built


def test_the_stop_names_the_kv_connector_that_may_have_turned_the_manager_off():
    error = last_json(run_python(CONNECTOR).stdout)
    assert error.startswith("HotfixError: kv_cache_groups: ")
    assert "--kv-transfer-config selects the KV connector 'NixlConnector'" in error


def test_with_the_stop_excluded_kv_view_guard_still_stops_the_narrow_view():
    report = last_json(run_python(OFF, env={"DSPARK_HOTFIX_PATCHES": "-kv_cache_groups"}).stdout)
    assert report["error"].startswith("HotfixError: kv_view_guard: DeepSeek-V4 fp8_ds_mla KV views FlashMLA would "
                                      "reject (584 bytes/token expected): MLAAttentionSpec(kv_quant_mode=NONE) "
                                      "viewed at 512 bytes/token")
    assert "kv_cache_groups excluded (excluded by DSPARK_HOTFIX_PATCHES; needed (vLLM's hybrid-off" in report["error"]


def test_with_the_manager_on_the_stop_passes_everything_through():
    on = last_json(run_python(OFF.replace("warmup.run(False)", "warmup.run()")).stdout)
    off = last_json(run_python(OFF.replace("warmup.run(False)", "warmup.run()"), env={"DSPARK_HOTFIX": "0"}).stdout)
    assert on["error"] is None and on["views"]["draft.0.swa"]["shape"] == [4, 64, 584]
    assert off["views"]["draft.0.swa"]["shape"] == [4, 64, 512]  # the spec patches, not the stop, make the difference


def test_where_the_hybrid_off_path_keeps_the_layout_the_stop_is_not_needed(tmp_path):
    standin = edited_standin(tmp_path / "standin", {"vllm/v1/core/kv_cache_utils.py": FIXED[
        "vllm/v1/core/kv_cache_utils.py"]})
    proc = run_python(IMPORT_ALL + STATUS, path=(REPO, standin))
    rows = last_json(proc.stdout)
    assert rows["kv_cache_groups"]["state"] == "not_needed"
    assert rows["kv_cache_groups"]["detail"] == "not needed (vLLM's hybrid-off grouping keeps the fp8_ds_mla layout)"
    (summary,) = summary_lines(proc.stderr)
    assert summary.endswith(": fixing: 5 patched (remap_dspark_name, attention_kv_cache_spec, swa_kv_cache_spec, "
                            "draft_load_coverage, kv_view_guard), 1 not_needed")


def test_a_vllm_without_kv_cache_utils_grouping_does_not_need_the_stop(tmp_path):
    standin = edited_standin(tmp_path / "standin", {"vllm/v1/core/kv_cache_utils.py": [
        ("def get_kv_cache_groups(", "def get_kv_cache_groups_elsewhere(")]})
    rows = last_json(run_python(IMPORT_ALL + STATUS, path=(REPO, standin)).stdout)
    assert rows["kv_cache_groups"]["state"] == "not_needed"
    assert rows["kv_cache_groups"]["detail"].startswith("not needed (vllm.v1.core.kv_cache_utils defines no "
                                                        "get_kv_cache_groups: its KV-cache grouping lives elsewhere")
