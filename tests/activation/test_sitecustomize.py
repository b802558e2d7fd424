"""Activation in real subprocesses: PYTHONPATH, switches, chaining, children."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from dspark_hotfix import __version__
from tests.conftest import (
    ALL_PATCHED,
    ENGINE_CORE_FIRST,
    IS_ORIGINAL,
    PATCHES,
    REPO,
    STANDIN,
    STATUS,
    TARGETS,
    WARMUP,
    clean_env,
    last_json,
    log_lines,
    run_python,
    summary_lines,
    warning_lines,
)
from tests.standin.warmup import CHECKPOINT


def test_pythonpath_activation_patches_every_target_on_import():
    proc = run_python(TARGETS + STATUS)
    rows = last_json(proc.stdout)
    assert {n: rows[n]["state"] for n in PATCHES} == dict.fromkeys(PATCHES, "patched")
    assert all(rows[n]["activated_by"] == "sitecustomize" for n in PATCHES)
    # One line for the process, in vLLM's format, and nothing else at the default level.
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("INFO ")
    (summary,) = summary_lines(proc.stderr)
    pid = rows["kv_view_guard"]["pid"]
    assert summary == f"dspark_hotfix {__version__} (pid {pid}) via sitecustomize: {ALL_PATCHED}"


def test_warmup_crashes_without_the_shim_and_runs_with_it():
    off = last_json(run_python(WARMUP, env={"DSPARK_HOTFIX": "0"}).stdout)
    on = last_json(run_python(WARMUP).stdout)
    assert off["error"] == (
        "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
    )
    assert off["views"]["draft.0.swa"]["shape"] == [4, 64, 512]
    assert "model.layers.0.attn.wkv.weight" not in off["loaded"]
    assert on["error"] is None
    assert on["views"]["draft.0.swa"] == {"shape": [4, 64, 584], "stride": [37440, 584, 1], "page_bytes": 37440}
    assert {f"model.layers.{i}.attn.wkv.weight" for i in range(3)} <= set(on["loaded"])


def test_view_guard_turns_a_narrow_view_into_a_clear_error_when_the_swa_patch_is_off():
    report = last_json(run_python(WARMUP, env={"DSPARK_HOTFIX_PATCHES": "-swa_kv_cache_spec"}).stdout)
    error = report["error"]
    assert error.startswith("HotfixError: kv_view_guard: DeepSeek-V4 fp8_ds_mla KV views FlashMLA would reject")
    # Each kind of spec once, with the layers counted; the cause named: the patch that was excluded.
    assert "SlidingWindowMLASpec(kv_quant_mode=NONE) viewed at 512 bytes/token: target.swa and 3 more layers" in error
    assert error.count("SlidingWindowMLASpec(kv_quant_mode=NONE)") == 1  # the other spec was corrected
    assert "MLAAttentionSpec(kv_quant_mode=NONE) viewed" not in error
    assert "swa_kv_cache_spec excluded (excluded by DSPARK_HOTFIX_PATCHES; needed (vLLM returns 512" in error
    assert "see `dspark-hotfix doctor`" in error and len(error) < 700


def test_view_guard_names_a_spec_patch_that_failed_not_one_to_enable(broken_standin):
    warmup = WARMUP.replace(str(STANDIN), str(broken_standin))
    report = last_json(run_python(warmup, path=(REPO, broken_standin)).stdout)
    assert report["error"].startswith("HotfixError: kv_view_guard: ")
    assert "swa_kv_cache_spec failed (unexpected signature DeepseekV4SWACache.get_kv_cache_spec" in report["error"]
    assert "DSPARK_HOTFIX_PATCHES" not in report["error"]


def test_view_guard_waits_for_the_spec_patches_when_the_runner_is_imported_first():
    code = "import vllm.v1.worker.gpu.attn_utils\n" + STATUS + "\n" + TARGETS + STATUS
    first, then = (__import__("json").loads(line) for line in run_python(code).stdout.strip().splitlines()[-2:])
    assert first["kv_view_guard"]["state"] == "pending"
    assert "and the verdicts of attention_kv_cache_spec" in first["kv_view_guard"]["detail"]
    assert then["kv_view_guard"]["state"] == "patched"


def test_a_guard_decided_after_the_first_line_gives_a_new_whole_line():
    # The engine core's order on vLLM 0.25.0: KV-cache grouping and the model first, the V2
    # runner's attn_utils later. The first line leaves kv_view_guard pending; an operator reading
    # the log must see it decided too, once, when it is, in a line that is the whole state again.
    first = ENGINE_CORE_FIRST
    proc = run_python(first + "import vllm.v1.worker.gpu.attn_utils\n" + STATUS)
    rows = last_json(proc.stdout)
    head = f"dspark_hotfix {__version__} (pid {rows['kv_view_guard']['pid']}) via sitecustomize: "
    assert summary_lines(proc.stderr) == [
        head + "fixing: 5 patched (remap_dspark_name, attention_kv_cache_spec, swa_kv_cache_spec, kv_cache_groups, "
               "draft_load_coverage), 1 pending (kv_view_guard until vllm.v1.worker.gpu.attn_utils is imported)",
        head + ALL_PATCHED,
    ]
    assert rows["kv_view_guard"]["state"] == "patched"
    # a process that never imports the runner's module says nothing more
    assert len(summary_lines(run_python(first + STATUS).stderr)) == 1


def test_draft_load_guard_names_the_unloaded_layers_when_the_remap_is_off():
    proc = run_python(WARMUP, env={"DSPARK_HOTFIX_PATCHES": "-remap_dspark_name"})
    errors = log_lines(proc.stderr, "ERROR")
    assert len(errors) == 1 and errors[0].startswith("draft_load_coverage: 6 DSpark draft parameters were never loaded")
    assert "model.layers.0.attn.wkv.weight" in errors[0] and "lm_head" not in errors[0]
    assert "remap_dspark_name excluded" in errors[0]
    assert log_lines(run_python(WARMUP).stderr, "ERROR") == []  # with the remap patch: all loaded


def test_draft_load_guard_reads_none_as_not_tracked_as_vllm_does(tmp_path):
    # vLLM's DefaultModelLoader checks coverage only when load_weights returns a set.
    from tests.conftest import edited_standin

    root = edited_standin(tmp_path / "standin", {
        "vllm/models/deepseek_v4/nvidia/dspark.py": [("        return loaded\n", "        return None\n")]})
    env = {"DSPARK_HOTFIX_PATCHES": "-remap_dspark_name", "DSPARK_HOTFIX_STRICT": "1"}
    proc = run_python(WARMUP.replace(str(STANDIN), str(root)), path=(REPO, root), env=env)
    assert log_lines(proc.stderr, "ERROR") == [] and last_json(proc.stdout)["loaded"] is None


def test_draft_load_guard_stops_the_load_in_strict_mode():
    proc = run_python(WARMUP, env={"DSPARK_HOTFIX_PATCHES": "-remap_dspark_name", "DSPARK_HOTFIX_STRICT": "1"})
    assert "HotfixError: draft_load_coverage: 6 DSpark draft parameters" in last_json(proc.stdout)["error"]


def test_corrections_and_calls_are_counted():
    rows = last_json(run_python(WARMUP + "\n" + STATUS).stdout)
    assert (rows["swa_kv_cache_spec"]["corrections"], rows["remap_dspark_name"]["corrections"]) == (4, 6)
    # every call of a wrapper is counted, the ones whose answer was right unchanged too
    assert (rows["swa_kv_cache_spec"]["calls"], rows["remap_dspark_name"]["calls"]) == (4, len(CHECKPOINT))
    assert rows["kv_cache_groups"]["calls"] == 1  # the engine groups its KV caches once


def test_off_means_nothing_is_wrapped_and_nothing_is_said():
    proc = run_python(TARGETS + IS_ORIGINAL + STATUS, env={"DSPARK_HOTFIX": "0"})
    originals, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert originals == [True] * len(PATCHES)
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert proc.stderr == ""
    assert "wrapt" not in run_python(TARGETS + "import sys; print(sorted(sys.modules))",
                                     env={"DSPARK_HOTFIX": "off"}).stdout


def test_hooks_fire_when_installed_after_vllm_is_imported():
    # The shim's directory is not on PYTHONPATH: no sitecustomize, a late install().
    code = TARGETS + "import dspark_hotfix; dspark_hotfix.install()\n" + IS_ORIGINAL + STATUS
    proc = run_python(f"import sys; sys.path.append({str(REPO)!r})\n" + code, path=(STANDIN,))
    originals, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert originals == [False] * len(PATCHES)
    assert {r["state"] for r in rows.values()} == {"patched"}
    assert {r["activated_by"] for r in rows.values()} == {"api"}


def test_selection_patches_only_the_named_patch():
    rows = last_json(run_python(TARGETS + STATUS, env={"DSPARK_HOTFIX_PATCHES": "swa_kv_cache_spec"}).stdout)
    assert rows["swa_kv_cache_spec"]["state"] == "patched"
    assert {rows[n]["state"] for n in PATCHES if n != "swa_kv_cache_spec"} == {"excluded"}


def test_exclusion_leaves_the_excluded_patch_alone():
    rows = last_json(run_python(TARGETS + STATUS, env={"DSPARK_HOTFIX_PATCHES": "-remap_dspark_name"}).stdout)
    assert rows["remap_dspark_name"]["state"] == "excluded"
    assert rows["swa_kv_cache_spec"]["state"] == "patched"


@pytest.mark.parametrize(
    ("var", "value"),
    [("DSPARK_HOTFIX_STRICT", "very"), ("DSPARK_HOTFIX_PATCHES", "swa_kv_cache_spec,bogus")],
)
def test_malformed_value_warns_once_and_uses_the_default(var, value):
    proc = run_python(TARGETS + STATUS, env={var: value})
    warnings = warning_lines(proc.stderr)
    assert warnings[0].startswith(var) and repr(value.split(",")[-1]) in warnings[0]
    if var == "DSPARK_HOTFIX_PATCHES":  # and, once, what the selection leaves off
        assert sorted(warnings[1:]) == [f"DSPARK_HOTFIX_PATCHES leaves off what this vLLM needs: {name}" for name in (
            "attention_kv_cache_spec", "draft_load_coverage", "kv_cache_groups", "kv_view_guard", "remap_dspark_name")]
    else:
        assert len(warnings) == 1
    assert last_json(proc.stdout)["swa_kv_cache_spec"]["state"] == "patched"


def test_unexpected_signature_warns_and_vllm_runs_unpatched(broken_standin):
    proc = run_python(TARGETS + STATUS, path=(REPO, broken_standin))
    rows = last_json(proc.stdout)
    assert rows["swa_kv_cache_spec"]["state"] == "failed"
    assert "unexpected signature" in rows["swa_kv_cache_spec"]["detail"]
    assert rows["attention_kv_cache_spec"]["state"] == "patched"
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line]
    assert len(warnings) == 1 and "swa_kv_cache_spec" in warnings[0] and "vLLM runs unpatched" in warnings[0]


def test_strict_mode_stops_the_import_naming_patch_target_and_remedy(broken_standin):
    proc = run_python(TARGETS, path=(REPO, broken_standin), env={"DSPARK_HOTFIX_STRICT": "1"}, check=False)
    assert proc.returncode == 1
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dspark_hotfix.registry.HotfixError: swa_kv_cache_spec: cannot patch ")
    assert "DeepseekV4SWACache.get_kv_cache_spec" in last and "DSPARK_HOTFIX_PATCHES=-swa_kv_cache_spec" in last


def test_shadowed_sitecustomize_runs_exactly_once(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os, sys\nsys.stderr.write('shadowed sitecustomize ran\\n')\nos.environ['SHADOWED'] = '1'\n"
    )
    proc = run_python(TARGETS + STATUS + "\nimport os; print(os.environ.get('SHADOWED'))",
                      path=(REPO, STANDIN, other))
    assert proc.stderr.count("shadowed sitecustomize ran") == 1
    assert proc.stdout.strip().splitlines()[-1] == "1"
    assert last_json("\n".join(proc.stdout.strip().splitlines()[:-1]))["swa_kv_cache_spec"]["state"] == "patched"


def test_a_raising_shadowed_sitecustomize_is_reported_like_site_does(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("raise ValueError('broken image customisation')\n")
    proc = run_python(TARGETS + STATUS, path=(REPO, STANDIN, other))
    assert "Error in sitecustomize (chained by dspark_hotfix):\nValueError: broken image" in proc.stderr
    assert last_json(proc.stdout)["swa_kv_cache_spec"]["state"] == "patched"


def test_spawn_children_are_each_patched():
    code = """
