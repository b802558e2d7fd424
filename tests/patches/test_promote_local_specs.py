"""promote_local_specs: its declarations (tests/patches/__init__.py), its arguments step as a plain
function, the repair on the stand-in's 0.33.0 planning, and on real vLLM 0.33.0 and 0.34.0."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dspark_hotfix
from dspark_hotfix.patches.fp8_ds_mla import (
    BYTES_PER_TOKEN,
    quant_mode,
    runner_bytes_per_token,
    stand_in_pair,
)
from dspark_hotfix.patches.promote_local_specs import FIELD, PATCH, arguments
from tests.conftest import STANDIN
from tests.patches import BUILDS, KVI, Fault, module_file

FILE = module_file(PATCH)
# The stand-in's kv_cache_utils, vLLM 0.25.0's grouping: the place of the call up to 0.32.0.
UTILS = PATCH.also_in[0].replace(".", "/") + ".py"
# vLLM 0.34.0 drops the field at the call.
FIX = [('drop=("extra_retained_tokens",)', 'drop=("extra_retained_tokens", "bounded_replay")')]
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
    "replace_as signature changed": Fault(
        {
            KVI: [
                (
                    "def replace_as(spec, target_cls, *, drop=(), **changes)",
                    "def replace_as(spec, target_cls, *, drop=(), keep=(), **changes)",
                )
            ]
        },
        "unexpected signature",
    ),
    # Its probe runs vLLM's promotion: where that is gone, it cannot tell, and leaves the call
    # alone.
    "promotion renamed": Fault(
        {FILE: [("def _promote_local_kv_cache_specs(", "def _promote_local_specs(")]},
        "probe inconclusive (LookupError: this vLLM defines no _promote_local_kv_cache_specs",
        state="undecided",
    ),
}
# 0.25.0 and 0.28.0 have no kv_cache_planning; 0.33.0's promotion raises
# (docs/evidence/hybrid-off.md).
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "patched"}
REVERT = ()  # the reported build plans as 0.25.0 does, without this module


# --- Its arguments step, a plain function ---


@dataclasses.dataclass(frozen=True)
class Narrow:
    size: int = 0


@dataclasses.dataclass(frozen=True)
class Wide(Narrow):
    bounded_replay: bool = False
    window: int = 0


NAMES = st.sampled_from(["window", "size", FIELD, "extra_retained_tokens"])


@given(
    source=st.sampled_from([Narrow, Wide]),
    target=st.sampled_from([Narrow, Wide]),
    drop=st.lists(NAMES, max_size=3).map(tuple),
    changes=st.dictionaries(st.sampled_from(["size", "block"]), st.integers(), max_size=2),
)
def test_the_arguments_step_drops_the_field_only_where_the_target_lacks_it_and_keeps_the_rest(
    source, target, drop, changes
):
    spec = source()
    repaired = arguments(spec, target, drop=drop, **changes)
    if source is Narrow or target is Wide or FIELD in drop:
        assert repaired is None  # the call as vLLM makes it
        return
    assert repaired == ((spec, target), {"drop": (*drop, FIELD), **changes})


# --- On the stand-in: vLLM 0.33.0's planning ---


def import_targets(patches: Any = None) -> None:
    """Import the patches' target modules, as vLLM does: each hook judges its patch."""
    for patch in dspark_hotfix.patches.ALL if patches is None else patches:
        importlib.import_module(patch.module)


def promoted() -> Any:
    """The stand-in planning's promotion of a DeepSeek-V4 pair, as vLLM's hybrid-off grouping calls
    it."""
    planning = importlib.import_module(PATCH.module)
    return planning._promote_local_kv_cache_specs(
        stand_in_pair(sys.modules["vllm.v1.kv_cache_interface"], quant_mode())
    )


def test_with_the_shim_the_promotion_keeps_the_layout_and_counts_one_repair(standin_shim):
    shim = standin_shim()
    dspark_hotfix.install()
    swa = promoted()["swa"]
    assert type(swa).__name__ == "MLAAttentionSpec" and swa.kv_quant_mode == quant_mode()
    assert runner_bytes_per_token(swa) == BYTES_PER_TOKEN and swa.sliding_window == 128
    row = shim.status()[PATCH.name]
    assert (row["state"], row["calls"], row["corrections"]) == ("patched", 1, 1), row


