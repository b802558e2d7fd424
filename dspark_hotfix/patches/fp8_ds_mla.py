"""The DeepSeek-V4 ``fp8_ds_mla`` KV-cache layout, and the spec correction both
spec patches share.

One token of the layout costs 584 bytes: a 576-byte body (448 fp8 e4m3 NoPE
values, 64 bf16 RoPE values) and an 8-byte scale record (7 UE8M0 scales, one per
64 NoPE values, and a pad byte); a page holds its 64 bodies, then their 64
scale records (docs/evidence/gpu-h200.md). FlashMLA reads pages padded to a
multiple of 576 bytes: a 64-slot page is 64 x 584 = 37376 B, padded to 37440 B.

vLLM's V2 GPU model runner (vllm-project/vllm PR #42890) builds a layer's KV
view with cache dtype ``"auto"`` whenever ``spec.kv_quant_mode`` is
``KVQuantMode.NONE``; the DeepSeek-V4 backends then give 512 bytes per token
(the semantic head size) instead of 584, ``torch.as_strided`` accepts that
silently over the padded pages, and FlashMLA rejects it:
``kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)``.
"""

import dataclasses
import logging
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dspark_hotfix.patches.base import Need

CACHE_DTYPE = "fp8_ds_mla"
BYTES_PER_TOKEN = 584
PAGE_ALIGNMENT = 576
MODEL_VERSION = "deepseek_v4"


class CorrectionFailed(Exception):
    """The rebuilt spec does not give the layout's 584 bytes per token."""


def fp8_ds_mla_spec(spec: Any, layer_cache_dtype: str | None, quant_mode: Any) -> Any:
    """Return a DeepSeek-V4 KV-cache spec that carries the ``fp8_ds_mla`` layout.

    ``spec`` is what vLLM's ``get_kv_cache_spec`` returned for a layer whose
    cache dtype is ``layer_cache_dtype``; ``quant_mode`` is
    ``get_kv_quant_mode("fp8_ds_mla")`` of the running vLLM. ``None``, specs of
    other layouts and specs that already carry the layout are returned as the
    very same object. Otherwise the spec is rebuilt with the fields its class
    has, so that its derived page size is recomputed by vLLM's own rule.
    """
    if spec is None:
        return spec
    if layer_cache_dtype != CACHE_DTYPE and getattr(spec, "cache_dtype_str", None) != CACHE_DTYPE:
        return spec
    if holds_layout(spec, quant_mode):
        return spec
    layout = {  # set where the spec's class has the field
        "cache_dtype_str": CACHE_DTYPE,
        "alignment": PAGE_ALIGNMENT,
        "page_size_padded": None,  # derived from the alignment in __post_init__
        "model_version": getattr(spec, "model_version", None) or MODEL_VERSION,
        "state_content_bytes": getattr(spec, "state_content_bytes", None) or BYTES_PER_TOKEN,
    }
    fields = {f.name for f in dataclasses.fields(spec) if f.init}
    fixed = dataclasses.replace(
        spec, kv_quant_mode=quant_mode, **{k: v for k, v in layout.items() if k in fields}
    )
    got = runner_bytes_per_token(fixed)
    if got != BYTES_PER_TOKEN or fixed.page_size_bytes % PAGE_ALIGNMENT:
        raise CorrectionFailed(
            f"rebuilt {type(spec).__name__} gives {got} bytes/token and a {fixed.page_size_bytes}-"
            f"byte page, not {BYTES_PER_TOKEN} on a {PAGE_ALIGNMENT}-byte alignment"
        )
    return fixed


def deepseek_v4_fp8_ds_mla(spec: Any) -> bool:
    """Whether ``spec`` is a DeepSeek-V4 cache of this layout."""
    return (
        getattr(spec, "model_version", None) == MODEL_VERSION
        and getattr(spec, "cache_dtype_str", None) == CACHE_DTYPE
    )


def holds_layout(spec: Any, quant_mode: Any) -> bool:
    """Whether ``spec`` already carries the layout. Any alignment counts: newer
    releases align packed pages to what the layer asks for (DeepSeek-V4.1's
    differ from 576), and a spec with its quantization mode set is vLLM's call."""
    return (
        spec.kv_quant_mode == quant_mode
        and getattr(spec, "cache_dtype_str", CACHE_DTYPE) == CACHE_DTYPE
        and getattr(spec, "alignment", PAGE_ALIGNMENT) is not None
    )


