"""The shim's state on ``/metrics``: prometheus_client from PyPI, on the toy patches.

vLLM serves prometheus_client's default registry with one API server and a
``MultiProcessCollector`` over ``PROMETHEUS_MULTIPROC_DIR`` with several; both
are read here the way vLLM reads them (tests/real_vllm/test_metrics.py does it
through vLLM 0.25.0's own ``get_prometheus_registry``). The default registry is
read in this process (the ``toys`` fixture takes the gauges away afterwards);
what prometheus_client decides as it is imported (the multiprocess directory, who
imports it, a fork) in fresh interpreters.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from functools import partial

import pytest

import dspark_hotfix
from dspark_hotfix import __version__, doctor, metrics, registry
from tests.child import import_modules, use_toys
from tests.conftest import (
    REPO,
    STANDIN,
    child,
    edited_standin,
    in_fresh_process,
    json_lines,
    last_json,
    program,
    run_python,
    warning_lines,
)
from tests.reporting.inprocess import AS_SHIPPED, activate, build
from tests.reporting.promql import documented_queries, promtool
from tests.toys import FAREWELL, GREETING, NAMES, PLANNER, fixed, module_file

TARGETS = [
    GREETING.module,
    PLANNER.module,
]  # every toy target module, as an engine core imports vLLM's


def samples(registry=None) -> list:
    """The dspark_hotfix samples of a registry of this process (the default one unless given)."""
    from prometheus_client import REGISTRY, generate_latest

    return exposed(generate_latest(registry or REGISTRY).decode())


def exposed(text: str) -> list:
    """The dspark_hotfix samples of a scrape's text."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        [s.name, s.labels, s.value]
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("dspark_hotfix_")
    ]


class Scrape:
    """One scrape's dspark_hotfix samples, by metric, keyed by their labels (``pid`` kept apart)."""

    def __init__(self, samples: list) -> None:
        self.info = {
            (s["activated_by"], s["version"], s.get("pid")): v
            for n, s, v in samples
            if n == "dspark_hotfix_info"
        }
        self.state = {
            (s["patch"], s["state"], s.get("pid")): v
            for n, s, v in samples
            if n == "dspark_hotfix_patch_state"
        }
        self.needed = {
            (s["patch"], s.get("pid")): v
            for n, s, v in samples
            if n == "dspark_hotfix_patch_needed"
        }

    def current(self, pid: str | None = None) -> dict[str, str]:
        """Each patch's state whose series is 1."""
        return {patch: state for (patch, state, p), v in self.state.items() if p == pid and v == 1}


def scrape() -> Scrape:
    return Scrape(samples())


# The default registry, in this process.


def test_each_patch_shows_its_state_and_follows_later_decisions(toys):
    dspark_hotfix.install("sitecustomize")
    import prometheus_client  # noqa: F401  (vLLM imports it)

    before = scrape()
    activate()
    after = scrape()
    assert before.info == {("sitecustomize", __version__, None): 1}
    assert before.current() == dict.fromkeys(NAMES, "pending")
    assert before.needed == {}  # not decided yet: no verdict to show
    assert after.current() == AS_SHIPPED
    assert {
        patch: v for (patch, state, _), v in after.state.items() if state == "pending"
    } == dict.fromkeys(NAMES, 0)
    assert after.needed == {
        (GREETING.name, None): 1,
        (FAREWELL.name, None): 0,
        (PLANNER.name, None): 1,
    }


def test_prometheus_client_imported_before_vllm_shows_the_states_at_activation(toys):
    import prometheus_client  # noqa: F401

    activate(modules=(PLANNER.module,))
    current = scrape()
    assert current.info == {("sitecustomize", __version__, None): 1}
    assert current.current()[PLANNER.name] == "patched"
    assert current.current()[GREETING.name] == "pending"


def test_an_excluded_patch_shows_excluded_and_needed(toys, monkeypatch):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name}")
    activate()
    excluded = scrape()
    assert excluded.current()[GREETING.name] == "excluded"
    assert (
        excluded.needed[(GREETING.name, None)] == 1
    )  # what an alert on needed-but-not-installed reads


def test_on_a_fixed_vllm_every_patch_shows_not_needed(toys, monkeypatch, tmp_path):
    build(tmp_path, monkeypatch, fixed())  # vLLM with the upstream fix: nothing is needed
    activate()
    not_needed = scrape()
    assert not_needed.current() == dict.fromkeys(NAMES, "not_needed")
    assert not_needed.needed == {(patch, None): 0 for patch in NAMES}


