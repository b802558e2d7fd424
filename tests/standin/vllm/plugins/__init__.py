"""vLLM's general-plugin loading: entry-point group ``vllm.general_plugins``,
the ``VLLM_PLUGINS`` allow-list, and exceptions that propagate into vLLM."""

from __future__ import annotations

from importlib.metadata import entry_points

from vllm import envs

_loaded = False


def load_general_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    names = envs.VLLM_PLUGINS  # as vLLM reads it: entries keep their spaces
    for point in entry_points(group="vllm.general_plugins"):
        if names is None or point.name in names:
            point.load()()
