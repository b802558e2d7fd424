"""docs/MATRIX.md, the version matrix: generated from the committed evidence, and refused where
records disagree."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest


def test_the_committed_matrix_is_what_the_evidence_gives(matrix):
    assert matrix.main(["--check"]) == 0, "run python scripts/matrix.py and commit docs/MATRIX.md"


def recorded_patches(matrix) -> list[str]:
    return matrix.recorded_patches(
        json.loads((matrix.EVIDENCE / "hybrid-off.json").read_text())["versions"]
    )


def test_every_recorded_line_reads_back_as_its_counts(matrix):
    lines = json.loads((matrix.EVIDENCE / "lines.json").read_text())
    names = recorded_patches(matrix)
    seen = 0
    for kinds in lines.values():
        for line in (line for kind_lines in kinds.values() for line in kind_lines):
            verdict, states = matrix.states_of(line, names)
            counts = {
                state: int(n) for n, state in re.findall(r"(\d+) (\w+)", line.partition(": ")[2])
            }
            assert verdict in ("fixing", "guarding", "removable", "problem", "undecided")
            assert list(states) == names and Counter(states.values()) == counts, line
            seen += 1
    assert seen >= 4 * 3


def test_a_line_printed_with_another_set_of_patches_is_refused(matrix):
    # Records of two runs, one with a patch more or less than the other: the matrix is not written
    # from both.
    names = recorded_patches(matrix)
    line = f"removable: {len(names)} not_needed"
    assert matrix.states_of(line, names) == ("removable", dict.fromkeys(names, "not_needed"))
    for other in (names[:-1], [*names, "another"]):
        with pytest.raises(SystemExit, match="run make records"):
            matrix.states_of(line, other)


def test_a_matrix_is_not_written_where_two_records_disagree(matrix, tmp_path: Path, monkeypatch):
    shutil.copytree(
        matrix.EVIDENCE,
        tmp_path / "evidence",
        ignore=shutil.ignore_patterns("*-logs", "hybrid-off*"),
    )
    hybrid = json.loads((matrix.EVIDENCE / "hybrid-off.json").read_text())
    row = next(iter(hybrid["versions"]["0.25.0"]["with_shim"]["status"]["patches"].values()))
    row["state"] = "excluded"  # a state no line of lines.json gives a patch on 0.25.0
    (tmp_path / "evidence" / "hybrid-off.json").write_text(json.dumps(hybrid))
    monkeypatch.setattr(matrix, "EVIDENCE", tmp_path / "evidence")
    with pytest.raises(SystemExit, match=r"0\.25\.0: hybrid-off\.json says"):
        matrix.render()
