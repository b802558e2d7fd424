"""Properties of the two corrections over generated names, drafts and specs.

The remap correction may change exactly one kind of answer (``mtp.{i}.<rest>``
sent to ``model.layers.{j}.<rest>`` with ``j`` outside the draft's layers and
``i`` inside); the spec correction may touch only DeepSeek-V4 ``fp8_ds_mla``
specs, and must give them 584 bytes per token. The oracles below are written
from that contract, not from the implementation.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dspark_hotfix.patches.fp8_ds_mla import BYTES_PER_TOKEN, CACHE_DTYPE, fp8_ds_mla_spec, runner_bytes_per_token
from dspark_hotfix.patches.remap_dspark_name import PATCH as REMAP
from dspark_hotfix.patches.remap_dspark_name import remap_dspark_name

# Reproducible in CI, and no .hypothesis/ directory written into the checkout.
PROPERTY = settings(database=None, derandomize=True, deadline=None, max_examples=200)
WITH_STANDIN = settings(
    PROPERTY, max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the stand-in is imported once per test; examples never modify it

# A checkpoint's draft names are f"mtp.{i}.{rest}" with an int i: ASCII digits only.
MTP = re.compile(r"mtp\.([0-9]+)\.(.*)", re.DOTALL)
LAYER = re.compile(r"model\.layers\.([0-9]+)\.(.*)", re.DOTALL)
HEAD = ("norm.weight", "markov_head.weight", "main_proj.weight", "main_norm.weight", "hc_head_fn")
LAYER_WEIGHTS = ("attn.wkv.weight", "ffn.gate.weight")


def defect_answer(name: str, mapped: str | None, draft_layers: int | None) -> str | None:
    """What the correction must answer instead of ``mapped``; None: ``mapped`` stands."""
    if mapped is None or draft_layers is None:
        return None
    src, dst = MTP.fullmatch(name), LAYER.fullmatch(mapped)
    if not (src and dst) or src[2] != dst[2]:
        return None
    i, j = int(src[1]), int(dst[1])
    if j < draft_layers or i >= draft_layers:
        return None
    return f"model.layers.{i}.{src[2]}"


def layer_index(answer: str | None) -> int | None:
    match = LAYER.fullmatch(answer or "")
    return int(match[1]) if match else None


# Digits as a checkpoint writes them, and look-alikes that str.isdigit() accepts
# but int() rejects (superscripts). Non-ASCII decimal digits, which int() reads,
# are left out: no checkpoint has them, and either answer would do.
index = st.one_of(
    st.integers(0, 99).map(str),
    st.sampled_from(["00", "01", "007", "0x1", "-1", "", "\u00b2", "\u00b9", "\u00b3\u00b2"]),
)
rest = st.one_of(st.sampled_from(LAYER_WEIGHTS + HEAD + ("", ".", "x.y.z")), st.text(max_size=12))


@st.composite
def shifted_cases(draw):
    """The reported defect's shape: mtp.{i}.<rest> answered model.layers.{i + shift}.<rest>."""
    i, shift, tail = draw(st.integers(0, 9)), draw(st.integers(0, 64)), draw(rest)
    return f"mtp.{i}.{tail}", f"model.layers.{i + shift}.{tail}", draw(st.one_of(st.none(), st.integers(0, 8)))


@st.composite
def remap_cases(draw):
    if draw(st.booleans()):
        return draw(shifted_cases())
    i, tail = draw(index), draw(rest)
    name = draw(
        st.one_of(
            st.just(f"mtp.{i}.{tail}"),
            st.sampled_from([f"mtp.{i}", f"layers.{i}.{tail}", f"model.layers.{i}.{tail}", f"MTP.{i}.{tail}"]),
            st.text(max_size=24),
        )
    )
    j = draw(st.one_of(index, st.integers(0, 200).map(str)))
    mapped = draw(
        st.one_of(
            st.none(),
            st.just(f"model.layers.{j}.{tail}"),
            st.just(f"model.layers.{j}.{draw(rest)}"),
            st.just(f"model.{tail}"),
            st.text(max_size=24),
        )
    )
    draft_layers = draw(st.one_of(st.none(), st.integers(0, 8)))
    return name, mapped, draft_layers


@PROPERTY
@given(remap_cases())
@example(("mtp.1.attn.wkv.weight", "model.layers.44.attn.wkv.weight", 3))  # the reported defect
@example(("mtp.3.attn.wkv.weight", "model.layers.46.attn.wkv.weight", 3))  # no layer 3 to land on
@example(("mtp.\u00b2.attn.wkv.weight", "model.layers.44.attn.wkv.weight", 3))  # isdigit() but not int()
@example(("mtp.1.attn.wkv.weight", "model.layers.\u2074\u2074.attn.wkv.weight", 3))
def test_remap_changes_only_a_shifted_draft_layer_and_keeps_every_other_answer(case):
    name, mapped, draft_layers = case
    answer = remap_dspark_name(name, mapped, draft_layers)
    expected = defect_answer(name, mapped, draft_layers)
    if expected is None:
        assert answer is mapped
    else:
        assert answer == expected


@PROPERTY
@given(remap_cases())
def test_remap_never_points_outside_the_draft_unless_vllm_did(case):
    name, mapped, draft_layers = case
    try:
        answer = remap_dspark_name(name, mapped, draft_layers)
    except ValueError:  # reported by the test above; this one is about where answers point
        return
    if answer != mapped:
        assert draft_layers is not None and 0 <= layer_index(answer) < draft_layers
    elif layer_index(answer) is not None and (draft_layers is None or layer_index(answer) >= draft_layers):
        assert answer is mapped  # out of range only because vLLM said so


