"""What the shim does not do, proved in real subprocesses: run files from the
working directory, evaluate the environment, extend ``sys.path``, write
anything but stderr, open sockets or start processes, load anything but the
standard library at start-up, or touch a vLLM that is already right. The
promises of SECURITY.md; switch values never evaluated are in
tests/switches/test_config.py.
"""

from __future__ import annotations

import json
import os
import re
import sys
import sysconfig

import pytest

from tests.conftest import (
    IMPORT_ALL,
    PATCHES,
    REPO,
    STANDIN,
    STATUS,
    WATCHING,
    WRAP_DEPTH,
    clean_env,
    json_lines,
    last_json,
    listing,
    run_in_env,
    run_python,
    summary_lines,
    warning_lines,
)

WARMUP = f"import sys; sys.path.insert(0, {str(STANDIN)!r}); import warmup\nwarmup.run()\n"
LOG_LINE = re.compile(r"(INFO|WARNING) \d\d-\d\d \d\d:\d\d:\d\d \[dspark_hotfix\] ")
SWITCHES = ("DSPARK_HOTFIX", "DSPARK_HOTFIX_PATCHES", "DSPARK_HOTFIX_STRICT")


@pytest.fixture
def decoy_cwd(tmp_path):
    """A working directory whose files would announce themselves if anything imported them."""
    cwd, marks = tmp_path / "cwd", tmp_path / "marks"
    cwd.mkdir()
    marks.mkdir()

    def decoy(name: str) -> str:
        return f"open({str(marks / name)!r}, 'w').close()\nprint('DECOY {name}')\n"

    (cwd / "dspark_hotfix").mkdir()
    (cwd / "dspark_hotfix" / "__init__.py").write_text(decoy("dspark_hotfix") + "raise ImportError('decoy')\n")
    (cwd / "dspark_hotfix" / "hooks.py").write_text(decoy("hooks"))
    (cwd / "wrapt.py").write_text(decoy("wrapt") + "raise ImportError('decoy')\n")
    (cwd / "sitecustomize.py").write_text(decoy("sitecustomize"))
    (cwd / "usercustomize.py").write_text(decoy("usercustomize"))
    return cwd, marks


@pytest.mark.parametrize("how", ["python -c, vLLM never imported", "python prog.py", "PYTHONSAFEPATH=1 python -c"])
def test_nothing_in_the_working_directory_is_read_or_run(decoy_cwd, tmp_path, how):
    # With -c (and -m) the interpreter itself puts the cwd first on sys.path once
    # start-up is over: start-up must not look there, and whatever imports vLLM
    # later resolves like vLLM's own imports do (SECURITY.md).
    cwd, marks = decoy_cwd
    env = clean_env(PYTHONPATH=os.pathsep.join([str(REPO), str(STANDIN)]))
    if how == "python -c, vLLM never imported":  # the shim watches; the child reads no package of ours
        argv, imports = [sys.executable, "-c", f"import sys; print({WATCHING})"], False
    elif how == "python prog.py":
        prog = tmp_path / "bin" / "prog.py"
        prog.parent.mkdir()
        prog.write_text(IMPORT_ALL + STATUS)
        argv, imports = [sys.executable, str(prog)], True
    else:
        env["PYTHONSAFEPATH"] = "1"
        argv, imports = [sys.executable, "-c", IMPORT_ALL + STATUS], True
    proc = run_in_env(argv, env, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert list(marks.iterdir()) == [] and "DECOY" not in proc.stdout + proc.stderr
    if imports:
        assert {r["state"] for r in last_json(proc.stdout).values()} == {"patched"}
    else:
        assert proc.stdout == "True\n"


SYS_PATH = "import sys, json; print(json.dumps([sys.path, [getattr(h, '__qualname__', '') for h in sys.path_hooks]]))"
SYS_PATH += "\n"


def test_the_shim_adds_nothing_to_sys_path(tmp_path):
    code = SYS_PATH + IMPORT_ALL + SYS_PATH

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
    quiet = run_python("pass", cwd=dirs["cwd"], env=env)
    busy = run_python(IMPORT_ALL + WARMUP + "import dspark_hotfix; dspark_hotfix.status()", cwd=dirs["cwd"], env=env)
    assert quiet.stdout == quiet.stderr == ""
    assert busy.stdout == ""
    lines = busy.stderr.splitlines()
    assert lines and all(LOG_LINE.match(line) for line in lines)  # its log goes to stderr
    assert all(listing(d) == {} for d in dirs.values())


AUDITED = """
import json, os, sys
events = []
WATCH = ("open", "compile", "socket.", "subprocess.", "os.system", "os.exec", "os.posix_spawn", "os.spawn",
         "os.fork", "os.kill", "urllib.", "http.", "ftplib.", "smtplib.", "ctypes.", "os.putenv", "os.unsetenv",
         "os.chdir", "os.mkdir", "os.remove", "os.rename", "os.rmdir", "os.truncate", "os.chmod", "os.chown",
         "os.symlink", "os.link", "os.utime", "shutil.", "tempfile.")

def audit(event, args):
    if event.startswith(WATCH):
        events.append([PHASE, event, *(a if isinstance(a, (str, int, type(None))) else repr(a)[:300]
                                       for a in args[:3])])

PHASE = "start-up"
sys.addaudithook(audit)
import site  # -S held it back: run it now, audited, exactly as interpreter start does
site.main()
PHASE = "vllm"
{work}
PHASE = "done"
print(json.dumps(events))
"""


def test_start_up_and_patching_open_no_socket_start_no_process_and_write_nothing(decoy_cwd, tmp_path):
    cwd, marks = decoy_cwd
    home = tmp_path / "home"
    home.mkdir()
    secret = "DSPARK-PAYLOAD-f00d"
    # DSPARK_HOTFIX is left alone: a value not understood turns the shim off (test above).
    env = {var: f"__import__('os').system('touch {marks / var}') # {secret}" for var in SWITCHES[1:]}
    code = AUDITED.replace("{work}", IMPORT_ALL + WARMUP + "import dspark_hotfix; dspark_hotfix.status()")
    proc = run_python(code, flags=("-S", "-P", "-B"), cwd=cwd, env={**env, "HOME": str(home)})
    events = last_json(proc.stdout)
    assert {e[0] for e in events} == {"start-up", "vllm"}  # the hook saw both phases
    assert [e for e in events if e[1] not in ("open", "compile")] == []  # no socket, process, env or fs change
    ours = (str(REPO / "dspark_hotfix"), str(REPO / "sitecustomize.py"), str(REPO / "__pycache__" / "sitecustomize."))
    allowed = (*ours, str(STANDIN), sysconfig.get_paths()["stdlib"], sys.prefix, sys.base_prefix)
    for _, _, path, mode, flags in (e for e in events if e[1] == "open"):
        if isinstance(path, str):
            assert path.startswith(allowed) and not path.startswith((str(cwd), str(home))), path
        assert mode is None or not set(str(mode)) & set("wax+"), (path, mode)
        if mode is None and isinstance(flags, int):
            assert not flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT), (path, flags)
    assert not [e for e in events if e[1] == "compile" and secret in str(e[2])]  # no switch value compiled
    assert list(marks.iterdir()) == []
    assert len(warning_lines(proc.stderr)) == len(SWITCHES) - 1


