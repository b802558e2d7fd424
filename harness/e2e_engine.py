"""One vLLM engine of harness.e2e_h200's phases: start it, warm it up, time generations, read
metrics.

``harness.e2e_h200 run`` starts this file by its path, once per phase, in a child process with
the PYTHONPATH of the phase's variant (the repository root on it only for the variants with the
shim). It is run by path, not as ``python3 -m harness...``, so that the repository root does not
join ``sys.path`` for the variants without the shim; for the same reason it imports nothing from
the ``harness`` package. Standard library at the top; vLLM inside ``engine``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path


def engine(args: argparse.Namespace) -> int:
    """One engine: start it, warm it up, time prefill-only and full generations, read metrics."""
    result: dict = {
        "python_path": os.environ.get("PYTHONPATH"),
        "dspark_hotfix": os.environ.get("DSPARK_HOTFIX"),
        "hybrid_off": os.environ.get("DSPARK_E2E_HYBRID_OFF") == "1",
    }
    result_path = Path(args.result)

    def save() -> None:
        result_path.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")

    import random

    import vllm
    from vllm import LLM, SamplingParams

    result["vllm_file"] = vllm.__file__
    result["vllm_version"] = getattr(vllm, "__version__", None)
    result["shim_loaded"] = "dspark_hotfix" in sys.modules
    save()
    if args.digests:  # collective_rpc sends a function to the engine's worker: vLLM pickles it then
        os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"
    started = time.monotonic()
    llm = LLM(
        model=str(args.model_dir),
        load_format=args.load_format,
        skip_tokenizer_init=True,
        kv_cache_dtype="fp8",
        block_size=256,
        enforce_eager=True,
        max_model_len=2048,
        max_num_seqs=max(args.batch, 8),
        gpu_memory_utilization=0.5,
        seed=0,
        disable_log_stats=False,
        speculative_config={"method": "dspark", "num_speculative_tokens": args.spec_tokens},
        disable_hybrid_kv_cache_manager=os.environ.get("DSPARK_E2E_HYBRID_OFF") == "1",
    )
    result["engine_start_s"] = round(time.monotonic() - started, 1)
    save()
    if args.digests:
        digests = llm.collective_rpc(_draft_digests)[0]
        result["draft_digests"] = digests
        lines = "".join(f"{name} {digest}\n" for name, digest in sorted(digests.items()))
        result["draft_digest"] = {
            "parameters": len(digests),
            "sha256": hashlib.sha256(lines.encode()).hexdigest(),
        }
        result["worker_shim_status"] = llm.collective_rpc(_shim_status)[0]
        save()
    rng = random.Random(0)
    prompts = [
        {"prompt_token_ids": [rng.randrange(1000, 100000) for _ in range(args.prompt_len)]}
        for _ in range(args.batch)
    ]

    def params(max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
        )

    def generate(max_tokens: int) -> tuple[float, int, list[list[int]]]:
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params(max_tokens), use_tqdm=False)
        elapsed = time.perf_counter() - t0
        ids = [list(o.outputs[0].token_ids) for o in outputs]
        return elapsed, sum(len(i) for i in ids), ids

    generate(8)  # warm-up
    before = _spec_metrics(llm)
    timed = []
    sample: list[list[int]] = []
    for _ in range(args.reps):
        started_at = time.strftime("%H:%M:%S")
        t_prefill, _, _ = generate(1)
        t_full, n_tokens, sample = generate(args.max_tokens)
        decode_tokens = n_tokens - len(prompts)
        # A kernel compiled during one of the two calls (vLLM logs "JIT compilation during
        # inference") makes the difference meaningless: then there is no decode rate.
        decode_s = t_full - t_prefill
        timed.append(
            {
                "started": started_at,
                "prefill_only_s": round(t_prefill, 4),
                "full_s": round(t_full, 4),
                "output_tokens": n_tokens,
                "output_tok_per_s": round(n_tokens / t_full, 1),
                "decode_tok_per_s": round(decode_tokens / decode_s, 1) if decode_s > 0 else None,
                "output_ids_sha256": hashlib.sha256(json.dumps(sample).encode()).hexdigest(),
            }
        )
        result["timed"] = timed
        save()
    after = _spec_metrics(llm)
    result["spec_metrics_timed"] = {
        k: after.get(k, 0) - before.get(k, 0) for k in after if not isinstance(after[k], list)
    }
    result["spec_metrics_total"] = after
    result["sample_output_token_ids"] = [ids[:24] for ids in sample[:2]]
    result["ok"] = True
    save()
    return 0


def _draft_digests(worker) -> dict:
    """The sha256 of each parameter of the draft model as loaded (after vLLM processed the weights),
    in the worker that holds it."""
    import torch

    model = worker.model_runner.speculator.model
    out = {}
    for name, param in model.named_parameters():
        data = param.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes()
        out[name] = hashlib.sha256(data).hexdigest()
    return out


def _shim_status(worker) -> object:
    """dspark_hotfix.status() in the worker that loaded the weights (None: the shim is not loaded
    there)."""
    shim = sys.modules.get("dspark_hotfix")
    return json.loads(json.dumps(shim.status(), default=str)) if shim else None


def _spec_metrics(llm) -> dict:
    values: dict = {}
    for metric in llm.get_metrics():
        name = getattr(metric, "name", "")
        if not name.startswith(
            ("vllm:spec_decode", "vllm:generation_tokens", "vllm:prompt_tokens")
        ):
            continue
        if hasattr(metric, "values"):
            values[name] = list(metric.values)
        elif hasattr(metric, "value"):
            values[name] = values.get(name, 0) + metric.value
    return values


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--result", required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--spec-tokens", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--prompt-len", type=int, required=True)
    parser.add_argument("--max-tokens", type=int, required=True)
    parser.add_argument("--reps", type=int, required=True)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument(
        "--digests", action="store_true", help="each draft parameter's sha256 once loaded"
    )
    return engine(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
