"""vLLM's OpenAI server with a DeepSeek-V4 DSpark draft on the H200: the report's own acceptance.

`vllm serve` with the reported flags, a real client on /v1/completions, vLLM's own benchmark
client, and the throughput ratio of the shim against upstream's fix. It rides on the pack of
harness.e2e_h200 (vLLM 0.25.0, its reverted copy, the wheels) and adds what a server needs:

  python3 -m harness.serve_h200 prepare
      here: .e2e/serve/ (uvicorn and the other wheels the H200 lacks for the API server, and
      this project's wheel: HEAD's files, versioned as `make dist` versions them)
  python3 -m harness.serve_h200 run [...]
      on the GPU machine, after e2e_h200's parts and .e2e/serve were carried: unpack, install,
      write the tokenizer, then the servers
  python3 -m harness.serve_h200 collect A [B]
      here: results.tgz files (in the order they ran) -> docs/evidence/serve-h200.json
  python3 -m harness.serve_h200 cpu-drift
      on the GPU machine, no pack: how the speed of two cores drifts, window by window (what
      moves a CPU-bound server's throughput)

Servers (every one `vllm serve MODEL --load-format dummy --kv-cache-dtype fp8 --block-size 256
--spec-method dspark --spec-tokens 5 --tensor-parallel-size N` and a port, plus --enforce-eager
for the --arms servers; the bench servers capture CUDA graphs, as the report runs vLLM;
at N > 1 all-reduces go through NCCL alone, NVLink multicast off, as a shared host requires):

  bug               the reverted copy, `DSPARK_HOTFIX=0 dspark-hotfix run -- vllm serve ...`:
                    never ready
  fixed-launcher    the reverted copy, `dspark-hotfix run -- vllm serve ...` (the wheel installed)
  fixed-plugin      the reverted copy, `vllm serve ...`: the wheel installed, nothing on PYTHONPATH
                    but the packages, so only vLLM's plugin loader can activate the shim
  baseline          unmodified vLLM 0.25.0, no shim
  baseline-hma-off  baseline with --disable-hybrid-kv-cache-manager: never ready
  shim-hma-off      unmodified 0.25.0 under the launcher, hybrid manager off: the shim's own stop

With --real the servers load harness.checkpoint's weights (no --load-format dummy), and the arms
only-NAME, without-NAME (the patch NAME of dspark_hotfix.patches.ALL alone, or every patch but it),
tolerant and tolerant-plugin are there too (ARMS below says what each runs).

`--arms` are each started, probed (the openai client on /v1/completions, /metrics) and stopped, one
after another. `--bench A,B` starts both servers side by side (each with 40% of the GPU), probes
them, warms each up with the benchmark's own load (one seed: every run sends the same prompts) until
a run adds nothing to the JIT caches, then runs vLLM's benchmark client
(`vllm.benchmarks.serve.main`, what `vllm bench serve` calls) against them in turn, A B / B A ...
The client and each server run on cores of their own, and each run records what it cost: engine
steps, CPU seconds per process, the host's stolen time, the GPU's clock. `--keep-servers` leaves the
bench servers running when the call ends, and the next call's `--attach` benchmarks the same
processes on (a machine stays warm for 30 s between calls; a CUDA-graph server takes minutes to
start). With --real, `--bench tolerant,tolerant-plugin` measures the silent form: the plugin against
the tolerant build without the shim (REFERENCES), acceptance by draft position, and every run's
whole /metrics appended to metrics-ARM.prom (what an SRE's Prometheus would have scraped).

Every server process writes the shim's call counts (dspark_hotfix.status()) when the harness asks:
at ready, before any request, and again after the probe or the benchmark (COUNTS_HOOK, started by a
.pth file in the interpreter's site directory, nothing on PYTHONPATH), and the shim's series on the
server's own /metrics are scraped at the same moments (dspark_hotfix.metrics).
Standard library only, except in the probe and bench children.
"""

from __future__ import annotations

import argparse
import datetime
import json
import lzma
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

from harness import common, e2e_h200
from harness.common import EVIDENCE, REPO, one_patch

STAGE = REPO / ".e2e" / "serve"
# What the API server imports that neither the H200 image nor e2e_h200's pack has (found by
# importing vllm.entrypoints.openai.api_server and vllm.benchmarks.serve in vLLM 0.25.0's venv).
SERVE_WHEELS = (
    "uvicorn==0.54.0",
    "jmespath==1.1.0",
    "model-hosting-container-standards==0.1.16",
    "supervisor==4.3.0",
    "setproctitle==1.3.8",
)
SPEC_TOKENS = 5
PROMPTS = 8  # the completions probe: one request, greedy, fixed prompts
PROBE_TOKENS = 32
# vLLM's random dataset with one seed: every run, warm-up or timed, sends the same prompts, so that
# a warm-up meets the shapes a timed run will. One wave (prompts = concurrency = --max-num-seqs):
# every request is admitted at the start and none waits for a slot. With 64 prompts at 32 (calls 43
# and 46) the second wave's prefills joined the running decodes at steps that differed from run to
# run, and the same prompts gave median ITLs of 34 to 53 ms.
# 128 at 128 (calls 49 to 52), with CUDA graphs: a bigger batch, to give the GPU the work. 32 at 32
# in eager mode (call 47) kept the engine core's CPU core busy for the whole run, and that core's
# speed drifted by itself (call 48); call 52's graph runs used 0.39 to 0.53 of it (runs that
# compiled).
BENCH = {"input": 128, "output": 256, "prompts": 128, "concurrency": 128}


def _e2e() -> ModuleType:
    """harness.e2e_h200: the pack, its unpacking, the variants' environment."""
    return e2e_h200


# ----------------------------------------------------------------------------- prepare (here)


def prepare(_: argparse.Namespace) -> int:
    e2e = _e2e()
    if STAGE.exists():
        shutil.rmtree(STAGE)
    (STAGE / "wheels").mkdir(parents=True)
    for spec in SERVE_WHEELS:
        shutil.copy(e2e._wheel_for(spec), STAGE / "wheels")
    from scripts import dist  # (here only: the GPU machine never imports it)

    with tempfile.TemporaryDirectory(
        prefix="dspark-hotfix-serve-"
    ) as tmp:  # HEAD's files, named as make dist names
        tree = dist.commit_tree(
            Path(tmp) / "tree"
        )  # them: a commit after a release is never the release
        version = dist.versioned(tree)
        wheel = [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "-w",
            str(STAGE / "project"),
            str(tree),
        ]
        subprocess.run(wheel, check=True)
    size = sum(p.stat().st_size for p in STAGE.rglob("*") if p.is_file())
    print(
        f"{STAGE}: {size / 2**20:.1f} MiB, dspark_hotfix {version}; "
        "carry it with the last part of harness.e2e_h200 prepare"
    )
    return 0


# ----------------------------------------------------------------------------- run (GPU machine)