def test_nothing_is_shown_where_the_shim_is_off(toys, monkeypatch):
    # doctor judges every patch in its own process even then: still nothing to show.
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    import prometheus_client  # noqa: F401

    activate()
    before = samples()
    row = doctor.report("doctor")["patches"][0]
    assert row["state"] == "disabled"
    assert before == samples() == []


def test_a_failure_in_the_metrics_path_registers_nothing_warns_once_and_vllm_runs_patched(
    toys, monkeypatch
):
    # A prometheus_client whose gauges cannot be made (as where the multiprocess directory is gone,
    # or after a reload of the metrics module: a duplicate series). Each later decision and scrape
    # publishes again: none may register one more collector (they would double at every scrape), nor
    # say it again.
    fake = types.ModuleType("prometheus_client")

    class Gauge:
        def __init__(self, *args, **kwargs):
            raise OSError("no space left on device")

    registered: list[object] = []
    fake.Gauge = Gauge  # type: ignore[attr-defined]
    fake.REGISTRY = types.SimpleNamespace(register=registered.append)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "prometheus_client", fake)
    monkeypatch.setenv("DSPARK_HOTFIX_STRICT", "1")
    activate()
    records = registry._active.records.values()  # type: ignore[union-attr]
    for _ in range(12):
        metrics.publish("sitecustomize", records)
    assert registered == []
    assert toys.states() == AS_SHIPPED
    assert toys.lines("WARNING") == [
        "cannot show the shim's state on /metrics (OSError: no space left on device); the patches"
        " are not affected"
    ]


# What prometheus_client decides as it is imported, in fresh processes
# (tests.conftest.in_fresh_process).


def test_the_shim_never_imports_prometheus_client():
    proc = in_fresh_process(
        program(use_toys, partial(import_modules, ["vllm", *TARGETS]), state_and_prometheus)
    )
    assert proc.returncode == 0 and last_json(proc.stdout) == ["patched", False], proc.stderr


def state_and_prometheus() -> list[object]:
    """The first patch's state, and whether prometheus_client is imported."""
    import sys

    import dspark_hotfix

    return [dspark_hotfix.status()["patches"][0]["state"], "prometheus_client" in sys.modules]


def test_multiprocess_collection_shows_each_process_with_its_pid(tmp_path):
    # As vLLM with --api-server-count above 1: the directory is set before prometheus_client is
    # imported, the engine core (here: every target imported) writes its files, an API server
    # collects them all.
    directory = str(tmp_path / "prometheus")
    os.mkdir(directory)
    engine = run_python(
        program(use_toys, partial(import_modules, ["vllm", "prometheus_client", *TARGETS]), pid),
        env={"PROMETHEUS_MULTIPROC_DIR": directory},
    )
    engine_pid = last_json(engine.stdout)
    api = run_python(
        program(
            use_toys,
            partial(import_modules, ["vllm", "prometheus_client"]),
            pid,
            partial(scrapes_around_a_death, engine_pid),
        ),
        env={"PROMETHEUS_MULTIPROC_DIR": directory},
    )
    api_pid, (both, after) = json_lines(api.stdout)
    engine_pid, api_pid = str(engine_pid), str(api_pid)
    both, after = Scrape(exposed(both)), Scrape(exposed(after))
    assert both.info == {
        ("sitecustomize", __version__, engine_pid): 1,
        ("sitecustomize", __version__, api_pid): 1,
    }
    assert both.current(engine_pid) == AS_SHIPPED
    assert both.current(api_pid) == dict.fromkeys(NAMES, "pending")
    assert {pid for (_, pid) in both.needed} == {engine_pid}
    # vLLM marks a process dead at shutdown; its series go with it ("liveall"), the others stay.
    assert {pid for (_, _, pid) in after.state} == {api_pid}


def pid() -> int:
    import os

    return os.getpid()


def scrapes_around_a_death(dead: int) -> list[str]:
    """What an API server's MultiProcessCollector shows, before and after vLLM marks ``dead``
    dead."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    before = generate_latest(registry).decode()
    multiprocess.mark_process_dead(dead)
    return [before, generate_latest(registry).decode()]


def collected(directories: list[str]) -> list[str]:
    """What one MultiProcessCollector over each of ``directories`` shows."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    scrapes = []
    for directory in directories:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=directory)
        scrapes.append(generate_latest(registry).decode())
    return scrapes


