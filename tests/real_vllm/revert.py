"""Re-create the reported pre-release build from a released vLLM, at test time only.

vLLM 0.25.0 carries the upstream fixes of the reported build's defects
(vllm-project/vllm#47648). Each patch's test module declares, in ``REVERT``
(tests/patches/__init__.py), the lines of 0.25.0 that change back to the
reported build's; this script builds a copy of an installed ``vllm`` package
with all of them applied. With the copy first on ``PYTHONPATH`` it shadows the
installed package.

The copy is a shadow tree: only the directories that lead to an edited file are
real; every other file and directory is a symbolic link into the installed
package (627 MB and 6600 files for 0.25.0), so building it takes milliseconds
and the compiled extensions load from where pip put them. ``__pycache__`` is
never linked from a real directory, so the edited modules compile into the copy
and the installed package's bytecode is left alone.

Each edit names the one line it expects; if that line is not found exactly once
inside the expected function, nothing is built and the error names the file,
the function and the line.

    python tests/real_vllm/revert.py SRC_VLLM_PACKAGE_DIR DEST_DIR

creates ``DEST_DIR/vllm``; put ``DEST_DIR`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Edit:
    path: str  # inside the vllm package
    function: str  # Class.method holding the line
    line: str  # the line as it reads in the release, without its indentation
    replacement: str | None  # None: the line is dropped


def declared_edits() -> tuple[Edit, ...]:
    """Every patch's ``REVERT`` edits (tests/patches/test_<name>.py), in the order of
    ``patches.ALL``.

    Read in the test process only: the declarations import pytest and hypothesis, which a vLLM venv
    may lack.
    """
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from dspark_hotfix.patches import ALL
    from tests.patches import declared

    return tuple(
        Edit(r.path, r.function, r.line, r.replacement) for p in ALL for r in declared(p).REVERT
    )


def to_json(edits: tuple[Edit, ...]) -> str:
    """The edits as JSON, for a process in a vLLM venv (``from_json`` reads them back)."""
    return json.dumps([asdict(edit) for edit in edits])


def from_json(text: str) -> tuple[Edit, ...]:
    return tuple(Edit(**edit) for edit in json.loads(text))


STAMP = ".dspark-hotfix-reverted"
USAGE = "usage: python tests/real_vllm/revert.py SRC_VLLM_PACKAGE_DIR DEST_DIR"


class RevertError(RuntimeError):
    pass


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _enclosing(lines: list[str], index: int) -> list[str]:
    """The names of the ``def``/``class`` blocks around ``lines[index]``, outermost first."""
    names: list[str] = []
    depth = _indent(lines[index])
    for line in reversed(lines[:index]):
        stripped = line.lstrip()
        if (
            stripped
            and _indent(line) < depth
            and stripped.startswith(("def ", "class ", "async def "))
        ):
            names.insert(0, stripped.split("(")[0].split(":")[0].split()[-1])
            depth = _indent(line)
    return names


def edited_text(source: Path, edit: Edit, text: str | None = None) -> str:
    """The text of ``source`` (or ``text``, its text so far) with ``edit`` applied, or RevertError
    naming what was expected."""
    lines = (source.read_text() if text is None else text).splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.strip() == edit.line]
    where = f"{source}: expected exactly one line `{edit.line}` in {edit.function}"
    if len(hits) != 1:
        raise RevertError(
            f"{where}, found {len(hits)}: this vLLM differs from the release the revert was"
            " written for"
        )
    (index,) = hits
    owner = ".".join(_enclosing(lines, index))
    if owner != edit.function:
        raise RevertError(f"{where}, found it in {owner or 'module level'} (line {index + 1})")
    if edit.replacement is None:
        del lines[index]
    else:
        line = lines[index]
        lines[index] = line[: _indent(line)] + edit.replacement + "\n"
    return "".join(lines)


def revert(src: Path | str, dest: Path | str, edits: tuple[Edit, ...]) -> Path:
    """Build ``dest/vllm``: ``src`` (an installed ``vllm`` package) with ``edits`` applied.

    Returns the package directory of the copy. ``dest`` is replaced atomically,
    so a concurrent or interrupted build never leaves a half-made copy in use.
    """
    src, dest = Path(src).resolve(), Path(dest)
    if not (src / "__init__.py").is_file():
        raise RevertError(f"{src}: not a package directory (expected the installed vllm package)")
    if not edits:
        raise RevertError("no edits: no patch declares a line to revert")
    texts: dict[str, str] = {}
    for edit in edits:  # all found before anything is built; two edits of one file both apply
        texts[edit.path] = edited_text(src / edit.path, edit, texts.get(edit.path))
    real_dirs = {Path(".")} | {parent for path in texts for parent in Path(path).parents}
    staging = dest.parent / f".{dest.name}.{os.getpid()}.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    package = staging / src.name
    for rel in sorted(real_dirs):
        (package / rel).mkdir(parents=True)
        for entry in (src / rel).iterdir():
            here = rel / entry.name
            if entry.name == "__pycache__" or here in real_dirs:
                continue
            if here.as_posix() in texts:
                (package / here).write_text(texts[here.as_posix()])
            else:
                (package / here).symlink_to(entry, target_is_directory=entry.is_dir())
    digest = hashlib.sha256("".join(texts[path] for path in sorted(texts)).encode()).hexdigest()
    stamp = json.dumps({"source": str(src), "edited": sorted(texts), "sha256": digest}) + "\n"
    (staging / STAMP).write_text(stamp)
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.rename(staging, dest)
    except OSError:  # dest exists
        if (dest / STAMP).is_file() and (dest / STAMP).read_text() == stamp:
            shutil.rmtree(
                staging
            )  # the same copy, built already (perhaps by a concurrent run): keep it
        else:
            shutil.rmtree(dest)
            os.rename(staging, dest)
    return dest / src.name


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        package = revert(argv[0], argv[1], declared_edits())
    except RevertError as exc:
        print(f"revert: {exc}", file=sys.stderr)
        return 1
    print(package)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
