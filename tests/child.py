"""What a child process does, as real Python: the helpers of the children that are functions
(``tests.conftest.call_in_child``), and the source of ``tests.conftest.STATUS`` and ``WRAP_DEPTH``, the
lines that code-string children end with.

Standard library only at the top: a child imports vLLM's stand-in, the toys and the shim when it asks.
A child that hangs is ended by ``faulthandler`` after ``HANG_AFTER`` seconds (exit 1, every thread's
traceback on stderr), never by CI's own timeout.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import threading
import time
import types
from typing import Any

HANG_AFTER = 8  # seconds before faulthandler ends a hung child


def hang_guard() -> None:
    import faulthandler

    faulthandler.dump_traceback_later(HANG_AFTER, exit=True)


def use_toys() -> None:
    """The toys as the patch set (``tests.toys.USE``)."""
    import tests.toys

    tests.toys.use()


def import_toy_targets() -> None:
    """Every toy target module, as an engine core imports vLLM's (``tests.toys.IMPORT``)."""
    import vllm.toy_model
    import vllm.toy_planner  # noqa: F401


def print_status() -> None:
    """status() as {patch name: its row}, each row with the process's activated_by and pid (``STATUS``)."""
    import dspark_hotfix

    status = dspark_hotfix.status()
    rows = {r["name"]: dict(r, activated_by=status["activated_by"], pid=status["pid"]) for r in status["patches"]}
    print(json.dumps(rows))


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
    """Per patch whose module is imported, the wrappers on vLLM's plain function (``WRAP_DEPTH``)."""
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


def slow_import(module: str, thread: str, pause: float = 0.5, release: threading.Event | None = None,
                ) -> threading.Event:
    """Slow the import of ``module`` in the thread named ``thread``: that thread holds the module's import
    lock for ``pause`` seconds (or until ``release`` is set); the Event returned is set when it starts to."""
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


def interrupt_registration(at: int, main_thread_only: bool = False, pause: float = 0.0,
                           error: type[BaseException] = KeyboardInterrupt) -> threading.Event:
    """The child's wrapt raises KeyboardInterrupt (or ``error``) at its ``at``-th hook registration, once (in
    the main thread's alone with ``main_thread_only``, after ``pause`` seconds): a Ctrl-C landing there. The
    Event returned is set just before."""
    import wrapt

    register, calls, inside = wrapt.register_post_import_hook, [], threading.Event()

    def interrupted(hook: Any, name: str) -> Any:
        calls.append(name)
        if len(calls) == at and (not main_thread_only or threading.current_thread() is threading.main_thread()):
            inside.set()
            time.sleep(pause)
            raise error
        return register(hook, name)

    wrapt.register_post_import_hook = interrupted
    return inside


def as_started(status: int) -> None:
    """What a child sees of its start (its modules, ``__main__``'s names, its arguments, its stdin), a line
    written at exit by ``atexit``, and ``status`` as its exit status."""
    import __main__

    seen = {"modules": sorted(sys.modules), "main": sorted(vars(__main__)), "argv": sys.argv, "stdin": sys.stdin.read()}
    print(json.dumps(seen))
    import atexit

    atexit.register(print, "at exit")
    sys.exit(status)
