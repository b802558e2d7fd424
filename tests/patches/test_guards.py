"""The guards' checks as plain functions: what counts as a problem, and what vLLM itself exempts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dspark_hotfix.patches import Finding
from dspark_hotfix.patches.draft_load_coverage import load_weights


class Module:
    def __init__(self, params, quant_method=None):
        self.params, self.quant_method = params, quant_method

    def named_parameters(self):
        return [(p, None) for p in self.params]


def draft(modules: dict[str, Module]):
    registered = [(f"{prefix}.{p}", None) for prefix, m in modules.items() for p in m.params]
    return SimpleNamespace(named_parameters=lambda: registered, named_modules=lambda: list(modules.items()))


def test_none_from_load_weights_means_not_tracked_as_in_vllms_loader():
    d = draft({"model.layers.0.attn": Module(["wkv.weight"])})
    assert load_weights(lambda self, w: None, d, []) is None


def test_parameters_a_quantization_method_fills_after_loading_are_exempt_as_in_vllms_loader():
    fp8 = SimpleNamespace(process_weights_after_loading=lambda layer: None)
    d = draft({"model.layers.0.attn.wkv": Module(["weight", "k_scale"], quant_method=fp8),
               "model.layers.0.ffn.gate": Module(["weight"]),
               "model.embed_tokens": Module(["weight"])})
    loaded = {"model.layers.0.attn.wkv.weight"}
    with pytest.raises(Finding, match=r"^1 DSpark draft parameters were never loaded from the checkpoint: "
                                      r"model\.layers\.0\.ffn\.gate\.weight;"):
        load_weights(lambda self, w: set(loaded), d, [])
    assert load_weights(lambda self, w: loaded | {"model.layers.0.ffn.gate.weight"}, d, []) is not None
