"""The Kubernetes manifest, read: kubernetes-validate from PyPI, installed once into a cached
directory.

kubernetes-validate ships the Kubernetes JSON schemas in its wheel, so
validation needs no network; its PyYAML reads the manifest for the tests.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.cache import pip_target
from tests.conftest import REPO, program

# The A/B's two arms, side by side: A (the shim on) is the manifest a fleet without an A/B applies.
ARMS = {arm: REPO / "deploy" / "kubernetes" / f"vllm-dspark-{arm}.yaml" for arm in ("a", "b")}
MANIFEST = ARMS["a"]
VALIDATOR = "kubernetes-validate==1.37.0"
# The oldest release still common in fleets and the newest the validator ships.
KUBERNETES = ("1.28.0", "1.37.0")


def validator_site() -> Path:
    """kubernetes-validate and its dependencies (about 120 MB, 15 s), for this interpreter's
    version."""
    return pip_target(
        f"{VALIDATOR.replace('==', '-')}-py{sys.version_info[0]}{sys.version_info[1]}", VALIDATOR
    )


def with_site(site: Path, argv: list[str], **kw) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        argv,
        env={**env, "PYTHONPATH": str(site)},
        capture_output=True,
        text=True,
        timeout=300,
        **kw,
    )


def validate(
    site: Path, path: Path, version: str, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    return with_site(
        site,
        [
            *prefix,
            sys.executable,
            "-m",
            "kubernetes_validate",
            "--strict",
            "-k",
            version,
            str(path),
        ],
    )


def documents(site: Path, path: Path = MANIFEST) -> list[dict]:
    """The manifest's YAML documents, read by PyYAML as kubectl reads them (each test gets its own
    copy)."""
    return json.loads(read_yaml(site, path, path.read_bytes()))


@functools.lru_cache
def read_yaml(site: Path, path: Path, content: bytes) -> str:
    """PyYAML's reading of ``path`` as JSON, once per content: the committed manifest is read by six
    tests."""
    code = program(functools.partial(yaml_documents, str(path)))
    return with_site(site, [sys.executable, "-c", code], check=True).stdout


def yaml_documents(path: str) -> list[object]:
    import yaml

    with open(path) as manifest:
        return list(yaml.safe_load_all(manifest))


def pod(site: Path, path: Path = MANIFEST) -> dict:
    (deployment,) = documents(site, path)
    return deployment["spec"]["template"]["spec"]


def env(container: dict) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container.get("env", ())}
