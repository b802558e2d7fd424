"""A Ray driver: one actor reports how its process was patched.

Run by the node's Python with one JSON argument: ``address`` (None starts a
local cluster, bounded in CPUs and memory), ``runtime_env``, ``load_plugins``
(call vLLM's plugin loader in the actor, as vLLM's Ray workers do) and
``temp_dir``. Prints one JSON line: the driver's pid and environment, and the
actor's report.
"""

import json
import os
import sys

import ray


class Reporter:
    def report(self, load_plugins):
        # The start-up hook's watcher, put there at interpreter start by sitecustomize.
        early = any(type(f).__name__ == "VllmImportWatcher" for f in sys.meta_path)
        out = {
            "pid": os.getpid(),
            "early": early,
            "env": {k: os.environ.get(k) for k in ("PYTHONPATH", "DSPARK_HOTFIX")},
        }
        if load_plugins:
            from vllm.plugins import load_general_plugins

            load_general_plugins()
        import warmup

        out["warmup_error"] = warmup.run()["error"]
        try:
            import dspark_hotfix
        except ImportError as exc:
            out["status"], out["import_error"] = None, str(exc)
        else:
            out["status"] = dspark_hotfix.status()
        return out


def main(config):
    local = config["address"] is None
    ray.init(
        address=config["address"],
        num_cpus=1 if local else None,
        object_store_memory=100 * 1024 * 1024 if local else None,
        include_dashboard=False if local else None,
        _temp_dir=config["temp_dir"] if local else None,
        runtime_env=config.get("runtime_env"),
        _node_ip_address="127.0.0.1" if local else None,
        log_to_driver=False,
    )
    try:
        actor = ray.remote(num_cpus=0)(Reporter).remote()
        report = ray.get(actor.report.remote(config["load_plugins"]), timeout=120)
    finally:
        ray.shutdown()
    print(
        json.dumps(
            {
                "driver_pid": os.getpid(),
                "driver_pythonpath": os.environ.get("PYTHONPATH"),
                "actor": report,
            }
        )
    )


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
