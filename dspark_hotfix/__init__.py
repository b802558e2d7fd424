"""dspark_hotfix: repairs DeepSeek-V4 DSpark speculative decoding in a running vLLM.

Put ``dspark-hotfix path`` on ``PYTHONPATH``, or let vLLM load the
``vllm.general_plugins`` entry point; ``DSPARK_HOTFIX=0`` turns it off.

This module is also all that interpreter start loads (``sitecustomize.py``
calls :func:`boot`): the switch, the import watcher, and the sitecustomize ours
shadows. It runs in every Python process of a serving image, so it is the
standard library only and as little of it as possible: no ``from __future__``,
no ``typing``, no ``importlib.abc`` base class (importing it pulls in
``pathlib`` and ``re``), no logging, no second module. The registry, wrapt and
the patches are imported when vLLM imports the packages of the patches'
targets, and never before. Nothing here raises: a start-up hook that fails
would break every process in the image.
"""

import os
import sys

__version__ = "0.3.0"
__all__ = ["HotfixError", "__version__", "install", "status", "uninstall"]

ENABLE = "DSPARK_HOTFIX"
TRUE_WORDS = ("1", "true", "on", "yes")
FALSE_WORDS = ("0", "false", "off", "no")
_enabled = None
chained = None  # what chain() imported at start-up: {"file": ...} or {"error": ...}; None: nothing shadowed


def shown(raw, limit=60):
    """A switch's value as a warning quotes it: repr, cut to ``limit`` characters."""
    text = repr(raw)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(raw)} characters)"


def enabled():
    """``DSPARK_HOTFIX``: on when unset or a true word; any other value is off.

    An A/B whose B arm is silently patched is worse than none, so a value that
    is neither a true nor a false word turns the shim off too, and says so once
    on stderr whatever ``DSPARK_HOTFIX_LOG`` asks.
    """
    global _enabled
    if _enabled is None:
        raw = os.environ.get(ENABLE)
        value = (raw or "").strip().lower()
        _enabled = raw is None or value in TRUE_WORDS
        if not _enabled and value not in FALSE_WORDS:
            sys.stderr.write(
                f"dspark_hotfix: {ENABLE}={shown(raw)} is not one of {'/'.join(TRUE_WORDS)}: the hotfix is OFF "
                f"in this process (say {'/'.join(FALSE_WORDS)} to turn it off without this warning)\n"
            )
    return _enabled


# The packages whose first import activates the registry: the parents of the
# patches' target modules (tests/test_activation.py checks that they agree).
# Activating there, not at `import vllm`, keeps wrapt and the registry out of
# processes that never load DeepSeek-V4 (or an MLA backend, or the V2 runner).
TRIGGERS = frozenset((
    "vllm.v1.core",
    "vllm.models.deepseek_v4",
    "vllm.models.deepseek_v4.nvidia",
    "vllm.v1.attention.backends.mla",
    "vllm.v1.worker.gpu",
))


def triggered():
    """Whether a package that activates the registry is imported already."""
    return any(name in sys.modules for name in TRIGGERS)


class VllmImportWatcher:
    """A meta-path finder that activates the registry when a TRIGGERS package loads.

    Hazard: CPython calls ``find_spec`` with the global import lock held. Were
    activation to run there, a thread importing wrapt (which activation
    imports) would wait for that lock while activation waited for wrapt's module
    lock: a hang for good. So ``find_spec`` only asks the finders after it for
    the package's spec and hands it a loader that activates in ``exec_module``,
    where the only lock held is the package's own module lock, which CPython's
    deadlock detection covers. Nothing here imports a module or takes a lock.

    It wraps every TRIGGERS import until an activation has completed, so a
    second thread importing another TRIGGERS package waits for the first
    thread's activation (in ``registry.activate``) instead of running ahead of
    the hooks. It stays on ``sys.meta_path``: removing a finder while the
    import system iterates that list would skip the next finder.
    """

    __slots__ = ("asking", "done", "source")

    def __init__(self, source):
        self.source = source
        self.done = False
        self.asking = False  # the finders asked below may ask the meta path again (wrapt's does)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in TRIGGERS or self.done or self.asking or self not in sys.meta_path:
            return None
        self.asking = True
        try:
            for finder in sys.meta_path[sys.meta_path.index(self) + 1:]:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None:
                    break
            else:
                return None
        finally:
            self.asking = False
        loader = spec.loader
        if hasattr(loader, "exec_module") and hasattr(loader, "create_module"):
            spec.loader = ActivatingLoader(loader, self)
        return spec

    def activate(self):
        try:
            from dspark_hotfix import registry

            registry.activate(self.source)
            self.done = True
        except Exception as exc:
            if type(exc).__name__ == "HotfixError":  # strict mode: the import of vLLM stops here
                raise
            self.done = True
            sys.stderr.write(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}\n")


