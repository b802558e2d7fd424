"""What a real vLLM process says: the shim's lines, measured per process kind, and the docs that
quote them.

Each kind of a ``vllm serve`` process imports the patches' modules in its own order, as the H200
server logs show (docs/evidence/serve-h200-logs): the API server the model's modules (vLLM's
``ModelConfig`` checks the checkpoint's quantization with ``get_quantization_config``, which imports
``vllm.models.deepseek_v4``: tests/real_vllm/test_metrics.py starts it so) and, later, KV-cache
grouping's (with its engine client), never the V2 runner's; the engine core (tensor parallel 1)
grouping first, then the model, then the runner; a tensor-parallel worker the model, then the
runner, never grouping. The modules are imported by name: on a CPU, releases from 0.33.0 on import a
CPU model package where a GPU server imports these. Here each order runs in a fresh interpreter of a
real vLLM release (and of 0.25.0 with every patch's REVERT applied, the reported build's code) with
the shim on ``PYTHONPATH``, as ``dspark-hotfix run`` starts them. The lines, pid and time aside, are
recorded in docs/evidence/lines.json (``make records``), which docs/MATRIX.md quotes whole
(harness/tests/test_matrix.py holds it to the record): an operator's grep is written from there.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import pytest

from dspark_hotfix.patches import ALL
from scripts.venvs import LINES_VERSIONS, ensure_venv
from tests.child import import_modules, import_present, load_plugins
from tests.conftest import REPO, clean_env, program, state_of, summary_lines
from tests.real_vllm import runs
from tests.real_vllm.runs import REVERTED, REVERTED_VERSION, reverted_copy

pytestmark = pytest.mark.real_vllm

EVIDENCE = REPO / "docs" / "evidence" / "lines.json"
# The patches' modules by where vLLM imports them: the ones judged everywhere (Patch.everywhere:
# KV-cache grouping's, light) and the model's. The V2 runner's module is no patch's target, imported
# where vLLM does.
GROUPING = tuple(dict.fromkeys(p.module for p in ALL if p.everywhere))
MODEL = tuple(m for m in dict.fromkeys(p.module for p in ALL) if m not in GROUPING)
RUNNER = "vllm.v1.worker.gpu.attn_utils"
KINDS = {
    "API server": (*MODEL, *GROUPING),
    "engine core": (*GROUPING, *MODEL, RUNNER),
    "tensor-parallel worker": (*MODEL, RUNNER),
}
BUILDS = (REVERTED, *LINES_VERSIONS)


def lines_of(build: str, kind: str) -> list[str]:
    """The state lines a process of ``kind`` prints on ``build``, without their heads."""
    version = build.split()[0]
    python, _ = ensure_venv(version)
    path = [str(REPO)]
    if build.endswith("reverted"):
        path.insert(0, str(reverted_copy(python)))  # built by the fixture, before the runs
    code = program(
        partial(import_present, list(KINDS[kind]))
    )  # (a patch's module some releases lack)
    proc = subprocess.run(
        [str(python), "-c", code],
        env=clean_env(PYTHONPATH=os.pathsep.join(path)),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{build}, {kind}:\n{proc.stderr[-3000:]}"
    return [state_of(line) for line in summary_lines(proc.stderr)]


@pytest.fixture(scope="module")
def measured() -> dict[str, dict[str, list[str]]]:
    for version in LINES_VERSIONS:  # one install at a time, before the runs
        ensure_venv(version)
    reverted_copy(ensure_venv(REVERTED_VERSION)[0])
    pairs = [(build, kind) for build in BUILDS for kind in KINDS]
    with ThreadPoolExecutor(max_workers=2) as pool:  # two cores
        found = list(pool.map(lambda pair: lines_of(*pair), pairs))
    out: dict[str, dict[str, list[str]]] = {}
    for (build, kind), lines in zip(pairs, found, strict=True):
        out.setdefault(build, {})[kind] = lines
    if os.environ.get("DSPARK_HOTFIX_UPDATE_EVIDENCE") == "1":
        EVIDENCE.write_text(json.dumps(out, indent=2) + "\n")
    return out


def read(line: str) -> tuple[int, dict[str, str]]:
    """How many patches a line counts, and the state of each it names."""
    rest = line.partition(": ")[2]
    named = {
        name.strip(): state
        for state, names in re.findall(r"\d+ (\w+)(?: \(([^)]*)\))?", rest)
        for name in names.split(",")
        if name.strip()
    }
    return sum(int(n) for n in re.findall(r"(\d+) \w+", rest)), named


def states(line: str) -> dict[str, str]:
    """The state of each patch of ALL in a line: as named, else ``not_needed`` (a line names every
    other state)."""
    named = read(line)[1]
    return {p.name: named.get(p.name, "not_needed") for p in ALL}


def test_the_committed_lines_are_what_real_vllm_processes_print(measured):
    committed = json.loads(EVIDENCE.read_text())
    stale = f"{EVIDENCE.relative_to(REPO)} is {runs.RECORDS}"
    assert set(committed) == set(measured), stale
    for build, kinds in measured.items():
        for kind, lines in kinds.items():
            recorded = committed[build][kind]
            counted, named = read(recorded[-1])
            if runs.history(
                named, counted
            ):  # a patch removed since: the states of the others still hold
                assert states(recorded[-1]) == states(lines[-1]), (build, kind, stale)
            else:
                assert recorded == lines, (build, kind, stale)


def test_every_kind_of_process_gives_one_verdict_per_build(measured):
    for build, kinds in measured.items():
        verdicts = {kind: lines[-1].split(":")[0] for kind, lines in kinds.items()}
        assert len(set(verdicts.values())) == 1, (build, verdicts)
    for build, kinds in measured.items():
        assert all(lines[-1].startswith(f"{verdict(build)}: ") for lines in kinds.values()), (
            build,
            kinds,
        )


def verdict(build: str) -> str:
    """The verdict a build's declared states give: a correction applied fixes, a stop alone
    guards."""
    patched = [p for p in ALL if runs.expected(build)[p.name] == "patched"]
    return "fixing" if any(not p.stops for p in patched) else "guarding" if patched else "removable"


def decorate_logs() -> None:
    """vLLM's decorate_logs(): from now on its stdout and stderr lines start with ``(EngineCore
    pid=N)``."""
    from vllm.utils.system_utils import decorate_logs

    decorate_logs("EngineCore")


# An engine core as vLLM 0.25.0 starts one: its config's classes imported as it is unpickled (the
# targets with them), then vLLM's decorate_logs() prefixes its stdout and stderr, then EngineCore
# loads vLLM's plugins.
ENGINE_CORE = program(
    partial(import_modules, ["vllm.models.deepseek_v4", "vllm.v1.core.kv_cache_utils"]),
    decorate_logs,
    load_plugins,
)


def test_an_engine_core_says_its_line_again_under_vllms_prefix_when_vllm_loads_the_plugin(
    tmp_path: Path,
):
    python, _ = ensure_venv("0.25.0")
    # The wheel's entry point, as an installed wheel declares it (setup.cfg), beside the checkout.
    entry = configparser.ConfigParser()
    entry.read(REPO / "setup.cfg")
    info = tmp_path / "dspark_hotfix-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dspark_hotfix\nVersion: 0\n")
    (info / "entry_points.txt").write_text(
        "[vllm.general_plugins]\n"
        + entry["options.entry_points"]["vllm.general_plugins"].strip()
        + "\n"
    )
    env = clean_env(
        PYTHONPATH=os.pathsep.join([str(REPO), str(tmp_path)]), VLLM_PLUGINS="dspark_hotfix"
    )
    proc = subprocess.run(
        [str(python), "-c", ENGINE_CORE], env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = [line for line in proc.stderr.splitlines() if "[dspark_hotfix] " in line]
    first, again = ours  # nothing else: no warning
    pid = first.split(" (pid ", 1)[1].split(")", 1)[0]
    assert first.startswith("INFO ") and again.startswith(f"(EngineCore pid={pid}) INFO "), (
        first,
        again,
    )
    assert state_of(first.split("[dspark_hotfix] ", 1)[1]) == state_of(
        again.split("[dspark_hotfix] ", 1)[1]
    )
    assert f"via sitecustomize: {verdict('0.25.0')}: " in again  # vLLM 0.25.0 as released
