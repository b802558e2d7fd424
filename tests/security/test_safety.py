"""What the shim does not do, proved in real subprocesses: run files from the
working directory, evaluate the environment, extend ``sys.path``, write
anything but stderr, open sockets or start processes, load anything but the
standard library at start-up, or touch a vLLM that is already right. The
promises of SECURITY.md; switch values never evaluated are in
tests/switches/test_config.py.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import re
import runpy
import sys
import sysconfig
from functools import partial
from typing import Any

import pytest

from tests.activation.children import AS_SHIPPED, JUDGED, UNWRAPPED, USE_LAST
from tests.child import (
    fail,
    import_toy_targets,
    print_status,
    toy_calls,
    use_toys,
    watchers,
    wrap_depths,
)
from tests.conftest import (
    REPO,
    STANDIN,
    clean_env,
    edited_standin,
    json_lines,
    last_json,
    listing,
    program,
    run_in_env,
    run_python,
    summary_lines,
    warning_lines,
)
from tests.toys import NAMES, TOYS, fixed, module_file

STATUS = program(
    use_toys, import_toy_targets, print_status
)  # a child's status() on the toys, their targets imported

LOG_LINE = re.compile(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[dspark_hotfix\] ")
SWITCHES = ("DSPARK_HOTFIX", "DSPARK_HOTFIX_PATCHES", "DSPARK_HOTFIX_STRICT")


def announce(mark: str, name: str) -> None:
    """A decoy's body: it leaves ``mark`` and says so."""
    with open(mark, "w"):
        pass
    print(f"DECOY {name}")


@pytest.fixture
def decoy_cwd(tmp_path):
    """A working directory whose files would announce themselves if anything imported them."""
    cwd, marks = tmp_path / "cwd", tmp_path / "marks"
    cwd.mkdir()
    marks.mkdir()

    def decoy(name: str, *then: partial) -> str:
        return program(partial(announce, str(marks / name), name), *then)

    refuse = partial(fail, "ImportError", "decoy")
    (cwd / "dspark_hotfix").mkdir()
    (cwd / "dspark_hotfix" / "__init__.py").write_text(decoy("dspark_hotfix", refuse))
    (cwd / "dspark_hotfix" / "hooks.py").write_text(decoy("hooks"))
    (cwd / "wrapt.py").write_text(decoy("wrapt", refuse))
    (cwd / "sitecustomize.py").write_text(decoy("sitecustomize"))
    (cwd / "usercustomize.py").write_text(decoy("usercustomize"))
    return cwd, marks


