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

Decision: at import, the real method is called with a stand-in draft (43
target layers, 3 draft layers) on ``mtp.1.*``; the patch is applied only if the
answer lands outside the draft's layers.

Removal: with any released vLLM (>= 0.25.0); ``dspark-hotfix status`` then
reports ``not_needed``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from dspark_hotfix.patches.base import Patch, Verdict

_LAYERS = "model.layers."


def remap_dspark_name(
    name: str, mapped: str | None, num_draft_layers: int | Callable[[], int | None] | None
) -> str | None:
    """Return the parameter a checkpoint weight ``name`` must load into.

    ``mapped`` is what vLLM's ``_remap_dspark_name`` answered. Only the defect is
    changed: ``mtp.{i}.<rest>`` mapped to ``model.layers.{j}.<rest>`` with ``j``
    outside the draft's layers becomes ``model.layers.{i}.<rest>``, and only when
    layer ``i`` exists. Every other answer (``None``, head weights, names in
    range) is returned as it is. ``num_draft_layers`` may be a callable, so the
    count is only looked up for names that need it.
    """
    # Called once per checkpoint name. Every released vLLM answers mtp.{i}.<rest> with
    # model.layers.{i}.<rest>: one comparison settles that case (13 == len(_LAYERS)).
    if mapped is None or not mapped.startswith(_LAYERS) or mapped[13:] == name[4:]:
        return mapped
    if not name.startswith("mtp."):
        return mapped
    j, _, tail = mapped[13:].partition(".")
    i, dot, rest = name[4:].partition(".")
    if j == i or not dot or tail != rest or not (i.isdecimal() and j.isdecimal()):  # int() accepts these
        return mapped
    count = num_draft_layers() if callable(num_draft_layers) else num_draft_layers
    index = int(i)
    if count is None or int(j) < count or index >= count:
        return mapped
    return f"{_LAYERS}{index}.{rest}"


def draft_layer_count(draft: Any) -> int | None:
    """How many decoder layers the DSpark draft registers (``model.layers``)."""
    layers = getattr(getattr(draft, "model", None), "layers", None)
    try:
        return len(layers) if layers is not None else None
    except TypeError:
        return None


class RemapDSparkName(Patch):
    name = "remap_dspark_name"
    module = "vllm.models.deepseek_v4.nvidia.dspark"
    qualname = "DSparkDeepseekV4ForCausalLM._remap_dspark_name"
    parameters = ("self", "name")
    summary = "draft weights mtp.{i}.* land on the draft's model.layers.{i}.*"

    # The last draft seen (weakly) and its layer indices.
    _last: tuple[Any, frozenset[str] | None] = (None, None)

    PROBE_TARGET_LAYERS = 43  # DeepSeek-V4-Flash
    PROBE_DRAFT_LAYERS = 3

    def probe(self, original: Any) -> Verdict:
        n, k = self.PROBE_TARGET_LAYERS, self.PROBE_DRAFT_LAYERS
        config = SimpleNamespace(num_hidden_layers=n, n_mtp_layers=k)
        draft = SimpleNamespace(
            config=config,
            model=SimpleNamespace(
                config=config,
                num_hidden_layers=n,
                num_dspark_layers=k,
                layers=[None] * k,
                confidence_head=None,
            ),
        )
        name = "mtp.1.attn.wkv.weight"
        try:
            mapped = original(draft, name)
        except Exception as exc:
            return Verdict(None, f"probe inconclusive ({type(exc).__name__}: {exc})")
        fixed = remap_dspark_name(name, mapped, k)
        if fixed != mapped:
            return Verdict(True, f"needed (vLLM maps {name} to {mapped}; shim gives {fixed})")
        return Verdict(False, f"not needed (vLLM maps {name} to {mapped})")

    def correct(self, mapped: str | None, draft: Any, name: str) -> str | None:
        """:func:`remap_dspark_name` for one call of vLLM's method, in fewer steps
        (it runs once per checkpoint name); the tests hold both to the same answers."""
        if mapped is None or not mapped.startswith(_LAYERS):
            return mapped
        tail = name[4:]
        if mapped[13:] == tail:
            return mapped  # every released vLLM's answer for a draft layer's weight
        ref, layers = self._last
        if ref is None or ref() is not draft:
            layers = self._layer_indices(draft)
        if layers is None:
            return mapped  # a draft of unknown size: nothing is changed
        i, dot, rest = tail.partition(".")
        if i not in layers or not dot or not name.startswith("mtp."):
            return remap_dspark_name(name, mapped, len(layers))  # the rare shapes, by the book
        # mtp.{i}.<rest> of a layer the draft has: the defect is model.layers.{j}.<rest>, j past them.
        end = len(mapped) - len(rest) - 1
        j = mapped[13:end]
        if mapped[end:] != tail[len(i):] or not j.isdecimal() or int(j) < len(layers):
            return mapped
        return _LAYERS + tail  # i is spelled as the draft numbers its layers

    def _layer_indices(self, draft: Any) -> frozenset[str] | None:
        """{"0", ..., "K-1"} for a draft of K layers, kept for the next call: on vLLM's
        module tree ``draft.model.layers`` is two ``nn.Module.__getattr__`` calls."""
        count = draft_layer_count(draft)
        if count is None:
            return None
        indices = frozenset(map(str, range(count)))
        try:
            self._last = (weakref.ref(draft), indices)
        except TypeError:  # not weakly referenceable: read every time
            pass
        return indices

    def describe(self, before: Any, after: Any) -> str:
        return f"{before} -> {after}"


PATCH = RemapDSparkName()
