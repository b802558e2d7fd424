"""vLLM's reading of ``VLLM_PLUGINS``: split on commas, spaces kept (vLLM 0.25.0 ``envs.py``)."""

import os


def __getattr__(name):
    if name == "VLLM_PLUGINS":
        return None if "VLLM_PLUGINS" not in os.environ else os.environ["VLLM_PLUGINS"].split(",")
    raise AttributeError(name)