def install(e2e, log) -> dict:
    """The serve wheels and this project's wheel, each in a folder of its own, and the counts
    hook."""
    root = e2e.DEVICE_ROOT
    carried = REPO / ".e2e" / "serve"
    serve_deps, shim_site, bin_dir = root / "serve-deps", root / "shim-site", root / "serve-bin"
    # the interpreter's own site directory: the servers run this interpreter (the `vllm` script
    # below)
    hook = install_counts_hook(Path(sysconfig.get_paths()["purelib"]), root / "counts-hook")
    if (root / KEPT).is_file() and (
        shim_site / "dspark_hotfix"
    ).is_dir():  # a kept server runs from it
        return {"kept": True, "counts_hook": str(hook)}
    if not (serve_deps / "uvicorn").is_dir():
        e2e._log_run(
            log,
            [
                sys.executable,
                *"-m pip install -q --no-index --no-deps --no-compile --target".split(),
                str(serve_deps),
                *map(str, sorted((carried / "wheels").glob("*.whl"))),
            ],
            check=True,
        )
    shutil.rmtree(shim_site, ignore_errors=True)
    project = sorted((carried / "project").glob("dspark_hotfix-*.whl"))
    e2e._log_run(
        log,
        [
            sys.executable,
            *"-m pip install -q --no-index --no-deps --target".split(),
            str(shim_site),
            str(project[-1]),
        ],
        check=True,
    )
    # The `vllm` command as vLLM's wheel declares it (console_scripts:
    # vllm.entrypoints.cli.main:main).
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "vllm"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
        "if __name__ == '__main__':  # as pip writes it: spawned children import this file again\n"
        "    sys.exit(main())\n"
    )
    script.chmod(0o755)
    return {
        "project_wheel": project[-1].name,
        "serve_wheels": sorted(p.name for p in (carried / "wheels").iterdir()),
        "counts_hook": str(hook),
    }


def write_tokenizer(model_dir: Path, vocab_size: int) -> dict:
    """A word-level tokenizer over the config's vocabulary: id i is the word ``t<i>`` (0, 1 and 2
    are <s>, </s> and <unk>), so that text and ids map one to one and nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<s>", "</s>", "<unk>"]
    vocab = {(specials[i] if i < len(specials) else f"t{i}"): i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens(specials)
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "</s>",
                "unk_token": "<unk>",
                "model_max_length": 2048,
                "clean_up_tokenization_spaces": False,
            },
            indent=2,
        )
        + "\n"
    )
    return {"vocab_size": vocab_size, "kind": "WordLevel t<i>"}


# The shim's call counts (dspark_hotfix.status(), `calls` per patch) read inside every process of a
# server. A .pth line in the interpreter's own site directory runs this file at interpreter start,
# in the processes whose environment names a counts folder (the servers' alone): it never imports
# dspark_hotfix, so in the `fixed-plugin` arm only vLLM's plugin loader still activates the shim,
# and nothing is added to PYTHONPATH. Each time the harness writes a new label into the folder's
# `trigger`, every process that has imported vLLM writes what status() says to LABEL-PID.json.
COUNTS_ENV = "SERVE_H200_COUNTS"
COUNTS_HOOK = r"""
import json, os, sys, threading, time


def _watch(folder):
    trigger, done = os.path.join(folder, "trigger"), set()
    while True:
        time.sleep(0.5)
        try:
            with open(trigger) as handle:
                label = handle.read().strip()
        except OSError:
            continue
        if not label or label in done:
            continue
        done.add(label)
        if "vllm" not in sys.modules:  # the launcher, a compiler's helper: not a server process
            continue
        # the registry is imported by the shim's activation alone; status() is the package's own
        shim = sys.modules.get("dspark_hotfix") if "dspark_hotfix.registry" in sys.modules else None
        try:
            with open("/proc/self/comm") as handle:
                comm = handle.read().strip()
        except OSError:
            comm = None
        record = {
            "pid": os.getpid(),
            "label": label,
            "comm": comm,
            "argv": sys.argv[:3],
            "hooks": sum(t.name == "serve-h200-counts" for t in threading.enumerate()),
            "status": shim.status() if shim is not None else None,
        }
        path = os.path.join(folder, f"{label}-{os.getpid()}.json")
        with open(path + ".tmp", "w") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)


# One watcher a process: a site directory's .pth files can run more than once in one process (any
# code that calls site.addsitedir() on it runs them again); on the H200 two watchers in one process
# raced for the same file (call 52).
if not any(t.name == "serve-h200-counts" for t in threading.enumerate()):
    threading.Thread(
        target=_watch,
        args=(os.environ["SERVE_H200_COUNTS"],),
        name="serve-h200-counts",
        daemon=True,
    ).start()
"""


def install_counts_hook(site_dir: Path, hook_dir: Path) -> Path:
    """The hook's file in ``hook_dir`` and the .pth line that runs it, in ``site_dir`` (a site
    directory: .pth files on PYTHONPATH are not read). Returns the .pth file."""
    hook_dir.mkdir(parents=True, exist_ok=True)
    hook = hook_dir / "serve_h200_counts.py"
    hook.write_text(COUNTS_HOOK)
    pth = site_dir / "serve_h200_counts.pth"
    pth.write_text(
        f"import os; exec(compile(open({str(hook)!r}).read(), {str(hook)!r}, 'exec'), "
        f"{{'__name__': 'serve_h200_counts'}}) if {COUNTS_ENV!r} in os.environ else None\n"
    )
    return pth


def scrape_metrics(port: int) -> list[str] | str:
    """The shim's series on the server's own ``/metrics`` (dspark_hotfix.metrics), as an SRE scrapes
    them: every ``dspark_hotfix_`` sample line, or why there was none."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
            text = reply.read().decode(errors="replace")
    except OSError as exc:
        return f"no /metrics: {exc}"
    return [line for line in text.splitlines() if line.startswith("dspark_hotfix_")]


def read_counts(folder: Path, label: str) -> dict:
    """What each process wrote for ``label``: its shim's state and calls per patch, by pid."""
    found = {}
    for path in sorted(folder.glob(f"{label}-*.json")):
        record = json.loads(path.read_text())
        status = record["status"]
        found[str(record["pid"])] = {
            "comm": record["comm"],
            "hooks": record.get("hooks"),
            "activated_by": status and status["activated_by"],
            "calls": {p["name"]: p["calls"] for p in status["patches"]} if status else None,
            "states": {p["name"]: p["state"] for p in status["patches"]} if status else None,
        }
    return found


def prompts() -> list[str]:
    """Fixed prompts of 64 words each, every word a token of the vocabulary."""
    return [" ".join(f"t{1000 + 97 * p + 13 * i}" for i in range(64)) for p in range(PROMPTS)]


# arm: (vLLM tree, this project's wheel installed, under `dspark-hotfix run`, DSPARK_HOTFIX)
ARMS = {
    "bug": ("vllm-rev", True, True, "0"),
    "fixed-launcher": ("vllm-rev", True, True, None),
    "fixed-plugin": ("vllm-rev", True, False, None),
    "baseline": ("vllm-site", False, False, None),
    "baseline-hma-off": ("vllm-site", False, False, None),
    "shim-hma-off": ("vllm-site", True, True, None),
    # With --real (harness.checkpoint's weights): the report's two bugs one at a time, and the
    # silent form of the first (harness.e2e_h200.TOLERANT's copy), without and with the plugin.
    "tolerant": ("vllm-tol", False, False, None),
    "tolerant-plugin": ("vllm-tol", True, False, None),
}
ONE_PATCH = ("vllm-rev", True, False, None)  # only-NAME, without-NAME: harness.common.one_patch


