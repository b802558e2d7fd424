"""The reported crash and its repair, side by side, on the stand-in build.

Runs the stand-in engine's start (draft weight loading, KV-cache warm-up, the
FlashMLA shape check) twice in fresh interpreters, as ``vllm serve`` would
start: once with ``DSPARK_HOTFIX=0`` and once with the shim on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"


def start(enabled: bool) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_HOTFIX")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(STANDIN)])
    env["DSPARK_HOTFIX"] = "1" if enabled else "0"
    proc = subprocess.run(
        [sys.executable, str(STANDIN / "warmup.py")], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout), proc.stderr


def main() -> int:
    arms = {"DSPARK_HOTFIX=0": start(False), "DSPARK_HOTFIX=1": start(True)}
    print("Stand-in for vLLM 0.23.1rc1.dev788 (DeepSeek-V4-Flash-DSpark, --kv-cache-dtype fp8, dspark)\n")
    for arm, (report, log) in arms.items():
        view = report["views"].get("draft.0.swa")
        layers = sorted(n for n in report["loaded"] or () if n.startswith("model.layers."))
        print(f"== {arm}")
        if log.strip():
            print("   shim log:\n" + "\n".join(f"     {line}" for line in log.strip().splitlines()))
        print(f"   draft layer weights loaded: {len(layers)} of 6")
        if view:
            print(f"   draft SWA KV view: shape {tuple(view['shape'])}, strides {tuple(view['stride'])}")
        print(f"   engine start: {'FAILED: ' + report['error'] if report['error'] else 'ok'}\n")
    fixed = arms["DSPARK_HOTFIX=1"][0]["error"] is None and arms["DSPARK_HOTFIX=0"][0]["error"]
    print("The shim turns the crash into a working start." if fixed else "UNEXPECTED: see above.")
    return 0 if fixed else 1


if __name__ == "__main__":
    raise SystemExit(main())
