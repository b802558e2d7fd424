"""The ``vllm.general_plugins`` entry point.

vLLM loads general plugins once in every process it starts (API server, engine
core, workers, Ray actors), honouring its ``VLLM_PLUGINS`` allow-list. This
path runs late, after vLLM has imported much of itself, which is why the hooks
also fire for modules that are already imported; the ``sitecustomize`` path runs
first and covers code that runs before plugins load. Both share one idempotent
installer, which raises into vLLM only :class:`~dspark_hotfix.HotfixError`, in
strict mode.
"""

import dspark_hotfix


def register() -> None:
    dspark_hotfix.install("vllm-plugin")
