"""Shared helpers: real subprocesses with the shim and the stand-in build on the path."""

from __future__ import annotations

import ast
import atexit
import builtins
import dis
import functools
import inspect
import io
import json
import marshal
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import dspark_hotfix
import dspark_hotfix.patches
from scripts.venvs import locked
from tests import child as child_steps

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any switch of ours or a PYTHONPATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("DSPARK_HOTFIX") and k not in ("PYTHONPATH", "PYTHONSAFEPATH")
    }
    env.update(overrides)
    return env


def run_python(
    code: str,
    *,
    path: tuple[Path | str, ...] = (REPO, STANDIN),
    env: dict[str, str] | None = None,
    flags: tuple[str, ...] = (),
    python: str = sys.executable,
    cwd: Path | str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter, as an operator's process would start."""
    full_env = clean_env(**(env or {}))
    if path:
        full_env["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    proc = subprocess.run(
        [python, *flags, "-c", code],
        env=full_env,
        cwd=str(cwd) if cwd else None,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
        )
    return proc


def last_json(stdout: str) -> Any:
    return json.loads(stdout.strip().splitlines()[-1])


def program(
    *steps: Callable[..., object] | functools.partial,
    helpers: tuple[Callable[..., object], ...] = (),
) -> str:
    """The ``-c`` code of a child that runs ``steps`` in order: each function's own source, then its
    call (a partial's arguments as their repr), its value printed as a JSON line where it returns
    one (``json`` imported once it has returned). So the child needs nothing of the tests on its
    path, and ruff and mypy check its code where it is written. A step imports what it uses in its
    own body, since only its source goes (``tests/child.py``'s steps), and goes without its
    annotations: they are for mypy, and the child imports nothing it did not ask for (no
    ``__future__``). ``helpers`` go too, without a call: functions the steps call."""
    sources: dict[str, str] = {}
    calls, used = [], set()
    for step in (*steps, *helpers):
        function, args = (
            (step.func, step.args) if isinstance(step, functools.partial) else (step, ())
        )
        source = bare(textwrap.dedent(inspect.getsource(function)))
        assert sources.setdefault(function.__name__, source) == source, (
            f"two steps named {function.__name__}"
        )
        used |= globals_read(compile(source, function.__name__, "exec"))  # what the child will read
        if step in helpers:
            continue
        call = f"{function.__name__}({', '.join(map(repr, args))})"
        returns = function.__annotations__.get("return") not in ("None", None)
        calls.append(f"value = {call}; import json; print(json.dumps(value))" if returns else call)
    unknown = used - set(sources) - set(vars(builtins))
    assert not unknown, (
        f"a step reads its module's {sorted(unknown)}: import them in the step's body"
    )
    return "\n".join([*sources.values(), *calls]) + "\n"


def bare(source: str) -> str:
    """``source`` without the annotations of its functions' arguments and returns."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
        elif isinstance(node, ast.arg):
            node.annotation = None
    return ast.unparse(tree)


def globals_read(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the functions and comprehensions inside it) reads."""
    names = {
        i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")
    }
    for inner in code.co_consts:
        if isinstance(inner, types.CodeType):
            names |= globals_read(inner)
    return names


@pytest.fixture
def standin_modules():
    """Import the stand-in build in this process; forget it afterwards."""
    sys.path.insert(0, str(STANDIN))
    try:
        yield
    finally:
        sys.path.remove(str(STANDIN))
        for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
            del sys.modules[name]


class Shim:
    """The shim in this very process, on a patch set and a stand-in build (the ``shim`` fixture)."""

    def __init__(self, log: io.StringIO, root: Path) -> None:
        self.log, self.root = log, root

    def lines(self, level: str = "INFO") -> list[str]:
        """The shim's log lines of ``level`` so far, without level and timestamp, its state lines
        aside (``summaries``)."""
        return [
            line for line in log_lines(self.log.getvalue(), level) if not STATE_LINE.match(line)
        ]

    def summaries(self) -> list[str]:
        return summary_lines(self.log.getvalue())

    def status(self) -> dict[str, dict]:
        """status()'s rows by patch name."""
        return {row["name"]: row for row in dspark_hotfix.status()["patches"]}

    def states(self) -> dict[str, str]:
        return {name: row["state"] for name, row in self.status().items()}


def forget() -> None:
    """This process as a fresh one would start, but for its patch set, ``sys.path`` and switches: no
    activation, no module of the stand-in, no pending hook of wrapt's, and no gauges."""
    from dspark_hotfix import metrics, registry

    registry._active = None
    dspark_hotfix._enabled = None
    for name in [m for m in sys.modules if m in ("vllm", "warmup") or m.startswith("vllm.")]:
        del sys.modules[name]
    importer = sys.modules.get("wrapt.importer")
    for name in list(getattr(importer, "_post_import_hooks", {})):
        if name == "prometheus_client" or name.startswith("vllm"):
            del importer._post_import_hooks[name]  # type: ignore[union-attr]
    if metrics._gauges:
        prometheus = sys.modules["prometheus_client"]
        for collector in list(prometheus.REGISTRY._collector_to_names):
            if collector in metrics._gauges or type(collector).__name__ == "_AtScrape":
                prometheus.REGISTRY.unregister(collector)
    metrics._gauges = None


@pytest.fixture
def shim(monkeypatch, tmp_path):
    """``shim(patches, edits=None, remove=())``: ``patches`` as this process's patch set, with the
    stand-in build (a copy with ``edits`` and without ``remove``, as :func:`edited_standin` makes
    it; none: the stand-in as shipped) first on ``sys.path``, and no activation yet. Interpreter
    start is not what these tests are about; the start-up paths have their own (tests/activation).
    The switches come from ``monkeypatch.setenv``, set before the first activation. One build per
    test; afterwards every trace is gone (:func:`forget`, and the finders the shim added)."""
    from dspark_hotfix import state

    for name in [k for k in os.environ if k.startswith("DSPARK_HOTFIX")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv(
        "PROMETHEUS_MULTIPROC_DIR", raising=False
    )  # `status` drops it from os.environ
    forget()  # a build another test left would shadow this one
    meta_path, log = list(sys.meta_path), io.StringIO()
    stream = state._handler.setStream(log)
    built: list[Shim] = []

    def build(patches, edits=None, remove=()) -> Shim:
        assert not built, "one stand-in build per test"
        monkeypatch.setattr(dspark_hotfix.patches, "ALL", tuple(patches))
        root = (
            edited_standin(tmp_path / "standin", edits or {}, remove)
            if edits or remove
            else STANDIN
        )
        monkeypatch.syspath_prepend(str(root))
        built.append(Shim(log, root))
        return built[0]

    try:
        yield build
    finally:
        state._handler.setStream(stream)
        sys.meta_path[:] = [
            f for f in sys.meta_path if f in meta_path or type(f).__name__ == "ImportHookFinder"
        ]
        forget()


@pytest.fixture
def toys(shim):
    """The toy patches (tests/toys.py) on the stand-in as shipped: the machinery's tests."""
    from tests import toys as toy_patches

    return shim(toy_patches.TOYS)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)``'s folder, built once per run: pytest-xdist's workers share it (the first to
    ask builds it, the others wait for it), as their own session fixtures would each build it again.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder the workers' own folders are in
    folder = root / name
    with locked(root / f"{name}.lock"):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The project's wheel, built once per run the way pip builds it."""

    def build(out: Path) -> None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                "-w",
                str(out),
                str(REPO),
            ],
            check=True,
            capture_output=True,
            text=True,
        )

    (built,) = built_once(tmp_path_factory, "wheel", build).glob("dspark_hotfix-*.whl")
    return built


