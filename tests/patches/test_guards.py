"""The guards: their checks as plain functions (what counts as a problem, and what vLLM itself exempts),
and the view guard and the draft-load guard in real subprocesses on the stand-in."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dspark_hotfix.patches import Finding
from tests.cases import LOAD_GUARD, REMAP, SWA, VIEW_GUARD
from tests.conftest import (
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    WARMUP,
    last_json,
    log_lines,
    run_python,
)

load_weights = LOAD_GUARD.replacement


class Module:
    def __init__(self, params, quant_method=None):
        self.params, self.quant_method = params, quant_method

    def named_parameters(self):
        return [(p, None) for p in self.params]


def draft(modules: dict[str, Module]):
    registered = [(f"{prefix}.{p}", None) for prefix, m in modules.items() for p in m.params]
    return SimpleNamespace(named_parameters=lambda: registered, named_modules=lambda: list(modules.items()))


def test_none_from_load_weights_means_not_tracked_as_in_vllms_loader():
    d = draft({"model.layers.0.attn": Module(["wkv.weight"])})
    assert load_weights(lambda self, w: None, d, []) is None


def test_parameters_a_quantization_method_fills_after_loading_are_exempt_as_in_vllms_loader():
    fp8 = SimpleNamespace(process_weights_after_loading=lambda layer: None)
    d = draft({"model.layers.0.attn.wkv": Module(["weight", "k_scale"], quant_method=fp8),
               "model.layers.0.ffn.gate": Module(["weight"]),
               "model.embed_tokens": Module(["weight"])})
    loaded = {"model.layers.0.attn.wkv.weight"}
    with pytest.raises(Finding, match=r"^1 DSpark draft parameters were never loaded from the checkpoint: "
                                      r"model\.layers\.0\.ffn\.gate\.weight;"):
        load_weights(lambda self, w: set(loaded), d, [])
    assert load_weights(lambda self, w: loaded | {"model.layers.0.ffn.gate.weight"}, d, []) is not None


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


def test_draft_load_guard_names_the_unloaded_layers_when_the_remap_is_off():
    proc = run_python(WARMUP, env={"DSPARK_HOTFIX_PATCHES": f"-{REMAP.name}"})
    errors = log_lines(proc.stderr, "ERROR")
    assert len(errors) == 1 and errors[0].startswith(f"{LOAD_GUARD.name}: 6 DSpark draft parameters were never loaded")
    assert "model.layers.0.attn.wkv.weight" in errors[0] and "lm_head" not in errors[0]
    assert f"{REMAP.name} excluded" in errors[0]
    assert log_lines(run_python(WARMUP).stderr, "ERROR") == []  # with the remap patch: all loaded


def test_draft_load_guard_reads_none_as_not_tracked_as_vllm_does(tmp_path):
    # vLLM's DefaultModelLoader checks coverage only when load_weights returns a set.
    from tests.conftest import edited_standin

    root = edited_standin(tmp_path / "standin", {
        "vllm/models/deepseek_v4/nvidia/dspark.py": [("        return loaded\n", "        return None\n")]})
    env = {"DSPARK_HOTFIX_PATCHES": f"-{REMAP.name}", "DSPARK_HOTFIX_STRICT": "1"}
    proc = run_python(WARMUP.replace(str(STANDIN), str(root)), path=(REPO, root), env=env)
    assert log_lines(proc.stderr, "ERROR") == [] and last_json(proc.stdout)["loaded"] is None
