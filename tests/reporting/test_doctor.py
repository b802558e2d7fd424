"""``dspark-hotfix doctor`` on the start-up paths it reports: which sitecustomize ran, what it
chained, what failed, and output that stays short whatever the environment holds; its verdicts from the
installed wheel (needed, switched off, no activation path, no vLLM) and the wrapt releases it knows."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.cases import PATCHES, SWA
from tests.conftest import (
    REPO,
    STANDIN,
    child,
    clean_env,
    copy_of_shim,
    edited_standin,
    run_in_env,
    run_in_venv,
    run_python,
    startup_dir,
)

STARTUP = REPO / "dspark_hotfix" / "startup"


def doctor(cwd: Path, path: tuple[Path | str, ...], *flags: str, **env: str):
    """``python -m dspark_hotfix doctor`` from ``cwd``: the checkout last on PYTHONPATH holds the package
    (start-up imports it only where vLLM is imported)."""
    full = clean_env(PYTHONPATH=os.pathsep.join(str(p) for p in (*path, REPO)), **env)
    return run_in_env([sys.executable, "-m", "dspark_hotfix", "doctor", *flags], full, cwd=cwd)


def image(root: Path, body: str) -> Path:
    """A directory holding the image's own sitecustomize.py."""
    root.mkdir()
    (root / "sitecustomize.py").write_text(body)
    return root


def test_doctor_names_the_image_sitecustomize_behind_a_second_copy_of_the_shim(tmp_path):
    # Two copies on PYTHONPATH: ours chains the second, which chains the image's; what that copy
    # chained is what start-up ran, and doctor names it.
    first, second = copy_of_shim(tmp_path / "first"), copy_of_shim(tmp_path / "second")
    theirs = image(tmp_path / "image", "import sys; sys.stderr.write('image sitecustomize ran\\n')\n")
    path = (first, second, theirs, STANDIN)
    text, js = doctor(tmp_path, path), doctor(tmp_path, path, "--json")
    assert text.returncode == js.returncode == 0, text.stdout
    assert js.stderr.count("image sitecustomize ran") == 1
    (line,) = [line for line in text.stdout.splitlines() if line.startswith("sitecustomize ")]
    assert line == f"sitecustomize ours ({first / 'sitecustomize.py'}), chained {theirs / 'sitecustomize.py'}"
    assert json.loads(js.stdout)["sitecustomize"]["chained"] == {"file": str(theirs / "sitecustomize.py")}


def test_doctor_output_stays_short_with_hundreds_of_entries_in_every_variable(tmp_path):
    env = {"VLLM_PLUGINS": ",".join(" " * i + "dspark_hotfix" for i in range(1, 301)),
           "DSPARK_HOTFIX_PATCHES": ",".join(f"no_such_patch_{i}" for i in range(2000))}
    path = (STARTUP, STANDIN, *(f"relative/{i}" for i in range(300)))
    text, js = doctor(tmp_path, path, **env), doctor(tmp_path, path, "--json", **env)
    assert text.returncode == js.returncode == 1  # the spaced entries keep vLLM from loading the plugin
    assert len(text.stdout) < 6000 and len(js.stdout) < 8000, (len(text.stdout), len(js.stdout))
    report = json.loads(js.stdout)
    (spaced,) = [p for p in report["problems"] if p.startswith("VLLM_PLUGINS=")]
    assert "'  dspark_hotfix', '   dspark_hotfix', ... (297 more) with the spaces" in spaced
    (relative,) = [w for w in report["warnings"] if "working directory" in w]
    assert relative.endswith("'relative/0', 'relative/1', 'relative/2', ... (297 more)")
    assert report["plugin"]["vllm_plugins"].endswith(f"... ({len(env['VLLM_PLUGINS'])} characters)")


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


# doctor names the sitecustomize that chain() imported at start-up.

DOCTOR = "from dspark_hotfix import cli; raise SystemExit(cli.main(['doctor', '--json']))"


def test_doctor_run_from_a_checkout_root_does_not_name_its_own_root_sitecustomize():
    # The checkout root holds sitecustomize.py (a link to ours); `-m` puts the working directory on sys.path
    # after start-up, when nothing chains any more.
    proc = child(args=("-m", "dspark_hotfix", "doctor", "--json"), path=(STARTUP, STANDIN), cwd=REPO)
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any("working directory" in w for w in report["warnings"]), report["warnings"]
    assert str(REPO / "sitecustomize.py") not in json.dumps(report["sitecustomize"])
    chained = report["sitecustomize"]["chained"]
    assert chained is None or not str(chained.get("file")).startswith(str(REPO)), chained


