"""deploy/kubernetes/deployment.yaml, the manifest docs/OPERATORS.md points at: valid, and consistent.

Its init container's commands run for real in the OCI tier (tests/oci/test_oci_image.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

import dspark_hotfix
from dspark_hotfix.startup import sitecustomize
from scripts import dist
from tests import kubernetes
from tests.cache import unavailable
from tests.conftest import REPO


@pytest.fixture(scope="module")
def site():
    return kubernetes.validator_site()


def offline() -> tuple[str, ...]:
    """A prefix that runs a command without any network (only a loopback), where this machine allows it."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "--net", "true"]).returncode != 0:
        unavailable("needs unshare --net (root) to run the validator without a network")
    return ("unshare", "--net")


@pytest.mark.parametrize("version", kubernetes.KUBERNETES)
def test_the_manifest_passes_the_kubernetes_schemas_offline(site, version):
    # --strict: an unknown or misspelled field fails, as the API server's field validation does.
    proc = kubernetes.validate(site, kubernetes.MANIFEST, version, prefix=offline())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"passed for resource deployment/vllm-dspark against version {version.rsplit('.', 1)[0]}" in proc.stdout


def test_a_misspelled_field_fails_the_validation(site, tmp_path):
    broken = tmp_path / "deployment.yaml"
    broken.write_text(kubernetes.MANIFEST.read_text().replace("readOnly: true", "readonly: true", 1))
    proc = kubernetes.validate(site, broken, kubernetes.KUBERNETES[-1])
    assert proc.returncode == 1 and "'readonly' was unexpected" in proc.stdout, proc.stdout + proc.stderr


def test_the_init_container_runs_the_serving_image_with_the_servers_environment(site):
    spec = kubernetes.pod(site)
    (init,), (server,) = spec["initContainers"], spec["containers"]
    # The volume is filled by the Python that imports it (bytecode, wrapt's extension).
    assert init["image"] == server["image"]
    init_env, server_env = kubernetes.env(init), kubernetes.env(server)
    assert {k: init_env[k] for k in server_env} == server_env  # doctor judges the server's environment
    assert init_env["DSPARK_HOTFIX_VERSION"] == dspark_hotfix.__version__
    # The wrapt wheel make dist ships, the Dockerfile's pin.
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", (REPO / "Dockerfile").read_text(), re.MULTILINE)
    assert pinned and init_env["WRAPT_WHEEL"] == dist.WRAPT_WHEEL == f"wrapt-{pinned[1]}-py3-none-any.whl"
    # doctor as a module: the volume's console script carries the shebang of wherever pip ran.
    assert "python3 -m dspark_hotfix doctor" in init["args"][0] and "dspark-hotfix doctor" not in init["args"][0]


def test_the_server_imports_the_shim_from_the_volume_it_mounts_read_only(site):
    spec = kubernetes.pod(site)
    (init,), (server,) = spec["initContainers"], spec["containers"]
    mounts = {m["name"]: m for m in server["volumeMounts"]}
    volume = mounts["dspark-hotfix"]
    assert volume["readOnly"] is True
    assert {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["dspark-hotfix"] == volume["mountPath"]
    root = volume["mountPath"]
    assert kubernetes.env(server)["PYTHONPATH"].split(":") == [f"{root}/dspark_hotfix/startup", root]
    assert f"--target {root} " in init["args"][0]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["dspark-hotfix"]
    wheels = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}["dspark-hotfix-wheels"]
    assert f'"{wheels}/dspark_hotfix-${{DSPARK_HOTFIX_VERSION}}-py3-none-any.whl"' in init["args"][0]


def test_the_uninstall_recipe_leaves_a_valid_deployment_without_the_shim(site, tmp_path):
    # What docs/OPERATORS.md's Kubernetes removal names, and nothing else.
    recipe = (REPO / "docs/OPERATORS.md").read_text().split("**Kubernetes.**", 1)[1].split("\n\n", 1)[0]
    for named in ("`dspark-hotfix` init container", "`dspark-hotfix` and\n`dspark-hotfix-wheels` volumes",
                  "`dspark-hotfix` volume mount", "`PYTHONPATH` and `DSPARK_HOTFIX` entries"):
        assert named in recipe, named
    (deployment,) = kubernetes.documents(site)
    spec = deployment["spec"]["template"]["spec"]
    del spec["initContainers"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in ("dspark-hotfix", "dspark-hotfix-wheels")]
    for container in spec["containers"]:
        container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "dspark-hotfix"]
        container["env"] = [e for e in container["env"] if e["name"] not in ("PYTHONPATH", "DSPARK_HOTFIX")]
        if not container["env"]:
            del container["env"]
    plain = tmp_path / "deployment.json"
    plain.write_text(json.dumps(deployment))
    text = plain.read_text()
    assert "dspark_hotfix" not in text.lower() and "dspark-hotfix" not in text.lower() and "DSPARK_HOTFIX" not in text
    proc = kubernetes.validate(site, plain, kubernetes.KUBERNETES[-1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_configmap_is_made_from_the_wheels_and_their_sums_the_init_container_checks(site):
    made = f"kubectl create configmap dspark-hotfix-wheels --from-file=dist/dspark_hotfix-{dspark_hotfix.__version__}-"
    for where in (kubernetes.MANIFEST, REPO / "docs" / "OPERATORS.md"):
        command = where.read_text().split(made, 1)[-1].split("\n\n")[0]
        assert made in where.read_text(), where
        assert f"--from-file=dist/{dist.WRAPT_WHEEL}" in command and "--from-file=dist/SHA256SUMS" in command, where
    # Each wheel's own line of SHA256SUMS checked before pip sees it; pip never asks an index.
    lines = kubernetes.pod(site)["initContainers"][0]["args"][0].replace("\\\n", " ").splitlines()
    installs = [n for n, line in enumerate(lines) if "pip install" in line]
    assert len(installs) == 2 and all("--no-index" in lines[n] for n in installs), lines
    wheels = ("dspark_hotfix-${DSPARK_HOTFIX_VERSION}-py3-none-any.whl", "${WRAPT_WHEEL}")
    for n, wheel in zip(installs, wheels, strict=True):
        assert "| sha256sum -c" in lines[n - 1] and f"  {wheel}\\$" in lines[n - 1] and f'/{wheel}"' in lines[n]


def test_the_b_arm_words_are_the_shims_false_words(site):
    script = kubernetes.pod(site)["initContainers"][0]["args"][0]
    words = re.search(r'case "\$\{DSPARK_HOTFIX:-\}" in ([^)]*)\)', script)
    assert words and sorted(words[1].split("|")) == sorted(sitecustomize.FALSE_WORDS)


def bytes_of(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    return int(quantity[:-2]) * units[quantity[-2:]] if quantity[-2:] in units else int(quantity)


def test_the_init_container_has_the_memory_doctor_needs(site):
    # doctor imports vLLM: about 1 GB of memory on vLLM 0.25.0.
    resources = kubernetes.pod(site)["initContainers"][0]["resources"]
    assert bytes_of(resources["limits"]["memory"]) >= 1.5 * 2**30
    assert 2**30 <= bytes_of(resources["requests"]["memory"]) <= bytes_of(resources["limits"]["memory"])
