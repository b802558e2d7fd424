"""attention_kv_cache_spec: its declarations (tests/patches/__init__.py); its correction is tested with the
swa patch's in test_fp8_ds_mla.py, the layout both share."""

from __future__ import annotations

from dspark_hotfix.patches.attention_kv_cache_spec import PATCH
from tests.patches import Fault, Revert, module_file

FILE = module_file(PATCH)
KVI = "vllm/v1/kv_cache_interface.py"
# Upstream PR #47716.
FIX = [("import MLAAttentionSpec, uint8", "import MLAAttentionSpec, get_kv_quant_mode, uint8"),
       ('model_version="deepseek_v4",',
        'model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype), alignment=576,')]
FAULTS = {
    "attention class renamed": Fault({"*": [("DeepseekV4Attention", "DeepseekV4MLAAttention")]},
                                     "has no class DeepseekV4Attention"),
    "attention method renamed": Fault({FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")]},
                                      "DeepseekV4Attention defines no get_kv_cache_spec"),
    "attention signature changed": Fault(
        {FILE: [("get_kv_cache_spec(self, vllm_config)", "get_kv_cache_spec(self, vllm_config, kv_sharing=None)")]},
        "unexpected signature"),
    "get_kv_quant_mode missing": Fault({KVI: [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]},
                                       "get_kv_quant_mode"),
}
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = (Revert("models/deepseek_v4/attention.py", "DeepseekV4Attention.get_kv_cache_spec",
                 "kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),", None),)
