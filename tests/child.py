"""What a child process does, as real Python: the steps children share, whether the child imports
them (``tests.conftest.call_in_child``'s functions) or is sent their source
(``tests.conftest.program``, for a child that has nothing of the tests on its path). So each step
imports what it uses in its own body.

Standard library only at the top: a child imports vLLM's stand-in, the toys and the shim when it
asks. A child that hangs is ended by ``faulthandler`` after ``HANG_AFTER`` seconds (exit 1, every
thread's traceback on stderr), never by CI's own timeout.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import threading
import time
from typing import Any

HANG_AFTER = 8  # seconds before faulthandler ends a hung child


def hang_guard() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(HANG_AFTER, exit=True)


def use_toys(repo: str | None = None) -> None:
    """The toys as the patch set; with ``repo``, the checkout appended to ``sys.path`` first, so
    that the shim still comes from where the test put it (its start-up directory, a venv, a copy).
    """
    import sys

    if repo is not None:
        sys.path.append(repo)
    import tests.toys

    tests.toys.use()


def import_toy_targets() -> None:
    """Every toy target module, as an engine core imports vLLM's."""
    import vllm.toy_model
    import vllm.toy_planner  # noqa: F401


def print_status() -> None:
    """status() as {patch name: its row}, each row with the process's activated_by and pid."""
    import json

    import dspark_hotfix

    status = dspark_hotfix.status()
    rows = {
        r["name"]: dict(r, activated_by=status["activated_by"], pid=status["pid"])
        for r in status["patches"]
    }
    print(json.dumps(rows))


def watchers() -> int:
    """How many of the start-up hook's VllmImportWatcher are on sys.meta_path (1: it watches for
    vLLM)."""
    import sys

    return sum(type(f).__name__ == "VllmImportWatcher" for f in sys.meta_path)


def load_plugins() -> None:
    """vLLM's general plugins loaded, as each of vLLM's processes loads them."""
    import vllm.plugins

    vllm.plugins.load_general_plugins()


def package_file() -> str | None:
    """Where this process's ``dspark_hotfix`` comes from."""
    import dspark_hotfix

    return dspark_hotfix.__file__


def shim_enabled() -> bool:
    """``dspark_hotfix.enabled()`` in this process."""
    import dspark_hotfix

    return dspark_hotfix.enabled()


def module_names() -> list[str]:
    """Every module imported in this process so far, sorted."""
    import sys

    return sorted(sys.modules)


def path_first(entries: list[str]) -> None:
    import sys

    sys.path[:0] = entries


def sys_path() -> list[str]:
    import sys

    return sys.path


def ran() -> None:
    print("ran")


def wrapt_version() -> str:
    import wrapt

    return wrapt.__version__


def say_on_stderr(text: str) -> None:
    import sys

    sys.stderr.write(text + "\n")


def set_environ(name: str, value: str) -> None:
    import os

    os.environ[name] = value


def fail(kind: str, message: str) -> None:
    """Raise the built-in exception ``kind`` with ``message``."""
    import builtins

    raise getattr(builtins, kind)(message)


def import_modules(names: list[str]) -> None:
    """Each module of ``names``, in order."""
    import importlib

    for name in names:
        importlib.import_module(name)


def import_present(names: list[str]) -> None:
    """Each module of ``names`` this interpreter has, in order: a patch's module may be new in a
    release, or gone."""
    import importlib
    import importlib.util

    for name in names:
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)


def environ(name: str) -> str | None:
    """This process's ``name`` variable."""
    import os

    return os.environ.get(name)


def sitecustomize_file() -> str | None:
    """The file of the sitecustomize that ran at start: the one ours chained, where ours ran (a
    distribution's own, Debian's or Ubuntu's, comes before an image's in site-packages)."""
    import sys

    module = sys.modules.get("sitecustomize")
    if hasattr(module, "VllmImportWatcher"):
        return (module.chained or {}).get("file")  # type: ignore[union-attr]
    return getattr(module, "__file__", None)


def run_cli(*argv: str) -> None:
    """``dspark-hotfix *argv`` in this process: its exit status is the child's."""
    from dspark_hotfix import cli

    raise SystemExit(cli.main(list(argv)))