def arm_env(e2e, arm: str | None) -> tuple[dict[str, str], list[str]]:
    """The environment and the command prefix of an arm; ``None``: the clients' (no vLLM tree, no
    shim)."""
    root = e2e.DEVICE_ROOT
    tree, shim, launcher, switch = (
        (ONE_PATCH if one_patch(arm) else ARMS[arm]) if arm else (None, False, False, None)
    )
    env = e2e.variant_env("baseline")  # the JIT caches, the sampler, CUDA_HOME: shared by every arm
    # Bytecode is written: every server runs three or more Pythons (API server, engine core, the
    # launcher's check) that would otherwise each compile all of vLLM's source again.
    for name in ("DSPARK_E2E_HYBRID_OFF", "DSPARK_HOTFIX", "PYTHONDONTWRITEBYTECODE"):
        env.pop(name, None)
    if switch is not None:
        env["DSPARK_HOTFIX"] = switch
    env.pop("DSPARK_HOTFIX_PATCHES", None)
    if arm and one_patch(arm):
        env["DSPARK_HOTFIX_PATCHES"] = str(one_patch(arm))
    # Nothing outside the machine can be reached: a server there is an air-gapped one.
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    # NVLink multicast stays off on a shared host (KINDS.md): vLLM's symmetric-memory all-reduce
    # would use it, so tensor parallelism all-reduces through NCCL alone (with NVLS off).
    env.update(
        NCCL_NVLS_ENABLE="0",
        TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
        NVSHMEM_DISABLE_NVLS="1",
        VLLM_ALLREDUCE_USE_SYMM_MEM="0",
    )
    env["PATH"] = os.pathsep.join(
        [str(root / "serve-bin"), str(root / "shim-site" / "bin"), env.get("PATH", "")]
    )
    site = root / "deps"
    paths = [str(root / "shim-site")] if shim else []
    paths += [str(root / tree)] if tree else []
    paths += [
        str(site),
        str(site / "nvidia_cutlass_dsl" / "python_packages"),
        str(root / "serve-deps"),
    ]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env, ["dspark-hotfix", "run", "--"] if launcher else []


def serve_command(
    model_dir: Path,
    arm: str,
    port: int,
    tp: int,
    gpu_share: float,
    eager: bool = True,
    real: bool = False,
) -> list[str]:
    """The report's flags; ``eager``: --enforce-eager (no CUDA graphs, no torch.compile), short
    starts; ``real``: the model folder's weights (harness.checkpoint), not --load-format dummy."""
    command = ["vllm", "serve", str(model_dir), *([] if real else ["--load-format", "dummy"])]
    command += "--kv-cache-dtype fp8 --block-size 256".split()
    command += [
        "--spec-method",
        "dspark",
        "--spec-tokens",
        str(SPEC_TOKENS),
        "--tensor-parallel-size",
        str(tp),
    ]
    command += ["--enforce-eager"] if eager else []
    command += ["--max-model-len", "2048", "--max-num-seqs", str(BENCH["concurrency"])]
    command += [
        "--gpu-memory-utilization",
        str(gpu_share),
        "--seed",
        "0",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    command += ["--disable-custom-all-reduce"] if tp > 1 else []
    return [*command, "--disable-hybrid-kv-cache-manager"] if arm.endswith("-hma-off") else command


class Server:
    def __init__(
        self,
        e2e,
        out: Path,
        label: str,
        arm: str,
        port: int,
        args: argparse.Namespace,
        gpu_share: float,
        cpus: list[int] | None = None,
        eager: bool = True,
        real: bool | None = None,
    ) -> None:
        self.label, self.arm, self.port = label, arm, port
        self.log_path = out / f"{label}.log"
        self.counts = out / "counts" / label
        self.counts.mkdir(parents=True, exist_ok=True)
        env, prefix = arm_env(e2e, arm)
        # relax, vLLM's default: DeepGEMM compiles its kernels for every M at start-up, not while
        # serving
        env["VLLM_DEEP_GEMM_WARMUP"] = args.deep_gemm_warmup
        env[COUNTS_ENV] = str(self.counts)
        real = getattr(args, "real", False) if real is None else real
        self.command = [
            *prefix,
            *serve_command(args.model_dir, arm, port, args.tp, gpu_share, eager, real),
        ]
        self.started = time.monotonic()
        self.log: Any = self.log_path.open("w")
        self.log.write(
            f"$ {' '.join(self.command)}\n# PYTHONPATH={env['PYTHONPATH']}\n"
            f"# DSPARK_HOTFIX={env.get('DSPARK_HOTFIX')}\n"
        )
        self.log.flush()
        pin = (
            (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        )  # its children inherit the cores
        self.proc: subprocess.Popen | None = subprocess.Popen(
            self.command,
            cwd="/tmp",
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=pin,
        )
        self.pgid = self.proc.pid
        self.record: dict = {
            "label": label,
            "arm": arm,
            "port": port,
            "command": self.command,
            "python_path": env["PYTHONPATH"],
            "dspark_hotfix": env.get("DSPARK_HOTFIX"),
            "deep_gemm_warmup": env["VLLM_DEEP_GEMM_WARMUP"],
            "cpus": cpus,
        }

    def kept(self) -> dict:
        """What a later call needs to take this server over: it runs on in its own session."""
        return {
            "label": self.label,
            "arm": self.arm,
            "port": self.port,
            "pgid": self.pgid,
            "started": self.started,
            "log": str(self.log_path),
            "counts": str(self.counts),
            "command": self.command,
            "record": self.record,
        }

    @classmethod
    def attach(cls, kept: dict) -> Server:
        """A server an earlier call started and left running (--keep-servers)."""
        server = cls.__new__(cls)
        server.label, server.arm, server.port, server.pgid = (
            kept["label"],
            kept["arm"],
            kept["port"],
            kept["pgid"],
        )
        server.started, server.command, server.record = (
            kept["started"],
            kept["command"],
            kept["record"],
        )
        server.log_path, server.counts = Path(kept["log"]), Path(kept["counts"])
        server.log, server.proc = None, None
        server.record["attached"] = True
        return server

    def alive(self) -> bool:
        return (self.proc.poll() is None) if self.proc is not None else bool(self._members())

    def _members(self) -> list[int]:
        """The live processes of the server's group (an attached server's own process, whose parent
        has gone, may linger as a zombie until init reaps it)."""
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == self.pgid and fields[0] != "Z":
                found.append(int(stat.parent.name))
        return found

    def wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                self.record.update(
                    outcome="exited", exit_code=self.proc.returncode if self.proc else None
                )
                break
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.port}/health", timeout=5
                ) as reply:
                    if reply.status == 200:
                        self.record.update(
                            outcome="ready", ready_s=round(time.monotonic() - self.started, 1)
                        )
                        break
            except OSError:
                pass
            time.sleep(2)
        else:
            self.record.update(outcome="timeout")
        return self.record["outcome"]

    def wait_for(self, text: str, timeout: float) -> bool:
        """Until the server's log holds ``text``, it exits, or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.alive():
            if text in self.log_path.read_text(errors="replace"):
                return True
            time.sleep(1)
        return False

    def shim_calls(self, label: str, timeout: float = 20.0) -> dict:
        """The shim's calls per patch in every process of the server that has imported vLLM, now:
        each one's hook answers a new label in the trigger file (COUNTS_HOOK)."""
        (self.counts / "trigger.tmp").write_text(label)
        (self.counts / "trigger.tmp").replace(self.counts / "trigger")
        pids = {
            name.split()[1]
            for name in log_facts(self.log_path.read_text(errors="replace"))["processes"]
        }
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not pids <= set(read_counts(self.counts, label)):
            time.sleep(0.5)
        time.sleep(
            1.0
        )  # a process the log does not name yet (a worker) answers within the hook's 0.5 s too
        found = read_counts(self.counts, label)
        self.record.setdefault("shim_calls", {})[label] = found
        self.record.setdefault("metrics", {})[label] = scrape_metrics(self.port)
        return found

    def stop(self) -> None:
        """SIGINT to the server's process group, SIGKILL if any of it (the engine core too) outlives
        40 s."""
        for sig, grace in ((signal.SIGINT, 40), (signal.SIGKILL, 20)):
            if not self._signal(sig):
                break
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and self._members():
                if self.proc is not None:
                    self.proc.poll()  # reap the server itself, so that its group can empty
                time.sleep(0.5)
            if not self._members():
                break
        if self.proc is not None:
            self.proc.wait()
            self.record.setdefault("exit_code", self.proc.returncode)
        self.record["wall_s"] = round(time.monotonic() - self.started, 1)
        if self.log is not None:
            self.log.close()
        self.record.update(log_facts(self.log_path.read_text(errors="replace")))

    def _signal(self, sig: int) -> bool:
        """Send ``sig`` to the server's process group; False if no process of it is left."""
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            return False
        return True


