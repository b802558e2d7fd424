"""``dspark-hotfix`` / ``python -m dspark_hotfix``: path, status, doctor."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Any

from dspark_hotfix import hooks


def startup_dir() -> str:
    """The directory to put on PYTHONPATH: it holds only our sitecustomize.py."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "startup")


def _table(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        lines.append(f"{row['name']:<24} {row['state']:<11} corrections={row['corrections']}")
        lines.append(f"    {row['target']}")
        lines.append(f"    {row['detail']}")
    by = rows[0]["activated_by"] if rows else None
    lines.append(f"activated by: {by or 'nothing'} (pid {os.getpid()})")
    return "\n".join(lines)


def cmd_status(args: argparse.Namespace) -> int:
    if args.import_targets:
        import contextlib

        hooks.install(source="cli")
        from dspark_hotfix.patches import ALL

        with contextlib.redirect_stdout(sys.stderr):  # vLLM logs to stdout
            for patch in ALL:
                try:
                    importlib.import_module(patch.module)
                except Exception as exc:
                    print(f"cannot import {patch.module}: {type(exc).__name__}: {exc}", file=sys.stderr)
    rows = hooks.status()
    print(json.dumps(rows, indent=2) if args.json else _table(rows))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    import contextlib

    from dspark_hotfix import doctor

    # vLLM logs to stdout and binds its handler when imported: keep stdout for the report.
    with contextlib.redirect_stdout(sys.stderr):
        report = doctor.diagnose()
    print(json.dumps(report, indent=2) if args.json else doctor.render(report))
    return 0 if report["ok"] else 1


def cmd_path(args: argparse.Namespace) -> int:
    print(startup_dir())
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="dspark-hotfix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("path", help="print the directory to put on PYTHONPATH")
    p.set_defaults(func=cmd_path)
    p = sub.add_parser("status", help="what the shim did in this process")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--import-targets",
        action="store_true",
        help="install the hooks and import vLLM's target modules first",
    )
    p.set_defaults(func=cmd_status)
    p = sub.add_parser("doctor", help="will the fix be active where it is needed? (exit 0 only if so)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_doctor)
    args = parser.parse_args(argv)
    return int(args.func(args))
