"""dspark_hotfix start-up hook: put this file's directory on PYTHONPATH.

At interpreter start this is the only module of the shim that loads, and it
imports only the standard library: it puts :class:`VllmImportWatcher` on
``sys.meta_path``, then runs the ``sitecustomize`` it shadows (:func:`chain`).
The ``dspark_hotfix`` package is imported when ``vllm`` is, and activates its
registry then; where ``DSPARK_HOTFIX`` holds a value other than the two it reads
itself, it is imported at once to read it (:func:`start`).
No ``from __future__``, no ``typing``, no ``importlib.abc`` base class (importing
it pulls in ``pathlib`` and ``re``), no logging. Nothing here raises (a start-up
hook that fails would break every process in the image), except the package's
``HotfixError`` in strict mode, when vLLM is imported.
"""

import os
import sys

chained = None  # what chain() imported: {"file": ...} or {"error": ...}; None: nothing shadowed


def say(text):
    """A line on stderr, where it can be written; the process goes on without it (the package says
    a malformed switch at start with it). Where ``sys.stderr`` is the interpreter's own, as yet
    undecorated, the line goes straight to its file descriptor: a line that could not be written
    must not stay in the stream's buffer, whose flush at exit would then fail (exit status 120)."""
    try:
        own = sys.__stderr__
        if own is None or own is not sys.stderr or "write" in vars(own):
            # Replaced or decorated (pytest's capture, vLLM's prefix): its own write.
            return sys.stderr.write(text + "\n")
        own.flush()
        os.write(own.fileno(), (text + "\n").encode(own.encoding, "backslashreplace"))
    except Exception:  # None under 2>&-, a read-only fd 2, a reader gone, a closed file
        pass


def package():
    """The ``dspark_hotfix`` package, or None where it cannot be imported (said on stderr).

    The package this file came with comes first: beside it (a checkout's root, or a
    copy of one), or two directories up from its real path (the start-up directory of
    an installed wheel or of a checkout), then ``sys.path``. Those directories are on
    ``sys.path`` only for the import: a checkout's tests/, bench/ and scripts/ must not
    become importable in every process."""
    real = os.path.realpath(__file__)
    ours = [os.path.dirname(__file__), os.path.dirname(os.path.dirname(os.path.dirname(real)))]
    sys.path[:0] = ours
    try:
        import dspark_hotfix

        return dspark_hotfix
    except Exception as exc:
        say(
            f"dspark_hotfix: not active: {sys.executable} cannot import the package"
            f" ({type(exc).__name__}: {exc}); install it into this interpreter from a checkout or a"
            f" wheel: {sys.executable} -m pip install PATH"
        )
        return None
    finally:
        del sys.path[: len(ours)]


def activate(source):
    """Activate the shim (the package's ``install``): the registry's hooks, from now on."""
    shim = package()
    if shim is not None:
        shim.install(source)


def start():
    """Watch for vLLM, or activate at once where it is imported already (by an earlier
    sitecustomize or a .pth); nothing where ``DSPARK_HOTFIX`` turns the shim off.

    Unset, blank, ``1`` (the Dockerfile's) and ``0`` (the B arm's) are read here; any other
    value is the package's to read: its :func:`~dspark_hotfix.switch` is the one reading, and
    says a value it does not understand. So the package loads at start only there."""
    word = (os.environ.get("DSPARK_HOTFIX") or "").strip()
    if word not in ("", "1", "0"):
        # The package reads any other value, as on or off.
        shim = package()
        word = "1" if shim is not None and shim.enabled(say) else "0"
    if word == "0":
        return
    if "vllm" in sys.modules:
        activate("sitecustomize")
    elif not any(type(finder).__name__ == "VllmImportWatcher" for finder in sys.meta_path):
        # A watcher of ours already there came with another copy of this file.
        sys.meta_path.insert(0, VllmImportWatcher("sitecustomize"))


