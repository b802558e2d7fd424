"""The sitecustomize path in real subprocesses: PYTHONPATH activation, chaining the image's own
sitecustomize (shadowed, raising, adding to sys.path, importing vLLM), two copies of the shim, the
start-up directory through a link or beside the checkout root, and an interpreter that cannot import
the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from functools import partial

import pytest

from dspark_hotfix import __version__
from tests.activation.children import JUDGED, JUDGED_LINE, USE_LAST, WRAPPED
from tests.child import (
    environ,
    fail,
    import_toy_targets,
    package_file,
    path_first,
    print_status,
    run_cli,
    say_on_stderr,
    set_environ,
    sys_path,
    use_toys,
    watchers,
    wrap_depths,
)
from tests.conftest import (
    REPO,
    STANDIN,
    child,
    copy_of_shim,
    edited_standin,
    json_lines,
    last_json,
    program,
    run_python,
    summary_lines,
    warning_lines,
)
from tests.toys import GREETING, NAMES
from tests.toys import TOYS as TOY_PATCHES

TOYS = (
    use_toys,
    import_toy_targets,
)  # a child's first steps: the toys as its patch set, their targets imported


def test_pythonpath_activation_patches_every_target_on_import():
    proc = run_python(program(*TOYS, print_status))
    rows = last_json(proc.stdout)
    assert {n: rows[n]["state"] for n in NAMES} == JUDGED
    assert all(rows[n]["activated_by"] == "sitecustomize" for n in NAMES)
    # One line for the process, in vLLM's format, and nothing else at the default level.
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("INFO ")
    (summary,) = summary_lines(proc.stderr)
    pid = rows[NAMES[0]]["pid"]  # every row carries the process's pid
    assert summary == f"dspark_hotfix {__version__} (pid {pid}) via sitecustomize: {JUDGED_LINE}"


def test_shadowed_sitecustomize_runs_exactly_once(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        program(
            partial(say_on_stderr, "shadowed sitecustomize ran"),
            partial(set_environ, "SHADOWED", "1"),
        )
    )
    proc = run_python(
        program(*TOYS, print_status, partial(environ, "SHADOWED")), path=(REPO, STANDIN, other)
    )
    assert proc.stderr.count("shadowed sitecustomize ran") == 1
    rows, shadowed = json_lines(proc.stdout)
    assert shadowed == "1" and rows[GREETING.name]["state"] == "patched"


def test_a_raising_shadowed_sitecustomize_is_reported_like_site_does(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        program(partial(fail, "ValueError", "broken image customisation"))
    )
    proc = run_python(program(*TOYS, print_status), path=(REPO, STANDIN, other))
    assert (
        "Error in sitecustomize (chained by dspark_hotfix):\nValueError: broken image"
        in proc.stderr
    )
    assert last_json(proc.stdout)[GREETING.name]["state"] == "patched"


STARTUP = REPO / "dspark_hotfix" / "startup"


# Ours boots once, whatever alias of its start-up directory is on the path.


def ours(file: str | None) -> bool:
    return file is not None and os.path.realpath(file) == os.path.realpath(
        STARTUP / "sitecustomize.py"
    )


def sitecustomize_runs(verbose_stderr: str) -> list[str]:
    """The real path of each sitecustomize ``python -v`` says it executed, in order: ours, and a
    distribution's own (Debian's, Ubuntu's) that ours chains. ``-v`` names the file a module's code
    comes from, its source or its cached bytecode."""
    runs = []
    for line in verbose_stderr.splitlines():
        if not line.startswith("# code object from "):
            continue
        path = line.removeprefix("# code object from ").strip("'")
        if os.path.basename(path).startswith("sitecustomize."):
            if os.path.basename(os.path.dirname(path)) == "__pycache__":
                path = os.path.join(os.path.dirname(os.path.dirname(path)), "sitecustomize.py")
            runs.append(os.path.realpath(path))
    return runs


def test_the_start_up_directory_through_a_link_and_its_real_path_boots_ours_once(tmp_path):
    link = tmp_path / "link"
    link.symlink_to(STARTUP, target_is_directory=True)
    code = program(
        USE_LAST, import_toy_targets, print_status, partial(environ, "PYTHONPATH"), watchers
    )
    proc = child(
        args=("-m", "dspark_hotfix", "run", "--", sys.executable, "-v", "-c", code),
        path=(link, STANDIN),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows, launched_path, watching = json_lines(proc.stdout)
    # Both aliases reach the command (ours first); chain() takes the link off sys.path while it
    # imports.
    assert launched_path.split(os.pathsep) == [str(STARTUP), str(link), str(STANDIN)]
    # `python -v` says each module it executes: our sitecustomize once, no second copy chained
    # through the link.
    runs = sitecustomize_runs(proc.stderr)
    assert [ours(file) for file in runs].count(True) == 1, runs
    assert len(runs) == len(set(runs)), runs
    assert watching == 1
    assert {name: row["state"] for name, row in rows.items()} == JUDGED
    assert len(summary_lines(proc.stderr)) == 1


def test_the_checkout_root_and_the_start_up_directory_both_on_pythonpath_boot_ours_once():
    # `dspark-hotfix run` from an environment whose PYTHONPATH holds the checkout root (a documented
    # way to deploy it): the launcher puts the start-up directory first and keeps the root.
    code = program(use_toys, partial(run_cli, "doctor", "--json"))
    proc = child(
        args=("-m", "dspark_hotfix", "run", "--", sys.executable, "-v", "-c", code),
        path=(REPO, STANDIN),
        cwd=STANDIN,
    )
    report = json.loads(proc.stdout)
    assert not ours((report["sitecustomize"]["chained"] or {}).get("file")), report["sitecustomize"]
    runs = sitecustomize_runs(proc.stderr)
    assert [ours(file) for file in runs].count(True) == 1, runs
    assert len(runs) == len(set(runs)), runs


def path_last(entry: str) -> None:
    import sys

    sys.path.append(entry)


def image_ran() -> None:
    print("image sitecustomize ran")


@pytest.fixture
def shadowed(tmp_path):
    def make(body: str):
        other = tmp_path / "image"
        other.mkdir()
        (other / "sitecustomize.py").write_text(body)
        return other

    return make


def test_a_shadowed_sitecustomize_that_imports_vllm_gets_it_patched(shadowed):
    # The image's customisation runs at start-up, before the child's code (and without the checkout
    # on sys.path: chain() takes ours off while it imports): the toys are its patch set there.
    other = shadowed(
        program(
            USE_LAST,
            import_toy_targets,
            partial(say_on_stderr, "image customisation imported vllm"),
        )
    )
    proc = run_python(
        program(import_toy_targets, wrap_depths, print_status), path=(REPO, STANDIN, other)
    )
    depth, rows = json_lines(proc.stdout)
    assert "image customisation imported vllm" in proc.stderr
    assert depth == WRAPPED and {n: r["state"] for n, r in rows.items()} == JUDGED


def test_sys_path_entries_a_shadowed_sitecustomize_adds_are_kept(shadowed, tmp_path):
    other = shadowed(
        program(partial(path_first, ["/opt/image/first"]), partial(path_last, "/opt/image/extra"))
    )
    code = program(sys_path)
    with_shim = last_json(run_python(code, path=(REPO, STANDIN, other), cwd=tmp_path).stdout)
    without = last_json(run_python(code, path=(STANDIN, other), cwd=tmp_path).stdout)
    assert "/opt/image/extra" in with_shim and "/opt/image/first" in with_shim
    assert [p for p in with_shim if p != str(REPO)] == without


@pytest.mark.parametrize("order", ["repo-first", "copy-first"])
def test_two_copies_of_the_shim_on_the_path_patch_once(tmp_path, order):
    copy = copy_of_shim(tmp_path / "copy")
    shims = (REPO, copy) if order == "repo-first" else (copy, REPO)
    # The child's use_toys imports the package before vLLM does, from the first copy on the path
    # (the working directory is neither), as the start-up hook would at vLLM's import.
    code = program(watchers, *TOYS, wrap_depths, print_status, package_file)
    proc = run_python(code, path=(*shims, STANDIN), cwd=tmp_path)
    watching, depth, rows, package = json_lines(proc.stdout)
    assert watching == 1  # the second copy's start-up found the first one's watcher
    assert depth == WRAPPED and {n: r["state"] for n, r in rows.items()} == JUDGED
    assert len(summary_lines(proc.stderr)) == 1
    assert package.startswith(str(shims[0]))  # the first copy wins; the second only chains
    assert warning_lines(proc.stderr) == [] and "Error in sitecustomize" not in proc.stderr


def test_an_interpreter_that_cannot_import_the_package_is_named_with_the_install_command(tmp_path):
    # The start-up directory on PYTHONPATH, but no package beside it or installed: a
    # wrong interpreter, say. vLLM's import goes on; the line names the interpreter and the fix.
    lonely = tmp_path / "a" / "b" / "c"
    lonely.mkdir(parents=True)
    shutil.copy(
        REPO / "dspark_hotfix" / "startup" / "sitecustomize.py", lonely / "sitecustomize.py"
    )
    proc = run_python(program(import_vllm), path=(lonely, STANDIN), cwd=tmp_path)
    assert proc.stdout.strip() == "vllm imported"
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"dspark_hotfix: not active: {sys.executable} cannot import the package")
    assert line.endswith(
        "install it into this interpreter from a checkout or a wheel: "
        f"{sys.executable} -m pip install PATH"
    )


def test_a_sourceless_install_chains_the_image_sitecustomize_once(tmp_path, shadowed):
    # Slim images compile to legacy .pyc files (compileall -b) and delete the sources.
    shim = copy_of_shim(tmp_path / "shim")
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-b", str(shim)], check=True)
    for source in shim.rglob("*.py"):
        source.unlink()
    other = shadowed(program(image_ran))
    proc = run_python(
        program(watchers), path=(shim / "dspark_hotfix" / "startup", other), check=False
    )
    assert proc.returncode == 0 and "RecursionError" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["image sitecustomize ran", "1"]


def import_vllm() -> None:
    import vllm  # noqa: F401

    print("vllm imported")


def import_first(module: str) -> dict[str, bool]:
    """``module`` imported as the process's first of vLLM's, and whether vLLM's package had run
    when the module began."""
    import importlib
    import sys

    importlib.import_module(module)
    return {"package_first": sys.modules[module].PACKAGE_RAN_FIRST}


@pytest.mark.parametrize("switch", ["1", "0"])
@pytest.mark.parametrize("target", sorted({toy.module for toy in TOY_PATCHES}))
def test_a_target_imported_first_runs_after_vllms_package_as_without_the_shim(
    tmp_path, target, switch
):
    # vLLM's package sets the process up before any of its modules runs (vllm.env_override): an
    # import of a target module as a process's first of vLLM's must not run it ahead of the
    # package, which the import system imports first.
    ran = "PACKAGE_RAN = True\n"
    first = "import vllm\nPACKAGE_RAN_FIRST = getattr(vllm, 'PACKAGE_RAN', False)\n"
    target_file = target.replace(".", "/") + ".py"
    standin = edited_standin(tmp_path / "standin", {})
    (standin / "vllm" / "__init__.py").write_text(
        (standin / "vllm" / "__init__.py").read_text() + ran
    )
    (standin / target_file).write_text(first + (standin / target_file).read_text())
    proc = run_python(
        program(partial(use_toys, str(REPO)), partial(import_first, target)),
        path=(STARTUP, standin),
        env={"DSPARK_HOTFIX": switch},
    )
    assert json_lines(proc.stdout)[-1] == {"package_first": True}, proc.stderr
