"""The spec correction on the stand-in build's types: 512 -> 584 bytes/token."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from dspark_hotfix.patches.attention_kv_cache_spec import PATCH as ATTENTION
from dspark_hotfix.patches.fp8_ds_mla import (
    CorrectionFailed,
    fp8_ds_mla_spec,
    runner_bytes_per_token,
)
from dspark_hotfix.patches.swa_kv_cache_spec import PATCH as SWA

CONFIG = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))


@pytest.fixture
def vllm(standin_modules):
    from vllm.models.deepseek_v4 import attention
    from vllm.v1 import kv_cache_interface
    from vllm.v1.attention.backends.mla import sparse_swa
    from vllm.v1.worker.gpu import attn_utils

    return SimpleNamespace(
        DeepseekV4Attention=attention.DeepseekV4Attention,
        DeepseekV4FlashMLABackend=attention.DeepseekV4FlashMLABackend,
        DeepseekV4SWACache=sparse_swa.DeepseekV4SWACache,
        DeepseekSparseSWABackend=sparse_swa.DeepseekSparseSWABackend,
        KVQuantMode=kv_cache_interface.KVQuantMode,
        get_kv_quant_mode=kv_cache_interface.get_kv_quant_mode,
        kv_view_layout=lambda spec, backend, blocks, dtype: attn_utils._reshape_kv_cache(
            [SimpleNamespace(kv_cache_spec=spec, backend=backend, layer_names=["layer"])],
            {"layer": blocks * spec.page_size_bytes}, dtype, [64], {},
        )["layer"],
    )


def test_swa_spec_512_to_584_bytes_per_token(vllm):
    layer = vllm.DeepseekV4SWACache()
    before = layer.get_kv_cache_spec(CONFIG)
    mode = vllm.get_kv_quant_mode("fp8_ds_mla")
    after = fp8_ds_mla_spec(before, "fp8_ds_mla", mode)
    assert runner_bytes_per_token(before) == 512 and runner_bytes_per_token(after) == 584
    assert after.kv_quant_mode == vllm.KVQuantMode.FP8_PER_TENSOR
    assert (after.alignment, after.cache_dtype_str, after.page_size_bytes) == (576, "fp8_ds_mla", 37440)
    # The V2 runner's own rule now builds the view FlashMLA accepts.
    shape, stride = vllm.kv_view_layout(after, vllm.DeepseekSparseSWABackend, 4, "fp8_ds_mla")
    assert (shape, stride) == ((4, 64, 584), (37440, 584, 1))
    assert vllm.kv_view_layout(before, vllm.DeepseekSparseSWABackend, 4, "fp8_ds_mla")[0] == (4, 64, 512)


def test_attention_spec_gets_quant_mode_and_alignment(vllm):
    layer = vllm.DeepseekV4Attention(compress_ratio=4)
    before = layer.get_kv_cache_spec(CONFIG)
    after = fp8_ds_mla_spec(before, layer.kv_cache_dtype, vllm.get_kv_quant_mode("fp8_ds_mla"))
    assert before.alignment is None and before.page_size_bytes == 37376
    assert after.alignment == 576 and after.page_size_bytes == 37440  # 64 slots x 584, padded
    assert vllm.kv_view_layout(after, vllm.DeepseekV4FlashMLABackend, 4, "fp8_ds_mla")[0] == (4, 64, 584)


def test_correction_is_idempotent_and_returns_the_same_object(vllm):
    mode = vllm.get_kv_quant_mode("fp8_ds_mla")
    once = fp8_ds_mla_spec(vllm.DeepseekV4SWACache().get_kv_cache_spec(CONFIG), "fp8_ds_mla", mode)
    assert fp8_ds_mla_spec(once, "fp8_ds_mla", mode) is once


@pytest.mark.parametrize("dtype", ["auto", "bfloat16", "nvfp4_ds_mla"])
def test_other_layouts_are_returned_as_the_same_object(vllm, dtype):
    spec = vllm.DeepseekV4SWACache(cache_dtype=dtype).get_kv_cache_spec(CONFIG)
    assert fp8_ds_mla_spec(spec, dtype, vllm.get_kv_quant_mode("fp8_ds_mla")) is spec


def test_none_stays_none(vllm):
    assert fp8_ds_mla_spec(None, "fp8_ds_mla", vllm.KVQuantMode.FP8_PER_TENSOR) is None


def test_a_rebuild_that_does_not_give_584_is_refused(vllm):
    # A spec class whose page rule ignores the layout: the correction must not
    # hand vLLM a spec it cannot vouch for.
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    spec = SlidingWindowMLASpec(
        block_size=64, num_kv_heads=1, head_size=512, dtype=vllm.DeepseekV4SWACache().dtype,
        sliding_window=128, cache_dtype_str="auto", model_version="other",
    )
    with pytest.raises(CorrectionFailed, match="not 584"):
        fp8_ds_mla_spec(spec, "fp8_ds_mla", vllm.get_kv_quant_mode("fp8_ds_mla"))


@pytest.mark.parametrize("patch", [ATTENTION, SWA], ids=lambda p: p.name)
def test_probe_finds_the_defect_in_the_standin(vllm, patch):
    module = __import__(patch.module, fromlist=["_"])
    cls_name, _, method = patch.qualname.partition(".")
    verdict = patch.probe(getattr(module, cls_name).__dict__[method])
    assert verdict.needed is True
    assert "512 bytes/token" in verdict.detail and "584" in verdict.detail


@pytest.mark.parametrize("patch", [ATTENTION, SWA], ids=lambda p: p.name)
def test_the_replacement_calls_vllm_and_returns_the_corrected_spec(vllm, patch):
    module = __import__(patch.module, fromlist=["_"])
    cls_name, _, method = patch.qualname.partition(".")
    cls = getattr(module, cls_name)
    layer = cls(compress_ratio=4) if cls is vllm.DeepseekV4Attention else cls()
    fixed = patch.replacement(vars(cls)[method], layer, CONFIG)
    assert runner_bytes_per_token(fixed) == 584 and fixed.page_size_bytes == 37440


def test_a_field_left_out_of_equality_is_kept(vllm):
    # vLLM 0.33's AttentionSpec has is_draft = field(compare=False): the rebuilt spec keeps it.
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class DraftAwareSpec(SlidingWindowMLASpec):
        is_draft: bool = dataclasses.field(default=False, compare=False)

    base = {f.name: getattr(vllm.DeepseekV4SWACache().get_kv_cache_spec(CONFIG), f.name)
            for f in dataclasses.fields(SlidingWindowMLASpec)}
    mode = vllm.get_kv_quant_mode("fp8_ds_mla")
    got = [fp8_ds_mla_spec(DraftAwareSpec(**base, is_draft=d), "fp8_ds_mla", mode) for d in (False, True)]
    assert [g.is_draft for g in got] == [False, True]
    assert all(runner_bytes_per_token(g) == 584 for g in got)