import multiprocessing as mp, json

def child(_):  # a tensor-parallel worker: the runner and the model, not (yet) vLLM's KV-cache grouping
    import dspark_hotfix, vllm.v1.worker.gpu.attn_utils, vllm.models.deepseek_v4.attention, os
    import vllm.models.deepseek_v4.nvidia.dspark, vllm.v1.attention.backends.mla.sparse_swa
    return os.getpid(), [r['state'] for r in dspark_hotfix.status()['patches']]

if __name__ == '__main__':
    with mp.get_context('spawn').Pool(8) as pool:
        print(json.dumps(pool.map(child, range(8), chunksize=1)))
"""
    script = REPO / ".pytest_cache" / "spawn_children.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text(code)
    proc = run_python(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    results = last_json(proc.stdout)
    assert len(results) == 8
    # vLLM never imports kv_cache_groups's module in a worker; the shim does, to judge it as everywhere.
    expected = ["patched"] * len(PATCHES)
    assert all(states == expected for _, states in results)
    assert len(summary_lines(proc.stderr)) >= len({pid for pid, _ in results})


@pytest.mark.parametrize("flag", ["-S", "-I"])
def test_isolating_flags_start_cleanly_without_the_shim(flag):
    proc = run_python("import sys; print('dspark_hotfix' in sys.modules)", flags=(flag,))
    assert proc.stdout.strip() == "False" and proc.stderr == ""


def test_status_before_vllm_is_imported_says_pending():
    rows = last_json(run_python(STATUS).stdout)
    assert {(r["state"], r["activated_by"]) for r in rows.values()} == {("pending", "sitecustomize")}


def test_double_install_is_idempotent():
    code = TARGETS + "import dspark_hotfix\nfor _ in range(3): dspark_hotfix.install(source='vllm-plugin')\n"
    proc = run_python(code + IS_ORIGINAL + STATUS)
    originals, rows = (__import__("json").loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert originals == [False] * len(PATCHES)
    assert len(summary_lines(proc.stderr)) == 1
    assert {r["activated_by"] for r in rows.values()} == {"sitecustomize"}


def test_startup_imports_nothing_heavy_when_vllm_is_never_imported():
    proc = run_python("import sys; print(repr(sorted(sys.modules)))", path=(REPO,))
    loaded = set(eval(proc.stdout))
    assert {m for m in loaded if m.startswith("dspark_hotfix")} == {"dspark_hotfix"}  # active, one module
    heavy = {"wrapt", "logging", "typing", "inspect", "importlib.abc", "__future__", "dataclasses"}
    assert not loaded & (heavy | {"dspark_hotfix.registry", "dspark_hotfix.config", "dspark_hotfix.patches"})


def test_doctor_judges_guards_as_the_hooks_do():
    env = {"DSPARK_HOTFIX_PATCHES": "-attention_kv_cache_spec,-swa_kv_cache_spec"}
    proc = run_python("from dspark_hotfix.cli import main; raise SystemExit(main(['doctor', '--json']))",
                      env=env, check=False)
    report = __import__("json").loads(proc.stdout)
    rows = {p["name"]: p for p in report["patches"]}
    assert proc.returncode == 1
    # The patches it guards are excluded but needed here: the guard is on, in doctor and in the hooks.
    assert (rows["kv_view_guard"]["needed"], rows["draft_load_coverage"]["needed"]) == (True, True)
    assert "swa_kv_cache_spec is needed but excluded by DSPARK_HOTFIX_PATCHES" in report["problems"]
    hooks = last_json(run_python(TARGETS + STATUS, env=env).stdout)
    assert {n: r["state"] for n, r in hooks.items()} == {n: r["state"] for n, r in rows.items()}
    assert hooks["kv_view_guard"]["state"] == "patched"


def test_wrappers_take_vllms_arguments_the_way_vllms_functions_do():
    # Keyword calls bind as on vLLM's function, and a wrong call fails the same way.
    code = TARGETS + """
