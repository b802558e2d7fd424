"""The patches of vLLM, one module each; imported only once vLLM is being imported.

Each module starts with its correction: a plain function that takes what vLLM's
own function answered and returns what vLLM's caller gets (a stop has a check
instead, before vLLM's function runs). The registry
(``dspark_hotfix.registry``) wraps vLLM's function with it only where the probe
says the running vLLM needs it.

remap_dspark_name
    Target:
    ``vllm.models.deepseek_v4.nvidia.dspark.DSparkDeepseekV4ForCausalLM._remap_dspark_name``.
    Why: the reported build loads draft weights ``mtp.{i}.*`` into
    ``model.layers.{num_hidden_layers + i}.*``; the draft registers ``model.layers.{i}.*``.
    How it decides: vLLM's method maps ``mtp.1.*`` for a stand-in draft of 3 layers.
    Upstream: vllm-project/vllm#47648 cause (1); every release maps positionally.
    Remove: with any release (>= 0.25.0).

attention_kv_cache_spec
    Target: ``vllm.models.deepseek_v4.attention.DeepseekV4Attention.get_kv_cache_spec``.
    Why: its ``fp8_ds_mla`` spec lacks ``kv_quant_mode``; the V2 runner then views
    the compressed cache at 512 bytes/token instead of 584.
    How it decides: vLLM's method answers for a stand-in ``fp8_ds_mla`` layer.
    Upstream: #47648 cause (2), fixed by PR #47716; regression from PR #42890.
    Remove: with PR #47716 (>= 0.25.0).

swa_kv_cache_spec
    Target: ``vllm.v1.attention.backends.mla.sparse_swa.DeepseekV4SWACache.get_kv_cache_spec``.
    Why: the same for the sliding-window cache, the tensor FlashMLA rejects
    (DSpark draft layers have only this cache).
    How it decides: as above, with a stand-in SWA layer.
    Upstream: #47648 (its follow-up), fixed by PR #47716.
    Remove: with PR #47716 (>= 0.25.0).

kv_cache_groups (a stop)
    Target: ``get_kv_cache_groups``, in ``vllm.v1.core.kv_cache_utils`` up to 0.32.0, in
    ``kv_cache_planning`` from 0.33.0.
    Why: with the hybrid KV cache manager off (the flag, or a KV connector without
    support for it), vLLM 0.25.0 to 0.27.1 rebuild the sliding-window specs without
    the layout: the reported error, on released vLLM. They also put every compressor
    state at block size 256; no small patch makes that path right (docs/evidence/hybrid-off.md).
    How it decides: vLLM's function converts a stand-in DeepSeek-V4 pair with the
    hybrid manager off; applied if the sliding-window spec loses its layout. It then
    stops such an engine at KV-cache grouping with the cause and what helps.
    Upstream: vllm-project/vllm#47776.
    Remove: with a vLLM whose hybrid-off path keeps the layout (0.28.0 on).

promote_local_specs
    Target: ``replace_as`` as the promotion of local specs calls it, in
    ``vllm.v1.core.kv_cache_planning`` (0.33.0 on) or ``kv_cache_utils`` (0.28.0 to 0.32.0).
    Why: with the hybrid KV cache manager off, vLLM 0.31.0 to 0.33.0 rebuild a DeepSeek-V4
    sliding-window spec as ``MLAAttentionSpec`` passing ``bounded_replay``, which
    that class lacks: ``TypeError``, and DeepSeek-V4 cannot start. It repairs the
    call (its arguments step): ``bounded_replay`` is dropped as well.
    How it decides: vLLM's promotion of a stand-in DeepSeek-V4 pair raises, and
    repaired keeps the layout (584 bytes per token). Where no place makes the call
    (0.25.0 to 0.27.1), vLLM's hybrid-off grouping as shipped raises no such error.
    Upstream: fixed in vLLM 0.34.0.
    Remove: with vLLM 0.34.0 or later.
"""

from dspark_hotfix.patches import (
    attention_kv_cache_spec,
    kv_cache_groups,
    promote_local_specs,
    remap_dspark_name,
    swa_kv_cache_spec,
)
from dspark_hotfix.patches.base import Finding, Need, Patch

ALL: tuple[Patch, ...] = (
    remap_dspark_name.PATCH,
    attention_kv_cache_spec.PATCH,
    swa_kv_cache_spec.PATCH,
    # Before promote_local_specs: its probe runs vLLM's hybrid-off grouping, which calls that one's
    # target, as vLLM ships it; after it, the probe's call would count as vLLM's.
    kv_cache_groups.PATCH,
    promote_local_specs.PATCH,
)

__all__ = ["ALL", "Finding", "Need", "Patch"]
