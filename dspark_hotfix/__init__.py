"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` (or this repository's root) on ``PYTHONPATH``, or let
vLLM load the ``vllm.general_plugins`` entry point; set ``DSPARK_HOTFIX=0`` to
turn it off. Importing this package costs next to nothing: the registry, wrapt
and the patches load on first use, or when vLLM is imported.
"""

__version__ = "0.1.0"
__all__ = ["HotfixError", "__version__", "install", "status", "uninstall"]


def __getattr__(name):
    if name in ("HotfixError", "install", "status", "uninstall"):
        from dspark_hotfix import hooks

        return getattr(hooks, name)
    raise AttributeError(f"module 'dspark_hotfix' has no attribute {name!r}")
