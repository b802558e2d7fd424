"""The switches' readings as properties, for any value: the README's words for ``DSPARK_HOTFIX`` and
``DSPARK_HOTFIX_STRICT`` (a true word, a false word, blank, or anything else: off and said once, on
one bounded line), for ``DSPARK_HOTFIX_PATCHES`` (names, ``-names``, unknown and empty entries,
padded and in any case), and the start-up hook's own reading of ``DSPARK_HOTFIX``, which must agree
with the package's. The values are built from labelled parts, so each example's expected reading
follows from its labels, not from the code under test. The cases in test_kill_switch.py and
test_selection.py show each word's effect on a running shim; these cover the readings themselves."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dspark_hotfix
from dspark_hotfix import config
from tests.conftest import REPO
from tests.toys import NAMES

# Reproducible in CI, and no .hypothesis/ directory written into the checkout.
PROPERTY = settings(database=None, derandomize=True, deadline=None, max_examples=300)

PADS = st.text(
    alphabet=" \t\n\r\x0b\x0c\u00a0\u2003", max_size=3
)  # whitespace that str.strip takes


def any_case(word: str) -> st.SearchStrategy[str]:
    return st.lists(st.booleans(), min_size=len(word), max_size=len(word)).map(
        lambda ups: "".join(c.upper() if up else c for c, up in zip(word, ups, strict=True))
    )


def not_a_word(text: str) -> bool:
    return text.strip().lower() not in (*dspark_hotfix.TRUE_WORDS, *dspark_hotfix.FALSE_WORDS, "")


@st.composite
def switch_values(draw: st.DrawFn) -> tuple[str, str]:
    """A value and its label: "true", "false", "blank" or "other"."""
    label = draw(st.sampled_from(["true", "false", "blank", "other"]))
    if label == "blank":
        return draw(PADS), label
    if label == "other":
        return (
            draw(
                st.one_of(st.text(max_size=80), st.text(min_size=200, max_size=2000)).filter(
                    not_a_word
                )
            ),
            label,
        )
    word = draw(
        st.sampled_from(dspark_hotfix.TRUE_WORDS if label == "true" else dspark_hotfix.FALSE_WORDS)
    )
    return draw(PADS) + draw(any_case(word)) + draw(PADS), label


@PROPERTY
@given(
    switch_values(),
    st.sampled_from(
        [(dspark_hotfix.ENABLE, True, "the shim"), (config.STRICT, False, "strict mode")]
    ),
)
def test_an_on_off_switch_reads_any_value_as_the_readme_says(value, which):
    (raw, label), (name, default, what) = value, which
    on, problem = dspark_hotfix.switch(name, raw, default, what)
    assert on == {"true": True, "false": False, "blank": default, "other": False}[label]
    if label != "other":
        assert problem is None
        return
    assert (
        problem is not None
        and problem.startswith(f"{name}=")
        and problem.endswith(f": {what} is OFF")
    )
    assert "\n" not in problem and "\r" not in problem and len(problem) < 250, (
        problem
    )  # one line, bounded
    assert dspark_hotfix.shown(raw) in problem  # the value as said: quoted, cut short


def load_startup_module():
    """The start-up hook's module, loaded under another name (its start-up block does not run)."""
    spec = importlib.util.spec_from_file_location(
        "startup_under_test", REPO / "dspark_hotfix" / "startup" / "sitecustomize.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STARTUP = load_startup_module()


def settable(value: tuple[str, str]) -> bool:
    """Whether an environment can hold the value: no NUL, and bytes as the process decodes them."""
    try:
        return b"\0" not in os.fsencode(value[0])
    except UnicodeEncodeError:
        return False


@PROPERTY
@given(switch_values().filter(settable))
def test_the_start_up_hook_reads_any_value_of_the_kill_switch_as_the_package_does(value):
    # start() reads blank, 1 and 0 itself and hands any other value to the package: whatever the
    # value, it watches for vLLM exactly where the package's reading says on.
    raw, _ = value
    activated: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(dspark_hotfix.ENABLE, raw)
        patch.setattr(dspark_hotfix, "_enabled", None)  # the package's reading, made afresh
        patch.setattr(sys, "meta_path", list(sys.meta_path))
        patch.setattr(
            STARTUP, "activate", activated.append
        )  # where vLLM is imported already (a test's stand-in)
        patch.setattr(
            dspark_hotfix, "say", lambda text: None
        )  # the warning of a value not understood
        STARTUP.start()
        watching = any(isinstance(finder, STARTUP.VllmImportWatcher) for finder in sys.meta_path)
        package_says = dspark_hotfix.enabled()
    assert (watching or activated == ["sitecustomize"]) == package_says, (raw, watching, activated)


UNKNOWN = st.from_regex(r"zz[a-z_]{0,10}", fullmatch=True)  # never a patch's name


@st.composite
def selections(draw: st.DrawFn) -> tuple[str, list[tuple[bool, str, str]]]:
    """A ``DSPARK_HOTFIX_PATCHES`` value and its entries' labels: (excluded, kind, name), kind
    "known", "unknown" or "empty"."""
    entries, labels = [], []
    for _ in range(draw(st.integers(1, 7))):
        minus, kind = draw(st.booleans()), draw(st.sampled_from(["known", "unknown", "empty"]))
        name = (
            draw(st.sampled_from(NAMES))
            if kind == "known"
            else draw(UNKNOWN)
            if kind == "unknown"
            else ""
        )
        written = draw(any_case(name))
        entries.append(draw(PADS) + ("-" + draw(PADS)) * minus + written + draw(PADS))
        labels.append((minus, kind, name))
    return ",".join(entries), labels


@PROPERTY
@given(selections())
def test_a_selection_reads_any_value_as_the_readme_says(value):
    raw, labels = value
    selected, warning = config.parse_selection(raw, NAMES)
    if not raw.strip():  # unset or blank: every patch, silently
        assert (selected, warning) == (frozenset(NAMES), None)
        return
    named = {name for minus, kind, name in labels if kind == "known" and not minus}
    excluded = {name for minus, kind, name in labels if kind == "known" and minus}
    ignored = len(
        {name for _, kind, name in labels if kind != "known"}
    )  # names, not entries: "" is one
    # Only the names, or all but the -names; names mixed with -names: the names less those. So a
    # value with no usable name (a typo) keeps every patch on.
    assert selected == (named - excluded if named else frozenset(NAMES) - excluded)
    if not ignored and not (named and excluded):
        assert warning is None
        return
    assert warning is not None and warning.startswith(f"{config.PATCHES}=") and "\n" not in warning
    why = (
        f"{ignored} unknown or empty name{'s' * (ignored > 1)} ignored"
        if ignored
        else "names mixed with -names"
    )
    says = ", ".join(n for n in NAMES if n in selected) or "none"
    assert f": {why}; it selects {says} (known: " in warning, warning
    assert len(warning) < 400, warning
