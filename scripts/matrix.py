"""docs/MATRIX.md, the version matrix, generated from the code and the committed evidence alone.

vLLM build x hybrid KV cache manager on/off x what each patch does x the exact lines, read from the
records alone, never from the code: a patch removed since they were written stays in them, and here,
as history (`make records` writes them anew, then this page):

- docs/evidence/releases.json: every vLLM release that carries DeepSeek-V4, without and with the
  shim: doctor's verdict, each patch's state, vLLM's own KV-cache grouping with the hybrid manager
  on and off, and the draft's quantization (tests/real_vllm/test_releases.py records it); the
  README's removal rule is written from it too;
- docs/evidence/hybrid-off.json: vLLM's own code on the CPU, each build without and with the shim,
  the hybrid manager on and off (tests/real_vllm/test_hybrid_off.py records it);
- docs/evidence/lines.json: the lines each process kind prints, per build
  (tests/real_vllm/test_lines.py);
- docs/evidence/serve-h200.json: `vllm serve` on the H200, per arm (harness/serve_h200.py);
- docs/evidence/checkpoint-h200/: `vllm.LLM` on the H200 with a real checkpoint, per variant
  (harness/e2e_h200.py --real).

Where two records say what a patch did on one build, they must agree, or nothing is written.

    python scripts/matrix.py           # writes docs/MATRIX.md and the README's removal rule
    python scripts/matrix.py --check   # exits 1 where either is not what the evidence gives
"""

from __future__ import annotations

import json
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EVIDENCE = ROOT / "docs" / "evidence"
TARGET = ROOT / "docs" / "MATRIX.md"
README = ROOT / "README.md"
RULE = re.compile(r"^\*\*The rule:\*\*.*?(?=\n\n)", re.S | re.M)  # the README's paragraph
REVERTED = "0.25.0 reverted"  # PR #47716 reverted on 0.25.0: the reported pre-release's code
# 0.25.0 with the shifted remap in a draft loader that skips names it does not have
# (harness.e2e_h200.TOLERANT)
TOLERANT = "0.25.0 tolerant"
CPU_LABEL = {"0.25.0-reverted": REVERTED}  # hybrid-off.json's name for it
# harness/serve_h200.py's arms: (build, hybrid manager, shim)
H200_ARMS = {
    "bug": (REVERTED, "on", "without"),
    "fixed-launcher": (REVERTED, "on", "with (launcher)"),
    "fixed-plugin": (REVERTED, "on", "with (plugin)"),
    "baseline": ("0.25.0", "on", "without"),
    "baseline-hma-off": ("0.25.0", "off", "without"),
    "shim-hma-off": ("0.25.0", "off", "with (launcher)"),
}
KINDS = ("API server", "engine core", "tensor-parallel worker")


def recorded_patches(hybrid: dict) -> list[str]:
    """The patches the records were written with, in the registry's order: each arm with the shim
    names them all."""
    (names,) = {tuple(arms["with_shim"]["status"]["patches"]) for arms in hybrid.values()}
    return list(names)


def states_of(line: str, names: list[str]) -> tuple[str, dict[str, str]]:
    """A line's verdict and the state of each of ``names`` (the patches it was printed with): named
    ones as named, the rest `not_needed`. A line that counts another number of patches was printed
    by another run."""
    verdict, _, rest = line.partition(": ")
    counted = sum(int(n) for n in re.findall(r"(\d+) \w+", rest))
    if counted != len(names):
        raise SystemExit(
            f"{line!r} counts {counted} patches, the records {len(names)}: run make records"
        )
    states = dict.fromkeys(names, "not_needed")
    for state, named in re.findall(r"\d+ (\w+)(?: \(([^)]*)\))?", rest):
        for name in filter(None, (n.strip() for n in named.split(","))):
            states[name] = state
    return verdict, states


def cpu_cell(arm: dict) -> str:
    if arm["outcome"] == "error":
        error = arm["error"]
        name = error["type"].rsplit(".", 1)[-1]
        return (
            f"stops: `{name}: {error['message'].split(':', 1)[0]}`"
            if name == "HotfixError"
            else f"`{name}`"
        )
    views = {
        layer["view"]["bytes_per_token"]
        for layer in arm["layers"].values()
        if layer["kind"] == "swa"
    }
    return (
        "SWA view "
        + "/".join(str(v) for v in sorted(views))
        + " B/token"
        + (" (FlashMLA rejects it)" if 512 in views else "")
    )


