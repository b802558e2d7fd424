"""``dspark-hotfix doctor`` on the start-up paths it reports: which sitecustomize ran, what it
chained, what failed, and output that stays short whatever the environment holds; its verdicts
(needed, switched off, no activation path, no vLLM), from the installed wheel too, and the wrapt
releases it knows.

On the toy patches. What start-up did (the sitecustomize that ran, the interpreter's encoding, the
wheel's own start-up directory, prometheus_client's multiprocess mode) in fresh interpreters; the
rest in this process, as if ours had started it (``as_if_started``)."""

from __future__ import annotations

import json
import os
import sys
from functools import partial
from pathlib import Path

import pytest

from dspark_hotfix.doctor import render
from tests.child import fail, run_cli, say_on_stderr, sitecustomize_file, use_toys
from tests.conftest import (
    REPO,
    STANDIN,
    child,
    clean_env,
    copy_of_shim,
    edited_standin,
    json_lines,
    program,
    run_in_env,
    run_in_venv,
    run_python,
    startup_dir,
)
from tests.reporting.inprocess import STARTUP, as_if_started, build, command, report
from tests.toys import FAREWELL, FIX, GREETING, PLANNER, module_file


def cli(*argv: str) -> str:
    """The ``-c`` code of ``dspark-hotfix *argv`` on the toy patches, in a fresh interpreter."""
    return program(use_toys, partial(run_cli, *argv))


def doctor(cwd: Path, path: tuple[Path | str, ...], *flags: str, **env: str):
    """``dspark-hotfix doctor`` in a fresh interpreter from ``cwd``: the checkout last on PYTHONPATH
    holds the package and the toys (start-up imports the package only where vLLM is imported)."""
    full = clean_env(PYTHONPATH=os.pathsep.join(str(p) for p in (*path, REPO)), **env)
    return run_in_env([sys.executable, "-c", cli("doctor", *flags)], full, cwd=cwd)


def image(root: Path, body: str) -> Path:
    """A directory holding the image's own sitecustomize.py."""
    root.mkdir()
    (root / "sitecustomize.py").write_text(body)
    return root


# Start-up, in fresh interpreters.


def test_doctor_names_the_image_sitecustomize_behind_a_second_copy_of_the_shim(tmp_path):
    # Two copies on PYTHONPATH: ours chains the second, which chains the image's; what that copy
    # chained is what start-up ran, and doctor names it.
    first, second = copy_of_shim(tmp_path / "first"), copy_of_shim(tmp_path / "second")
    theirs = image(tmp_path / "image", program(partial(say_on_stderr, "image sitecustomize ran")))
    path = (first, second, theirs, STANDIN)
    js = doctor(tmp_path, path, "--json")
    assert js.returncode == 0, js.stdout
    assert js.stderr.count("image sitecustomize ran") == 1
    found = json.loads(js.stdout)
    assert found["sitecustomize"]["chained"] == {"file": str(theirs / "sitecustomize.py")}
    # The text is the report rendered (cli.py prints doctor.render(report)); printed, in the test
    # below.
    (line,) = [line for line in render(found).splitlines() if line.startswith("sitecustomize ")]
    assert (
        line == f"sitecustomize ours ({first / 'sitecustomize.py'}), chained"
        f" {theirs / 'sitecustomize.py'}"
    )