def test_excluded_vllm_meets_its_own_type_error_and_the_line_says_the_repair_was_needed(
    standin_shim, monkeypatch
):
    shim = standin_shim()
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{PATCH.name}")
    dspark_hotfix.install()
    import_targets()
    try:
        promoted()
    except TypeError as exc:
        assert f"unexpected keyword argument '{FIELD}'" in str(exc)
    else:
        raise AssertionError("the stand-in's promotion did not raise")
    (line,) = shim.summaries()
    assert f"1 excluded ({PATCH.name})" in line and ": problem: " in line


def test_where_no_place_makes_the_call_the_grouping_as_shipped_decides(standin_shim):
    # No planning module, and a grouping that makes no replace_as call: the grouping, run as vLLM
    # ships it (the stop's wrapper taken off), raises no TypeError for a field.
    shim = standin_shim(remove=(FILE,))
    dspark_hotfix.install()
    import_targets([p for p in dspark_hotfix.patches.ALL if p is not PATCH])  # as vLLM does
    row = shim.status()[PATCH.name]
    assert row["state"] == "not_needed", row
    assert PATCH.absent is not None
    assert (
        row["detail"]
        == PATCH.absent().detail
        == (
            "not needed (this vLLM's KV-cache planning makes no replace_as call, and its hybrid-off"
            " grouping raises no TypeError for a field)"
        )
    )
    (line,) = shim.summaries()
    assert ": fixing: " in line and "1 not_needed" in line


def test_where_no_place_makes_the_call_but_the_grouping_raises_for_a_field_it_is_undecided(
    standin_shim,
):
    # The absence is judged by what the grouping does, not by a module's name: a grouping without
    # the planning module that still raises for a field leaves the repair undecided, and said.
    shim = standin_shim(
        {UTILS: [("compress_ratio=spec.compress_ratio,", "window=spec.sliding_window,")]},
        remove=(FILE,),
    )
    dspark_hotfix.install()
    import_targets([p for p in dspark_hotfix.patches.ALL if p is not PATCH])
    row = shim.status()[PATCH.name]
    assert row["state"] == "undecided", row
    assert "unexpected keyword argument 'window'" in row["detail"], row


def test_where_the_promotion_lives_in_kv_cache_utils_it_is_repaired_there(standin_shim):
    # vLLM 0.31.0 and 0.32.0: the same call, in the module vLLM 0.33.0 moved it from.
    planning = (STANDIN / FILE).read_text().split("from vllm.v1.kv_cache_interface", 1)[1]
    utils = UTILS
    head = "from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec\n"
    shim = standin_shim(
        {utils: [(head, f"from vllm.v1.kv_cache_interface{planning}\n")]}, remove=(FILE,)
    )
    dspark_hotfix.install()
    import_targets([p for p in dspark_hotfix.patches.ALL if p is not PATCH])  # as vLLM does
    row = shim.status()[PATCH.name]
    assert (row["state"], row["target"]) == ("patched", f"{PATCH.also_in[0]}.replace_as"), row
    utils_module = sys.modules[PATCH.also_in[0]]
    swa = utils_module._promote_local_kv_cache_specs(
        stand_in_pair(sys.modules["vllm.v1.kv_cache_interface"], quant_mode())
    )["swa"]
    assert runner_bytes_per_token(swa) == BYTES_PER_TOKEN
    assert shim.status()[PATCH.name]["corrections"] == 1


@pytest.mark.parametrize("by_keyword", [(), ("target_cls",), ("spec", "target_cls")])
def test_the_repair_takes_every_form_of_call_vllm_takes(standin_shim, by_keyword):
    # vLLM's replace_as takes spec and target_cls by position or by keyword: so does the step.
    shim = standin_shim()
    dspark_hotfix.install()
    import_targets()
    interface = sys.modules["vllm.v1.kv_cache_interface"]
    swa = stand_in_pair(interface, quant_mode())["swa"]
    given_args = {"spec": swa, "target_cls": interface.MLAAttentionSpec}
    positional = [value for name, value in given_args.items() if name not in by_keyword]
    keywords = {name: given_args[name] for name in by_keyword}
    planning = sys.modules[PATCH.module]
    promoted = planning.replace_as(*positional, drop=("extra_retained_tokens",), **keywords)
    assert type(promoted).__name__ == "MLAAttentionSpec"
    assert runner_bytes_per_token(promoted) == BYTES_PER_TOKEN
    row = shim.status()[PATCH.name]
    assert (row["state"], row["corrections"]) == ("patched", 1), row


