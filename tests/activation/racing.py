"""The children of test_concurrency.py, as real Python: each function is one child process's whole
run, started in a fresh interpreter by ``tests.conftest.call_in_child``.

Standard library (and ``tests.child``) only at the top: a child imports the stand-in build, the toys
and the shim itself, in the order its race needs.
"""

from __future__ import annotations

import importlib
import json
import os
import threading
import time
from typing import Any

from tests.child import (
    hang_guard,
    import_toy_targets,
    print_status,
    slow_import,
    use_toys,
    wrap_depths,
)

# 1. A hang at start-up: activation ran in VllmImportWatcher.find_spec, under the global import
#    lock. Each child starts with the repository first on its path: the start-up hook is active.


def wrapt_imported_in_another_thread() -> None:
    """Another library imports wrapt in a second thread while vLLM's first module is imported in the
    main one: activation imports wrapt too."""
    hang_guard()
    use_toys()
    inside = slow_import("wrapt", "second")
    barrier = threading.Barrier(2)

    def second() -> None:
        barrier.wait()
        import wrapt  # noqa: F401

    worker = threading.Thread(target=second, name="second")
    worker.start()
    barrier.wait()
    inside.wait(5)  # the second thread holds wrapt's module lock
    import vllm.toy_model  # noqa: F401  (the first import of vLLM: activation)

    worker.join()
    import_toy_targets()
    print_status()


def status_asked_in_another_thread() -> None:
    """A health check asks status() (which imports the registry) while the model loads."""
    hang_guard()
    use_toys()
    inside = slow_import("dspark_hotfix.registry", "second")
    import dspark_hotfix

    barrier = threading.Barrier(2)
    seen = []

    def second() -> None:
        barrier.wait()
        seen.append(dspark_hotfix.status()["schema"])

    worker = threading.Thread(target=second, name="second")
    worker.start()
    barrier.wait()
    inside.wait(5)  # the second thread holds the registry's module lock
    import vllm.toy_model  # noqa: F401

    worker.join()
    assert seen == [2], seen
    import_toy_targets()
    print_status()


# 2. A half-done activation: a second caller went on before the hooks existed. Each child starts
#    with the stand-in alone on its path (no start-up hook), imports vLLM, then the shim (the
#    repository goes last).


def plugin_registered_in_another_thread() -> None:
    """The main thread activates (slowed down in its import of wrapt); meanwhile vLLM's plugin
    loader calls register() in another thread, then imports a target's module and uses its target at
    once."""
    import vllm.toy_planner  # noqa: F401

    use_toys()
    inside = slow_import("wrapt", "MainThread")
    import dspark_hotfix
    import dspark_hotfix.plugin

    seen: dict[str, Any] = {}

    def plugin_loader() -> None:
        inside.wait(5)  # the main thread's activation is under way
        dspark_hotfix.plugin.register()
        from vllm import toy_model

        seen["wrapped"] = hasattr(toy_model.Greeter.greet, "__wrapped__")
        seen["states"] = {r["name"]: r["state"] for r in dspark_hotfix.status()["patches"]}

    worker = threading.Thread(target=plugin_loader)
    worker.start()
    dspark_hotfix.install()
    worker.join()
    print(json.dumps(seen))


def target_imported_while_the_package_executes() -> None:
    """The hooks are registered before vLLM is imported; the main thread executes vLLM's package
    (slowed down), a second thread imports a target's module meanwhile, and the package's body
    imports a module of its own. wrapt's finder would import the target's parent (the package) with
    the import lock held."""
    hang_guard()
    use_toys()
    import dspark_hotfix

    dspark_hotfix.install()
    inside = slow_import("vllm", "MainThread", then="colorsys")  # any module not imported yet
    worker = threading.Thread(
        target=lambda: inside.wait(5) and importlib.import_module("vllm.toy_model")
    )
    worker.start()
    import vllm  # noqa: F401

    worker.join()
    import_toy_targets()
    print_status()


def fork_during_activation(decisions_before_fork: int, stall: float) -> None:
    """A thread activates (a decision slowed down); the main thread forks once
    ``decisions_before_fork`` patches are decided (every target module is imported). The child calls
    status() and writes its activation path, rows and wrap depths to the parent, which prints them.
    """
    import vllm.toy_planner

    use_toys()
    import vllm.toy_model  # noqa: F401

    import dspark_hotfix
    from dspark_hotfix import registry

    parent, inside, calls = os.getpid(), threading.Event(), []
    decide = registry._decide

    def slow(activation: Any, record: Any, module: Any) -> Any:
        calls.append(record)
        if os.getpid() == parent and len(calls) == decisions_before_fork + 1:
            inside.set()
            time.sleep(stall)
        return decide(activation, record, module)

    registry._decide = slow
    activating = threading.Thread(target=dspark_hotfix.install, kwargs={"source": "api"})
    activating.start()
    inside.wait(5)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            s = dspark_hotfix.status()
            rows = {p["name"]: [p["state"], p["detail"]] for p in s["patches"]}
            os.write(w, json.dumps([s["activated_by"], rows, wrap_depths()]).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        report = f.read()
    os.waitpid(pid, 0)
    activating.join()
    print(report)


def plugin_registered_while_a_module_is_half_imported(module: str) -> None:
    """vLLM's plugin loader calls register() while another thread is still executing a target's
    module."""
    import vllm  # noqa: F401  (vLLM first, then its plugin loader: no sitecustomize)

    use_toys()
    inside = slow_import(module, "second", pause=1.0)
    import dspark_hotfix
    import dspark_hotfix.plugin

    worker = threading.Thread(target=lambda: __import__(module), name="second")
    worker.start()
    inside.wait(5)  # the other thread holds the module's import lock, its body not yet run
    dspark_hotfix.plugin.register()
    worker.join()
    import_toy_targets()
    print_status()


# 3. A fork while another thread holds wrapt's registration lock (the repository first on the path).


def fork_while_wrapts_lock_is_held() -> None:
    """wrapt's import finder takes its registration lock on every import, and wrapt does not renew
    it after a fork: the child's first import must not hang."""
    hang_guard()
    use_toys()
    import_toy_targets()
    import wrapt.importer

    held = threading.Event()

    def hold() -> None:
        with wrapt.importer._post_import_hooks_lock:
            held.set()
            time.sleep(2)

    threading.Thread(target=hold).start()
    held.wait(5)
    pid = os.fork()
    if pid == 0:
        import xml.dom.minidom  # noqa: F401  (any module not imported yet)

        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child", os.waitstatus_to_exitcode(status))