def test_doctor_reports_an_image_sitecustomize_that_fails_at_every_start(tmp_path):
    broken = image(tmp_path / "image", "raise RuntimeError('image customisation broke')\n")
    proc = child(DOCTOR, path=(STARTUP, broken, STANDIN, REPO), cwd=tmp_path)
    site = json.loads(proc.stdout)["sitecustomize"]
    assert "Error in sitecustomize" in proc.stderr  # said at start-up, as site says it
    assert site["ours"] and site["chained"] == {"error": "RuntimeError: image customisation broke"}, site
    text = doctor(tmp_path, (STARTUP, broken, STANDIN)).stdout
    assert f"sitecustomize ours ({STARTUP / 'sitecustomize.py'}), chained one that failed: RuntimeError: image " \
           "customisation broke\n" in text, text


def test_doctor_json_against_the_standin_says_needed_and_active(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=(startup_dir(venv), STANDIN))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout
    assert (report["schema"], report["verdict"], report["exit_code"]) == (2, "fixing", 0)
    assert report["sitecustomize"]["ours"] and report["plugin"]["visible"]
    assert report["sitecustomize"]["chained"]["file"].startswith(str(venv["purelib"]))
    assert {p["name"]: p["needed"] for p in report["patches"]} == dict.fromkeys(PATCHES, True)
    swa = next(p for p in report["patches"] if p["name"] == SWA.name)
    assert swa["detail"] == "needed (vLLM returns 512 bytes/token for fp8_ds_mla; shim gives 584)"


def test_doctor_fails_when_the_fix_is_needed_but_switched_off(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor"), path=(startup_dir(venv), STANDIN), DSPARK_HOTFIX="0")
    assert proc.returncode == 1
    assert f"PROBLEM       {', '.join(PATCHES)} needed but DSPARK_HOTFIX='0' turns the shim off" in proc.stdout


def test_doctor_fails_without_any_activation_path(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"), path=(STANDIN,), VLLM_PLUGINS="")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["verdict"] == "problem"
    assert any(p.startswith("no activation path") for p in report["problems"])


def test_doctor_fails_without_vllm(venv):
    proc = run_in_venv(venv, args=("dspark-hotfix", "doctor", "--json"))
    assert proc.returncode == 1
    assert f"vLLM cannot be imported by {venv['python']}" in json.loads(proc.stdout)["problems"][0]


CLI = "import sys; from dspark_hotfix.cli import main; sys.exit(main(sys.argv[1:]))"


def cli(*args: str, path=(STARTUP, STANDIN), **kwargs):
    return run_python(f"import sys; sys.argv[1:] = {list(args)!r}\n" + CLI, path=path, check=False, **kwargs)


def test_doctor_warns_about_the_working_directory_on_the_path(tmp_path):
    proc = cli("doctor", "--json", path=(STARTUP, STANDIN, "", "relative/dir", REPO), cwd=tmp_path)
    warnings = json.loads(proc.stdout)["warnings"]
    assert proc.returncode == 0  # warnings do not change the verdict
    assert [w for w in warnings if w.startswith("PYTHONPATH ")] == [
        "PYTHONPATH has entries that depend on the working directory (an empty one is the working directory itself; "
        "`dspark-hotfix run` drops them, and ${PYTHONPATH:+:$PYTHONPATH} adds none when extending it): "
        "'', 'relative/dir'"]


def test_doctor_prints_values_and_paths_that_are_not_utf_8_and_exits_as_its_json_says(tmp_path):
    link = tmp_path / "startup-\udcff"  # one byte 0xff in a name, as the OS gives it
    link.symlink_to(STARTUP, target_is_directory=True)
    env = {"VLLM_PLUGINS": "other,\udcff", "PYTHONIOENCODING": "utf-8"}
    text = doctor(tmp_path, (link, STANDIN), **env)
    report = json.loads(doctor(tmp_path, (link, STANDIN), "--json", **env).stdout)
    assert "Traceback" not in text.stderr, text.stderr[-500:]
    assert "VLLM_PLUGINS='other,\\udcff'" in text.stdout and "startup-\\udcff/sitecustomize.py" in text.stdout
    assert text.returncode == report["exit_code"] == 0, report["problems"]


def test_status_leaves_no_series_of_its_own_in_a_servers_multiprocess_directory(tmp_path):
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    # vLLM imports prometheus_client, as the stand-in does not.
    imports = ("__version__ =", "import prometheus_client\n__version__ =")
    standin = edited_standin(tmp_path / "standin", {"vllm/__init__.py": [imports]})
    proc = run_python("import sys; from dspark_hotfix.cli import main; sys.exit(main(['status']))",
                      path=(STARTUP, standin), env={"PROMETHEUS_MULTIPROC_DIR": str(metrics)}, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(metrics.iterdir()) == []
