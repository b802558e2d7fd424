"""The shim's state on ``/metrics``: prometheus_client from PyPI, the stand-in build, real subprocesses.

vLLM serves prometheus_client's default registry with one API server and a
``MultiProcessCollector`` over ``PROMETHEUS_MULTIPROC_DIR`` with several; both
are read here the way vLLM reads them (tests/real_vllm/test_metrics.py does it
through vLLM 0.25.0's own ``get_prometheus_registry``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from dspark_hotfix import __version__
from tests.cases import PATCHES, REMAP, STOP, SWA
from tests.conftest import (
    FIXED,
    IMPORT_ALL,
    REPO,
    STANDIN,
    child,
    edited_standin,
    json_lines,
    last_json,
    run_python,
    warning_lines,
)
from tests.real_vllm.venvs import cache_dir

# Prints the dspark_hotfix samples of a registry (the default one unless given) as one JSON line.
SCRAPE = """
import json as _json
from prometheus_client import REGISTRY as _REGISTRY, generate_latest as _generate_latest
from prometheus_client.parser import text_string_to_metric_families as _parse

def scrape(registry=_REGISTRY):
    print(_json.dumps([[s.name, s.labels, s.value] for f in _parse(_generate_latest(registry).decode())
                       for s in f.samples if s.name.startswith('dspark_hotfix_')]))
"""


class Scrape:
    """One scrape's dspark_hotfix samples, by metric, keyed by their labels (``pid`` kept apart)."""

    def __init__(self, samples: list) -> None:
        self.info = {(s["activated_by"], s["version"], s.get("pid")): v for n, s, v in samples
                     if n == "dspark_hotfix_info"}
        self.state = {(s["patch"], s["state"], s.get("pid")): v for n, s, v in samples
                      if n == "dspark_hotfix_patch_state"}
        self.needed = {(s["patch"], s.get("pid")): v for n, s, v in samples if n == "dspark_hotfix_patch_needed"}

    def current(self, pid: str | None = None) -> dict[str, str]:
        """Each patch's state whose series is 1."""
        return {patch: state for (patch, state, p), v in self.state.items() if p == pid and v == 1}


def scrapes(code: str, **env: str) -> list[Scrape]:
    return [Scrape(line) for line in json_lines(run_python(SCRAPE + code, env=env).stdout)]  # type: ignore[arg-type]


def test_each_patch_shows_its_state_and_follows_later_decisions():
    before, after = scrapes("import vllm, prometheus_client\nscrape()\n" + IMPORT_ALL + "scrape()\n")
    assert before.info == {("sitecustomize", __version__, None): 1}
    assert before.current() == dict.fromkeys(PATCHES, "pending")
    assert before.needed == {}  # not decided yet: no verdict to show
    assert after.current() == dict.fromkeys(PATCHES, "patched")
    assert {patch: v for (patch, state, _), v in after.state.items() if state == "pending"} == dict.fromkeys(PATCHES, 0)
    assert after.needed == {(patch, None): 1 for patch in PATCHES}


def test_prometheus_client_imported_before_vllm_shows_the_states_at_activation():
    (scrape,) = scrapes("import prometheus_client, vllm.v1.core.kv_cache_utils\nscrape()\n")
    assert scrape.info == {("sitecustomize", __version__, None): 1}
    assert scrape.current()[STOP.name] == "patched"
    assert scrape.current()[REMAP.name] == "pending"


def test_excluded_and_not_needed_patches_show_their_verdicts(tmp_path):
    code = "import vllm, prometheus_client\n" + IMPORT_ALL + "scrape()\n"
    (excluded,) = scrapes(code, DSPARK_HOTFIX_PATCHES=f"-{REMAP.name}")
    assert excluded.current()[REMAP.name] == "excluded"
    assert excluded.needed[(REMAP.name, None)] == 1  # what an alert on needed-but-not-installed reads
    fixed = edited_standin(tmp_path / "fixed", FIXED)  # vLLM with the upstream fix: nothing is needed
    proc = run_python(SCRAPE + code, path=(REPO, fixed))
    (not_needed,) = (Scrape(line) for line in json_lines(proc.stdout))  # type: ignore[arg-type]
    assert not_needed.current() == dict.fromkeys(PATCHES, "not_needed")
    assert not_needed.needed == {(patch, None): 0 for patch in PATCHES}