def log_facts(text: str) -> dict:
    """What a server's log says: its processes, the shim's lines (with their pids), the first
    error."""
    names: dict[
        str, str
    ] = {}  # pid -> the last name its lines carry (a worker: `Worker`, then `Worker_TP0`)
    for m in re.finditer(r"^\((\w+) pid=(\d+)\)", text, re.MULTILINE):
        names[m[2]] = m[1]
    processes = sorted(f"{name} {pid}" for pid, name in names.items())
    shim = [
        line
        for line in text.splitlines()
        if "[dspark_hotfix]" in line or line.startswith("dspark_hotfix")
    ]
    summaries = [line for line in shim if re.search(r"dspark_hotfix \S+ \(pid \d+\) via ", line)]
    before_shutdown = text.split("[shutdown]")[0]  # stopping a server makes errors of its own
    errors = re.findall(
        r"(?:^|\) |\] )((?:\w+\.)*\w*(?:Error|Exception): [^\n]*)", before_shutdown, re.MULTILINE
    )
    return {
        "processes": processes,
        "shim_lines": shim[:40],
        "shim_summary_pids": sorted(
            {int(p) for line in summaries for p in re.findall(r"\(pid (\d+)\)", line)}
        ),
        "first_error": errors[0][:400] if errors else None,
        "reported_error": (
            "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
            in text
        ),
    }


PROBE = r"""
import hashlib, json, re, sys, urllib.request
import openai

port, out, prompts, max_tokens = (
    int(sys.argv[1]),
    sys.argv[2],
    json.loads(sys.argv[3]),
    int(sys.argv[4]),
)
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused")
model = client.models.list().data[0].id
reply = client.completions.create(
    model=model,
    prompt=prompts,
    max_tokens=max_tokens,
    temperature=0.0,
    seed=0,
    extra_body={"ignore_eos": True},
)
texts = [c.text for c in sorted(reply.choices, key=lambda c: c.index)]
metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
spec, by_position = {}, {}
for line in metrics.splitlines():
    name = line.split("{")[0].split(" ")[0]
    if name.startswith("vllm:spec_decode") and name.endswith("_total"):
        spec[name] = spec.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
        position = re.search(r'position="(\d+)"', line)
        if position:
            by_position[position[1]] = by_position.get(position[1], 0.0) + float(
                line.rsplit(" ", 1)[1]
            )
json.dump(
    {
        "model": model,
        "openai": openai.__version__,
        "completion_tokens": reply.usage.completion_tokens,
        "texts_sha256": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
        "texts_head": [t[:160] for t in texts[:2]],
        "spec_decode_metrics": spec,
        "accepted_by_position": by_position,
    },
    open(out, "w"),
    indent=2,
)
"""


def probe(e2e, server: Server, out: Path) -> dict:
    target = out / f"{server.label}-probe.json"
    env, _ = arm_env(e2e, None)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            str(server.port),
            str(target),
            json.dumps(prompts()),
            str(PROBE_TOKENS),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode or not target.is_file():
        return {
            "error": (
                (proc.stderr or proc.stdout).strip().splitlines()[-1:]
                or [f"exit {proc.returncode}"]
            )
        }
    return json.loads(target.read_text())


BENCH_CHILD = r"""
import json, os, resource, sys, time, urllib.request
from pathlib import Path
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser

plan, out = json.loads(sys.argv[1]), sys.argv[2]
parser = FlexibleArgumentParser()
add_cli_args(parser)
records = []
load = plan["load"]
if plan.get("client_cpus"):
    os.sched_setaffinity(0, plan["client_cpus"])


def engine_steps(port):  # vLLM counts every engine step in its tokens-per-step histogram
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30).read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:iteration_tokens_total_count")
    )


def group_cpu(pgid):  # CPU seconds of each process of a server's process group, by name
    used, tick = {}, os.sysconf("SC_CLK_TCK")
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        fields = rest.split()
        if pgid and int(fields[2]) == pgid:
            name = head.split("(", 1)[1]
            used[name] = used.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return used


def host_cpu():  # /proc/stat's cpu line: user nice system idle iowait irq softirq steal
    return [int(x) for x in open("/proc/stat").readline().split()[1:9]]


def client_cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def scrape(
    arm, tag
):  # the server's whole /metrics, as Prometheus scrapes it: one file per arm, appended
    if plan.get("metrics_dir"):
        text = (
            urllib.request.urlopen(f"http://127.0.0.1:{arm['port']}/metrics", timeout=30)
            .read()
            .decode()
        )
        with open(os.path.join(plan["metrics_dir"], f"metrics-{arm['arm']}.prom"), "a") as handle:
            handle.write(f"# scrape arm={arm['arm']} {tag} epoch={time.time():.3f}\n{text}")


def compiles(
    log,
):  # what a server compiled while serving: files its JIT caches gained, and TileLang's log lines
    text = open(log, errors="replace").read()
    return sum(1 for _ in Path(plan["jit_cache"]).rglob("*")) + text.count(
        "TileLang begins to compile"
    )


def one(arm, phase, rep):
    argv = [
        "--backend",
        "vllm",
        "--host",
        "127.0.0.1",
        "--port",
        str(arm["port"]),
        "--model",
        plan["model"],
        "--tokenizer",
        plan["model"],
        "--dataset-name",
        "random",
        "--random-input-len",
        str(load["input"]),
        "--random-output-len",
        str(load["output"]),
        "--num-prompts",
        str(load["prompts"]),
        "--max-concurrency",
        str(load["concurrency"]),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        "0",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
    ]
    before, started, t0 = compiles(arm["log"]), time.strftime("%H:%M:%S"), time.monotonic()
    steps, server, host, client, epoch = (
        engine_steps(arm["port"]),
        group_cpu(arm.get("pgid")),
        host_cpu(),
        client_cpu(),
        time.time(),
    )
    result = main(parser.parse_args(argv))
    compiled = compiles(arm["log"]) - before
    keep = {
        k: v
        for k, v in result.items()
        if isinstance(v, (int, float, str)) or k.startswith("spec_decode")
    }
    host = [b - a for a, b in zip(host, host_cpu())]
    # what the run cost: engine steps (the batches the scheduler made), CPU seconds per process of
    # the server and of this client, the host's busy and stolen shares, its span for the GPU samples
    cost = {
        "engine_steps": engine_steps(arm["port"]) - steps,
        "client_cpu_s": round(client_cpu() - client, 2),
        "server_cpu_s": {
            k: round(v - server.get(k, 0.0), 2) for k, v in group_cpu(arm.get("pgid")).items()
        },
        "host_busy": round(1 - (host[3] + host[4]) / max(1, sum(host)), 4),
        "host_steal": round(host[7] / max(1, sum(host)), 4),
        "epoch": [round(epoch, 2), round(time.time(), 2)],
    }
    scrape(arm, f"after={phase}-{rep}")
    records.append(
        {
            "arm": arm["arm"],
            "phase": phase,
            "rep": rep,
            "started": started,
            "jit_compiles": compiled,
            "wall_s": round(time.monotonic() - t0, 2),
            "load": load,
            "result": keep,
            "cost": cost,
        }
    )
    json.dump(records, open(out, "w"), indent=2)
    return compiled


for arm in plan["arms"]:  # the counters as this call found them, before any of its runs
    scrape(arm, "before=call")
for arm in plan["arms"]:  # warm up each server until a whole run of the load compiles nothing
    for index in range(plan["max_warmups"]):
        if one(arm, "warmup", 100 + index) == 0 or time.time() > plan["warmups_end"]:
            break
first, pair_s = (
    plan.get("first_rep", 0),
    0.0,
)  # a later call on the same servers numbers its pairs on
for rep in range(
    first, first + plan["reps"]
):  # then A B, B A, A B ...: neither arm always goes first
    if plan.get("end") and time.time() + 1.2 * pair_s > plan["end"]:
        break  # only whole pairs
    t0 = time.monotonic()
    for arm in plan["arms"] if rep % 2 == 0 else plan["arms"][::-1]:
        one(arm, "timed", rep)
    pair_s = time.monotonic() - t0
"""
# Seconds kept for the timed repetitions: warm-ups start no later than that before the deadline
# for MIN_PAIRS pairs; the pairs then run until the deadline (whole pairs only).
TIMED_S_PER_RUN = 13
MIN_PAIRS = 6


