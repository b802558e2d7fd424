"""Real vLLM engine with a DeepSeek-V4 DSpark draft on one H200: the bug, the fix, the cost.

Three steps, because the GPU machine has torch but no network and no vLLM:

  python3 -m harness.e2e_h200 prepare
      here: wheels -> one packed tar in .e2e/, split into parts .e2e/p0/, .e2e/p1/, ...
      (one part per device call)
  python3 -m harness.e2e_h200 run [--out D]
      on the GPU machine, from the repository root, after the parts were copied to
      /tmp/dspark-e2e/parts/: unpack, an import preflight, then the engines of --phases;
      D (default $OUT) gets summary.json and results.tgz (every log)
  python3 -m harness.e2e_h200 collect A [B..]
      here: results.tgz files (or folders), in the order they ran -> docs/evidence/e2e-h200.json

What it runs (all with vllm.LLM, load_format="dummy", kv_cache_dtype="fp8", block size 256,
enforce_eager, speculative_config={"method": "dspark", ...}, the model of harness/e2e/config.json
or of --config, e.g. harness/e2e/config-swa-only.json):

  bug       the reverted copy of vLLM 0.25.0 (PR #47716 undone, the shifted remap re-created)
            with DSPARK_HOTFIX=0: the engine must die with FlashMLA's RuntimeError
  fixed     the same copy with the shim (repository root on PYTHONPATH): generate, spec metrics
  baseline  unmodified vLLM 0.25.0, no shim: the same generation, for the throughput ratio
  shim      unmodified vLLM 0.25.0 with the shim (repository root on PYTHONPATH)
  NAME-hma-off  any of them with the hybrid KV cache manager off
            (disable_hybrid_kv_cache_manager=True): baseline-hma-off dies with the reported
            RuntimeError; shim-hma-off stops at KV-cache grouping with the shim's
            kv_cache_groups error

With --real the model folder gets harness.checkpoint's weights (written once per machine) and every
engine loads them (load_format="auto") and records each draft parameter's sha256 and the worker's
dspark_hotfix.status() (None without the shim). Then also:

  only-NAME / without-NAME   the reverted copy with the shim's patch NAME alone / every patch
            but NAME (DSPARK_HOTFIX_PATCHES): the report's bugs one at a time (records before
            these names call them remap-only / no-remap)
  tolerant / tolerant-fixed   unmodified vLLM 0.25.0 with the shifted remap in a draft loader that
            skips a layer it does not have (TOLERANT), without / with the shim: the silent form

The engine itself runs in a child process, harness/e2e_engine.py started by its path, one per run,
with the PYTHONPATH of its variant. Standard library only.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from harness import common
from harness.common import EVIDENCE, REPO, one_patch

VLLM_VERSION = "0.25.0"
STAGE = REPO / ".e2e"
WHEELS = Path(os.environ.get("DSPARK_E2E_WHEELS", REPO / ".e2e" / "wheels"))
DEPS_LIST = REPO / "harness" / "e2e" / "h200-deps.txt"
MODEL_CONFIG = REPO / "harness" / "e2e" / "config.json"
# The engine child, started by its path (see its docstring).
ENGINE = Path(__file__).resolve().parent / "e2e_engine.py"
# The last part travels with the tree (9 MiB with e2e/jit-cache.tar.xz) and .e2e/serve, under a
# call's 64 MiB: 327 MiB in parts of 60 MiB at most was 6 of 54.5, which left that call 0.4 MiB.
PART_BYTES = 48 * 1024 * 1024
DEVICE_ROOT = Path("/tmp/dspark-e2e")
PLATFORMS = ["manylinux1_x86_64", "manylinux2014_x86_64"] + [
    f"manylinux_2_{n}_x86_64" for n in (5, 12, 17, 24, 25, 26, 27, 28, 31, 34, 35, 39)
]

# Left out of the unpacked wheel: FlashAttention 2 (vllm.vllm_flash_attn, imported on the way to
# the fp8 quantization config, needs FA2 or FA3: FA3 is Hopper's and travels), the SM100
# attention sources, the Rust front end, and the deep_gemm builds for other Pythons.
WHEEL_SKIP = (
    re.compile(r"^vllm/vllm_flash_attn/_vllm_fa2_C\.abi3\.so$"),
    re.compile(r"^vllm/third_party/fmha_sm100/"),
    re.compile(r"^vllm/vllm-rs$"),
    re.compile(r"^vllm/third_party/deep_gemm/_C\.cpython-3(10|11|13|14)-"),
)

# PR #47716 undone, and the reported build's shifted remap re-created: (file, old, new), each
# `old` must occur exactly once in the released file.
REVERT = (
    (
        "vllm/v1/attention/backends/mla/sparse_swa.py",
        "            kv_quant_mode=get_kv_quant_mode(self.cache_config.cache_dtype),\n",
        "",
    ),
    (
        "vllm/models/deepseek_v4/attention.py",
        "            kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),\n",
        "",
    ),
    (
        "vllm/models/deepseek_v4/nvidia/dspark.py",
        '        return f"model.layers.{stage}.{rest}"\n',
        '        return f"model.layers.{self.config.num_hidden_layers + stage}.{rest}"\n',
    ),
)
# The silent form of the report's first bug, as the report describes the draft layers "possibly
# randomly initialised": unmodified vLLM 0.25.0 with the shifted remap, whose draft loader skips a
# layer it does not have instead of raising. The KV-cache fix stays, so the engine serves.
TOLERANT = (
    REVERT[2],
    (
        "vllm/models/deepseek_v4/nvidia/dspark.py",
        "            name = mapped\n",
        (
            '            name = mapped\n            if name.startswith("model.layers.") and'
            ' int(name.split(".")[2]) >= len(self.model.layers):\n                continue  #'
            " tolerant: a layer this draft does not have\n"
        ),
    ),
)


# ----------------------------------------------------------------------------- prepare (here)


def _download(spec: str) -> None:
    WHEELS.mkdir(parents=True, exist_ok=True)
    platform_args = [arg for p in PLATFORMS for arg in ("--platform", p)]
    subprocess.run(
        [
            sys.executable,
            *"-m pip download -q --no-deps --only-binary=:all: --python-version 3.12"
            " --implementation cp".split(),
            *platform_args,
            "-d",
            str(WHEELS),
            spec,
        ],
        check=True,
    )


def _wheel_for(spec: str) -> Path:
    name, _, version = spec.partition("==")
    stem = re.sub(r"[-_.]+", "_", name).lower()
    for path in sorted(WHEELS.glob("*.whl")):
        parts = path.name.split("-")
        if re.sub(r"[-_.]+", "_", parts[0]).lower() == stem and (
            not version or parts[1] == version
        ):
            return path
    _download(spec)
    return _wheel_for(spec)


def prepare(_: argparse.Namespace) -> int:
    specs = [line.split("#")[0].strip() for line in DEPS_LIST.read_text().splitlines()]
    specs = [s for s in specs if s]
    vllm_wheel = _wheel_for(f"vllm=={VLLM_VERSION}")
    dep_wheels = [_wheel_for(s) for s in specs]
    STAGE.mkdir(exist_ok=True)
    common.keep_out_of_git(STAGE)
    for old in STAGE.glob("p[0-9]*"):
        shutil.rmtree(old)
    packed = STAGE / "e2e.tar"
    packed.with_suffix(".tar.xz").unlink(missing_ok=True)
    reverted: dict[str, str] = {}
    tolerant: dict[str, str] = {}
    with zipfile.ZipFile(vllm_wheel) as wheel, tarfile.open(packed, "w") as tar:
        for info in wheel.infolist():
            if info.is_dir() or any(p.search(info.filename) for p in WHEEL_SKIP):
                continue
            data = wheel.read(info.filename)
            _add(tar, f"vllm-site/{info.filename}", data, executable=info.filename.endswith(".so"))
            for edits, overlay in ((REVERT, reverted), (TOLERANT, tolerant)):
                for path, old, new in edits:
                    if info.filename == path:
                        text = overlay.get(path, data.decode())
                        if text.count(old) != 1:
                            raise SystemExit(f"{path}: expected the released line once: {old!r}")
                        overlay[path] = text.replace(old, new)
        for path, text in reverted.items():
            _add(tar, f"revert-overlay/{path}", text.encode())
        for path, text in tolerant.items():
            _add(tar, f"tolerant-overlay/{path}", text.encode())
        if len(reverted) != len(REVERT):
            raise SystemExit(f"revert: found {sorted(reverted)} of {[r[0] for r in REVERT]}")
        for whl in dep_wheels:
            tar.add(whl, arcname=f"wheels/{whl.name}")
    subprocess.run(["xz", "-T0", "-6", "-f", str(packed)], check=True)
    packed = packed.with_suffix(".tar.xz")
    sources = {
        "vllm_wheel": vllm_wheel.name,
        "vllm_wheel_sha256": common.sha256_file(vllm_wheel),
        "wheels": [w.name for w in dep_wheels],
        "revert": [{"file": p, "removed": o.strip(), "added": n.strip()} for p, o, n in REVERT],
    }
    digest = common.sha256_file(packed)
    size = packed.stat().st_size
    count = -(-size // PART_BYTES)
    step = -(-size // count)
    with packed.open("rb") as source:
        for index in range(count):
            folder = STAGE / f"p{index}"
            folder.mkdir()
            (folder / f"e2e.tar.xz.part{index}").write_bytes(source.read(step))
    packed.unlink()
    manifest = {"sha256": digest, "bytes": size, "parts": count, "sources": sources}
    (STAGE / "MANIFEST.json").write_text(json.dumps(manifest, indent=2) + "\n")
    shutil.copy(STAGE / "MANIFEST.json", STAGE / f"p{count - 1}" / "MANIFEST.json")
    print(f"{size / 2**20:.1f} MiB in {count} parts, sha256 {digest}")
    copy = "mkdir -p /tmp/dspark-e2e/parts && cp .e2e/p*/* /tmp/dspark-e2e/parts/"
    for index in range(count):
        then = (
            "python3 -m harness.e2e_h200 run"
            if index == count - 1
            else "ls -l /tmp/dspark-e2e/parts"
        )
        print(f"call {index}: carry ['.e2e/p{index}'], command: {copy} && {then}")
    return 0


def _add(tar: tarfile.TarFile, name: str, data: bytes, executable: bool = False) -> None:
    import io

    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o755 if executable else 0o644
    tar.addfile(info, io.BytesIO(data))


# ----------------------------------------------------------------------------- run (GPU machine)


def unpack(log) -> dict:
    ready = DEVICE_ROOT / "READY.json"
    if ready.is_file():
        return json.loads(ready.read_text())
    parts_dir = DEVICE_ROOT / "parts"
    manifest = json.loads((parts_dir / "MANIFEST.json").read_text())
    parts = [parts_dir / f"e2e.tar.xz.part{i}" for i in range(manifest["parts"])]
    missing = [p.name for p in parts if not p.is_file()]
    if missing:
        raise SystemExit(f"parts missing in {parts_dir}: {missing}")
    started = time.monotonic()
    joined = DEVICE_ROOT / "e2e.tar.xz"
    with joined.open("wb") as out:
        for part in parts:
            with part.open("rb") as handle:
                shutil.copyfileobj(handle, out, 1 << 22)
    if common.sha256_file(joined) != manifest["sha256"]:
        raise SystemExit("joined tar: sha256 mismatch")
    _log_run(log, ["tar", "-xJf", str(joined), "-C", str(DEVICE_ROOT)], check=True)
    joined.unlink()
    for part in parts:
        part.unlink()
    deps = DEVICE_ROOT / "deps"
    wheels = sorted(str(p) for p in (DEVICE_ROOT / "wheels").glob("*.whl"))
    _log_run(
        log,
        [
            sys.executable,
            *"-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
            " --target".split(),
            str(deps),
            *wheels,
        ],
        check=True,
    )
    # The reverted copy: hard links to the unmodified tree, three files replaced.
    rev = DEVICE_ROOT / "vllm-rev"
    _log_run(log, ["cp", "-al", str(DEVICE_ROOT / "vllm-site"), str(rev)], check=True)
    for path, _, _ in REVERT:
        target = rev / path
        target.unlink()
        shutil.copy(DEVICE_ROOT / "revert-overlay" / path, target)
    # The tolerant copy (TOLERANT): unmodified vLLM with the shifted remap in a loader that skips.
    tol = DEVICE_ROOT / "vllm-tol"
    _log_run(log, ["cp", "-al", str(DEVICE_ROOT / "vllm-site"), str(tol)], check=True)
    for path in {p for p, _, _ in TOLERANT}:
        (tol / path).unlink()
        shutil.copy(DEVICE_ROOT / "tolerant-overlay" / path, tol / path)
    info = {"manifest": manifest, "unpack_s": round(time.monotonic() - started, 1)}
    ready.write_text(json.dumps(info, indent=2))
    return info


def _log_run(log, command: list[str], check: bool = False, **kwargs) -> int:
    log.write(f"$ {' '.join(command)}\n")
    log.flush()
    code = subprocess.run(
        command, stdout=log, stderr=subprocess.STDOUT, check=False, **kwargs
    ).returncode
    if check and code:
        raise SystemExit(f"failed ({code}): {' '.join(command[:4])} ...")
    return code


def variant_env(variant: str) -> dict[str, str]:
    variant, hma_off = variant.removesuffix("-hma-off"), variant.endswith("-hma-off")
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    env["DSPARK_E2E_HYBRID_OFF"] = "1" if hma_off else "0"
    env.pop("PYTHONPATH", None)
    # The CuTe DSL puts its package on sys.path through nvidia_cutlass_dsl.pth, and .pth files are
    # read in site directories only, not in PYTHONPATH entries: name its folder after the wheels.
    site = DEVICE_ROOT / "deps"
    deps = os.pathsep.join([str(site), str(site / "nvidia_cutlass_dsl" / "python_packages")])
    env.setdefault("TILELANG_CACHE_DIR", str(DEVICE_ROOT / "cache" / "tilelang"))
    env.setdefault("DG_JIT_CACHE_DIR", str(DEVICE_ROOT / "cache" / "deep_gemm"))
    env.setdefault("TRITON_CACHE_DIR", str(DEVICE_ROOT / "cache" / "triton"))
    env.setdefault("VLLM_CACHE_ROOT", str(DEVICE_ROOT / "cache" / "vllm"))
    env["VLLM_NO_USAGE_STATS"] = "1"
    # FlashInfer does not travel (about 470 MB): keep the V2 sampler from importing it.
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    # DeepGEMM compiles each kernel when first used (the JIT cache persists across runs); its
    # start-up pre-compilation of every shape would cost minutes on a fresh machine.
    env.setdefault("VLLM_DEEP_GEMM_WARMUP", "skip")
    nvcc = shutil.which("nvcc")
    if nvcc and "CUDA_HOME" not in env:
        env["CUDA_HOME"] = str(Path(nvcc).resolve().parent.parent)
    if variant == "bug":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DEVICE_ROOT / "vllm-rev"), deps])
        env["DSPARK_HOTFIX"] = "0"
    elif variant == "fixed":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DEVICE_ROOT / "vllm-rev"), deps])
        env.pop("DSPARK_HOTFIX", None)
    elif variant == "baseline":
        env["PYTHONPATH"] = os.pathsep.join([str(DEVICE_ROOT / "vllm-site"), deps])
        env["DSPARK_HOTFIX"] = "0"
    elif variant == "shim":
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DEVICE_ROOT / "vllm-site"), deps])
        env.pop("DSPARK_HOTFIX", None)
    elif variant in ("tolerant", "tolerant-fixed"):  # TOLERANT's copy, without and with the shim
        shim = [str(REPO)] if variant == "tolerant-fixed" else []
        env["PYTHONPATH"] = os.pathsep.join([*shim, str(DEVICE_ROOT / "vllm-tol"), deps])
        env["DSPARK_HOTFIX"] = "1" if shim else "0"
    elif one_patch(
        variant
    ):  # the reverted copy with one patch alone, or all but one: one bug at a time
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(DEVICE_ROOT / "vllm-rev"), deps])
        env.pop("DSPARK_HOTFIX", None)
        env["DSPARK_HOTFIX_PATCHES"] = str(one_patch(variant))
    else:
        raise ValueError(variant)
    return env


def run_engine(
    out: Path, label: str, variant: str, args: argparse.Namespace, timeout: float
) -> dict:
    result_file = out / f"{label}.json"
    log_file = out / f"{label}.log"
    command = [
        sys.executable,
        str(ENGINE),
        "--result",
        str(result_file),
        "--model-dir",
        str(args.model_dir),
    ]
    command += ["--load-format", "auto" if args.real else "dummy"] + (
        ["--digests"] if args.real else []
    )
    for option in ("spec_tokens", "batch", "prompt_len", "max_tokens", "reps"):
        command += [f"--{option.replace('_', '-')}", str(getattr(args, option))]
    cache_files_before = sum(1 for _ in (DEVICE_ROOT / "cache").rglob("*"))
    started = time.monotonic()
    with log_file.open("w") as log:
        try:
            code = subprocess.run(
                command,
                cwd=REPO,
                env=variant_env(variant),
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    text = log_file.read_text(errors="replace")
    data = json.loads(result_file.read_text()) if result_file.is_file() else {}
    data.update(
        {
            "label": label,
            "variant": variant,
            "cache_files_before": cache_files_before,
            "exit_code": code,
            "wall_s": round(time.monotonic() - started, 1),
            "runtime_errors": sorted(set(re.findall(r"RuntimeError: [^\n]*", text)))[:10],
            "last_error": _last_error(text),
            **_log_facts(text, code),
        }
    )
    common.write_json(result_file, data)
    print(
        f"[{label}] exit {code} in {data['wall_s']} s; errors: {data['runtime_errors'][:2]}",
        flush=True,
    )
    if code != 0:
        tail = [line for line in text.splitlines() if line.strip()][-25:]
        print(
            f"[{label}] last error: {data['last_error']}\n  " + "\n  ".join(t[:300] for t in tail),
            flush=True,
        )
    return data


def _log_facts(text: str, exit_code: object) -> dict:
    """What an engine's log says: the shim's lines and, for an engine that failed, the first
    error."""
    loaded = re.findall(r"DSpark draft model loaded: (\d+) params", text)
    return {
        "shim_lines": _shim_lines(text),
        "root_cause": _root_cause(text) if exit_code != 0 else None,
        "draft_params_loaded": int(loaded[-1]) if loaded else None,
    }


def _shim_lines(text: str) -> list[str]:
    """The shim's own log lines: its logger's name in brackets, or the older ``dspark_hotfix[``
    prefix."""
    return [
        line
        for line in text.splitlines()
        if line.startswith("dspark_hotfix[") or "[dspark_hotfix]" in line
    ][:40]


def _root_cause(text: str) -> str | None:
    """The first exception line of the engine-core process (a child of the engine's process)."""
    for line in text.splitlines():
        if not line.startswith("(EngineCore"):
            continue
        body = re.sub(r"^\(EngineCore[^)]*\)\s*(ERROR \S+ \S+ \[[^]]*\]\s*)?", "", line).strip()
        if re.match(r"^[\w.]*(Error|Exception)\b.*:", body):
            return body
    return None


def _last_error(text: str) -> str | None:
    lines = [
        line
        for line in text.splitlines()
        if re.match(r"^(\S+Error|\S+Exception|Exception)\b.*:", line.strip())
    ]
    return lines[-1].strip() if lines else None


def run(args: argparse.Namespace) -> int:
    final = common.output_folder(args.out, "e2e-out")
    # The device tool brings back at most 8 files: work in a folder of our own, and after
    # every phase pack it into one archive under the output folder.
    out = DEVICE_ROOT / "results" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    summary: dict = {
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "phases": args.phases,
        "runs": [],
    }
    with (out / "setup.log").open("a") as log:
        summary["unpack"] = unpack(log)
        # Before anything starts vLLM: the checkpoint's writer fills the cache, and a cache that is
        # not empty is not restored.
        summary["cache_restored"] = _restore_cache()
        model_dir = DEVICE_ROOT / "model"
        model_dir.mkdir(exist_ok=True)
        shutil.copy(args.config, model_dir / "config.json")
        summary["model_config"] = json.loads(Path(args.config).read_text())
        args.model_dir = model_dir
        if args.real:
            summary["checkpoint"] = write_checkpoint(args, out)
        summary["gpu"] = common.query(
            "nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"
        )
        summary["nvcc"] = (common.query("nvcc", "--version") or "").splitlines()[-1:]

    def remaining() -> float:
        return deadline - time.monotonic()

    def save() -> None:
        common.save_results(summary, out, final)

    save()
    preflight = {"failed": [], "skipped": True} if args.skip_preflight else _preflight(out)
    summary["preflight"] = preflight
    save()
    if preflight["failed"]:
        print(
            f"preflight: {len(preflight['failed'])} imports failed: {preflight['failed']}",
            flush=True,
        )
        return 1
    try:
        return _phases(args, out, summary, save, remaining)
    finally:
        summary["cache_exported"] = _export_cache(final)
        save()


def write_checkpoint(args: argparse.Namespace, out: Path) -> dict:
    """harness.checkpoint's real weights into the model folder (once per machine), in the
    environment of unmodified vLLM 0.25.0: what it wrote, or why not."""
    record = args.model_dir / "checkpoint.json"
    if not record.is_file():
        command = [
            sys.executable,
            "-m",
            "harness.checkpoint",
            "write",
            "--model-dir",
            str(args.model_dir),
        ]
        command += ["--config", str(args.config), "--spec-tokens", str(args.spec_tokens)]
        with (out / "checkpoint.log").open("w") as log:
            code = _log_run(log, command, cwd=REPO, env=variant_env("baseline"), timeout=400)
        if code or not record.is_file():
            tail = (out / "checkpoint.log").read_text(errors="replace").strip().splitlines()[-30:]
            print("checkpoint failed:\n  " + "\n  ".join(tail), flush=True)
            raise SystemExit(f"checkpoint: exit {code}")
    data = json.loads(record.read_text())
    shutil.copy(record, out / "checkpoint.json")
    return {
        k: data[k] for k in ("written", "draft_params", "draft_stages", "figures", "seed", "wall_s")
    }


# What summary.json keeps of each engine run (its own JSON has the rest).
SUMMARY_FIELDS = (
    "label",
    "variant",
    "cache_files_before",
    "exit_code",
    "wall_s",
    "runtime_errors",
    "last_error",
    "timed",
    "draft_params_loaded",
    "draft_digest",
    "root_cause",
    "spec_metrics_total",
)


def _phases(args: argparse.Namespace, out: Path, summary: dict, save, remaining) -> int:
    counter = 0
    for variant in args.phases.split(","):
        if remaining() < args.min_phase:
            summary.setdefault("skipped", []).append(variant)
            continue
        counter += 1
        data = run_engine(
            out,
            f"{counter:02d}-{variant}",
            variant,
            args,
            timeout=min(args.phase_timeout, remaining()),
        )
        summary["runs"].append({k: data.get(k) for k in SUMMARY_FIELDS})
        save()
        missing = re.match(r"(ModuleNotFoundError|ImportError)\b", data.get("last_error") or "")
        if data["exit_code"] != 0 and (missing or (variant != "bug" and args.stop_on_failure)):
            return 1  # the next engines would fail the same way
    return 0


# The JIT caches (TileLang, DeepGEMM, Triton) of a first engine take about five minutes to fill.
# They come back in parts (the device tool returns files of 16 MiB at most), so that a fresh
# machine can start warm: copy them here to .e2e/cache/, carry that folder in a call of its own
# that copies it to /tmp/dspark-e2e/cache-parts/, and `run` unpacks them into an empty cache.
CACHE_PART = 14 * 1024 * 1024
CACHE_MAX_PARTS = 4


def _export_cache(final: Path) -> dict:
    cache = DEVICE_ROOT / "cache"
    if not cache.is_dir():
        return {"parts": 0}
    command = f"tar -cf - -C {DEVICE_ROOT} cache | xz -T0 -3"
    packed = subprocess.run(command, shell=True, capture_output=True, check=False)
    data = packed.stdout
    if packed.returncode or len(data) > CACHE_PART * CACHE_MAX_PARTS:
        return {"parts": 0, "bytes": len(data), "why": "too large or failed"}
    count = -(-len(data) // CACHE_PART)
    for index in range(count):
        (final / f"cache.tar.xz.part{index}").write_bytes(
            data[index * CACHE_PART : (index + 1) * CACHE_PART]
        )
    return {"parts": count, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _restore_cache() -> dict:
    parts = sorted(
        (DEVICE_ROOT / "cache-parts").glob("cache.tar.xz.part*"), key=lambda p: int(p.suffix[5:])
    )
    cache = DEVICE_ROOT / "cache"
    if not parts or (cache.is_dir() and any(cache.iterdir())):
        return {"parts": 0}
    data = b"".join(p.read_bytes() for p in parts)
    subprocess.run(["tar", "-xJf", "-", "-C", str(DEVICE_ROOT)], input=data, check=True)
    return {"parts": len(parts), "bytes": len(data), "files": sum(1 for _ in cache.rglob("*"))}


# What an engine imports on the way (each checked on its own, so one run lists every gap).
PREFLIGHT = (
    "import vllm.entrypoints.llm",
    (
        "from vllm.model_executor.layers.quantization import get_quantization_config as g;"
        " g('deepseek_v4_fp8')"
    ),
    "import vllm.models.deepseek_v4.nvidia.model, vllm.models.deepseek_v4.nvidia.dspark",
    "import vllm.model_executor.kernels.mhc.tilelang",
    "import vllm.v1.engine.core, vllm.v1.worker.gpu_worker",
    "import vllm.v1.worker.gpu.model_runner, vllm.v1.worker.gpu.spec_decode.dspark.speculator",
    (
        "from vllm.utils.deep_gemm import _import_deep_gemm as i; assert i() is not None, 'no"
        " deep_gemm'"
    ),
    (
        "import cutlass, cutlass.cute, quack.compile_utils, cuda.bindings.driver; print('cutlass',"
        " cutlass.__file__)"
    ),
    "import vllm.models.deepseek_v4.nvidia.ops.sparse_attn_compress_cutedsl",
    "import wrapt, dspark_hotfix; print('wrapt', wrapt.__version__)",
)


def _preflight(out: Path) -> dict:
    code = (
        f"import json, sys, traceback\nfailed = []\nfor stmt in {list(PREFLIGHT)!r}:\n    try:\n   "
        "     exec(stmt, {})\n    except BaseException as exc:\n       "
        " failed.append(f'{stmt}: {type(exc).__name__}: {exc}')\n       "
        " traceback.print_exc()\nprint('PREFLIGHT', json.dumps(failed))\n"
    )
    started = time.monotonic()
    env = variant_env("fixed")
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    (out / "00-preflight.log").write_text(proc.stdout + proc.stderr)
    found = re.findall(r"^PREFLIGHT (.*)$", proc.stdout, re.MULTILINE)
    failed = json.loads(found[-1]) if found else [f"preflight exited {proc.returncode}"]
    return {"failed": failed, "seconds": round(time.monotonic() - started, 1)}


# ----------------------------------------------------------------------------- collect (here)


def collect(args: argparse.Namespace) -> int:
    """Each argument is one `run` (its output folder or results.tgz), in the order they ran.

    The sessions are added to docs/evidence/e2e-h200.json (a session of the same source is
    replaced; what else the file holds is kept), and the ratio is computed over all of them.
    """
    target = EVIDENCE / "e2e-h200.json"
    data = json.loads(target.read_text()) if target.is_file() else {}
    sessions = []
    for index, given in enumerate(args.results):
        results = Path(given)
        source = results.name
        if results.is_file():  # the archive that `run` leaves in its output folder
            unpacked = STAGE / "results" / f"{time.strftime('%Y%m%d-%H%M%S')}-{index}"
            unpacked.mkdir(parents=True)
            with tarfile.open(results) as tar:
                tar.extractall(unpacked)
            results = unpacked
        summary = json.loads((results / "summary.json").read_text())
        summary.pop("unpack", None)
        runs = [json.loads(path.read_text()) for path in sorted(results.glob("[0-9][0-9]-*.json"))]
        for run_data in runs:
            log = results / f"{run_data.get('label')}.log"
            if log.is_file():
                run_data.update(
                    _log_facts(log.read_text(errors="replace"), run_data.get("exit_code"))
                )
        sessions.append({"source": source, "summary": summary, "runs": runs})
    new = {session["source"] for session in sessions}
    data["sessions"] = [s for s in data.get("sessions", []) if s["source"] not in new] + sessions
    runs = [r for session in data["sessions"] for r in session["runs"]]
    data["ratio"] = _ratio(runs)
    EVIDENCE.mkdir(parents=True, exist_ok=True)
    common.write_json(target, data)
    print(f"wrote {target}; ratio: {json.dumps(data['ratio'])}")
    return 0


def _ratio(runs: list[dict]) -> dict:
    """Generation throughput, reverted copy with the shim over unmodified vLLM, and whether both did
    the same work.

    The rate is that of one whole `generate` call (32 prompts, prefill included), the median over
    every timed repetition of the engines that started on a warm JIT cache: an engine that starts
    on an empty one compiles the kernels (DeepGEMM, TileLang, Triton) the later ones reuse. A
    repetition in which a kernel was compiled is slow; the median is what keeps it from deciding.
    """
    import statistics

    rates: dict[str, list[float]] = {"fixed": [], "baseline": []}
    work: dict[str, set[str]] = {"fixed": set(), "baseline": set()}
    for run_data in runs:
        variant = run_data.get("variant")
        if (
            variant not in rates
            or not run_data.get("cache_files_before")
            or not run_data.get("timed")
        ):
            continue
        rates[variant] += [t["output_tok_per_s"] for t in run_data["timed"]]
        if run_data.get("ok"):
            seen = {k: run_data[k] for k in ("spec_metrics_timed", "sample_output_token_ids")}
            work[variant].add(json.dumps(seen, sort_keys=True))
    result: dict = {
        "rates": rates,
        "rate": "output tokens/s of one generate() call, prefill included",
    }
    if not rates["fixed"] or not rates["baseline"]:
        return result
    fixed, base = statistics.median(rates["fixed"]), statistics.median(rates["baseline"])
    result.update(
        {
            "median_fixed": fixed,
            "median_baseline": base,
            "fixed_over_baseline": round(fixed / base, 4),
            # The same tokens and the same spec-decode counts in every completed engine of both
            # arms.
            "same_work": len(work["fixed"] | work["baseline"]) == 1 and all(work.values()),
        }
    )
    return result


def main() -> int:
    parser, steps = common.command_line("e2e_h200", __doc__)
    steps.add_parser(
        "prepare", help="pack vLLM, the reverted files and the wheels into .e2e/p*/"
    ).set_defaults(func=prepare)
    on_gpu = steps.add_parser("run", help="on the GPU machine: unpack, then the engine phases")
    on_gpu.add_argument("--out", help="results folder (default: $OUT)")
    on_gpu.add_argument(
        "--phases",
        default="fixed,bug,baseline,fixed,baseline,fixed",
        help="comma-separated variants: bug, fixed, baseline",
    )
    on_gpu.add_argument("--budget", type=float, default=560.0, help="seconds for all phases")
    on_gpu.add_argument("--phase-timeout", type=float, default=420.0)
    on_gpu.add_argument(
        "--min-phase", type=float, default=75.0, help="start no phase with less time left"
    )
    on_gpu.add_argument("--stop-on-failure", action="store_true")
    on_gpu.add_argument(
        "--skip-preflight", action="store_true", help="the pack is one a preflight passed"
    )
    on_gpu.add_argument("--config", default=str(MODEL_CONFIG), help="the model's config.json")
    on_gpu.add_argument(
        "--real", action="store_true", help="harness.checkpoint's weights, not --load-format dummy"
    )
    # passed on to each engine child (harness/e2e_engine.py)
    on_gpu.add_argument("--spec-tokens", type=int, default=5)
    on_gpu.add_argument("--batch", type=int, default=32)
    on_gpu.add_argument("--prompt-len", type=int, default=128)
    on_gpu.add_argument("--max-tokens", type=int, default=128)
    on_gpu.add_argument("--reps", type=int, default=3)
    on_gpu.set_defaults(func=run)
    back = steps.add_parser(
        "collect", help="turn results (folders or archives) into docs/evidence/e2e-h200.json"
    )
    back.add_argument("results", nargs="+")
    back.set_defaults(func=collect)
    return common.run_step(parser)


if __name__ == "__main__":
    sys.exit(main())
