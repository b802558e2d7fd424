"""kv_cache_groups: a stop, not a correction: DeepSeek-V4 with the hybrid KV cache manager off.

Symptom: with the hybrid KV cache manager off, released vLLM 0.25.0 dies with
the reported ``RuntimeError: kv must have shape (num_blocks, page_block_size,
h_kv, bytes_per_token)``, upstream's fix notwithstanding. The manager is off
with ``--disable-hybrid-kv-cache-manager``, or where vLLM turns it off for a
``--kv-transfer-config`` connector without support for it (many
prefill/decode-disaggregated setups).

Cause: vLLM's ``get_kv_cache_groups`` (in ``vllm.v1.core.kv_cache_utils`` up to 0.32.0,
``kv_cache_planning`` from 0.33.0) then rebuilds every
``SlidingWindowMLASpec`` as a full-attention ``MLAAttentionSpec``. The rebuilt
spec has no ``kv_quant_mode``, so the V2 runner views it at 512 bytes/token
and FlashMLA rejects it. It also gets the full-attention block size (256),
compressor states included, whose kernels take 4 and 8. So carrying
``kv_quant_mode`` through is not enough: DeepSeek-V4 needs the hybrid manager.
docs/evidence/hybrid-off.md has the measurements, release by release.

Upstream: vllm-project/vllm#47776.

Decision: at import, vLLM's ``get_kv_cache_groups``, wherever it lives, converts a
stand-in pair of DeepSeek-V4 ``fp8_ds_mla`` specs with the hybrid manager off. The
patch is applied only if the sliding-window spec comes back without the layout; a
vLLM that has neither place is an unexpected one (``failed``). Applied, it stops
such an engine at KV-cache grouping, before the KV cache is allocated and before
FlashMLA runs. Its error names what turned the manager off and what helps.
Everything else passes through.

Removal: with a vLLM whose hybrid-off path keeps the layout (0.28.0 on).
"""

from collections.abc import Callable
from typing import Any

from dspark_hotfix.patches.base import Finding, Need, Patch
from dspark_hotfix.patches.fp8_ds_mla import (
    BYTES_PER_TOKEN,
    CACHE_DTYPE,
    deepseek_v4_fp8_ds_mla,
    hybrid_off,
    quant_mode,
)


def check(vllm_config: Any, kv_cache_spec: Any) -> None:
    """Stops DeepSeek-V4 with the hybrid KV cache manager off (--disable-hybrid-kv-cache-manager, or
    a --kv-transfer-config connector without hybrid support).

    Before ``vllm.v1.core.kv_cache_utils.get_kv_cache_groups``, which would break its KV caches
    there."""
    layers = [name for name, spec in kv_cache_spec.items() if deepseek_v4_fp8_ds_mla(spec)]
    if layers and getattr(vllm_config.scheduler_config, "disable_hybrid_kv_cache_manager", False):
        many = f"{len(layers)} layer{'s' if len(layers) > 1 else ''}, e.g. {layers[0]}"
        raise Finding(
            f"DeepSeek-V4's {CACHE_DTYPE} KV caches ({many}) need vLLM's hybrid KV cache manager,"
            " and it is off (--disable-hybrid-kv-cache-manager, or vLLM turned it off and logged"
            " why: a --kv-transfer-config connector without hybrid support). This vLLM then"
            " rebuilds their sliding-window caches without their layout (a 512-byte/token view"
            f" where FlashMLA needs {BYTES_PER_TOKEN}) and its compressor states at a block size"
            " their kernels refuse. What helps: leave the hybrid manager on; for prefill/decode"
            " disaggregation, a KV connector that supports it (SupportsHMA); or a vLLM from 0.28.0"
            " on, which keeps the layout with it off"
        )


def probe(vllm_get_kv_cache_groups: Callable[..., Any]) -> Need:
    mode = quant_mode()  # raises where vLLM lacks get_kv_quant_mode: the layout cannot be checked
    try:
        specs, raised = hybrid_off(vllm_get_kv_cache_groups)
    except Exception as exc:  # spec classes this probe does not know how to build
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    swa = specs["swa"]
    # Not rebuilt where the grouping raised first: the layout is not lost there, and what raised is
    # another patch's concern (promote_local_specs, judged after this one).
    kept = "keeps the fp8_ds_mla layout"
    if type(swa).__name__ == "SlidingWindowMLASpec":
        kept = f"leaves the sliding-window spec as it is, raising {raised!r}"
    if swa.kv_quant_mode == mode:
        return Need(False, f"not needed (vLLM's hybrid-off grouping {kept})")
    return Need(
        True,
        "needed (vLLM's hybrid-off grouping rebuilds an fp8_ds_mla sliding-window spec as "
        f"{type(swa).__name__}(kv_quant_mode={getattr(swa.kv_quant_mode, 'name', '?')}))",
    )


PATCH = Patch(
    name="kv_cache_groups",
    module="vllm.v1.core.kv_cache_utils",
    also_in=("vllm.v1.core.kv_cache_planning",),
    qualname="get_kv_cache_groups",
    parameters=("vllm_config", "kv_cache_spec"),
    arguments=check,
    stops=True,
    probe=probe,
    everywhere=True,
)