def run(args: argparse.Namespace) -> int:
    e2e = _e2e()
    final = common.output_folder(args.out, "serve-out")
    out = e2e.DEVICE_ROOT / "serve-results" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + args.budget
    summary: dict = {
        "started_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "arms": args.arms,
        "bench": args.bench,
        "tp": args.tp,
        "servers": [],
    }

    def save() -> None:
        common.save_results(summary, out, final)

    with (out / "setup.log").open("a") as log:
        started = time.monotonic()
        summary["unpack"] = e2e.unpack(log)
        summary["install"] = install(e2e, log)
        model_dir = e2e.DEVICE_ROOT / "model"
        model_dir.mkdir(exist_ok=True)
        config = json.loads(Path(args.config).read_text())
        shutil.copy(args.config, model_dir / "config.json")
        summary["tokenizer"] = write_tokenizer(model_dir, config["vocab_size"])
        summary["model_config"] = config
        summary["setup_s"] = round(time.monotonic() - started, 1)
        summary["gpu"] = common.query(
            "nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"
        )
    args.model_dir = model_dir
    # The JIT caches first: the checkpoint's writer adds to them, and a cache folder that is not
    # empty is not restored (call 6 of the fourth session started cold, so: its DeepGEMM warm-up).
    summary["cache_restored"] = e2e._restore_cache()
    if args.real:  # the weights, once per machine, in unmodified vLLM's environment
        ns = argparse.Namespace(model_dir=model_dir, config=args.config, spec_tokens=SPEC_TOKENS)
        summary["checkpoint"] = e2e.write_checkpoint(ns, out)
    save()
    counter = 0
    try:
        for arm in [a for a in args.arms.split(",") if a]:
            if deadline - time.monotonic() < args.min_phase:
                summary.setdefault("skipped", []).append(arm)
                continue
            counter += 1
            real = args.real and not args.arms_dummy
            server = Server(
                e2e,
                out,
                f"{counter:02d}-{arm}",
                arm,
                8100 + counter,
                args,
                args.gpu_share,
                real=real,
            )
            try:
                if (
                    server.wait_ready(min(args.ready_timeout, deadline - time.monotonic() - 30))
                    == "ready"
                ):
                    server.shim_calls("ready")
                    server.record["probe"] = probe(e2e, server, out)
                    server.shim_calls("after-probe")
            finally:
                server.stop()
            summary["servers"].append(server.record)
            _print(server.record, server.log_path)
            save()
        bench_arms = [a for a in args.bench.split(",") if a]
        if bench_arms:
            counter = _bench(e2e, args, out, summary, save, bench_arms, counter, deadline)
    finally:
        summary["cache_exported"] = e2e._export_cache(final)
        save()
    return 0


def cpu_sets(cores: list[int], servers: int) -> tuple[list[int], list[list[int]]]:
    """The bench client's cores (the last two) and each server's equal share of the others, so that
    neither the idle server nor the client runs on the cores of the server being measured."""
    client, rest = cores[-2:], cores[:-2]
    share = len(rest) // servers
    return client, [rest[i * share : (i + 1) * share] for i in range(servers)]


def gpu_during(runs: list[dict], samples: str) -> None:
    """Each run's mean and lowest SM clock and mean power, from nvidia-smi's samples in its span."""
    points = []
    for line in samples.splitlines():
        try:
            stamp, clock, power = (field.strip() for field in line.split(",")[:3])
            when = datetime.datetime.strptime(stamp, "%Y/%m/%d %H:%M:%S.%f").timestamp()
            points.append((when, float(clock), float(power)))
        except ValueError:
            continue
    for run in runs:
        start, end = run.get("cost", {}).get("epoch", (0, 0))
        inside = [p for p in points if start <= p[0] <= end]
        if inside:
            run["cost"]["gpu"] = {
                "samples": len(inside),
                "sm_mhz_mean": round(statistics.fmean(p[1] for p in inside)),
                "sm_mhz_min": min(p[1] for p in inside),
                "power_w_mean": round(statistics.fmean(p[2] for p in inside), 1),
            }


# in the device root: the bench servers a call left running (--keep-servers)
KEPT = "bench-servers.json"


