"""The spec correction on the stand-in build's types: 512 -> 584 bytes/token, and its properties.

The spec correction may touch only DeepSeek-V4 ``fp8_ds_mla`` specs, and must
give them 584 bytes per token; the oracles of the properties are written from
that contract, not from the implementation. The stand-in's warm-up crashes
without it and runs with it (in this process, on the ``standin_shim`` fixture of
tests/patches/conftest.py).

This module is the layout both spec patches share, so it names those two.
"""

from __future__ import annotations

import dataclasses
import re
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dspark_hotfix.patches import ALL
from dspark_hotfix.patches.fp8_ds_mla import (
    BYTES_PER_TOKEN,
    CACHE_DTYPE,
    CorrectionFailed,
    fp8_ds_mla_spec,
    quant_mode,
    runner_bytes_per_token,
)
from tests.patches import engine_start

# The patches that correct a spec with this module, whichever ALL has: this module's tests hold
# without any one of them.
SPEC_PATCHES = [p for p in ALL if p.qualname.endswith(".get_kv_cache_spec")]

CONFIG = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))


def as_reported(spec, **defect):
    """The spec as the reported build returns it: no ``kv_quant_mode`` (and what else ``defect``
    names), whether or not the stand-in still carries that patch's defect (removing a patch takes
    it out, tests/test_lifecycle.py)."""
    none = type(spec.kv_quant_mode).NONE
    # The page size padded anew, from the alignment the reported build gives.
    return dataclasses.replace(spec, kv_quant_mode=none, page_size_padded=None, **defect)


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
            {"layer": blocks * spec.page_size_bytes},
            dtype,
            [64],
            {},
        )["layer"],
    )


def test_swa_spec_512_to_584_bytes_per_token(vllm):
    before = as_reported(vllm.DeepseekV4SWACache().get_kv_cache_spec(CONFIG))
    mode = vllm.get_kv_quant_mode("fp8_ds_mla")
    after = fp8_ds_mla_spec(before, "fp8_ds_mla", mode)
    assert runner_bytes_per_token(before) == 512 and runner_bytes_per_token(after) == 584
    assert after.kv_quant_mode == vllm.KVQuantMode.FP8_PER_TENSOR
    assert (after.alignment, after.cache_dtype_str, after.page_size_bytes) == (
        576,
        "fp8_ds_mla",
        37440,
    )
    # The V2 runner's own rule now builds the view FlashMLA accepts.
    shape, stride = vllm.kv_view_layout(after, vllm.DeepseekSparseSWABackend, 4, "fp8_ds_mla")
    assert (shape, stride) == ((4, 64, 584), (37440, 584, 1))
    assert vllm.kv_view_layout(before, vllm.DeepseekSparseSWABackend, 4, "fp8_ds_mla")[0] == (
        4,
        64,
        512,
    )


def test_attention_spec_gets_quant_mode_and_alignment(vllm):
    layer = vllm.DeepseekV4Attention(compress_ratio=4)
    before = as_reported(layer.get_kv_cache_spec(CONFIG), alignment=None)
    after = fp8_ds_mla_spec(before, layer.kv_cache_dtype, vllm.get_kv_quant_mode("fp8_ds_mla"))
    assert before.page_size_bytes == 37376
    assert after.alignment == 576 and after.page_size_bytes == 37440  # 64 slots x 584, padded
    assert vllm.kv_view_layout(after, vllm.DeepseekV4FlashMLABackend, 4, "fp8_ds_mla")[0] == (
        4,
        64,
        584,
    )


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
        block_size=64,
        num_kv_heads=1,
        head_size=512,
        dtype=vllm.DeepseekV4SWACache().dtype,
        sliding_window=128,
        cache_dtype_str="auto",
        model_version="other",
    )
    with pytest.raises(CorrectionFailed, match="not 584"):
        fp8_ds_mla_spec(spec, "fp8_ds_mla", vllm.get_kv_quant_mode("fp8_ds_mla"))


@pytest.mark.parametrize("patch", SPEC_PATCHES, ids=lambda p: p.name)
def test_probe_finds_the_defect_in_the_standin(vllm, patch):
    module = __import__(patch.module, fromlist=["_"])
    cls_name, _, method = patch.qualname.partition(".")
    verdict = patch.probe(getattr(module, cls_name).__dict__[method])
    assert verdict.needed is True
    assert "512 bytes/token" in verdict.detail and "584" in verdict.detail


