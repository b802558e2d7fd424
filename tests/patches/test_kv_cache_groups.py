"""The hybrid KV cache manager off, on the stand-in: the stop at KV-cache grouping and its words.

The stand-in engine's start (tests/standin/warmup.py) runs in this process, on the shim of the
``standin_shim`` fixture (tests/patches/conftest.py).
"""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest

import dspark_hotfix
from dspark_hotfix.patches import ALL
from dspark_hotfix.patches.kv_cache_groups import PATCH
from tests.conftest import REPO, state_of
from tests.patches import BUILDS, Fault, module_file

# vLLM 0.28.0's hybrid-off grouping keeps the layout (vllm#51612).
FIX = [
    (
        "compress_ratio=spec.compress_ratio,",
        "compress_ratio=spec.compress_ratio, kv_quant_mode=spec.kv_quant_mode,",
    )
]
FAULTS = {
    "get_kv_quant_mode missing": Fault(BUILDS["get_kv_quant_mode missing"], "get_kv_quant_mode"),
    "spec class with an unknown required field": Fault(
        BUILDS["spec class with an unknown required field"],
        "probe inconclusive (TypeError",
        state="undecided",
    ),
    "spec page rule raises": Fault(
        BUILDS["spec page rule raises"],
        "probe inconclusive (NotImplementedError",
        state="undecided",
    ),
}
# 0.25.0's hybrid-off grouping loses the layout (docs/evidence/hybrid-off.md); 0.33.0 groups
# elsewhere.
RELEASED = {"0.25.0": "patched", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = ()  # the reported build's grouping is 0.25.0's

CONFIG = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
HYBRID_ON = SimpleNamespace(
    scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False), kv_transfer_config=None
)


def exercise():
    """vLLM's call of the target: the engine groups a DeepSeek-V4 layer's KV-cache specs, the hybrid
    manager on (through the shim's wrapper where it wraps)."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.v1.core import kv_cache_utils

    attn = DeepseekV4Attention(compress_ratio=4)
    specs = {
        "model.layers.0.attn": attn.get_kv_cache_spec(CONFIG),
        "model.layers.0.attn.swa_cache": attn.swa_cache.get_kv_cache_spec(CONFIG),
    }
    return kv_cache_utils.get_kv_cache_groups(HYBRID_ON, specs)


REPORTED = "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"


def engine_start(hybrid: bool) -> dict:
    """The stand-in engine's start (tests/standin/warmup.py) in this process: its report."""
    return importlib.import_module("warmup").run(hybrid)


def import_targets() -> None:
    """Import every patch's target module: every patch is judged."""
    for patch in ALL:
        importlib.import_module(patch.module)


def grouping_behind_a_connector() -> str | None:
    """What grouping one DeepSeek-V4 cache raises where a KV connector turned the hybrid manager
    off."""
    from vllm.models.deepseek_v4.attention import DeepseekV4Attention
    from vllm.v1.core import kv_cache_utils

    attn = DeepseekV4Attention(compress_ratio=4)
    specs = {"model.layers.0.attn.swa_cache": attn.swa_cache.get_kv_cache_spec(CONFIG)}
    off = SimpleNamespace(
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=True),
        kv_transfer_config=SimpleNamespace(kv_connector="NixlConnector"),
    )
    try:
        kv_cache_utils.get_kv_cache_groups(off, specs)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def test_without_the_shim_the_hybrid_off_path_dies_with_the_reported_error(
    standin_shim, monkeypatch
):
    standin_shim()
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    dspark_hotfix.install()
    report = engine_start(hybrid=False)
    assert report["error"] == REPORTED
    assert report["views"]["draft.0.swa"]["shape"] == [4, 256, 512]


