"""The Dockerfile built for real and its image run, with buildah (no daemon, no registry).

The base stands for a serving image of the reported build (tests/oci/build.py):
Debian bookworm, a venv on PATH, no wrapt, the stand-in vLLM installed, a
sitecustomize of the image's own. A second base carries the upstream fix and a
wrapt 2.x of its own. Base images are cached; the Dockerfile is built every run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from types import SimpleNamespace

import pytest

import dspark_hotfix
from tests import status_shape
from tests.oci import build

pytestmark = pytest.mark.oci

REPORTED_ERROR = "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
PROBE = """
import json, os
import vllm.v1.core.kv_cache_utils, vllm.v1.worker.gpu.attn_utils  # vLLM's order: the engine's, then the model's
import vllm.models.deepseek_v4.attention, vllm.models.deepseek_v4.nvidia.dspark
import vllm.v1.attention.backends.mla.sparse_swa, vllm.v1.worker.gpu.attn_utils
import dspark_hotfix, wrapt
print(json.dumps({"status": dspark_hotfix.status(), "pid": os.getpid(), "wrapt": wrapt.__version__,
                  "env": {k: os.environ.get(k) for k in ("IMAGE_SITECUSTOMIZE_PID", "PYTHONPATH", "DSPARK_HOTFIX")}}))
"""


def unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"the OCI tier cannot run in CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def tools():
    try:
        build.ensure_tools()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        unavailable(str(exc))


class Image:
    def __init__(self, base: str, tag: str, *build_args: str):
        self.base, self.tag = base, tag
        self.build = build.build_dockerfile(base, tag, *build_args)
        self.log = self.build.stdout + self.build.stderr
        self.container: str | None = None

    def run(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        assert self.build.returncode == 0, self.log[-4000:]
        if self.container is None:
            self.container = build.buildah("from", "--pull=never", self.tag).stdout.strip()
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        return build.buildah("run", "--isolation", "chroot", *flags, self.container, "--", *argv, check=False,
                             timeout=300)

    def json(self, *argv: str, env: dict[str, str] | None = None) -> dict:
        proc = self.run(*argv, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def remove(self) -> None:
        if self.container:
            build.buildah("rm", self.container, check=False)
        build.buildah("rmi", self.tag, check=False)


@pytest.fixture(scope="module")
def reported(tools):
    image = Image(build.serving("reported"), f"localhost/dspark-hotfix-oci/test-reported:{os.getpid()}")
    yield image
    image.remove()


@pytest.fixture(scope="module")
def fixed(tools):
    base = build.serving("fixed")
    refused = Image(base, f"localhost/dspark-hotfix-oci/test-fixed-refused:{os.getpid()}")
    allowed = Image(base, f"localhost/dspark-hotfix-oci/test-fixed:{os.getpid()}", "ALLOW_NOT_NEEDED=1")
    yield SimpleNamespace(refused=refused, allowed=allowed)
    refused.remove()
    allowed.remove()
    build.buildah("rmi", "--prune", check=False)


def test_the_image_builds_on_the_reported_build_and_doctor_passes_at_build_and_in_it(reported):
    assert reported.build.returncode == 0, reported.log[-4000:]
    assert re.search(r"STEP \d+/\d+: RUN \$\{PYTHON\} -m dspark_hotfix doctor", reported.log)
    doctor = reported.run("python3", "-m", "dspark_hotfix", "doctor")
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr


def test_vllm_imported_in_the_container_is_patched_by_the_image_environment(reported):
    got = reported.json("python3", "-c", PROBE)
    status = got["status"]
    assert status_shape.fixes_installed(status), status
    assert status_shape.activated_by(status) == "sitecustomize"
    assert status_shape.pid(status) == got["pid"]
    # The image's own sitecustomize ran in this very process: ours chained it.
    assert got["env"]["IMAGE_SITECUSTOMIZE_PID"] == str(got["pid"])
    # The base image's PYTHONPATH is kept, after the start-up directory.
    assert got["env"]["PYTHONPATH"] == "/opt/dspark_hotfix:/opt/image-lib"
    assert got["env"]["DSPARK_HOTFIX"] == "1"
    # The base had no wrapt: it got the Dockerfile's pin.
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", (build.REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert pinned and got["wrapt"] == pinned[1]


def test_the_engine_starts_and_the_b_arm_crashes_as_reported(reported):
    on = reported.json("python3", "/opt/standin/warmup.py")
    assert on["error"] is None and on["views"]["draft.0.swa"]["shape"] == [4, 64, 584]
    off = reported.json("python3", "/opt/standin/warmup.py", env={"DSPARK_HOTFIX": "0"})
    assert off["error"] == REPORTED_ERROR and off["views"]["draft.0.swa"]["shape"] == [4, 64, 512]


def test_the_image_is_labelled_with_the_version_and_keeps_no_wheel(reported):
    assert reported.build.returncode == 0, reported.log[-4000:]
    labels = json.loads(build.buildah("inspect", "--type", "image", reported.tag).stdout)["OCIv1"]["config"]["Labels"]
    assert labels["org.opencontainers.image.version"] == dspark_hotfix.__version__
    assert labels["io.dspark-hotfix.version"] == dspark_hotfix.__version__
    found = reported.run("find", "/", "-xdev", "-name", "dspark_hotfix-*.whl")
    assert found.returncode == 0 and found.stdout.strip() == ""
    # One layer on top of the base, small: the package, wrapt and the link.
    layer, base = build.top_layer(reported.tag), build.top_layer(reported.base)
    assert layer["parent"] == base["id"]
    assert 0 < layer["diff-size"] < 2_000_000
    print(f"shim layer: {layer['diff-size']} bytes")


def test_a_base_that_needs_no_fix_builds_only_when_allowed(fixed):
    assert fixed.refused.build.returncode != 0
    assert "exit status 3" in fixed.refused.log and "ALLOW_NOT_NEEDED=1" in fixed.refused.log
    assert fixed.allowed.build.returncode == 0, fixed.allowed.log[-4000:]
    assert "built because ALLOW_NOT_NEEDED=1" in fixed.allowed.log
    got = fixed.allowed.json("python3", "-c", PROBE)
    assert {row["state"] for row in status_shape.rows(got["status"]).values()} == {"not_needed"}
    assert got["wrapt"].startswith("2.")  # the image's own wrapt, kept
    assert fixed.allowed.json("python3", "/opt/standin/warmup.py")["error"] is None
