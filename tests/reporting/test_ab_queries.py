"""docs/OPERATORS.md's A/B comparison, evaluated by Prometheus's own promtool: on the made-up series
of ab_series.json (two pods per arm, one restarted), and on the GPU servers' own scrapes (H200 and
H100) of the silent form's benchmark (docs/evidence/serve-h200-metrics/), where it must give the
acceptance vLLM's benchmark client measured, and where the output-rate query's counter grows by each
run's output tokens.

The answer each arm should get is worked out here from the counters' values, the way Prometheus's
rate() works (promql/functions.go, extrapolatedRate), and the documented queries must give it;
nothing here names a value.
"""

from __future__ import annotations

import itertools
import json
import lzma
import math
import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.reporting.promql import documented_queries, promtool

SERIES = Path(__file__).with_name("ab_series.json")
EVIDENCE = REPO / "docs" / "evidence"
METRICS = EVIDENCE / "serve-h200-metrics"
ACCEPTED, DRAFTED, GENERATED = (
    "vllm:spec_decode_num_accepted_tokens_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:generation_tokens_total",
)
NEAREST = 1e-6  # promtool compares values exactly: both sides are rounded to this


def rate(points: list[tuple[float, float]], window: float, at: float) -> float:
    """rate() of a counter scraped at the ``points`` (time, value), over the ``window`` seconds up
    to ``at`` (no scrape on the window's start): the increase, resets counted, extrapolated to the
    window's ends where the scrapes reach close enough, and never back past the counter's zero."""
    points = [(t, v) for t, v in points if at - window < t <= at]
    (start, first), (end, last) = points[0], points[-1]
    increase = (
        last
        - first
        + sum(before for (_, before), (_, after) in itertools.pairwise(points) if after < before)
    )
    sampled = end - start
    average = sampled / (len(points) - 1)
    to_start, to_end = start - (at - window), at - end
    if increase > 0 and first >= 0:
        to_start = min(to_start, sampled * (first / increase))
    threshold = average * 1.1
    span = sampled + sum(gap if gap < threshold else average / 2 for gap in (to_start, to_end))
    return increase * (span / sampled) / window


def rounded(value: float) -> float:
    """``round(value, NEAREST)`` as PromQL computes it."""
    inverse = 1.0 / NEAREST
    return math.floor(value * inverse + 0.5) / inverse


