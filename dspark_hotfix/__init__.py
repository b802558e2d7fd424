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
import sys

__version__ = "0.5.0"
__all__ = ["HotfixError", "__version__", "install", "status"]

ENABLE = "DSPARK_HOTFIX"
TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")
_enabled = None


def say(text):
    """A line on stderr, where it can be written; start-up goes on without it."""
    try:
        sys.stderr.write(text + "\n")
    except Exception:  # None under 2>&-, a read-only fd 2, a reader gone, a closed file
        pass


def shown(raw, limit=60):
    """A switch's value as a warning quotes it: repr, cut to ``limit`` characters."""
    text = repr(raw)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(raw)} characters)"


def switch_problem(name, raw, meaning):
    """The complaint about a value of an on/off switch that is neither a true nor a false word."""
    if raw is None or raw.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return None
    return f"{name}={shown(raw)} is not one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}: {meaning}"


def enabled():
    """``DSPARK_HOTFIX``: on when unset or a true word; any other value is off.

    An A/B whose B arm is silently patched is worse than none, so a value that
    is neither a true nor a false word turns the shim off too, and says so once
    on stderr.
    """
    global _enabled
    if _enabled is None:
        raw = os.environ.get(ENABLE)
        _enabled = raw is None or raw.strip().lower() in TRUE_WORDS
        problem = switch_problem(ENABLE, raw, "the hotfix is OFF in this process")
        if problem:
            say(f"dspark_hotfix: {problem}")
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
    except Exception as exc:
        if type(exc).__name__ == "HotfixError":  # strict mode: the import of vLLM, or its plugin loader, fails
            raise
        say(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}")


def __getattr__(name):
    if name in ("HotfixError", "status"):
        from dspark_hotfix import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'dspark_hotfix' has no attribute {name!r}")
