"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` on ``PYTHONPATH``, or let vLLM load the
``vllm.general_plugins`` entry point; ``DSPARK_HOTFIX=0`` turns it off.

This module holds the switches' one reading and :func:`install`. Interpreter
start loads it only where ``DSPARK_HOTFIX`` holds a value other than blank, ``1``
or ``0`` (``startup/sitecustomize.py`` reads those itself, and watches for vLLM),
so it is the standard library only: no ``from __future__``,
no ``typing``, no logging. The registry, wrapt and the patches are imported
when the shim activates, and never before. Nothing here raises, except
:class:`~dspark_hotfix.HotfixError` in strict mode.
"""

import os
import sys

__version__ = "0.8.0"


def say(text):
    """A line on stderr, where it can be written; the process goes on without it."""
    try:
        sys.stderr.write(text + "\n")
    except Exception:  # None under 2>&-, a read-only fd 2, a reader gone, a closed file
        pass


TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")


def shown(raw, limit=60):
    """A switch's value as a warning quotes it: repr, cut to ``limit`` characters."""
    text = repr(raw)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(raw)} characters)"


def switch(name, raw, default, what):
    """An on/off switch's value, and the problem to say, if any: the one reading of
    ``DSPARK_HOTFIX`` (here, in the commands and, for any value but blank, ``1`` and ``0``, at
    interpreter start) and of ``DSPARK_HOTFIX_STRICT``. Unset or blank (a blank templated variable)
    is ``default``; any value that is neither a true nor a false word turns ``what`` off, and is
    said: an A/B arm is never patched by mistake, nor a fleet made strict."""
    word = (raw or "").strip().lower()
    if word in TRUE_WORDS + FALSE_WORDS or not word:
        return word in TRUE_WORDS or (default and not word), None
    return (
        False,
        f"{name}={shown(raw)} is not one of {'/'.join(TRUE_WORDS + FALSE_WORDS)}: {what} is OFF",
    )


ENABLE = "DSPARK_HOTFIX"
_enabled = None


class HotfixError(RuntimeError):
    """Strict mode (or a stop): the shim stops vLLM, saying why."""


def enabled(tell=say):
    """``DSPARK_HOTFIX``: on where unset, blank or a true word; off otherwise. A value that is
    neither a true nor a false word is said once on stderr (:func:`switch`) with ``tell``,
    with the verdict ``status`` gives there, ``undecided``: nothing is judged. At interpreter start
    the start-up hook's own ``say`` tells it, which leaves nothing buffered where stderr cannot be
    written (a line left in stderr's buffer fails the flush at exit: exit status 120)."""
    global _enabled
    if _enabled is None:
        _enabled, problem = switch(ENABLE, os.environ.get(ENABLE), True, "the shim")
        # Tagged as the state lines are (no logging here), with the verdict their alert reads.
        if problem:
            tell(
                f"WARNING [dspark_hotfix] dspark_hotfix {__version__} (pid {os.getpid()}):"
                f" undecided: {problem}"
            )
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
    except BaseException:
        # An interrupt. vLLM calls a plugin once, so the activation is made whole first.
        install(source)
        raise


def status():
    """What the shim did in this process (``registry.status``); changes nothing."""
    from dspark_hotfix import registry

    return registry.status()
