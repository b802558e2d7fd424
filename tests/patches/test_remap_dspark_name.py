"""The remap correction as a plain function, on the stand-in draft's loader, and its properties.

The remap correction may change exactly one kind of answer (``mtp.{i}.<rest>``
sent to ``model.layers.{j}.<rest>`` with ``j`` outside the draft's layers and
``i`` inside). The oracles of the properties are written from that contract,
not from the implementation.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dspark_hotfix.patches.remap_dspark_name import PATCH, remap_dspark_name
from tests.patches import Fault, Revert, engine_start, module_file

REMAP = PATCH
CORRECT = REMAP.correction  # the patched method's answer from vLLM's
FILE = module_file(PATCH)
# The released remap (every dspark.py from 0.25.0 on).
FIX = [("{self.config.num_hidden_layers + stage}", "{stage}")]
FAULTS = {
    "draft class renamed": Fault(
        {"*": [("DSparkDeepseekV4ForCausalLM", "DSparkDraftForCausalLM")]},
        "has no class DSparkDeepseekV4ForCausalLM",
    ),
    "remap method renamed": Fault(
        {FILE: [("_remap_dspark_name", "_remap_checkpoint_name")]},
        "DSparkDeepseekV4ForCausalLM defines no _remap_dspark_name",
    ),
    "remap signature changed": Fault(
        {
            FILE: [
                (
                    "def _remap_dspark_name(self, name)",
                    "def _remap_dspark_name(self, name, *, stage_offset=0)",
                )
            ]
        },
        "unexpected signature",
    ),
}
RELEASED = {"0.25.0": "not_needed", "0.28.0": "not_needed", "0.33.0": "not_needed"}
REVERT = (
    Revert(
        "models/deepseek_v4/nvidia/dspark.py",
        "DSparkDeepseekV4ForCausalLM._remap_dspark_name",
        'return f"model.layers.{stage}.{rest}"',
        'return f"model.layers.{self.config.num_hidden_layers + stage}.{rest}"',
    ),
)


def exercise():
    """vLLM's call of the target: the draft's loader maps a checkpoint name (through the shim's
    wrapper where it wraps)."""
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    return DSparkDeepseekV4ForCausalLM()._remap_dspark_name("mtp.1.attn.wkv.weight")


N, K = 43, 3  # DeepSeek-V4-Flash: 43 target layers, 3 draft layers


@pytest.mark.parametrize("i", range(K))
def test_shifted_layer_lands_on_the_draft_layer(i):
    shifted = f"model.layers.{N + i}.attn.wkv.weight"
    assert (
        remap_dspark_name(f"mtp.{i}.attn.wkv.weight", shifted, K)
        == f"model.layers.{i}.attn.wkv.weight"
    )


@pytest.mark.parametrize(
    ("name", "mapped"),
    [
        ("mtp.0.attn.wkv.weight", "model.layers.0.attn.wkv.weight"),  # already right
        ("mtp.2.norm.weight", "model.norm.weight"),  # head weights stay
        ("mtp.2.markov_head.weight", "model.markov_head.weight"),
        ("mtp.0.main_proj.weight", "model.main_proj.weight"),
        ("layers.0.attn.wkv.weight", None),  # not a draft weight
        ("mtp.1.confidence_head.weight", None),
        ("context_wkv_proj.weight", "model.context_wkv_proj.weight"),
        ("mtp.1.ffn.gate.weight", "model.layers.2.ffn.gate.weight"),  # in range: not ours to judge
        ("mtp.1.attn.wkv.weight", "model.layers.44.attn.other.weight"),  # rest differs
    ],
)
def test_every_other_answer_is_returned_untouched(name, mapped):
    assert remap_dspark_name(name, mapped, K) is mapped


def test_never_maps_onto_a_layer_the_draft_does_not_have():
    # mtp.3 with a 3-layer draft: layer 3 does not exist, so keep vLLM's answer.
    assert (
        remap_dspark_name("mtp.3.attn.wkv.weight", "model.layers.46.attn.wkv.weight", K)
        == "model.layers.46.attn.wkv.weight"
    )


def test_unknown_draft_size_changes_nothing():
    assert (
        remap_dspark_name("mtp.0.x.weight", "model.layers.43.x.weight", None)
        == "model.layers.43.x.weight"
    )


def test_the_correction_reads_the_drafts_layers_and_corrects_vllms_answer():
    from types import SimpleNamespace

    from dspark_hotfix.patches.remap_dspark_name import correction

    draft = SimpleNamespace(model=SimpleNamespace(layers=[None] * K))
    shifted = f"model.layers.{N + 1}.attn.wkv.weight"
    assert correction(shifted, draft, "mtp.1.attn.wkv.weight") == "model.layers.1.attn.wkv.weight"
    assert (
        correction(shifted, SimpleNamespace(), "mtp.1.attn.wkv.weight") is shifted
    )  # a draft of unknown size


# Reproducible in CI, and no .hypothesis/ directory written into the checkout.
PROPERTY = settings(database=None, derandomize=True, deadline=None, max_examples=200)
WITH_STANDIN = settings(
    PROPERTY, max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture]
)  # the stand-in is imported once per test; examples never modify it

# A checkpoint's draft names are f"mtp.{i}.{rest}" with an int i: ASCII digits only, and a rest:
# "mtp.0." names no weight, and whatever vLLM answers for it stands.
MTP = re.compile(r"mtp\.([0-9]+)\.(.+)", re.DOTALL)
LAYER = re.compile(r"model\.layers\.([0-9]+)\.(.*)", re.DOTALL)
HEAD = ("norm.weight", "markov_head.weight", "main_proj.weight", "main_norm.weight", "hc_head_fn")
LAYER_WEIGHTS = ("attn.wkv.weight", "ffn.gate.weight")


def defect_answer(name: str, mapped: str | None, draft_layers: int | None) -> str | None:
    """What the correction must answer instead of ``mapped``; None: ``mapped`` stands."""
    if mapped is None or draft_layers is None:
        return None
    src, dst = MTP.fullmatch(name), LAYER.fullmatch(mapped)
    if not (src and dst) or src[2] != dst[2]:
        return None
    i, j = int(src[1]), int(dst[1])
    if j < draft_layers or i >= draft_layers:
        return None
    return f"model.layers.{i}.{src[2]}"


def layer_index(answer: str | None) -> int | None:
    match = LAYER.fullmatch(answer or "")
    return int(match[1]) if match else None


# Digits as a checkpoint writes them, and look-alikes that str.isdigit() accepts
# but int() rejects (superscripts). Non-ASCII decimal digits, which int() reads,
# are left out: no checkpoint has them, and either answer would do.
index = st.one_of(
    st.integers(0, 99).map(str),
    st.sampled_from(["00", "01", "007", "0x1", "-1", "", "\u00b2", "\u00b9", "\u00b3\u00b2"]),
)
rest = st.one_of(st.sampled_from(LAYER_WEIGHTS + HEAD + ("", ".", "x.y.z")), st.text(max_size=12))


@st.composite
def shifted_cases(draw):
    """The reported defect's shape: mtp.{i}.<rest> answered model.layers.{i + shift}.<rest>."""
    i, shift, tail = draw(st.integers(0, 9)), draw(st.integers(0, 64)), draw(rest)
    return (
        f"mtp.{i}.{tail}",
        f"model.layers.{i + shift}.{tail}",
        draw(st.one_of(st.none(), st.integers(0, 8))),
    )