# Helpers of the subprocess tests in every folder (activation, switches, reporting, security).

STATE_LINE = re.compile(
    r"dspark_hotfix \S+ \(pid \d+\) via "
)  # a state line, without level and timestamp


def log_lines(stderr: str, *levels: str) -> list[str]:
    """The shim's log lines of ``levels``, each without its level and timestamp; in their order."""
    return [
        line.split("[dspark_hotfix] ", 1)[1]
        for line in stderr.splitlines()
        if line.startswith(tuple(f"{level} " for level in levels)) and "[dspark_hotfix] " in line
    ]


def warning_lines(stderr: str) -> list[str]:
    """The shim's warnings, its state lines aside (a state line whose verdict exits 1 is a WARNING
    too)."""
    return [line for line in log_lines(stderr, "WARNING") if not STATE_LINE.match(line)]


def summary_lines(stderr: str) -> list[str]:
    """The shim's lines that give a process's state: the first once every patch is judged, one
    more on every change after it (each whole: the verdict, then every record's state). INFO, or
    WARNING where the verdict exits 1 (``problem``, ``undecided``)."""
    return [line for line in log_lines(stderr, "INFO", "WARNING") if STATE_LINE.match(line)]


def state_of(line: str) -> str:
    """A state line without its head (version, pid and activation path)."""
    return line.split(": ", 1)[1]


def json_lines(stdout: str) -> list[Any]:
    """Each line of ``stdout`` that is JSON, decoded (a step's value, :func:`program`), in order."""
    values = []
    for line in stdout.splitlines():
        try:
            values.append(json.loads(line))
        except ValueError:
            pass  # a line the child printed as text
    return values