@pytest.mark.parametrize("patch", SPEC_PATCHES, ids=lambda p: p.name)
def test_the_correction_of_vllms_spec_gives_the_layout(vllm, patch):
    module = __import__(patch.module, fromlist=["_"])
    cls_name, _, method = patch.qualname.partition(".")
    cls = getattr(module, cls_name)
    layer = cls(compress_ratio=4) if cls is vllm.DeepseekV4Attention else cls()
    fixed = patch.correction(vars(cls)[method](layer, CONFIG), layer, CONFIG)
    assert runner_bytes_per_token(fixed) == 584 and fixed.page_size_bytes == 37440


def test_a_field_left_out_of_equality_is_kept(vllm):
    # vLLM 0.33's AttentionSpec has is_draft = field(compare=False): the rebuilt spec keeps it.
    from vllm.v1.kv_cache_interface import SlidingWindowMLASpec

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class DraftAwareSpec(SlidingWindowMLASpec):
        is_draft: bool = dataclasses.field(default=False, compare=False)

    base = {
        f.name: getattr(vllm.DeepseekV4SWACache().get_kv_cache_spec(CONFIG), f.name)
        for f in dataclasses.fields(SlidingWindowMLASpec)
    }
    mode = vllm.get_kv_quant_mode("fp8_ds_mla")
    got = [
        fp8_ds_mla_spec(DraftAwareSpec(**base, is_draft=d), "fp8_ds_mla", mode)
        for d in (False, True)
    ]
    assert [g.is_draft for g in got] == [False, True]
    assert all(runner_bytes_per_token(g) == 584 for g in got)


def test_warmup_crashes_without_the_shim(standin_shim, monkeypatch):
    # Which cache FlashMLA refuses first depends on which spec patches' defects the stand-in has.
    off = engine_start(standin_shim, monkeypatch, "0")
    assert re.fullmatch(
        r"RuntimeError: (extra_)?kv must have shape "
        r"\(num_blocks, page_block_size, h_kv, bytes_per_token\)",
        off["error"],
    ), off["error"]
    assert min(view["shape"][-1] for view in off["views"].values()) == 512


def test_warmup_runs_with_the_shim(standin_shim, monkeypatch):
    on = engine_start(standin_shim, monkeypatch, "1")
    assert on["error"] is None
    assert on["views"]["draft.0.swa"] == {
        "shape": [4, 64, 584],
        "stride": [37440, 584, 1],
        "page_bytes": 37440,
    }