@st.composite
def remap_cases(draw):
    if draw(st.booleans()):
        return draw(shifted_cases())
    i, tail = draw(index), draw(rest)
    name = draw(
        st.one_of(
            st.just(f"mtp.{i}.{tail}"),
            st.sampled_from(
                [f"mtp.{i}", f"layers.{i}.{tail}", f"model.layers.{i}.{tail}", f"MTP.{i}.{tail}"]
            ),
            st.text(max_size=24),
        )
    )
    j = draw(st.one_of(index, st.integers(0, 200).map(str)))
    mapped = draw(
        st.one_of(
            st.none(),
            st.just(f"model.layers.{j}.{tail}"),
            st.just(f"model.layers.{j}.{draw(rest)}"),
            st.just(f"model.{tail}"),
            st.text(max_size=24),
        )
    )
    draft_layers = draw(st.one_of(st.none(), st.integers(0, 8)))
    return name, mapped, draft_layers


@PROPERTY
@given(remap_cases())
@example(("mtp.1.attn.wkv.weight", "model.layers.44.attn.wkv.weight", 3))  # the reported defect
@example(("mtp.3.attn.wkv.weight", "model.layers.46.attn.wkv.weight", 3))  # no layer 3 to land on
@example(
    ("mtp.\u00b2.attn.wkv.weight", "model.layers.44.attn.wkv.weight", 3)
)  # isdigit() but not int()
@example(("mtp.1.attn.wkv.weight", "model.layers.\u2074\u2074.attn.wkv.weight", 3))
@example(("mtp.0.", "model.layers.1.", 1))  # no rest: not a weight
def test_remap_changes_only_a_shifted_draft_layer_and_keeps_every_other_answer(case):
    name, mapped, draft_layers = case
    answer = remap_dspark_name(name, mapped, draft_layers)
    expected = defect_answer(name, mapped, draft_layers)
    if expected is None:
        assert answer is mapped
    else:
        assert answer == expected


