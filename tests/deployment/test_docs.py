"""Every shell recipe in README.md and docs/OPERATORS.md that can run here, run.

Each ```sh block runs in bash, twice (``PYTHONPATH`` unset, and set to another directory), in a
fresh venv that stands for a serving image: the project's recipes run in a checkout of the project,
installing it as written, the stand-in build importable through a ``.pth`` file, as an image's vLLM
is, and a ``vllm`` command that imports the DeepSeek-V4 targets and prints what the shim did. A
block that needs what this machine lacks starts with ``# needs: <what>, <where it is tested
instead>``. A block that uninstalls the shim must leave the image without it; the wheel goes back
for the blocks after it. The blocks run in the order a reader follows them, on one image (a later
block uses what an earlier one installed): run this module whole, on one worker (``--dist
loadfile``, as ``make unit`` does).

Then the docs' consistency: each rule in one place, the words and codes as the code has them, the
links that resolve, the size an operator reads, and the demo's story.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest

from dspark_hotfix import state
from dspark_hotfix.patches import ALL
from tests import status_shape
from tests.child import import_modules
from tests.conftest import REPO, STANDIN, clean_env, program

DOCS = ("README.md", "docs/OPERATORS.md")
BLOCK = re.compile(
    r"^( *)```sh\n(.*?)^\1```", re.MULTILINE | re.DOTALL
)  # indented ones too (in a list)
UNINSTALL = "pip uninstall -y dspark-hotfix"
TARGETS = partial(
    import_modules, status_shape.target_modules()
)  # a child's step: every patch's target module


def stub_says() -> None:
    """What the shim did in this process, on a line of its own."""
    import json
    import sys

    import dspark_hotfix

    print("vllm-stub " + json.dumps({"status": dspark_hotfix.status(), "sys_path": sys.path}))


def shim_gone() -> list[bool]:
    """Whether the package can no longer be found, and whether it was imported here."""
    import importlib.util
    import sys

    return [importlib.util.find_spec("dspark_hotfix") is None, "dspark_hotfix" in sys.modules]


def site_packages() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


# A `vllm` command: imports every patch's target module, then says what the shim did.
STUB = "#!{python}\n" + program(TARGETS, stub_says)


def recipes() -> list[tuple[str, int, str]]:
    return [
        (doc, n, textwrap.dedent(block))
        for doc in DOCS
        for n, (_, block) in enumerate(BLOCK.findall((REPO / doc).read_text()))
    ]


@pytest.fixture(scope="session")
def image(tmp_path_factory, wheel) -> dict:
    root = tmp_path_factory.mktemp("image")
    subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "wrapt==1.17.3"],
        check=True,
    )
    purelib = json.loads(
        subprocess.run(
            [str(python), "-c", program(site_packages)], check=True, capture_output=True, text=True
        ).stdout
    )
    Path(purelib, "vllm-standin.pth").write_text(f"{STANDIN}\n")
    vllm = root / "venv" / "bin" / "vllm"
    vllm.write_text(STUB.replace("{python}", str(python)))
    vllm.chmod(0o755)
    checkout = (
        root / "checkout"
    )  # what `python -m pip wheel .` reads, without writing into this repository
    checkout.mkdir()
    for name in ("pyproject.toml", "setup.cfg", "README.md"):
        shutil.copy(REPO / name, checkout / name)
    shutil.copytree(
        REPO / "dspark_hotfix",
        checkout / "dspark_hotfix",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (root / "other").mkdir()
    return {
        "root": root,
        "bin": root / "venv" / "bin",
        "checkout": checkout,
        "other": root / "other",
    }


@pytest.mark.parametrize("pythonpath", ["unset", "set"])
@pytest.mark.parametrize(
    ("doc", "n", "block"), [pytest.param(*r, id=f"{r[0]}-{r[1]}") for r in recipes()]
)
def test_recipe_runs_and_patches_every_vllm_it_starts(image, wheel, doc, n, block, pythonpath):
    first = block.splitlines()[0]
    if first.startswith("# needs:"):
        pytest.skip(f"{doc} block {n}: {first[2:]}")
    if all(line.startswith("make ") for line in block.splitlines() if line.strip()):
        pytest.skip(f"{doc} block {n}: the quick start; CI runs `make test` itself")
    script = block  # run as written: an install line must work from a checkout
    env = clean_env(
        PATH=f"{image['bin']}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(image["bin"].parent)
    )
    if pythonpath == "set":
        env["PYTHONPATH"] = str(image["other"])
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        cwd=image["checkout"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, (
        f"{doc} block {n}:\n{block}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    )
    for line in proc.stdout.splitlines():
        if line.startswith("vllm-stub "):
            seen = json.loads(line[len("vllm-stub ") :])
            states = {row["state"] for row in seen["status"]["patches"]}
            assert states == {"patched"}, f"{doc} block {n}: {seen['status']}"
            assert "" not in seen["sys_path"] and str(image["checkout"]) not in seen["sys_path"], (
                seen["sys_path"]
            )
    if UNINSTALL in block:
        python = str(image["bin"] / "python")
        gone = subprocess.run(
            [python, "-c", program(TARGETS, shim_gone)],
            env=env,
            cwd=image["other"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(gone.stdout) == [True, False] and "dspark_hotfix" not in gone.stderr, gone
        subprocess.run(
            [
                python,
                "-m",
                "pip",
                "install",
                "-q",
                "--no-deps",
                "--disable-pip-version-check",
                str(wheel),
            ],
            check=True,
        )  # back, for the blocks after this one


def test_every_recipe_that_does_not_run_here_says_what_it_needs_and_where_it_is_tested():
    skipped = [block.splitlines()[0] for _, _, block in recipes() if block.startswith("# needs:")]
    assert all(", tested in " in line or ", see " in line for line in skipped), skipped
    assert len(recipes()) - len(skipped) >= 4  # most recipes run here


def test_docs_spell_states_as_the_output_does():
    for doc in DOCS:
        assert "`not needed`" not in (REPO / doc).read_text(), doc


# An absolute path of the machine a doc was written on: a home, a developer's work tree, a test's
# scratch directory. A reader has none of them. /tmp/<name> is fine where a committed script makes
# that directory.
MACHINE_PATH = re.compile(
    r"(?<![\w.~$<>-])(/(?:work|root|home|Users|private|mnt|scratch)/[^\s`'\")\]]*"
    r"|/var/folders/\S*|/tmp/[^\s`'\")\]:/]+)"
)


def committed_docs() -> list[str]:
    out = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return sorted(set(out))


def made_by_a_script(path: str) -> bool:
    found = (
        *(REPO / "scripts").rglob("*"),
        *(REPO / "harness").rglob("*"),
        *(REPO / "tests").rglob("*.py"),
    )
    scripts = [p for p in found if p.is_file() and p != Path(__file__).resolve()]
    named = re.compile(re.escape(path) + r"(?![\w.-])")
    return path.startswith("/tmp/") and any(
        named.search(p.read_text(errors="replace")) for p in scripts
    )


def test_no_doc_names_a_path_of_the_machine_it_was_written_on():
    docs = committed_docs()
    assert "docs/BENCHMARKS.md" in docs and "README.md" in docs
    found = [
        f"{doc}:{n}: {m}"
        for doc in docs
        for n, line in enumerate((REPO / doc).read_text().splitlines(), 1)
        for m in MACHINE_PATH.findall(line)
        if not made_by_a_script(m)
    ]
    assert found == [], "\n".join(found)


@pytest.mark.parametrize(
    "line",
    [
        "ran `/work/wt18/.venv/bin/python -c pass`",
        "in /root/.cache/x/bin/python",
        "PYTHONPATH=/home/dev/checkout",
        "python3 -m venv /tmp/v",
    ],
)
def test_a_machine_path_is_recognized(line):
    assert [m for m in MACHINE_PATH.findall(line) if not made_by_a_script(m)], line


def test_the_changelog_names_each_release_by_the_commit_that_set_its_version():
    import dspark_hotfix

    text = (REPO / "CHANGELOG.md").read_text()
    sections = re.findall(r"^## (.+)$", text, re.MULTILINE)
    assert sections[0] == "Unreleased", sections
    releases = []
    for section in sections[1:]:
        release = re.fullmatch(
            r"(\d+\.\d+\.\d+) \((\d{4}-\d\d-\d\d), commit ([0-9a-f]{7,})\)", section
        )
        assert release is not None, sections
        releases.append(release)
    assert releases[0][1] == dspark_hotfix.__version__  # a version bump adds its section
    for release in releases:
        version, date, commit = release.groups()
        source = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}:dspark_hotfix/__init__.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert f'__version__ = "{version}"' in source, release[0]
        parent = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{commit}~1:dspark_hotfix/__init__.py"],
            capture_output=True,
            text=True,
        ).stdout
        assert f'__version__ = "{version}"' not in parent, (
            f"{release[0]}: not the commit that set it"
        )
        day = subprocess.run(
            ["git", "-C", str(REPO), "show", "-s", "--format=%ad", "--date=short", commit],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        assert day == date, release[0]


def test_the_patch_guide_names_files_that_exist():
    guide = (REPO / "docs" / "WRITING_A_PATCH.md").read_text()
    paths = {
        p for p in re.findall(r"`((?:dspark_hotfix|tests|bench|scripts|docs)/[\w/.-]+)`", guide)
    }
    # The files a new patch touches, and the ones it reads from: enough that the pattern finds them.
    assert len(paths) >= 10 and [p for p in paths if not (REPO / p).exists()] == []


# Each rule in one place. The docs an operator reads, and the pages generated from code and
# evidence.
OPERATOR_DOCS = (
    "README.md",
    *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")),
    "SECURITY.md",
)
GENERATED = ("docs/MATRIX.md", "docs/BENCHMARKS.md")  # scripts/matrix.py, bench/run.py
HAND_WRITTEN = (*(d for d in OPERATOR_DOCS if d not in GENERATED), "CHANGELOG.md")


def text(doc: str) -> str:
    return (REPO / doc).read_text()


def test_the_verdicts_and_exit_codes_are_written_once_as_the_code_has_them():
    tables = [doc for doc in HAND_WRITTEN if "| exit | verdict |" in text(doc)]
    assert tables == ["README.md"], tables
    rows = re.findall(r"^\| (\d) \| (?:`(\w+)`)? *\|", text("README.md"), re.MULTILINE)
    documented = {word: int(code) for code, word in rows if word}
    assert set(documented) == set(state.VERDICTS), documented
    assert documented == {word: state.exit_code({"verdict": word}) for word in state.VERDICTS}
    helped = dict(
        re.findall(r"^  (\d)  (.*)$", state.EXIT_CODES, re.MULTILINE)
    )  # what the commands' help says
    assert {int(code) for code, word in rows if not word} == {2} and helped["2"] == "usage error"
    assert {code for code, _ in rows} == set(helped)


def test_the_state_words_are_written_once_as_the_code_has_them():
    tables = [doc for doc in HAND_WRITTEN if "| state | meaning |" in text(doc)]
    assert tables == ["docs/OPERATORS.md"], tables
    table = text("docs/OPERATORS.md").split("| state | meaning |", 1)[1].split("\n\n", 1)[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE) == list(
        dict.fromkeys(
            (
                state.PATCHED,
                state.RAISED,
                state.NOT_NEEDED,
                state.UNDECIDED,
                state.PENDING,
                state.EXCLUDED,
                state.FAILED,
                state.DISABLED,
            )
        )
    )
    assert set(re.findall(r"^\| `(\w+)` \|", table, re.MULTILINE)) == set(state.STATES)


def test_the_removal_rule_and_the_pythonpath_caution_are_written_once_and_linked():
    assert [doc for doc in HAND_WRITTEN if "**The rule:**" in text(doc)] == ["README.md"]
    assert [doc for doc in HAND_WRITTEN if "empty entry in `PYTHONPATH`" in text(doc)] == [
        "README.md"
    ]
    operators = text("docs/OPERATORS.md")
    for anchor in ("#remove-it", "#check-it", "#install-and-run"):
        assert f"../README.md{anchor}" in operators, anchor
    # The release that ends the shim's need: the rule names it, and the history; generated pages
    # may.
    assert [doc for doc in HAND_WRITTEN if "0.28.0" in text(doc)] == ["README.md", "CHANGELOG.md"]


def test_guarding_gives_the_readmes_removal_rule_in_an_operators_words():
    # One rule: where the shim guards, remove it only where no deployment uses the setting its stop
    # stops.
    assert not [
        text for text in state.VERDICTS.values() if re.search(r"\w\.\w|_|\(see ", text)
    ]  # no code names
    assert state.VERDICTS["guarding"].endswith(
        "remove it only where no deployment uses that setting"
    )
    rule = " ".join(text("README.md").split("**The rule:**", 1)[1].split("\n\n", 1)[0].split())
    assert (
        "`guarding`" in rule
        and "remove it only where no deployment uses the setting it stops" in rule
    )


def anchors(doc: str) -> set[str]:
    """GitHub's anchors for a page's headings."""
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text(doc), re.MULTILINE)
    }


def test_every_link_between_the_docs_resolves():
    links = 0
    for doc in (*OPERATOR_DOCS, "CHANGELOG.md"):
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([\w-]+))?\)", text(doc)):
            if "://" in target:
                continue
            path = ((REPO / doc).parent / target).resolve() if target else REPO / doc
            assert path.exists(), f"{doc}: {target}"
            if anchor:
                assert anchor in anchors(str(path.relative_to(REPO))), f"{doc}: {target}#{anchor}"
            links += 1
    assert links > 20


def test_every_test_a_doc_cites_exists():
    # "tests/x.py::test_name" and "harness/tests/x.py" in any committed page: a test renamed, moved
    # or removed must not leave a doc citing it as proof (a guide's new file, marked "guide: new",
    # is the exception, and so are the dated records under docs/evidence: history, which cites
    # what was there when it was measured)
    pages = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=REPO, capture_output=True, text=True, check=True
    )
    cited = [
        (page, path, name)
        for page in pages.stdout.split()
        if not page.startswith("docs/evidence/")
        for line in text(page).splitlines()
        if "guide: new" not in line
        for path, name in re.findall(r"((?:harness/)?tests/[\w/]+\.py)(?:::(\w+))?", line)
    ]
    for page, path, name in cited:
        assert (REPO / path).is_file(), f"{page} cites {path}"
        assert not name or re.search(
            rf"^(\s*def|class) {name}\b", (REPO / path).read_text(), re.MULTILINE
        ), f"{page} cites {path}::{name}"
    assert len(cited) > 50  # the scan read the pages


def test_every_tier_selection_the_docs_write_is_the_makefiles():
    makefile = (REPO / "Makefile").read_text()
    tiers = {m[1]: m[2] for m in re.finditer(r"^(FAST|SLOW) := (.+)$", makefile, re.MULTILINE)}
    written = [
        (doc, m[1])
        for doc in (*HAND_WRITTEN, "tests/README.md")
        for m in re.finditer(r'pytest[^`\n]* -m "([^"]+)"', text(doc))
    ]
    assert written and all(expr in tiers.values() for _, expr in written), (written, tiers)


def test_the_operators_pages_name_no_patch():
    # Every patch goes with a release: an example naming one would outlive it. The generated pages
    # and the patch guide may; these two say `<name>`.
    for doc in ("README.md", "docs/OPERATORS.md"):
        named = [p.name for p in ALL if re.search(rf"\b{p.name}\b", text(doc))]
        assert named == [], (doc, named)


def test_the_docs_an_operator_reads_stay_short():
    assert len(text("README.md").splitlines()) <= 120
    assert len(text("docs/OPERATORS.md").splitlines()) <= 250
    # What people write, as `cat README.md docs/*.md SECURITY.md | wc -w` less the generated pages:
    # a patch's rows there come and go with the records, not with anyone's prose.
    words = sum(len(text(doc).split()) for doc in OPERATOR_DOCS if doc not in GENERATED)
    # The README's removal rule too is scripts/matrix.py's, from every release's record.
    rule = re.search(r"^\*\*The rule:\*\*.*?\n\n", text("README.md"), re.S | re.M)
    assert rule is not None
    words -= len(rule[0].split())
    assert words <= 6500, words


def test_the_demo_says_which_patch_changes_each_line_and_what_to_do_next():
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")],
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown, _, changes = proc.stdout.partition("What changed, and which patch changed it:")
    changes, _, following = changes.partition("Next:")
    off, _, on = shown.partition("== DSPARK_HOTFIX=1")
    # Which cache fails first (kv, or extra_kv) depends on which defects the stand-in carries.
    assert re.search(r"engine start: FAILED: RuntimeError: (extra_)?kv must have shape", off)
    assert "engine start: ok" in on
    assert "KV view width 512 -> 584 bytes/token" in changes
    # Every patch the shim's line counts as patched is explained: a correction says what it
    # corrected (vLLM's function, how many answers), a repair of a path the demo's start does not
    # take and a stop that it applied, why they changed nothing; each then says what it is for.
    (patched,) = re.findall(r": fixing: \d+ patched \(([^)]+)\)$", on, re.MULTILINE)
    named = re.findall(
        r"^   (\w+) (?:corrected \d+ answers? of (\S+)|is applied; this start does not call (\S+)|"
        r"is applied; (it stops) vLLM only where vLLM would crash, and this start would not):\n  "
        r"   \S",
        changes,
        re.MULTILINE,
    )
    said = {name: corrected or uncalled or stop for name, corrected, uncalled, stop in named}
    assert len(said) == len(named) and said == {
        p.name: "it stops" if p.stops else p.qualname for p in ALL if p.name in patched.split(", ")
    }, changes
    assert following.index("dspark-hotfix doctor") < following.index(
        "dspark-hotfix run -- vllm serve"
    )
    assert 'export PYTHONPATH="$(dspark-hotfix path)${PYTHONPATH:+:$PYTHONPATH}"' in following