def test_nothing_is_shown_where_the_shim_is_off():
    # doctor judges every patch in its own process even then: still nothing to show.
    proc = run_python(SCRAPE + "import vllm, prometheus_client, sys\n" + IMPORT_ALL + "scrape()\n"
                      "from dspark_hotfix import doctor\nprint(_json.dumps(doctor.report('doctor')['patches'][0]))\n"
                      "scrape()\n", env={"DSPARK_HOTFIX": "0"})
    before, row, after = json_lines(proc.stdout)
    assert row["state"] == "disabled"  # type: ignore[index]
    assert before == after == []


def test_the_shim_never_imports_prometheus_client():
    proc = run_python("import sys, vllm\n" + IMPORT_ALL + "import dspark_hotfix\n"
                      "print(dspark_hotfix.status()['patches'][0]['state'], 'prometheus_client' in sys.modules)\n")
    assert proc.stdout.split() == ["patched", "False"]


def test_a_failure_in_the_metrics_path_warns_once_and_vllm_runs_patched(tmp_path):
    # A prometheus_client whose gauges cannot be made (as where the multiprocess directory is gone).
    fake = tmp_path / "prometheus_client"
    fake.mkdir()
    (fake / "__init__.py").write_text("class Gauge:\n    def __init__(self, *a, **k):\n"
                                      "        raise OSError('no space left on device')\n"
                                      "class REGISTRY:\n    register = staticmethod(lambda collector: None)\n")
    proc = run_python("import vllm, prometheus_client\n" + IMPORT_ALL + "import dspark_hotfix, json\n"
                      "print(json.dumps([r['state'] for r in dspark_hotfix.status()['patches']]))\n",
                      path=(tmp_path, REPO, STANDIN), env={"DSPARK_HOTFIX_STRICT": "1"})
    assert json_lines(proc.stdout) == [["patched"] * len(PATCHES)]
    assert warning_lines(proc.stderr) == [
        "cannot show the shim's state on /metrics (OSError: no space left on device); the patches are not affected"]


def test_multiprocess_collection_shows_each_process_with_its_pid(tmp_path):
    # As vLLM with --api-server-count above 1: the directory is set before prometheus_client is imported,
    # the engine core (here: every target imported) writes its files, an API server collects them all.
    directory = str(tmp_path / "prometheus")
    os.mkdir(directory)
    engine = run_python("import os, vllm, prometheus_client\n" + IMPORT_ALL + "print(os.getpid())\n",
                        env={"PROMETHEUS_MULTIPROC_DIR": directory})
    api = run_python(SCRAPE + "import os, vllm, prometheus_client\nfrom prometheus_client import CollectorRegistry, "
                     "multiprocess\nregistry = CollectorRegistry()\nmultiprocess.MultiProcessCollector(registry)\n"
                     "print([os.getpid()])\nscrape(registry)\nmultiprocess.mark_process_dead(" + engine.stdout.strip() +
                     ")\nscrape(registry)\n", env={"PROMETHEUS_MULTIPROC_DIR": directory})
    (api_pid,), both, after = json_lines(api.stdout)  # type: ignore[misc]
    engine_pid, api_pid = engine.stdout.strip(), str(api_pid)
    both, after = Scrape(both), Scrape(after)  # type: ignore[arg-type]
    assert both.info == {("sitecustomize", __version__, engine_pid): 1, ("sitecustomize", __version__, api_pid): 1}
    assert both.current(engine_pid) == dict.fromkeys(PATCHES, "patched")
    assert both.current(api_pid) == dict.fromkeys(PATCHES, "pending")
    assert {pid for (_, pid) in both.needed} == {engine_pid}
    # vLLM marks a process dead at shutdown; its series go with it ("liveall"), the others stay.
    assert {pid for (_, _, pid) in after.state} == {api_pid}



