"""``DSPARK_HOTFIX_PATCHES``: selecting and excluding patches by name; a malformed value (unknown
names, empty entries, names mixed with exclusions) warned about once, briefly however long, with
what it selects then; and a needed patch the selection leaves off warned about. On the toy patches,
in this process."""

from __future__ import annotations

import pytest

from dspark_hotfix import config
from tests.reporting.inprocess import AS_SHIPPED, activate, build, command, report, states
from tests.toys import FAREWELL, FIX, GREETING, NAMES, PLANNER, module_file


def test_selection_patches_only_the_named_patch(toys, monkeypatch):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", GREETING.name)
    activate()
    assert toys.states() == {
        GREETING.name: "patched",
        FAREWELL.name: "excluded",
        PLANNER.name: "excluded",
    }


def test_selecting_only_the_stop_on_a_build_with_the_correction_released_exits_0(
    toys, monkeypatch, capsys, tmp_path
):
    # A build like a release: the greeting's bug fixed upstream, the planner's not; only the stop is
    # selected.
    build(tmp_path, monkeypatch, {module_file(GREETING): FIX[GREETING.name]})
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", PLANNER.name)
    code, out = report(capsys, "status")
    assert (code, out["verdict"]) == (0, "guarding"), out["problems"]
    assert states(out)[PLANNER.name] == "patched"


def test_an_unknown_name_is_a_warning_in_status_not_a_problem(toys, monkeypatch, capsys):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", "-toy_greting")
    code, out = command(capsys, "status")
    assert (
        code == 0
        and "WARNING       DSPARK_HOTFIX_PATCHES='-toy_greting': 1 unknown or empty name ignored;"
        f" it selects {', '.join(NAMES)} (known: "
        in out
    ), out


def test_exclusion_leaves_the_excluded_patch_alone(toys, monkeypatch):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name}")
    activate()
    assert toys.states()[GREETING.name] == "excluded"
    assert toys.states()[PLANNER.name] == "patched"
    from vllm.toy_model import Greeter

    assert Greeter().greet("you") == "helo, you"  # the toy build's own answer


def test_a_needed_patch_the_selection_leaves_off_makes_the_line_a_problem(toys, monkeypatch):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", f"-{GREETING.name}")
    activate()
    (line,) = toys.summaries()
    assert line.endswith(
        f"problem: 1 patched ({PLANNER.name}), 1 not_needed, 1 excluded ({GREETING.name})"
    ), line


# Bounded warnings, in a process that imports the targets.


def test_two_thousand_unknown_patch_names_give_one_short_warning(toys, monkeypatch):
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", ",".join(f"no_such_patch_{i}" for i in range(2000)))
    activate()
    warnings = toys.lines("WARNING")
    assert len(warnings) <= 1 and all(len(w) < 300 for w in warnings), (len(warnings), warnings[:3])
    assert len(toys.log.getvalue()) < 1000
    assert toys.states() == AS_SHIPPED  # a typo never turns the fix off


def test_a_name_both_selected_and_excluded_gives_one_warning(toys, monkeypatch):
    # Hyphens for underscores: a name that is unknown both ways, said once.
    monkeypatch.setenv("DSPARK_HOTFIX_PATCHES", "toy-greeting,-toy-greeting")
    activate()
    assert len(toys.lines("WARNING")) == 1, toys.log.getvalue()


# The parsing itself.


def test_selection_of_names_is_case_insensitive():
    assert config.parse_selection(f"{GREETING.name.upper()}, {PLANNER.name.title()}", NAMES) == (
        frozenset({GREETING.name, PLANNER.name}),
        None,
    )


def test_selection_by_exclusion_keeps_the_rest():
    assert config.parse_selection(f"-{PLANNER.name}", NAMES) == (
        frozenset(NAMES) - {PLANNER.name},
        None,
    )


def test_a_name_both_selected_and_excluded_is_excluded_and_said():
    selected, problem = config.parse_selection(
        f"{GREETING.name},-{GREETING.name},-{GREETING.name}", NAMES
    )
    assert selected == frozenset()
    assert problem is not None and ": names mixed with -names; it selects none (known: " in problem


def test_names_mixed_with_exclusions_select_the_names_less_the_excluded_and_say_so():
    selected, problem = config.parse_selection(
        f"{GREETING.name},{PLANNER.name},-{PLANNER.name}", NAMES
    )
    assert selected == {GREETING.name}
    assert problem is not None and problem.startswith(
        f"DSPARK_HOTFIX_PATCHES='{GREETING.name},{PLANNER.name},-{PLANNER.name}': names mixed with"
        f" -names; it selects {GREETING.name} (known: "
    )


def test_selection_with_unknown_name_warns_and_ignores_it():
    selected, problem = config.parse_selection(f"{GREETING.name},bogus", NAMES)
    assert selected == {GREETING.name}
    assert (
        problem is not None
        and f": 1 unknown or empty name ignored; it selects {GREETING.name} (known: " in problem
    )


def test_selection_of_only_unknown_names_keeps_every_patch_on():
    selected, problem = config.parse_selection("bogus", NAMES)
    assert selected == frozenset(NAMES) and problem is not None


def test_unset_or_blank_means_all_silently():
    assert (
        config.parse_selection(None, NAMES)
        == config.parse_selection(" ", NAMES)
        == (frozenset(NAMES), None)
    )


@pytest.mark.parametrize("raw", [",", "-", " , - ", f"{GREETING.name},", f"-{PLANNER.name},-"])
def test_an_empty_entry_is_said_and_ignored(raw):
    # A value with no name in it, or an entry without one: never a silent "all" or a silent
    # selection.
    selected, problem = config.parse_selection(raw, NAMES)
    expected = {
        ",": NAMES,
        "-": NAMES,
        " , - ": NAMES,
        f"{GREETING.name},": (GREETING.name,),
        f"-{PLANNER.name},-": (GREETING.name, FAREWELL.name),
    }[raw]
    assert selected == frozenset(expected)
    assert (
        problem is not None
        and f": 1 unknown or empty name ignored; it selects {', '.join(expected)} (" in problem
    )


def test_thousands_of_unknown_names_give_one_short_warning():
    raw = ",".join(f"name{i}" for i in range(2000)) + ",toy-greeting,-toy-greeting"
    selected, problem = config.parse_selection(raw, NAMES)
    assert selected == frozenset(NAMES) and problem is not None
    assert problem.startswith("DSPARK_HOTFIX_PATCHES='name0,name1,") and "... (" in problem
    assert (
        f": 2001 unknown or empty names ignored; it selects {', '.join(NAMES)} (known: " in problem
    )
    assert len(problem) < 300


def test_the_readme_and_help_say_what_a_malformed_selection_does_in_the_warnings_words(capsys):
    from dspark_hotfix.cli import main
    from tests.conftest import REPO

    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        "An unknown or empty patch name is ignored, and names mixed with `-names` select the names"
        " less those; either way one warning says what the value selects." in readme
    )
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert (
        "-name,-name (all but these); anything else: one warning saying what it selects"
        in help_text
    )
    for raw in (
        ",",
        "-",
        f"{NAMES[0]},-{NAMES[1]}",
        "nonesuch",
    ):  # each says what it selects, in those words
        _, warning = config.parse_selection(raw, NAMES)
        assert warning is not None and "; it selects " in warning, raw