def cards(serve: dict) -> dict[str, str]:
    """Each device call's card, as a short name ("H200", "H100"), from the GPU its summary
    recorded."""
    return {
        ses["source"]: (
            ses["summary"].get("gpu", "").removeprefix("NVIDIA ").split(",")[0].split(" ")[0]
        )
        for ses in serve["sessions"]
    }  # "NVIDIA H100 80GB HBM3, 81559 MiB" -> "H100"


def h200_cells(serve: dict) -> tuple[dict[tuple[str, str, str], str], list[str]]:
    """Each (build, hybrid manager, shim) cell's servers by tensor-parallel size, and a note for
    each server that did not come up for another reason than the reported error (with its first
    error)."""
    first = {
        f"{ses['source']}-{s['label']}": s.get("first_error")
        for ses in serve["sessions"]
        for s in ses["summary"].get("servers", [])
    }
    card = cards(serve)
    cells: dict[tuple[str, str, str], dict[str, list[str]]] = {}
    notes: list[str] = []
    for arm, servers in sorted(serve["figures"]["outcomes"].items()):
        for s in (
            servers if arm in H200_ARMS else ()
        ):  # (the real checkpoint's arms: their own tables)
            if s["reported_error"]:
                what = "the reported error"
            elif s["outcome"] == "ready":
                what = "ready"
            elif first[s["server"]] and "HotfixError" in first[s["server"]]:
                what = "stopped by the shim: `" + first[s["server"]].split(": ")[1] + "`"
            else:
                notes.append(
                    f"{s['server']} ({arm}, {s['tp']}): {s['outcome'] or 'no outcome'}, "
                    f"first error: `{(first[s['server']] or 'none')[:140]}`"
                )
                what = f"{s['outcome'] or 'no outcome'} [{len(notes)}]"
            name = card[s["server"].split("-")[0]]
            where = s["tp"] if name == "H200" else f"{s['tp']} on an {name}"
            cells.setdefault(H200_ARMS[arm], {}).setdefault(where, []).append(what)
    text = {
        key: "; ".join(
            f"{tp}: "
            + ", ".join(
                f"{v} x{values.count(v)}" if values.count(v) > 1 else v
                for v in dict.fromkeys(values)
            )
            for tp, values in tps.items()
        )
        for key, tps in cells.items()
    }
    return text, notes


# The engine runs on the H200 with a real checkpoint (harness/checkpoint.py): variant -> (build,
# shim). Any other variant runs the reverted build with some patches excluded
# (harness.common.one_patch): its row says which.
WEIGHT_RUNS = {
    "baseline": ("0.25.0", "none"),
    "bug": (REVERTED, "off (`DSPARK_HOTFIX=0`)"),
    "fixed": (REVERTED, "on"),
    "tolerant": (TOLERANT, "none"),
    "tolerant-fixed": (TOLERANT, "on"),
}


def selected(run: dict) -> str:
    """The shim's setting of a run with patches excluded, from the line it printed: the fewer of the
    patches it kept on and the ones it left off."""
    line = str(run["shim_lines"][0])
    on, off = (re.search(rf"\d+ {state} \(([^)]*)\)", line) for state in ("patched", "excluded"))
    kept, left = (
        [f"`{name}`" for name in found[1].split(", ")] if found else [] for found in (on, off)
    )
    if kept and (not left or len(kept) <= len(left)):
        return f"on, {', '.join(kept)} alone"
    return f"on, without {', '.join(left)}"


