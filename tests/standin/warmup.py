"""Replay the stand-in engine's start: draft weight loading and KV-cache warm-up.

``python warmup.py`` prints one JSON object: the views each cache got, and the
error the first failing step raised (as ``vllm serve`` would die with it).
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

NUM_BLOCKS = 4
CHECKPOINT = [
    *(f"mtp.{i}.{rest}" for i in range(3) for rest in ("attn.wkv.weight", "ffn.gate.weight")),
    "mtp.2.norm.weight",
    "mtp.0.main_proj.weight",
    "mtp.2.markov_head.weight",
    "layers.0.attn.wkv.weight",  # a target weight: not the draft's
]


def run(hybrid: bool = True) -> dict:
    """``hybrid=False``: the hybrid KV cache manager off, so the specs go through KV-cache grouping."""
    # vLLM's order: the engine's KV-cache grouping and the V2 runner, then the model; their functions
    # are looked up when called, as vLLM's own callers do (module globals).
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.worker.gpu import attn_utils
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention, DeepseekV4FlashMLABackend
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM
    from vllm.models.deepseek_v4.nvidia.flashmla import flash_mla_with_kvcache
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWABackend

    report: dict = {"views": {}, "loaded": None, "error": None}
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
    draft = DSparkDeepseekV4ForCausalLM()
    target_attn = DeepseekV4Attention(compress_ratio=4)
    try:
        report["loaded"] = sorted(draft.load_weights((name, None) for name in CHECKPOINT))
        caches = {
            "target.compressed": (target_attn.get_kv_cache_spec(config), DeepseekV4FlashMLABackend),
            "target.swa": (target_attn.swa_cache.get_kv_cache_spec(config), DeepseekSparseSWABackend),
        }
        for i, layer in enumerate(draft.model.layers):
            assert layer.attn.get_kv_cache_spec(config) is None  # SWA-only layers
            caches[f"draft.{i}.swa"] = (layer.attn.swa_cache.get_kv_cache_spec(config), DeepseekSparseSWABackend)
        specs = {name: spec for name, (spec, _) in caches.items()}
        off = SimpleNamespace(scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=not hybrid),
                              kv_transfer_config=None)
        for group in kv_cache_utils.get_kv_cache_groups(off, specs):
            for name in group.layer_names:
                caches[name] = (group.kv_cache_spec, caches[name][1])
        groups = [
            SimpleNamespace(kv_cache_spec=spec, backend=backend, layer_names=[name])
            for name, (spec, backend) in caches.items()
        ]
        raw = {name: NUM_BLOCKS * spec.page_size_bytes for name, (spec, _) in caches.items()}
        views = attn_utils._reshape_kv_cache(groups, raw, "fp8_ds_mla", [64], {})
        for name, (spec, _) in caches.items():
            shape, stride = views[name]
            report["views"][name] = {"shape": list(shape), "stride": list(stride), "page_bytes": spec.page_size_bytes}
        flash_mla_with_kvcache(
            report["views"]["draft.0.swa"]["shape"], report["views"]["target.compressed"]["shape"]
        )
    except Exception as exc:
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


if __name__ == "__main__":
    json.dump(run(hybrid="--hybrid-off" not in sys.argv), sys.stdout)
    print()