def _bench(
    e2e, args, out: Path, summary: dict, save, arms: list[str], counter: int, deadline: float
) -> int:
    servers: list[Server] = []
    cores = sorted(os.sched_getaffinity(0))
    client_cpus, server_cpus = (
        cpu_sets(cores, len(arms))
        if args.pin and len(cores) >= 2 + 2 * len(arms)
        else ([], [None] * len(arms))
    )
    summary["cpus"] = {
        "cores": cores,
        "client": client_cpus,
        "servers": server_cpus,
        "topology": common.query("nvidia-smi", "topo", "-m"),
    }
    kept_path = e2e.DEVICE_ROOT / KEPT
    kept = json.loads(kept_path.read_text()) if args.attach and kept_path.is_file() else None
    # CUDA graphs, as the report runs vLLM (calls 49 on); --bench-eager: --enforce-eager (calls 41
    # to 47)
    eager = args.bench_eager
    try:
        if (
            kept is not None
        ):  # the servers an earlier call started: the same processes, their pairs numbered on
            servers = [Server.attach(k) for k in kept["servers"]]
            summary["bench_servers"], first_rep = kept["id"], kept["reps_done"]
        else:
            summary["bench_servers"], first_rep = summary["started_utc"], 0
            for arm, cpus in zip(
                arms, server_cpus, strict=True
            ):  # each starts once the one before holds its KV
                # cache, so that their memory profiles do not count each other's allocations
                if servers:
                    servers[-1].wait_for(
                        "GPU KV cache size",
                        min(args.ready_timeout, deadline - time.monotonic() - 60),
                    )
                counter += 1
                servers.append(
                    Server(
                        e2e,
                        out,
                        f"{counter:02d}-{arm}",
                        arm,
                        8100 + counter,
                        args,
                        args.bench_gpu_share,
                        cpus,
                        eager,
                    )
                )
        for server in servers:
            if server.record.get("outcome") == "ready":
                continue
            # a server an earlier call kept was still starting: it gets this call's whole budget
            # (call 50 gave it --ready-timeout and stopped it while it captured CUDA graphs)
            left = deadline - time.monotonic() - 60
            if (
                server.wait_ready(
                    left if server.record.get("attached") else min(args.ready_timeout, left)
                )
                != "ready"
            ):
                summary["bench_result"] = f"{server.arm} not ready"
                return counter
            server.shim_calls("ready")  # before any request: the start-up's calls
            server.record["probe"] = probe(e2e, server, out)
        timed_left = (
            deadline - time.monotonic() - 60 - 2 * min(args.reps, MIN_PAIRS) * TIMED_S_PER_RUN
        )
        plan = {
            "arms": [
                {"arm": s.arm, "port": s.port, "log": str(s.log_path), "pgid": s.pgid}
                for s in servers
            ],
            "reps": args.reps,
            "max_warmups": args.max_warmups,
            "load": BENCH,
            "model": str(args.model_dir),
            "jit_cache": str(e2e.DEVICE_ROOT / "cache"),
            "client_cpus": client_cpus,
            "warmups_end": time.time() + timed_left,
            "first_rep": first_rep,
            "end": time.time() + deadline - time.monotonic() - 70,
            "metrics_dir": str(out),  # metrics-ARM.prom: every scrape of the call, whole
        }
        target = out / "bench.json"
        env, _ = arm_env(e2e, "baseline")  # vLLM's client from the unmodified tree, no shim
        env["DSPARK_HOTFIX"] = "0"
        log, gpu_csv = (out / "bench.log").open("w"), (out / "gpu.csv").open("w")
        sampler = subprocess.Popen(
            [
                "nvidia-smi",
                *"--query-gpu=timestamp,clocks.sm,power.draw -i 0 --format=csv,noheader,nounits"
                " -lms 500".split(),
            ],
            stdout=gpu_csv,
            stderr=subprocess.DEVNULL,
        )
        try:
            left = max(30.0, deadline - time.monotonic() - 60)
            proc = subprocess.run(
                [sys.executable, "-c", BENCH_CHILD, json.dumps(plan), str(target)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=left,
                check=False,
            )
            summary["bench_exit"] = proc.returncode
        except subprocess.TimeoutExpired:
            summary["bench_exit"] = "timeout"
        finally:
            sampler.terminate()
            sampler.wait()
            log.close()
            gpu_csv.close()
        summary["bench_runs"] = json.loads(target.read_text()) if target.is_file() else []
        gpu_during(summary["bench_runs"], (out / "gpu.csv").read_text(errors="replace"))
        summary["bench_ratio"] = bench_ratio(summary["bench_runs"])
        print("bench:", json.dumps(summary["bench_ratio"]), flush=True)
        for server in (
            servers
        ):  # after every request of this call: what serving added to the start-up's calls
            server.shim_calls(f"after-{summary['started_utc']}")
        reps = [r["rep"] for r in summary["bench_runs"] if r["phase"] == "timed"]
        first_rep = max(reps, default=first_rep - 1) + 1
    finally:
        if args.keep_servers and servers and all(s.alive() for s in servers):
            kept_path.write_text(
                json.dumps(
                    {
                        "id": summary["bench_servers"],
                        "reps_done": first_rep,
                        "servers": [s.kept() for s in servers],
                    },
                    indent=2,
                )
            )
            summary["kept_servers"] = [s.label for s in servers]
        else:
            kept_path.unlink(missing_ok=True)
            for server in servers:
                server.stop()
                if (
                    server.log_path.parent != out
                ):  # started by an earlier call: its whole log travels with this one
                    shutil.copy(server.log_path, out / server.log_path.name)
                summary["servers"].append(server.record)
                _print(server.record, server.log_path)
        save()
    return counter


def _print(record: dict, log_path: Path | None = None) -> None:
    keys = (
        "label",
        "outcome",
        "ready_s",
        "exit_code",
        "processes",
        "shim_summary_pids",
        "first_error",
    )
    print(json.dumps({k: record.get(k) for k in keys}), flush=True)
    if record.get("shim_calls"):
        print("  shim calls:", json.dumps(shim_calls(record)), flush=True)
    if record.get("metrics"):
        print("  /metrics:", json.dumps(record["metrics"])[:600], flush=True)
    if record.get("outcome") != "ready" and log_path is not None:
        tail = [
            line[:300] for line in log_path.read_text(errors="replace").splitlines() if line.strip()
        ][-12:]
        print("  " + "\n  ".join(tail), flush=True)
    if record.get("probe"):
        print("  probe:", json.dumps(record["probe"])[:600], flush=True)


DRIFT_CHILD = r"""
import json, os, sys, time

core, seconds = int(sys.argv[1]), float(sys.argv[2])
os.sched_setaffinity(0, [core])
slices, end = [], time.time() + seconds
while (
    time.time() < end
):  # the same pure-Python work again and again: its speed is this core's speed
    t0, x = time.perf_counter(), 0
    for i in range(100_000):
        x += i * i % 7
    slices.append([time.time(), time.perf_counter() - t0])
print(json.dumps(slices))
"""


def drift_figures(rates: list[list[float]]) -> dict:
    """Two cores' rates, window by window: each one's spread, the spread of their ratio, their
    correlation."""
    first, second = rates
    return {
        "rates": rates,
        "spread": [_spread(first), _spread(second)],
        "side_by_side_spread": _spread([a / b for a, b in zip(first, second, strict=True)]),
        "correlation": round(statistics.correlation(first, second), 3) if len(first) > 2 else None,
    }


def cpu_drift(args: argparse.Namespace) -> int:
    """How fast one core runs the same Python work, window by window, on the core each bench
    server's engine would get, both at once: how much a run's speed drifts (what A then B sees)
    and how much the two cores' speeds differ at one time (what A and B side by side would see)."""
    available = sorted(os.sched_getaffinity(0))
    _, servers = cpu_sets(available, 2)
    cores = [cpus[0] for cpus in servers] if all(servers) else available[:2]
    children = [
        subprocess.Popen(
            [sys.executable, "-c", DRIFT_CHILD, str(core), str(args.seconds)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for core in cores
    ]
    slices = [json.loads(child.communicate()[0]) for child in children]
    start = max(s[0][0] for s in slices)
    rates = []  # per core, per window: loops per second
    for core_slices in slices:
        windows: dict[int, list[float]] = {}
        for when, took in core_slices:
            if when >= start:
                windows.setdefault(int((when - start) // args.window), []).append(took)
        rates.append([len(v) / sum(v) for _, v in sorted(windows.items())])
    n = min(len(r) for r in rates) - 1  # the last window is cut short
    rates = [
        [round(x, 1) for x in r[:n]] for r in rates
    ]  # as kept: the figures follow from what is kept
    result = {"cores": cores, "window_s": args.window, "windows": n, **drift_figures(rates)}
    out = common.output_folder(args.out, ".")
    (out / "cpu-drift.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))
    return 0


# ----------------------------------------------------------------------------- the figures (here
# and there)

T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
}


def _interval(ratios: list[float]) -> dict:
    if len(ratios) < 2:
        return {"pairs": len(ratios)}
    mean = statistics.fmean(ratios)
    half = T95.get(len(ratios) - 1, 1.96) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return {
        "pairs": len(ratios),
        "ratio": round(mean, 4),
        "ci95": [round(mean - half, 4), round(mean + half, 4)],
    }


MEDIANS = (
    "output_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "mean_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "spec_decode_acceptance_rate",
    "spec_decode_acceptance_length",
)
# The arm a bench pair is measured against: unmodified vLLM (baseline), or the silent form's build
# without the shim (tolerant, with --real), whose draft serves with none of its tokens accepted.
REFERENCES = ("baseline", "tolerant")


def _spread(values: list[float]) -> float | None:
    return (
        round((max(values) - min(values)) / statistics.fmean(values), 4)
        if len(values) > 1
        else None
    )


def _spec(run: dict) -> dict:
    return {k: v for k, v in run["result"].items() if k.startswith("spec_decode")}


def bench_ratio(runs: list[dict]) -> dict:
    """Output throughput of the fixed arm over the reference arm (baseline, or tolerant:
    REFERENCES), from the timed repetitions.

    Repetition k of the two arms ran back to back (A B, then B A, ...), so each k gives one
    ratio: the figure is their mean, with a 95% Student-t interval. A pair in which either server
    compiled a kernel while serving (its log says so) is counted in ``all`` and left out of
    ``clean``, the figure that decides: a compile stalls the whole batch for seconds.
    """
    timed = [
        r for r in runs if r.get("phase") == "timed" and "output_throughput" in r.get("result", {})
    ]
    arms = sorted({r["arm"] for r in timed})
    reference = next((a for a in REFERENCES if a in arms), None)
    fixed = [a for a in arms if a != reference]
    if reference is None or len(fixed) != 1:
        return {"arms": arms}
    by_rep: dict[int, dict[str, dict]] = {}
    for r in timed:
        by_rep.setdefault(r["rep"], {})[r["arm"]] = r
    pairs = [(v[fixed[0]], v[reference]) for _, v in sorted(by_rep.items()) if len(v) == 2]

    def ratio(pair: tuple[dict, dict]) -> float:
        return float(pair[0]["result"]["output_throughput"]) / float(
            pair[1]["result"]["output_throughput"]
        )

    clean = [p for p in pairs if not p[0].get("jit_compiles") and not p[1].get("jit_compiles")]
    per_arm = {arm: [r for r in timed if r["arm"] == arm] for arm in (fixed[0], reference)}
    extra = {}
    if (
        reference != "baseline"
    ):  # the cost of the bug: the reference's throughput over the fixed arm's
        extra = {
            "reference_arm": reference,
            "clean_reference_over_fixed": _interval([1 / ratio(p) for p in clean]),
        }
    return {
        "fixed_arm": fixed[0],
        **extra,
        "all": _interval([ratio(p) for p in pairs]),
        "clean": _interval([ratio(p) for p in clean]),
        "output_throughput": {
            arm: [r["result"]["output_throughput"] for r in rs] for arm, rs in per_arm.items()
        },
        "jit_compiles": {arm: [r.get("jit_compiles") for r in rs] for arm, rs in per_arm.items()},
        # (max - min) / mean of an arm's runs that compiled nothing: what one arm's own noise is
        "clean_spread": {
            arm: _spread(
                [r["result"]["output_throughput"] for r in rs if not r.get("jit_compiles")]
            )
            for arm, rs in per_arm.items()
        },
        # the batches the scheduler made: equal in every run of one load, unless timing shaped them
        "engine_steps": {
            arm: [r.get("cost", {}).get("engine_steps") for r in rs] for arm, rs in per_arm.items()
        },
        # vLLM's own figures per arm, the median over its timed runs
        "medians": {
            arm: {
                key: round(statistics.median(r["result"][key] for r in rs), 3)
                for key in MEDIANS
                if all(key in r["result"] for r in rs)
            }
            for arm, rs in per_arm.items()
        },
        **({"acceptance_by_position": _by_position(per_arm)} if extra else {}),
        "failed": sum(int(r["result"].get("failed", 0)) for r in timed),
        # the same prompts in both servers of a pair: the same drafts and accepted tokens, or the
        # shim changed decoding
        "pairs_with_the_same_spec_decode": sum(_spec(a) == _spec(b) for a, b in pairs),
        "completed": {
            arm: sorted({r["result"].get("completed") for r in rs}, key=str)
            for arm, rs in per_arm.items()
        },
        # what bounded the runs: the engine core's CPU seconds over the run's duration (1.0: one
        # core busy the whole run), the GPU's SM clock and power; [lowest, highest] over an arm's
        # timed runs
        "bounds": {arm: _bounds(rs) for arm, rs in per_arm.items()},
    }


def _by_position(per_arm: dict[str, list[dict]]) -> dict:
    """vLLM's own acceptance rate at each draft position, the median over an arm's timed runs."""
    found = {}
    for arm, rs in per_arm.items():
        rates = [r["result"].get("spec_decode_per_position_acceptance_rates") or [] for r in rs]
        width = min((len(x) for x in rates), default=0)
        found[arm] = [round(statistics.median(x[i] for x in rates), 4) for i in range(width)]
    return found


def _bounds(runs: list[dict]) -> dict:
    def span(values: list[float]) -> list[float] | None:
        return [min(values), max(values)] if values else None

    shares = [
        cpu / float(r["result"]["duration"])
        for r in runs
        if r["result"].get("duration")
        for name, cpu in r.get("cost", {}).get("server_cpu_s", {}).items()
        if "EngineCor" in name
    ]
    gpu = [r["cost"]["gpu"] for r in runs if r.get("cost", {}).get("gpu")]
    return {
        "engine_core_cpu_share": span([round(x, 3) for x in shares]),
        "sm_mhz_min": span([g["sm_mhz_min"] for g in gpu]),
        "power_w_mean": span([g["power_w_mean"] for g in gpu]),
        "host_steal": span(
            [r["cost"]["host_steal"] for r in runs if "host_steal" in r.get("cost", {})]
        ),
    }


def shim_calls(record: dict) -> dict | None:
    """A server's shim counts: its processes (from the log) and those that answered at each reading,
    the calls per patch at ready (the start-up's), and what every later reading added, per process.
    """
    readings = record.get("shim_calls")
    if not readings or "ready" not in readings:
        return None
    ready = readings["ready"]
    logged = sorted(name.split()[1] for name in record.get("processes", []))

    def total(reading: dict) -> dict[str, int]:
        calls: dict[str, int] = {}
        for process in reading.values():
            for patch, n in (process["calls"] or {}).items():
                calls[patch] = calls.get(patch, 0) + n
        return calls

    def added(reading: dict) -> dict[str, int]:  # per process with the shim: calls since ready
        return {
            pid: sum(
                n - (ready.get(pid, {}).get("calls") or {}).get(patch, 0)
                for patch, n in p["calls"].items()
            )
            for pid, p in reading.items()
            if p["calls"] is not None
        }

    since = {label: added(reading) for label, reading in readings.items() if label != "ready"}
    return {
        "logged_processes": logged,
        "answered": {label: sorted(reading) for label, reading in readings.items()},
        "with_the_shim": {
            label: sorted(pid for pid, p in reading.items() if p["calls"] is not None)
            for label, reading in readings.items()
        },
        "activated_by": sorted(
            {str(p["activated_by"]) for p in ready.values() if p["calls"] is not None}
        ),
        "at_ready": total(ready),
        "added_after_ready": since,
        "serving_calls": sum(n for per_pid in since.values() for n in per_pid.values()),
    }


# ----------------------------------------------------------------------------- collect (here)


METRICS = EVIDENCE / "serve-h200-metrics"


def collect(args: argparse.Namespace) -> int:
    """Each argument is NAME=results.tgz (a device call's archive), in the order they ran; a
    session of the same name is replaced, the others kept, and the figures computed over all."""
    target = EVIDENCE / "serve-h200.json"
    data = json.loads(target.read_text()) if target.is_file() else {}
    sessions = list(data.get("sessions", []))
    logs = EVIDENCE / "serve-h200-logs"
    for given in args.results:
        source, _, path = given.rpartition("=")
        with tarfile.open(path) as tar:
            files = {
                Path(m.name).name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()
            }  # type: ignore[union-attr]
        summary = json.loads(files["summary.json"])
        summary.pop("unpack", None)
        for server in summary.get(
            "servers", []
        ):  # what its log says, read again with this script's parser
            server.update(log_facts(files[f"{server['label']}.log"].decode(errors="replace")))
        logs.mkdir(parents=True, exist_ok=True)
        for name, content in files.items():
            if name.endswith(".log") and name != "setup.log":
                (logs / f"{source}-{name}").write_bytes(content)
            if name.endswith(
                ".prom"
            ):  # the bench's raw /metrics scrapes, one file per arm (xz: 2% of the text)
                METRICS.mkdir(parents=True, exist_ok=True)
                (METRICS / f"{source}-{name}.xz").write_bytes(lzma.compress(content, preset=9))
        sessions = [s for s in sessions if s["source"] != source] + [
            {"source": source, "summary": summary}
        ]
    data["sessions"] = sessions
    data["figures"] = figures(sessions)
    common.write_json(target, data)
    print(json.dumps(data["figures"], indent=2))
    return 0


def figures(sessions: list[dict]) -> dict:
    """Each server's outcome; for each tensor-parallel size, whether its fixed and baseline servers
    completed the probe alike (the same texts and the same spec-decode counters); each bench
    session's ratio (its repetitions pair only with each other)."""
    outcomes: dict[str, list] = {}
    served: dict[str, dict[str, set]] = {}  # "tp1" -> arm -> what its servers answered
    counts: dict[str, dict] = {}
    metrics: dict[str, dict] = {}
    for session in sessions:
        for s in session["summary"].get("servers", []):
            # CUDA graphs compute in another order than eager kernels, and the weights are dummy:
            # the greedy tokens differ, so graph servers are compared with each other
            tp = f"tp{session['summary'].get('tp', 1)}" + (
                "" if "--enforce-eager" in s["command"] else "-cudagraph"
            )
            tp += (
                "" if "dummy" in s["command"] else "-real"
            )  # harness.checkpoint's weights: other texts
            if shim_calls(s) is not None:
                counts[f"{session['source']}-{s['label']}"] = {"arm": s["arm"], **shim_calls(s)}
            if s.get("metrics"):  # what /metrics showed of the shim, at each reading
                metrics[f"{session['source']}-{s['label']}"] = {"arm": s["arm"], **s["metrics"]}
            outcomes.setdefault(s["arm"], []).append(
                {
                    "server": f"{session['source']}-{s['label']}",
                    "tp": tp,
                    "outcome": s.get("outcome"),
                    "wall_s": s.get("wall_s"),
                    "reported_error": s.get("reported_error"),
                    "processes": len(s.get("processes", [])),
                    "shim_summaries": len(s.get("shim_summary_pids", [])),
                }
            )
            probe = s.get("probe") or {}
            if probe.get("texts_sha256"):
                counters: dict[str, float] = {}
                for key, value in probe.get("spec_decode_metrics", {}).items():
                    name = key.split("{")[0]  # (call 39 to 41 kept the labels)
                    if name.endswith("_total"):
                        counters[name] = counters.get(name, 0.0) + value
                answer = json.dumps([probe["texts_sha256"], counters], sort_keys=True)
                served.setdefault(tp, {}).setdefault(s["arm"], set()).add(answer)
    same = {}
    for tp, arms in served.items():
        if (
            "baseline" not in arms
        ):  # the silent form's arms (tolerant, tolerant-plugin) differ in acceptance
            continue
        compared = [arm for arm in arms if arm.startswith("fixed")] + ["baseline"]
        same[tp] = (
            len(compared) > 1
            and all(arm in arms for arm in compared)
            and len(set().union(*(arms[arm] for arm in compared))) == 1
        )
    probes = {tp: {arm: sorted(v) for arm, v in arms.items()} for tp, arms in served.items()}
    bench = {
        session["source"]: bench_ratio(session["summary"]["bench_runs"])
        for session in sessions
        if session["summary"].get("bench_runs")
    }
    # calls on the same servers (--keep-servers, --attach) number their pairs on: one figure over
    # all
    joined: dict[str, list[dict]] = {}
    for session in sessions:
        if session["summary"].get("bench_runs") and session["summary"].get("bench_servers"):
            joined.setdefault(session["summary"]["bench_servers"], []).append(session)
    for group in joined.values():
        if len(group) > 1:
            bench["+".join(s["source"] for s in group)] = bench_ratio(
                [r for s in group for r in s["summary"]["bench_runs"]]
            )
    return {
        "outcomes": outcomes,
        "probes": probes,
        "same_completions": same,
        "bench": bench,
        "shim_calls": counts,
        "metrics": metrics,
    }


def main() -> int:
    parser, steps = common.command_line("serve_h200", __doc__)
    steps.add_parser(
        "prepare", help="the serve wheels and this project's wheel -> .e2e/serve/"
    ).set_defaults(func=prepare)
    on_gpu = steps.add_parser("run", help="on the GPU machine: the servers of --arms, then --bench")
    on_gpu.add_argument("--out", help="results folder (default: $OUT)")
    on_gpu.add_argument(
        "--arms", default="bug,fixed-launcher", help="servers started, probed and stopped in turn"
    )
    on_gpu.add_argument(
        "--bench", default="", help="two servers side by side, e.g. baseline,fixed-plugin"
    )
    on_gpu.add_argument("--reps", type=int, default=8, help="timed benchmark runs per bench arm")
    on_gpu.add_argument(
        "--max-warmups",
        type=int,
        default=6,
        help="untimed runs per bench server, until one compiles no kernel",
    )
    on_gpu.add_argument("--tp", type=int, default=1, help="--tensor-parallel-size")
    on_gpu.add_argument(
        "--deep-gemm-warmup",
        choices=("relax", "skip"),
        default="relax",
        help=(
            "VLLM_DEEP_GEMM_WARMUP of every server: relax (vLLM's default) compiles DeepGEMM's "
            "kernels at start-up; skip compiles them while serving (calls 33 to 44)"
        ),
    )
    on_gpu.add_argument(
        "--gpu-share", type=float, default=0.5, help="--gpu-memory-utilization of an --arms server"
    )
    on_gpu.add_argument(
        "--bench-gpu-share", type=float, default=0.4, help="the same, for each bench server"
    )
    on_gpu.add_argument(
        "--bench-eager",
        action="store_true",
        help="--enforce-eager for the bench servers too (calls 41 to 47); default: CUDA graphs",
    )
    on_gpu.add_argument(
        "--keep-servers",
        action="store_true",
        help="leave the bench servers running for the next call (a machine stays warm 30 s)",
    )
    on_gpu.add_argument(
        "--attach",
        action="store_true",
        help="bench the servers an earlier --keep-servers call left running, if any",
    )
    on_gpu.add_argument(
        "--no-pin",
        dest="pin",
        action="store_false",
        help="leave the bench servers and client on every core (calls 42 to 46 did)",
    )
    on_gpu.add_argument(
        "--budget", type=float, default=560.0, help="seconds for everything after set-up"
    )
    on_gpu.add_argument("--ready-timeout", type=float, default=360.0)
    on_gpu.add_argument(
        "--min-phase",
        type=float,
        default=200.0,
        help=(
            "start no server with less time left (one takes 90 to 180 s to be ready, calls 39"
            " to 44)"
        ),
    )
    on_gpu.add_argument("--config", default=str(e2e_h200.MODEL_CONFIG))
    on_gpu.add_argument(
        "--real", action="store_true", help="harness.checkpoint's weights, not --load-format dummy"
    )
    on_gpu.add_argument(
        "--arms-dummy",
        action="store_true",
        help=(
            "with --real: the --arms servers still load dummy weights (the reverted build's `bug`"
            " then reaches the KV-cache warm-up and its reported error instead of the checkpoint's"
            " KeyError at load)"
        ),
    )
    on_gpu.set_defaults(func=run)
    drift = steps.add_parser(
        "cpu-drift", help="the speed of two cores, window by window, side by side"
    )
    drift.add_argument("--seconds", type=float, default=90.0)
    drift.add_argument(
        "--window", type=float, default=10.0, help="seconds per window (a bench run: about 10)"
    )
    drift.add_argument("--out", help="folder for cpu-drift.json (default: $OUT)")
    drift.set_defaults(func=cpu_drift)
    back = steps.add_parser("collect", help="results.tgz files -> docs/evidence/serve-h200.json")
    back.add_argument("results", nargs="+", metavar="NAME=results.tgz")
    back.set_defaults(func=collect)
    return common.run_step(parser)


if __name__ == "__main__":
    sys.exit(main())