def weight_rows() -> list[str]:
    """One row per engine variant of docs/evidence/checkpoint-h200/: what its runs loaded, how they
    ended where they failed, how many draft parameters equal unmodified vLLM's, and the acceptance
    of the runs that generated."""
    found: dict[str, list[dict]] = {}
    for path in sorted((EVIDENCE / "checkpoint-h200").glob("call*/[0-9][0-9]-*.json")):
        run = json.loads(path.read_text())
        found.setdefault(run["variant"], []).append(run)
    reference = next(
        (r["draft_digests"] for r in found.get("baseline", []) if r.get("draft_digests")), {}
    )
    rows = []
    variants = {
        **WEIGHT_RUNS,
        **{v: (REVERTED, selected(found[v][0])) for v in sorted(found) if v not in WEIGHT_RUNS},
    }
    for variant, (build, shim) in variants.items():
        runs = found.get(variant, [])
        loaded = sorted({r["draft_params_loaded"] for r in runs if r.get("draft_params_loaded")})
        errors = sorted({r["root_cause"] for r in runs if r.get("root_cause")})
        load = [f"{'/'.join(map(str, loaded))} draft parameters"] if loaded else []
        load += [f"`{e}`" for e in errors]
        equal = sorted(
            {
                sum(reference.get(n) == d for n, d in r["draft_digests"].items())
                for r in runs
                if r.get("draft_digests")
            }
        )
        same = (
            f"{'/'.join(map(str, equal))} of {len(reference)}"
            if equal and reference
            else "not measured"
        )
        accepted = []
        for run in runs:
            spec = run.get("spec_metrics_total") or {}
            if spec.get("vllm:spec_decode_num_drafts"):
                drafts, by_position = (
                    spec["vllm:spec_decode_num_drafts"],
                    spec["vllm:spec_decode_num_accepted_tokens_per_pos"],
                )
                accepted.append(", ".join(f"{a / drafts:.2f}" for a in by_position))
        cells = [build, shim, str(len(runs)), ", then ".join(load) or "not run", same]
        rows.append(f"| {' | '.join(cells)} | {'; '.join(accepted) or 'not measured'} |")
    return rows


# harness/serve_h200.py's arms with the real checkpoint: arm -> (build, shim)
WEIGHT_SERVERS = {
    "baseline": ("0.25.0", "none"),
    "fixed-plugin": (REVERTED, "on (plugin)"),
    "tolerant": (TOLERANT, "none"),
    "tolerant-plugin": (TOLERANT, "on (plugin)"),
}


def weight_server_rows() -> list[str]:
    """One row per `vllm serve` arm of docs/evidence/checkpoint-h200/serve*/: whether it served the
    texts unmodified 0.25.0 served (greedy), its acceptance by position, and the shim's states on
    /metrics at ready."""
    found: dict[str, list[dict]] = {}
    for path in sorted((EVIDENCE / "checkpoint-h200").glob("serve*/summary.json")):
        for server in json.loads(path.read_text())["servers"]:
            found.setdefault(server["arm"], []).append(server)
    texts = {s["probe"]["texts_sha256"] for s in found.get("baseline", []) if s.get("probe")}
    rows = []
    for arm, (build, shim) in WEIGHT_SERVERS.items():
        runs = [s for s in found.get(arm, []) if s.get("probe")]
        same = sorted({"yes" if s["probe"]["texts_sha256"] in texts else "no" for s in runs})
        accepted = []
        for run in runs:
            drafts = run["probe"]["spec_decode_metrics"]["vllm:spec_decode_num_drafts_total"]
            by_position = run["probe"]["accepted_by_position"]
            accepted.append(
                ", ".join(
                    f"{by_position[str(k)] / drafts:.2f}" for k in sorted(map(int, by_position))
                )
            )
        states: dict[
            str, list[str]
        ] = {}  # state -> its patches, from dspark_hotfix_patch_state's series at 1
        for line in {
            line for run in runs for line in run["metrics"]["ready"] if line.endswith("} 1.0")
        }:
            found_state = re.fullmatch(
                r'dspark_hotfix_patch_state\{patch="(\w+)",state="(\w+)"[^}]*\} 1.0', line
            )
            if found_state:
                states.setdefault(found_state[2], []).append(found_state[1])
        # as the shim's line says them: the patched ones named where some are not
        named = {"patched"} if len(states) > 1 else set()
        said = [
            f"{len(v)} {k}" + (f" ({', '.join(sorted(v))})" if k in named else "")
            for k, v in states.items()
        ]
        cells = [build, shim, "/".join(same) or "not run", "; ".join(accepted) or "not measured"]
        rows.append(
            f"| {' | '.join(cells)} | {', '.join(sorted(said, reverse=True)) or 'no series'} |"
        )
    return rows


