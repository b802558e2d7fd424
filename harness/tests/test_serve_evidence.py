"""The H200 server evidence: docs/evidence/serve-h200.json holds what harness/serve_h200.py computes
from its runs."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dspark_hotfix import __version__ as VERSION
from dspark_hotfix.patches import ALL
from harness import serve_h200
from harness.common import REPO as ROOT

EVIDENCE = ROOT / "docs" / "evidence" / "serve-h200.json"


@pytest.fixture(scope="module")
def serve():
    return serve_h200


def test_the_committed_evidence_holds_the_figures_its_own_runs_give(serve):
    data = json.loads(EVIDENCE.read_text())
    assert data["figures"] == serve.figures(data["sessions"])
    outcomes = data["figures"]["outcomes"]
    bug = [o for o in outcomes["bug"] if o["tp"] == "tp1"]
    assert bug and all(o["outcome"] == "exited" and o["reported_error"] for o in bug)
    for arm in ("fixed-launcher", "fixed-plugin"):
        ready = [o for o in outcomes[arm] if o["outcome"] == "ready"]
        assert ready and all(o["shim_summaries"] == o["processes"] >= 2 for o in ready), arm
    # tensor parallel 2: API server, engine core and two workers, each with its own shim line
    assert [o["shim_summaries"] for o in outcomes["fixed-plugin"] if o["tp"] == "tp2"] == [4]
    # every baseline server came up, but call 50's: it still captured CUDA graphs when that call's
    # budget ended (it had waited out DeepGEMM's start-up warm-up on a cold cache in call 49)
    assert all(
        o["outcome"] == "ready" and o["shim_summaries"] == 0
        for o in outcomes["baseline"]
        if o["server"] != "call50-01-baseline"
    )
    assert [o["outcome"] for o in outcomes["baseline"] if o["server"] == "call50-01-baseline"] == [
        "timeout"
    ]
    # CUDA graphs (calls 49 on) are compared with each other; their probe gave the eager servers'
    # texts too
    assert data["figures"]["same_completions"] == {"tp1": True, "tp1-cudagraph": True, "tp2": True}
    assert data["figures"]["probes"]["tp1-cudagraph"] == {
        arm: data["figures"]["probes"]["tp1"]["baseline"] for arm in ("baseline", "fixed-plugin")
    }
    # the hybrid KV cache manager off: unmodified 0.25.0 dies with the reported error; with the shim
    # it stops at KV-cache grouping with the cause, every process having logged its line
    servers = {s["arm"]: s for session in data["sessions"] for s in session["summary"]["servers"]}
    assert [o["outcome"] for o in outcomes["baseline-hma-off"]] == ["exited"]
    assert servers["baseline-hma-off"]["reported_error"]
    assert [(o["outcome"], o["shim_summaries"]) for o in outcomes["shim-hma-off"]] == [
        ("exited", 2)
    ]
    stop = servers["shim-hma-off"]["first_error"]
    assert stop.startswith("dspark_hotfix.registry.HotfixError: kv_cache_groups: ")
    assert "hybrid KV cache manager" in stop
    assert not servers["shim-hma-off"]["reported_error"]
    # call 47: one wave per run, pinned; every run made the same batches and every pair decoded
    # alike
    bench = data["figures"]["bench"]["call47"]
    assert bench["all"] == bench["clean"] and bench["clean"]["pairs"] == 10 and bench["failed"] == 0
    low, high = bench["clean"]["ci95"]
    assert (
        low < 1.0 < high
    )  # no cost shown; not resolved to the goal's 0.02 either (the CPU drift below)
    steps = [n for arm in bench["engine_steps"].values() for n in arm]
    assert max(steps) - min(steps) <= 1 and bench["pairs_with_the_same_spec_decode"] == 10
    bench = data["figures"]["bench"]["call43"]
    assert (
        bench["failed"] == 0
        and bench["pairs_with_the_same_spec_decode"] == bench["all"]["pairs"] == 4
    )
    # call 52, CUDA graphs, 128 at 128: one pair, both runs compiling (TileLang, new shapes): no
    # clean pair
    bench = data["figures"]["bench"]["call52"]
    assert bench["all"]["pairs"] == 1 and bench["clean"] == {"pairs": 0} and bench["failed"] == 0
    assert all(n > 0 for arm in bench["jit_compiles"].values() for n in arm)
    assert bench["pairs_with_the_same_spec_decode"] == 1 and bench["completed"] == {
        "fixed-plugin": [128],
        "baseline": [128],
    }
    # the engine core no longer busy for the whole run, as in call 47's eager runs (1.015 to 1.019)
    assert all(
        share[1] < 0.6 for share in (b["engine_core_cpu_share"] for b in bench["bounds"].values())
    )
    assert all(
        b["engine_core_cpu_share"][0] > 1.0
        for b in data["figures"]["bench"]["call47"]["bounds"].values()
    )


def test_the_shim_is_called_at_start_up_only_in_every_process_of_the_served_benchmark():
    data = json.loads(EVIDENCE.read_text())
    counts = data["figures"]["shim_calls"]
    fixed, baseline = counts["call52-02-fixed-plugin"], counts["call52-01-baseline"]
    for figure in (
        fixed,
        baseline,
    ):  # every process vLLM's log names answered at ready and after the benchmark
        assert all(
            answered == figure["logged_processes"] for answered in figure["answered"].values()
        )
        assert len(figure["logged_processes"]) == 2 and len(figure["answered"]) == 2
    # fixed-plugin: the shim in both processes, by vLLM's plugin loader; its 16 calls all at
    # start-up
    assert all(pids == fixed["logged_processes"] for pids in fixed["with_the_shim"].values())
    assert fixed["activated_by"] == ["vllm-plugin"]
    assert fixed["at_ready"] == {
        "attention_kv_cache_spec": 7,
        "swa_kv_cache_spec": 7,
        "kv_cache_groups": 1,
        "remap_dspark_name": 0,
        "kv_view_guard": 1,
        "draft_load_coverage": 0,
    }  # shim 0.5.0's guards, removed since
    (after,) = fixed["added_after_ready"].values()
    assert after == dict.fromkeys(fixed["logged_processes"], 0) and fixed["serving_calls"] == 0
    # baseline: no shim anywhere (the hook reads the shim, it never starts it)
    assert (
        all(pids == [] for pids in baseline["with_the_shim"].values())
        and baseline["at_ready"] == {}
    )
    # what the benchmark between the two readings sent to the fixed server: every run's requests
    # completed
    session = next(s for s in data["sessions"] if s["source"] == "call52")["summary"]
    runs = [r for r in session["bench_runs"] if r["arm"] == "fixed-plugin"]
    assert len(runs) == 2 and all(r["result"]["completed"] == 128 for r in runs)


def test_the_committed_cpu_drift_holds_the_figures_of_its_own_rates(serve):
    # call 48: the same Python work on the two engine cores of the bench, side by side, idle machine
    drift = json.loads(
        (ROOT / "docs" / "evidence" / "serve-h200-logs" / "call48-cpu-drift.json").read_text()
    )
    assert {
        k: drift[k] for k in ("rates", "spread", "side_by_side_spread", "correlation")
    } == serve.drift_figures(drift["rates"])
    assert drift["windows"] == len(drift["rates"][0]) == len(drift["rates"][1]) >= 20


def test_cpu_drift_times_the_same_work_on_two_cores_window_by_window(serve, tmp_path):
    import argparse

    serve.cpu_drift(argparse.Namespace(seconds=2.5, window=0.5, out=str(tmp_path)))
    drift = json.loads((tmp_path / "cpu-drift.json").read_text())
    assert drift["windows"] >= 3 and all(
        len(r) == drift["windows"] and min(r) > 0 for r in drift["rates"]
    )
    assert (
        len(drift["cores"]) == 2
        and drift["side_by_side_spread"] >= 0
        and -1 <= drift["correlation"] <= 1
    )


def test_a_fixed_server_answering_otherwise_than_baseline_is_not_the_same_completions(serve):
    data = json.loads(EVIDENCE.read_text())
    sessions = json.loads(json.dumps(data["sessions"]))
    server = next(
        s
        for session in sessions
        for s in session["summary"]["servers"]
        if s["arm"] == "fixed-plugin"
    )
    counters = server["probe"]["spec_decode_metrics"]
    key = next(k for k in counters if k.startswith("vllm:spec_decode_num_accepted_tokens_total"))
    counters[key] += 1
    assert serve.figures(sessions)["same_completions"] == {
        "tp1": False,
        "tp1-cudagraph": True,
        "tp2": True,
    }


def _run(arm, rep, rate, compiles=0, phase="timed"):
    result = {
        "output_throughput": rate,
        "failed": 0,
        "completed": 64,
        "spec_decode_accepted_tokens": 100 + rep,
    }
    return {"arm": arm, "phase": phase, "rep": rep, "jit_compiles": compiles, "result": result}


def test_the_ratio_pairs_repetitions_and_leaves_pairs_with_a_compile_out_of_the_clean_figure(serve):
    runs = [_run("baseline", 100, 1.0, compiles=3, phase="warmup")]
    for rep, (fixed, base) in enumerate(
        [(99.0, 100.0), (101.0, 100.0), (50.0, 100.0), (100.0, 100.0)]
    ):
        runs += [
            _run("fixed-plugin", rep, fixed, compiles=2 if fixed == 50.0 else 0),
            _run("baseline", rep, base),
        ]
    ratio = serve.bench_ratio(runs)
    assert ratio["fixed_arm"] == "fixed-plugin"
    assert ratio["clean"]["pairs"] == 3 and ratio["clean"]["ratio"] == 1.0
    low, high = ratio["clean"]["ci95"]
    assert low < 1.0 < high and high - low < 0.05
    assert ratio["all"]["pairs"] == 4 and ratio["all"]["ratio"] == pytest.approx(0.875)
    assert ratio["jit_compiles"]["fixed-plugin"] == [0, 0, 2, 0]
    assert ratio["pairs_with_the_same_spec_decode"] == 4
    runs[1]["result"]["spec_decode_accepted_tokens"] += 1
    assert serve.bench_ratio(runs)["pairs_with_the_same_spec_decode"] == 3
    assert serve.bench_ratio([r for r in runs if r["arm"] == "baseline"]) == {"arms": ["baseline"]}


def test_the_silent_forms_pairs_measure_the_plugin_against_the_tolerant_build_and_the_bugs_cost(
    serve,
):
    runs = []
    for rep, (fixed, tolerant) in enumerate([(400.0, 100.0), (300.0, 100.0), (500.0, 100.0)]):
        for arm, rate, accepted in (
            ("tolerant-plugin", fixed, [1.0] * 5),
            ("tolerant", tolerant, [0.0] * 5),
        ):
            run = _run(arm, rep, rate)
            run["result"]["spec_decode_per_position_acceptance_rates"] = accepted
            runs.append(run)
    ratio = serve.bench_ratio(runs)
    assert (ratio["fixed_arm"], ratio["reference_arm"]) == ("tolerant-plugin", "tolerant")
    assert ratio["clean"]["ratio"] == 4.0 and ratio["clean_reference_over_fixed"][
        "ratio"
    ] == pytest.approx(0.2611, 1e-3)
    assert ratio["acceptance_by_position"] == {"tolerant-plugin": [1.0] * 5, "tolerant": [0.0] * 5}
    # against baseline nothing of the kind is added: the committed figures keep their keys
    assert "reference_arm" not in serve.bench_ratio(
        [
            dict(r, arm=r["arm"].replace("tolerant", "baseline"))
            for r in runs
            if r["arm"] == "tolerant"
        ]
        + [r for r in runs if r["arm"] == "tolerant-plugin"]
    )


def test_the_operators_ab_recipe_gives_the_silent_forms_cost_as_measured(matrix):
    # the figure over the most pairs in which no run compiled, and the card it ran on, as
    # docs/OPERATORS.md's A/B recipe says them
    serve = json.loads(EVIDENCE.read_text())
    calls, measured = max(
        (
            (calls, b["clean"])
            for calls, b in serve["figures"]["bench"].items()
            if b.get("reference_arm") == "tolerant"
        ),
        key=lambda each: each[1]["pairs"],
    )
    on = {matrix.cards(serve)[call] for call in calls.split("+")}
    said = re.findall(
        r"saturated, the silent form's A made (\d+\.\d)x B's \(4-layer model, one (\w+)\)",
        (ROOT / "docs" / "OPERATORS.md").read_text(),
    )
    assert (
        measured["pairs"] >= 10 and len(on) == 1 and said == [(f"{measured['ratio']:.1f}", *on)]
    ), (said, measured)


def test_an_arms_spread_is_over_its_runs_that_compiled_nothing(serve):
    runs = [
        _run("fixed-plugin", rep, rate, compiles=9 if rate == 10.0 else 0)
        for rep, rate in enumerate([100.0, 110.0, 10.0, 90.0])
    ] + [_run("baseline", 0, 100.0)]
    spread = serve.bench_ratio(runs)["clean_spread"]
    assert spread == {"fixed-plugin": 0.2, "baseline": None}


def test_the_bench_pins_the_client_and_each_server_to_cores_of_their_own(serve):
    client, servers = serve.cpu_sets(list(range(16)), 2)
    assert client == [14, 15] and servers == [[0, 1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12, 13]]
    client, servers = serve.cpu_sets([2, 3, 5, 8, 9, 11], 2)
    assert client == [9, 11] and servers == [[2, 3], [5, 8]]


def test_each_run_gets_the_gpu_samples_taken_within_its_span(serve):
    import datetime

    def stamp(second: float) -> str:
        return datetime.datetime.fromtimestamp(1_800_000_000 + second).strftime(
            "%Y/%m/%d %H:%M:%S.%f"
        )[:-3]

    samples = "\n".join(
        [
            f"{stamp(0.5)}, 1980, 300.00",
            f"{stamp(1.0)}, 1500, 400.00",
            f"{stamp(2.5)}, 1980, 500.0",
            f"{stamp(9.0)}, [N/A], 1.0",
            "not a sample",
        ]
    )
    runs = [
        {"cost": {"epoch": [1_800_000_000.4, 1_800_000_001.1]}},
        {"cost": {"epoch": [1_800_000_008, 1_800_000_010]}},
        {"result": {}},
    ]
    serve.gpu_during(runs, samples)
    assert runs[0]["cost"]["gpu"] == {
        "samples": 2,
        "sm_mhz_mean": 1740,
        "sm_mhz_min": 1500.0,
        "power_w_mean": 350.0,
    }
    assert "gpu" not in runs[1]["cost"] and runs[2] == {
        "result": {}
    }  # no usable sample in its span; no span


def test_each_arm_runs_the_tree_and_the_activation_it_names(serve):
    e2e = serve._e2e()
    # Each patch alone and every patch but one, for each patch of ALL (none or several of them
    # stops).
    one = [f"{how}-{patch.name}" for patch in ALL for how in ("only", "without")]
    envs = {arm: serve.arm_env(e2e, arm) for arm in (*serve.ARMS, *one)}
    for arm, (env, prefix) in envs.items():
        paths = env["PYTHONPATH"].split(":")
        reverted = arm.startswith(("bug", "fixed")) or arm in one
        assert ("vllm-rev" in env["PYTHONPATH"]) == reverted, arm
        assert ("vllm-tol" in env["PYTHONPATH"]) == arm.startswith("tolerant"), arm
        assert not any(p.endswith("startup") for p in paths), (
            arm
        )  # only the launcher adds it, in the child
        assert (prefix == ["dspark-hotfix", "run", "--"]) == (
            arm in ("bug", "fixed-launcher", "shim-hma-off")
        ), arm
        shim = not arm.startswith("baseline") and arm != "tolerant"
        assert any(p.endswith("shim-site") for p in paths) == shim, arm
        selected = arm.partition("-")[2] if arm.startswith("only-") else f"-{arm.partition('-')[2]}"
        assert env.get("DSPARK_HOTFIX_PATCHES") == (selected if arm in one else None), arm
    assert envs["bug"][0]["DSPARK_HOTFIX"] == "0"
    assert all("DSPARK_HOTFIX" not in env for arm, (env, _) in envs.items() if arm != "bug")
    assert "--disable-hybrid-kv-cache-manager" in serve.serve_command(
        Path("m"), "shim-hma-off", 1, 1, 0.4
    )
    assert "dummy" in serve.serve_command(Path("m"), "baseline", 1, 1, 0.4)
    assert "dummy" not in serve.serve_command(
        Path("m"), "baseline", 1, 1, 0.4, real=True
    )  # the checkpoint's weights
    assert "--disable-hybrid-kv-cache-manager" not in serve.serve_command(
        Path("m"), "baseline", 1, 1, 0.4
    )
    # tensor parallelism all-reduces through NCCL only: no NVLink multicast on a shared host
    assert "--disable-custom-all-reduce" in serve.serve_command(Path("m"), "baseline", 1, 2, 0.4)
    assert "--disable-custom-all-reduce" not in serve.serve_command(
        Path("m"), "baseline", 1, 1, 0.4
    )
    assert all(
        env["VLLM_ALLREDUCE_USE_SYMM_MEM"] == "0" and env["NCCL_NVLS_ENABLE"] == "0"
        for env, _ in envs.values()
    )


def test_a_servers_log_gives_its_processes_the_shim_lines_and_the_error_before_its_shutdown(serve):
    log = "\n".join(
        [
            (
                "(APIServer pid=10) INFO 12-01 06:34:49 [dspark_hotfix] dspark_hotfix 0.3.0 (pid"
                " 10) via sitecustomize: 4 patched, 2 pending (...)"
            ),
            (
                "INFO 12-01 06:35:13 [dspark_hotfix] dspark_hotfix 0.3.0 (pid 11) via"
                " sitecustomize: 5 patched, 1 pending"
            ),
            (
                "(EngineCore pid=11) ERROR 12-01 06:32:00 [core.py:1231] RuntimeError: kv must have"
                " shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
            ),
            (
                "(APIServer pid=10) INFO 12-01 09:34:50 [launcher.py:100] [shutdown] API server:"
                " shutdown triggered"
            ),
            (
                "(APIServer pid=10) ERROR 12-01 09:34:50 [async_llm.py:704]"
                " vllm.v1.engine.exceptions.EngineDeadError: ..."
            ),
        ]
    )
    facts = serve.log_facts(log + "\n(Worker pid=12) INFO starting\n(Worker_TP0 pid=12) INFO ready")
    assert facts["processes"] == ["APIServer 10", "EngineCore 11", "Worker_TP0 12"]
    assert facts["shim_summary_pids"] == [10, 11]
    assert facts["reported_error"] is True
    assert facts["first_error"].startswith("RuntimeError: kv must have shape")


FAKE_VLLM = """#!{python}
import http.server, os, signal, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
warmup = os.environ.get("VLLM_DEEP_GEMM_WARMUP")
print(f"(EngineCore pid={{os.getpid()}}) INFO deep_gemm_warmup={{warmup}} "
      f"cpus={{sorted(os.sched_getaffinity(0))}}", flush=True)
