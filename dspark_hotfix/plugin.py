"""The ``vllm.general_plugins`` entry point.

vLLM loads general plugins once in every process it starts (API server, engine
core, workers, Ray actors), honouring its ``VLLM_PLUGINS`` allow-list. This
path runs late, after vLLM has imported much of itself, which is why the hooks
also fire for modules that are already imported; the ``sitecustomize`` path runs
first and covers code that runs before plugins load. Both share one idempotent
installer. An exception raised here would propagate into vLLM, so none does,
except :class:`~dspark_hotfix.HotfixError` in strict mode.
"""

from __future__ import annotations

import sys


def register() -> None:
    try:
        from dspark_hotfix import registry

        registry.install(source="vllm-plugin")
    except Exception as exc:
        if type(exc).__name__ == "HotfixError":
            raise
        sys.stderr.write(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}\n")