def edited_standin(
    root: Path, edits: dict[str, list[tuple[str, str]]], remove: tuple[str, ...] = ()
) -> Path:
    """A copy of the stand-in build at ``root`` with textual edits.

    ``edits`` maps a path inside the copy (or ``"*"``: every ``.py`` file) to
    ``(old, new)`` replacements; each must apply somewhere, so a change to the
    stand-in cannot silently turn a fault into no fault.
    """

    shutil.copytree(STANDIN, root, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, replacements in edits.items():
        files = sorted(root.rglob("*.py")) if rel == "*" else [root / rel]
        for old, new in replacements:
            hits = [f for f in files if old in f.read_text()]
            if not hits:
                raise AssertionError(f"{rel}: {old!r} not found: the stand-in changed")
            for f in hits:
                f.write_text(f.read_text().replace(old, new))
    for rel in remove:
        (root / rel).unlink()
    return root


def listing(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and modification time (ns)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            out[str(path.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


def copy_of_shim(root: Path) -> Path:
    """The shim as an operator deploys it from a checkout: ``dspark_hotfix/`` and
    ``sitecustomize.py``."""

    root.mkdir(parents=True)
    shutil.copytree(
        REPO / "dspark_hotfix", root / "dspark_hotfix", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(
        REPO / "sitecustomize.py", root / "sitecustomize.py"
    )  # the link's target, as a file
    return root


def run_in_env(
    argv: list[str], env: dict[str, str], cwd: Path | str | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` with exactly ``env`` (run_python always starts from this process's
    environment)."""
    return subprocess.run(
        argv, env=env, cwd=str(cwd) if cwd else None, capture_output=True, text=True, timeout=120
    )


# The wheel installed in a fresh venv, as an image would install it (both activation paths,
# doctor, the launcher and packaging use it).

IMAGE_CUSTOMISATION = program(
    functools.partial(child_steps.set_environ, "IMAGE_SITECUSTOMIZE", "ran")
)


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory) -> Path:
    """A venv without pip, wrapt or the shim, built once per run; read only."""

    def build(root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)

    return built_once(tmp_path_factory, "bare-venv", build)


@pytest.fixture(scope="session")
def venv(tmp_path_factory, wheel) -> dict:
    """A venv with the wheel installed and an image's own sitecustomize, built once per run; read
    only."""

    def build(root: Path) -> None:
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        purelib = Path(
            sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"]
        )
        # The image's own customisation, as Debian and Ubuntu Pythons ship one.
        (purelib / "sitecustomize.py").write_text(IMAGE_CUSTOMISATION)
        proc = subprocess.run(
            [
                str(root / "bin" / "python"),
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                str(wheel),
            ],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr

    root = built_once(tmp_path_factory, "venv", build)
    purelib = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    return {
        "root": root,
        "python": root / "bin" / "python",
        "bin": root / "bin",
        "purelib": purelib,
    }


def run_in_venv(
    venv: dict, code: str | None = None, args: tuple = (), path: tuple = (), **env: str
):
    full = clean_env(**env)
    full["PATH"] = f"{venv['bin']}{os.pathsep}{full.get('PATH', '')}"
    if path:
        full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    command = [str(venv["python"]), "-c", code] if code is not None else list(args)
    return subprocess.run(
        command, env=full, capture_output=True, text=True, timeout=120, cwd=str(venv["root"])
    )


def startup_dir(venv: dict) -> Path:
    proc = run_in_venv(venv, args=("dspark-hotfix", "path"))
    assert proc.returncode == 0, proc.stderr
    return Path(proc.stdout.strip())


CHILD_TIMEOUT = 20  # seconds: the backstop, should faulthandler not end it


def call_in_child(
    function: Callable[..., None],
    *args: object,
    stand_in_alone: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = CHILD_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """``function(*args)`` (``args`` as JSON) in a fresh process (:func:`in_fresh_process`): the
    repository first on its path (the start-up hook active), or with ``stand_in_alone`` the stand-in
    alone (no start-up hook; the repository goes last, so the shim is imported only where the child
    asks). The function's module must import only the standard library at its top."""
    return in_fresh_process(
        code_calling(function, stand_in_alone),
        json.dumps(args),
        path=(STANDIN,) if stand_in_alone else (REPO, STANDIN),
        env=env,
        timeout=timeout,
    )


def code_calling(function: Callable[..., None], stand_in_alone: bool = False) -> str:
    """The ``-c`` code of :func:`call_in_child`: ``function`` called with the arguments in
    ``sys.argv[1]``."""
    code = (
        f"import json, sys; from {function.__module__} import {function.__name__} as f; "
        "f(*json.loads(sys.argv[1]))"
    )
    if stand_in_alone:
        code = f"import sys; sys.path.append({str(REPO)!r}); " + code
    return code


def in_fresh_process(
    code: str,
    *argv: str,
    path: tuple[Path, ...] = (REPO, STANDIN),
    env: dict[str, str] | None = None,
    timeout: float = CHILD_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """``python -c code *argv`` as :func:`child` runs it, for what comes after interpreter start:
    forked from a :mod:`tests.zygote` started once per path and environment in this pytest process
    (the start-up hook ran in it, as at any start). Where that start wrote anything, a fresh
    interpreter runs it instead, so that nothing said at start is lost."""
    server = zygote(path, env or {})
    if server is None:
        return child(args=("-c", code, *argv), path=path, env=env, timeout=timeout)
    return forked(server, code, list(argv), timeout)


ZYGOTES: dict[
    tuple, subprocess.Popen[bytes] | None
] = {}  # (path, environment): its server, or None


def zygote(path: tuple[Path, ...], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
    """This pytest process's :mod:`tests.zygote` for ``path`` and ``env``, started on first use;
    None where its start wrote anything (on stderr, or on stdout before its "ready")."""
    key = (path, tuple(sorted(env.items())))
    if key not in ZYGOTES:
        full = clean_env(**env)
        full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
        source = (REPO / "tests" / "zygote.py").read_text()
        with tempfile.TemporaryFile() as said:
            server = subprocess.Popen(
                [sys.executable, "-c", source],
                env=full,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=said,
                bufsize=0,
            )
            ready = reply(server, CHILD_TIMEOUT)
            said.seek(0)
            if ready != "ready" or said.read():
                server.kill()
                server.wait()
                ZYGOTES[key] = None
            else:
                ZYGOTES[key] = server
    return ZYGOTES[key]


def reply(server: subprocess.Popen[bytes], timeout: float) -> object:
    """The zygote's next reply, or None where none came within ``timeout`` seconds."""
    assert server.stdout is not None
    if not select.select([server.stdout], [], [], timeout)[0]:
        return None
    try:
        return marshal.load(server.stdout)
    except (EOFError, ValueError):
        return None


def forked(
    server: subprocess.Popen[bytes],
    code: str,
    argv: list[str],
    timeout: float,
) -> subprocess.CompletedProcess[str]:
    """``python -c code *argv`` forked from ``server``, as :func:`child` returns it (returncode None
    and "(killed: timeout)" on stderr where it ran past ``timeout``)."""
    assert server.stdin is not None
    with tempfile.TemporaryDirectory() as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        server.stdin.write(marshal.dumps((code, argv, str(out), str(err))))
        pid = reply(server, CHILD_TIMEOUT)
        assert isinstance(pid, int), f"the zygote did not fork: {server.poll()}"
        status = reply(server, timeout)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            reply(server, CHILD_TIMEOUT)
        # As subprocess.run(text=True) decodes: the locale's encoding, universal newlines.
        stdout, stderr = out.read_text(), err.read_text()
    command = [sys.executable, "-c", code, *argv]
    if not isinstance(status, int):
        return killed(command, stdout, stderr)
    return subprocess.CompletedProcess(command, status, stdout, stderr)


def killed(argv: list[str], stdout: str, stderr: str) -> subprocess.CompletedProcess[str]:
    """A child ended by its timeout, as :func:`child` and :func:`forked` return it."""
    return subprocess.CompletedProcess(argv, None, stdout, stderr + "\n(killed: timeout)")  # type: ignore[arg-type]


@atexit.register
def _end_zygotes() -> None:
    for server in ZYGOTES.values():
        if server is not None and server.stdin is not None:
            server.stdin.close()  # end of input: the server ends
            try:
                server.wait(5)
            except subprocess.TimeoutExpired:
                server.kill()


def child(
    code: str | None = None,
    *,
    args: tuple[str, ...] = (),
    path: tuple[Path | str, ...] = (REPO, STANDIN),
    env: dict[str, str] | None = None,
    cwd: Path | str | None = None,
    timeout: float = CHILD_TIMEOUT,
) -> subprocess.CompletedProcess[str]:
    """``python -c code`` (or ``python *args``) as run_python starts it, with a short timeout; never
    raises on a non-zero exit or on a timeout (the CompletedProcess then has returncode None)."""
    full = clean_env(**(env or {}))
    if path:
        full["PYTHONPATH"] = os.pathsep.join(str(p) for p in path)
    argv = [sys.executable, *(("-c", code) if code is not None else args)]
    try:
        return subprocess.run(
            argv,
            env=full,
            cwd=str(cwd) if cwd else None,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else exc.stdout or ""
        err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else exc.stderr or ""
        return killed(argv, out, err)