def toy_calls() -> dict[str, object]:
    """Every toy target called as the toy build's callers would, with what each gave (an exception:
    its type's name): ``tests.activation.children.CORRECTED`` where the toys are applied,
    ``AS_SHIPPED`` where not."""
    import importlib
    from types import SimpleNamespace

    # As sys.modules holds them: a module imported by another thread while the package's import
    # failed here is no attribute of the package imported again (CPython's import, with or without
    # the shim).
    model, planner = (
        importlib.import_module("vllm.toy_model"),
        importlib.import_module("vllm.toy_planner"),
    )

    def call(f: Any, *args: object) -> object:
        try:
            return f(*args)
        except Exception as exc:
            return type(exc).__name__

    return {
        "greet": call(model.Greeter().greet, "ada"),
        "plan": call(planner.plan, SimpleNamespace(compact=False), [1, 2]),
        "compact": call(planner.plan, SimpleNamespace(compact=True), [1, 2]),
    }


def states() -> dict[str, str]:
    """Each patch's state in status()."""
    import dspark_hotfix

    return {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}


def start_and_join(threads: list[threading.Thread]) -> None:
    """Start every thread, then wait for each."""
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def wrap_depths() -> dict[str, int | None]:
    """Per patch whose module is imported, how many wrappers sit on vLLM's plain function in its
    class's (or module's) ``__dict__``: 0 untouched, 1 patched once, -1 no plain function
    underneath, None no such one."""
    import sys
    import types

    from dspark_hotfix.patches import ALL

    def depth(f: Any) -> int | None:
        if f is None:
            return None
        n = 0
        while hasattr(f, "__wrapped__"):
            f, n = f.__wrapped__, n + 1
        return n if type(f) is types.FunctionType else -1

    def target(p: Any) -> Any:
        *owners, name = p.qualname.split(".")
        owner = sys.modules[p.module]
        for part in owners:
            owner = getattr(owner, part)
        return vars(owner).get(name)

    return {p.name: depth(target(p)) for p in ALL if p.module in sys.modules}


def slow_import(
    module: str,
    thread: str,
    pause: float = 0.5,
    release: threading.Event | None = None,
    then: str | None = None,
) -> threading.Event:
    """Slow the import of ``module`` in the thread named ``thread``: that thread holds the module's
    import lock for ``pause`` seconds (or until ``release`` is set), then imports ``then`` (as the
    module's body would) before it runs the module; the Event returned is set when it starts to hold
    it."""
    inside = threading.Event()

    class SlowLoader:
        def __init__(self, loader: Any) -> None:
            self.loader = loader

        def create_module(self, spec: Any) -> Any:
            return self.loader.create_module(spec)

        def exec_module(self, module: Any) -> None:
            module.__loader__ = module.__spec__.loader = self.loader
            inside.set()
            if release:
                release.wait(30)
            else:
                time.sleep(pause)
            if then is not None:
                importlib.import_module(then)
            self.loader.exec_module(module)

    class SlowImport:
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name != module or threading.current_thread().name != thread:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            assert spec is not None
            spec.loader = SlowLoader(spec.loader)  # type: ignore[assignment]
            return spec

    sys.meta_path.insert(0, SlowImport())
    return inside


def interrupt_registry(
    at: int,
    function: str = "_decide",
    main_thread_only: bool = False,
    pause: float = 0.0,
    error: type[BaseException] = KeyboardInterrupt,
) -> threading.Event:
    """The registry's ``function`` (a patch's decision, by default) raises KeyboardInterrupt (or
    ``error``) at its ``at``-th call, once (in the main thread's alone with ``main_thread_only``,
    after ``pause`` seconds): a Ctrl-C landing there. The Event returned is set just before."""
    from dspark_hotfix import registry

    real, calls, inside = getattr(registry, function), [], threading.Event()

    def interrupted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        if len(calls) == at and (
            not main_thread_only or threading.current_thread() is threading.main_thread()
        ):
            inside.set()
            time.sleep(pause)
            raise error
        return real(*args, **kwargs)

    setattr(registry, function, interrupted)
    return inside


def as_started(status: int) -> None:
    """What a child sees of its start (its modules, ``__main__``'s names, its arguments, its stdin),
    a line written at exit by ``atexit``, and ``status`` as its exit status."""
    import __main__

    seen = {
        "modules": sorted(sys.modules),
        "main": sorted(vars(__main__)),
        "argv": sys.argv,
        "stdin": sys.stdin.read(),
    }
    print(json.dumps(seen))
    import atexit

    atexit.register(print, "at exit")
    sys.exit(status)
