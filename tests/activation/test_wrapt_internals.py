"""wrapt's private names and ways the registry relies on (``_after_fork_in_child``, ``_register``,
``_find`` and ``_arm``), held to both ends of the wrapt range the shim supports: 1.17 (this venv's,
what the Dockerfile installs) and the newest 2.x (the packaging venv's, as pip resolves the wheel's
requirement)."""

from __future__ import annotations

import wrapt

from tests.conftest import json_lines, program, run_in_venv


def relied_on() -> dict[str, object]:
    """What the registry reads or replaces in this process's wrapt, and what each is."""
    import inspect
    import threading

    import wrapt
    import wrapt.importer as i

    return {
        "version": wrapt.__version__,
        "hooks": type(getattr(i, "_post_import_hooks", None)).__name__,
        "lock": (
            type(getattr(i, "_post_import_hooks_lock", None)).__name__
            == type(threading.RLock()).__name__
        ),
        "chained": isinstance(getattr(i, "_ImportHookChainedLoader", None), type),
        "finder": isinstance(getattr(i, "ImportHookFinder", None), type),
        "finder_first": (
            "sys.meta_path.insert(0, ImportHookFinder())"
            in inspect.getsource(i.register_post_import_hook)
        ),
        "notify_pops": "_post_import_hooks.pop(" in inspect.getsource(i.notify_module_loaded),
    }


def expected(version: str) -> dict:
    return {
        "version": version,
        "hooks": "dict",
        "lock": True,
        "chained": True,
        "finder": True,
        "finder_first": True,
        "notify_pops": True,
    }


def test_the_wrapt_of_this_venv_has_what_the_registry_relies_on():
    assert relied_on() == expected(wrapt.__version__)


def test_the_newest_wrapt_2_has_what_the_registry_relies_on(venv):
    proc = run_in_venv(venv, program(relied_on))
    assert proc.returncode == 0, proc.stderr
    (found,) = json_lines(proc.stdout)
    assert found["version"].startswith("2.") and found == expected(found["version"])


def test_cpythons_table_of_module_locks_names_a_module_and_its_loader_while_it_is_being_loaded():
    # activate() waits (by importing it) for a module whose lock another thread holds in the
    # table; a forked child skips the modules whose lock was in it at the fork.
    import gc
    import sys
    import threading

    bootstrap = sys.modules["importlib._bootstrap"]
    name, held, release = "tests.a_module_no_one_imports", threading.Event(), threading.Event()

    def hold() -> None:
        with bootstrap._ModuleLockManager(name):
            held.set()
            release.wait(5)

    assert name not in bootstrap._module_locks
    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(5)
    assert name in bootstrap._module_locks
    assert bootstrap._module_locks[name]().owner == thread.ident != threading.get_ident()
    release.set()
    thread.join(5)
    gc.collect()
    assert name not in bootstrap._module_locks