def test_the_documented_alerts_find_the_pods_they_name(tmp_path):
    """docs/OPERATORS.md's PromQL, evaluated by Prometheus's own promtool on what eight pods'
    processes export: the pod without the shim pages, the B arm of an A/B, off as asked, does not;
    the pod whose only patch in place is the stop guards, and the pod where the stop is in place
    beside corrections does not."""

    def pod(name: str, *processes: tuple[list[str], dict[str, str], tuple]) -> str:
        directory = tmp_path / name
        directory.mkdir()
        for modules, env, path in processes:
            run_python(
                program(use_toys, partial(import_modules, ["vllm", "prometheus_client", *modules])),
                path=(REPO, *path),
                env={"PROMETHEUS_MULTIPROC_DIR": str(directory), **env},
            )
        return str(directory)

    fixed_copy = edited_standin(tmp_path / "fixed-standin", fixed())
    guarding_copy = edited_standin(
        tmp_path / "guarding-standin", fixed((GREETING, FAREWELL))
    )  # the stop's bug only
    # fixed, and a signature the shim does not know: failed
    signature = ("def greet(self, name)", "def greet(self, name, title='')")
    edits = fixed()
    edits[module_file(GREETING)] = [*edits[module_file(GREETING)], signature]
    broken = edited_standin(tmp_path / "broken-standin", edits)
    engine: tuple[list[str], dict[str, str], tuple] = (TARGETS, {}, (STANDIN,))
    api: tuple[list[str], dict[str, str], tuple] = ([], {}, (STANDIN,))
    off = {"DSPARK_HOTFIX": "0"}
    directories = {
        "patched": pod("patched", engine, api),
        "excluded": pod(
            "excluded", (TARGETS, {"DSPARK_HOTFIX_PATCHES": f"-{GREETING.name}"}, (STANDIN,))
        ),
        "fixed": pod("fixed", (TARGETS, {}, (fixed_copy,)), ([], {}, (fixed_copy,))),
        "guarding": pod("guarding", (TARGETS, {}, (guarding_copy,)), ([], {}, (guarding_copy,))),
        # an API server's process alone: the planner judged, the model's patches never
        "fixed-api-server": pod("fixed-api-server", ([PLANNER.module], {}, (fixed_copy,))),
        "fixed-failed": pod("fixed-failed", (TARGETS, {}, (broken,))),
        "off": pod("off", (TARGETS, off, (STANDIN,))),
        "b-arm": pod(
            "b-arm", (TARGETS, off, (STANDIN,))
        ),  # the B arm of an A/B: its pod labelled arm="b"
    }
    arms = {
        "patched": {"arm": "a"},
        "b-arm": {"arm": "b"},
    }  # the pod label, kept on the series by the scrape
    # One collector per pod, all read by one interpreter without the shim.
    scrapes = last_json(
        run_python(program(partial(collected, list(directories.values()))), path=()).stdout
    )
    pods = {name: exposed(text) for name, text in zip(directories, scrapes, strict=True)}
    assert pods["off"] == pods["b-arm"] == []
    (excluded_pid,) = {labels["pid"] for _, labels, _ in pods["excluded"]}
    (failed_pid,) = {labels["pid"] for _, labels, _ in pods["fixed-failed"]}

    def series(name: str, labels: dict[str, str]) -> str:
        return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"

    where = {"namespace": "serving"}
    inputs = [
        {
            "series": series(name, {**labels, **where, "pod": p, **arms.get(p, {})}),
            "values": f"{value:g}x10",
        }
        for p, samples in pods.items()
        for name, labels, value in samples
    ]
    inputs += [
        {
            "series": series("vllm:num_requests_running", {**where, "pod": p, **arms.get(p, {})}),
            "values": "0x10",
        }
        for p in pods
    ]
    needed_not_installed, could_drop, guarding, without_shim = documented_queries("On /metrics")
    excluded = {
        **where,
        "pod": "excluded",
        "patch": GREETING.name,
        "stop": "false",
        "pid": excluded_pid,
    }
    failed = {
        **where,
        "pod": "fixed-failed",
        "patch": GREETING.name,
        "stop": "false",
        "pid": failed_pid,
    }
    expected = [
        (
            needed_not_installed,
            [
                (series("dspark_hotfix_patch_needed", excluded), 1),
                (series("dspark_hotfix_patch_needed", failed), -1),
            ],
        ),
        (could_drop, [(series("", {**where, "pod": "fixed"}), 0)]),
        (guarding, [(series("", {**where, "pod": "guarding"}), 1)]),
        (without_shim, [(series("", {**where, "pod": "off"}), 1)]),
    ]
    tests = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": expr,
                        "eval_time": "5m",
                        "exp_samples": [{"labels": labels, "value": v} for labels, v in found],
                    }
                    for expr, found in expected
                ],
            }
        ],
    }
    (tmp_path / "tests.yml").write_text(json.dumps(tests))  # JSON is YAML
    proc = subprocess.run(
        [promtool(), "test", "rules", str(tmp_path / "tests.yml")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("ci", "outcome"), [("", pytest.skip.Exception), ("true", pytest.fail.Exception)]
)
def test_without_promtool_or_apt_get_the_alert_test_skips_with_the_reason_and_fails_in_ci(
    monkeypatch, tmp_path, ci, outcome
):
    monkeypatch.setenv("DSPARK_HOTFIX_CACHE", str(tmp_path))
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(
        shutil, "which", lambda name, *args, **kw: None
    )  # a host that is not Debian
    with pytest.raises(outcome, match="promtool is not on PATH, and this host has no apt-get"):
        promtool()
    assert list(tmp_path.iterdir()) == []


def forked_while_publishing() -> None:
    """A child forked while another thread of this process publishes (the state lock held at the
    fork) decides the model's patches and prints its ``dspark_hotfix_info`` lines."""
    import json
    import os
    import threading

    import prometheus_client
    import vllm.toy_planner

    import dspark_hotfix.state as state

    held, done = threading.Event(), threading.Event()

    def publishing() -> None:  # what a thread mid-publish looks like to a fork
        with state.lock:
            held.set()
            done.wait()

    threading.Thread(target=publishing, daemon=True).start()
    held.wait()
    pid = os.fork()
    if pid == 0:
        import vllm.toy_model  # noqa: F401  (decisions in the child: they publish)

        text = prometheus_client.generate_latest().decode()
        print(
            json.dumps(
                [line for line in text.splitlines() if line.startswith("dspark_hotfix_info{")]
            ),
            flush=True,
        )
        os._exit(0)
    done.set()
    os.waitpid(pid, 0)


def test_a_child_forked_while_the_parent_publishes_decides_and_shows_the_shim_active():
    proc = child(
        program(use_toys, partial(import_modules, ["vllm"]), forked_while_publishing),
        path=(REPO, STANDIN),
    )
    assert proc.returncode == 0, proc.stderr
    (info,) = json_lines(proc.stdout)
    assert info == [
        f'dspark_hotfix_info{{activated_by="sitecustomize",version="{__version__}"}} 1.0'
    ], info


def fork_deciding() -> int:
    """A forked child that decides the model's patches; its pid."""
    import os

    import vllm.toy_planner

    pid = os.fork()
    if pid == 0:
        import vllm.toy_model  # noqa: F401

        os._exit(0)
    os.waitpid(pid, 0)
    return pid


def multiprocess_info() -> list[str]:
    """The ``dspark_hotfix_info`` lines a MultiProcessCollector shows."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return [
        line
        for line in generate_latest(registry).decode().splitlines()
        if line.startswith("dspark_hotfix_info")
    ]


def test_a_forked_child_with_a_multiprocess_directory_shows_the_shim_active(tmp_path):
    # prometheus_client starts a forked child's values afresh: its first decision sets info again.
    code = program(use_toys, partial(import_modules, ["vllm", "prometheus_client"]), fork_deciding)
    proc = run_python(code, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    child_pid = last_json(proc.stdout)
    info = last_json(
        run_python(
            program(multiprocess_info), path=(), env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
        ).stdout
    )
    assert any(f'pid="{child_pid}"' in line and line.endswith(" 1.0") for line in info), info


def replaced_then_refreshed() -> list:
    """This process's pid, the greeting's row in status() at the end, and what a
    MultiProcessCollector shows: once every toy is judged, then after another tool's method
    replaces the wrapper, as soon as the series say so (up to 10 s) with no decision or activation
    in between; the refresher's period cut to 0.1 s."""
    import os
    import time

    import vllm.toy_model

    import dspark_hotfix
    from dspark_hotfix import metrics

    metrics.EVERY = 0.1  # the refresher reads it again after each sleep (the first is 5 s)
    where = [os.environ["PROMETHEUS_MULTIPROC_DIR"]]
    judged = collected(where)[0]
    vllm.toy_model.Greeter.greet = (
        vllm.toy_model.Greeter.greet.__wrapped__
    )  # another tool's own method
    deadline = time.monotonic() + 10
    while 'state="failed"} 1.0' not in collected(where)[0] and time.monotonic() < deadline:
        time.sleep(0.1)
    return [os.getpid(), dspark_hotfix.status()["patches"][0]["state"], judged, collected(where)[0]]


def test_with_a_multiprocess_dir_a_replaced_function_shows_failed_without_another_decision(
    tmp_path,
):
    # With PROMETHEUS_MULTIPROC_DIR no scrape runs in the process that writes the series: its
    # refresher publishes them again, every metrics.EVERY seconds (5 s).
    code = program(
        use_toys,
        partial(import_modules, ["vllm", "prometheus_client", *TARGETS]),
        replaced_then_refreshed,
        helpers=(collected,),
    )
    proc = run_python(code, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    pid, status, *scrapes = last_json(proc.stdout)
    assert status == "failed", proc.stderr
    assert [Scrape(exposed(text)).current(str(pid))[GREETING.name] for text in scrapes] == [
        "patched",
        "failed",
    ], proc.stderr
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        "with `PROMETHEUS_MULTIPROC_DIR` (`--api-server-count` above 1), each process writes its"
        " series again every 5 s" in readme
    )
    assert metrics.EVERY == 5.0


def forks_beside_the_refresher() -> list[int]:
    """Forks 100 children while the refresher publishes without pause (period 0.001 s). Each child
    sets a multiprocess gauge of its own, which takes prometheus_client's one value lock; the pids
    of those not done in 5 s (killed)."""
    import os
    import signal
    import sys
    import time

    import prometheus_client

    from dspark_hotfix import metrics

    metrics.EVERY = 0.001
    sys.setswitchinterval(1e-6)  # the GIL changes hands inside a publish too, not only at its sleep
    time.sleep(5.5)  # the refresher's first sleep is 5 s
    hung = []
    for _ in range(100):
        pid = os.fork()
        if pid == 0:
            prometheus_client.Gauge("child", "a child's own gauge", registry=None).set(1)
            os._exit(0)
        deadline = time.monotonic() + 5
        while os.waitpid(pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
            time.sleep(0.005)
        if time.monotonic() >= deadline:
            hung.append(pid)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return hung


def test_a_fork_beside_the_refresher_never_hangs_the_childs_metrics(tmp_path):
    code = program(
        use_toys,
        partial(import_modules, ["vllm", "prometheus_client", *TARGETS]),
        forks_beside_the_refresher,
    )
    proc = run_python(code, env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)})
    assert last_json(proc.stdout) == [], proc.stderr