@pytest.mark.parametrize(
    "how", ["python -c, vLLM never imported", "python prog.py", "PYTHONSAFEPATH=1 python -c"]
)
def test_nothing_in_the_working_directory_is_read_or_run(decoy_cwd, tmp_path, how):
    # With -c (and -m) the interpreter itself puts the cwd first on sys.path once
    # start-up is over: start-up must not look there, and whatever imports vLLM
    # later resolves like vLLM's own imports do (SECURITY.md).
    cwd, marks = decoy_cwd
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(STANDIN)]))
    if (
        how == "python -c, vLLM never imported"
    ):  # the shim watches; the child reads no package of ours
        argv, imports = [sys.executable, "-c", program(watchers)], False
    elif how == "python prog.py":
        prog = tmp_path / "bin" / "prog.py"
        prog.parent.mkdir()
        prog.write_text(STATUS)
        argv, imports = [sys.executable, str(prog)], True
    else:
        env["PYTHONSAFEPATH"] = "1"
        argv, imports = [sys.executable, "-c", STATUS], True
    proc = run_in_env(argv, env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert list(marks.iterdir()) == [] and "DECOY" not in proc.stdout + proc.stderr
    if imports:
        assert {n: r["state"] for n, r in last_json(proc.stdout).items()} == JUDGED
    else:
        assert proc.stdout == "1\n"  # one watcher of the shim's


def path_and_hooks() -> list[list[str]]:
    import sys

    return [list(sys.path), [getattr(h, "__qualname__", "") for h in sys.path_hooks]]


def path_without(entry: str) -> None:
    import sys

    sys.path.remove(entry)


def test_the_shim_adds_nothing_to_sys_path(tmp_path):
    # Without the shim on PYTHONPATH the toys come from the checkout appended last, then taken off
    # again.
    code = program(
        path_and_hooks,
        USE_LAST,
        partial(path_without, str(REPO)),
        import_toy_targets,
        path_and_hooks,
    )

    def paths(**kwargs):
        return json_lines(run_python(code, cwd=tmp_path, **kwargs).stdout)

    on, off, absent = paths(), paths(env={"DSPARK_HOTFIX": "0"}), paths(path=(STANDIN,))
    assert on == off  # before and after vLLM is imported
    for (with_shim, hooks), (without, hooks_without) in zip(on, absent, strict=True):
        assert [p for p in with_shim if p != str(REPO)] == without and hooks == hooks_without


def test_a_silent_process_writes_nothing_to_stdout_and_creates_no_files(tmp_path):
    dirs = {name: tmp_path / name for name in ("cwd", "home", "tmp")}
    for d in dirs.values():
        d.mkdir()
    env = {"HOME": str(dirs["home"]), "TMPDIR": str(dirs["tmp"])}
    quiet = run_python(program(), cwd=dirs["cwd"], env=env)
    busy = run_python(
        program(use_toys, work_silently, helpers=(toy_calls,)), cwd=dirs["cwd"], env=env
    )
    assert quiet.stdout == quiet.stderr == ""
    assert busy.stdout == ""
    lines = busy.stderr.splitlines()
    assert lines and all(LOG_LINE.match(line) for line in lines)  # its log goes to stderr
    assert all(listing(d) == {} for d in dirs.values())


def work_silently() -> None:
    """Every toy target imported and called (tests.child.toy_calls, a helper), and status() read,
    printing nothing."""
    import dspark_hotfix

    toy_calls()
    dspark_hotfix.status()


def audited() -> list[list[Any]]:
    """What start-up (run by this step: the child starts with -S) and then the shim's work on the
    toys did that the audit hooks see, each event with its phase: ``start-up``, ``toys`` (the tests'
    own module read), ``vllm``."""
    import sys

    events: list[list[Any]] = []
    phase = ["start-up"]
    watch = (
        "open",
        "compile",
        "socket.",
        "subprocess.",
        "os.system",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.fork",
        "os.kill",
        "urllib.",
        "http.",
        "ftplib.",
        "smtplib.",
        "ctypes.",
        "os.putenv",
        "os.unsetenv",
        "os.chdir",
        "os.mkdir",
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "os.symlink",
        "os.link",
        "os.utime",
        "shutil.",
        "tempfile.",
    )

    def audit(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith(watch):
            events.append(
                [
                    phase[0],
                    event,
                    *(
                        a if isinstance(a, (str, int, type(None))) else repr(a)[:300]
                        for a in args[:3]
                    ),
                ]
            )

    sys.addaudithook(audit)
    import site  # -S held it back: run it now, audited, exactly as interpreter start does

    site.main()
    phase[0] = "toys"
    import tests.toys

    tests.toys.use()
    phase[0] = "vllm"
    work_silently()
    return list(events)  # a copy: the hook goes on seeing what the child does after


def test_start_up_and_patching_open_no_socket_start_no_process_and_write_nothing(
    decoy_cwd, tmp_path
):
    cwd, marks = decoy_cwd
    home = tmp_path / "home"
    home.mkdir()
    secret = "DSPARK-PAYLOAD-f00d"
    # DSPARK_HOTFIX is left alone: a value not understood turns the shim off (test above).
    env = {
        var: f"__import__('os').system('touch {marks / var}') # {secret}" for var in SWITCHES[1:]
    }
    # The toys are the patch set: their own module is the tests', read in a phase of its own.
    code = program(audited, helpers=(work_silently, toy_calls))
    proc = run_python(code, flags=("-S", "-P", "-B"), cwd=cwd, env={**env, "HOME": str(home)})
    events = last_json(proc.stdout)
    assert {e[0] for e in events} == {"start-up", "toys", "vllm"}  # the hook saw every phase
    assert [
        e for e in events if e[1] not in ("open", "compile")
    ] == []  # no socket, process, env or fs change
    ours = (
        str(REPO / "dspark_hotfix"),
        str(REPO / "sitecustomize.py"),
        str(REPO / "__pycache__" / "sitecustomize."),
    )
    allowed = (*ours, str(STANDIN), sysconfig.get_paths()["stdlib"], sys.prefix, sys.base_prefix)
    for phase, _, path, mode, flags in (e for e in events if e[1] == "open"):
        if isinstance(path, str):
            toys = (
                str(REPO / "tests" / "__init__.py"),
                str(REPO / "tests" / "toys.py"),
                str(REPO / "tests" / "__pycache__" / "__init__."),
                str(REPO / "tests" / "__pycache__" / "toys."),
            )
            assert path.startswith(allowed + (toys if phase == "toys" else ())), path
            assert not path.startswith((str(cwd), str(home))), path
        assert mode is None or not set(str(mode)) & set("wax+"), (path, mode)
        if mode is None and isinstance(flags, int):
            assert not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT), (path, flags)
    assert not [
        e for e in events if e[1] == "compile" and secret in str(e[2])
    ]  # no switch value compiled
    assert list(marks.iterdir()) == []
    assert len(warning_lines(proc.stderr)) == len(SWITCHES) - 1


def test_start_up_loads_only_the_standard_library_and_the_start_up_module():
    # Until a vLLM module is imported: other imports (here a package's submodule) leave the shim
    # asleep.
    with_shim = last_json(run_python(program(module_files)).stdout)
    without = last_json(run_python(program(module_files), path=(STANDIN,)).stdout)
    stdlib = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
    ours = (str(REPO / "dspark_hotfix") + os.sep, str(REPO / "sitecustomize.py"))
    added = {name: path for name, path in with_shim.items() if name not in without}
    # The shim did start. A distribution's own sitecustomize (Debian's, Ubuntu's) is loaded in both
    # processes, under the same name: in this one ours chained it.
    added["sitecustomize"] = with_shim.get("sitecustomize")
    assert added["sitecustomize"] == str(REPO / "sitecustomize.py")
    for name, path in added.items():
        assert path is None or path.startswith(stdlib) or path.startswith(ours), (name, path)
    assert [n for n, p in added.items() if p and p.startswith(ours)] == ["sitecustomize"]


def module_files() -> dict[str, str | None]:
    """Each module's file, once a package's submodule is imported (no vLLM module: the shim stays
    asleep)."""
    import sys
    import xml.dom.minidom  # noqa: F401

    return {n: getattr(m, "__file__", None) for n, m in sys.modules.items()}


def fingerprints() -> dict[str, list[str] | None]:
    """Per patch whose module is imported, what vLLM's attribute holds: its type, and its code's
    file and digest (marshal's bytes of the code object); None where there is no such attribute."""
    import hashlib
    import marshal
    import sys

    from dspark_hotfix.patches import ALL

    def fingerprint(p: Any) -> list[str] | None:
        *owners, name = p.qualname.split(".")
        owner = sys.modules[p.module]
        for part in owners:
            owner = getattr(owner, part)
        f = vars(owner).get(name)
        if f is None:
            return None
        code = f.__code__
        return [type(f).__name__, code.co_filename, hashlib.sha256(marshal.dumps(code)).hexdigest()]

    return {p.name: fingerprint(p) for p in ALL if p.module in sys.modules}


def shipped_fingerprints(root) -> dict[str, list[str] | None]:
    """:func:`fingerprints`'s answer for the build at ``root`` as it ships: its files compiled here,
    nothing else run."""
    out: dict[str, list[str] | None] = {}
    for patch in TOYS:
        path = str(root / module_file(patch))
        namespace = runpy.run_path(path)
        *owners, name = patch.qualname.split(".")
        owner = namespace[owners[0]] if owners else None
        f = vars(owner).get(name) if owner is not None else namespace.get(name)
        out[patch.name] = (
            None
            if f is None
            else [
                "function",
                f.__code__.co_filename,
                hashlib.sha256(marshal.dumps(f.__code__)).hexdigest(),
            ]
        )
    return out


def untouched(build, **env: str):
    """Imports and calls the toy build at ``build`` (-B: no bytecode written): wrap depths,
    fingerprints, answers and status; and the build's files, listed before and after."""
    before = listing(build)
    code = program(use_toys, import_toy_targets, wrap_depths, fingerprints, toy_calls, print_status)
    proc = run_python(code, path=(REPO, build), flags=("-B",), env=env)
    assert listing(build) == before  # not a byte of vLLM's files written, nor a file added
    return proc, json_lines(proc.stdout)


def test_a_vllm_that_is_already_fixed_is_left_untouched(tmp_path):
    build = edited_standin(tmp_path / "fixed", fixed())
    on, (depth, prints, calls, rows) = untouched(build)
    off, (off_depth, off_prints, off_calls, _) = untouched(build, DSPARK_HOTFIX="0")
    assert depth == off_depth == UNWRAPPED  # vLLM's own functions, unwrapped
    assert off.stderr == ""  # off says nothing
    assert prints == off_prints == shipped_fingerprints(build)  # byte for byte the code it ships
    assert (
        calls == off_calls == {"greet": "hello, ada", "plan": [1, 2], "compact": [1, 2]}
    )  # its own answers
    assert {r["state"] for r in rows.values()} == {"not_needed"}
    assert warning_lines(on.stderr) == []
    (summary,) = summary_lines(on.stderr)
    assert summary.endswith(f" via sitecustomize: removable: {len(NAMES)} not_needed")


def test_with_the_shim_off_vllm_is_left_untouched(tmp_path):
    build = edited_standin(tmp_path / "buggy", {})
    off, (depth, prints, calls, rows) = untouched(build, DSPARK_HOTFIX="0")
    assert depth == UNWRAPPED
    assert prints == shipped_fingerprints(build)
    assert calls == AS_SHIPPED  # the toy build's bugs included
    assert {r["state"] for r in rows.values()} == {"disabled"}
    assert off.stderr == ""


FORBIDDEN_CALLS = {"eval", "exec", "compile", "open", "__import__", "breakpoint", "input"}
FORBIDDEN_MODULES = {
    "socket",
    "ssl",
    "subprocess",
    "urllib",
    "http",
    "requests",
    "asyncio",
    "ctypes",
    "pickle",
    "marshal",
    "shutil",
    "tempfile",
    "multiprocessing",
    "ftplib",
    "smtplib",
}
FORBIDDEN_OS = {
    "system",
    "popen",
    "fork",
    "forkpty",
    "kill",
    "putenv",
    "unsetenv",
    "remove",
    "unlink",
    "rename",
    "replace",
    "mkdir",
    "makedirs",
    "chmod",
    "chdir",
} | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v", "ve", "vp", "vpe")}


def test_the_shim_source_has_no_eval_no_file_or_network_or_process_calls():
    # The runtime audit above covers the paths the stand-in exercises; this
    # covers every line, including branches only a real vLLM would take.
    import ast

    found = []
    # The command line is not the shim: `dspark-hotfix run` starts the command it is given.
    for path in sorted(
        set((REPO / "dspark_hotfix").rglob("*.py")) - {REPO / "dspark_hotfix" / "cli.py"}
    ):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in FORBIDDEN_CALLS
            ):
                found.append(f"{where}: {node.func.id}()")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in FORBIDDEN_OS
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "os"
            ):
                found.append(f"{where}: os.{node.func.attr}()")
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            found += [f"{where}: import {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
    assert found == []


def test_security_md_names_only_tests_that_exist():
    refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", (REPO / "SECURITY.md").read_text())
    assert refs
    missing = [
        f"{f}::{t}" for f, t in refs if not re.search(rf"^def {t}\(", (REPO / f).read_text(), re.M)
    ]
    assert missing == []