def test_with_the_shim_it_stops_at_kv_cache_grouping_naming_the_cause_and_what_helps(standin_shim):
    standin_shim()
    dspark_hotfix.install()
    report = engine_start(hybrid=False)
    error = report["error"]
    assert error.startswith(
        f"HotfixError: {PATCH.name}: DeepSeek-V4's fp8_ds_mla KV caches (5 layers, "
    )
    assert (
        "need vLLM's hybrid KV cache manager, and it is off (--disable-hybrid-kv-cache-manager, or"
        " vLLM turned it off and logged why: a --kv-transfer-config connector without hybrid"
        " support)" in error
    )
    assert (
        "leave the hybrid manager on" in error
        and "or a vLLM from 0.28.0 on, which keeps the layout with it off" in error
    )
    assert "PR #47716" not in error  # a release with it fails the same way
    assert "doctor" not in error  # doctor says `guarding` there, and nothing of this setting
    assert report["views"] == {}  # stopped before any view was built


def test_the_stop_says_the_same_where_a_kv_connector_turned_the_manager_off(standin_shim):
    # The config keeps the flag, not its reason; vLLM's own log says which turned it off.
    standin_shim()
    dspark_hotfix.install()
    error, off = grouping_behind_a_connector(), engine_start(hybrid=False)["error"]
    assert error is not None
    assert error.startswith(
        f"HotfixError: {PATCH.name}: DeepSeek-V4's fp8_ds_mla KV caches (1 layer, "
    )
    assert error.partition(" need ")[2] == off.partition(" need ")[2]


def test_with_the_stop_excluded_vllm_meets_its_own_error_and_the_line_says_the_stop_was_needed(
    standin_shim, monkeypatch
):
    shim = standin_shim()
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{PATCH.name}")
    dspark_hotfix.install()
    assert engine_start(hybrid=False)["error"] == REPORTED
    (line,) = shim.summaries()
    assert state_of(line).startswith("problem: ") and f"1 excluded ({PATCH.name})" in line


@pytest.mark.parametrize("switch", ["1", "0"], ids=["shim on", "shim off"])
def test_with_the_manager_on_the_stop_passes_everything_through(standin_shim, monkeypatch, switch):
    standin_shim()
    monkeypatch.setenv("DSPARK_HOTFIX", switch)
    dspark_hotfix.install()
    report = engine_start(hybrid=True)
    widths = {view["shape"][-1] for view in report["views"].values()}
    # The spec patches, not the stop, make 584: off, a view the stand-in's defects give stays 512.
    if switch == "1":
        assert widths == {584} and report["error"] is None, report
    else:
        assert 512 in widths, report


def test_where_the_hybrid_off_path_keeps_the_layout_the_stop_is_not_needed(standin_shim):
    shim = standin_shim({module_file(PATCH): FIX})
    dspark_hotfix.install()
    import_targets()
    row = shim.status()[PATCH.name]
    assert row["state"] == "not_needed"
    assert row["detail"] == "not needed (vLLM's hybrid-off grouping keeps the fp8_ds_mla layout)"
    (summary,) = shim.summaries()
    patched = [p.name for p in ALL if p is not PATCH]
    assert summary.endswith(
        f": fixing: {len(patched)} patched ({', '.join(patched)}), 1 not_needed"
    )


def test_what_doctor_says_it_guards_names_the_settings_the_readmes_removal_rule_names():
    # doctor's `guards` row is the first paragraph of the stop's step; the README's rule must say
    # the same.
    said = " ".join((PATCH.arguments.__doc__ or "").split("\n\n")[0].split())
    rule = (REPO / "README.md").read_text().split("**The rule:**")[1].split("\n\n")[0]
    rule = " ".join(rule.split())  # as it reads, however scripts/matrix.py wraps it
    for setting in (
        "hybrid KV cache manager",
        "--disable-hybrid-kv-cache-manager",
        "--kv-transfer-config",
    ):
        assert setting in said and setting in rule, (setting, said, rule)