# --- On real vLLM (tests/real_vllm) --- vLLM's own hybrid-off grouping of DeepSeek-V4's specs
# (tests/real_vllm/inside/hybrid_off.py): 0.33.0 and, beside the releases every patch declares,
# 0.34.0, the release with the fix.

from tests.real_vllm import runs  # noqa: E402

FIXED_RELEASE = "0.34.0"


def swa_layers(result: dict) -> dict[str, Any]:
    return {
        name: layer
        for name, layer in result["hybrid_off"]["layers"].items()
        if layer["kind"] == "swa"
    }


@pytest.mark.real_vllm
def test_on_real_vllm_0_33_0_the_hybrid_off_grouping_succeeds_with_the_layout():
    without, result = (
        runs.hybrid_off("0.33.0", "without_shim"),
        runs.hybrid_off("0.33.0", "with_shim"),
    )
    assert without["hybrid_off"]["outcome"] == "error", without["hybrid_off"]
    assert without["hybrid_off"]["error"]["message"].endswith(
        f"unexpected keyword argument '{FIELD}'"
    )
    off = result["hybrid_off"]
    assert off["outcome"] == "ok", off
    assert off["groups"] == [
        {"spec": "UniformTypeKVCacheSpecs", "block_size": 256, "layers": 13}
    ], off["groups"]
    layers = swa_layers(result)
    assert len(layers) == 7, layers  # 4 target layers, 3 draft layers
    for name, layer in layers.items():
        assert (layer["spec"], layer["kv_quant_mode"]) == ("MLAAttentionSpec", "FP8_PER_TENSOR"), (
            name,
            layer,
        )
        assert layer["view"]["bytes_per_token"] == BYTES_PER_TOKEN, (name, layer)
    row = result["status"]["patches"][PATCH.name]
    assert (
        row["state"] == "patched" and f"unexpected keyword argument '{FIELD}'" in row["detail"]
    ), row


@pytest.mark.real_vllm
def test_on_real_vllm_0_34_0_it_is_not_needed_and_the_grouping_is_vllms_own():
    without, result = (
        runs.hybrid_off(FIXED_RELEASE, "without_shim"),
        runs.hybrid_off(FIXED_RELEASE, "with_shim"),
    )
    assert result["vllm"] == FIXED_RELEASE
    assert result["hybrid_off"] == without["hybrid_off"] and result["hybrid_off"]["outcome"] == "ok"
    assert {layer["view"]["bytes_per_token"] for layer in swa_layers(result).values()} == {
        BYTES_PER_TOKEN
    }
    row = result["status"]["patches"][PATCH.name]
    assert row == {
        "state": "not_needed",
        "needed": False,
        "detail": "not needed (vLLM's hybrid-off promotion of the sliding-window specs succeeds)",
    }, row


@pytest.mark.real_vllm
@pytest.mark.parametrize("version", ["0.25.0"])
def test_on_real_vllm_without_the_planning_module_it_is_not_needed_and_says_why(version):
    row = runs.hybrid_off(version, "with_shim")["status"]["patches"][PATCH.name]
    assert row["state"] == "not_needed", row
    assert row["detail"].startswith("not needed (this vLLM's KV-cache planning makes no"), row


def test_what_the_shim_says_names_the_place_it_decided_on(standin_shim):
    # The promotion in kv_cache_utils (vLLM 0.31.0, 0.32.0), with a call the probe cannot judge:
    # the warning, and the row, name that module's replace_as, not the first place's.
    planning = (STANDIN / FILE).read_text().split("from vllm.v1.kv_cache_interface", 1)[1]
    head = "from vllm.v1.kv_cache_interface import MLAAttentionSpec, SlidingWindowMLASpec\n"
    moved = f"from vllm.v1.kv_cache_interface{planning}\n".replace(
        "page_size_padded=None)", "page_size_padded=None, window=spec.sliding_window)"
    )
    assert "window=" in moved
    shim = standin_shim({UTILS: [(head, moved)]}, remove=(FILE,))
    dspark_hotfix.install()
    import_targets([p for p in dspark_hotfix.patches.ALL if p is not PATCH])
    row = shim.status()[PATCH.name]
    where = f"{PATCH.also_in[0]}.replace_as"
    assert (row["state"], row["target"]) == ("undecided", where), row
    (warning,) = [line for line in shim.lines("WARNING") if f"{PATCH.name}: cannot patch" in line]
    assert f"cannot patch {where}: " in warning, warning
