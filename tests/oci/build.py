"""OCI images for the Dockerfile's real build: base images made without any registry, and the build.

buildah builds and runs images without a daemon (vfs storage, chroot isolation).
A Debian bookworm root file system made by debootstrap is the root of every
image; on it, a serving image of the reported build: a venv at /opt/venv on
PATH (as vLLM's own images have), no wrapt, the stand-in vLLM installed in the
venv, and a sitecustomize of the image's own (Debian's /etc/python3.11 one)
that records the pid it ran in. Images are tagged with a hash of what went into
them, so a second run reuses them. Storage lives under the project's cache
(``$DSPARK_HOTFIX_CACHE``, default ``~/.cache/dspark-hotfix``), apart from any
other buildah state of the machine.

    # the base, and the Dockerfile built on it
    python -m tests.oci.build [reported|fixed] [NAME=VALUE ...]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.conftest import program

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = "python3,python3-venv,ca-certificates"
# The trust store of this machine goes into the images: package downloads inside
# a build go through the same network as the host's.
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")
STANDIN_VERSION = "0.23.1rc1.dev788+gfa4321de3"
SITE = "/opt/venv/lib/python3.11/site-packages"


def image_customisation() -> None:
    """The image's own sitecustomize: it says it ran in the process's environment, with the pid."""
    import os

    os.environ["IMAGE_SITECUSTOMIZE_PID"] = str(os.getpid())


IMAGE_SITECUSTOMIZE = program(image_customisation)
SERVING = """FROM {base}
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    PYTHONPATH=/opt/image-lib
COPY sitecustomize.py /tmp/image-sitecustomize.py
RUN python3 -m venv /opt/venv && mkdir -p /opt/image-lib \\
 && cat /tmp/image-sitecustomize.py >> /etc/python3.11/sitecustomize.py \\
 && rm /tmp/image-sitecustomize.py{extra}
