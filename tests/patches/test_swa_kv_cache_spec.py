"""swa_kv_cache_spec: its declarations (tests/patches/__init__.py); its correction is tested with
the attention patch's in test_fp8_ds_mla.py, the layout both share."""

from __future__ import annotations

from types import SimpleNamespace

from dspark_hotfix.patches.swa_kv_cache_spec import PATCH
from tests.patches import BUILDS, Fault, Revert, module_file

FILE = module_file(PATCH)
# Upstream PR #47716.
FIX = [
    ("import SlidingWindowMLASpec, uint8", "import SlidingWindowMLASpec, get_kv_quant_mode, uint8"),
    (
        'model_version="deepseek_v4",',
        (
            'model_version="deepseek_v4",'
            " kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),"
        ),
    ),
]
FAULTS = {
    "swa class renamed": Fault(
        {"*": [("DeepseekV4SWACache", "DeepseekV4SlidingWindowCache")]},
        "has no class DeepseekV4SWACache",
    ),
    "swa method renamed": Fault(
        {
            FILE: [("def get_kv_cache_spec(", "def kv_cache_spec(")],
            "*": [("swa_cache.get_kv_cache_spec(", "swa_cache.kv_cache_spec(")],
        },  # warmup's
        "DeepseekV4SWACache defines no get_kv_cache_spec",
    ),
    "swa signature changed": Fault(
        {
            FILE: [
                (
                    "def get_kv_cache_spec(self, vllm_config)",
                    "def get_kv_cache_spec(self, vllm_config, layer_idx=0)",
                )
            ]
        },
        "unexpected signature",
    ),
    "get_kv_quant_mode missing": Fault(BUILDS["get_kv_quant_mode missing"], "get_kv_quant_mode"),
    # dataclasses.replace raises ValueError here up to Python 3.12, TypeError from 3.13 on.
    "spec class with an unknown required field": Fault(
        BUILDS["spec class with an unknown required field"],
        "Error: InitVar 'window_layout' must be specified with replace())",
        state="undecided",
    ),
    "spec page rule raises": Fault(
        BUILDS["spec page rule raises"],
        "probe inconclusive (NotImplementedError",
        state="undecided",
    ),
}
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = (
    Revert(
        "v1/attention/backends/mla/sparse_swa.py",
        "DeepseekV4SWACache.get_kv_cache_spec",
        "kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),",
        None,
    ),
)

CONFIG = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))


def exercise():
    """vLLM's call of the target: a sliding-window layer's KV-cache spec (through the shim's wrapper
    where it wraps)."""
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache

    return DeepseekV4SWACache().get_kv_cache_spec(CONFIG)


# --- On real vLLM (tests/real_vllm) --- The spec on vLLM 0.25.0 with every REVERT applied, read
# from the real tier's shared run (tests/real_vllm/runs.py): vLLM's own spec method and V2 runner
# reshape (tests/real_vllm/inside/runner_answers.py), under the kind "swa".

import pytest  # noqa: E402

from tests.real_vllm import runs  # noqa: E402

REAL_KIND = "swa"


def real_reverted() -> dict:
    """What vLLM 0.25.0 with every REVERT applied answered, without the shim and with it."""
    run = runs.reverted()
    assert run["answers"], run["report"]
    return run["answers"]


@pytest.mark.real_vllm
def test_on_reverted_vllm_the_v2_runner_views_swa_at_512_bytes_without_the_shim_and_584_with_it():
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
    # The round's one spec of the sliding-window cache, corrected once.
    assert answers["corrections"][PATCH.name] == 1


@pytest.mark.real_vllm
@pytest.mark.parametrize("version", runs.VERSIONS)
def test_on_a_release_with_the_upstream_fix_it_says_vllm_already_returns_584_bytes_per_token(
    version,
):
    run = runs.released(version)
    assert run["answers"], run["report"]
    assert (
        run["answers"]["status"][PATCH.name]["detail"]
        == "not needed (vLLM already returns 584 bytes/token)"
    )
