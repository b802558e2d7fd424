"""Ray workers patched: which activation path reaches an actor's process, on a real Ray.

Ray (from PyPI) is installed once into a cached directory; each test builds a
small venv that sees it, with the stand-in vLLM installed (a .pth line) and,
where the test says so, the project's wheel. That venv's Python is the node's:
Ray starts its workers with it. Every cluster is local, one CPU, 100 MB of
object store, no dashboard, bounded in time, and stopped by process group:
nothing else on the machine is touched. Ray never uses the loopback address
when the machine has another one, so every Ray process runs in a network
namespace of the test's own that has only ``lo``: its traffic cannot leave it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import pytest

from tests import status_shape
from tests.cache import pip_target, unavailable
from tests.conftest import REPO, STANDIN, clean_env, program

pytestmark = pytest.mark.ray

RAY = "ray==2.60.0"
DRIVER = Path(__file__).with_name("driver.py")
REPORTED_ERROR = (
    "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
)


@pytest.fixture(scope="session")
def ray_site() -> Path:
    """Ray and wrapt, installed once (about 25 s and 260 MB) and reused."""
    name = f"ray-{RAY.split('==')[1]}-py{sys.version_info[0]}{sys.version_info[1]}"
    return pip_target(name, f"{RAY} wrapt==1.17.3")


def node_python(root: Path, ray_site: Path, wheel: Path | None) -> str:
    """A venv standing in for a Ray node's image: Ray, wrapt and the stand-in vLLM; the wheel if
    given."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120
    )
    (site,) = root.glob("lib/python*/site-packages")
    (site / "node.pth").write_text(f"{STANDIN}\n{ray_site}\n")
    if wheel is not None:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
                "--target",
                str(site),
                str(wheel),
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    return str(root / "bin" / "python")


@pytest.fixture(scope="session")
def netns():
    """The command prefix that runs a process in a network namespace with only loopback."""
    name = f"dspark-ray-{os.getpid()}"
    made = (
        subprocess.run(["ip", "netns", "add", name], capture_output=True, text=True)
        if shutil.which("ip")
        else None
    )
    if made is None or made.returncode != 0:
        unavailable(
            "cannot make a network namespace for Ray (needs root and iproute2): "
            f"{made.stderr.strip() if made else 'no ip command'}"
        )
    try:
        subprocess.run(["ip", "netns", "exec", name, "ip", "link", "set", "lo", "up"], check=True)
        yield ["ip", "netns", "exec", name]
    finally:
        subprocess.run(["ip", "netns", "delete", name], check=False)


# `ray start` turns token authentication on; every process of a test's cluster gets this token.
TOKEN = secrets.token_hex(16)


def ray_env(**extra: str) -> dict[str, str]:
    return clean_env(
        RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=TOKEN, **extra
    )


