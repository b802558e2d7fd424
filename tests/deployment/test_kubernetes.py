"""deploy/kubernetes/, the A/B's two arms docs/OPERATORS.md points at: valid, apart, and consistent.

The init container's decision runs here on the stand-in, doctor included; its whole script runs for
real in the OCI tier (tests/oci/test_oci_image.py).
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark_hotfix
from dspark_hotfix.startup import sitecustomize
from scripts import dist
from tests import kubernetes
from tests.cache import offline
from tests.conftest import REPO, STANDIN


@pytest.fixture(scope="module")
def site():
    return kubernetes.validator_site()


@pytest.mark.parametrize("arm", sorted(kubernetes.ARMS))
@pytest.mark.parametrize("version", kubernetes.KUBERNETES)
def test_each_arm_passes_the_kubernetes_schemas_offline(site, version, arm):
    # --strict: an unknown or misspelled field fails, as the API server's field validation does.
    proc = kubernetes.validate(site, kubernetes.ARMS[arm], version, prefix=offline())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    minor = version.rsplit(".", 1)[0]
    assert (
        f"passed for resource deployment/vllm-dspark-{arm} against version {minor}" in proc.stdout
    )


def test_the_b_arm_is_the_a_arm_with_the_shim_off_under_its_own_name_selector_and_label(site):
    (a,), (b,) = (kubernetes.documents(site, kubernetes.ARMS[arm]) for arm in ("a", "b"))
    # Applying one never replaces the other, and neither Deployment's selector takes the other's
    # pods.
    assert a["metadata"]["name"] != b["metadata"]["name"]
    for mine, other in ((a, b), (b, a)):
        selector, labels = (
            mine["spec"]["selector"]["matchLabels"],
            mine["spec"]["template"]["metadata"]["labels"],
        )
        assert selector.items() <= labels.items()
        assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
        assert mine["metadata"]["labels"]["arm"] == labels["arm"] == selector["arm"]
    # Everything else is the A arm's, with DSPARK_HOTFIX a false word in both containers.
    expected = copy.deepcopy(a)
    expected["metadata"]["name"] = b["metadata"]["name"]
    for labels in (
        expected["metadata"]["labels"],
        expected["spec"]["selector"]["matchLabels"],
        expected["spec"]["template"]["metadata"]["labels"],
    ):
        labels["arm"] = "b"
    spec = expected["spec"]["template"]["spec"]
    for container in (*spec["initContainers"], *spec["containers"]):
        (switch,) = [e for e in container["env"] if e["name"] == "DSPARK_HOTFIX"]
        assert switch["value"] in dspark_hotfix.TRUE_WORDS
        switch["value"] = "0"
    assert b == expected


def test_a_misspelled_field_fails_the_validation(site, tmp_path):
    broken = tmp_path / "deployment.yaml"
    broken.write_text(
        kubernetes.MANIFEST.read_text().replace("readOnly: true", "readonly: true", 1)
    )
    proc = kubernetes.validate(site, broken, kubernetes.KUBERNETES[-1])
    assert proc.returncode == 1 and "'readonly' was unexpected" in proc.stdout, (
        proc.stdout + proc.stderr
    )


def test_the_init_container_runs_the_serving_image_with_the_servers_environment(site):
    spec = kubernetes.pod(site)
    (init,), (server,) = spec["initContainers"], spec["containers"]
    # The volume is filled by the Python that imports it (bytecode, wrapt's extension).
    assert init["image"] == server["image"]
    init_env, server_env = kubernetes.env(init), kubernetes.env(server)
    assert {
        k: init_env[k] for k in server_env
    } == server_env  # doctor judges the server's environment
    assert init_env["DSPARK_HOTFIX_VERSION"] == dspark_hotfix.__version__
    # The wrapt wheel make dist ships, the Dockerfile's pin.
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert (
        pinned
        and init_env["WRAPT_WHEEL"] == dist.WRAPT_WHEEL == f"wrapt-{pinned[1]}-py3-none-any.whl"
    )
    # doctor as a module: the volume's console script carries the shebang of wherever pip ran.
    assert (
        "python3 -m dspark_hotfix doctor" in init["args"][0]
        and "dspark-hotfix doctor" not in init["args"][0]
    )


def test_the_server_imports_the_shim_from_the_volume_it_mounts_read_only(site):
    spec = kubernetes.pod(site)
    (init,), (server,) = spec["initContainers"], spec["containers"]
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volume = mounts["dspark-hotfix"]
    assert volume["readOnly"] is True
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["dspark-hotfix"] == volume[
        "mountPath"
    ]
    root = volume["mountPath"]
    assert kubernetes.env(server)["PYTHONPATH"].split(":") == [
        f"{root}/dspark_hotfix/startup",
        root,
    ]
    assert f"--target {root} " in init["args"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["dspark-hotfix"]
    wheels = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["dspark-hotfix-wheels"]
    assert (
        f'"{wheels}/dspark_hotfix-${{DSPARK_HOTFIX_VERSION}}-py3-none-any.whl"' in init["args"][0]
    )


def test_the_uninstall_recipe_leaves_a_valid_deployment_without_the_shim(site, tmp_path):
    # What docs/OPERATORS.md's Kubernetes removal names, and nothing else.
    recipe = (
        (REPO / "docs/OPERATORS.md").read_text().split("**Kubernetes.**", 1)[1].split("\n\n", 1)[0]
    )
    recipe = " ".join(recipe.split())  # as it reads, however it is wrapped
    for named in (
        "`dspark-hotfix` init container",
        "`dspark-hotfix` and `dspark-hotfix-wheels` volumes",
        "`dspark-hotfix` volume mount",
        "`PYTHONPATH` and `DSPARK_HOTFIX` entries",
    ):
        assert named in recipe, named
    (deployment,) = kubernetes.documents(site)
    spec = deployment["spec"]["template"]["spec"]
    del spec["initContainers"]
    spec["volumes"] = [
        v for v in spec["volumes"] if v["name"] not in ("dspark-hotfix", "dspark-hotfix-wheels")
    ]
    for container in spec["containers"]:
        container["volumeMounts"] = [
            m for m in container["volumeMounts"] if m["name"] != "dspark-hotfix"
        ]
        container["env"] = [
            e for e in container["env"] if e["name"] not in ("PYTHONPATH", "DSPARK_HOTFIX")
        ]
        if not container["env"]:
            del container["env"]
    plain = tmp_path / "deployment.json"
    plain.write_text(json.dumps(deployment))
    text = plain.read_text()
    assert (
        "dspark_hotfix" not in text.lower()
        and "dspark-hotfix" not in text.lower()
        and "DSPARK_HOTFIX" not in text
    )
    proc = kubernetes.validate(site, plain, kubernetes.KUBERNETES[-1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_configmap_is_made_from_the_wheels_and_their_sums_the_init_container_checks(site):
    made = (
        "kubectl create configmap dspark-hotfix-wheels"
        f" --from-file=dist/dspark_hotfix-{dspark_hotfix.__version__}-"
    )
    for where in (kubernetes.MANIFEST, REPO / "docs" / "OPERATORS.md"):
        command = where.read_text().split(made, 1)[-1].split("\n\n")[0]
        assert made in where.read_text(), where
        assert (
            f"--from-file=dist/{dist.WRAPT_WHEEL}" in command
            and "--from-file=dist/SHA256SUMS" in command
        ), where
    # Each wheel's own line of SHA256SUMS checked before pip sees it; pip never asks an index.
    lines = kubernetes.pod(site)["initContainers"][0]["args"][0].replace("\\\n", " ").splitlines()
    installs = [n for n, line in enumerate(lines) if "pip install" in line]
    assert len(installs) == 2 and all("--no-index" in lines[n] for n in installs), lines
    wheels = ("dspark_hotfix-${DSPARK_HOTFIX_VERSION}-py3-none-any.whl", "${WRAPT_WHEEL}")
    for n, wheel in zip(installs, wheels, strict=True):
        assert (
            "| sha256sum -c" in lines[n - 1]
            and f"  {wheel}\\$" in lines[n - 1]
            and f'/{wheel}"' in lines[n]
        )


def doctors_step(site) -> str:
    """The init container's script from doctor on: what decides whether the pod starts."""
    script = kubernetes.pod(site)["initContainers"][0]["args"][0]
    assert script == kubernetes.pod(site, kubernetes.ARMS["b"])["initContainers"][0]["args"][0]
    return script[script.index("python3 -m dspark_hotfix doctor") :]


