"""attention_kv_cache_spec: its declarations (tests/patches/__init__.py); its correction is tested
with the swa patch's in test_fp8_ds_mla.py, the layout both share."""

from __future__ import annotations

from types import SimpleNamespace

from dspark_hotfix.patches.attention_kv_cache_spec import PATCH
from tests.patches import BUILDS, Fault, Revert, module_file

FILE = module_file(PATCH)
# Upstream PR #47716.
FIX = [
    ("import MLAAttentionSpec, uint8", "import MLAAttentionSpec, get_kv_quant_mode, uint8"),
    (
        'model_version="deepseek_v4",',
        (
            'model_version="deepseek_v4", kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),'
            " alignment=576,"
        ),
    ),
]
FAULTS = {
    "attention class renamed": Fault(
        {"*": [("DeepseekV4Attention", "DeepseekV4MLAAttention")]},
        "has no class DeepseekV4Attention",
    ),
    "attention method renamed": Fault(
        {FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")]},
        "DeepseekV4Attention defines no get_kv_cache_spec",
    ),
    "attention signature changed": Fault(
        {
            FILE: [
                (
                    "get_kv_cache_spec(self, vllm_config)",
                    "get_kv_cache_spec(self, vllm_config, kv_sharing=None)",
                )
            ]
        },
        "unexpected signature",
    ),
    "get_kv_quant_mode missing": Fault(BUILDS["get_kv_quant_mode missing"], "get_kv_quant_mode"),
}
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = (
    Revert(
        "models/deepseek_v4/attention.py",
        "DeepseekV4Attention.get_kv_cache_spec",
        "kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),",
        None,
    ),
)

CONFIG = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))


def exercise():
    """vLLM's call of the target: a compressed layer's KV-cache spec (through the shim's wrapper
    where it wraps)."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention

    return DeepseekV4Attention(compress_ratio=4).get_kv_cache_spec(CONFIG)


# --- On real vLLM (tests/real_vllm) --- The spec on vLLM 0.25.0 with every REVERT applied, read
# from the real tier's shared run (tests/real_vllm/runs.py): vLLM's own spec method and V2 runner
# reshape (tests/real_vllm/inside/runner_answers.py), under the kind "attention".

import pytest  # noqa: E402

from tests.real_vllm import runs  # noqa: E402

REAL_KIND = "attention"


def real_reverted() -> dict:
    """What vLLM 0.25.0 with every REVERT applied answered, without the shim and with it."""
    run = runs.reverted()
    assert run["answers"], run["report"]
    return run["answers"]


@pytest.mark.real_vllm
def test_on_reverted_vllm_the_v2_runner_views_attention_at_512_bytes_and_584_with_the_shim():
    answers = real_reverted()
    without, with_shim = answers["without_shim"], answers["with_shim"]
    assert without["kv_quant_mode"][REAL_KIND] == "NONE"
    view = without["views"][REAL_KIND]
    # Silently strided over the padded 37440-byte pages: what FlashMLA rejects.
    assert view["shape"] == [4, 64, 512], view
    assert view["stride"] == [37440, 512, 1], view
    assert view["page_bytes"] == 37440
    view = with_shim["views"][REAL_KIND]
    assert view["shape"] == [4, 64, 584], view
    assert view["stride"] == [37440, 584, 1], view
    assert view["page_bytes"] == without["views"][REAL_KIND]["page_bytes"]
    # The round's one spec of the compressed cache, corrected once.
    assert answers["corrections"][PATCH.name] == 1