def test_doctor_run_from_a_checkout_root_does_not_name_its_own_root_sitecustomize():
    # The checkout root holds sitecustomize.py (a link to ours); `-m` puts the working directory on
    # sys.path after start-up, when nothing chains any more. (`-m` runs the product's patch set:
    # nothing here reads it.)
    proc = child(
        args=("-m", "dspark_hotfix", "doctor", "--json"), path=(STARTUP, STANDIN), cwd=REPO
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not any("working directory" in w for w in report["warnings"]), report["warnings"]
    assert str(REPO / "sitecustomize.py") not in json.dumps(report["sitecustomize"])
    chained = report["sitecustomize"]["chained"]
    assert chained is None or not str(chained.get("file")).startswith(str(REPO)), chained


def test_doctor_reports_an_image_sitecustomize_that_fails_at_every_start(tmp_path):
    broken = image(
        tmp_path / "image", program(partial(fail, "RuntimeError", "image customisation broke"))
    )
    proc = doctor(tmp_path, (STARTUP, broken, STANDIN), "--json")
    found = json.loads(proc.stdout)
    site = found["sitecustomize"]
    assert "Error in sitecustomize" in proc.stderr  # said at start-up, as site says it
    assert site["ours"] and site["chained"] == {
        "error": "RuntimeError: image customisation broke"
    }, site
    text = render(found)
    assert (
        f"sitecustomize ours ({STARTUP / 'sitecustomize.py'}), chained one that failed:"
        " RuntimeError: image customisation broke\n" in text
    ), text


def test_doctor_prints_values_and_paths_that_are_not_utf_8_and_exits_as_its_json_says(tmp_path):
    link = tmp_path / "startup-\udcff"  # one byte 0xff in a name, as the OS gives it
    link.symlink_to(STARTUP, target_is_directory=True)
    env = {"VLLM_PLUGINS": "other,\udcff", "PYTHONIOENCODING": "utf-8"}
    text = doctor(tmp_path, (link, STANDIN), **env)
    report = json.loads(doctor(tmp_path, (link, STANDIN), "--json", **env).stdout)
    assert "Traceback" not in text.stderr, text.stderr[-500:]
    assert (
        "VLLM_PLUGINS='other,\\udcff'" in text.stdout
        and "startup-\\udcff/sitecustomize.py" in text.stdout
    )
    assert text.returncode == report["exit_code"] == 0, report["problems"]


def test_status_leaves_no_series_of_its_own_in_a_servers_multiprocess_directory(tmp_path):
    metrics = tmp_path / "prometheus"
    metrics.mkdir()
    # vLLM imports prometheus_client, as the stand-in does not.
    imports = ("__version__ =", "import prometheus_client\n__version__ =")
    standin = edited_standin(tmp_path / "standin", {"vllm/__init__.py": [imports]})
    proc = run_python(
        cli("status"),
        path=(STARTUP, standin, REPO),
        env={"PROMETHEUS_MULTIPROC_DIR": str(metrics)},
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert list(metrics.iterdir()) == []


# The installed wheel: its own start-up directory, its plugin entry point.


@pytest.fixture
def toys_only(tmp_path) -> Path:
    """A directory that makes the tests' toys importable, and not the checkout's package: the
    wheel's is used."""
    root = tmp_path / "toys"
    root.mkdir()
    (root / "tests").symlink_to(REPO / "tests")
    return root


def test_doctor_json_against_the_standin_says_needed_and_active(venv, toys_only):
    proc = run_in_venv(venv, cli("doctor", "--json"), path=(startup_dir(venv), STANDIN, toys_only))
    report = json.loads(proc.stdout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (report["schema"], report["verdict"], report["exit_code"]) == (2, "fixing", 0)
    assert report["sitecustomize"]["ours"] and report["plugin"]["visible"]
    assert report["sitecustomize"]["file"].startswith(str(venv["root"]))
    # The one that runs without ours: the image's, or a distribution's own ahead of it.
    alone = run_in_venv(venv, program(sitecustomize_file), path=(STANDIN, toys_only))
    assert report["sitecustomize"]["chained"]["file"] == json_lines(alone.stdout)[-1]
    assert {p["name"]: p["needed"] for p in report["patches"]} == {
        GREETING.name: True,
        FAREWELL.name: False,
        PLANNER.name: True,
    }
    greeting = next(p for p in report["patches"] if p["name"] == GREETING.name)
    assert greeting["detail"] == "the toy build greets 'helo, probe'"  # the probe's words


# The verdicts and the output's bounds, in this process.


def test_doctor_output_stays_short_with_hundreds_of_entries_in_every_variable(
    toys, monkeypatch, capsys
):
    as_if_started(monkeypatch)
    monkeypatch.setenv("VLLM_PLUGINS", ",".join(" " * i + "dspark_hotfix" for i in range(1, 301)))
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", ",".join(f"no_such_patch_{i}" for i in range(2000)))
    monkeypatch.setenv(
        "PYTHONPATH",
        os.pathsep.join(map(str, (STARTUP, STANDIN, *(f"relative/{i}" for i in range(300))))),
    )
    (text_code, text), (json_code, js) = (
        command(capsys, "doctor"),
        command(capsys, "doctor", "--json"),
    )
    assert text_code == json_code == 1  # the spaced entries keep vLLM from loading the plugin
    assert len(text) < 6000 and len(js) < 8000, (len(text), len(js))
    report = json.loads(js)
    (spaced,) = report["problems"]
    assert spaced.startswith("VLLM_PLUGINS=")
    assert "'  dspark_hotfix', '   dspark_hotfix', ... (297 more) with the spaces" in spaced
    (relative,) = [w for w in report["warnings"] if "working directory" in w]
    assert relative.endswith("'relative/0', 'relative/1', 'relative/2', ... (297 more)")
    assert report["plugin"]["vllm_plugins"].endswith(
        f"... ({len(os.environ['VLLM_PLUGINS'])} characters)"
    )


@pytest.mark.parametrize(
    "version, supported",
    [
        ("1.17.3", True),
        ("1.17.0", True),
        ("2.0.0", True),
        ("2.5.2", True),
        ("2.10.1rc1", True),
        ("1.16.0", False),
        ("1.10.11", False),
        ("3.0.0", False),
        ("nightly", False),
    ],
)
def test_wrapt_releases_outside_the_tested_ones_are_named(version, supported):
    from dspark_hotfix.doctor import wrapt_supported

    assert wrapt_supported(version) is supported


def test_doctor_names_a_wrapt_outside_the_tested_releases(toys, monkeypatch, capsys, tmp_path):
    # An image that brings its own wrapt keeps it (the Dockerfile installs one only where
    # there is none); doctor, a build step there, fails on one the shim is not tested with.
    version = "1.10.11"
    dist = tmp_path / f"wrapt-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: wrapt\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    as_if_started(monkeypatch)
    code, out = report(capsys, "doctor")
    assert code == 1 and out["versions"]["wrapt"] == version
    assert out["problems"] == [
        f"wrapt {version} is not one the shim is tested with (1.17 to 2.x): install e.g."
        " wrapt==1.17.3"
    ]


def test_doctor_fails_when_the_fix_is_needed_but_switched_off(toys, monkeypatch, capsys):
    as_if_started(monkeypatch)
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    code, out = command(capsys, "doctor")
    assert code == 1
    assert (
        f"PROBLEM       {GREETING.name}, {PLANNER.name} needed but DSPARK_HOTFIX='0' turns the"
        " shim off" in out
    )


@pytest.mark.parametrize("vllm", ["imports", "does not import"])
@pytest.mark.parametrize("name", ["doctor", "status"])
def test_with_the_shim_off_nothing_activated_it_whether_or_not_vllm_imports(
    toys, monkeypatch, capsys, vllm, name
):
    # Each command judges the patches in its own process, with the shim off too: that is no
    # activation.
    as_if_started(monkeypatch)
    monkeypatch.setenv("DSPARK_HOTFIX", "0")
    if vllm == "does not import":
        monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(STANDIN)])
    _, out = report(capsys, name)
    assert out["activated_by"] is None and out["enabled"] is False
    _, text = command(capsys, name)
    assert text.splitlines()[0].startswith(
        "activated by  nothing: DSPARK_HOTFIX turns the shim off (pid "
    ), text


def test_doctor_fails_without_any_activation_path(toys, monkeypatch, capsys):
    # No sitecustomize ran in this process, and VLLM_PLUGINS allows no plugin.
    monkeypatch.delitem(sys.modules, "sitecustomize", raising=False)
    monkeypatch.setenv("VLLM_PLUGINS", "")
    code, out = report(capsys, "doctor")
    assert code == 1 and out["verdict"] == "problem"
    assert any(p.startswith("no activation path") for p in out["problems"]), out["problems"]


def test_doctor_fails_without_vllm(toys, monkeypatch, capsys):
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(STANDIN)])
    as_if_started(monkeypatch)
    code, out = report(capsys, "doctor")
    assert code == 1
    assert f"vLLM cannot be imported by {sys.executable}" in out["problems"][0]


