"""Build the sdist and the wheel reproducibly, and write dist/SHA256SUMS.

Two builds of one commit are byte-identical, wherever they run:

- the source is the commit itself (``git archive HEAD``): an untracked file or
  an uncommitted edit never ships;
- every timestamp is ``SOURCE_DATE_EPOCH`` (default: the last commit's time);
  setuptools' bdist_wheel honours it, its sdist does not (tar and gzip headers
  carry the build's clock and the checkout's mtimes), so the sdist is written
  again here with sorted members, that time, owner root and modes 0644/0755;
- the wheel is built from that sdist, the way ``python -m build`` does, so its
  files' modes come from the sdist, not from the umask of the checkout;
- the build backend is the one installed (``--no-isolation``): setuptools and
  wheel pinned in requirements-dev.txt, not whatever the index has that day;
- the build runs under umask 022, whatever the caller's: setuptools writes the
  wheel's files with modes the umask decides;
- wrapt's wheel ships beside the shim's, for images that have none (the
  Kubernetes recipe installs it with ``--no-index``): the Dockerfile's pin, as
  the pure-Python wheel (one file for every Python and CPU), fetched with pip
  once and kept in the project's cache (``$DSPARK_HOTFIX_CACHE``), so a rebuild
  needs no network; refused unless its bytes are the ones pinned here.

A commit is a release where it is the one that set ``__version__`` (the CHANGELOG
names it). Any other commit is built as ``VERSION.postN.dev0+gHASH``: N commits
after release VERSION, at commit HASH (PEP 440: later than the release, never it).

    python scripts/dist.py [OUTDIR]     # default dist/
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # run as a script too
from scripts.venvs import cache_dir  # noqa: E402

# wrapt's C extension only speeds up calls, and the shim's calls are made at start-up.
WRAPT_WHEEL = "wrapt-1.17.3-py3-none-any.whl"
WRAPT_SHA256 = "7171ae35d2c33d326ac19dd8facb1e82e5fd04ef8c6c0e394d7af55a55051c22"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    return int(git("log", "-1", "--format=%ct"))


def versioned(tree: Path) -> str:
    """The version ``tree`` (HEAD's files) is built as; a commit after the release gets its own, in
    its ``__init__.py``, so that neither the files' names nor what the shim says name it as the
    release."""
    init = tree / "dspark_hotfix" / "__init__.py"
    source = init.read_text()
    release = re.search(r'^__version__ = "([^"]+)"$', source, re.MULTILINE)
    if release is None:
        raise SystemExit(f"dist: no __version__ line in {init}")
    head, setter = (
        git("rev-parse", "HEAD"),
        git("log", "-1", "--format=%H", "-G", "^__version__ = ", "--", "dspark_hotfix/__init__.py"),
    )
    if head == setter:
        return release[1]
    version = f"{release[1]}.post{git('rev-list', '--count', f'{setter}..HEAD')}.dev0+g{head[:12]}"
    init.write_text(source.replace(release[0], f'__version__ = "{version}"'))
    return version


def unpack(tar: tarfile.TarFile, dest: Path) -> None:
    # Python before 3.10.12 and 3.11.4 has no extraction filters; the archives are our own.
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)


def commit_tree(dest: Path) -> Path:
    """HEAD's files, as git stores them, in ``dest``."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        unpack(tar, dest)
    return dest


def build(kind: str, source: Path, outdir: Path, epoch: int) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONHASHSEED": "0"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--no-isolation",
            f"--{kind}",
            "--outdir",
            str(outdir),
            str(source),
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"dist: building the {kind} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    (built,) = outdir.glob("*.tar.gz" if kind == "sdist" else "*.whl")
    return built


def wrapt_wheel(outdir: Path) -> Path:
    """``WRAPT_WHEEL`` in ``outdir``, with the pinned sum: the copy kept in the project's cache,
    else from pip's index, kept then."""
    kept = cache_dir() / "dist" / WRAPT_WHEEL
    data = kept.read_bytes() if kept.exists() else b""
    if hashlib.sha256(data).hexdigest() != WRAPT_SHA256:
        data = fetched_wrapt()
        kept.parent.mkdir(parents=True, exist_ok=True)
        partial = kept.with_name(
            f".{kept.name}.{os.getpid()}"
        )  # another build may read it meanwhile
        partial.write_bytes(data)
        partial.replace(kept)
    (outdir / WRAPT_WHEEL).write_bytes(data)
    return outdir / WRAPT_WHEEL


def fetched_wrapt() -> bytes:
    version = WRAPT_WHEEL.split("-")[1]
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-wrapt-") as tmp:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "--platform",
                "any",
                "--implementation",
                "py",
                "--abi",
                "none",
                "--python-version",
                "3.10",
                "--dest",
                tmp,
                f"wrapt=={version}",
            ],
            capture_output=True,
            text=True,
        )
        fetched = Path(tmp) / WRAPT_WHEEL
        if proc.returncode != 0 or not fetched.exists():
            raise SystemExit(
                f"dist: could not fetch {WRAPT_WHEEL} (PIP_INDEX_URL names a mirror):\n"
                f"{proc.stderr[-3000:]}"
            )
        data = fetched.read_bytes()
    if hashlib.sha256(data).hexdigest() != WRAPT_SHA256:
        raise SystemExit(
            f"dist: {WRAPT_WHEEL} has sha256 {hashlib.sha256(data).hexdigest()}, not {WRAPT_SHA256}"
        )
    return data


def normalized_sdist(sdist: Path, epoch: int) -> bytes:
    """The sdist's members, sorted, with one time, one owner and modes 0644/0755, in a gzip without
    name or time."""
    members = []
    with tarfile.open(sdist) as tar:
        for info in tar.getmembers():
            member = tar.extractfile(info) if info.isfile() else None
            data = member.read() if member is not None else None
            info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "root", "root"
            info.mode = 0o755 if info.isdir() or info.mode & 0o100 else 0o644
            info.pax_headers = {}
            members.append((info, data))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in sorted(members, key=lambda m: m[0].name):
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=epoch, compresslevel=9) as gz:
        gz.write(raw.getvalue())
    return packed.getvalue()


def main(argv: list[str]) -> int:
    umask = os.umask(0o022)  # for the builds; the caller's again after them
    try:
        return made(Path(argv[0]) if argv else REPO / "dist")
    finally:
        os.umask(umask)


def made(outdir: Path) -> int:
    epoch = source_date_epoch()
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-dist-") as tmp:
        work = Path(tmp)
        commit = commit_tree(work / "commit")
        versioned(commit)
        sdist = build("sdist", commit, work / "sdist", epoch)
        final_sdist = outdir / sdist.name
        final_sdist.write_bytes(normalized_sdist(sdist, epoch))
        with tarfile.open(final_sdist) as tar:
            unpack(tar, work / "src")
        (tree,) = (work / "src").iterdir()
        wheel = build("wheel", tree, work / "wheel", epoch)
        final_wheel = outdir / wheel.name
        shutil.copyfile(wheel, final_wheel)
    sums = "".join(
        f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
        for p in sorted((final_sdist, final_wheel, wrapt_wheel(outdir)), key=lambda p: p.name)
    )
    (outdir / "SHA256SUMS").write_text(sums)
    sys.stdout.write(sums)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
