"""draft_load_coverage: a guard, not a correction: every draft weight is loaded.

Symptom: a DSpark draft whose layer weights never arrive starts anyway, with
randomly initialised layers, and speculative decoding silently accepts almost
nothing. That is how a wrong ``_remap_dspark_name`` shows in a build whose
loader skips names it has no parameter for.

Cause and upstream: see ``remap_dspark_name`` (vllm-project/vllm#47648).

Decision: applied exactly when ``remap_dspark_name`` is (the same probe of
vLLM's own ``_remap_dspark_name``). After ``load_weights`` it compares the
parameters the draft registers with the names the loader reports as loaded;
parameters shared with the target model (``embed_tokens``, ``lm_head``) are not
the draft's to load. Missing ones are logged as an error naming them; in strict
mode the load stops. The result is never changed.

Removal: with ``remap_dspark_name``.
"""

from __future__ import annotations

import os
from typing import Any

from dspark_hotfix.patches.base import Patch, Verdict
from dspark_hotfix.patches.remap_dspark_name import PATCH as REMAP

SHARED_WITH_TARGET = ("embed_tokens", "lm_head")


def unloaded_draft_parameters(registered: Any, loaded: Any) -> list[str]:
    """Draft parameters the checkpoint never filled, in registration order."""
    done = set(loaded or ())
    return [
        name
        for name in registered
        if name not in done and not any(part in SHARED_WITH_TARGET for part in name.split("."))
    ]


class DraftLoadCoverage(Patch):
    name = "draft_load_coverage"
    module = REMAP.module
    qualname = "DSparkDeepseekV4ForCausalLM.load_weights"
    parameters = ("self", "weights")
    summary = "after loading, every draft parameter came from the checkpoint"

    def probe(self, original: Any) -> Verdict:
        import sys

        from dspark_hotfix.hooks import unwrapped

        owner = getattr(sys.modules.get(self.module), REMAP.qualname.partition(".")[0], None)
        remap = unwrapped(getattr(owner, "__dict__", {}).get("_remap_dspark_name"))
        if remap is None:
            return Verdict(None, "probe inconclusive (no _remap_dspark_name)")
        verdict = REMAP.probe(remap)
        if verdict.needed is False:
            return Verdict(False, "not needed (vLLM's draft remap is right)")
        return Verdict(True, "needed (guards the draft's load while its remap is wrong)")

    def correct(self, result: Any, draft: Any, weights: Any) -> Any:
        missing = unloaded_draft_parameters((n for n, _ in draft.named_parameters()), result)
        if missing:
            from dspark_hotfix import hooks

            shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
            message = (
                f"{self.name}: {len(missing)} DSpark draft parameters were never loaded from the checkpoint "
                f"(pid {os.getpid()}): {shown}; the draft would run with random weights"
            )
            if hooks.settings().strict:
                raise hooks.HotfixError(message)
            hooks.report_error(message)
        return result


PATCH = DraftLoadCoverage()