def prometheus_client_half_imported() -> list[str]:
    """vLLM imported (and the toys' targets) while another thread is part-way through importing
    prometheus_client; then the ``dspark_hotfix_info`` lines of its default registry."""
    import importlib.util
    import sys
    import threading
    import time
    from typing import Any

    started = threading.Event()

    class Slow:  # holds the other thread inside prometheus_client's import until the shim activates
        def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
            if name != "prometheus_client.metrics":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            assert spec is not None and spec.loader is not None
            run = spec.loader.exec_module

            def exec_module(
                module: Any,
            ) -> None:  # (a loader's exec_module runs without the global import lock)
                started.set()
                for _ in range(100):
                    if (
                        getattr(sys.modules.get("dspark_hotfix.registry"), "_active", None)
                        is not None
                    ):
                        break
                    time.sleep(0.05)
                time.sleep(0.3)
                run(module)

            spec.loader.exec_module = exec_module  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Slow())
    importing = threading.Thread(target=__import__, args=("prometheus_client",))
    importing.start()
    started.wait(5)
    import vllm.toy_model
    import vllm.toy_planner  # noqa: F401

    importing.join()
    from prometheus_client import generate_latest

    return [
        line
        for line in generate_latest().decode().splitlines()
        if line.startswith("dspark_hotfix_info")
    ]


def test_the_gauges_appear_when_another_thread_was_importing_prometheus_client_at_activation():
    proc = in_fresh_process(program(use_toys, prometheus_client_half_imported))
    assert proc.returncode == 0, proc.stderr
    assert last_json(proc.stdout) == [
        f'dspark_hotfix_info{{activated_by="sitecustomize",version="{__version__}"}} 1.0'
    ], proc.stderr
    assert warning_lines(proc.stderr) == []
