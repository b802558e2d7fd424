"""Run the GPU evidence tier (tests/gpu) against vLLM 0.25.0's real FlashMLA kernel.

Three steps, because the GPU machine has torch but no network and no vLLM:

  python3 -m harness.gpu_evidence prepare
      here: extract FlashMLA from the vLLM 0.25.0 wheel into .gpu/
  python3 -m harness.gpu_evidence run [--out D]
      on the GPU machine, from the repository root: pytest -m gpu, results into D (default $OUT)
  python3 -m harness.gpu_evidence collect D
      here: D's results -> docs/evidence/gpu-h200.{json,md}

Between prepare and run, copy the checkout with its ignored .gpu/ folder to the GPU
machine (with this workplace's device tool: command `python3 -m harness.gpu_evidence run`,
carry [".gpu"]), then bring D back. Standard library only; any Python 3.9+.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from harness import common
from harness.common import EVIDENCE, REPO

VLLM_VERSION = "0.25.0"
WHEEL_MEMBER = "vllm/_flashmla_C.abi3.so"
STAGE = REPO / ".gpu"
WHEEL_CACHE = Path(
    os.environ.get("DSPARK_WHEEL_CACHE", Path.home() / ".cache" / "dspark-hotfix" / "wheels")
)
RESULTS_NAME = "gpu-h200.json"


def prepare(_: argparse.Namespace) -> int:
    wheels = sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*x86_64.whl"))
    if not wheels:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        # The extension is built for x86-64 Linux and torch 2.11, whatever this
        # machine is; the wheel is abi3, so any CPython tag resolves it.
        platforms = ["manylinux_2_31_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64"]
        subprocess.run(
            [
                sys.executable,
                *"-m pip download".split(),
                f"vllm=={VLLM_VERSION}",
                *"--no-deps --only-binary=:all: --python-version 3.12 -d".split(),
                str(WHEEL_CACHE),
                *[arg for p in platforms for arg in ("--platform", p)],
            ],
            check=True,
        )
        wheels = sorted(WHEEL_CACHE.glob(f"vllm-{VLLM_VERSION}-*x86_64.whl"))
    wheel = wheels[-1]
    STAGE.mkdir(exist_ok=True)
    library = STAGE / Path(WHEEL_MEMBER).name
    with zipfile.ZipFile(wheel) as archive:
        library.write_bytes(archive.read(WHEEL_MEMBER))
    digest = common.sha256_file(library)
    (STAGE / "SOURCE.json").write_text(
        json.dumps({"wheel": wheel.name, "member": WHEEL_MEMBER, "sha256": digest}, indent=2) + "\n"
    )
    common.keep_out_of_git(STAGE)
    print(f"{library.relative_to(REPO)}  sha256 {digest}\n  from {wheel}")
    print("next, on the GPU machine with .gpu/ carried along: python3 -m harness.gpu_evidence run")
    return 0


def run(args: argparse.Namespace) -> int:
    out = common.output_folder(args.out, "gpu-evidence-out")
    results = out / RESULTS_NAME
    env = dict(os.environ, DSPARK_GPU_EVIDENCE_JSON=str(results), PYTHONUNBUFFERED="1")
    if (STAGE / "_flashmla_C.abi3.so").is_file():
        env.setdefault("DSPARK_FLASHMLA_LIB", str(STAGE / "_flashmla_C.abi3.so"))
    print(common.query("nvidia-smi") or "nvidia-smi: not available", flush=True)
    # addopts are cleared so that project-wide options meant for the CPU CI (coverage,
    # marker filters) cannot hide or break the GPU tier on a bare machine.
    command = [
        sys.executable,
        *"-m pytest tests/gpu -m gpu -v -rs -p no:cacheprovider -o addopts=".split(),
        f"--junitxml={out / 'junit.xml'}",
    ]
    started = datetime.datetime.now(datetime.UTC)
    with (out / "pytest.log").open("w") as log:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
        code = process.wait()
    data = (
        json.loads(results.read_text())
        if results.is_file()
        else {"environment": {}, "results": {}, "tests": {}}
    )
    data["run"] = {
        "command": "python3 -m harness.gpu_evidence run",
        "pytest": " ".join(command[1:]),
        "pytest_exit_code": code,
        "started_utc": started.isoformat(timespec="seconds"),
        "driver": _driver_version(),
        "flashmla_source": _stage_source(),
    }
    common.write_json(results, data)
    if code == 0 and not any(t["outcome"] == "passed" for t in data["tests"].values()):
        print("no GPU test ran (see the skip reasons above): this is no evidence", file=sys.stderr)
        return 1
    return code


def _driver_version() -> str | None:
    return common.query("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader")


def _stage_source() -> dict[str, str] | None:
    source = STAGE / "SOURCE.json"
    return json.loads(source.read_text()) if source.is_file() else None


def collect(args: argparse.Namespace) -> int:
    data = json.loads((Path(args.results) / RESULTS_NAME).read_text())
    EVIDENCE.mkdir(parents=True, exist_ok=True)
    common.write_json(EVIDENCE / RESULTS_NAME, data)
    (EVIDENCE / "gpu-h200.md").write_text(render(data))
    print(f"wrote {EVIDENCE / RESULTS_NAME} and {EVIDENCE / 'gpu-h200.md'}")
    failed = [k for k, v in data["tests"].items() if v["outcome"] == "failed"]
    return 1 if failed or data.get("run", {}).get("pytest_exit_code") else 0


def render(data: dict) -> str:
    env, res, tests, run_info = (
        data["environment"],
        data["results"],
        data["tests"],
        data.get("run", {}),
    )
    outcomes = [t["outcome"] for t in tests.values()]
    lines = [
        "# GPU evidence: FlashMLA on the SWA KV layouts (NVIDIA H200)",
        "",
        "Generated by `python3 -m harness.gpu_evidence collect` from the results of",
        (
            "`python3 -m harness.gpu_evidence run`; raw numbers in"
            f" [{RESULTS_NAME}]({RESULTS_NAME}). Re-run:"
        ),
        (
            "`python3 -m harness.gpu_evidence prepare`, then `python3 -m harness.gpu_evidence run`"
            " on a machine"
        ),
        (
            "with the GPU (carrying `.gpu/`), then `python3 -m harness.gpu_evidence collect <its"
            " output folder>`."
        ),
        "",
        "## Setup",
        "",
        (
            f"- GPU: {env.get('gpu')} (SM {env.get('capability')}, {env.get('multiprocessors')}"
            f" SMs, {env.get('gpu_memory_gib')} GiB), driver {run_info.get('driver')}"
        ),
        f"- torch {env.get('torch')} (CUDA {env.get('cuda')}), Python {env.get('python')}",
        (
            f"- FlashMLA: `{env.get('flashmla_library')}` from"
            f" `{(run_info.get('flashmla_source') or {}).get('wheel', 'an installed vLLM')}`,"
            f" sha256 `{env.get('flashmla_sha256')}`, called as"
            " `torch.ops._flashmla_C.sparse_decode_fwd`"
        ),
        f"- Op schema: `{env.get('sparse_decode_fwd_schema')}`",
        (
            "- KV view geometry from `docs/evidence/kv_views.json` (source:"
            f" {env.get('kv_views_source')})"
        ),
        (
            f"- Run {run_info.get('started_utc')}: {outcomes.count('passed')} passed, "
            f"{outcomes.count('failed')} failed, {outcomes.count('skipped')} skipped "
            f"(pytest exit code {run_info.get('pytest_exit_code')})"
        ),
        "",
        "## 1. The pre-fix SWA view is what FlashMLA rejects",
        "",
    ]
    pre, extra = res.get("pre_fix_main_cache"), res.get("pre_fix_extra_cache")
    if pre:
        lines += [
            (
                f"The 512-byte view {pre['view']['shape']} (page stride"
                f" {pre['view']['page_stride']} B), passed as the main (SWA) cache, raises:"
            ),
            "",
            f"    RuntimeError: {pre['error']}",
            "",
            (
                f"The page under that view is {pre['view']['page_stride']} B, large enough for a"
                " block of 64 fp8_ds_mla tokens: only the view's last dimension is wrong, and that"
                " is what the shim corrects."
                if pre["page_holds_fp8_ds_mla_block"]
                else (
                    f"The page under that view, {pre['view']['page_stride']} B, could not even hold"
                    " a block of 64 fp8_ds_mla tokens (37376 B): the allocation is wrong too, not"
                    " only the view."
                )
            ),
        ]
    if extra:
        lines += [
            "",
            (
                "The same view passed as the *extra* (compressed) cache raises a different message,"
                " so the reported one names the SWA cache:"
            ),
            "",
            f"    RuntimeError: {extra['error']}",
        ]
    fixed = res.get("corrected_main_cache")
    lines += ["", "## 2. The corrected view runs", ""]
    if fixed:
        lines += [
            (
                f"The 584-byte view {fixed['view']['shape']} with strides {fixed['view']['stride']}"
                f" runs: out {fixed['out_shape']} bf16, lse {fixed['lse_shape']} fp32, all finite."
            ),
        ]
    lines += [
        "",
        "## 3. Attention from the corrected layout matches an fp32 reference",
        "",
        (
            "The pools are filled in the `fp8_ds_mla` page layout: per page, 64 token bodies of 576"
            " B (448 e4m3 NoPE values, then 64 bf16 RoPE values), then 64 records of 8 B (7 UE8M0"
            " exponents, one per 64 NoPE values, and a pad byte), padded to 37440 B. Each 64-value"
            " tile has its own gain, so a scale read from the wrong place is mostly off by 2x or"
            " more. h_q = 64, d = d_v = 512, softmax scale 512^-0.5, one query per request,"
            " requests at lengths 5 ... 4095 (windows shorter and longer than 128). The SWA cache"
            " is the main cache (window 128 via `topk_length`); the C4A case adds the compressed"
            " cache as the extra cache with top-k 512, about 10% `-1` entries and its own lengths."
            " Index entries past a request's length point at poison tokens. The reference"
            " dequantizes the same bytes and computes softmax attention in fp32 (V = the whole"
            " 512-wide K, the sink rescaling the output only)."
        ),
        "",
        (
            "| case | attended tokens | max abs err | mean abs err | max abs ref | mean abs ref |"
            " max err / max ref | mean err / mean ref | max err / bound | 1 - cos | lse max abs"
            " err |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in sorted(res.items()):
        if key.startswith("correctness_"):
            lines.append(
                f"| {key.removeprefix('correctness_')} | {r['attended_tokens']} |"
                f" {r['max_abs_error']:.3g} | {r['mean_abs_error']:.3g} | {r['max_abs_ref']:.3g} |"
                f" {r['mean_abs_ref']:.3g} | {r['relative_max_error']:.1e} |"
                f" {r['relative_mean_error']:.1e} | {r['max_error_over_bound']:.3f} |"
                f" {r['one_minus_cosine']:.1e} | {r['lse_max_abs_error']:.1e} |"
            )
    lines += [
        "",
        (
            "Tolerance, elementwise: |out - ref| <= 2^-7 |ref| + 2^-8 max|ref|, and |lse - ref| <="
            " 1e-3. bf16 keeps 8 significant bits (one rounding: 2^-9 relative); the kernel rounds"
            " the softmax weights to bf16 before P.V and the output to bf16, so 2^-7 leaves a"
            " margin of about 4x over those two roundings; the absolute floor covers outputs that"
            " cancel to near zero. The fp8 inputs add no error of their own: e4m3 times a power of"
            " two is exact in bf16, and the reference uses the same dequantized values. The lse"
            " comes from fp32 sums of exact products. A layout error lands far outside: a misplaced"
            " scale (mostly 2x off or more) or a token read past `topk_length` (hundreds off)."
        ),
        "",
        "## 4. Decode speed from the corrected layout",
        "",
        (
            "Every request at length 8192: 128 SWA tokens, plus 512 of 2048 compressed tokens in"
            " the C4A case, pages spread over a pool of at least 300 MB per cache. The SWA-only"
            " rows are what a DSpark draft layer runs. Scheduler metadata planned once and reused,"
            " as vLLM does across layers. Cold: median of"
            f" {next((r['runs'] for k, r in res.items() if k.startswith('speed_')), '?')} launches,"
            " each after a 256 MB write that evicts the 60 MB L2. Warm: mean of as many launches"
            " back to back (two kernels per launch, split-KV and combine, so small batches show a"
            " fixed floor). Bytes = attended tokens x 584 B + indices + q + out + lse; peak = 4.8"
            " TB/s (datasheet). Each 584-byte token feeds 2 x 64 heads x (512 + 512) = 131072"
            " FLOP, 224 FLOP per byte, above the H200's ridge point (about 206 FLOP/B in dense"
            " bf16 by the datasheet): at large batches this decode leans on the tensor cores, so"
            " the fraction of HBM peak alone understates it; TFLOP/s is given beside it."
        ),
        "",
        (
            "| layer | batch | tokens | bytes | cold median (us) | warm mean (us) | cold GB/s | of"
            " peak | TFLOP/s |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    speed = [r for k, r in res.items() if k.startswith("speed_")]
    for r in sorted(speed, key=lambda r: (r["with_extra"], r["batch"])):
        lines.append(
            f"| {'SWA + compressed' if r['with_extra'] else 'SWA only'} | {r['batch']} |"
            f" {r['attended_tokens']} | {r['bytes_moved'] / 1e6:.2f} MB |"
            f" {r['cold_l2_median_us']:.1f} | {r['back_to_back_mean_us']:.1f} |"
            f" {r['cold_l2_gb_per_s']:.0f} | {r['cold_l2_fraction_of_peak']:.1%} |"
            f" {r['cold_l2_tflop_per_s']:.1f} |"
        )
    lines += ["", "## Tests", ""]
    for node, t in sorted(tests.items()):
        note = f": {t['reason']}" if "reason" in t else ""
        lines.append(f"- `{node}` {t['outcome']}{note}")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser, steps = common.command_line("gpu_evidence", __doc__)
    steps.add_parser(
        "prepare", help="extract FlashMLA from the vLLM wheel into .gpu/"
    ).set_defaults(func=prepare)
    on_gpu = steps.add_parser("run", help="on the GPU machine: run tests/gpu, write results")
    on_gpu.add_argument("--out", help="results folder (default: $OUT)")
    on_gpu.set_defaults(func=run)
    back = steps.add_parser(
        "collect", help="turn a results folder into docs/evidence/gpu-h200.{json,md}"
    )
    back.add_argument("results")
    back.set_defaults(func=collect)
    return common.run_step(parser)


if __name__ == "__main__":
    sys.exit(main())