def runner_bytes_per_token(spec: Any) -> int:
    """Bytes per token of the KV view the V2 runner builds from ``spec``.

    A spec without a quantization mode is viewed with cache dtype ``"auto"``:
    head_size elements of the spec's dtype. Otherwise the spec's own page rule
    decides (real page bytes over the slots one page stores).
    """
    if int(spec.kv_quant_mode) == 0:  # KVQuantMode.NONE in every release
        return int(spec.head_size) * int(getattr(spec.dtype, "itemsize", 1))
    content = getattr(spec, "state_content_size_bytes", None)  # vLLM >= 0.28
    if content is not None:
        return int(content)
    slots = getattr(spec, "storage_block_size", spec.block_size)
    return int(spec.real_page_size_bytes) // int(slots)


def quant_mode() -> Any:
    """``get_kv_quant_mode("fp8_ds_mla")`` of the running vLLM."""
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    return get_kv_quant_mode(CACHE_DTYPE)


def uint8_dtype() -> Any:
    """``torch.uint8`` where vLLM has imported torch (its specs' dtype), else its name."""
    return getattr(sys.modules.get("torch"), "uint8", "uint8")


def probe_spec(get_kv_cache_spec: Callable[..., Any], layer: Any) -> Need:
    """Call vLLM's ``get_kv_cache_spec`` for a stand-in ``fp8_ds_mla`` layer."""
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype=CACHE_DTYPE))
    mode = quant_mode()  # raises where vLLM lacks get_kv_quant_mode: the patch cannot apply
    try:
        spec = get_kv_cache_spec(layer, config)
        if spec is None:
            return Need(None, "probe inconclusive (vLLM returned no spec)")
        width = runner_bytes_per_token(spec)
        fixed = fp8_ds_mla_spec(spec, CACHE_DTYPE, mode)
    except Exception as exc:  # any drift in vLLM's internals: undecided
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    if fixed is spec:
        return Need(False, f"not needed (vLLM already returns {width} bytes/token)")
    why = f"vLLM returns {width} bytes/token for {CACHE_DTYPE}; shim gives {BYTES_PER_TOKEN}"
    return Need(True, f"needed ({why})")


def stand_in_pair(interface: Any, mode: Any) -> dict[str, Any]:
    """A DeepSeek-V4 model's two kinds of ``fp8_ds_mla`` cache, as vLLM's specs (``interface`` is
    its ``vllm.v1.kv_cache_interface``): a compressed-attention layer's and a sliding-window
    layer's."""
    return {
        "full": _spec(interface.MLAAttentionSpec, mode, block_size=256, compress_ratio=4),
        "swa": _spec(interface.SlidingWindowMLASpec, mode, block_size=64, sliding_window=128),
    }


def _spec(cls: Any, mode: Any, **values: Any) -> Any:
    values.update(
        num_kv_heads=1,
        head_size=512,
        dtype=uint8_dtype(),
        kv_quant_mode=mode,
        cache_dtype_str=CACHE_DTYPE,
        alignment=PAGE_ALIGNMENT,
        model_version=MODEL_VERSION,
        state_content_bytes=BYTES_PER_TOKEN,
    )
    names = {f.name for f in dataclasses.fields(cls) if f.init}  # the fields this release has
    return cls(**{k: v for k, v in values.items() if k in names})


def hybrid_off(get_kv_cache_groups: Callable[..., Any]) -> tuple[dict[str, Any], Any]:
    """vLLM's ``get_kv_cache_groups`` run with the hybrid KV cache manager off on a stand-in pair:
    the specs after it, which it converts in place first, and what it raised (grouping needs a real
    config, so it raises past the conversion)."""
    specs = stand_in_pair(sys.modules["vllm.v1.kv_cache_interface"], quant_mode())
    config = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True),
        kv_transfer_config=None,
    )
    # vLLM warns "Hybrid KV cache manager is disabled" on this path: not in an operator's log for a
    # probe.
    log = logging.getLogger(get_kv_cache_groups.__module__)
    quiet, log.disabled, raised = log.disabled, True, None
    try:
        get_kv_cache_groups(config, specs)
    except Exception as exc:
        raised = exc
    finally:
        log.disabled = quiet
    return specs, raised