def test_a_vllm_without_grouping_in_any_place_fails_the_stop_and_says_where_it_looked(
    standin_shim,
):
    # An unexpected vLLM: no place defines the grouping, so nothing shows the layout is kept.
    shim = standin_shim(
        {module_file(PATCH): [("def get_kv_cache_groups(", "def get_kv_cache_groups_elsewhere(")]}
    )
    dspark_hotfix.install()
    import_targets()
    row = shim.status()[PATCH.name]
    assert row["state"] == "failed", row
    assert "defines no get_kv_cache_groups" in row["detail"], row
    assert "1 failed (kv_cache_groups)" in shim.summaries()[-1]


# --- On real vLLM (tests/real_vllm) --- The stop on vLLM releases from PyPI, read from the real
# tier's shared hybrid-off runs (tests/real_vllm/runs.py, tests/real_vllm/inside/hybrid_off.py):
# vLLM's own grouping of DeepSeek-V4's specs with the manager off.

import pytest  # noqa: E402

from tests.real_vllm import runs  # noqa: E402

REAL_ERROR = "dspark_hotfix.HotfixError"
REAL_WORDS = (
    "hybrid KV cache manager",
    "--disable-hybrid-kv-cache-manager",
    "or a vLLM from 0.28.0 on, which keeps the layout with it off",
)
REAL_GROUPING = PATCH.qualname  # vLLM's KV-cache grouping: hybrid_off.py reports it under this name


def real_assert_stopped(result: dict) -> None:
    off = result["hybrid_off"]
    assert off["outcome"] == "error", f"no stop with the hybrid manager off: {off}"
    error = off["error"]
    assert error["type"] == REAL_ERROR, error
    assert error["message"].startswith(
        f"{PATCH.name}: DeepSeek-V4's fp8_ds_mla KV caches (9 layers"
    ), error
    for words in REAL_WORDS:
        assert words in error["message"], (words, error["message"])
    # Before vLLM's conversion, which rebuilds specs in place (10 of them on 0.25.0): none was
    # rebuilt.
    assert off["specs_rebuilt"] == [], off
    assert result[REAL_GROUPING] == {"module": PATCH.module, "wrapped": True}


@pytest.mark.real_vllm
@pytest.mark.parametrize("version", runs.VERSIONS)
def test_on_real_vllm_it_stops_a_hybrid_off_engine_only_where_the_release_loses_the_layout(version):
    result, without = (
        runs.hybrid_off(version, "with_shim"),
        runs.hybrid_off(version, "without_shim"),
    )
    row = result["status"]["patches"][PATCH.name]
    if RELEASED[version] == "patched":
        real_assert_stopped(result)
        assert row["state"] == "patched", row
    else:
        # Not its to stop: vLLM's grouping is not wrapped and no finding of its own comes (what the
        # other patches make of that grouping is theirs to say).
        assert PATCH.name not in str(result["hybrid_off"].get("error")), result["hybrid_off"]
        assert without["hybrid_off"].get("error", {}).get("type") != REAL_ERROR, without[
            "hybrid_off"
        ]
        assert not result[REAL_GROUPING]["wrapped"], result[REAL_GROUPING]
        # Its probe reads vLLM's hybrid-off grouping as shipped: it keeps the layout (0.28.0), or
        # raises before it rebuilds anything (0.33.0: promote_local_specs' bug, not this one's).
        raised = without["hybrid_off"].get("error")
        words = (
            f"raising {raised['type'].rpartition('.')[2]}("
            if raised
            else "keeps the fp8_ds_mla layout"
        )
        assert row["state"] == "not_needed" and words in row["detail"], (words, row)


@pytest.mark.real_vllm
def test_on_reverted_vllm_it_stops_at_grouping_with_the_releases_words():
    """0.25.0 with every REVERT applied: the corrections apply, and with the manager off the same
    stop comes at grouping, before any view."""
    result = runs.hybrid_off(runs.REVERTED, "with_shim")
    real_assert_stopped(result)
    assert (
        result["hybrid_off"]["error"]
        == runs.hybrid_off(runs.REVERTED_VERSION, "with_shim")["hybrid_off"]["error"]
    )
