"""One truth: the hooks, ``status``, ``doctor`` and the summary line read the same records.

Each situation is run in real subprocesses three ways: ``doctor --json``,
``status --json`` and ``dspark_hotfix.status()`` in a process whose
sitecustomize activated the shim and that imported vLLM's targets. They must
name the same state for every patch, and status and doctor must exit alike.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    FIXED,
    IMPORT_ALL,
    REPO,
    STANDIN,
    STATUS,
    clean_env,
    edited_standin,
    last_json,
    run_in_env,
    run_python,
    summary_lines,
)

STARTUP = REPO / "dspark_hotfix" / "startup"  # holds only sitecustomize.py
CLI = "import sys; from dspark_hotfix.cli import main; sys.exit(main(sys.argv[1:]))"
SWA = "swa_kv_cache_spec"
GUARDS = ("draft_load_coverage", "kv_view_guard")
SWA_FILE = "vllm/v1/attention/backends/mla/sparse_swa.py"
SWA_SIGNATURE = [("def get_kv_cache_spec(self, vllm_config)", "def get_kv_cache_spec(self, vllm_config, layer_idx=0)")]
NO_QUANT_MODE = {"vllm/v1/kv_cache_interface.py": [("def get_kv_quant_mode(", "def kv_quant_mode_for(")]}
RESHAPE_SIGNATURE = {"vllm/v1/worker/gpu/attn_utils.py": [("kv_cache_config=None\n",
                                                          "kv_cache_config=None, layer_map=None\n")]}


def cli(*args: str, path: tuple[Path | str, ...], env: dict[str, str] | None = None):
    return run_python(f"import sys; sys.argv[1:] = {list(args)!r}\n" + CLI, path=path, env=env, check=False)


def report_of(proc) -> dict:
    """The one JSON object a command printed; a traceback instead fails with what it said."""
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}, no JSON\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}") \
            from None


def states(report: dict) -> dict[str, str]:
    return {row["name"]: row["state"] for row in report["patches"]}


def hooks(standin: Path, env: dict[str, str] | None = None) -> dict[str, dict]:
    """status() rows in a process whose sitecustomize activated the shim, after vLLM imported every target."""
    return last_json(run_python(IMPORT_ALL + STATUS, path=(REPO, standin), env=env).stdout)


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("standins")
    return {
        "buggy": STANDIN,
        "fixed": edited_standin(root / "fixed", FIXED),
        "changed signature": edited_standin(root / "signature", {SWA_FILE: SWA_SIGNATURE}),
    }


@pytest.fixture
def package_only(tmp_path) -> Path:
    """A directory that makes the package importable without a sitecustomize: the shim is not active."""
    root = tmp_path / "package"
    root.mkdir()
    (root / "dspark_hotfix").symlink_to(REPO / "dspark_hotfix")
    return root


def test_doctor_reports_failed_rows_when_a_probe_raises_and_the_shim_is_not_active(tmp_path, package_only):
    standin = edited_standin(tmp_path / "standin", NO_QUANT_MODE)
    proc = cli("doctor", "--json", path=(package_only, standin))
    report = report_of(proc)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    doctor = states(report)
    assert doctor["attention_kv_cache_spec"] == doctor[SWA] == "failed"
    assert any(problem.startswith(f"{SWA}: ") for problem in report["problems"]), report["problems"]
    assert {name: row["state"] for name, row in hooks(standin).items()} == doctor


def test_an_excluded_patch_whose_target_cannot_be_resolved_is_excluded_everywhere(standins, package_only):
    standin, env = standins["changed signature"], {"DSPARK_HOTFIX_PATCHES": f"-{SWA}"}
    # doctor judges in its own process whether or not the shim is active there.
    doctors = [cli("doctor", "--json", path=(where, standin), env=env) for where in (STARTUP, package_only)]
    status = cli("status", "--import-targets", "--json", path=(STARTUP, standin), env=env)
    assert [states(report_of(doctor))[SWA] for doctor in doctors] == ["excluded", "excluded"]
    assert states(report_of(status))[SWA] == hooks(standin, env)[SWA]["state"] == "excluded"
    assert doctors[0].returncode == status.returncode


def test_doctor_with_the_switch_off_says_disabled_and_judges_what_is_needed():
    proc = cli("doctor", "--json", path=(STARTUP, STANDIN), env={"DSPARK_HOTFIX": "0"})
    report = report_of(proc)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    assert set(states(report).values()) == {"disabled"}
    assert all(row["needed"] is True for row in report["patches"]), report["patches"]


def test_plain_status_imports_the_targets_and_reports_the_registrys_decision(standins, package_only):
    buggy = cli("status", "--json", path=(package_only, standins["buggy"]))
    report = report_of(buggy)
    assert buggy.returncode == 0 and report["activated_by"] == "status"
    assert set(states(report).values()) == {"patched"}
    broken = cli("status", "--json", path=(package_only, standins["changed signature"]))
    report = report_of(broken)
    assert broken.returncode == 1 and report["verdict"] == "problem"
    assert states(report)[SWA] == "failed"


def test_a_fixed_vllm_with_the_switch_off_exits_3_in_status_and_doctor(standins):
    path, env = (STARTUP, standins["fixed"]), {"DSPARK_HOTFIX": "0"}
    status = cli("status", "--import-targets", "--json", path=path, env=env)
    doctor = cli("doctor", "--json", path=path, env=env)
    assert (status.returncode, doctor.returncode) == (3, 3), status.stdout + doctor.stdout
    assert report_of(status)["verdict"] == report_of(doctor)["verdict"] == "removable"


WORDS = {state: state for state in ("patched", "not_needed", "excluded", "failed", "pending")}  # the line's words


def test_the_summary_line_counts_the_states_that_status_reports(tmp_path):
    standin = edited_standin(tmp_path / "standin", RESHAPE_SIGNATURE)
    # vLLM's V2 runner imports attn_utils before the model: the guard is decided before the summary is due.
    proc = run_python("import vllm.v1.core.kv_cache_utils, vllm.v1.worker.gpu.attn_utils\n" + IMPORT_ALL + STATUS,
                      path=(REPO, standin))
    rows = last_json(proc.stdout)
    assert rows["kv_view_guard"]["state"] == "failed"
    (summary,) = summary_lines(proc.stderr)
    assert "guards on" not in summary
    assert "problem: " in summary and "failed (kv_view_guard)" in summary
    for state, word in WORDS.items():
        count = sum(row["state"] == state for row in rows.values())
        assert f" {count} {word}" in summary if count else word not in summary, (state, summary)


RETRY = """
import json
errors = []
for attempt in range(2):
    try:
        import vllm.v1.attention.backends.mla.sparse_swa
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
    else:
        errors.append(None)
