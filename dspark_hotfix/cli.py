"""``dspark-hotfix`` / ``python -m dspark_hotfix``: path, run, status, doctor."""

import argparse
import functools
import json
import os
import re
import shutil
import subprocess
import sys

import dspark_hotfix
from dspark_hotfix import ENABLE, state

EPILOG = (
    """\
environment:
  DSPARK_HOTFIX          1/true/on/yes, blank or unset: on; 0/false/off/no: off;
                         anything else: off, with one warning (the shim is OFF)
  DSPARK_HOTFIX_PATCHES  name,name (only these) or -name,-name (all but these);
                         anything else: one warning saying what it selects
  DSPARK_HOTFIX_STRICT   1/true/on/yes: a patch that cannot be applied, or a
                         correction that raises, stops vLLM; blank, unset or
                         0/false/off/no: off; anything else: off, with one warning

"""
    + state.EXIT_CODES
    + """
exit status of run: the command's own once it runs; before that:
  1    the shim would not be active in it (the reason is said)
  2    usage error
  126  it cannot be run
  127  command not found
"""
)


def startup_dir() -> str:
    """The directory to put on PYTHONPATH: it holds only our sitecustomize.py."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def safe_pythonpath(current: str | None) -> str:
    """Our start-up directory first, then the absolute entries of ``current``: an empty
    or relative entry would put the working directory on sys.path. An alias of ours
    there (a link to it) boots nothing twice: chain() takes it off sys.path."""
    kept = [e for e in (current or "").split(os.pathsep) if os.path.isabs(e)]
    return os.pathsep.join(dict.fromkeys([startup_dir(), *kept]))


def interpreter_of(path: str, args: list[str]) -> list[str] | None:
    """The Python that the program at ``path`` runs, with the interpreter options it gets
    (from ``args`` for a ``python`` command, from the ``#!`` line for a script, where
    ``#!/usr/bin/env python3`` is read too, but not env's own options): ``-I``, ``-E`` or
    ``-S`` there keep the shim out. None where it is no Python that this can tell."""
    if os.path.basename(path).startswith("python"):
        return [path, *interpreter_options(args)]
    try:
        with open(path, "rb") as script:
            first = script.readline(512).decode(errors="replace")
    except OSError:
        return None
    words = first[2:].split() if first.startswith("#!") else []
    # `env python3`; an option of env's is no command.
    if len(words) > 1 and os.path.basename(words[0]) == "env":
        words = [shutil.which(words[1]) or "", *words[2:]]
    if not words or "python" not in os.path.basename(words[0]):
        return None
    return [words[0], *interpreter_options(words[1:])]


def interpreter_options(args: list[str]) -> list[str]:
    """The interpreter options at the head of a ``python`` command's ``args``, read as
    CPython reads them (Python/getopt.c): short options combine (``-IBc``); ``-c`` and
    ``-m`` end them, taking the rest of their word or the next one, and are left out
    with what they take; ``-W`` and ``-X`` take the rest of their word or the next one,
    ``--check-hash-based-pycs`` the next one; ``--``, ``-``, the script and the options
    that only print (``-h``, ``-V``, ``--help``, ``--version``) end them."""
    options: list[str] = []
    words = iter(args)
    for word in words:
        if word == "--check-hash-based-pycs":
            options += [word, next(words, "")]
            continue
        if not word.startswith("-") or word.startswith("--") or word == "-":
            break
        flags, letter, rest = re.fullmatch(r"-([^cmWXhV?]*)(.?)(.*)", word, re.S).groups()  # type: ignore[union-attr]
        if letter in ("W", "X"):
            options += [word] if rest else [word, next(words, "")]
            continue
        options += [f"-{flags}"] if flags else []
        if letter:
            break
    return options


# Wrappers that put a sitecustomize of their own first on PYTHONPATH and do not import the one it
# shadows (opentelemetry-instrumentation 0.66b1): ours would never run in what they start. Started
# outside the launcher, theirs is the one ours chains. ddtrace-run's chains (ddtrace 4.16.0).
NOT_CHAINING = ("opentelemetry-instrument",)


def run(command: list[str]) -> int:
    """Exec ``command`` with our start-up directory first on PYTHONPATH, where the shim will be
    active in it."""
    path = shutil.which(command[0])
    if path is None:
        print(f"dspark-hotfix run: {command[0]}: command not found", file=sys.stderr)
        return 127
    name = next((os.path.basename(w) for w in command if os.path.basename(w) in NOT_CHAINING), "")
    if name:
        print(
            f"dspark-hotfix run: {name} puts its own sitecustomize ahead of ours and does not run"
            " ours, so the shim would not be active in what it starts; start it the other way"
            f" round: {name} [its options] dspark-hotfix run -- COMMAND",
            file=sys.stderr,
        )
        return 1
    env = dict(os.environ, PYTHONPATH=safe_pythonpath(os.environ.get("PYTHONPATH")))
    python = interpreter_of(path, command[1:])
    checked = f"cannot tell whether {command[0]} starts Python with the shim: nothing checked"
    if python is not None:
        # Asked of the command's own interpreter with its own options: the shim is
        # active there only if interpreter start imported it.
        proc = subprocess.run(
            [*python, "-c", STARTED],
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            why = ((proc.stdout or proc.stderr).strip().splitlines() or ["?"])[-1]
            if proc.returncode == CANNOT_IMPORT:
                # No index carries the wheel, so the hint names the file, not the project.
                wheel = f"dspark_hotfix-{dspark_hotfix.__version__}-py3-none-any.whl"
                why += f"; install it there from the wheel you built: {python[0]} -m pip install"
                why += f" {wheel}"
            print(
                f"dspark-hotfix run: the shim would not be active in {' '.join(python)}"
                f" (the interpreter of {command[0]}): {why}",
                file=sys.stderr,
            )
            return 1
        checked = f"{' '.join(python)} starts it"
    if not dspark_hotfix.enabled():
        checked += f"; {ENABLE}={os.environ.get(ENABLE)!r} turns the hotfix off in it"
    print(
        f"dspark_hotfix {dspark_hotfix.__version__}: running {command[0]}"
        f" with PYTHONPATH={env['PYTHONPATH']} ({checked})",
        file=sys.stderr,
    )
    try:
        os.execve(path, command, env)
    except OSError as exc:
        print(f"dspark-hotfix run: cannot run {command[0]}: {exc}", file=sys.stderr)
    return 126


CANNOT_IMPORT = 4  # STARTED's exit status where the interpreter cannot import the shim or wrapt
# It says why on stdout and leaves with os._exit: under -i a SystemExit would open the prompt, and
# -v or -X importtime write lines of their own to stderr.
STARTED = """import os, sys
def stop(code, why):
    print(why, flush=True)
    os._exit(code)
if sys.flags.no_site:
    stop(1, "-S: it runs no site, so no sitecustomize; start it without -S")
if sys.flags.ignore_environment:
    flag = "-I" if sys.flags.isolated else "-E"
    stop(1, f"{flag}: it ignores PYTHONPATH; start it without that option")
# Ours ran: it is the sitecustomize of this process (it chains one it shadows), or it watches
# for vLLM.
started = hasattr(sys.modules.get("sitecustomize"), "VllmImportWatcher") or any(
    type(f).__name__ == "VllmImportWatcher" for f in sys.meta_path
)
try:
    import dspark_hotfix.registry, wrapt
except ImportError as exc:
    stop(4, f"{type(exc).__name__}: {exc}")
if not started:
    stop(1, "interpreter start did not run ours: a sitecustomize ahead of ours")
"""


def show(command: str, as_json: bool, model: str | None = None) -> int:
    """``status`` or ``doctor``: the report, as text or one JSON object; its exit code."""
    from dspark_hotfix import doctor

    report = doctor.diagnose(model) if command == "doctor" else doctor.report("status")
    # An environment value that the locale cannot encode is escaped.
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    print(json.dumps(report, indent=2) if as_json else doctor.render(report))
    return int(report["exit_code"])


def main(argv: list[str] | None = None) -> int:
    plain = argparse.RawDescriptionHelpFormatter  # the epilog as written
    parser = argparse.ArgumentParser(
        prog="dspark-hotfix",
        description=(
            "In-place hotfix for vLLM builds whose DeepSeek-V4 DSpark speculative decoding crashes."
        ),
        epilog=EPILOG,
        formatter_class=plain,
    )
    parser.add_argument(
        "--version", action="version", version=f"dspark-hotfix {dspark_hotfix.__version__}"
    )
    sub = parser.add_subparsers(dest="name", required=True)
    command = functools.partial(sub.add_parser, epilog=EPILOG, formatter_class=plain)
    command(
        "path", help="print the directory to put on PYTHONPATH (it holds only sitecustomize.py)"
    )
    launcher = command(
        "run", help="run a command with the hotfix: dspark-hotfix run -- vllm serve ..."
    )
    launcher.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    for name, text in (
        ("status", "import vLLM's target modules here and show what the hotfix does to them"),
        ("doctor", "will the fix be active where it is needed? (see exit status)"),
    ):
        checker = command(name, help=text)
        checker.add_argument(
            "--json", action="store_true", help=f"one JSON object (schema {state.SCHEMA})"
        )
    checker.add_argument("--model", metavar="DIR", help="a checkpoint: judge its DSpark draft")
    args = parser.parse_args(argv)
    if args.name == "path":
        print(startup_dir())
        return 0
    if args.name == "run":
        words = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not words:
            launcher.error("give the command to run, e.g. dspark-hotfix run -- vllm serve ...")
        return run(words)
    return show(args.name, args.json, getattr(args, "model", None))