def test_doctor_warns_about_the_working_directory_on_the_path(toys, monkeypatch, capsys):
    as_if_started(monkeypatch)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(STARTUP), str(STANDIN), "", "relative/dir", str(REPO)])
    )
    code, out = report(capsys, "doctor")
    assert code == 0  # warnings do not change the verdict
    assert [w for w in out["warnings"] if w.startswith("PYTHONPATH ")] == [
        "PYTHONPATH has entries that depend on the working directory (an empty one is the working"
        " directory itself; `dspark-hotfix run` drops them, and ${PYTHONPATH:+:$PYTHONPATH} adds"
        " none when extending it): '', 'relative/dir'"
    ]


def test_guarding_names_the_setting_its_stop_is_for(toys, monkeypatch, capsys, tmp_path):
    # A build like a release: the greeting's bug fixed upstream, the farewell's left off; the stop
    # is patched.
    build(tmp_path, monkeypatch, {module_file(GREETING): FIX[GREETING.name]})
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{FAREWELL.name}")
    code, out = command(capsys, "status")
    guards = [line for line in out.splitlines() if line.startswith("guards ")]
    assert code == 0 and "verdict       guarding" in out, out
    # What the stop stops: the first paragraph of its step's docstring.
    assert guards == [
        f"guards        {PLANNER.name}: Stops the toy planner with compact on; remove the shim"
        " where no deployment uses that"
    ]


def test_doctor_judges_a_named_drafts_quantization_only_where_given_the_model(
    toys, monkeypatch, capsys, tmp_path
):
    # vllm#51916 lives in vLLM's SpeculativeConfig, which reads the checkpoint's config.json: no
    # patch can tell without it, and doctor says so. With --model it asks vLLM's own config, which
    # the stand-in lacks: it says why it could not judge (the judged cases are the real tier's:
    # tests/real_vllm/test_releases.py).
    as_if_started(monkeypatch)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # doctor --model sets it where unset
    code, text = command(capsys, "doctor")
    assert "draft         named, not judged: doctor --model DIR judges it" in text.splitlines()
    assert report(capsys, "doctor")[1]["draft"] is None
    with_model, out = command(capsys, "doctor", "--json", "--model", str(tmp_path))
    draft = json.loads(out)["draft"]
    assert draft == {"model": str(tmp_path), "error": draft["error"]}
    assert draft["error"].startswith("ModuleNotFoundError: No module named 'vllm.config'"), draft
    assert with_model == code  # the verdict is the shim's: a draft it cannot judge is no problem
