"""draft_load_coverage: a guard, not a correction: every draft weight is loaded.

Symptom: a DSpark draft whose layer weights never arrive starts anyway, with
randomly initialised layers, and speculative decoding silently accepts almost
nothing. That is how a wrong ``_remap_dspark_name`` shows in a build whose
loader skips names it has no parameter for.

Cause and upstream: see ``remap_dspark_name`` (vllm-project/vllm#47648).

Decision: applied where ``remap_dspark_name`` is needed, after the draft's
``load_weights``. It reads the returned set of loaded names the way vLLM's own
``DefaultModelLoader`` does: ``None`` means the model does not track what it
loaded, so there is nothing to check. Otherwise a registered draft parameter
missing from the set is a :class:`Finding`. Two kinds are exempt: parameters
shared with the target model (``embed_tokens``, ``lm_head``), and, as vLLM's
``track_weights_loading`` exempts them, the parameters of a module whose
quantization method fills them after loading (KV-cache and online-quantization
scales). The registry logs the finding as an error naming them (strict mode:
the load stops). The result is never changed.

Removal: with ``remap_dspark_name``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dspark_hotfix.patches.base import Finding, Patch

SHARED_WITH_TARGET = ("embed_tokens", "lm_head")


def load_weights(vllm_load_weights: Callable[..., Any], /, self: Any, weights: Any) -> Any:
    """``DSparkDeepseekV4ForCausalLM.load_weights``, guarded."""
    loaded = vllm_load_weights(self, weights)
    missing = unloaded_draft_parameters((name for name, _ in self.named_parameters()), loaded, filled_later(self))
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise Finding(f"{len(missing)} DSpark draft parameters were never loaded from the checkpoint: {shown}; "
                      "the draft would run with random weights")
    return loaded


def unloaded_draft_parameters(registered: Any, loaded: Any, exempt: Any = ()) -> list[str]:
    """Draft parameters the checkpoint never filled, in registration order; none if not tracked."""
    if loaded is None:
        return []
    done = set(loaded) | set(exempt)
    return [name for name in registered
            if name not in done and not any(part in SHARED_WITH_TARGET for part in name.split("."))]


def filled_later(draft: Any) -> set[str]:
    """Parameters of modules whose quantization method fills them after loading."""
    exempt: set[str] = set()
    for prefix, module in getattr(draft, "named_modules", lambda: ())():
        method = getattr(module, "quant_method", None)
        if getattr(method, "uses_meta_device", False) or getattr(method, "process_weights_after_loading", None):
            exempt.update(f"{prefix}.{name}" if prefix else name for name, _ in module.named_parameters())
    return exempt


PATCH = Patch(
    name="draft_load_coverage",
    module="vllm.models.deepseek_v4.nvidia.dspark",
    qualname="DSparkDeepseekV4ForCausalLM.load_weights",
    parameters=("self", "weights"),
    replacement=load_weights,
    guards=("remap_dspark_name",),
)
