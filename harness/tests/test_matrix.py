"""docs/MATRIX.md, the version matrix: generated from the committed evidence, and refused where records disagree."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest

from dspark_hotfix.patches import ALL
from harness.common import REPO


@pytest.fixture(scope="module")
def matrix():
    """scripts/matrix.py, a command-line tool (not a package), loaded from its path."""
    spec = importlib.util.spec_from_file_location("matrix", REPO / "scripts" / "matrix.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_matrix_is_what_the_evidence_gives(matrix):
    assert matrix.main(["--check"]) == 0, "run python scripts/matrix.py and commit docs/MATRIX.md"


def test_every_recorded_line_reads_back_as_its_counts(matrix):
    lines = json.loads((matrix.EVIDENCE / "lines.json").read_text())
    seen = 0
    for kinds in lines.values():
        for line in (line for kind_lines in kinds.values() for line in kind_lines):
            verdict, states = matrix.states_of(line)
            counts = {state: int(n) for n, state in re.findall(r"(\d+) (\w+)", line.partition(": ")[2])}
            assert verdict in ("fixing", "guarding", "removable", "problem", "undecided")
            assert set(states) == {p.name for p in ALL} and Counter(states.values()) == counts, line
            seen += 1
    assert seen >= 4 * 3


def test_a_matrix_is_not_written_where_two_records_disagree(matrix, tmp_path: Path, monkeypatch):
    shutil.copytree(matrix.EVIDENCE, tmp_path / "evidence", ignore=shutil.ignore_patterns("*-logs", "hybrid-off*"))
    hybrid = json.loads((matrix.EVIDENCE / "hybrid-off.json").read_text())
    hybrid["versions"]["0.25.0"]["with_shim"]["status"]["patches"]["kv_cache_groups"]["state"] = "not_needed"
    (tmp_path / "evidence" / "hybrid-off.json").write_text(json.dumps(hybrid))
    monkeypatch.setattr(matrix, "EVIDENCE", tmp_path / "evidence")
    with pytest.raises(SystemExit, match=r"0\.25\.0: hybrid-off\.json says"):
        matrix.render()


def test_every_recorded_line_is_quoted_whole_in_the_matrix(matrix):
    """What an operator greps for: tests/real_vllm/test_lines.py holds the record to real processes."""
    lines = json.loads((matrix.EVIDENCE / "lines.json").read_text())
    quoted = set(matrix.TARGET.read_text().splitlines())
    recorded = {line for kinds in lines.values() for kind_lines in kinds.values() for line in kind_lines}
    assert recorded and recorded <= quoted, sorted(recorded - quoted)


def test_the_patch_table_is_each_patch_in_order_with_its_removal(matrix):
    rows = matrix.patch_rows()
    assert [re.match(r"\| `(\w+)` \|", row)[1] for row in rows] == [p.name for p in ALL]  # type: ignore[index]
    for patch, row in zip(ALL, rows, strict=True):
        cells = [c.strip() for c in row.strip("|").split(" | ")]
        assert cells[3] == f"`{patch.target}`" and cells[4], row
        assert cells[1] == ("stop" if patch.stops else "correction"), row
