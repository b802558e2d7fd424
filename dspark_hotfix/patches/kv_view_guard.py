"""kv_view_guard: a guard, not a correction: the V2 runner's DeepSeek-V4 KV views.

Symptom: a DeepSeek-V4 ``fp8_ds_mla`` spec may still reach vLLM's V2 model runner without
its quantization mode: a spec patch excluded or unable to apply, or a spec class
this shim does not know. The runner then builds a 512-byte-per-token view over the
padded pages. FlashMLA fails later, on the first decode, with the cryptic
``kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)``.

Cause and upstream: see ``swa_kv_cache_spec`` (vllm-project/vllm#47648,
PR #47716; the ``"auto"`` rule came with PR #42890).

Decision: applied where a spec patch is needed, or the ``kv_cache_groups``
stop (the hybrid-off path that loses the layout). It runs after vLLM's
``vllm.v1.worker.gpu.attn_utils._reshape_kv_cache`` (vLLM 0.25.0 to 0.28.0
have it) and checks every DeepSeek-V4 ``fp8_ds_mla`` view the runner built.
A view that is not 584 bytes wide is a :class:`Finding`. The registry turns it
into an error that names the layers, the spec and the patch that did not apply.
It never changes a view.

Removal: with the spec patches.
"""

from __future__ import annotations

from typing import Any

from dspark_hotfix.patches.base import Finding, Patch
from dspark_hotfix.patches.fp8_ds_mla import BYTES_PER_TOKEN, deepseek_v4_fp8_ds_mla

PARAMETERS = ("attn_groups", "kv_cache_raw_tensors", "cache_dtype", "kernel_block_sizes", "shared_kv_cache_layers",
              "kv_cache_config")


def correction(views: Any, /, *args: Any, **kwargs: Any) -> Any:
    """What ``vllm.v1.worker.gpu.attn_utils._reshape_kv_cache`` built, checked (never changed)."""
    arguments = {**dict(zip(PARAMETERS, args, strict=False)), **kwargs}
    narrow = narrow_fp8_ds_mla_views(arguments["attn_groups"], views, arguments["cache_dtype"])
    if narrow:
        raise Finding(f"DeepSeek-V4 fp8_ds_mla KV views FlashMLA would reject ({BYTES_PER_TOKEN} bytes/token "
                      f"expected): {'; '.join(narrow)}")
    return views


def narrow_fp8_ds_mla_views(attn_groups: Any, kv_caches: Any, cache_dtype: str | None) -> list[str]:
    """One line per kind of DeepSeek-V4 ``fp8_ds_mla`` spec whose views are too narrow."""
    kinds: dict[str, list[str]] = {}
    for group in attn_groups:
        spec: Any = getattr(group, "kv_cache_spec", None)
        if not deepseek_v4_fp8_ds_mla(spec, cache_dtype):
            continue
        for layer in getattr(group, "layer_names", ()):
            shape = tuple(getattr(kv_caches.get(layer), "shape", ()))
            if shape and shape[-1] != BYTES_PER_TOKEN:
                mode = getattr(spec.kv_quant_mode, "name", spec.kv_quant_mode)
                kind = f"{type(spec).__name__}(kv_quant_mode={mode}) viewed at {shape[-1]} bytes/token"
                kinds.setdefault(kind, []).append(layer)
    return [
        f"{kind}: {layers[0]}" + (f" and {len(layers) - 1} more layers" if len(layers) > 1 else "")
        for kind, layers in kinds.items()
    ]


PATCH = Patch(
    name="kv_view_guard",
    module="vllm.v1.worker.gpu.attn_utils",
    qualname="_reshape_kv_cache",
    parameters=PARAMETERS,
    correction=correction,
    guards=("attention_kv_cache_spec", "swa_kv_cache_spec", "kv_cache_groups"),
    absent="the V2 runner no longer builds views by this rule (vLLM 0.29.0 on)",
)
