"""The view guard in real subprocesses on the stand-in: a narrow KV view stops vLLM naming the patch that did
not apply, and the guard waits for the patches it guards."""

from __future__ import annotations

from tests.cases import SWA, VIEW_GUARD
from tests.conftest import (
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    WARMUP,
    last_json,
    run_python,
)


def test_view_guard_turns_a_narrow_view_into_a_clear_error_when_the_swa_patch_is_off():
    report = last_json(run_python(WARMUP, env={"DSPARK_HOTFIX_PATCHES": f"-{SWA.name}"}).stdout)
    error = report["error"]
    assert error.startswith(f"HotfixError: {VIEW_GUARD.name}: DeepSeek-V4 fp8_ds_mla KV views FlashMLA would reject")
    # Each kind of spec once, with the layers counted; the cause named: the patch that was excluded.
    assert "SlidingWindowMLASpec(kv_quant_mode=NONE) viewed at 512 bytes/token: target.swa and 3 more layers" in error
    assert error.count("SlidingWindowMLASpec(kv_quant_mode=NONE)") == 1  # the other spec was corrected
    assert "MLAAttentionSpec(kv_quant_mode=NONE) viewed" not in error
    assert f"{SWA.name} excluded (excluded by DSPARK_HOTFIX_PATCHES; needed (vLLM returns 512" in error
    assert "see `dspark-hotfix doctor`" in error and len(error) < 700


def test_view_guard_names_a_spec_patch_that_failed_not_one_to_enable(broken_standin):
    warmup = WARMUP.replace(str(STANDIN), str(broken_standin))
    report = last_json(run_python(warmup, path=(REPO, broken_standin)).stdout)
    assert report["error"].startswith(f"HotfixError: {VIEW_GUARD.name}: ")
    assert f"{SWA.name} failed (unexpected signature DeepseekV4SWACache.get_kv_cache_spec" in report["error"]
    assert "DSPARK_HOTFIX_PATCHES" not in report["error"]


def test_view_guard_waits_for_the_spec_patches_when_the_runner_is_imported_first():
    code = "import vllm.v1.worker.gpu.attn_utils\n" + STATUS + "\n" + IMPORT_ALL + STATUS
    first, then = (__import__("json").loads(line) for line in run_python(code).stdout.strip().splitlines()[-2:])
    assert first[VIEW_GUARD.name]["state"] == "pending"
    assert f"and the patches it guards ({VIEW_GUARD.guards[0]}" in first[VIEW_GUARD.name]["detail"]
    assert then[VIEW_GUARD.name]["state"] == "patched"
