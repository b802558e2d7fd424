"""The H200 FlashMLA evidence: docs/evidence/gpu-h200.md is what harness/gpu_evidence.py renders
from its record."""

from __future__ import annotations

import json

from harness import gpu_evidence
from harness.common import EVIDENCE


def test_the_committed_gpu_page_is_what_its_record_renders_to():
    data = json.loads((EVIDENCE / "gpu-h200.json").read_text())
    assert gpu_evidence.render(data) == (EVIDENCE / "gpu-h200.md").read_text(), (
        "run python3 -m harness.gpu_evidence collect, or render the committed record again"
    )
    outcomes = [test["outcome"] for test in data["tests"].values()]
    assert outcomes and "failed" not in outcomes and "passed" in outcomes