class ActivatingLoader:
    """The package's own loader, activating the registry before the package runs."""

    __slots__ = ("loader", "watcher")

    def __init__(self, loader, watcher):
        self.loader, self.watcher = loader, watcher

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        # The module keeps its real loader (pkgutil, importlib.resources and
        # reload read it), as wrapt's chained loader does.
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self.loader
        if getattr(module.__spec__, "loader", None) is self:
            module.__spec__.loader = self.loader
        self.watcher.activate()
        self.loader.exec_module(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def watch(source):
    """Insert a watcher unless one (of any copy of this module) is there already."""
    if not any(type(finder).__name__ == "VllmImportWatcher" for finder in sys.meta_path):
        sys.meta_path.insert(0, VllmImportWatcher(source))


def start(source):
    """Activate the registry now if a target's package is imported already (by an
    earlier sitecustomize, a .pth, or vLLM before its plugins), else watch for one."""
    if enabled():
        if triggered():
            from dspark_hotfix import registry

            registry.activate(source)
        else:
            watch(source)


def boot(sitecustomize_file):
    """Called by ``sitecustomize.py``: arrange the hooks, then chain."""
    try:
        start("sitecustomize")
    except Exception as exc:
        sys.stderr.write(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}\n")
    chain(sitecustomize_file)


def chain(sitecustomize_file):
    """Import the ``sitecustomize`` that ours shadows, exactly once.

    Only the first ``sitecustomize`` on ``sys.path`` runs, and Debian and Ubuntu
    Pythons ship their own. Every entry whose ``sitecustomize.py`` is our very
    file (a symlinked directory, or a checkout root's link to it, too) is taken off ``sys.path`` for the import and
    put back where it was, keeping what the shadowed one changed (images extend
    ``sys.path`` there); errors are reported the way ``site`` reports its own
    sitecustomize's, start-up goes on, and ``chained`` records what happened.
    """
    global chained
    ours = sys.modules.get("sitecustomize")
    # samefile compares two stats; realpath would walk every path component in Python code.
    found = [(i, p, os.path.join(p, "sitecustomize.py")) for i, p in enumerate(sys.path)]
    taken = [(i, p) for i, p, f in found if os.path.isfile(f) and os.path.samefile(f, sitecustomize_file)]
    sys.path[:] = [p for i, p in enumerate(sys.path) if (i, p) not in taken]
    sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # (the shadowed one, if any)

        chained = {"file": getattr(sitecustomize, "__file__", None)}
    except ImportError as exc:
        if exc.name != "sitecustomize":
            chained = _report(exc)
    except Exception as exc:
        chained = _report(exc)
    finally:
        for i, p in taken:
            sys.path.insert(i, p)
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _report(exc):
    if sys.flags.verbose:
        sys.excepthook(type(exc), exc, exc.__traceback__)
    else:
        sys.stderr.write(
            "Error in sitecustomize; set PYTHONVERBOSE for traceback:\n"
            f"{type(exc).__name__}: {exc}\n"
        )
    return {"error": f"{type(exc).__name__}: {exc}"}


def __getattr__(name):
    if name in ("HotfixError", "install", "status", "uninstall"):
        from dspark_hotfix import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'dspark_hotfix' has no attribute {name!r}")
