"""The hybrid KV cache manager off, on the stand-in: the stop at KV-cache grouping and its words."""

from __future__ import annotations

from dspark_hotfix.patches.kv_cache_groups import PATCH  # noqa: F401  (declared: tests/patches/__init__.py)
from tests.cases import PATCHES, STOP, method, module_file
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
from tests.patches import Fault

# vLLM 0.28.0's hybrid-off grouping keeps the layout (vllm#51612).
FIX = [("compress_ratio=spec.compress_ratio,", "compress_ratio=spec.compress_ratio, kv_quant_mode=spec.kv_quant_mode,")]
FAULTS = {
    "get_kv_quant_mode missing": Fault({"vllm/v1/kv_cache_interface.py": [("def get_kv_quant_mode(",
                                                                          "def kv_quant_mode_for(")]},
                                       "get_kv_quant_mode"),
}
# 0.25.0's hybrid-off grouping loses the layout (docs/evidence/hybrid-off.md); 0.33.0 groups elsewhere.
RELEASED = {"0.25.0": "patched", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = ()  # the reported build's grouping is 0.25.0's

OFF = f"import sys; sys.path.insert(0, {str(STANDIN)!r}); import warmup, json; print(json.dumps(warmup.run(False)))"
CONNECTOR = f"""
from types import SimpleNamespace as NS
import json, dspark_hotfix
from vllm.v1.core import kv_cache_utils
from vllm.models.deepseek_v4.attention import DeepseekV4Attention
config = NS(cache_config=NS(block_size=256, cache_dtype="fp8_ds_mla"))
attn = DeepseekV4Attention(compress_ratio=4)
specs = {{"model.layers.0.attn.swa_cache": attn.swa_cache.get_kv_cache_spec(config)}}
off = NS(scheduler_config=NS(disable_hybrid_kv_cache_manager=True), kv_transfer_config=NS(kv_connector="NixlConnector"))
try:
    kv_cache_utils.{STOP.qualname}(off, specs)
    print(json.dumps(None))
except Exception as exc:
    print(json.dumps(f"{{type(exc).__name__}}: {{exc}}"))
"""


def test_without_the_shim_the_hybrid_off_path_dies_with_the_reported_error():
    report = last_json(run_python(OFF, env={"DSPARK_HOTFIX": "0"}).stdout)
    assert report["error"] == "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
    assert report["views"]["draft.0.swa"]["shape"] == [4, 256, 512]


def test_with_the_shim_it_stops_at_kv_cache_grouping_naming_the_cause_and_what_helps():
    report = last_json(run_python(OFF).stdout)
    error = report["error"]
    assert error.startswith(f"HotfixError: {STOP.name}: DeepSeek-V4's fp8_ds_mla KV caches (5 layers, ")
    assert ("need vLLM's hybrid KV cache manager, and it is off (--disable-hybrid-kv-cache-manager, or vLLM turned it "
            "off and logged why: a --kv-transfer-config connector without hybrid support)") in error
    assert "leave the hybrid manager on" in error and "no vLLM release up to 0.33.0 runs DeepSeek-V4" in error
    assert "PR #47716" not in error  # a release with it fails the same way
    assert report["views"] == {}  # stopped before any view was built


def test_the_stop_says_the_same_where_a_kv_connector_turned_the_manager_off():
    # The config keeps the flag, not its reason; vLLM's own log says which turned it off.
    error, off = last_json(run_python(CONNECTOR).stdout), last_json(run_python(OFF).stdout)["error"]
    assert error.startswith(f"HotfixError: {STOP.name}: DeepSeek-V4's fp8_ds_mla KV caches (1 layers, ")
    assert error.partition(" need ")[2] == off.partition(" need ")[2]


def test_with_the_stop_excluded_vllm_meets_its_own_error_and_the_line_says_the_stop_was_needed():
    proc = run_python(OFF, env={"DSPARK_HOTFIX_PATCHES": f"-{STOP.name}"})
    assert last_json(proc.stdout)["error"] == ("RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, "
                                               "bytes_per_token)")
    (line,) = summary_lines(proc.stderr)
    assert line.split(": ", 1)[1].startswith("problem: ") and f"1 excluded ({STOP.name})" in line


def test_with_the_manager_on_the_stop_passes_everything_through():
    on = last_json(run_python(OFF.replace("warmup.run(False)", "warmup.run()")).stdout)
    off = last_json(run_python(OFF.replace("warmup.run(False)", "warmup.run()"), env={"DSPARK_HOTFIX": "0"}).stdout)
    assert on["error"] is None and on["views"]["draft.0.swa"]["shape"] == [4, 64, 584]
    assert off["views"]["draft.0.swa"]["shape"] == [4, 64, 512]  # the spec patches, not the stop, make the difference


def test_where_the_hybrid_off_path_keeps_the_layout_the_stop_is_not_needed(tmp_path):
    standin = edited_standin(tmp_path / "standin", {module_file(STOP): FIXED[module_file(STOP)]})
    proc = run_python(IMPORT_ALL + STATUS, path=(REPO, standin))
    rows = last_json(proc.stdout)
    assert rows[STOP.name]["state"] == "not_needed"
    assert rows[STOP.name]["detail"] == "not needed (vLLM's hybrid-off grouping keeps the fp8_ds_mla layout)"
    (summary,) = summary_lines(proc.stderr)
    patched = [name for name in PATCHES if name != STOP.name]
    assert summary.endswith(f": fixing: {len(patched)} patched ({', '.join(patched)}), 1 not_needed")


def test_a_vllm_without_kv_cache_utils_grouping_does_not_need_the_stop(tmp_path):
    standin = edited_standin(tmp_path / "standin", {module_file(STOP): [
        (f"def {method(STOP)}(", f"def {method(STOP)}_elsewhere(")]})
    rows = last_json(run_python(IMPORT_ALL + STATUS, path=(REPO, standin)).stdout)
    assert rows[STOP.name]["state"] == "not_needed"
    assert rows[STOP.name]["detail"].startswith(f"not needed ({STOP.module} defines no {method(STOP)}: its KV-cache "
                                                "grouping lives elsewhere")