def series(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


def evaluated(pods: list[dict], step: int, tmp_path: Path) -> dict[str, dict[str, float]]:
    """The documented acceptance and output-rate queries' answer per arm, worked out here, after
    promtool has given the same answer on the same series. Each pod's counters are (time, value)
    points at whole multiples of ``step`` seconds from 0; a step without a scrape is a missing
    sample."""
    acceptance, output = documented_queries("A/B")
    windows = {int(m) * 60 for m in re.findall(r"\[(\d+)m\]", acceptance + output)}
    (window,) = windows  # one window for every rate
    at = max(t for pod in pods for points in pod["counters"].values() for t, _ in points) + step / 2
    assert all(
        t != at - window for pod in pods for points in pod["counters"].values() for t, _ in points
    )
    rates: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pod in pods:
        for name, points in pod["counters"].items():
            rates[pod["labels"]["arm"]][name] += rate(points, window, at)
    expected = {
        "acceptance": {arm: got[ACCEPTED] / got[DRAFTED] for arm, got in rates.items()},
        "output": {arm: got[GENERATED] for arm, got in rates.items()},
    }
    inputs = []
    for pod in pods:
        for name, points in pod["counters"].items():
            at_step = {round(t / step): v for t, v in points}
            values = [f"{at_step[n]:g}" if n in at_step else "_" for n in range(max(at_step) + 1)]
            inputs.append({"series": series(name, pod["labels"]), "values": " ".join(values)})
    tests = {
        "evaluation_interval": f"{step}s",
        "tests": [
            {
                "interval": f"{step}s",
                "input_series": inputs,
                "promql_expr_test": [
                    {
                        "expr": f"round({expr}, {NEAREST:g})",
                        "eval_time": f"{int(at * 1000)}ms",
                        "exp_samples": [
                            {"labels": series("", {"arm": arm}), "value": rounded(value)}
                            for arm, value in sorted(expected[which].items())
                        ],
                    }
                    for which, expr in (("acceptance", acceptance), ("output", output))
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
    return expected


def test_the_documented_ab_queries_give_each_arms_acceptance_and_output_rate(tmp_path):
    data = json.loads(SERIES.read_text())
    interval = data["interval_s"]
    pods = [
        {
            **pod,
            "counters": {
                name: [(n * interval, v) for n, v in enumerate(values)]
                for name, values in pod["counters"].items()
            },
        }
        for pod in data["pods"]
    ]
    assert (
        min(map(len, data["pods"][0]["counters"].values())) - 1
    ) * interval > 5 * 60  # more than the window
    expected = evaluated(pods, interval, tmp_path)
    assert set(expected["acceptance"]) == {"a", "b"}
    # What the comparison is for: B's draft runs on weights it never loaded, A's does not.
    assert expected["acceptance"]["b"] < 0.01 < expected["acceptance"]["a"]


def scraped(path: Path) -> list[tuple[float, dict[str, float], dict[str, str]]]:
    """The scrapes of one serve-h200-metrics file: each one's epoch, the value of each counter named
    here (summed over its series), and its header's words (``arm``, ``before=call`` or
    ``after=<run>``, ``epoch``)."""
    scrapes: list[tuple[float, dict[str, float], dict[str, str]]] = []
    for line in lzma.decompress(path.read_bytes()).decode().splitlines():
        if line.startswith("# scrape "):
            header = dict(word.split("=", 1) for word in line.split()[2:])
            scrapes.append((float(header["epoch"]), defaultdict(float), header))
        elif (name := line.split("{", 1)[0]) in (ACCEPTED, DRAFTED, GENERATED):
            scrapes[-1][1][name] += float(line.rsplit(" ", 1)[1])
    return scrapes


# The silent form's benchmark: the same two server processes scraped before each call and after each
# run (the calls' last carries the benchmark client's runs), and how many scrapes each arm has.
BENCH_SCRAPES = {
    "H200, one warm-up and one timed pair": (("call57", "call58"), 4),
    "H100, one warm-up each": (("call60", "call61"), 3),
    "H100, 39 timed pairs over three calls": (("call62", "call63", "call64"), 46),
}


@pytest.mark.parametrize("calls, scrapes", BENCH_SCRAPES.values(), ids=BENCH_SCRAPES)
def test_the_documented_ab_queries_on_the_gpu_servers_scrapes_give_the_benchmarks_acceptance(
    calls, scrapes, tmp_path
):
    # The A arm is the tolerant build with the plugin, B the tolerant build as shipped.
    record = json.loads((EVIDENCE / "serve-h200.json").read_text())
    figure = record["figures"]["bench"]["call58"]  # (the arms' names)
    arms = {"a": figure["fixed_arm"], "b": figure["reference_arm"]}
    (runs,) = [
        ses["summary"]["bench_runs"] for ses in record["sessions"] if ses["source"] == calls[-1]
    ]
    points = {
        arm: [s for call in calls for s in scraped(METRICS / f"{call}-metrics-{server}.prom.xz")]
        for arm, server in arms.items()
    }
    origin = math.floor(min(t for scrapes in points.values() for t, _, _ in scrapes))
    pods = [
        {
            "labels": {"arm": arm, "pod": f"vllm-dspark-{arm}-0"},
            "counters": {
                name: [(round(t - origin), got[name]) for t, got, _ in scrapes]
                for name in (ACCEPTED, DRAFTED, GENERATED)
            },
        }
        for arm, scrapes in points.items()
    ]
    assert all(len(got) == scrapes for got in points.values()), points
    expected = evaluated(pods, 1, tmp_path)
    # The query says what vLLM's benchmark client measured over the last call's runs: every draft
    # token accepted with the shim, none without.
    for arm, server in arms.items():
        measured = [run["result"] for run in runs if run["arm"] == server]
        assert measured, server
        bench = sum(r["spec_decode_accepted_tokens"] for r in measured) / sum(
            r["spec_decode_draft_tokens"] for r in measured
        )
        assert abs(expected["acceptance"][arm] - bench) < 0.001, (
            arm,
            expected["acceptance"][arm],
            bench,
        )
    assert expected["acceptance"]["a"] == 1.0 and expected["acceptance"]["b"] < 1e-4


def test_the_counter_the_output_rate_query_reads_counts_each_benchmark_runs_output_tokens():
    # Between the scrapes after two runs of one server, vllm:generation_tokens_total grows by the
    # output tokens vLLM's benchmark client counted in the later run: the output-rate query measures
    # the benchmark's load.
    record = json.loads((EVIDENCE / "serve-h200.json").read_text())
    runs = {
        (ses["source"], run["arm"], f"{run['phase']}-{run['rep']}"): run["result"][
            "total_output_tokens"
        ]
        for ses in record["sessions"]
        for run in ses["summary"].get("bench_runs", [])
    }
    compared = []
    for path in sorted(METRICS.glob("*.prom.xz")):
        for (_, then, before), (_, now, after) in itertools.pairwise(scraped(path)):
            if (
                "after" in before and "after" in after
            ):  # (before a call's first run: the probe's requests too)
                compared.append(
                    (
                        now[GENERATED] - then[GENERATED],
                        runs[(path.name.split("-")[0], after["arm"], after["after"])],
                    )
                )
    assert len(compared) >= 80 and all(grew == output for grew, output in compared), compared
