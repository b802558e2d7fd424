"""The reported crash and its repair, side by side, on the stand-in build.

Runs the stand-in engine's start (draft weight loading, KV-cache warm-up, the
FlashMLA shape check) twice in fresh interpreters, as ``vllm serve`` would
start: once with ``DSPARK_HOTFIX=0`` and once with the shim on ``PYTHONPATH``.
Then it says which patch made each change, and what to do next.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STANDIN = REPO / "tests" / "standin"
sys.path.insert(0, str(REPO))

from dspark_hotfix.patches import ALL  # noqa: E402

# The engine start, then what the shim did there: each patch's row, with its corrections.
START = """
import json, warmup
report = warmup.run()
import dspark_hotfix
report["patches"] = {row["name"]: row for row in dspark_hotfix.status()["patches"]}
print(json.dumps(report))
"""


def start(enabled: bool) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSPARK_HOTFIX")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(STANDIN)])
    env["DSPARK_HOTFIX"] = "1" if enabled else "0"
    proc = subprocess.run(
        [sys.executable, "-c", START], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(proc.stdout), proc.stderr


def width(report: dict) -> int:
    """The narrowest KV view the engine start gave (FlashMLA refuses any but 584 bytes/token)."""
    return min(view["shape"][-1] for view in report["views"].values())


def draft_layers(report: dict) -> int:
    return sum(1 for name in report["loaded"] or () if name.startswith("model.layers."))


def what(patch) -> str:
    """What the patch repairs: the first line of its module's docstring, after its name."""
    doc = importlib.import_module(f"dspark_hotfix.patches.{patch.name}").__doc__ or ""
    return doc.strip().splitlines()[0].partition(": ")[2]


def main() -> int:
    arms = {"DSPARK_HOTFIX=0": start(False), "DSPARK_HOTFIX=1": start(True)}
    print(
        "Stand-in for vLLM 0.23.1rc1.dev788 (DeepSeek-V4-Flash-DSpark, --kv-cache-dtype fp8,"
        " dspark)\n"
    )
    for arm, (report, log) in arms.items():
        view = report["views"].get("draft.0.swa")
        print(f"== {arm}")
        if log.strip():
            print("   shim log:\n" + "\n".join(f"     {line}" for line in log.strip().splitlines()))
        print(f"   draft layer weights loaded: {draft_layers(report)} of 6")
        if view:
            print(
                f"   draft SWA KV view: shape {tuple(view['shape'])}, strides"
                f" {tuple(view['stride'])}"
            )
        print(f"   engine start: {'FAILED: ' + report['error'] if report['error'] else 'ok'}\n")
    (off, _), (on, _) = arms.values()
    fixed = on["error"] is None and off["error"]
    if not fixed:
        print("UNEXPECTED: see above.")
        return 1
    print("What changed, and which patch changed it:")
    print(
        f"   KV view width {width(off)} -> {width(on)} bytes/token: FlashMLA runs where it refused"
        " the view."
    )
    if draft_layers(on) != draft_layers(off):
        print(
            f"   draft layer weights {draft_layers(off)} -> {draft_layers(on)} of 6: the draft runs"
            " on its weights."
        )
    for patch in ALL:  # every patch the shim's line counts as patched
        row = on["patches"][patch.name]
        n = row["corrections"]
        if n:
            print(f"   {patch.name} corrected {n} answer{'s' * (n != 1)} of {patch.qualname}:")
        elif (
            row["state"] == "patched" and patch.stops
        ):  # it corrects nothing: it stops a start that would crash
            print(
                f"   {patch.name} is applied; it stops vLLM only where vLLM would crash, and this"
                " start would not:"
            )
        elif row["state"] == "patched":  # a repair of a path this start does not take
            print(f"   {patch.name} is applied; this start does not call {patch.qualname}:")
        if n or row["state"] == "patched":
            print(f"     {what(patch)}")
    print("   Where a patch is not in place, the shim's line, status and doctor say problem.\n")
    print("Next: in your serving image, with the server's environment, run")
    print("   dspark-hotfix doctor")
    print(
        "Exit 0 means the fix will be active where this vLLM needs it. Then start vLLM with the"
        " launcher:"
    )
    print(
        "   dspark-hotfix run -- vllm serve deepseek-ai/DeepSeek-V4-Flash-DSpark --spec-method"
        " dspark ..."
    )
    print("or put the start-up hook on PYTHONPATH yourself:")
    print('   export PYTHONPATH="$(dspark-hotfix path)${PYTHONPATH:+:$PYTHONPATH}"')
    print("README.md says how to install it, and what each exit code means.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
