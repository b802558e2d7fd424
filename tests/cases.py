"""What the tests know of each patch: the one place they name one.

``CASES`` has a row per patch of ``dspark_hotfix.patches.ALL``, in its order (tests/patches/test_cases.py
holds them to each other): the upstream fix as edits of the stand-in, what the fault driver gets through the
patch, and its state on released vLLM. ``FAULTS`` is the stand-in with one edit that a patch does not expect.
A new patch adds its row, and its faults.

Everything else the tests need of a patch they read from ``ALL``: the names, the targets, and the roles below,
each picked by the patch's fields (a stop, a correction, its target), never by its name.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dspark_hotfix.patches import ALL, Patch

PATCHES = tuple(p.name for p in ALL)
# The stop for vLLM's hybrid-off KV-cache grouping: it checks before vLLM's function, and corrects nothing.
STOP = next(p for p in ALL if p.stops)
# The corrections: decided by a probe, they change vLLM's answer.
CORRECTIONS = tuple(p for p in ALL if not p.stops)
SPECS = tuple(p for p in CORRECTIONS if p.qualname.endswith(".get_kv_cache_spec"))  # the two spec patches
ATTENTION = next(p for p in SPECS if p.qualname.startswith("DeepseekV4Attention."))
SWA = next(p for p in SPECS if p.qualname.startswith("DeepseekV4SWACache."))
REMAP = next(p for p in CORRECTIONS if p.qualname.startswith("DSparkDeepseekV4ForCausalLM."))  # the draft's remap


def module_file(patch: Patch) -> str:
    """The file of the patch's target module, inside the stand-in build (or a vLLM package's parent)."""
    return patch.module.replace(".", "/") + ".py"


def method(patch: Patch) -> str:
    """The name of vLLM's function the patch wraps, without its class."""
    return patch.qualname.rpartition(".")[2]


@dataclass(frozen=True)
class Case:
    # The upstream fix (vllm-project/vllm PR #47716, the released remap, 0.28.0's hybrid-off grouping): the
    # textual edits that turn the stand-in's target module into a fixed build (FIXED in tests/conftest.py).
    fix: list[tuple[str, str]] = field(default_factory=list)
    # What tests/patches/faults.py's driver gets from vLLM through the patch: the outputs it changes (none:
    # it changes none, yet is judged there); None: the driver never reaches it.
    outputs: tuple[str, ...] | None = None
    # Its state on vLLM 0.25.0 as released: the spec and remap fixes are in; its hybrid-off grouping loses the
    # fp8_ds_mla layout (docs/evidence/hybrid-off.md). 0.33.0 needs nothing.
    released: str = "not_needed"


CASES: dict[str, Case] = {
    "remap_dspark_name": Case(
        fix=[("{self.config.num_hidden_layers + stage}", "{stage}")],
        outputs=("remap", "load"),
    ),
    "attention_kv_cache_spec": Case(
        fix=[("import MLAAttentionSpec, uint8", "import MLAAttentionSpec, get_kv_quant_mode, uint8"),
             ('model_version="deepseek_v4",',
              'model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype), alignment=576,')],
        outputs=("attention",),
    ),
    "swa_kv_cache_spec": Case(
        fix=[("import SlidingWindowMLASpec, uint8", "import SlidingWindowMLASpec, get_kv_quant_mode, uint8"),
             ('model_version="deepseek_v4",',
              'model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),')],
        outputs=("swa",),
    ),
    "kv_cache_groups": Case(
        fix=[("compress_ratio=spec.compress_ratio,",
              "compress_ratio=spec.compress_ratio, kv_quant_mode=spec.kv_quant_mode,")],
        outputs=(),  # the shim imports its module to judge it, as in a tensor-parallel worker
        released="patched",
    ),
}


# vLLM builds that differ from what the shim expects: each the stand-in with one edit. The fault tests
# (tests/patches/test_faults.py) and the strict-mode tests (tests/switches/test_strict.py) run faults.driver
# against each: shim on, shim off and strict.

DSPARK, ATTN, SWA_FILE = module_file(REMAP), module_file(ATTENTION), module_file(SWA)
KVI = "vllm/v1/kv_cache_interface.py"


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
        {SWA.name: "has no class DeepseekV4SWACache"},
        {"swa_cls": "DeepseekV4SlidingWindowCache"},
    ),
    "attention class renamed": Fault(
        {"*": [("DeepseekV4Attention", "DeepseekV4MLAAttention")]},
        {ATTENTION.name: "has no class DeepseekV4Attention"},
        {"attn_cls": "DeepseekV4MLAAttention"},
    ),
    "draft class renamed": Fault(
        {"*": [("DSparkDeepseekV4ForCausalLM", "DSparkDraftForCausalLM")]},
        {REMAP.name: "has no class DSparkDeepseekV4ForCausalLM"},
        {"draft_cls": "DSparkDraftForCausalLM"},
    ),
    "swa method renamed": Fault(
        {SWA_FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")],
         "*": [("swa_cache.get_kv_cache_spec(", "swa_cache.kv_cache_spec(")]},  # warmup.py calls it
        {SWA.name: "DeepseekV4SWACache defines no get_kv_cache_spec"},
        {"swa_meth": "kv_cache_spec"},
    ),
    "attention method renamed": Fault(
        {ATTN: [("def get_kv_cache_spec(", "def kv_cache_spec(")]},
        {ATTENTION.name: "DeepseekV4Attention defines no get_kv_cache_spec"},
        {"attn_meth": "kv_cache_spec"},
    ),
    "remap method renamed": Fault(
        {DSPARK: [("_remap_dspark_name", "_remap_checkpoint_name")]},
        {REMAP.name: "DSparkDeepseekV4ForCausalLM defines no _remap_dspark_name"},
        {"remap_meth": "_remap_checkpoint_name"},
    ),
    "attention signature changed": Fault(
        {ATTN: [("get_kv_cache_spec(self, vllm_config)", "get_kv_cache_spec(self, vllm_config, kv_sharing=None)")]},
        {ATTENTION.name: "unexpected signature"},
    ),
    "remap signature changed": Fault(
        {DSPARK: [("def _remap_dspark_name(self, name)", "def _remap_dspark_name(self, name, *, stage_offset=0)")]},
        {REMAP.name: "unexpected signature"},
    ),
    "get_kv_quant_mode missing": Fault(
        {KVI: [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]},
        {SWA.name: "get_kv_quant_mode", ATTENTION.name: "get_kv_quant_mode", STOP.name: "get_kv_quant_mode"},
    ),
    "spec class with an unknown required field": Fault(
        {KVI: [("from dataclasses import dataclass", "from dataclasses import InitVar, dataclass"),
               ("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n"
                "    window_layout: InitVar[str]\n\n"
                "    def __post_init__(self, window_layout: str) -> None:\n"
                "        super().__post_init__()\n")],
         SWA_FILE: [('model_version="deepseek_v4",', 'model_version="deepseek_v4", window_layout="ring",')]},
        {SWA.name: "correction raised ValueError"},
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
        {SWA.name: "correction raised NotImplementedError"},
        at_call=True,
    ),
}
