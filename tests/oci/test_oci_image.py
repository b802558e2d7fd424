"""The Dockerfile built for real and its image run, with buildah (no daemon, no registry).

The base stands for a serving image of the reported build (tests/oci/build.py):
Debian bookworm, a venv on PATH, no wrapt, the stand-in vLLM installed, a
sitecustomize of the image's own. A second base carries the upstream fix and a
wrapt 2.x of its own. Base images are cached; the Dockerfile is built every run.
On the same bases, the pods of the A/B's two arms (deploy/kubernetes/): their init
container's commands as written there, without a network (``unshare --net``), then
the server's environment, the emptyDir a host directory, the ConfigMap a directory
holding make dist's wheels (the shim's and wrapt's) and their SHA256SUMS.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import dspark_hotfix
from dspark_hotfix.patches import ALL
from scripts import dist
from tests import kubernetes, status_shape
from tests.cache import unavailable
from tests.child import environ, import_present
from tests.conftest import REPO, json_lines, program
from tests.oci import build

pytestmark = pytest.mark.oci

REPORTED_ERROR = (
    "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
)


def container_says() -> dict[str, Any]:
    """What the container's process says: the shim's status, its pid, its wrapt, and the variables
    that matter."""
    import os

    import wrapt

    import dspark_hotfix

    return {
        "status": dspark_hotfix.status(),
        "pid": os.getpid(),
        "wrapt": wrapt.__version__,
        "wrapt_file": wrapt.__file__,
        "env": {
            k: os.environ.get(k) for k in ("IMAGE_SITECUSTOMIZE_PID", "PYTHONPATH", "DSPARK_HOTFIX")
        },
    }


def found_after_uninstall() -> list[bool]:
    """Whether the shim's package, and wrapt, can still be found."""
    import importlib.util

    return [
        importlib.util.find_spec("dspark_hotfix") is not None,
        importlib.util.find_spec("wrapt") is not None,
    ]


# Every patch's target module imported, then what the container's process says.
PROBE = program(partial(import_present, status_shape.target_modules()), container_says)
# The digest of a layer that changes nothing: an empty tar archive.
EMPTY_LAYER = f"sha256:{hashlib.sha256(bytes(1024)).hexdigest()}"
# A patch the reported build needs: the stand-in needs every correction
# (status_shape.fixes_installed).
NEEDED = next(p for p in ALL if not p.stops)


def names_every_patch(report: str) -> bool:
    """doctor's report lists each patch of ``patches.ALL``."""
    return all(p.name in report for p in ALL)


# The init container runs in a network namespace of its own with only a loopback: a cluster without
# internet access.
OFFLINE = ("unshare", "--net")


@pytest.fixture(scope="module")
def tools():
    try:
        build.ensure_tools()
        subprocess.run([*OFFLINE, "true"], check=True, capture_output=True)
        build.bookworm()  # Debian's archive, through debootstrap
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        unavailable(str(exc))