time.sleep(1)
print(
    f"(EngineCore pid={{os.getpid()}}) INFO [kv_cache_utils.py:2146] GPU KV cache size: 100 tokens",
    flush=True,
)
signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def log_message(self, *_):
        pass
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_a_server_is_followed_from_its_log_to_ready_and_stopped_with_its_process_group(
    serve, tmp_path, monkeypatch
):
    # What runs on the GPU machine around `vllm serve`, here with a stand-in `vllm` on the arm's
    # PATH.
    import argparse
    import socket
    import sys

    e2e = serve._e2e()
    monkeypatch.setattr(e2e, "DEVICE_ROOT", tmp_path)  # the module is shared with the other tests
    (tmp_path / "serve-bin").mkdir()
    fake = tmp_path / "serve-bin" / "vllm"
    fake.write_text(FAKE_VLLM.format(python=sys.executable))
    fake.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = argparse.Namespace(model_dir=tmp_path, tp=1, deep_gemm_warmup="relax")
    core = sorted(os.sched_getaffinity(0))[-1:]
    server = serve.Server(e2e, tmp_path, "01-baseline", "baseline", port, args, 0.4, core)
    try:
        assert server.wait_for("GPU KV cache size", 30)  # the next bench server starts here
        assert server.wait_ready(30) == "ready"
    finally:
        server.stop()
    log = (tmp_path / "01-baseline.log").read_text()
    assert "deep_gemm_warmup=relax" in log and server.record["deep_gemm_warmup"] == "relax"
    assert f"cpus={core}" in log and server.record["cpus"] == core  # pinned where the bench puts it
    assert server.record["exit_code"] == 0 and server.record["processes"] == [
        f"EngineCore {server.proc.pid}"
    ]
    assert not server.wait_for("never logged", 5)  # a server that has exited is not waited for


