"""The children of test_processes.py, as real Python: each function (but the pools' workers) is one
child process's whole run, started in a fresh interpreter by ``tests.conftest.call_in_child``.

Standard library (and ``tests.child``) only at the top: a child imports the stand-in build, the toys
and the shim when it asks. The pools' workers are functions of this module too, so that a spawn or
forkserver worker finds them by importing it.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import sys
import threading
from typing import Any

from tests.child import start_and_join, states, use_toys, wrap_depths

THREADS = 16


def sixteen_threads(targets: list[str], shim: bool) -> None:
    """Half the threads import a target first (the first import of vLLM activates, in any of them),
    then every thread every target (in the other order for the odd ones), then a quarter call
    install() as vLLM's plugin loader would, racing the import watcher. Prints the errors, the wrap
    depths and, with the shim, each patch's state."""
    use_toys()
    sys.setswitchinterval(1e-6)
    barrier = threading.Barrier(THREADS)
    errors = []

    def worker(k: int) -> None:
        barrier.wait()
        try:
            if k % 2 == 0:
                importlib.import_module(targets[k // 2 % len(targets)])
            for name in targets if k % 2 == 0 else reversed(targets):
                importlib.import_module(name)
            if k % 4 == 1:
                import dspark_hotfix

                dspark_hotfix.install(source="vllm-plugin")
        except BaseException as exc:
            errors.append(repr(exc))

    start_and_join([threading.Thread(target=worker, args=(k,)) for k in range(THREADS)])
    print(json.dumps(errors))
    print(json.dumps(wrap_depths()))
    if shim:
        print(json.dumps(states()))


def greet_in_a_pool_worker(_: int) -> list[Any]:
    """A pool's worker: it imports every target, and gives its pid, wrap depths and states, and a
    greeting through the toy build (the toy correction's answer where it is patched). A spawn or
    forkserver worker does not run the parent's code: it makes the toys the patch set itself, before
    vLLM is imported."""
    use_toys()
    import vllm.toy_model
    import vllm.toy_planner  # noqa: F401
    from vllm.toy_model import Greeter

    return [os.getpid(), wrap_depths(), states(), Greeter().greet("ada")]


def pool_of_workers(method: str, parent_imports: bool) -> None:
    """Six tasks on a pool of three ``method`` workers, the parent having imported every target
    first or not; prints the parent's pid and each task's answer."""
    use_toys()
    if parent_imports:
        import vllm.toy_model
        import vllm.toy_planner  # noqa: F401
    with multiprocessing.get_context(method).Pool(3) as pool:
        print(json.dumps([os.getpid(), pool.map(greet_in_a_pool_worker, range(6), chunksize=1)]))


def states_in_a_tensor_parallel_worker(_: int) -> tuple[int, list[str]]:
    """A tensor-parallel worker: it imports the greeting's module, never the planner's (as vLLM's
    workers never import its KV-cache grouping). The toys are its own patch set, as in a pool's
    worker."""
    use_toys()
    import vllm.toy_model  # noqa: F401

    return os.getpid(), list(states().values())


def spawned_workers() -> None:
    """Eight spawn workers, in a process that never imported vLLM; prints each one's pid and
    states."""
    use_toys()
    with multiprocessing.get_context("spawn").Pool(8) as pool:
        print(json.dumps(pool.map(states_in_a_tensor_parallel_worker, range(8), chunksize=1)))


def reloads(targets: list[str]) -> None:
    """Each target module reloaded in turn, in one process: after each reload, the wrap depths and
    status()."""
    use_toys()
    import vllm.toy_model
    import vllm.toy_planner  # noqa: F401

    import dspark_hotfix

    for target in targets:
        importlib.reload(sys.modules[target])
        print(json.dumps(wrap_depths()))
        print(json.dumps(dspark_hotfix.status()))
