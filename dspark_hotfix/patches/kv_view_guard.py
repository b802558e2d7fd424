"""kv_view_guard: defence in depth where the V2 runner builds the KV views.

Symptom: should a DeepSeek-V4 ``fp8_ds_mla`` spec reach vLLM's V2 model runner
without its quantization mode anyway (a spec patch excluded, a spec class this
shim does not know), the runner builds a 512-byte-per-token view over the
padded pages and FlashMLA fails much later, on the first decode, with the
cryptic ``kv must have shape (num_blocks, page_block_size, h_kv,
bytes_per_token)``.

Cause and upstream: see ``swa_kv_cache_spec`` (vllm-project/vllm#47648,
PR #47716; the ``"auto"`` rule came with PR #42890).

Decision: a guard for the spec patches: it is applied where either of them is
installed (or could not be), after vLLM's
``vllm.v1.worker.gpu.attn_utils._reshape_kv_cache`` (vLLM 0.25.0 to 0.28.0 have
it). It checks every DeepSeek-V4 ``fp8_ds_mla`` view the runner built and
raises an error naming the layer, the spec and the fix if one is not 584 bytes
wide. It never changes a view.

Removal: with the spec patches.
"""

from __future__ import annotations

from typing import Any

from dspark_hotfix.patches.base import Patch
from dspark_hotfix.patches.fp8_ds_mla import BYTES_PER_TOKEN, CACHE_DTYPE, MODEL_VERSION


def narrow_fp8_ds_mla_views(attn_groups: Any, kv_caches: Any, cache_dtype: str | None) -> list[str]:
    """One line per DeepSeek-V4 ``fp8_ds_mla`` KV view narrower than the layout."""
    problems = []
    for group in attn_groups:
        spec: Any = getattr(group, "kv_cache_spec", None)
        if getattr(spec, "model_version", None) != MODEL_VERSION:
            continue
        if CACHE_DTYPE not in (getattr(spec, "cache_dtype_str", None), cache_dtype):
            continue
        for layer in getattr(group, "layer_names", ()):
            shape = tuple(getattr(kv_caches.get(layer), "shape", ()))
            if shape and shape[-1] != BYTES_PER_TOKEN:
                mode = getattr(spec.kv_quant_mode, "name", spec.kv_quant_mode)
                problems.append(
                    f"{layer}: {type(spec).__name__}(kv_quant_mode={mode}, cache_dtype_str="
                    f"{getattr(spec, 'cache_dtype_str', None)!r}) viewed as {shape}: {shape[-1]} bytes/token"
                )
    return problems


class KVViewGuard(Patch):
    name = "kv_view_guard"
    module = "vllm.v1.worker.gpu.attn_utils"
    qualname = "_reshape_kv_cache"
    parameters = (
        "attn_groups",
        "kv_cache_raw_tensors",
        "cache_dtype",
        "kernel_block_sizes",
        "shared_kv_cache_layers",
        "kv_cache_config",
    )
    summary = "a DeepSeek-V4 fp8_ds_mla KV view narrower than 584 bytes/token stops with a clear error"
    depends_on = ("attention_kv_cache_spec", "swa_kv_cache_spec")

    def probe(self, original: Any) -> Any:
        raise NotImplementedError("decided by depends_on")

    def correct(self, result: Any, /, *args: Any, **kwargs: Any) -> Any:
        params = dict(zip(self.parameters, args, strict=False), **kwargs)
        problems = narrow_fp8_ds_mla_views(params.get("attn_groups", ()), result, params.get("cache_dtype"))
        if problems:
            from dspark_hotfix import hooks

            raise hooks.HotfixError(
                f"{self.name}: DeepSeek-V4 fp8_ds_mla KV views of {BYTES_PER_TOKEN} bytes/token expected, "
                f"FlashMLA would reject these: {'; '.join(problems[:4])}"
                + (f" and {len(problems) - 4} more" if len(problems) > 4 else "")
                + ". The spec lacks kv_quant_mode (vllm-project/vllm#47648): enable the spec patches "
                "(DSPARK_HOTFIX_PATCHES) or run a vLLM with PR #47716 (>= 0.25.0)."
            )
        return result


PATCH = KVViewGuard()