FAKE_SERVER = """#!{python}
import http.server, multiprocessing, os, signal, sys, time

def start():  # what vLLM's plugin loader does in each process it starts, then the model vLLM builds
    import vllm
    # the tests' toy patches (tests/toys.py) as the patch set: no real patch's
    sys.path.append({repo!r})
    import tests.toys
    tests.toys.use()
    from dspark_hotfix import plugin
    plugin.register()
    from vllm.toy_model import Greeter
    return Greeter()

def engine_core(ready):  # a spawned child, as vLLM starts its engine core: two calls at start-up
    model = start()
    import site, sysconfig  # adding a site directory again runs its .pth files again
    site.addsitedir(sysconfig.get_paths()["purelib"])
    for stage in (0, 1):
        model.greet(f"stage {{stage}}")
    print(f"(EngineCore pid={{os.getpid()}}) INFO GPU KV cache size: 100 tokens", flush=True)
    ready.set()
    time.sleep(3600)

def helper():  # imports vLLM, no plugin: a process without the shim
    import vllm
    time.sleep(3600)

if __name__ == "__main__":
    port = int(sys.argv[sys.argv.index("--port") + 1])
    model = start()
    import prometheus_client  # as vLLM's API server does: the shim's gauges join its /metrics
    model.greet("api server")
    print(f"(APIServer pid={{os.getpid()}}) INFO starting", flush=True)
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Event()
    for target, args in ((engine_core, (ready,)), (helper, ())):
        spawn.Process(target=target, args=args, daemon=True).start()
    ready.wait(60)
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/v1/serve":  # a request whose handling calls a wrapped function
                model.greet("request")
            body = prometheus_client.generate_latest() if self.path == "/metrics" else b""
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *_):
            pass
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    http.server.HTTPServer(("127.0.0.1", port), Handler).serve_forever()
"""