# Reproducible in CI, and no .hypothesis/ directory written into the checkout.
PROPERTY = settings(database=None, derandomize=True, deadline=None, max_examples=200)
WITH_STANDIN = settings(
    PROPERTY, max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the stand-in is imported once per test; examples never modify it


# Spec correction. A generated stand-in spec, and the layer cache dtype vLLM's
# method saw; consistent the way vLLM builds them (the spec's cache_dtype_str
# comes from the layer, or is unset).
CACHE_DTYPES = ("fp8_ds_mla", "auto", "bfloat16", "fp8", "fp8_e4m3", "nvfp4_ds_mla")


OTHER_DTYPES = tuple(d for d in CACHE_DTYPES if d != CACHE_DTYPE)


def draw_spec(data, kvi, inside: bool | None = None):
    """``inside``: True, an fp8_ds_mla case; False, any other layout; None, either."""
    if inside is None:
        inside = data.draw(st.booleans(), label="fp8_ds_mla case")
    if (
        inside
    ):  # the layer says fp8_ds_mla (the spec's string may have degraded), or only the spec does
        layer_dtype = data.draw(st.sampled_from([CACHE_DTYPE, None]), label="layer cache dtype")
        spec_dtype = data.draw(
            st.sampled_from([CACHE_DTYPE, None, "auto"] if layer_dtype else [CACHE_DTYPE])
        )
    else:
        layer_dtype = data.draw(st.sampled_from([*OTHER_DTYPES, None]), label="layer cache dtype")
        spec_dtype = data.draw(
            st.sampled_from([layer_dtype, None] if layer_dtype else OTHER_DTYPES)
        )
    cls = data.draw(
        st.sampled_from([kvi.MLAAttentionSpec, kvi.SlidingWindowMLASpec]), label="class"
    )
    fields = dict(
        block_size=64 * data.draw(st.integers(1, 16), label="block / 64"),
        num_kv_heads=1,
        head_size=512,
        dtype=kvi.uint8,
        compress_ratio=data.draw(st.sampled_from([1, 4]), label="compress ratio"),
        alignment=data.draw(st.sampled_from([None, 512, 576]), label="alignment"),
        kv_quant_mode=data.draw(st.sampled_from(list(kvi.KVQuantMode)), label="kv_quant_mode"),
        cache_dtype_str=spec_dtype,
        model_version="deepseek_v4",
    )
    if cls is kvi.SlidingWindowMLASpec:
        fields["sliding_window"] = data.draw(st.sampled_from([128, 4096]), label="window")
    return cls(**fields), layer_dtype


def v2_view(spec, backend):
    """Shape and strides of the KV view the stand-in's V2 runner builds from ``spec``."""
    from vllm.v1.worker.gpu import attn_utils

    reshape = vars(attn_utils)["_reshape_kv_cache"]
    reshape = getattr(reshape, "__wrapped__", reshape)  # vLLM's own rule, not a guard around it
    group = SimpleNamespace(kv_cache_spec=spec, layer_names=["layer"], backend=backend)
    view = reshape([group], {"layer": 4 * spec.page_size_bytes}, CACHE_DTYPE, None, None)["layer"]
    return view.shape, view.stride


def in_fp8_ds_mla_case(spec, layer_dtype) -> bool:
    return CACHE_DTYPE in (layer_dtype, spec.cache_dtype_str)


@WITH_STANDIN
@given(st.data())
def test_spec_correction_returns_every_other_spec_as_the_same_object(standin_modules, data):
    from vllm.v1 import kv_cache_interface as kvi

    spec, layer_dtype = draw_spec(data, kvi, inside=False)
    mode = kvi.get_kv_quant_mode(CACHE_DTYPE)
    assert not in_fp8_ds_mla_case(spec, layer_dtype)
    assert fp8_ds_mla_spec(spec, layer_dtype, mode) is spec
    assert fp8_ds_mla_spec(None, layer_dtype, mode) is None


@WITH_STANDIN
@given(st.data())
def test_spec_correction_gives_584_bytes_per_token_and_keeps_the_geometry(standin_modules, data):
    from vllm.models.deepseek_v4.attention import DeepseekV4FlashMLABackend
    from vllm.v1 import kv_cache_interface as kvi

    spec, layer_dtype = draw_spec(data, kvi, inside=True)
    assert in_fp8_ds_mla_case(spec, layer_dtype)
    fixed = fp8_ds_mla_spec(spec, layer_dtype, kvi.get_kv_quant_mode(CACHE_DTYPE))
    assert runner_bytes_per_token(fixed) == BYTES_PER_TOKEN
    shape, stride = v2_view(fixed, DeepseekV4FlashMLABackend)
    assert (
        shape[2] == BYTES_PER_TOKEN
        and stride[0] * fixed.dtype.itemsize >= shape[1] * BYTES_PER_TOKEN
    )
    kept = ("block_size", "num_kv_heads", "head_size", "dtype", "compress_ratio", "sliding_window")
    assert all(getattr(fixed, f, None) == getattr(spec, f, None) for f in kept)


@WITH_STANDIN
@given(st.data())
def test_spec_correction_is_idempotent(standin_modules, data):
    from vllm.v1 import kv_cache_interface as kvi

    spec, layer_dtype = draw_spec(data, kvi)
    mode = kvi.get_kv_quant_mode(CACHE_DTYPE)
    once = fp8_ds_mla_spec(spec, layer_dtype, mode)
    assert fp8_ds_mla_spec(once, layer_dtype, mode) is once


@WITH_STANDIN
@given(st.integers(1, 16), st.sampled_from(CACHE_DTYPES), st.sampled_from([128, 4096]))
def test_the_correction_of_the_standin_swa_spec_holds_for_every_block_size(
    standin_modules, blocks, dtype, window
):
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    layer = DeepseekV4SWACache(window_size=window, cache_dtype=dtype)
    layer.block_size = 64 * blocks
    method = DeepseekV4SWACache.__dict__["get_kv_cache_spec"]
    method = getattr(method, "__wrapped__", method)
    spec = as_reported(method(layer, SimpleNamespace()))
    fixed = fp8_ds_mla_spec(spec, dtype, quant_mode())
    if dtype == CACHE_DTYPE:
        assert (
            runner_bytes_per_token(spec) == 512 and runner_bytes_per_token(fixed) == BYTES_PER_TOKEN
        )
    else:
        assert fixed == spec
