"""``tests.conftest.program``, the code of the children whose steps are real Python: each step's own
source goes, without its annotations, then its call; a step that reads its module's names is refused
before any child starts."""

from __future__ import annotations

import json
from functools import partial
from typing import Any

import pytest

from tests.conftest import in_fresh_process, program


def answer(word: str, times: int) -> dict[str, Any]:
    """Its arguments, and which of the modules a program could bring in unasked are imported so
    far."""
    import sys

    return {
        "said": word * times,
        "imported": [m for m in ("__future__", "typing", "json") if m in sys.modules],
    }


def say(word: str) -> None:
    print(word)


def test_a_program_runs_its_steps_in_order_and_prints_what_each_returns():
    proc = in_fresh_process(
        program(partial(say, "first"), partial(answer, "ab", 2), partial(say, "last"))
    )
    assert proc.returncode == 0, proc.stderr
    first, returned, last = proc.stdout.splitlines()
    assert (first, last) == ("first", "last")
    # The annotations stayed behind (no __future__, no typing), and json came after the step had
    # returned.
    assert json.loads(returned) == {"said": "abab", "imported": []}


def reads_its_module() -> None:
    print(json.dumps(partial))


def test_a_step_that_reads_its_modules_names_is_refused_before_a_child_starts():
    with pytest.raises(AssertionError, match=r"a step reads its module's \['json', 'partial'\]"):
        program(say, reads_its_module)
