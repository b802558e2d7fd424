"""remap_dspark_name: where a DSpark draft weight from the checkpoint loads.

Symptom: the DSpark draft of DeepSeek-V4 does not receive its layer weights;
released loaders index ``params_dict[name]`` directly and fail with
``KeyError``, a tolerant loader leaves the layers randomly initialised and the
draft's acceptance collapses.

Cause: the reported pre-release build maps checkpoint ``mtp.{i}.*`` to
``model.layers.{num_hidden_layers + i}.*`` (the prefix its attention layers
carry, 43..45 on V4-Flash), while the draft's ``ModuleList`` registers its
layers as ``model.layers.{i}.*``.

Upstream: vllm-project/vllm#47648, cause (1); every released ``dspark.py``
(0.25.0 to 0.33.0) maps ``mtp.{i}.*`` to ``model.layers.{i}.*``. Defensive:
the shifted mapping existed only in the reported build.

Decision: at import, vLLM's method is called with a stand-in draft (43 target
layers, 3 draft layers) on ``mtp.1.*``; the patch is applied only if the
answer lands outside the draft's layers.

Removal: with any released vLLM (>= 0.25.0); ``dspark-hotfix status`` then
reports ``not_needed``.
"""

import re
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dspark_hotfix.patches.base import Need, Patch


def correction(mapped: str | None, /, self: Any, name: str) -> str | None:
    """What ``DSparkDeepseekV4ForCausalLM._remap_dspark_name`` answered, corrected."""
    return remap_dspark_name(name, mapped, draft_layer_count(self))


_DRAFT_WEIGHT = re.compile(r"mtp\.(\d+)\.(.+)", re.ASCII | re.DOTALL)
_LAYER_PARAMETER = re.compile(r"model\.layers\.(\d+)\.(.+)", re.ASCII | re.DOTALL)


def remap_dspark_name(name: str, mapped: str | None, num_draft_layers: int | None) -> str | None:
    """Return the parameter a checkpoint weight ``name`` must load into.

    ``mapped`` is what vLLM's ``_remap_dspark_name`` answered. Only the defect is
    changed: ``mtp.{i}.<rest>`` mapped to ``model.layers.{j}.<rest>`` with ``j``
    outside the draft's layers becomes ``model.layers.{i}.<rest>``, and only when
    layer ``i`` exists. Every other answer (``None``, head weights, names in
    range, a draft of unknown size) is returned as it is.
    """
    if mapped is None or num_draft_layers is None:
        return mapped
    weight = _DRAFT_WEIGHT.fullmatch(name)
    parameter = _LAYER_PARAMETER.fullmatch(mapped)
    if weight is None or parameter is None or weight.group(2) != parameter.group(2):
        return mapped
    i, j = int(weight.group(1)), int(parameter.group(1))
    if j < num_draft_layers or i >= num_draft_layers:
        return mapped
    return f"model.layers.{i}.{weight.group(2)}"


def draft_layer_count(draft: Any) -> int | None:
    """How many decoder layers the DSpark draft registers (``model.layers``)."""
    try:
        return len(draft.model.layers)
    except (AttributeError, TypeError):
        return None


def probe(vllm_remap_dspark_name: Callable[..., Any]) -> Need:
    n, k = 43, 3  # DeepSeek-V4-Flash: 43 target layers, 3 draft layers
    config = SimpleNamespace(num_hidden_layers=n, n_mtp_layers=k)
    model = SimpleNamespace(
        config=config,
        num_hidden_layers=n,
        num_dspark_layers=k,
        layers=[None] * k,
        confidence_head=None,
    )
    draft = SimpleNamespace(config=config, model=model)
    name = "mtp.1.attn.wkv.weight"
    try:
        mapped = vllm_remap_dspark_name(draft, name)
    except Exception as exc:
        return Need(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
    fixed = remap_dspark_name(name, mapped, k)
    if fixed != mapped:
        return Need(True, f"needed (vLLM maps {name} to {mapped}; shim gives {fixed})")
    return Need(False, f"not needed (vLLM maps {name} to {mapped})")


PATCH = Patch(
    name="remap_dspark_name",
    module="vllm.models.deepseek_v4.nvidia.dspark",
    qualname="DSparkDeepseekV4ForCausalLM._remap_dspark_name",
    parameters=("self", "name"),
    correction=correction,
    probe=probe,
)
