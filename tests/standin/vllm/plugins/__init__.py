"""vLLM's general-plugin loading: entry-point group ``vllm.general_plugins``,
the ``VLLM_PLUGINS`` allow-list, and exceptions that propagate into vLLM."""

from __future__ import annotations

import os
from importlib.metadata import entry_points

_loaded = False


def load_general_plugins() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    allowed = os.environ.get("VLLM_PLUGINS")
    names = None if allowed is None else {n.strip() for n in allowed.split(",")}
    for point in entry_points(group="vllm.general_plugins"):
        if names is None or point.name in names:
            point.load()()