@PROPERTY
@given(remap_cases())
def test_remap_never_points_outside_the_draft_unless_vllm_did(case):
    name, mapped, draft_layers = case
    try:
        answer = remap_dspark_name(name, mapped, draft_layers)
    except ValueError:  # reported by the test above; this one is about where answers point
        return
    if answer != mapped:
        index = layer_index(answer)
        assert draft_layers is not None and index is not None and 0 <= index < draft_layers
    elif layer_index(answer) is not None and (
        draft_layers is None or layer_index(answer) >= draft_layers
    ):
        assert answer is mapped  # out of range only because vLLM said so


@PROPERTY
@given(st.text(max_size=40), st.one_of(st.none(), st.integers(-2, 64)))
def test_remap_keeps_none(name, draft_layers):
    assert remap_dspark_name(name, None, draft_layers) is None


@st.composite
def checkpoint_names(draw, draft_layers: int):
    i = draw(st.integers(0, draft_layers + 2))
    return draw(
        st.sampled_from(
            [f"mtp.{i}.{w}" for w in LAYER_WEIGHTS + HEAD]
            + [f"layers.{i}.attn.wkv.weight", f"mtp.{i}.confidence_x"]
        )
    )


def vllm_remap(draft_class):
    """vLLM's own ``_remap_dspark_name``, even if a shim in this process wrapped it."""
    function = draft_class.__dict__["_remap_dspark_name"]
    return getattr(function, "__wrapped__", function)


@WITH_STANDIN
@given(st.data(), st.integers(0, 96), st.integers(1, 8))
def test_standin_draft_weights_land_on_the_draft_layers_through_the_correction(
    standin_modules, data, n, k
):
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    draft = DSparkDeepseekV4ForCausalLM(num_hidden_layers=n, n_mtp_layers=k)
    remap = vllm_remap(DSparkDeepseekV4ForCausalLM)
    for name in data.draw(st.lists(checkpoint_names(k), min_size=1, max_size=12)):
        mapped = remap(draft, name)  # the reported build's answer
        fixed = CORRECT(mapped, draft, name)  # the patched method's answer
        assert fixed == (defect_answer(name, mapped, k) or mapped)
        src = MTP.fullmatch(name)
        if src and src[2] in LAYER_WEIGHTS and int(src[1]) < k and n + int(src[1]) >= k:
            assert fixed == f"model.layers.{src[1]}.{src[2]}"  # the draft's own layer
        elif src and src[2] in LAYER_WEIGHTS and int(src[1]) >= k:
            assert fixed == mapped  # no such draft layer: vLLM's answer stands
        if src is None:
            assert fixed is None


@WITH_STANDIN
@given(st.integers(1, 8).flatmap(lambda k: st.tuples(st.integers(k, 96), st.just(k))))
def test_standin_draft_receives_every_layer_weight_through_the_correction(standin_modules, shape):
    from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM

    n, k = shape  # every DeepSeek-V4 model has at least as many target layers as draft layers
    draft = DSparkDeepseekV4ForCausalLM(num_hidden_layers=n, n_mtp_layers=k)
    remap = vllm_remap(DSparkDeepseekV4ForCausalLM)
    checkpoint = [f"mtp.{i}.{w}" for i in range(k) for w in LAYER_WEIGHTS]
    layer_params = {p for p, _ in draft.named_parameters() if p.startswith("model.layers.")}
    assert n == 0 or not {remap(draft, name) for name in checkpoint} & layer_params - {
        f"model.layers.{i}.{w}" for i in range(min(n, k)) for w in LAYER_WEIGHTS
    }  # vLLM's answers miss
    assert {CORRECT(remap(draft, name), draft, name) for name in checkpoint} == layer_params


