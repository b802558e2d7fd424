"""The tests' one table of the patches (tests/cases.py) against the product's one list (``patches.ALL``)."""

from __future__ import annotations

from dspark_hotfix.patches import ALL
from tests import cases


def test_the_table_has_a_row_for_every_patch_in_the_order_of_all():
    # The one pinned expectation: every other test reads the names, targets and roles from ALL.
    assert tuple(cases.CASES) == tuple(p.name for p in ALL)


def test_each_role_the_tests_pick_from_all_is_one_patch_and_no_two_the_same():
    roles = (cases.REMAP, cases.ATTENTION, cases.SWA, cases.STOP)
    assert all(any(p is role for p in ALL) for role in roles)
    assert len({role.name for role in roles}) == len(roles)