def start_on_the_standin(
    step: str, tmp: Path, values: list[str]
) -> list[subprocess.CompletedProcess[str]]:
    """The step run by sh as the init container runs it, doctor included, on the stand-in of the
    reported build (doctor exits 1 there with the shim off), once with DSPARK_HOTFIX set to each of
    ``values``."""
    # The image's python3: this one, with wrapt. A script, not a link: a link to a venv's
    # interpreter starts it outside the venv.
    (tmp / "python3").write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    (tmp / "python3").chmod(0o755)
    path = os.pathsep.join((sitecustomize_dir(), str(REPO), str(STANDIN)))

    def run(value: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": f"{tmp}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": path,
            "DSPARK_HOTFIX": value,
        }
        return subprocess.run(
            ["sh", "-euc", step], env=env, capture_output=True, text=True, timeout=120
        )

    with ThreadPoolExecutor(2) as pool:
        return list(pool.map(run, values))


def sitecustomize_dir() -> str:
    return str(Path(sitecustomize.__file__).parent)


def cases(word: str) -> list[str]:
    """``word`` in every mix of upper and lower case."""
    return [
        "".join(letters) for letters in itertools.product(*({c.lower(), c.upper()} for c in word))
    ]


WHITESPACE = [
    chr(c) for c in range(0x110000) if chr(c).isspace()
]  # what str.strip() takes off, Unicode's too


