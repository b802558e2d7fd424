"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` on ``PYTHONPATH``, or let vLLM load the
``vllm.general_plugins`` entry point; ``DSPARK_HOTFIX=0`` turns it off.

This module holds the switch and :func:`install`. Interpreter start loads it
only where ``DSPARK_HOTFIX`` is set (``startup/sitecustomize.py`` watches for
vLLM without it), so it is the standard library only: no ``from __future__``,
no ``typing``, no logging. The registry, wrapt and the patches are imported
when the shim activates, and never before. Nothing here raises, except
:class:`~dspark_hotfix.HotfixError` in strict mode.
"""

import os

from dspark_hotfix.startup.sitecustomize import say, shown, switch

__version__ = "0.6.0"
__all__ = ["HotfixError", "__version__", "enabled", "install", "say", "shown", "status", "switch"]

ENABLE = "DSPARK_HOTFIX"
_enabled = None


class HotfixError(RuntimeError):
    """Strict mode (or a stop): the shim stops vLLM, saying why."""


def enabled():
    """``DSPARK_HOTFIX``: on where unset, blank or a true word; off otherwise. A value that is
    neither a true nor a false word is said once on stderr (:func:`~dspark_hotfix.startup.sitecustomize.switch`),
    with the verdict ``status`` gives there, ``undecided``: nothing is judged."""
    global _enabled
    if _enabled is None:
        _enabled, problem = switch(ENABLE, os.environ.get(ENABLE), True, "the shim")
        if problem:  # tagged as the state lines are (no logging here), with the verdict their alert reads
            say(f"WARNING [dspark_hotfix] dspark_hotfix {__version__} (pid {os.getpid()}): undecided: {problem}")
    return _enabled


def install(source="api"):
    """Activate the shim in this process: each selected patch is applied when vLLM
    imports its module (at once where it has). Idempotent; ``source`` names the
    activation path (``sitecustomize``, ``vllm-plugin``, ``api``). It raises only
    :class:`~dspark_hotfix.HotfixError`, in strict mode."""
    try:
        if enabled():
            from dspark_hotfix import registry

            registry.activate(source)
    except HotfixError:  # strict mode: the import of vLLM, or its plugin loader, fails
        raise
    except Exception as exc:
        say(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}")
    except BaseException:  # an interrupt: vLLM calls a plugin once, so the activation is made whole first
        install(source)
        raise


def status():
    """What the shim did in this process (``registry.status``); changes nothing."""
    from dspark_hotfix import registry

    return registry.status()