import inspect, json
from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM as D
from vllm.v1.attention.backends.mla.sparse_swa import DeepseekV4SWACache as S
from types import SimpleNamespace
wrapper = D.__dict__["_remap_dspark_name"]
config = SimpleNamespace(cache_config=SimpleNamespace(block_size=256, cache_dtype="fp8_ds_mla"))
try:
    D()._remap_dspark_name(nom="mtp.1.attn.wkv.weight")
    wrong = None
except TypeError as exc:
    wrong = str(exc)
print(json.dumps({
    "signature": list(inspect.signature(wrapper).parameters),
    "keyword": D()._remap_dspark_name(name="mtp.1.attn.wkv.weight"),
    "positional": D()._remap_dspark_name("mtp.1.attn.wkv.weight"),
    "spec_keyword": S().get_kv_cache_spec(vllm_config=config).kv_quant_mode.name,
    "wrong": wrong,
}))
"""
    got = last_json(run_python(code).stdout)
    assert got["signature"] == ["self", "name"]
    assert got["keyword"] == got["positional"] == "model.layers.1.attn.wkv.weight"
    assert got["spec_keyword"] == "FP8_PER_TENSOR"
    assert "unexpected keyword argument 'nom'" in got["wrong"]


@pytest.mark.parametrize("version, supported", [
    ("1.17.3", True), ("1.17.0", True), ("2.0.0", True), ("2.5.2", True), ("2.10.1rc1", True),
    ("1.16.0", False), ("1.10.11", False), ("3.0.0", False), ("nightly", False),
])
def test_doctor_names_a_wrapt_outside_the_tested_releases(tmp_path, version, supported):
    # An image that brings its own wrapt keeps it (the Dockerfile installs one only where
    # there is none); doctor, a build step there, fails on one the shim is not tested with.
    from dspark_hotfix.doctor import wrapt_supported

    assert wrapt_supported(version) is supported
    if version != "1.10.11":
        return
    dist = tmp_path / f"wrapt-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: wrapt\nVersion: {version}\n")
    proc = run_python("from dspark_hotfix.cli import main; raise SystemExit(main(['doctor', '--json']))",
                      path=(REPO, STANDIN, tmp_path), check=False)
    report = __import__("json").loads(proc.stdout)
    assert proc.returncode == 1 and report["versions"]["wrapt"] == version
    assert any(f"wrapt {version} is not one the shim is tested with (1.17 to 2.x)" in p for p in report["problems"])


@pytest.mark.parametrize("parameters", [("self", "name"), ("self", "result"), ("self", "vllm"), ("self", "returned"),
                                        ("a", "b", "c")])
def test_a_wrapper_binds_arguments_as_vllms_function_whatever_their_names(parameters):
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Patch

    namespace: dict = {}
    exec(f"def target({', '.join(parameters)}):\n    return ({', '.join(parameters)},)", namespace)

    def replacement(vllm, /, *args, **kwargs):
        return (*vllm(*args, **kwargs), "corrected")

    patch = Patch("echo", "nowhere", "target", parameters, replacement, "echo")
    wrapper = registry._wrap(registry.Activation("test"), registry.Record(patch), namespace["target"])
    values = list(range(len(parameters)))
    assert wrapper(*values) == (*values, "corrected")
    assert wrapper(**dict(zip(parameters, values, strict=True))) == (*values, "corrected")
    assert wrapper.__wrapped__ is namespace["target"]


def test_a_logging_config_applied_after_activation_does_not_silence_the_summary_line():
    # vLLM applies VLLM_LOGGING_CONFIG_PATH with dictConfig while `import vllm` runs, after the
    # shim activated; dictConfig's default disable_existing_loggers=True would disable its logger.
    code = 'import logging.config, vllm\nlogging.config.dictConfig({"version": 1})\n' + TARGETS
    proc = run_python(code)
    (summary,) = summary_lines(proc.stderr)
    assert summary.endswith(f"via sitecustomize: {ALL_PATCHED}")


@pytest.mark.parametrize("value", ["", "bogus", "1"])
def test_with_stderr_closed_interpreter_start_goes_on(value):
    # `2>&-` leaves sys.stderr None: a warning about a malformed switch must not end the interpreter.
    env = clean_env(DSPARK_HOTFIX=value, PYTHONPATH=os.pathsep.join((str(REPO), str(STANDIN))))
    code = "import vllm.models.deepseek_v4.attention; print('ran')"
    proc = subprocess.run(["sh", "-c", f'"{sys.executable}" -c "{code}" 2>&-'], env=env, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, "ran\n"), proc


def test_a_needed_patch_the_selection_leaves_off_is_warned_about_when_it_is_decided_after_the_first_line():
    proc = run_python(ENGINE_CORE_FIRST + "import vllm.v1.worker.gpu.attn_utils\n",
                      env={"DSPARK_HOTFIX_PATCHES": "-kv_view_guard"})
    lines = [line.split("] ", 1)[1] for line in proc.stderr.splitlines()]
    first = next(i for i, line in enumerate(lines) if line.startswith("dspark_hotfix "))
    warned = lines.index("DSPARK_HOTFIX_PATCHES leaves off what this vLLM needs: kv_view_guard")
    assert warned > first  # decided when the V2 runner's module came, after the first line
    assert lines[-1].endswith("problem: 5 patched (remap_dspark_name, attention_kv_cache_spec, swa_kv_cache_spec, "
                              "kv_cache_groups, draft_load_coverage), 1 excluded (kv_view_guard)")