def test_the_documented_alerts_find_the_pods_they_name(tmp_path):
    """docs/OPERATORS.md's PromQL, evaluated by Prometheus's own promtool on what six pods' processes export."""
    def pod(name: str, *processes: tuple[str, dict[str, str], tuple]) -> list:
        directory = tmp_path / name
        directory.mkdir()
        for code, env, path in processes:
            run_python("import vllm, prometheus_client\n" + code, path=path,
                       env={"PROMETHEUS_MULTIPROC_DIR": str(directory), **env})
        collect = ("from prometheus_client import CollectorRegistry, multiprocess\nr = CollectorRegistry()\n"
                   "multiprocess.MultiProcessCollector(r, path=" + repr(str(directory)) + ")\nscrape(r)\n")
        return json_lines(run_python(SCRAPE + collect, path=()).stdout)[0]  # type: ignore[return-value]

    fixed = edited_standin(tmp_path / "fixed-standin", FIXED)
    swa = "vllm/v1/attention/backends/mla/sparse_swa.py"  # fixed, and a signature the shim does not know: failed
    signature = ("def get_kv_cache_spec(self, vllm_config)", "def get_kv_cache_spec(self, vllm_config, layer=0)")
    broken = edited_standin(tmp_path / "broken-standin", {**FIXED, swa: [*FIXED[swa], signature]})
    engine, api, off = (IMPORT_ALL, {}, (REPO, STANDIN)), ("", {}, (REPO, STANDIN)), {"DSPARK_HOTFIX": "0"}
    pods = {
        "patched": pod("patched", engine, api),
        "excluded": pod("excluded", (IMPORT_ALL, {"DSPARK_HOTFIX_PATCHES": f"-{REMAP.name}"}, (REPO, STANDIN))),
        "fixed": pod("fixed", (IMPORT_ALL, {}, (REPO, fixed)), ("", {}, (REPO, fixed))),
        # an API server's process alone: the grouping judged, the model's patches never
        "fixed-api-server": pod("fixed-api-server", ("import vllm.v1.core.kv_cache_utils\n", {}, (REPO, fixed))),
        "fixed-failed": pod("fixed-failed", (IMPORT_ALL, {}, (REPO, broken))),
        "off": pod("off", (IMPORT_ALL, off, (REPO, STANDIN))),
    }
    assert pods["off"] == []
    (excluded_pid,) = {labels["pid"] for _, labels, _ in pods["excluded"]}
    (failed_pid,) = {labels["pid"] for _, labels, _ in pods["fixed-failed"]}

    def series(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

    where = {"namespace": "serving"}
    inputs = [{"series": series(name, {**labels, **where, "pod": p}), "values": f"{value:g}x10"}
              for p, samples in pods.items() for name, labels, value in samples]
    inputs += [{"series": series("vllm:num_requests_running", {**where, "pod": p}), "values": "0x10"} for p in pods]
    needed_not_installed, could_drop, without_shim = documented_queries()
    excluded = {**where, "pod": "excluded", "patch": REMAP.name, "pid": excluded_pid}
    failed = {**where, "pod": "fixed-failed", "patch": SWA.name, "pid": failed_pid}
    expected = [
        (needed_not_installed, [(series("dspark_hotfix_patch_needed", excluded), 1),
                                (series("dspark_hotfix_patch_needed", failed), -1)]),
        (could_drop, [(series("", {**where, "pod": "fixed"}), 0)]),
        (without_shim, [(series("", {**where, "pod": "off"}), 1)]),
    ]
    tests = {"evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": labels, "value": v} for labels, v in found]}
        for expr, found in expected]}]}
    (tmp_path / "tests.yml").write_text(json.dumps(tests))  # JSON is YAML
    proc = subprocess.run([promtool(), "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def documented_queries() -> list[str]:
    """The queries of docs/OPERATORS.md's ```promql block, each without its comment lines."""
    block = re.search(r"^```promql\n(.*?)^```", (REPO / "docs" / "OPERATORS.md").read_text(), re.M | re.S)
    assert block is not None
    queries: list[list[str]] = [[]]
    for line in block.group(1).splitlines():
        if line.startswith("#") or not line.strip():
            if queries[-1]:
                queries.append([])
        else:
            queries[-1].append(line)
    return ["\n".join(q) for q in queries if q]


def promtool() -> str:
    """Prometheus's promtool: on PATH, or from Debian's ``prometheus`` package, unpacked once into the cache
    (never installed: no service of it starts)."""
    found = shutil.which("promtool")
    root = cache_dir() / "promtool"
    binary = root / "usr" / "bin" / "promtool"
    if found or binary.exists():
        return found or str(binary)
    download = root.with_name("promtool-deb")
    download.mkdir(parents=True, exist_ok=True)
    for argv in (["apt-get", "download", "-q", "prometheus"], ["apt-get", "update", "-qq"],
                 ["apt-get", "download", "-q", "prometheus"]):
        proc = subprocess.run(argv, cwd=download, capture_output=True, text=True, timeout=600)
        if proc.returncode == 0 and argv[1] == "download":
            break
    debs = sorted(download.glob("prometheus_*.deb"))
    assert debs, f"promtool is not on PATH and Debian's prometheus package could not be downloaded:\n{proc.stderr}"
    subprocess.run(["dpkg-deb", "-x", str(debs[-1]), str(root)], check=True, timeout=120)
    return str(binary)


# A child forked while another thread of the parent publishes: the state lock held at the fork.
FORKED = """
import json, os, threading, prometheus_client, vllm
import vllm.v1.core.kv_cache_utils, vllm.v1.attention.backends.mla.sparse_swa
import dspark_hotfix.state as state
held, done = threading.Event(), threading.Event()
def publishing():  # what a thread mid-publish looks like to a fork
    with state.lock:
        held.set()
        done.wait()
threading.Thread(target=publishing, daemon=True).start()
held.wait()
pid = os.fork()
if pid == 0:
    import vllm.models.deepseek_v4.attention  # decisions in the child (and the remap's module): they publish
    from prometheus_client import generate_latest
    info = [l for l in generate_latest().decode().splitlines() if l.startswith("dspark_hotfix_info{")]
    print(json.dumps(info), flush=True)
    os._exit(0)
done.set()
os.waitpid(pid, 0)
"""


def test_a_child_forked_while_the_parent_publishes_decides_and_shows_the_shim_active():
    proc = child(FORKED, path=(REPO, STANDIN))
    assert proc.returncode == 0, proc.stderr
    (info,) = json_lines(proc.stdout)
    assert info == [f'dspark_hotfix_info{{activated_by="sitecustomize",version="{__version__}"}} 1.0'], info


def test_a_forked_child_with_a_multiprocess_directory_shows_the_shim_active(tmp_path):
    # prometheus_client starts a forked child's values afresh: its first decision sets info again.
    code = ("import json, os, prometheus_client, vllm\nimport vllm.v1.core.kv_cache_utils\n"
            "pid = os.fork()\nif pid == 0:\n    import vllm.models.deepseek_v4.attention\n    os._exit(0)\n"
            "os.waitpid(pid, 0)\nprint(pid)\n")
    proc = run_python(code, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    child_pid = int(proc.stdout.split()[-1])
    read = ("import json, sys\nfrom prometheus_client import CollectorRegistry, generate_latest, multiprocess\n"
            "r = CollectorRegistry(); multiprocess.MultiProcessCollector(r)\n"
            "lines = generate_latest(r).decode().splitlines()\n"
            "print(json.dumps([l for l in lines if l.startswith('dspark_hotfix_info')]))")
    info = last_json(run_python(read, path=(), env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}).stdout)
    assert any(f'pid="{child_pid}"' in line and line.endswith(" 1.0") for line in info), info  # type: ignore[union-attr]


# Another thread is part-way through importing prometheus_client when vLLM's import activates the shim.
HALF_IMPORTED = """
import importlib.util, json, sys, threading, time
started = threading.Event()
class Slow:  # holds the other thread inside prometheus_client's import until the shim activates
    def find_spec(self, name, path=None, target=None):
        if name != "prometheus_client.metrics":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):  # (a loader's exec_module runs without the global import lock)
            started.set()
            for _ in range(100):
                if getattr(sys.modules.get("dspark_hotfix.registry"), "_active", None) is not None:
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            run(module)
        spec.loader.exec_module = exec_module
        return spec
sys.meta_path.insert(0, Slow())
importing = threading.Thread(target=__import__, args=("prometheus_client",))
importing.start()
started.wait(5)
import vllm
""" + IMPORT_ALL + """
importing.join()
from prometheus_client import generate_latest
print(json.dumps([l for l in generate_latest().decode().splitlines() if l.startswith("dspark_hotfix_info")]))
"""


def test_the_gauges_appear_when_another_thread_was_importing_prometheus_client_at_activation():
    proc = run_python(HALF_IMPORTED)
    assert last_json(proc.stdout) == [
        f'dspark_hotfix_info{{activated_by="sitecustomize",version="{__version__}"}} 1.0'], proc.stderr
    assert warning_lines(proc.stderr) == []