def test_the_standin_engine_loads_the_drafts_layer_weights_only_with_the_shim(
    standin_shim, monkeypatch
):
    # tests/standin/warmup.py loads the draft's checkpoint as vLLM's engine does: without the shim
    # its layers' names are shifted past the target's, so none of them loads where the draft
    # registers it.
    off = engine_start(standin_shim, monkeypatch, "0")
    assert off["loaded"] and not [
        name for name in off["loaded"] if name.startswith("model.layers.0.")
    ], off


def test_with_the_shim_the_standin_engine_loads_them_where_the_draft_registers_them(
    standin_shim, monkeypatch
):
    on = engine_start(standin_shim, monkeypatch, "1")
    assert "model.layers.0.attn.wkv.weight" in on["loaded"], on


# --- On real vLLM (tests/real_vllm) --- The remap on vLLM releases from PyPI, read from the real
# tier's shared runs (tests/real_vllm/runs.py).

import json  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

from tests.conftest import program  # noqa: E402
from tests.real_vllm import runs  # noqa: E402

REAL_N, REAL_K = 43, 3  # the draft of tests/real_vllm/inside/runner_answers.py: 3 layers over 43
REAL_LAYER_WEIGHTS = 10  # the names of each draft layer in tests/real_vllm/inside/grid.py (NAMES)


def real_corrections(n: int, k: int) -> list[list[Any]]:
    """Run in the 0.25.0 venv with the shim on: vLLM's remap through the class, for every name of
    the grid, and what the correction makes of its answer and of the answer shifted as the reported
    build shifts it."""
    import grid

    from dspark_hotfix.patches.remap_dspark_name import PATCH

    draft, rows = grid.draft(n, k), []
    for name in grid.NAMES:
        try:
            real = grid.remap(draft, name)
        except Exception:
            continue
        shifted = real
        if real is not None and real.startswith("model.layers."):
            index, _, rest = real[len("model.layers.") :].partition(".")
            shifted = f"model.layers.{n + int(index)}.{rest}"
        correct = PATCH.correction
        assert correct is not None
        rows.append(
            [real, correct(real, draft, name) is real, shifted, correct(shifted, draft, name)]
        )
    return rows


@pytest.mark.real_vllm
def test_on_real_vllm_the_correction_keeps_the_releases_answers_and_corrects_the_shifted_ones():
    proc = runs.in_venv("0.25.0", program(partial(real_corrections, REAL_N, REAL_K)))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(kept for _, kept, _, _ in rows), rows  # vLLM's own answer, the very object
    assert [corrected for _, _, _, corrected in rows] == [real for real, _, _, _ in rows]
    assert sum(shifted != real for real, _, shifted, _ in rows) == REAL_K * REAL_LAYER_WEIGHTS


def real_reverted() -> dict:
    """What vLLM 0.25.0 with every REVERT applied answered, without the shim and with it."""
    run = runs.reverted()
    assert run["answers"], run["report"]
    return run["answers"]


@pytest.mark.real_vllm
def test_on_reverted_vllm_without_the_shim_the_remap_shifts_draft_layers_past_the_target():
    remap = real_reverted()["without_shim"]["remap"]
    assert remap["mtp.1.attn.wkv.weight"] == f"model.layers.{REAL_N + 1}.attn.wkv.weight"
    shifted = 0
    for name, answer in remap.items():
        match = MTP.fullmatch(name)
        if answer and answer.startswith("model.layers.") and match:
            i, rest = match.groups()
            assert answer == f"model.layers.{REAL_N + int(i)}.{rest}", (name, answer)
            shifted += 1
    assert shifted == REAL_K * REAL_LAYER_WEIGHTS


@pytest.mark.real_vllm
def test_on_reverted_vllm_with_the_shim_the_remap_is_positional_and_leaves_head_weights_alone():
    answers = real_reverted()
    moved = kept = 0
    for name, before in answers["without_shim"]["remap"].items():
        after = answers["with_shim"]["remap"][name]
        match = MTP.fullmatch(name)
        if before and before.startswith("model.layers.") and match:
            i, rest = match.groups()
            assert after == f"model.layers.{i}.{rest}", (name, before, after)
            moved += 1
        else:
            assert after == before, (name, before, after)
            kept += bool(before and before.startswith("model."))
    assert moved == REAL_K * REAL_LAYER_WEIGHTS
    assert kept >= 7, (
        "the head weights (norm, hc_head_*, markov_head, main_proj, main_norm) were not exercised"
    )
    # One round of the grid's names: one correction per draft layer weight.
    assert answers["corrections"][PATCH.name] == REAL_K * REAL_LAYER_WEIGHTS
