"""``dspark-hotfix`` / ``python -m dspark_hotfix``: path, run, status, doctor."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import dspark_hotfix

EPILOG = """\
environment:
  DSPARK_HOTFIX          1/true/on/yes or unset: on; 0/false/off/no: off;
                         anything else: off, with a warning
  DSPARK_HOTFIX_PATCHES  name,name (only these) or -name,-name (all but these)
  DSPARK_HOTFIX_STRICT   1/true/on/yes: a patch that cannot be applied stops vLLM
  DSPARK_HOTFIX_LOG      DEBUG, INFO (default), WARNING or ERROR

exit status of doctor and status:
  0  the fix is active where it is needed
  1  a problem: a patch failed, a target is not importable, a malformed
     switch, no activation path, the shim switched off where it is needed
  2  usage error
  3  not needed on this vLLM (fixed upstream): the shim is a no-op, removable
"""


def startup_dir() -> str:
    """The directory to put on PYTHONPATH: it holds only our sitecustomize.py."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def safe_pythonpath(current: str | None) -> str:
    """Our start-up directory first, then the absolute entries of ``current``:
    an empty or relative entry would put the working directory on sys.path."""
    ours = startup_dir()
    kept = [e for e in (current or "").split(os.pathsep) if e and os.path.isabs(e) and e != ours]
    return os.pathsep.join([ours, *dict.fromkeys(kept)])


def interpreter_of(command: str) -> str | None:
    """The Python that ``command`` will run: itself, or its script's ``#!`` line."""
    path = shutil.which(command)
    if path is None:
        return None
    if os.path.basename(path).startswith("python"):
        return path
    try:
        with open(path, "rb") as script:
            first = script.readline(512).decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!") or "python" not in first:
        return None
    words = first[2:].split()
    if os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        return shutil.which(words[0]) if words else None
    return words[0]


def cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        print("dspark-hotfix run: give the command to run, e.g. dspark-hotfix run -- vllm serve ...", file=sys.stderr)
        return 2
    env = dict(os.environ, PYTHONPATH=safe_pythonpath(os.environ.get("PYTHONPATH")))
    python = interpreter_of(command[0])
    if python is None:
        checked = f"{command[0]} is not a Python program: nothing checked"
    else:
        proc = subprocess.run([python, "-c", "import dspark_hotfix.registry, wrapt"], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            why = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"dspark-hotfix run: {python} (the interpreter of {command[0]}) cannot import the hotfix and wrapt "
                  f"({why}); install them there: {python} -m pip install dspark-hotfix", file=sys.stderr)
            return 1
        checked = f"{python} imports it"
    print(f"dspark_hotfix {dspark_hotfix.__version__}: running {command[0]} with PYTHONPATH={env['PYTHONPATH']} "
          f"({checked})", file=sys.stderr)
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        print(f"dspark-hotfix run: cannot run {command[0]}: {exc}", file=sys.stderr)
        return 1
    return 1  # not reached


def cmd_status(args: argparse.Namespace) -> int:
    import contextlib
    import importlib

    from dspark_hotfix import doctor, registry
    from dspark_hotfix.patches import ALL

    problems = doctor.switch_problems()
    if args.import_targets:
        registry.install(source="cli")
        with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout
            for module in dict.fromkeys(p.module for p in ALL):
                try:
                    importlib.import_module(module)
                except Exception as exc:
                    problems.append(f"cannot import {module}: {type(exc).__name__}: {exc}")
    report = registry.status()
    report["problems"] = problems
    for row in report["patches"]:
        if row["state"] == registry.FAILED:
            problems.append(f"{row['name']}: {row['detail']}")
    if args.import_targets and not report["enabled"]:
        problems.append(f"{registry.config.ENABLE}={os.environ.get(registry.config.ENABLE)!r} turns the shim off")
    code = doctor.evaluate(report) if args.import_targets else doctor.PROBLEM if problems else doctor.OK
    report.update(verdict=doctor.VERDICTS[code], exit_code=code)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for row in report["patches"]:
            print(f"{row['name']:<24} {row['state']:<11} corrections={row['corrections']}  {row['detail']}")
        print(f"activated by: {report['activated_by'] or 'nothing'} (pid {report['pid']}"
              + (", this command's own process: the server logs its own summary line)" if not args.import_targets
                 else ")"))
        for problem in problems:
            print(f"PROBLEM  {problem}")
    return code


def cmd_doctor(args: argparse.Namespace) -> int:
    from dspark_hotfix import doctor

    report = doctor.diagnose()
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return int(report["exit_code"])


def cmd_path(args: argparse.Namespace) -> int:
    print(startup_dir())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="dspark-hotfix",
        description="In-place hotfix for vLLM builds whose DeepSeek-V4 DSpark speculative decoding crashes.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"dspark-hotfix {dspark_hotfix.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("path", help="print the directory to put on PYTHONPATH (it holds only sitecustomize.py)")
    p.set_defaults(func=cmd_path)
    p = sub.add_parser("run", help="run a command with the hotfix: dspark-hotfix run -- vllm serve ...",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command and its arguments")
    p.set_defaults(func=cmd_run)
    p = sub.add_parser("status", help="what the hotfix did in this process",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object (schema 1)")
    p.add_argument("--import-targets", action="store_true", help="install the hooks and import vLLM's targets first")
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("doctor", help="will the fix be active where it is needed? (see exit status)",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="one JSON object (schema 1)")
    p.set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    return int(args.func(args))
