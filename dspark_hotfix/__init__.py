"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` on ``PYTHONPATH``, or let vLLM load the
``vllm.general_plugins`` entry point; ``DSPARK_HOTFIX=0`` turns it off.

This module is also all that interpreter start loads (``sitecustomize.py``
calls :func:`at_interpreter_start`): the switch, the import watcher, and the sitecustomize ours
shadows. It runs in every Python process of a serving image, so it is the
standard library only and as little of it as possible: no ``from __future__``,
no ``typing``, no ``importlib.abc`` base class (importing it pulls in
``pathlib`` and ``re``), no logging, no second module. The registry, wrapt and
the patches are imported when ``vllm`` is imported, and never before. Nothing
here raises (a start-up hook that fails would break every process in the
image), except :class:`~dspark_hotfix.HotfixError` in strict mode.
"""

import os
import sys

__version__ = "0.5.0"
__all__ = ["HotfixError", "__version__", "install", "status"]

ENABLE = "DSPARK_HOTFIX"
TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")
_enabled = None
chained = None  # what chain() imported at start-up: {"file": ...} or {"error": ...}; None: nothing shadowed


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


class VllmImportWatcher:
    """A meta-path finder that activates the registry when ``vllm`` is imported.

    Hazard: CPython calls ``find_spec`` with the global import lock held. Were
    activation to run there, a thread importing wrapt (which activation
    imports) would wait for that lock while activation waited for wrapt's module
    lock: a hang for good. So ``find_spec`` only asks the finders after it for
    the module's spec and hands it a loader that activates in ``exec_module``,
    where the only lock held is the module's own, which CPython's deadlock
    detection covers. Nothing here imports a module or takes a lock.

    Until an activation has completed it does so for every module of vLLM, not
    only ``vllm`` itself: a second thread importing a submodule of the package
    that the first is still executing does not wait for the package, so it is
    made to wait for the first thread's activation (in ``registry.activate``)
    instead of running ahead of the hooks. It stays on ``sys.meta_path``:
    removing a finder while the import system iterates that list would skip the
    next finder.

    The construction is deliberate and not new: ddtrace's module watchdog
    (``ModuleWatchdog.find_spec`` in DataDog/dd-trace-py) asks the finders after
    it itself and wraps the loader it gets, its fix for the same import-lock
    deadlock; wrapt's importer (``ImportHookFinder``, the hooks' own mechanism)
    guards its re-entry the way ``asking`` does here.
    """

    __slots__ = ("asking", "done", "source")

    def __init__(self, source):
        self.source = source
        self.done = False
        self.asking = False  # the finders asked below may ask the meta path again

    def find_spec(self, fullname, path=None, target=None):
        if self.done or self.asking or not (fullname == "vllm" or fullname.startswith("vllm.")) or \
                self not in sys.meta_path:
            return None
        self.asking = True
        try:
            for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
                spec = finder.find_spec(fullname, path, target) if hasattr(finder, "find_spec") else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.asking = False
        if hasattr(spec.loader, "exec_module"):
            spec.loader = ActivatingLoader(spec.loader, self)  # type: ignore[assignment]  # no abc base, see above
        return spec


class ActivatingLoader:
    """A vLLM module's own loader, activating the registry before the module runs.

    A transparent proxy, because other tools wrap it and keep it, by design as
    in the prior art. ddtrace's ``ModuleWatchdog`` (``ddtrace/internal/module.py``)
    walks ``sys.meta_path`` as the watcher does, wraps this loader, assigns
    ``get_code`` on it to transform the module's code, and leaves it as the
    module's ``__loader__``; availability checks copy and pickle the spec of
    ``importlib.util.find_spec("vllm")``. So, like wrapt's ``ObjectProxy``, no
    ``__slots__``: reads and writes go to the real loader, but for its own two
    attributes, in its ``__dict__``, which is empty while ``copy`` or ``pickle``
    rebuilds one (a look-up must fail then, not recurse). ``__loader__`` and
    ``__spec__.loader`` go back to the real loader only where they still point
    at the proxy, as wrapt's importer does (``_self_set_loader``): a loader
    wrapped around this one (ddtrace's, wrapt's, ``importlib.util.LazyLoader``)
    put itself there and restores what it wants; a module that refuses keeps it.
    """

    def __init__(self, loader, watcher):
        vars(self).update(loader=loader, watcher=watcher)  # __setattr__ writes to the real loader

    def exec_module(self, module):
        # The module keeps its real loader (pkgutil, importlib.resources and reload read it).
        for owner, name in ((module, "__loader__"), (getattr(module, "__spec__", None), "loader")):
            try:
                if getattr(owner, name, None) is self:
                    setattr(owner, name, self.loader)
            except (AttributeError, TypeError):
                pass
        activate_or_watch(self.watcher.source, now=True)
        self.watcher.done = True  # not after an interrupt: the retried import activates
        self.loader.exec_module(module)

    def __getattr__(self, name):  # create_module and whatever else is asked of the real loader
        if "loader" not in vars(self):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __setattr__(self, name, value):
        setattr(self.loader, name, value)


def activate_or_watch(source, now=False):
    """Activate the registry now if vLLM is imported already (by an earlier
    sitecustomize, a .pth, or vLLM's plugin loader), or ``now`` is asked, else
    watch for it. The watcher's loader asks ``now``: the module it runs is
    vLLM's even outside ``sys.modules`` (a version probe's ``exec_module``)."""
    try:
        if enabled() and (now or "vllm" in sys.modules):
            from dspark_hotfix import registry

            registry.activate(source)
        elif enabled() and not any(type(finder).__name__ == "VllmImportWatcher" for finder in sys.meta_path):
            sys.meta_path.insert(0, VllmImportWatcher(source))  # unless one (of any copy of this module) is there
    except Exception as exc:
        if type(exc).__name__ == "HotfixError":  # strict mode: the import of vLLM, or its plugin loader, fails
            raise
        say(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}")


def at_interpreter_start(sitecustomize_file):
    """Called by ``sitecustomize.py``: arrange the hooks, then chain."""
    try:
        activate_or_watch("sitecustomize")
    finally:
        chain(sitecustomize_file)


def chain(sitecustomize_file):
    """Import the ``sitecustomize`` that ours shadows, exactly once.

    Only the first ``sitecustomize`` on ``sys.path`` runs, and Debian and Ubuntu
    Pythons ship their own. Every entry whose ``sitecustomize.py`` (``.pyc`` in
    a sourceless image) is our very file (a symlinked directory, or a checkout
    root's link to it, too) is taken off ``sys.path`` for the import and put
    back where it was, keeping what the shadowed one changed (images extend
    ``sys.path`` there); errors are reported the way ``site`` reports its own
    sitecustomize's, start-up goes on, and ``chained`` records what happened.
    """
    global chained
    ours = sys.modules.pop("sitecustomize", None)
    name = os.path.basename(sitecustomize_file)  # sitecustomize.pyc where an image keeps no sources
    # samefile compares two stats; realpath would walk every path component in Python code.
    taken = [(i, p) for i, p in enumerate(sys.path) if os.path.isfile(os.path.join(p, name))
             and os.path.samefile(os.path.join(p, name), sitecustomize_file)]
    for i, _ in reversed(taken):
        del sys.path[i]
    try:
        import sitecustomize  # (the shadowed one, if any)

        # Another copy of ours (in a directory further down sys.path) recorded what it chained.
        if getattr(sitecustomize, "at_interpreter_start", None) is not at_interpreter_start:
            chained = {"file": getattr(sitecustomize, "__file__", None)}
    except Exception as exc:
        if not (isinstance(exc, ImportError) and exc.name == "sitecustomize"):
            chained = {"error": f"{type(exc).__name__}: {exc}"}
            say(f"Error in sitecustomize (chained by dspark_hotfix):\n{chained['error']}")
    finally:
        for i, p in taken:
            sys.path.insert(i, p)
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def __getattr__(name):
    if name in ("HotfixError", "install", "status"):
        from dspark_hotfix import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'dspark_hotfix' has no attribute {name!r}")