COPY vllm {site}/vllm
COPY vllm-{version}.dist-info {site}/vllm-{version}.dist-info
COPY warmup.py /opt/standin/warmup.py
"""


def cache_dir() -> Path:
    return (
        Path(os.environ.get("DSPARK_HOTFIX_CACHE", Path.home() / ".cache" / "dspark-hotfix"))
        / "oci"
    )


def say(message: str) -> None:
    print(f"oci: {message}", file=sys.stderr, flush=True)


def ensure_tools() -> None:
    """buildah and debootstrap, installed from Debian when missing (this tier runs as root on
    Debian)."""
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            f"{', '.join(missing)} missing, and apt-get cannot install them here (needs root on"
            " Debian)"
        )
    say(f"installing {' '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *missing]):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
            )


def buildah(
    *args: str, check: bool = True, timeout: float = 1800, prefix: tuple[str, ...] = (), **kw
) -> subprocess.CompletedProcess[str]:
    storage = cache_dir()
    argv = [
        *prefix,
        "buildah",
        "--root",
        str(storage / "storage"),
        "--runroot",
        str(storage / "run"),
        "--storage-driver",
        "vfs",
        *args,
    ]
    env = {**os.environ, "BUILDAH_ISOLATION": "chroot", **kw.pop("env", {})}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, **kw)
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)}: exit"
            f" {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def has_image(name: str) -> bool:
    return buildah("inspect", "--type", "image", name, check=False).returncode == 0


def digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def tree_bytes(root: Path) -> bytes:
    files = sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    return b"".join(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes() for p in files)


def bookworm() -> str:
    """Debian bookworm (minbase) with python3 and venv, from debootstrap; no registry."""
    ca = HOST_CA.read_bytes() if HOST_CA.exists() else b""
    name = f"localhost/dspark-hotfix-oci/bookworm:{digest(MIRROR, PACKAGES, ca)}"
    if has_image(name):
        return name
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        proc = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={PACKAGES}",
                "bookworm",
                str(rootfs),
                MIRROR,
            ],
            capture_output=True,
            text=True,
            timeout=1200,
        )
        if proc.returncode != 0:
            raise RuntimeError(
                "debootstrap could not make Debian bookworm from"
                f" {MIRROR}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
            )
        if ca:
            shutil.copy(HOST_CA, rootfs / "etc/ssl/certs/ca-certificates.crt")
        for cache in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (rootfs / cache).glob("*"):
                if entry.is_file():
                    entry.unlink()
        container = buildah("from", "scratch").stdout.strip()
        try:
            buildah("copy", "--quiet", container, str(rootfs), "/")
            buildah(
                "config",
                "--env",
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "--cmd",
                "/bin/bash",
                container,
            )
            buildah("commit", "--quiet", container, name)
        finally:
            buildah("rm", container, check=False)
    prune(name.rsplit(":", 1)[0], name)
    say(f"built {name} in {time.monotonic() - start:.0f} s")
    return name


def serving(variant: str = "reported") -> str:
    """A serving image standing in for the one vLLM runs in: ``reported`` (the buggy build, no
    wrapt) or ``fixed`` (the build with the upstream fix, and a wrapt 2.x of its own)."""
    base = bookworm()
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-ctx-") as tmp:
        ctx = Path(tmp)
        extra = ""
        if variant == "fixed":
            sys.path.insert(0, str(REPO))
            from dspark_hotfix.patches import ALL
            from tests.conftest import edited_standin
            from tests.patches import fixed_edits

            edited_standin(ctx / "standin", fixed_edits(ALL))  # every patch's upstream fix
            extra = ' \\\n && /opt/venv/bin/pip install --no-cache-dir "wrapt>=2,<3"'
        elif variant == "reported":
            shutil.copytree(STANDIN, ctx / "standin", ignore=shutil.ignore_patterns("__pycache__"))
        else:
            raise ValueError(f"unknown variant {variant!r}")
        shutil.move(ctx / "standin" / "vllm", ctx / "vllm")
        shutil.move(ctx / "standin" / "warmup.py", ctx / "warmup.py")
        info = ctx / f"vllm-{STANDIN_VERSION}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: vllm\nVersion: {STANDIN_VERSION}\n"
        )
        (info / "INSTALLER").write_text("dspark-hotfix-tests\n")
        shutil.rmtree(ctx / "standin")
        text = SERVING.format(base=base, extra=extra, site=SITE, version=STANDIN_VERSION)
        (ctx / "Containerfile").write_text(text)
        (ctx / "sitecustomize.py").write_text(IMAGE_SITECUSTOMIZE)
        name = f"localhost/dspark-hotfix-oci/serving-{variant}:{digest(base, tree_bytes(ctx))}"
        if has_image(name):
            return name
        start = time.monotonic()
        buildah("bud", "--pull=never", "--isolation", "chroot", "-t", name, str(ctx))
    prune(name.rsplit(":", 1)[0], name)
    say(f"built {name} in {time.monotonic() - start:.0f} s")
    return name


def build_dockerfile(
    base: str, tag: str, *build_args: str, layers: bool = False
) -> subprocess.CompletedProcess[str]:
    """The project's Dockerfile built on ``base``; the wheel stage runs on the same image (it has
    pip). buildah commits one layer for the whole build; ``layers`` commits one per instruction, as
    docker build does."""
    args = [
        "bud",
        "--pull=never",
        "--isolation",
        "chroot",
        "--build-arg",
        f"VLLM_IMAGE={base}",
        "--build-arg",
        f"PYTHON_IMAGE={base}",
        "-t",
        tag,
        *(("--layers", "--no-cache") if layers else ()),
    ]
    for arg in build_args:
        args += ["--build-arg", arg]
    return buildah(*args, "-f", str(REPO / "Dockerfile"), str(REPO), check=False)


def top_layer(name: str) -> dict:
    """The image's newest layer as containers/storage records it: id, parent, diff-size (bytes,
    uncompressed)."""
    image_id = buildah(
        "inspect", "--type", "image", "--format", "{{.FromImageID}}", name
    ).stdout.strip()
    storage = cache_dir() / "storage"
    images = json.loads((storage / "vfs-images" / "images.json").read_text())
    layer_id = next(i["layer"] for i in images if i["id"] == image_id)
    return stored_layers()[layer_id]


def stored_layers() -> dict[str, dict]:
    layers = json.loads((cache_dir() / "storage" / "vfs-layers" / "layers.json").read_text())
    return {layer["id"]: layer for layer in layers}


def layers_above(name: str, base: str) -> list[dict]:
    """The layers image ``name`` adds on image ``base``, newest first."""
    layers, layer, stop = stored_layers(), top_layer(name), top_layer(base)["id"]
    added = []
    while layer["id"] != stop:
        added.append(layer)
        layer = layers[layer["parent"]]
    return added


def prune(repository: str, keep: str) -> None:
    """Drop the other tags of ``repository`` (images of older inputs) and dangling images."""
    names = buildah("images", "--format", "{{.Name}}:{{.Tag}}").stdout.split()
    stale = [n for n in names if n.rsplit(":", 1)[0] == repository and n != keep]
    if stale:
        buildah("rmi", *stale, check=False)
    buildah("rmi", "--prune", check=False)


def main(argv: list[str]) -> int:
    variant = argv[0] if argv else "reported"
    ensure_tools()
    base = serving(variant)
    tag = f"localhost/dspark-hotfix-oci/hotfix-{variant}:latest"
    proc = build_dockerfile(base, tag, *argv[1:])
    print(proc.stdout + proc.stderr)
    print(f"exit {proc.returncode}: {tag} on {base}")
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
