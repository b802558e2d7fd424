"""The remap correction as a plain function, and on the stand-in draft's loader."""

from __future__ import annotations

import pytest

from dspark_hotfix.patches.remap_dspark_name import remap_dspark_name

N, K = 43, 3  # DeepSeek-V4-Flash: 43 target layers, 3 draft layers


@pytest.mark.parametrize("i", range(K))
def test_shifted_layer_lands_on_the_draft_layer(i):
    shifted = f"model.layers.{N + i}.attn.wkv.weight"
    assert remap_dspark_name(f"mtp.{i}.attn.wkv.weight", shifted, K) == f"model.layers.{i}.attn.wkv.weight"


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
    assert remap_dspark_name("mtp.3.attn.wkv.weight", "model.layers.46.attn.wkv.weight", K) == (
        "model.layers.46.attn.wkv.weight"
    )


def test_unknown_draft_size_changes_nothing():
    assert remap_dspark_name("mtp.0.x.weight", "model.layers.43.x.weight", None) == "model.layers.43.x.weight"


def test_the_replacement_calls_vllm_first_and_corrects_its_answer():
    from types import SimpleNamespace

    from dspark_hotfix.patches.remap_dspark_name import _remap_dspark_name

    draft = SimpleNamespace(model=SimpleNamespace(layers=[None] * K))
    calls = []

    def vllm(self, name):
        calls.append((self, name))
        return f"model.layers.{N + 1}.attn.wkv.weight"

    assert _remap_dspark_name(vllm, draft, "mtp.1.attn.wkv.weight") == "model.layers.1.attn.wkv.weight"
    assert calls == [(draft, "mtp.1.attn.wkv.weight")]
