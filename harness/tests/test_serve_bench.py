"""harness/serve_h200.py's benchmark, run here as it runs on the H200: vLLM 0.25.0's own client.

The H200 run drives two real servers. Here its benchmark child (``BENCH_CHILD``,
``vllm.benchmarks.serve.main`` in vLLM 0.25.0's venv) drives two stand-in
OpenAI servers. They stream tokens, count spec-decode metrics the way vLLM names
them, record each prompt, and "compile" a kernel (add a file to the JIT cache)
at the requests they are told to. What the GPU cannot afford to find out is
checked here: the warm-up loop, the compile counts, the A B / B A order, and
the single seed.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from harness import serve_h200
from scripts.venvs import ensure_venv
from tests.conftest import REPO, clean_env

LOAD = {"input": 16, "output": 8, "prompts": 8, "concurrency": 4}


class StandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, cache: Path, compile_at: set[int]) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.cache, self.compile_at = cache, compile_at
        self.prompts: list[str] = []  # sha256 of each request's prompt, in arrival order
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: StandIn

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(
        self,
    ) -> None:  # /metrics: 2 drafts of 5 tokens, 1 accepted and 3 engine steps per request so far
        with self.server.lock:
            n = len(self.server.prompts)
        body = (
            f"vllm:spec_decode_num_drafts_total {2 * n}\nvllm:spec_decode_num_draft_tokens_total"
            f" {10 * n}\n"
            f"vllm:spec_decode_num_accepted_tokens_total {n}\n"
            f'vllm:iteration_tokens_total_count{{engine="0"}} {3 * n}\n'
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:  # /v1/completions, streamed as vLLM streams it
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":  # /tokenize: the client then skips its prompt alignment
            self.send_error(404)
            return
        with self.server.lock:
            index = len(self.server.prompts)
            self.server.prompts.append(
                hashlib.sha256(json.dumps(request["prompt"]).encode()).hexdigest()
            )
            if index in self.server.compile_at:
                (self.server.cache / f"kernel-{self.server.server_port}-{index}").write_text(
                    "compiled"
                )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(request["max_tokens"]):
            self.wfile.write(
                f"data: {json.dumps({'choices': [{'index': 0, 'text': f' t{i}'}]})}\n\n".encode()
            )
        usage = {
            "choices": [],
            "usage": {"prompt_tokens": LOAD["input"], "completion_tokens": request["max_tokens"]},
        }
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


@pytest.mark.real_vllm
def test_the_bench_warms_up_until_nothing_compiles_then_pairs_runs_of_one_seed(tmp_path):
    python, _ = ensure_venv("0.25.0")
    serve = serve_h200
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    cache.mkdir()
    write = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from harness.serve_h200 import"
        f" write_tokenizer; from pathlib import Path; write_tokenizer(Path({str(model)!r}), 2000)"
    )
    subprocess.run([str(python), "-c", write], env=clean_env(), check=True, capture_output=True)
    # baseline compiles twice in its first warm-up; fixed-plugin once in its second timed run
    # (its requests 16 to 23: one warm-up of 8, then timed runs 0 and 1).
    servers = {"baseline": StandIn(cache, {0, 1}), "fixed-plugin": StandIn(cache, {19})}
    for server in servers.values():
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        plan = {
            "arms": [
                {
                    "arm": arm,
                    "port": s.server_port,
                    "log": str(tmp_path / f"{arm}.log"),
                    "pgid": os.getpgid(0),
                }
                for arm, s in servers.items()
            ],
            "reps": 2,
            "max_warmups": 4,
            "load": LOAD,
            "model": str(model),
            "jit_cache": str(cache),
            "client_cpus": sorted(os.sched_getaffinity(0))[-1:],
            "warmups_end": time.time() + 600,
            "first_rep": 2,
            "end": time.time() + 600,
            "metrics_dir": str(tmp_path),
        }
        # first_rep: a second call on the same servers (--attach) numbers its pairs on, here 2 and 3
        for arm in plan["arms"]:
            Path(arm["log"]).write_text("")
        out = tmp_path / "bench.json"
        proc = subprocess.run(
            [str(python), "-c", serve.BENCH_CHILD, json.dumps(plan), str(out)],
            env=clean_env(HF_HUB_OFFLINE="1", DSPARK_HOTFIX="0"),
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        for server in servers.values():
            server.shutdown()
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    runs = json.loads(out.read_text())
    assert [(r["arm"], r["phase"], r["rep"], r["jit_compiles"]) for r in runs] == [
        # until a run compiles nothing
        ("baseline", "warmup", 100, 2),
        ("baseline", "warmup", 101, 0),
        ("fixed-plugin", "warmup", 100, 0),
        ("baseline", "timed", 2, 0),
        ("fixed-plugin", "timed", 2, 0),  # A B
        ("fixed-plugin", "timed", 3, 1),
        ("baseline", "timed", 3, 0),  # B A
    ]
    assert {(r["result"]["completed"], r["result"]["failed"]) for r in runs} == {
        (LOAD["prompts"], 0)
    }
    # One seed: every run of either server sent the same prompts.
    per_run = [
        sorted(s.prompts[i : i + LOAD["prompts"]])
        for s in servers.values()
        for i in range(0, len(s.prompts), LOAD["prompts"])
    ]
    assert len(per_run) == len(runs) and all(prompts == per_run[0] for prompts in per_run)
    assert len(set(per_run[0])) == LOAD["prompts"]  # and they are 8 different prompts
    # Each run's cost: the stand-ins' engine steps counted from /metrics, the CPU of the servers'
    # process group (this one, whose threads serve them) and of the client, the host's shares.
    assert {r["cost"]["engine_steps"] for r in runs} == {3 * LOAD["prompts"]}
    assert all(
        sum(r["cost"]["server_cpu_s"].values()) >= 0 and r["cost"]["server_cpu_s"] for r in runs
    )
    assert all(
        r["cost"]["client_cpu_s"] > 0
        and 0 <= r["cost"]["host_steal"] <= r["cost"]["host_busy"] <= 1
        and r["cost"]["epoch"][0] < r["cost"]["epoch"][1]
        for r in runs
    )
    # every server's whole /metrics, as found at the call's start and after each of its runs
    for arm in servers:
        scrapes = (tmp_path / f"metrics-{arm}.prom").read_text().split("# scrape ")[1:]
        tags = [s.split(" epoch=")[0] for s in scrapes]
        assert tags == [f"arm={arm} before=call"] + [
            f"arm={arm} after={r['phase']}-{r['rep']}" for r in runs if r["arm"] == arm
        ]
        accepted = [
            float(s.split("vllm:spec_decode_num_accepted_tokens_total ")[1].split()[0])
            for s in scrapes
        ]
        assert accepted == [
            LOAD["prompts"] * n for n in range(len(scrapes))
        ]  # one run's requests between scrapes
    ratio = serve.bench_ratio(runs)
    assert (ratio["all"]["pairs"], ratio["clean"]["pairs"]) == (
        2,
        1,
    )  # pair 1 compiled: out of `clean`
    assert ratio["jit_compiles"] == {"fixed-plugin": [0, 1], "baseline": [0, 0]}
    assert ratio["pairs_with_the_same_spec_decode"] == 2 and ratio["failed"] == 0
    assert ratio["engine_steps"] == {
        "fixed-plugin": [3 * LOAD["prompts"]] * 2,
        "baseline": [3 * LOAD["prompts"]] * 2,
    }
    assert (
        set(ratio["clean_spread"]) == {"fixed-plugin", "baseline"}
        and ratio["clean_spread"]["fixed-plugin"] is None
    )