def check_starts(site, tmp: Path, values: list[str]) -> None:
    for value, proc in zip(
        values, start_on_the_standin(doctors_step(site), tmp, values), strict=True
    ):
        on, problem = dspark_hotfix.switch("DSPARK_HOTFIX", value, True, "the shim")
        b_arm = not on and problem is None
        said = proc.stdout + proc.stderr
        # The B arm starts, saying so; A starts on doctor's exit 0; any other value is refused with
        # doctor's exit 1.
        assert (proc.returncode, "the B arm" in proc.stdout) == (
            (0, True) if b_arm else (0 if on else 1, False)
        ), (value, said)


def test_the_init_container_starts_the_b_arm_for_exactly_the_false_words_the_shim_reads(
    site, tmp_path
):
    # Every word in every case, padded with whitespace the shim strips; the true words in every case
    # too.
    words = [
        w for word in (*dspark_hotfix.FALSE_WORDS, *dspark_hotfix.TRUE_WORDS) for w in cases(word)
    ]
    padded = [
        f"{WHITESPACE[n % len(WHITESPACE)]}{w}{WHITESPACE[-n % len(WHITESPACE)]}"
        for n, w in enumerate(words)
    ]
    check_starts(site, tmp_path, [*words, *padded])


@settings(max_examples=25, deadline=None)
@given(
    value=st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=12)
)
def test_any_other_value_is_refused_as_the_shim_reads_it(site, tmp_path_factory, value):
    check_starts(site, tmp_path_factory.mktemp("bin"), [value])


def bytes_of(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def test_the_init_container_has_the_memory_doctor_needs(site):
    # doctor imports vLLM: about 1 GB of memory on vLLM 0.25.0.
    resources = kubernetes.pod(site)["initContainers"][0]["resources"]
    assert bytes_of(resources["limits"]["memory"]) >= 1.5 * 2**30
    assert (
        2**30
        <= bytes_of(resources["requests"]["memory"])
        <= bytes_of(resources["limits"]["memory"])
    )
