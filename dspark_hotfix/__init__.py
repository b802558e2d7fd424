"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` (or this repository's root) on ``PYTHONPATH``, or let
vLLM load the ``vllm.general_plugins`` entry point; set ``DSPARK_HOTFIX=0`` to
turn it off. Importing this package costs next to nothing: wrapt and the patches
are imported only when vLLM is.
"""

from __future__ import annotations

from dspark_hotfix.hooks import HotfixError, install, status, uninstall

__version__ = "0.1.0"
__all__ = ["HotfixError", "__version__", "install", "status", "uninstall"]