def bench_rows(serve: dict) -> list[str]:
    """One row per arm of each silent-form benchmark (figures.bench with a reference arm; calls on
    the same servers as one figure): vLLM's own figures, the median of the arm's timed runs, and how
    many runs compiled kernels (such a run is no clean measure of the arm's speed); then the bug's
    cost over the clean pairs."""
    rows, costs = [], []
    card = cards(serve)
    benches = serve["figures"]["bench"]
    joined = {call for key in benches if "+" in key for call in key.split("+")}
    for call, bench in sorted(benches.items()):
        if not bench.get("reference_arm") or call in joined:
            continue
        name = card[call.split("+")[0]]
        arms = (bench["reference_arm"], bench["fixed_arm"])
        for arm in arms:
            build, shim = WEIGHT_SERVERS[arm]
            got, by_position = bench["medians"][arm], bench["acceptance_by_position"][arm]
            compiled = bench["jit_compiles"][arm]
            cells = [
                call,
                name,
                build,
                shim,
                str(len(bench["output_throughput"][arm])),
                f"{got['output_throughput']:,.0f}",
                f"{got['spec_decode_acceptance_rate']:.3f}%",
                ", ".join(f"{a:.2f}" for a in by_position),
                f"{got['mean_ttft_ms']:,.0f}",
                f"{got['median_itl_ms']:.1f}",
                f"{sum(n > 0 for n in compiled)} of {len(compiled)}",
            ]
            rows.append(f"| {' | '.join(cells)} |")
        cost = bench[
            "clean"
        ]  # the fixed arm's output throughput over the reference's, pair by pair
        if "ratio" in cost:
            low, high = cost["ci95"]
            costs.append(
                f"- {call} ({name}): {cost['ratio']:.2f} times (95% {low:.2f} to {high:.2f}), over"
                f" the {cost['pairs']} pairs in which no run compiled"
            )
        else:
            fixed, reference = (
                bench["medians"][arm]["output_throughput"] for arm in reversed(arms)
            )
            pairs = bench["all"]["pairs"]
            costs.append(
                f"- {call} ({name}): {fixed / reference:.2f} times on the medians, no clean"
                f" measure: {'each of its' if pairs > 1 else 'its one'} pair{'s' * (pairs > 1)} had"
                " a run that compiled"
            )
    why = (
        "The bug's cost, as the output throughput with the shim over without it (the same build,"
        " paired runs):"
    )
    return [*rows, "", why, "", *costs]


def spans(versions: list[str], line: list[str]) -> str:
    """``versions`` as runs of consecutive releases of ``line``: "0.25.0 to 0.27.1, 0.33.0"."""
    runs: list[list[str]] = []
    for version in versions:
        if runs and line.index(version) == line.index(runs[-1][-1]) + 1:
            runs[-1].append(version)
        else:
            runs.append([version])
    named = [run[0] if len(run) == 1 else f"{run[0]} to {run[-1]}" for run in runs]
    return ", ".join(named[:-1]) + (" and " if len(named) > 1 else "") + named[-1]


def removal_rule(releases: dict) -> str:
    """The README's removal rule, from every release's verdict and draft quantization."""
    line = list(releases)
    by: dict[str, list[str]] = {"removable": [], "guarding": [], "fixing": []}
    for version, arms in releases.items():
        by[arms["with_shim"]["verdict"]].append(version)
    draft = {v: arms["with_shim"]["draft_quantization"] for v, arms in releases.items()}
    named = [
        v for v, quantization in draft.items() if quantization["named"] != quantization["target"]
    ]
    text = (
        f"**The rule:** remove the shim where it says `removable` (`doctor` exits 3): vLLM"
        f" {spans(by['removable'], line)}. Where it says `guarding`"
        f" ({spans(by['guarding'], line)}), remove it only where no deployment uses the setting it"
        " stops: the hybrid KV cache manager off (`--disable-hybrid-kv-cache-manager`, or a"
        " `--kv-transfer-config` connector without hybrid support). Keep it where it says `fixing`"
        f" ({spans(by['fixing'], line)})."
    )
    if named:
        text += (
            f" On {spans(named, line)} a DSpark draft named explicitly"
            " (`--speculative-config.model`) gets `fp8`, not the target's quantization"
            " (vllm#51916), which no patch repairs: leave it unnamed."
            " `dspark-hotfix doctor --model DIR` says it for a checkpoint (no patch can tell"
            " without its files)."
        )
    return textwrap.fill(text, 120, break_long_words=False, break_on_hyphens=False)