def test_every_server_process_reports_the_shims_calls_at_ready_and_after_serving(
    serve, tmp_path, monkeypatch
):
    # The counts hook as the GPU machine runs it: a .pth in the interpreter's own site directory
    # (here a fresh venv's), the `fixed-plugin` arm's PYTHONPATH (the stand-in build in place of the
    # reverted copy), the shim activated by the plugin function alone, in the server and in its
    # spawned children; the hook never activates it (the helper imports vLLM and has no shim).
    import argparse
    import socket
    import subprocess
    import sys
    import sysconfig
    import urllib.request

    from tests.conftest import STANDIN

    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True
    )
    python = tmp_path / "venv" / "bin" / "python"
    site_dir = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    pth = serve.install_counts_hook(site_dir, tmp_path / "counts-hook")
    assert pth.parent == site_dir
    e2e = serve._e2e()
    monkeypatch.setattr(e2e, "DEVICE_ROOT", tmp_path)  # the module is shared with the other tests
    (tmp_path / "shim-site").mkdir()
    (tmp_path / "shim-site" / "dspark_hotfix").symlink_to(ROOT / "dspark_hotfix")
    (tmp_path / "vllm-rev").symlink_to(STANDIN)
    (tmp_path / "deps").symlink_to(sysconfig.get_paths()["purelib"])  # wrapt
    (tmp_path / "serve-bin").mkdir()
    fake = tmp_path / "serve-bin" / "vllm"
    fake.write_text(FAKE_SERVER.format(python=python, repo=str(ROOT)))
    fake.chmod(0o755)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = argparse.Namespace(model_dir=tmp_path, tp=1, deep_gemm_warmup="relax")
    server = serve.Server(e2e, tmp_path, "02-fixed-plugin", "fixed-plugin", port, args, 0.4)
    try:
        assert server.wait_ready(60) == "ready"
        ready = server.shim_calls("ready")
        urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/serve", timeout=10).read()
        # a later call takes the running server over (--keep-servers, then --attach), reads and
        # stops it
        attached = serve.Server.attach(json.loads(json.dumps(server.kept())))
        attached.shim_calls("after-bench")
        attached.stop()
        assert not attached.alive() and server.proc.wait(5) == 0
    finally:
        server.stop()
    server.record = attached.record
    assert (
        "counts-hook" not in server.record["python_path"]
    )  # nothing of the hook's on the arm's path
    figure = serve.shim_calls(server.record)
    api, core = (name.split()[1] for name in server.record["processes"])
    assert figure["logged_processes"] == sorted([api, core]) and len(ready) == 3  # and the helper
    assert figure["with_the_shim"] == {
        "ready": sorted([api, core]),
        "after-bench": sorted([api, core]),
    }
    assert figure["activated_by"] == ["vllm-plugin"]
    assert {p["hooks"] for p in ready.values()} == {
        1
    }  # one watcher in each process, the engine core's too
    assert figure["at_ready"]["toy_greeting"] == 3 and sum(figure["at_ready"].values()) == 3
    assert (
        figure["added_after_ready"] == {"after-bench": {api: 1, core: 0}}
        and figure["serving_calls"] == 1
    )
    # /metrics as an SRE scrapes it: the API server's own gauges (one API server), at each reading
    metrics = server.record["metrics"]
    assert set(metrics) == {"ready", "after-bench"}
    for lines in metrics.values():
        assert f'dspark_hotfix_info{{activated_by="vllm-plugin",version="{VERSION}"}} 1.0' in lines
        assert (
            'dspark_hotfix_patch_state{patch="toy_greeting",state="patched",stop="false"} 1.0'
            in lines
        )
        assert 'dspark_hotfix_patch_needed{patch="toy_greeting",stop="false"} 1.0' in lines
    figured = serve.figures([{"source": "call-1", "summary": {"servers": [server.record]}}])[
        "metrics"
    ]
    assert figured == {"call-1-02-fixed-plugin": {"arm": "fixed-plugin", **metrics}}
