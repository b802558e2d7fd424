"""What the harnesses share: the repository's paths, their command lines, their records, the tools
they ask.

Standard library only, and Python 3.9 as the GPU machine's own interpreter may be (the
``from __future__`` import keeps the annotations unevaluated). Not for harness/e2e_engine.py,
which imports nothing from this package (see its docstring).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
EVIDENCE = REPO / "docs" / "evidence"


# ----------------------------------------------------------------------------- command line


def command_line(module: str, doc: str | None) -> tuple[argparse.ArgumentParser, Any]:
    """The parser of ``python3 -m harness.<module>`` and its steps (subcommands); each step sets
    ``func``."""
    parser = argparse.ArgumentParser(
        prog=f"python3 -m harness.{module}",
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return parser, parser.add_subparsers(dest="step", required=True)


def run_step(parser: argparse.ArgumentParser) -> int:
    """Parse the command line and run the step it names: its exit code."""
    args = parser.parse_args()
    return int(args.func(args))


def output_folder(given: str | None, default: str) -> Path:
    """Where a step on the GPU machine writes what comes back: ``--out``, else $OUT (the device
    tool's folder), else ``default``; made if missing."""
    folder = Path(given or os.environ.get("OUT") or default).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# ----------------------------------------------------------------------------- records


def write_json(path: Path, data: Any) -> None:
    """A record as every harness writes it: indented, keys sorted, one newline at the end."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def save_results(summary: dict, work: Path, final: Path) -> None:
    """``summary.json`` into the work folder and the output folder, and the whole work folder, every
    log in it, as ``results.tgz`` in the output folder (the device tool brings back a few files
    only)."""
    write_json(work / "summary.json", summary)
    shutil.copy(work / "summary.json", final / "summary.json")
    subprocess.run(["tar", "czf", str(final / "results.tgz"), "-C", str(work), "."], check=False)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ----------------------------------------------------------------------------- this machine and the
# GPU's


def keep_out_of_git(folder: Path) -> None:
    """A staging folder at the repository root that .gitignore does not cover goes into
    .git/info/exclude."""
    probe = subprocess.run(
        ["git", "-C", str(REPO), "check-ignore", "-q", f"{folder.name}/x"], check=False
    )
    if probe.returncode == 1:
        # a worktree's .git is a file: ask git where its exclude file is
        where = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--git-path", "info/exclude"],
            capture_output=True,
            text=True,
            check=True,
        )
        exclude = (REPO / where.stdout.strip()).resolve()
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a") as handle:
            handle.write(f"/{folder.name}/\n")


def query(*command: str) -> str | None:
    """What a tool of the machine (nvidia-smi, nvcc) prints, stripped; None where it is missing or
    prints nothing."""
    if shutil.which(command[0]) is None:
        return None
    return (
        subprocess.run(command, capture_output=True, text=True, check=False).stdout.strip() or None
    )


# ----------------------------------------------------------------------------- one patch alone


def one_patch(arm: str) -> str | None:
    """``DSPARK_HOTFIX_PATCHES`` of an arm that runs the reverted copy with one patch alone
    (``only-NAME``) or with every patch but one (``without-NAME``), NAME a patch of
    ``dspark_hotfix.patches.ALL``; None for any other arm. The shim itself warns of a name it does
    not know."""
    for prefix, selection in (("only-", "{}"), ("without-", "-{}")):
        if arm.startswith(prefix) and arm[len(prefix) :]:
            return selection.format(arm[len(prefix) :])
    return None
