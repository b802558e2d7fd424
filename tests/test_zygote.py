"""tests.zygote, behind call_in_child: a child forked from it is what a fresh interpreter would
be."""

from __future__ import annotations

import json

from tests import child as child_code
from tests.conftest import REPO, STANDIN, ZYGOTES, call_in_child, child, code_calling


def test_a_forked_child_sees_what_a_fresh_interpreter_sees_and_ends_as_one():
    forked = call_in_child(child_code.as_started, 3)
    assert ZYGOTES[((REPO, STANDIN), ())] is not None  # forked, not started
    fresh = child(args=("-c", code_calling(child_code.as_started), json.dumps([3])))
    assert (forked.returncode, forked.stderr) == (fresh.returncode, fresh.stderr) == (3, "")
    assert forked.stdout == fresh.stdout and forked.stdout.endswith("\nat exit\n")
    seen = json.loads(forked.stdout.splitlines()[0])
    assert seen["argv"] == ["-c", "[3]"] and seen["stdin"] == ""


def test_a_start_that_says_something_is_a_fresh_interpreter_where_it_is_said():
    proc = call_in_child(child_code.as_started, 0, env={"DSPARK_HOTFIX": "maybe"})
    assert ZYGOTES[((REPO, STANDIN), (("DSPARK_HOTFIX", "maybe"),))] is None
    (line,) = proc.stderr.splitlines()
    assert (
        proc.returncode == 0
        and "DSPARK_HOTFIX='maybe'" in line
        and line.endswith(": the shim is OFF")
    ), line
