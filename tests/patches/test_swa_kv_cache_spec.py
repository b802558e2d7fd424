"""swa_kv_cache_spec: its declarations (tests/patches/__init__.py); its correction is tested with the
attention patch's in test_fp8_ds_mla.py, the layout both share."""

from __future__ import annotations

from dspark_hotfix.patches.swa_kv_cache_spec import PATCH
from tests.patches import Fault, Revert, module_file

FILE = module_file(PATCH)
KVI = "vllm/v1/kv_cache_interface.py"
# Upstream PR #47716.
FIX = [("import SlidingWindowMLASpec, uint8", "import SlidingWindowMLASpec, get_kv_quant_mode, uint8"),
       ('model_version="deepseek_v4",',
        'model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),')]
FAULTS = {
    "swa class renamed": Fault({"*": [("DeepseekV4SWACache", "DeepseekV4SlidingWindowCache")]},
                               "has no class DeepseekV4SWACache"),
    "swa method renamed": Fault({FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")],
                                 "*": [("swa_cache.get_kv_cache_spec(", "swa_cache.kv_cache_spec(")]},  # warmup's
                                "DeepseekV4SWACache defines no get_kv_cache_spec"),
    "get_kv_quant_mode missing": Fault({KVI: [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]},
                                       "get_kv_quant_mode"),
    "spec class with an unknown required field": Fault(
        {KVI: [("from dataclasses import dataclass", "from dataclasses import InitVar, dataclass"),
               ("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n"
                "    window_layout: InitVar[str]\n\n"
                "    def __post_init__(self, window_layout: str) -> None:\n"
                "        super().__post_init__()\n")],
         FILE: [('model_version="deepseek_v4",', 'model_version="deepseek_v4", window_layout="ring",')]},
        "correction raised ValueError", at_call=True),
    "spec page rule raises": Fault(
        {KVI: [("class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n",
                "class SlidingWindowMLASpec(_DeepseekV4Spec):\n    sliding_window: int\n\n"
                "    @property\n"
                "    def real_page_size_bytes(self) -> int:\n"
                "        if self.kv_quant_mode != KVQuantMode.NONE:\n"
                "            raise NotImplementedError('quantized SWA pages are sized by the backend')\n"
                "        return _DeepseekV4Spec.real_page_size_bytes.fget(self)\n")]},
        "correction raised NotImplementedError", at_call=True),
}
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = (Revert("v1/attention/backends/mla/sparse_swa.py", "DeepseekV4SWACache.get_kv_cache_spec",
                 "kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),", None),)