@PROPERTY
@given(st.text(max_size=40), st.one_of(st.none(), st.integers(-2, 64)))
def test_remap_keeps_none(name, draft_layers):
    assert remap_dspark_name(name, None, draft_layers) is None


@st.composite
def checkpoint_names(draw, draft_layers: int):
    i = draw(st.integers(0, draft_layers + 2))
    return draw(
        st.sampled_from(
            [f"mtp.{i}.{w}" for w in LAYER_WEIGHTS + HEAD] + [f"layers.{i}.attn.wkv.weight", f"mtp.{i}.confidence_x"]
        )
    )


def vllm_remap(draft_class):
    """vLLM's own ``_remap_dspark_name``, even if a shim in this process wrapped it."""
    function = draft_class.__dict__["_remap_dspark_name"]
    return getattr(function, "__wrapped__", function)


@WITH_STANDIN
@given(st.data(), st.integers(0, 96), st.integers(1, 8))
def test_standin_draft_weights_land_on_the_draft_layers_through_the_correction(standin_modules, data, n, k):
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    draft = DSparkDeepseekV4ForCausalLM(num_hidden_layers=n, n_mtp_layers=k)
    remap = vllm_remap(DSparkDeepseekV4ForCausalLM)
    for name in data.draw(st.lists(checkpoint_names(k), min_size=1, max_size=12)):
        mapped = remap(draft, name)  # the reported build's answer
        fixed = REMAP.replacement(remap, draft, name)  # the patched method
        assert fixed == (defect_answer(name, mapped, k) or mapped)
        src = MTP.fullmatch(name)
        if src and src[2] in LAYER_WEIGHTS and int(src[1]) < k and n + int(src[1]) >= k:
            assert fixed == f"model.layers.{src[1]}.{src[2]}"  # the draft's own layer
        elif src and src[2] in LAYER_WEIGHTS and int(src[1]) >= k:
            assert fixed == mapped  # no such draft layer: vLLM's answer stands
        if src is None:
            assert fixed is None


@WITH_STANDIN
@given(st.integers(1, 8).flatmap(lambda k: st.tuples(st.integers(k, 96), st.just(k))))
def test_standin_draft_receives_every_layer_weight_through_the_correction(standin_modules, shape):
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    n, k = shape  # every DeepSeek-V4 model has at least as many target layers as draft layers
    draft = DSparkDeepseekV4ForCausalLM(num_hidden_layers=n, n_mtp_layers=k)
    remap = vllm_remap(DSparkDeepseekV4ForCausalLM)
    checkpoint = [f"mtp.{i}.{w}" for i in range(k) for w in LAYER_WEIGHTS]
    layer_params = {p for p, _ in draft.named_parameters() if p.startswith("model.layers.")}
    assert n == 0 or not {remap(draft, name) for name in checkpoint} & layer_params - {
        f"model.layers.{i}.{w}" for i in range(min(n, k)) for w in LAYER_WEIGHTS}  # vLLM's answers miss
    assert {REMAP.replacement(remap, draft, name) for name in checkpoint} == layer_params


# Spec correction. A generated stand-in spec, and the layer cache dtype vLLM's
# method saw; consistent the way vLLM builds them (the spec's cache_dtype_str
# comes from the layer, or is unset).
CACHE_DTYPES = ("fp8_ds_mla", "auto", "bfloat16", "fp8", "fp8_e4m3", "nvfp4_ds_mla")


OTHER_DTYPES = tuple(d for d in CACHE_DTYPES if d != CACHE_DTYPE)


def draw_spec(data, kvi, inside: bool | None = None):
    """``inside``: True, an fp8_ds_mla case; False, any other layout; None, either."""
    if inside is None:
        inside = data.draw(st.booleans(), label="fp8_ds_mla case")
    if inside:  # the layer says fp8_ds_mla (the spec's string may have degraded), or only the spec does
        layer_dtype = data.draw(st.sampled_from([CACHE_DTYPE, None]), label="layer cache dtype")
        spec_dtype = data.draw(st.sampled_from([CACHE_DTYPE, None, "auto"] if layer_dtype else [CACHE_DTYPE]))
    else:
        layer_dtype = data.draw(st.sampled_from([*OTHER_DTYPES, None]), label="layer cache dtype")
        spec_dtype = data.draw(st.sampled_from([layer_dtype, None] if layer_dtype else OTHER_DTYPES))
    cls = data.draw(st.sampled_from([kvi.MLAAttentionSpec, kvi.SlidingWindowMLASpec]), label="class")
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
    assert shape[2] == BYTES_PER_TOKEN and stride[0] * fixed.dtype.itemsize >= shape[1] * BYTES_PER_TOKEN
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
def test_swa_patch_corrects_the_standin_method_for_every_block_size(standin_modules, blocks, dtype, window):
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    from dspark_hotfix.patches.swa_kv_cache_spec import PATCH as SWA

    layer = DeepseekV4SWACache(window_size=window, cache_dtype=dtype)
    layer.block_size = 64 * blocks
    method = DeepseekV4SWACache.__dict__["get_kv_cache_spec"]
    method = getattr(method, "__wrapped__", method)
    spec = method(layer, SimpleNamespace())
    fixed = SWA.replacement(method, layer, SimpleNamespace())
    if dtype == CACHE_DTYPE:
        assert runner_bytes_per_token(spec) == 512 and runner_bytes_per_token(fixed) == BYTES_PER_TOKEN
    else:
        assert fixed == spec