print(json.dumps(errors))
"""


def test_strict_mode_refuses_every_retried_import_of_a_broken_target(standins):
    proc = run_python(RETRY, path=(REPO, standins["changed signature"]), env={"DSPARK_HOTFIX_STRICT": "1"})
    first, retry = last_json(proc.stdout)
    assert first is not None and first.startswith(f"HotfixError: {SWA}: "), first
    assert retry == first


def launch(tmp_path: Path, *command: str):
    """``python -m dspark_hotfix run -- command...``, from a directory holding nothing."""
    return run_in_env([sys.executable, "-m", "dspark_hotfix", "run", "--", *command],
                      clean_env(PYTHONPATH=str(REPO)), cwd=tmp_path)


def test_run_refuses_an_interpreter_whose_flags_keep_the_shim_out(tmp_path):
    said = "import sys; print('RAN', 'dspark_hotfix' in sys.modules)"
    plain = launch(tmp_path, sys.executable, "-c", said)
    assert plain.returncode == 0 and plain.stdout == "RAN True\n", plain.stderr  # the check itself lets it through
    isolated = launch(tmp_path, sys.executable, "-I", "-c", said)
    assert isolated.returncode == 1 and "RAN" not in isolated.stdout
    assert "would not be active" in isolated.stderr and "-I" in isolated.stderr, isolated.stderr


def test_run_says_when_the_switch_turns_the_hotfix_off_in_the_command(tmp_path):
    command = [sys.executable, "-m", "dspark_hotfix", "run", "--", sys.executable, "-c", "print('ran')"]
    for switch, said in ((None, ""), ("0", "; DSPARK_HOTFIX='0' turns the hotfix off in it")):
        env = clean_env(PYTHONPATH=str(REPO), **({"DSPARK_HOTFIX": switch} if switch else {}))
        proc = run_in_env(command, env, cwd=tmp_path)
        assert proc.returncode == 0 and proc.stdout == "ran\n", proc.stderr
        (line,) = [line for line in proc.stderr.splitlines() if ": running " in line]
        assert line.endswith(f"starts it{said})"), line


def test_run_of_a_command_that_does_not_exist_exits_127(tmp_path):
    proc = launch(tmp_path, "dspark-hotfix-no-such-command-4711")
    assert proc.returncode == 127
    assert "dspark-hotfix-no-such-command-4711: command not found" in proc.stderr
    assert "not a Python program" not in proc.stderr


@pytest.fixture
def shim_log(monkeypatch):
    """The registry's log records in this process, whatever handlers an earlier activation left."""
    monkeypatch.delenv("DSPARK_HOTFIX_STRICT", raising=False)
    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    log = logging.getLogger("dspark_hotfix")
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    try:
        yield records
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def wrapped(replacement, name: str = "t", guards: tuple[str, ...] = (), stops: bool = False):
    """vLLM's function ``f(x) -> ("vllm", x)`` with ``replacement`` wrapped in front, as the registry wraps it."""
    from dspark_hotfix import registry
    from dspark_hotfix.patches import Patch

    patch = Patch(name=name, module="m", qualname="f", parameters=("x",), replacement=replacement, summary=name,
                  guards=guards, stops=stops)
    return registry._wrap(registry.Activation("t"), registry.Record(patch), lambda x: ("vllm", x))


