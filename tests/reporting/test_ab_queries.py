"""docs/OPERATORS.md's A/B comparison, evaluated by Prometheus's own promtool on the series of ab_series.json.

ab_series.json holds what each pod's /metrics said at each scrape: its labels, and every scrape's value of
vLLM's counters. The answer each arm should get is worked out here from those values, the way Prometheus's
rate() works (promql/functions.go, extrapolatedRate), and the documented queries must give it. Scrapes of real
servers replace the file as they are, in the same shape; nothing here names a value of it.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import subprocess
from collections import defaultdict
from pathlib import Path

from tests.reporting.promql import documented_queries, promtool

SERIES = Path(__file__).with_name("ab_series.json")
ACCEPTED, DRAFTED, GENERATED = ("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total",
                                "vllm:generation_tokens_total")
NEAREST = 1e-6  # promtool compares values exactly: both sides are rounded to this


def rate(values: list[float], interval: float, window: float, at: float) -> float:
    """rate() of a counter scraped every ``interval`` seconds from time 0, over the ``window`` seconds up to ``at``
    (no scrape on the window's start): the increase, resets counted, extrapolated to the window's ends where the
    scrapes reach close enough, and never back past the counter's zero."""
    points = [(n * interval, v) for n, v in enumerate(values) if at - window < n * interval <= at]
    (start, first), (end, last) = points[0], points[-1]
    increase = last - first + sum(before for (_, before), (_, after) in itertools.pairwise(points) if after < before)
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


def test_the_documented_ab_queries_give_each_arms_acceptance_and_output_rate(tmp_path):
    data = json.loads(SERIES.read_text())
    interval, pods = data["interval_s"], data["pods"]
    acceptance, output = documented_queries("A/B")
    windows = {int(m) * 60 for m in re.findall(r"\[(\d+)m\]", acceptance + output)}
    (window,) = windows  # one window for every rate
    scrapes = min(len(values) for pod in pods for values in pod["counters"].values())
    at = (scrapes - 1) * interval + interval / 2  # after the last scrape, so that no scrape is on the window's start
    assert at > window, "the series cover less than the queries' window"
    rates: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for pod in pods:
        for name, values in pod["counters"].items():
            rates[pod["labels"]["arm"]][name] += rate(values, interval, window, at)
    assert set(rates) == {"a", "b"}
    expected = {
        acceptance: {arm: got[ACCEPTED] / got[DRAFTED] for arm, got in rates.items()},
        output: {arm: got[GENERATED] for arm, got in rates.items()},
    }
    inputs = [{"series": series(name, pod["labels"]), "values": " ".join(f"{v:g}" for v in values)}
              for pod in pods for name, values in pod["counters"].items()]
    tests = {"evaluation_interval": f"{interval}s", "tests": [{"interval": f"{interval}s", "input_series": inputs,
             "promql_expr_test": [
                 {"expr": f"round({expr}, {NEAREST:g})", "eval_time": f"{int(at * 1000)}ms",
                  "exp_samples": [{"labels": series("", {"arm": arm}), "value": rounded(value)}
                                  for arm, value in sorted(by_arm.items())]}
                 for expr, by_arm in expected.items()]}]}
    (tmp_path / "tests.yml").write_text(json.dumps(tests))  # JSON is YAML
    proc = subprocess.run([promtool(), "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What the comparison is for: B's draft runs on weights it never loaded, A's does not.
    assert expected[acceptance]["b"] < 0.01 < expected[acceptance]["a"]
