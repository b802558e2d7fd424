"""The summary line on stderr: one whole line once every patch is judged, a new whole line on each later
decision, never silenced by a logging config applied after activation, and the same verdict in every
process kind (engine core, worker, API server), on a fixed vLLM only the removable line."""

from __future__ import annotations

import pytest

from dspark_hotfix import __version__
from tests.cases import PATCHES
from tests.conftest import (
    ALL_PATCHED,
    ENGINE_CORE_FIRST,
    IMPORT_ALL,
    REPO,
    RUNNER,
    STANDIN,
    STATUS,
    json_lines,
    last_json,
    run_python,
    state_of,
    summary_lines,
)


def test_one_whole_line_once_every_patch_is_judged_and_none_for_later_imports():
    # The engine core's order on vLLM 0.25.0: KV-cache grouping and the model, then the V2 runner.
    proc = run_python(ENGINE_CORE_FIRST + f"import {RUNNER}\n" + STATUS)
    rows = last_json(proc.stdout)
    head = f"dspark_hotfix {__version__} (pid {rows[PATCHES[0]]['pid']}) via sitecustomize: "
    assert summary_lines(proc.stderr) == [head + ALL_PATCHED]
    assert {row["state"] for row in rows.values()} == {"patched"}


def test_a_logging_config_applied_after_activation_does_not_silence_the_summary_line():
    # vLLM applies VLLM_LOGGING_CONFIG_PATH with dictConfig while `import vllm` runs, after the
    # shim activated; dictConfig's default disable_existing_loggers=True would disable its logger.
    code = 'import logging.config, vllm\nlogging.config.dictConfig({"version": 1})\n' + IMPORT_ALL
    proc = run_python(code)
    (summary,) = summary_lines(proc.stderr)
    assert summary.endswith(f"via sitecustomize: {ALL_PATCHED}")


def test_on_a_fixed_vllm_the_removable_line_is_the_only_one_in_the_engine_cores_order(fixed_standin):
    code = ENGINE_CORE_FIRST + f"import {RUNNER}\n" + STATUS
    proc = run_python(code, path=(REPO, fixed_standin))
    rows = json_lines(proc.stdout)[-1]
    assert {row["state"] for row in rows.values()} == {"not_needed"}
    assert [line.split("[dspark_hotfix] ")[1] for line in proc.stderr.splitlines()] == summary_lines(proc.stderr)
    assert [state_of(line) for line in summary_lines(proc.stderr)] == [f"removable: {len(PATCHES)} not_needed"]


# A tensor-parallel worker's order: the model and the V2 runner, never vLLM's KV-cache grouping.
WORKER = ("import vllm.models.deepseek_v4.attention, vllm.models.deepseek_v4.nvidia.dspark\n"
          "import vllm.v1.attention.backends.mla.sparse_swa, vllm.v1.worker.gpu.attn_utils\n")


@pytest.mark.parametrize("build", ["fixed", "reverted"])
def test_every_process_kind_gives_the_same_verdict(fixed_standin, build):
    # The stop's module is the engine core's (and the API server's), never a worker's: the shim
    # imports it there to judge it, so a worker does not leave it pending.
    path = (REPO, fixed_standin if build == "fixed" else STANDIN)
    orders = {"engine core": ENGINE_CORE_FIRST + f"import {RUNNER}\n", "worker": WORKER,
              "api server": ENGINE_CORE_FIRST}
    last = {kind: state_of(summary_lines(run_python(code + STATUS, path=path).stderr)[-1])
            for kind, code in orders.items()}
    if build == "fixed":
        assert set(last.values()) == {f"removable: {len(PATCHES)} not_needed"}, last
    else:
        assert {line.split(":")[0] for line in last.values()} == {"fixing"}, last
        assert last["worker"] == last["engine core"] == last["api server"] == ALL_PATCHED