def processes() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, process group) of every process."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid, pgrp = stat.read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        found.append((int(stat.parent.name), state, int(ppid), int(pgrp)))
    return found


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for child, _, ppid, _ in processes():
        children.setdefault(ppid, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def stop_group(proc: subprocess.Popen) -> None:
    """Stop the processes we started: the session's group, and Ray's workers (sessions of their
    own)."""
    for pid in descendants(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    # Orphans of the group are reaped by whoever is pid 1; wait only for the living.
    deadline = time.monotonic() + 30
    while any(pgrp == proc.pid and state != "Z" for _, state, _, pgrp in processes()):
        assert time.monotonic() < deadline, f"processes of group {proc.pid} outlived SIGKILL"
        time.sleep(0.2)


def drive(netns: list[str], python: str, config: dict, env: dict[str, str], cwd: Path) -> dict:
    """Run the driver in a session of its own; whatever it leaves running is stopped with it."""
    proc = subprocess.Popen(
        [*netns, python, str(DRIVER), json.dumps(config)],
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        stop_group(proc)
    assert proc.returncode == 0, f"driver exit {proc.returncode}\n{out}\n{err[-4000:]}"
    return json.loads(out.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def short_tmp():
    # Ray's socket paths must stay under the 107-byte limit of AF_UNIX.
    with tempfile.TemporaryDirectory(prefix="rt") as tmp:
        yield Path(tmp)


@pytest.fixture
def head(short_tmp, netns):
    """A Ray head started on its own (``ray start --block``), its environment given by the test."""
    started: list[subprocess.Popen] = []

    def start(python: str, env: dict[str, str]) -> str:
        port = free_port()
        log = (short_tmp / "head.log").open("wb")
        proc = subprocess.Popen(
            [
                *netns,
                python,
                "-m",
                "ray.scripts.scripts",
                "start",
                "--head",
                "--block",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                "--num-cpus=1",
                "--object-store-memory=100000000",
                "--include-dashboard=false",
                f"--temp-dir={short_tmp / 'head'}",
                "--disable-usage-stats",
            ],
            env=env,
            cwd=short_tmp,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(proc)
        address = f"127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert proc.poll() is None, (
                f"ray start exited {proc.returncode}: {Path(log.name).read_text()[-4000:]}"
            )
            check = subprocess.run(
                [*netns, python, "-c", program(partial(ray_reachable, address))],
                env=env,
                cwd=short_tmp,
                capture_output=True,
                timeout=120,
            )
            if check.returncode == 0:
                return address
            time.sleep(1)
        raise AssertionError("the Ray head did not come up within 120 s")

    yield start
    for proc in started:
        stop_group(proc)


def ray_reachable(address: str) -> None:
    import ray

    ray.init(address=address)
    ray.shutdown()


def local_config(tmp: Path, **kw) -> dict:
    return {"address": None, "temp_dir": str(tmp / "ray"), "load_plugins": False, **kw}


def test_installed_wheel_patches_an_actor_through_vllms_plugin_loader(
    netns, ray_site, wheel, tmp_path, short_tmp
):
    python = node_python(tmp_path / "node", ray_site, wheel)
    got = drive(netns, python, local_config(short_tmp, load_plugins=True), ray_env(), short_tmp)
    actor = got["actor"]
    assert actor["pid"] != got["driver_pid"] and actor["early"] is False
    assert status_shape.activated_by(actor["status"]) == "vllm-plugin"
    assert status_shape.fixes_installed(actor["status"]), actor["status"]
    assert actor["warmup_error"] is None


def test_pythonpath_in_runtime_env_patches_an_actor_at_interpreter_start(
    netns, ray_site, tmp_path, short_tmp
):
    python = node_python(tmp_path / "node", ray_site, wheel=None)
    runtime_env = {"env_vars": {"PYTHONPATH": f"{REPO}:{STANDIN}"}}
    got = drive(
        netns, python, local_config(short_tmp, runtime_env=runtime_env), ray_env(), short_tmp
    )
    actor = got["actor"]
    assert got["driver_pythonpath"] is None and actor["pid"] != got["driver_pid"]
    assert actor["early"] is True
    assert status_shape.activated_by(actor["status"]) == "sitecustomize"
    assert status_shape.fixes_installed(actor["status"]), actor["status"]
    assert actor["warmup_error"] is None


def test_on_a_separately_started_node_only_the_nodes_own_install_or_environment_counts(
    netns, ray_site, wheel, tmp_path, short_tmp, head
):
    # The node has vLLM but not the shim; the driver has the shim on its PYTHONPATH and the switch
    # set.
    bare = node_python(tmp_path / "bare", ray_site, wheel=None)
    address = head(bare, ray_env())
    driver_env = ray_env(PYTHONPATH=f"{REPO}:{STANDIN}", DSPARK_HOTFIX="1")
    got = drive(netns, bare, {"address": address, "load_plugins": True}, driver_env, short_tmp)
    actor = got["actor"]
    # Neither PYTHONPATH nor the switch reaches the worker: it runs vLLM as shipped and crashes.
    assert actor["env"] == {"PYTHONPATH": None, "DSPARK_HOTFIX": None}
    assert actor["early"] is False and actor["status"] is None
    assert actor["warmup_error"] == REPORTED_ERROR


def test_on_a_separately_started_node_the_wheel_patches_and_runtime_env_carries_the_switch(
    netns, ray_site, wheel, tmp_path, short_tmp, head
):
    node = node_python(tmp_path / "node", ray_site, wheel)
    address = head(node, ray_env())
    driver_env = ray_env(DSPARK_HOTFIX="0")  # set in the driver only: the workers never see it
    got = drive(netns, node, {"address": address, "load_plugins": True}, driver_env, short_tmp)
    assert status_shape.activated_by(got["actor"]["status"]) == "vllm-plugin"
    assert (
        status_shape.fixes_installed(got["actor"]["status"])
        and got["actor"]["warmup_error"] is None
    )
    off = drive(
        netns,
        node,
        {
            "address": address,
            "load_plugins": True,
            "runtime_env": {"env_vars": {"DSPARK_HOTFIX": "0"}},
        },
        ray_env(),
        short_tmp,
    )
    assert off["actor"]["env"]["DSPARK_HOTFIX"] == "0"
    assert {row["state"] for row in status_shape.rows(off["actor"]["status"]).values()} == {
        "disabled"
    }
    assert off["actor"]["warmup_error"] == REPORTED_ERROR


def test_on_a_separately_started_node_pythonpath_in_the_nodes_environment_patches_at_start(
    netns, ray_site, tmp_path, short_tmp, head
):
    bare = node_python(tmp_path / "bare", ray_site, wheel=None)
    address = head(bare, ray_env(PYTHONPATH=f"{REPO}:{STANDIN}"))
    got = drive(netns, bare, {"address": address, "load_plugins": False}, ray_env(), short_tmp)
    actor = got["actor"]
    assert actor["early"] is True and status_shape.activated_by(actor["status"]) == "sitecustomize"
    assert status_shape.fixes_installed(actor["status"]) and actor["warmup_error"] is None
