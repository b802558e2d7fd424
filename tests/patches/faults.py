"""vLLM builds that differ from what the shim expects: each ``Fault`` is the stand-in with one edit.

The fault tests (tests/patches/test_faults.py) and the strict-mode tests (tests/switches/test_strict.py)
run ``driver`` against each: shim on, shim off and strict. A new patch adds its outputs to ``OUTPUTS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.conftest import SWA_FILE, edited_standin

SWA, ATTENTION, REMAP, LOAD = "swa_kv_cache_spec", "attention_kv_cache_spec", "remap_dspark_name", "draft_load_coverage"
DSPARK = "vllm/models/deepseek_v4/nvidia/dspark.py"
ATTN = "vllm/models/deepseek_v4/attention.py"
KVI = "vllm/v1/kv_cache_interface.py"

# What the driver calls for each patch: the outputs that must match vLLM as shipped.
GROUPS = "kv_cache_groups"  # the shim imports its module to judge it, as in a tensor-parallel worker
OUTPUTS = {SWA: ("swa",), ATTENTION: ("attention",), REMAP: ("remap", "load"), LOAD: (), GROUPS: ()}


@dataclass
class Fault:
    edits: dict[str, list[tuple[str, str]]]
    failed: dict[str, str]  # patch -> what its status detail must say
    names: dict[str, str] = field(default_factory=dict)  # renamed classes and methods, for the driver
    remove: tuple[str, ...] = ()
    at_call: bool = False  # the correction fails when vLLM calls the method, not at import


FAULTS = {
    "swa class renamed": Fault(
        {"*": [("DeepseekV4SWACache", "DeepseekV4SlidingWindowCache")]},
        {SWA: "has no class DeepseekV4SWACache"},
        {"swa_cls": "DeepseekV4SlidingWindowCache"},
    ),
    "attention class renamed": Fault(
        {"*": [("DeepseekV4Attention", "DeepseekV4MLAAttention")]},
        {ATTENTION: "has no class DeepseekV4Attention"},
        {"attn_cls": "DeepseekV4MLAAttention"},
    ),
    "draft class renamed": Fault(
        {"*": [("DSparkDeepseekV4ForCausalLM", "DSparkDraftForCausalLM")]},
        {REMAP: "has no class DSparkDeepseekV4ForCausalLM", LOAD: "has no class DSparkDeepseekV4ForCausalLM"},
        {"draft_cls": "DSparkDraftForCausalLM"},
    ),
    "swa method renamed": Fault(
        {SWA_FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")],
         "*": [("swa_cache.get_kv_cache_spec(", "swa_cache.kv_cache_spec(")]},  # warmup.py calls it
        {SWA: "DeepseekV4SWACache defines no get_kv_cache_spec"},
        {"swa_meth": "kv_cache_spec"},
    ),
    "attention method renamed": Fault(
        {ATTN: [("def get_kv_cache_spec(", "def kv_cache_spec(")]},
        {ATTENTION: "DeepseekV4Attention defines no get_kv_cache_spec"},
        {"attn_meth": "kv_cache_spec"},
    ),
    "remap method renamed": Fault(
        {DSPARK: [("_remap_dspark_name", "_remap_checkpoint_name")]},
        {REMAP: "DSparkDeepseekV4ForCausalLM defines no _remap_dspark_name"},
        {"remap_meth": "_remap_checkpoint_name"},
    ),
    "attention signature changed": Fault(
        {ATTN: [("get_kv_cache_spec(self, vllm_config)", "get_kv_cache_spec(self, vllm_config, kv_sharing=None)")]},
        {ATTENTION: "unexpected signature"},
    ),
    "remap signature changed": Fault(
        {DSPARK: [("def _remap_dspark_name(self, name)", "def _remap_dspark_name(self, name, *, stage_offset=0)")]},
        {REMAP: "unexpected signature"},
    ),
    "get_kv_quant_mode missing": Fault(
        {KVI: [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]},
        {SWA: "get_kv_quant_mode", ATTENTION: "get_kv_quant_mode", GROUPS: "get_kv_quant_mode"},
    ),
    "spec class with an unknown required field": Fault(
        {KVI: [("from dataclasses import dataclass", "from dataclasses import InitVar, dataclass"),
               ("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n"
                "    window_layout: InitVar[str]\n\n"
                "    def __post_init__(self, window_layout: str) -> None:\n"
                "        super().__post_init__()\n")],
         SWA_FILE: [('model_version="deepseek_v4",', 'model_version="deepseek_v4", window_layout="ring",')]},
        {SWA: "correction raised ValueError"},
        at_call=True,
    ),
    "spec page rule raises": Fault(
        {KVI: [("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n\n"
                "    @property\n"
                "    def real_page_size_bytes(self) -> int:\n"
                "        if self.kv_quant_mode != KVQuantMode.NONE:\n"
                "            raise NotImplementedError('quantized SWA pages are sized by the backend')\n"
                "        return _DeepseekV4Spec.real_page_size_bytes.fget(self)\n")]},
        {SWA: "correction raised NotImplementedError"},
        at_call=True,
    ),
}


NAMES = {
    "swa_cls": "DeepseekV4SWACache", "swa_meth": "get_kv_cache_spec",
    "attn_cls": "DeepseekV4Attention", "attn_meth": "get_kv_cache_spec",
    "draft_cls": "DSparkDeepseekV4ForCausalLM", "remap_meth": "_remap_dspark_name",
}


CHECKPOINT = ["mtp.0.attn.wkv.weight", "mtp.1.ffn.gate.weight", "mtp.2.norm.weight", "layers.0.attn.wkv.weight"]


def driver(names: dict[str, str], draft: bool = True) -> str:
    """vLLM's import and calls, each call twice (a failure must be reported once), then status."""
    n = {**NAMES, **names}
    lines = [
        "import json",
        "from types import SimpleNamespace",
        "config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype='fp8_ds_mla'))",
        "out = {}",
        f"from vllm.v1.attention.backends.mla.sparse_swa import {n['swa_cls']} as S",
        f"from vllm.models.deepseek_v4.attention import {n['attn_cls']} as A",
        f"out['swa'] = [repr(S().{n['swa_meth']}(config)) for _ in range(2)]",
        f"out['attention'] = [repr(A(compress_ratio=4).{n['attn_meth']}(config)) for _ in range(2)]",
    ]
    if draft:
        lines += [
            f"from vllm.models.deepseek_v4.nvidia.dspark import {n['draft_cls']} as D",
            f"out['remap'] = [D().{n['remap_meth']}(name) for name in {CHECKPOINT!r} * 2]",
            f"out['load'] = sorted(D().load_weights((name, None) for name in {CHECKPOINT!r}))",
        ]
    lines += ["import dspark_hotfix", "out['status'] = {r['name']: r for r in dspark_hotfix.status()['patches']}",
              "print(json.dumps(out))"]
    return "\n".join(lines) + "\n"


@pytest.fixture(params=sorted(FAULTS), ids=lambda k: k.replace(" ", "-"))
def fault(request, tmp_path):
    spec = FAULTS[request.param]
    return spec, edited_standin(tmp_path / "standin", spec.edits, spec.remove)