class Image:
    def __init__(self, base: str, tag: str, *build_args: str, layers: bool = False):
        self.base, self.tag = base, tag
        self.build = build.build_dockerfile(base, tag, *build_args, layers=layers)
        self.log = self.build.stdout + self.build.stderr
        self.container: str | None = None

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        assert self.build.returncode == 0, self.log[-4000:]
        if self.container is None:
            self.container = build.buildah("from", "--pull=never", self.tag).stdout.strip()
        return run_in(self.container, *argv, env=env)

    def json(self, *argv: str, env: dict[str, str] | None = None) -> dict:
        proc = self.run(*argv, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def remove(self) -> None:
        if self.container:
            build.buildah("rm", self.container, check=False)
        build.buildah("rmi", self.tag, check=False)


# Where a container's command writes its output: a directory of the host, mounted.
CAPTURED = "/dspark-hotfix-test-output"


def run_in(
    container: str,
    *argv: str,
    env: dict[str, str] | None = None,
    volumes: tuple[str, ...] = (),
    prefix: tuple[str, ...] = (),
) -> subprocess.CompletedProcess[str]:
    """``argv`` run in ``container``, its stdout and stderr written to files of the host. buildah's
    chroot isolation relays a command's pipes through a process of its own, which can end before it
    has passed on the last of them (buildah 1.28, Debian 12): a line written just before the command
    exits went missing."""
    with tempfile.TemporaryDirectory(prefix="dspark-hotfix-output-") as out:
        flags = [f"--env={k}={v}" for k, v in (env or {}).items()]
        flags += [f"--volume={v}" for v in (*volumes, f"{out}:{CAPTURED}")]
        redirected = ["sh", "-c", f'exec "$@" >{CAPTURED}/stdout 2>{CAPTURED}/stderr', "sh", *argv]
        proc = build.buildah(
            "run",
            "--isolation",
            "chroot",
            *flags,
            container,
            "--",
            *redirected,
            check=False,
            timeout=300,
            prefix=prefix,
        )
        said = {
            name: Path(out, name).read_text() if Path(out, name).exists() else ""
            for name in ("stdout", "stderr")
        }
    # buildah's own lines (a command that exits non-zero) come after the command's.
    return subprocess.CompletedProcess(
        proc.args, proc.returncode, said["stdout"] + proc.stdout, said["stderr"] + proc.stderr
    )


@pytest.fixture(scope="module")
def reported(tools):
    # One layer per instruction, as docker build makes them; the "fixed" images get buildah's one
    # layer.
    image = Image(
        build.serving("reported"),
        f"localhost/dspark-hotfix-oci/test-reported:{os.getpid()}",
        layers=True,
    )
    yield image
    image.remove()
    build.buildah(
        "rmi", "--prune", check=False
    )  # the layers' intermediate images (vfs keeps a full copy each)


@pytest.fixture(scope="module")
def fixed(tools):
    base = build.serving("fixed")
    refused = Image(base, f"localhost/dspark-hotfix-oci/test-fixed-refused:{os.getpid()}")
    allowed = Image(
        base, f"localhost/dspark-hotfix-oci/test-fixed:{os.getpid()}", "ALLOW_NOT_NEEDED=1"
    )
    yield SimpleNamespace(refused=refused, allowed=allowed)
    refused.remove()
    allowed.remove()
    build.buildah("rmi", "--prune", check=False)


def test_the_image_builds_on_the_reported_build_and_doctor_passes_at_build_and_in_it(reported):
    assert reported.build.returncode == 0, reported.log[-4000:]
    assert re.search(
        r"STEP \d+/\d+: RUN PYTHONDONTWRITEBYTECODE=1 \$\{PYTHON\} -m dspark_hotfix doctor",
        reported.log,
    )
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
    pinned = re.search(
        r"^ARG WRAPT=wrapt==(\S+)$", (build.REPO / "Dockerfile").read_text(), re.MULTILINE
    )
    assert pinned and got["wrapt"] == pinned[1]


def test_the_engine_starts_and_the_b_arm_crashes_as_reported(reported):
    on = reported.json("python3", "/opt/standin/warmup.py")
    assert on["error"] is None and on["views"]["draft.0.swa"]["shape"] == [4, 64, 584]
    off = reported.json("python3", "/opt/standin/warmup.py", env={"DSPARK_HOTFIX": "0"})
    assert off["error"] == REPORTED_ERROR and off["views"]["draft.0.swa"]["shape"] == [4, 64, 512]


def test_the_image_is_labelled_keeps_no_wheel_and_adds_one_non_empty_layer_built_as_docker_does(
    reported,
):
    assert reported.build.returncode == 0, reported.log[-4000:]
    labels = json.loads(build.buildah("inspect", "--type", "image", reported.tag).stdout)["OCIv1"][
        "config"
    ]["Labels"]
    assert labels["org.opencontainers.image.version"] == dspark_hotfix.__version__
    assert labels["io.dspark-hotfix.version"] == dspark_hotfix.__version__
    found = reported.run("find", "/", "-xdev", "-name", "dspark_hotfix-*.whl")
    assert found.returncode == 0 and found.stdout.strip() == ""
    # Built one layer per instruction, one layer holds anything: the package, wrapt and the link.
    # The doctor step, which imports vLLM, adds an empty one (an empty tar: 1024 zero bytes), as
    # docker build's 0 B layer.
    added = build.layers_above(reported.tag, reported.base)
    print(f"layers on the base, newest first: {[layer['diff-size'] for layer in added]} bytes")
    (layer,) = [layer for layer in added if layer["diff-digest"] != EMPTY_LAYER]
    assert 0 < layer["diff-size"] < 2_000_000


def test_built_as_buildah_does_by_default_the_shim_adds_one_layer(fixed):
    assert fixed.allowed.build.returncode == 0, fixed.allowed.log[-4000:]
    (layer,) = build.layers_above(fixed.allowed.tag, fixed.allowed.base)
    assert 0 < layer["diff-size"] < 2_000_000


def test_a_base_that_needs_no_fix_builds_only_when_allowed(fixed):
    assert fixed.refused.build.returncode != 0
    assert "exit status 3" in fixed.refused.log and "ALLOW_NOT_NEEDED=1" in fixed.refused.log
    assert fixed.allowed.build.returncode == 0, fixed.allowed.log[-4000:]
    assert "built because ALLOW_NOT_NEEDED=1" in fixed.allowed.log
    got = fixed.allowed.json("python3", "-c", PROBE)
    assert {row["state"] for row in status_shape.rows(got["status"]).values()} == {"not_needed"}
    assert got["wrapt"].startswith("2.")  # the image's own wrapt, kept
    assert fixed.allowed.json("python3", "/opt/standin/warmup.py")["error"] is None


def test_the_images_uninstall_recipe_leaves_vllm_as_shipped(reported):
    (recipe,) = [
        b
        for b in re.findall(
            r"^```sh\n(.*?)^```", (REPO / "docs/OPERATORS.md").read_text(), re.MULTILINE | re.DOTALL
        )
        if "pip uninstall -y dspark-hotfix" in b
    ]
    container = build.buildah("from", "--pull=never", reported.tag).stdout.strip()
    try:
        done = run_in(container, "sh", "-euc", recipe)
        assert done.returncode == 0, done.stdout + done.stderr
        off = run_in(container, "python3", "/opt/standin/warmup.py")
        assert off.returncode == 0 and "dspark_hotfix" not in off.stdout + off.stderr, (
            off.stdout + off.stderr
        )
        assert json.loads(off.stdout.splitlines()[-1])["error"] == REPORTED_ERROR
        # pip removes no dependency: the wrapt the Dockerfile installed stays, unused.
        found = run_in(container, "python3", "-c", program(found_after_uninstall))
        assert json_lines(found.stdout) == [[False, True]], found.stdout + found.stderr
        image = run_in(
            container, "python3", "-c", program(partial(environ, "IMAGE_SITECUSTOMIZE_PID"))
        )
        assert image.returncode == 0 and json_lines(image.stdout)[0] is not None, (
            image.stdout + image.stderr
        )
    finally:
        build.buildah("rm", container, check=False)


class Pod:
    """An arm's pod on ``base``: the init container run as written, then one server container."""

    def __init__(
        self,
        base: str,
        wheels: tuple[Path, ...],
        root: Path,
        site: Path,
        sums: str | None = None,
        arm: str = "a",
        **init_env: str,
    ):
        spec = kubernetes.pod(site, kubernetes.ARMS[arm])
        (self.init,), (self.server,) = spec["initContainers"], spec["containers"]
        self.base, self.volume, configmap = base, root / "emptyDir", root / "configMap"
        self.volume.mkdir(parents=True)
        configmap.mkdir()
        # kubectl create configmap dspark-hotfix-wheels --from-file=<each wheel>
        # --from-file=<SHA256SUMS>
        for wheel in wheels:
            shutil.copy(wheel, configmap)
        (configmap / "SHA256SUMS").write_text(sha256sums(*wheels) if sums is None else sums)
        self.hosts = {"dspark-hotfix": self.volume, "dspark-hotfix-wheels": configmap}
        self.containers: dict[str, str] = {}
        self.init_run = self.start(
            self.init, [*self.init["command"], *self.init["args"]], prefix=OFFLINE, **init_env
        )

    def start(
        self, container: dict, argv: list[str], prefix: tuple[str, ...] = (), **env: str
    ) -> subprocess.CompletedProcess[str]:
        volumes = tuple(
            f"{self.hosts[m['name']]}:{m['mountPath']}" + (":ro" if m.get("readOnly") else "")
            for m in container["volumeMounts"]
            if m["name"] in self.hosts
        )
        if container["name"] not in self.containers:
            self.containers[container["name"]] = build.buildah(
                "from", "--pull=never", self.base
            ).stdout.strip()
        return run_in(
            self.containers[container["name"]],
            *argv,
            env={**kubernetes.env(container), **env},
            volumes=volumes,
            prefix=prefix,
        )

    def serve(self, *argv: str, **env: str) -> dict:
        proc = self.start(self.server, list(argv), (), **env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(proc.stdout.strip().splitlines()[-1])

    def remove(self) -> None:
        for name in self.containers.values():
            build.buildah("rm", name, check=False)


def sha256sums(*wheels: Path) -> str:
    """make dist's lines for the wheels."""
    return "".join(
        f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in sorted(wheels)
    )


@pytest.fixture(scope="module")
def wrapt_wheel(tmp_path_factory) -> Path:
    """The wrapt wheel make dist ships, fetched and checked as make dist does."""
    try:
        return dist.wrapt_wheel(tmp_path_factory.mktemp("wrapt"))
    except SystemExit as exc:
        unavailable(str(exc))


@pytest.fixture
def pods(wrapt_wheel):
    """Pods of an arm: ``pods(base, wheel, root, site, ...)``, the ConfigMap holding ``wheel`` and
    wrapt's."""
    made: list[Pod] = []

    def make(base, wheel, *args, **env) -> Pod:
        made.append(Pod(base, (wheel, wrapt_wheel), *args, **env))
        return made[-1]

    yield make
    for pod in made:
        pod.remove()


@pytest.fixture(scope="module")
def site():
    return kubernetes.validator_site()


def test_the_manifests_init_container_fills_the_volume_and_the_server_is_patched_from_it(
    tools, site, wheel, tmp_path, pods
):
    pod = pods(build.serving("reported"), wheel, tmp_path, site)
    assert pod.init_run.returncode == 0, pod.init_run.stdout + pod.init_run.stderr
    assert f"{wheel.name}: OK" in pod.init_run.stdout  # sha256sum -c
    assert (
        f"{dist.WRAPT_WHEEL}: OK" in pod.init_run.stdout
    )  # the base has none: the ConfigMap's, checked
    assert "PROBLEM" not in pod.init_run.stdout and names_every_patch(
        pod.init_run.stdout
    )  # doctor's report
    # The base has no wrapt: the volume holds the Dockerfile's pin, and the server imports it from
    # there.
    got = pod.serve("python3", "-c", PROBE)
    assert status_shape.fixes_installed(got["status"]), got["status"]
    assert status_shape.activated_by(got["status"]) == "sitecustomize"
    assert got["wrapt"] == kubernetes.env(pod.init)["WRAPT_WHEEL"].split("-")[1]
    assert got["wrapt_file"].startswith("/opt/dspark-hotfix/wrapt/")
    assert (pod.volume / "wrapt").is_dir() and (
        pod.volume / "dspark_hotfix" / "startup" / "sitecustomize.py"
    ).exists()
    assert pod.serve("python3", "/opt/standin/warmup.py")["error"] is None
    assert (
        pod.serve("python3", "/opt/standin/warmup.py", DSPARK_HOTFIX="0")["error"] == REPORTED_ERROR
    )


def test_on_a_base_with_its_own_wrapt_the_volume_holds_none_and_a_vllm_that_needs_no_fix_starts(
    tools, site, wheel, tmp_path, pods
):
    # doctor exits 3 (removable): an upgraded vLLM starts, and /metrics says the shim can go.
    pod = pods(build.serving("fixed"), wheel, tmp_path, site)
    assert pod.init_run.returncode == 0, pod.init_run.stdout + pod.init_run.stderr
    assert (
        "verdict       removable" in pod.init_run.stdout
        and "removable: this vLLM needs none" in pod.init_run.stdout
    )
    assert not (pod.volume / "wrapt").exists()
    # The image's wrapt 2.x is the one every package imports, the shim included: the volume shadows
    # nothing.
    got = pod.serve("python3", "-c", PROBE)
    assert got["wrapt"].startswith("2.") and got["wrapt_file"].startswith("/opt/venv/"), got
    assert {row["state"] for row in status_shape.rows(got["status"]).values()} == {"not_needed"}


def test_the_b_arm_starts_and_crashes_as_reported_while_the_a_arm_refuses_without_the_fix(
    tools, site, wheel, tmp_path, pods
):
    base = build.serving("reported")
    b_arm = pods(base, wheel, tmp_path / "b", site, arm="b")
    assert b_arm.init_run.returncode == 0, b_arm.init_run.stdout + b_arm.init_run.stderr
    assert (
        names_every_patch(b_arm.init_run.stdout) and "the B arm" in b_arm.init_run.stdout
    )  # doctor's report
    assert b_arm.serve("python3", "/opt/standin/warmup.py")["error"] == REPORTED_ERROR
    # Any false word the shim reads, in any case: here, one upper-case, padded.
    upper = pods(base, wheel, tmp_path / "upper", site, arm="b", DSPARK_HOTFIX=" False ")
    assert upper.init_run.returncode == 0 and "the B arm" in upper.init_run.stdout, (
        upper.init_run.stdout + upper.init_run.stderr
    )
    # Only those start a pod that doctor refuses: a typo, or the A arm with a needed patch left out,
    # does not.
    typo = pods(base, wheel, tmp_path / "typo", site, arm="b", DSPARK_HOTFIX="of")
    assert typo.init_run.returncode == 1, typo.init_run.stdout + typo.init_run.stderr
    excluded = pods(
        base, wheel, tmp_path / "excluded", site, DSPARK_HOTFIX_PATCHES=f"-{NEEDED.name}"
    )
    assert excluded.init_run.returncode == 1, excluded.init_run.stdout + excluded.init_run.stderr
    assert "the B arm" not in typo.init_run.stdout + excluded.init_run.stdout


def test_the_captured_output_of_a_container_is_whole(tools):
    # Much output on both streams, then a last line each, as the init container's script ends.
    container = build.buildah("from", "--pull=never", build.serving("reported")).stdout.strip()
    try:
        script = "seq 1 200000; seq 1 200000 >&2; echo last; echo last >&2; exit 3"
        proc = run_in(container, "sh", "-c", script)
    finally:
        build.buildah("rm", container, check=False)
    lines = [str(n) for n in range(1, 200001)] + ["last"]
    assert proc.returncode == 3
    assert proc.stdout.splitlines() == lines
    assert (
        proc.stderr.splitlines()[: len(lines)] == lines
    )  # then buildah's own line on the exit status


def test_a_wheel_that_its_sha256sums_does_not_list_is_refused_before_anything_is_installed(
    tools, site, wheel, tmp_path, pods
):
    base = build.serving("reported")
    # A wheel pip installs as readily, one file more, under the name SHA256SUMS lists with the built
    # one's sum.
    altered = tmp_path / "altered" / wheel.name
    altered.parent.mkdir()
    with zipfile.ZipFile(wheel) as built, zipfile.ZipFile(altered, "w") as copy:
        for item in built.infolist():
            copy.writestr(item, built.read(item))
        copy.writestr("dspark_hotfix/altered.py", "")
    refused = pods(base, altered, tmp_path / "altered-pod", site, sums=sha256sums(wheel))
    assert (
        refused.init_run.returncode != 0 and f"{wheel.name}: FAILED" in refused.init_run.stdout
    ), refused.init_run.stdout + refused.init_run.stderr
    assert list(refused.volume.iterdir()) == []
    # SHA256SUMS without the wheel's line: nothing to check is a refusal too.
    sdist = f"dspark_hotfix-{dspark_hotfix.__version__}.tar.gz"
    unlisted = pods(
        base,
        wheel,
        tmp_path / "unlisted",
        site,
        sums=f"{hashlib.sha256(b'').hexdigest()}  {sdist}\n",
    )
    assert unlisted.init_run.returncode != 0, unlisted.init_run.stdout + unlisted.init_run.stderr
    assert list(unlisted.volume.iterdir()) == []
