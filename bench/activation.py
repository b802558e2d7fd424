"""The shim's own work in a process that imports vLLM, timed from inside; run by ``bench/run.py``.

Run without the shim on the path: a worker's modules (``IMPORTS``) are imported first, then
the shim is activated by hand, which imports wrapt and the registry and runs
the post-import hooks (the probes) of the targets already imported. Added to
that is what the shim costs every import: the two meta-path finders (the
shim's watcher from interpreter start, wrapt's once activated) per module, and
the directory on PYTHONPATH, searched first for each top-level name. The sum is
the shim's share of the import without the run-to-run noise of a 10 s import.
Prints one JSON line.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import time
import timeit
from pathlib import Path

# What a tensor-parallel worker of DeepSeek-V4 has imported once it loads the model: the worker,
# vLLM's V2 model runner (DSpark forces it) and the target module. (A process that imports the
# target module alone lacks the KV-cache grouping's modules, which the activation then imports: see
# run.py.)
IMPORTS = (
    "vllm.v1.worker.gpu_worker",
    "vllm.v1.worker.gpu.model_runner",
    "vllm.models.deepseek_v4.attention",
)


def per_call_ns(find_spec: object, name: str) -> float:
    timer = timeit.Timer(f"find_spec({name!r}, None)", globals={"find_spec": find_spec})
    return min(timer.repeat(20, 2000)) / 2000 * 1e9


def main() -> None:
    for name in IMPORTS:
        importlib.import_module(name)
    modules = len(sys.modules)
    top_level = sum("." not in name for name in sys.modules)
    repo = str(Path(__file__).resolve().parent.parent)
    sys.path.insert(0, repo)
    before = set(sys.modules)
    start = time.perf_counter()
    from dspark_hotfix import registry

    registry.activate("bench")
    activation = time.perf_counter() - start
    vllm_imported = sorted(m for m in set(sys.modules) - before if m.startswith("vllm."))
    spec = importlib.util.spec_from_file_location(
        "startup", Path(repo) / "dspark_hotfix/startup/sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    startup = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(
        startup
    )  # its classes only: start() and chain() run where it is sitecustomize
    watcher = startup.VllmImportWatcher("bench")
    watcher.done = True  # as after activation, for the rest of the import
    wrapt_finder = next(f for f in sys.meta_path if type(f).__module__.startswith("wrapt"))
    path_entry = sys.path_hooks[-1](repo)  # the FileFinder that PYTHONPATH's directory gets
    finders = {
        "watcher": per_call_ns(watcher.find_spec, "vllm.some.module"),
        "wrapt": per_call_ns(wrapt_finder.find_spec, "vllm.some.module"),
    }
    states = {row["name"]: row["state"] for row in registry.status()["patches"]}
    print(
        json.dumps(
            {
                "modules": modules,
                "activation_s": activation,
                "find_spec_ns": finders,
                "states": states,
                "vllm_imported": vllm_imported,
                "top_level": top_level,
                "path_entry_ns": per_call_ns(path_entry.find_spec, "some_module"),
            }
        )
    )


if __name__ == "__main__":
    main()
