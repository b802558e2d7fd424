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
- wrapt's wheel ships beside the shim's, for images that have none (the
  Kubernetes recipe installs it with ``--no-index``): the Dockerfile's pin, as
  the pure-Python wheel (one file for every Python and CPU), fetched with pip
  and refused unless its bytes are the ones pinned here.

    python scripts/dist.py [OUTDIR]     # default dist/
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# wrapt's C extension only speeds up calls, and the shim's calls are made at start-up.
WRAPT_WHEEL = "wrapt-1.17.3-py3-none-any.whl"
WRAPT_SHA256 = "7171ae35d2c33d326ac19dd8facb1e82e5fd04ef8c6c0e394d7af55a55051c22"


def source_date_epoch() -> int:
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    out = subprocess.run(["git", "-C", str(REPO), "log", "-1", "--format=%ct"], check=True, capture_output=True,
                         text=True).stdout
    return int(out.strip())


def unpack(tar: tarfile.TarFile, dest: Path) -> None:
    # Python before 3.10.12 and 3.11.4 has no extraction filters; the archives are our own.
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
    else:
        tar.extractall(dest)


def commit_tree(dest: Path) -> Path:
    """HEAD's files, as git stores them, in ``dest``."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", "HEAD"], check=True,
                             capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        unpack(tar, dest)
    return dest


def build(kind: str, source: Path, outdir: Path, epoch: int) -> Path:
    env = {**os.environ, "SOURCE_DATE_EPOCH": str(epoch), "PYTHONHASHSEED": "0"}
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", f"--{kind}", "--outdir", str(outdir),
                           str(source)], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"dist: building the {kind} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    (built,) = outdir.glob("*.tar.gz" if kind == "sdist" else "*.whl")
    return built


def wrapt_wheel(outdir: Path) -> Path:
    """``WRAPT_WHEEL`` in ``outdir``, from pip's index (or its cache), with the pinned sum."""
    version = WRAPT_WHEEL.split("-")[1]
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-wrapt-") as tmp:
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                               "--no-deps", "--only-binary=:all:", "--platform", "any", "--implementation", "py",
                               "--abi", "none", "--python-version", "3.10", "--dest", tmp, f"wrapt=={version}"],
                              capture_output=True, text=True)
        fetched = Path(tmp) / WRAPT_WHEEL
        if proc.returncode != 0 or not fetched.exists():
            raise SystemExit(f"dist: could not fetch {WRAPT_WHEEL} (PIP_INDEX_URL names a mirror):\n"
                             f"{proc.stderr[-3000:]}")
        data = fetched.read_bytes()
    if hashlib.sha256(data).hexdigest() != WRAPT_SHA256:
        raise SystemExit(f"dist: {WRAPT_WHEEL} has sha256 {hashlib.sha256(data).hexdigest()}, not {WRAPT_SHA256}")
    (outdir / WRAPT_WHEEL).write_bytes(data)
    return outdir / WRAPT_WHEEL


def normalized_sdist(sdist: Path, epoch: int) -> bytes:
    """The sdist's members, sorted, with one time, one owner and modes 0644/0755, in a gzip without name or time."""
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
    outdir = Path(argv[0]) if argv else REPO / "dist"
    epoch = source_date_epoch()
    outdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-dist-") as tmp:
        work = Path(tmp)
        sdist = build("sdist", commit_tree(work / "commit"), work / "sdist", epoch)
        final_sdist = outdir / sdist.name
        final_sdist.write_bytes(normalized_sdist(sdist, epoch))
        with tarfile.open(final_sdist) as tar:
            unpack(tar, work / "src")
        (tree,) = (work / "src").iterdir()
        wheel = build("wheel", tree, work / "wheel", epoch)
        final_wheel = outdir / wheel.name
        shutil.copyfile(wheel, final_wheel)
    sums = "".join(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  {p.name}\n"
                   for p in sorted((final_sdist, final_wheel, wrapt_wheel(outdir)), key=lambda p: p.name))
    (outdir / "SHA256SUMS").write_text(sums)
    sys.stdout.write(sums)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