def release_rows(releases: dict) -> list[str]:
    """One row per release: verdict, the patches applied, vLLM's grouping as shipped and with the
    shim, and the quantization vLLM gives a draft named explicitly."""

    def grouped(cell: dict) -> str:
        if "error" in cell:
            return f"`{cell['error']}`"
        return "SWA view " + "/".join(map(str, cell["swa_bytes_per_token"])) + " B/token"

    rows = [
        "| vLLM | verdict | patched | hybrid on, as shipped | hybrid off, as shipped |"
        " hybrid on, with the shim | hybrid off, with the shim | draft named explicitly |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for version, arms in releases.items():
        shim, shipped = arms["with_shim"], arms["without_shim"]
        cells = [
            version,
            shim["verdict"],
            ", ".join(f"`{name}`" for name in shim["needed"]) or "none",
            *(grouped(arm[key]) for arm in (shipped, shim) for key in ("hybrid_on", "hybrid_off")),
            f"`{shim['draft_quantization']['named']}`",
        ]
        rows.append(f"| {' | '.join(cells)} |")
    return rows


def render() -> str:
    hybrid = json.loads((EVIDENCE / "hybrid-off.json").read_text())["versions"]
    lines = json.loads((EVIDENCE / "lines.json").read_text())
    serve = json.loads((EVIDENCE / "serve-h200.json").read_text())
    h200, notes = h200_cells(serve)
    builds = list(lines)
    names = recorded_patches(hybrid)
    final = {build: states_of(lines[build]["engine core"][-1], names) for build in builds}
    for label, arms in hybrid.items():  # the two records agree, or the matrix is not written
        build = CPU_LABEL.get(label, label)
        recorded = {name: p["state"] for name, p in arms["with_shim"]["status"]["patches"].items()}
        if build in final and recorded != final[build][1]:
            raise SystemExit(
                f"{build}: hybrid-off.json says {recorded}, lines.json {final[build][1]}"
            )
    releases = json.loads((EVIDENCE / "releases.json").read_text())
    out = [
        "# Version matrix",
        "",
        (
            "Generated by `scripts/matrix.py` from the committed evidence alone (`make records`"
            " runs the real-vLLM"
        ),
        (
            "tier that writes the CPU records, then the script); `make evidence` fails where this"
            " file is stale"
        ),
        (
            "(`harness/tests/test_matrix.py`). The patches are those the records were written with;"
            " what each is and"
        ),
        (
            "when it goes: `dspark_hotfix/patches/__init__.py`. `0.25.0 reverted` is vLLM 0.25.0"
            " with PR #47716"
        ),
        "reverted: the reported pre-release's KV-cache code (no registry carries that build).",
        "",
        "## Every release",
        "",
        "Every vLLM release on the registry that carries DeepSeek-V4, judged on the CPU by vLLM's"
        " own code (docs/evidence/releases.json,",
        "tests/real_vllm/test_releases.py): doctor's verdict with the shim, the patches it applies,"
        " the sliding-window",
        "layers' V2 runner view after vLLM's KV-cache grouping with the hybrid manager on and off,"
        " and the quantization",
        "vLLM's `SpeculativeConfig` gives a DSpark draft named explicitly (the target's is"
        " `deepseek_v4_fp8`).",
        "",
        *release_rows(releases),
        "",
        removal_rule(releases),
        "",
        "## Builds, hybrid KV cache manager on and off",
        "",
        (
            "CPU: vLLM's own KV-cache grouping and V2 runner views for a DeepSeek-V4 model with"
            " DSpark draft"
        ),
        "layers (docs/evidence/hybrid-off.json). H200: `vllm serve` with the reported flags",
        (
            "(docs/evidence/serve-h200.json; `tp1-cudagraph`: without `--enforce-eager`; a cell"
            " names the card where"
        ),
        "the lent machine was not an H200).",
        "",
        (
            "| vLLM build | hybrid manager | CPU, without the shim | CPU, with the shim | H200,"
            " without | H200, with | verdict |"
        ),
        "|---|---|---|---|---|---|---|",
    ]
    for label, arms in hybrid.items():
        build = CPU_LABEL.get(label, label)
        for side in ("on", "off"):
            key = f"hybrid_{side}"
            with_h200 = "; ".join(
                f"{shim[6:-1]}: {v}"
                for (b, h, shim), v in h200.items()
                if b == build and h == side and shim != "without"
            )
            out.append(
                f"| {build} | {side} | {cpu_cell(arms['without_shim'][key])} |"
                f" {cpu_cell(arms['with_shim'][key])} |"
                f" {h200.get((build, side, 'without'), 'not run')} | {with_h200 or 'not run'} |"
                f" {final[build][0] if build in final else 'not recorded'} |"
            )
    out += [
        "",
        (
            "Servers neither ready nor stopped by the reported error or the shim (first error as"
            " logged;"
        ),
        "docs/evidence/serve-h200.md tells each call):",
        "",
    ]
    out += [f"{n}. {note}" for n, note in enumerate(notes, 1)]
    out += [
        "",
        "## A real weight load, H200",
        "",
        (
            "`vllm.LLM` with a real checkpoint for the e2e model (harness/checkpoint.py: the draft"
            " predicts what the"
        ),
        (
            "target predicts only with its three layers where they belong), greedy"
            " (docs/evidence/checkpoint-h200.md)."
        ),
        (
            "vLLM's loader counts the draft's own 96 parameters; the digests, taken in the worker"
            " once loaded, cover all"
        ),
        (
            "98, the 2 the draft shares with the target included. `0.25.0 tolerant` is 0.25.0 with"
            " the shifted remap"
        ),
        (
            "in a draft loader that skips names it does not have: the report's silent form, where"
            " the layers keep"
        ),
        (
            "their initial values (those equal without the shim are the head stack it loads, the 2"
            " shared, and the"
        ),
        "layer parameters whose checkpoint value is their initial one).",
        "",
        (
            "| vLLM build | shim | runs | draft load | parameters equal to 0.25.0's | accepted /"
            " drafted, by position |"
        ),
        "|---|---|---|---|---|---|",
        *weight_rows(),
        "",
        (
            "`vllm serve` with the same checkpoint and the report's flags (harness/serve_h200.py"
            " --real):"
        ),
        "",
        (
            "| vLLM build | shim | texts as 0.25.0's | accepted / drafted, by position | states on"
            " /metrics |"
        ),
        "|---|---|---|---|---|",
        *weight_server_rows(),
        "",
        (
            "Under `vllm bench serve` (vLLM's own client: 128 prompts at 128, 128 tokens in, 256"
            " out, one seed; eager):"
        ),
        "",
        (
            "| calls | card | vLLM build | shim | timed runs | output tokens/s | acceptance | by"
            " position | mean TTFT, ms | median ITL, ms | runs that compiled |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *bench_rows(serve),
        "",
        "## What each patch does, per build",
        "",
        (
            "The state each patch ends in, in an engine core once every patch is judged"
            " (docs/evidence/lines.json;"
        ),
        "docs/evidence/hybrid-off.json says the same where it measured the build).",
        "",
        "| patch | " + " | ".join(builds) + " |",
        "|---|" + "---|" * len(builds),
    ]
    for name in names:
        cells = " | ".join(final[build][1][name] for build in builds)
        out.append(f"| `{name}` | {cells} |")
    out += [
        "",
        "## The exact lines",
        "",
        (
            "What each process kind prints, in order, after `dspark_hotfix VERSION (pid PID) via"
            " SOURCE: `"
        ),
        (
            "(tests/real_vllm/test_lines.py imports each kind's modules in the order vLLM does)."
            " The last line of"
        ),
        "a pid is its whole state.",
    ]
    for build in builds:
        out += ["", f"### {build}", ""]
        for kind in KINDS:
            out += [f"{kind}:", "", "```", *lines[build][kind], "```", ""]
        out.pop()
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    rule = removal_rule(json.loads((EVIDENCE / "releases.json").read_text()))
    readme = RULE.sub(lambda _: rule, README.read_text(), count=1)
    if "--check" in argv:
        stale = [p for p, t in ((TARGET, text), (README, readme)) if p.read_text() != t]
        for path in stale:
            print(
                f"{path.relative_to(ROOT)} is stale: run python scripts/matrix.py", file=sys.stderr
            )
        return 1 if stale else 0
    TARGET.write_text(text)
    README.write_text(readme)
    print(f"wrote {TARGET.relative_to(ROOT)} and the removal rule of {README.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