def test_start_up_loads_only_the_standard_library_and_the_start_up_module():
    code = "import sys, json; print(json.dumps({n: getattr(m, '__file__', None) for n, m in sys.modules.items()}))"
    with_shim = json.loads(run_python(code).stdout)
    without = json.loads(run_python(code, path=(STANDIN,)).stdout)
    stdlib = (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"])
    ours = (str(REPO / "dspark_hotfix") + os.sep, str(REPO / "sitecustomize.py"))
    added = {name: path for name, path in with_shim.items() if name not in without}
    assert added.get("sitecustomize") == str(REPO / "sitecustomize.py")  # the shim did start
    for name, path in added.items():
        assert path is None or path.startswith(stdlib) or path.startswith(ours), (name, path)
    assert [n for n, p in added.items() if p and p.startswith(ours)] == ["sitecustomize"]


def test_a_vllm_that_is_already_fixed_is_left_untouched(fixed_standin):
    warmup = f"import sys; sys.path.insert(0, {str(fixed_standin)!r}); import warmup, json\n" \
             "print(json.dumps(warmup.run()))\n"
    code = IMPORT_ALL + WRAP_DEPTH + warmup + STATUS
    on = run_python(code, path=(REPO, fixed_standin))
    off = run_python(code, path=(REPO, fixed_standin), env={"DSPARK_HOTFIX": "0"})
    depth, report, rows = json_lines(on.stdout)
    assert depth == dict.fromkeys(PATCHES, 0)  # vLLM's own functions, unwrapped
    assert report["error"] is None and report == json_lines(off.stdout)[1]
    assert {r["state"] for r in rows.values()} == {"not_needed"}
    assert warning_lines(on.stderr) == []
    (summary,) = summary_lines(on.stderr)
    assert summary.endswith(f" via sitecustomize: removable: {len(PATCHES)} not_needed")


FORBIDDEN_CALLS = {"eval", "exec", "compile", "open", "__import__", "breakpoint", "input"}
FORBIDDEN_MODULES = {"socket", "ssl", "subprocess", "urllib", "http", "requests", "asyncio", "ctypes", "pickle",
                     "marshal", "shutil", "tempfile", "multiprocessing", "ftplib", "smtplib"}
FORBIDDEN_OS = {"system", "popen", "fork", "forkpty", "kill", "putenv", "unsetenv", "remove", "unlink", "rename",
                "replace", "mkdir", "makedirs", "chmod", "chdir"} | {f"exec{s}" for s in ("l", "le", "lp", "lpe", "v",
                                                                                        "ve", "vp", "vpe")}


def test_the_shim_source_has_no_eval_no_file_or_network_or_process_calls():
    # The runtime audit above covers the paths the stand-in exercises; this
    # covers every line, including branches only a real vLLM would take.
    import ast

    found = []
    # The command line is not the shim: `dspark-hotfix run` starts the command it is given.
    for path in sorted(set((REPO / "dspark_hotfix").rglob("*.py")) - {REPO / "dspark_hotfix" / "cli.py"}):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(REPO)}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
                found.append(f"{where}: {node.func.id}()")
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FORBIDDEN_OS \
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "os":
                found.append(f"{where}: os.{node.func.attr}()")
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{where}: import {n}" for n in names if n.split(".")[0] in FORBIDDEN_MODULES]
    assert found == []


def test_security_md_names_only_tests_that_exist():
    refs = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", (REPO / "SECURITY.md").read_text())
    assert refs
    missing = [f"{f}::{t}" for f, t in refs if not re.search(rf"^def {t}\(", (REPO / f).read_text(), re.M)]
    assert missing == []