def test_a_replacement_that_never_calls_vllm_returns_its_answer(shim_log):
    assert wrapped(lambda vllm, x: ("shim", x))(1) == ("shim", 1)


def test_a_replacement_that_raises_before_calling_vllm_gives_vllms_answer(shim_log):
    def broken(vllm, x):
        raise ValueError("no layout")

    assert wrapped(broken)(1) == ("vllm", 1)
    (warning,) = [r.getMessage() for r in shim_log if r.levelno >= logging.WARNING]
    assert warning.startswith("t: correction raised ValueError: no layout"), warning


@pytest.mark.parametrize("when", ["before vLLM answers", "after vLLM answers"], ids=["before", "after"])
def test_a_guards_finding_is_logged_as_the_finding(shim_log, when):
    from dspark_hotfix.patches import Finding

    def check(vllm, x):
        if when == "after vLLM answers":
            vllm(x)
        raise Finding("views too narrow")

    assert wrapped(check, guards=(SWA,))(1) == ("vllm", 1)
    (error,) = [r.getMessage() for r in shim_log if r.levelno >= logging.WARNING]
    assert error.startswith("t: views too narrow; swa_kv_cache_spec ") and " raised " not in error, error


def test_kv_view_guards_finding_stops_vllm_worded_as_the_finding(shim_log):
    from dspark_hotfix.patches import Finding
    from dspark_hotfix.registry import HotfixError

    def check(vllm, x):
        vllm(x)
        raise Finding("views too narrow")

    with pytest.raises(HotfixError, match=r"^kv_view_guard: views too narrow; ") as stopped:
        wrapped(check, name="kv_view_guard", guards=(SWA,), stops=True)(1)
    assert " raised " not in str(stopped.value)


# The matrix: every situation, three readers, one state per patch.

SWITCHES = {"unset": {}, "off": {"DSPARK_HOTFIX": "0"}, "bogus": {"DSPARK_HOTFIX": "bogus"}}


def expected_exit(switch: str, build: str, excluded: bool) -> int:
    if switch == "bogus":
        return 1  # a malformed switch is a problem wherever it is
    if build == "fixed":
        return 3
    return 0 if switch == "unset" and build == "buggy" and not excluded else 1


@pytest.mark.parametrize("excluded", [False, True], ids=["all", f"-{SWA}"])
@pytest.mark.parametrize("build", ["buggy", "fixed", "changed signature"], ids=lambda k: k.replace(" ", "-"))
@pytest.mark.parametrize("switch", sorted(SWITCHES))
def test_doctor_status_and_the_hooks_name_the_same_state_and_exit_alike(standins, switch, build, excluded):
    env = {**SWITCHES[switch], **({"DSPARK_HOTFIX_PATCHES": f"-{SWA}"} if excluded else {})}
    path = (STARTUP, standins[build])
    doctor = cli("doctor", "--json", path=path, env=env)
    status = cli("status", "--json", path=path, env=env)
    flagged = cli("status", "--import-targets", "--json", path=path, env=env)  # the flag is a kept no-op
    in_process = {name: row["state"] for name, row in hooks(standins[build], env).items()}
    assert states(report_of(doctor)) == states(report_of(flagged)) == in_process
    assert states(report_of(status)) == in_process
    assert doctor.returncode == flagged.returncode == status.returncode == expected_exit(switch, build, excluded), (
        report_of(doctor)["problems"], report_of(status)["problems"])