class VllmImportWatcher:
    """A meta-path finder that activates the shim when ``vllm`` is imported.

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
    made to wait for the first thread's activation (in the registry's ``activate``)
    instead of running ahead of the hooks. It stays on ``sys.meta_path``:
    removing a finder while the import system iterates that list would skip the
    next finder.

    The construction is deliberate and not new: ddtrace's module watchdog
    (``ModuleWatchdog.find_spec`` in DataDog/dd-trace-py) asks the finders after
    it itself and wraps the loader it gets, its fix for the same import-lock
    deadlock. A finder asked here that asks the meta path again guards its own
    re-entry, as wrapt's importer (``ImportHookFinder``) does: it would ask
    itself again too.
    """

    __slots__ = ("done", "source")

    def __init__(self, source):
        self.source = source
        self.done = False

    def find_spec(self, fullname, path=None, target=None):
        if (
            self.done
            or not (fullname == "vllm" or fullname.startswith("vllm."))
            or self not in sys.meta_path
        ):
            return None
        for finder in sys.meta_path[sys.meta_path.index(self) + 1 :]:
            spec = None
            if hasattr(finder, "find_spec"):
                spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if hasattr(spec.loader, "exec_module"):
            # No importlib.abc base class, by design (see the module's docstring).
            spec.loader = ActivatingLoader(spec.loader, self)  # type: ignore[assignment]
        return spec


class ActivatingLoader:
    """A vLLM module's own loader, activating the registry before the module runs,
    then running the hooks registered while it was found, as wrapt's loader does
    for the modules found once the hooks are there.

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
        activate(self.watcher.source)
        self.watcher.done = True  # not after an interrupt: the retried import activates
        self.loader.exec_module(module)
        # The hooks registered while the module was found, which wrapt's loader would have run.
        if "wrapt.importer" in sys.modules:
            sys.modules["wrapt.importer"].notify_module_loaded(module)

    def __getattr__(self, name):  # create_module and whatever else is asked of the real loader
        if "loader" not in vars(self):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __setattr__(self, name, value):
        setattr(self.loader, name, value)


def chain(sitecustomize_file):
    """Import the ``sitecustomize`` that ours shadows, exactly once.

    Only the first ``sitecustomize`` on ``sys.path`` runs, and Debian and Ubuntu
    Pythons ship their own. Each entry of ``sys.path`` is asked in turn, as the
    import would ask it (``PathFinder``, whose directory listings are cached: no
    import is tried where none is shadowed, the common case). Every entry whose
    ``sitecustomize`` is our very file (a symlinked directory, or a checkout root's
    link to it, too) is taken off ``sys.path`` for the import and put back where it
    was, keeping what the shadowed one changed (images extend ``sys.path`` there);
    errors are reported the way ``site`` reports its own sitecustomize's, start-up
    goes on, and ``chained`` records what happened.
    """
    global chained
    # importlib.machinery's PathFinder, without importing importlib.machinery (1 ms).
    from _frozen_importlib_external import PathFinder

    taken = []  # the entries whose sitecustomize is our file, and their places
    for i, entry in enumerate(sys.path):
        spec = PathFinder.find_spec("sitecustomize", [entry])
        # No origin: no sitecustomize there, or a directory of that name, which a module beats.
        origin = getattr(spec, "origin", None)
        if origin is None:
            continue
        # Ours is the same path (in a zip archive too, where it is no file), or the same file by
        # another path.
        try:
            same = origin == sitecustomize_file or os.path.samefile(origin, sitecustomize_file)
        except OSError:  # either is no file
            same = False
        if not same:
            break
        taken.append((i, entry))
    else:
        return  # none shadowed
    ours = sys.modules.pop("sitecustomize", None)
    for i, _ in reversed(taken):
        del sys.path[i]
    try:
        import sitecustomize  # the one ours shadowed

        # Another copy of ours, further down sys.path, chained the one that ran.
        chained = (
            sitecustomize.chained
            if hasattr(sitecustomize, "VllmImportWatcher")
            else {"file": getattr(sitecustomize, "__file__", None)}
        )
    except Exception as exc:
        chained = {"error": f"{type(exc).__name__}: {exc}"}
        say(f"Error in sitecustomize (chained by dspark_hotfix):\n{chained['error']}")
    finally:
        for i, entry in taken:
            sys.path.insert(i, entry)
        if ours is not None:
            sys.modules["sitecustomize"] = ours


if __name__ == "sitecustomize":  # not where a tool loads this file under another name
    try:
        start()
    except Exception as exc:
        # site would print it and go on; it is said as the shim says everything.
        say(f"dspark_hotfix: not active: {type(exc).__name__}: {exc}")
    finally:
        chain(__file__)
