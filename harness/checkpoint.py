"""A real checkpoint for the e2e model, written on the GPU machine so that nothing large travels.

  python3 -m harness.checkpoint write --model-dir D [--config C] [--seed N]
      on the GPU machine, where vLLM 0.25.0 imports (harness.e2e_h200's baseline environment):
      D gets config.json, model-0000K.safetensors, model.safetensors.index.json and
      checkpoint.json (the parameter table it was written from, and the construction's figures)

**Names.** vLLM 0.25.0's own DeepSeek-V4 model and its DSpark draft are built on the meta device,
as the engine builds them (`initialize_model`, the draft with the non-causal attention of
`load_dspark_model`). Each parameter is then named as DeepSeek-V4's published checkpoint names it:
the inverse of the loaders' rules (`_make_deepseek_v4_weights_mapper("fp8")` for the target,
`DSparkDeepseekV4ForCausalLM.load_weights` and `_remap_dspark_name` for the draft). A fused
parameter splits into its shards (`gate_up_proj` into `w1`, `w3`; `attn.fused_wqa_wkv` into
`attn.wq_a`, `attn.wkv`; `compressor.fused_wkv_wgate` into `compressor.wkv`, `compressor.wgate`;
`experts.w13_weight` into `experts.{e}.w1`, `experts.{e}.w3`), a block-FP8 weight carries its
`.scale` (128x128 blocks, float32), and the draft's layers are `mtp.{i}.*`, its context combiner
(`main_proj`, `main_norm`) `mtp.0.*`, its head stack (`norm`, `hc_head_*`, `markov_head`) the last
stage's. The draft's embedding and LM head are the target's (vLLM aliases them), so they are not
written twice.

**Values** (`construct`, checked on the CPU by harness/tests/test_checkpoint.py). Acceptance
depends on the draft's layer weights landing where they belong:

- Every token but the noise token embeds as a sign vector: 1 in dimension 0, +-1 in the next
  INFO dimensions, 0 elsewhere; the noise token embeds as zeros. `head` maps the embedding of t to
  `succ(t)`, a fixed random permutation of the tokens (the noise token excepted).
- Every attention's output projection (`attn.wo_b`) and every expert's down projection are zero,
  the hyper-connection parameters zero (scale 1), the norms 1: the target's residual stream stays
  its input's embedding, and the target predicts `succ(t)` after t.
- Each draft layer's shared expert flips the sign of the embedding's sign dimensions: its gate
  reads dimension 0, its up projection copies the sign dimensions, and its down projection sends
  them back scaled by flip(), so that the layer adds -2x to its input x. So x becomes -x, the same
  size, and the next layer sees what this one saw and flips again. The draft's final norm is -1.
  With all three layers in place the flips are odd and the final norm turns them back: the draft
  predicts `succ(anchor)`. Where any layer's weights are missing (zeros) or misplaced, the count is
  even and the draft predicts the token least like `succ(anchor)`; where they are garbage, noise.
- The Markov head maps the previously drafted token t to `succ(t)` (weaker than the base logits),
  so that the later draft positions, whose input is the noise token, follow the chain.

Standard library at the top; torch and vLLM inside the functions that run on the GPU machine.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from harness import common

BLOCK = 128  # the config's weight_block_size: 128x128
INFO = 1024  # the sign dimensions of every embedding
GATE = 2.0  # each draft layer's shared-expert gate weight on dimension 0 (see flip())
HEAD = 0.02  # the LM head's scale: base logits of about +-HEAD * INFO
MARKOV = 0.02  # the Markov head's scale: about +-MARKOV * rank, below the base logits
SMALL = 0.02  # every other weight: normal, this standard deviation
SHARD_BYTES = 2 << 30

# (fused parameter, its checkpoint shards), as the loaders' stacked rules undo them.
STACKED = (
    ("gate_up_proj", ("w1", "w3")),
    ("attn.fused_wqa_wkv", ("attn.wq_a", "attn.wkv")),
    ("compressor.fused_wkv_wgate", ("compressor.wkv", "compressor.wgate")),
)
HEAD_STACK = ("norm.", "hc_head_fn", "hc_head_base", "hc_head_scale", "markov_head.")


# ----------------------------------------------------------------------------- names


def checkpoint_name(name: str, draft_stages: int | None) -> str | None:
    """The published checkpoint's name of vLLM's parameter ``name`` (its shard rules aside);
    ``draft_stages``: the draft's stage count (None for the target). None: not written."""
    if draft_stages is None:
        if name == "lm_head.weight":
            return "head.weight"
        name = name.removeprefix("model.").replace("embed_tokens.weight", "embed.weight")
    else:
        if name.startswith(("model.embed_tokens.", "lm_head.")):
            return None  # the target's, aliased
        m = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        rest = name.removeprefix("model.")
        if m:
            name = f"mtp.{m[1]}.{m[2]}"
        elif rest.startswith(("main_proj.", "main_norm.")):
            name = f"mtp.0.{rest}"
        elif rest.startswith(HEAD_STACK):
            name = f"mtp.{draft_stages - 1}.{rest}"
        else:
            raise ValueError(f"draft parameter with no checkpoint name: {name}")
    name = name.replace(".ffn.gate.e_score_correction_bias", ".ffn.gate.bias")
    name = name.replace(".shared_experts.down_proj", ".shared_experts.w2")
    return re.sub(r"\.weight_scale_inv$", ".scale", name)


def entries(model, draft_stages: int | None) -> list[dict]:
    """Every tensor of the checkpoint for ``model`` (built by vLLM): name, shape, dtype."""
    out = []
    for name, param in model.named_parameters():
        base = checkpoint_name(name, draft_stages)
        if base is None:
            continue
        dtype, shape = str(param.dtype).removeprefix("torch."), list(param.shape)
        expert = re.match(
            r"(.*\.experts\.)(?:routed_experts\.)?(w13|w2)_(weight|weight_scale_inv|weight_scale)$",
            base,
        )
        if expert:
            prefix, which, kind = expert.groups()
            suffix = "weight" if kind == "weight" else "scale"
            shards = ("w1", "w3") if which == "w13" else ("w2",)
            rows = shape[1] // len(shards)
            for e in range(shape[0]):
                for shard in shards:
                    out.append(
                        {
                            "name": f"{prefix}{e}.{shard}.{suffix}",
                            "shape": [rows, *shape[2:]],
                            "dtype": dtype,
                        }
                    )
            continue
        for fused, shards in STACKED:
            if f".{fused}." not in f".{base}":
                continue
            module = model.get_submodule(name.rsplit(".", 1)[0])
            sizes = list(module.output_sizes)
            if base.endswith(".scale"):
                sizes = [-(-s // BLOCK) for s in sizes]
            if sum(sizes) != shape[0]:
                raise ValueError(f"{name}: shards {sizes} do not add up to {shape}")
            for shard, rows in zip(shards, sizes, strict=True):
                out.append(
                    {
                        "name": base.replace(fused, shard),
                        "shape": [rows, *shape[1:]],
                        "dtype": dtype,
                    }
                )
            break
        else:
            out.append({"name": base, "shape": shape, "dtype": dtype})
    return out


def vllm_tables(model_dir: Path, spec_tokens: int) -> dict:
    """The checkpoint's tensors for vLLM 0.25.0's target and draft, built on the meta device."""
    import tempfile

    import torch
    from vllm.config import replace, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    config = EngineArgs(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        kv_cache_dtype="fp8",
        block_size=256,
        enforce_eager=True,
        max_model_len=2048,
        speculative_config={"method": "dspark", "num_speculative_tokens": spec_tokens},
    ).create_engine_config()
    spec = config.speculative_config
    draft_config = replace(
        config,
        attention_config=replace(
            config.attention_config, use_non_causal=True, backend=spec.attention_backend
        ),
    )
    with set_current_vllm_config(config):
        init_distributed_environment(1, 0, f"file://{tempfile.mktemp()}", 0, "gloo")
        initialize_model_parallel(1, 1)
        with set_default_torch_dtype(config.model_config.dtype), torch.device("meta"):
            target = initialize_model(vllm_config=config)
    with (
        set_current_vllm_config(draft_config),
        set_default_torch_dtype(spec.draft_model_config.dtype),
    ):
        with torch.device("meta"):
            draft = initialize_model(vllm_config=draft_config, model_config=spec.draft_model_config)
    stages = len(draft.model.layers)
    return {
        "target": entries(target, None),
        "draft": entries(draft, stages),
        "draft_params": len(dict(draft.named_parameters())),
        "draft_stages": stages,
        "vllm_params": {
            "target": sorted(n for n, _ in target.named_parameters()),
            "draft": sorted(n for n, _ in draft.named_parameters()),
        },
    }


# ----------------------------------------------------------------------------- values


def permutation(config: dict, seed: int):
    """``succ``: a random permutation of every token but the noise token (which maps to itself)."""
    import torch

    vocab, noise = config["vocab_size"], config["dspark_noise_token_id"]
    gen = torch.Generator().manual_seed(seed)
    others = torch.tensor([t for t in range(vocab) if t != noise])
    succ = torch.arange(vocab)
    succ[others] = others[torch.randperm(len(others), generator=gen)]
    return succ


def flip(hidden: int, info: int) -> float:
    """The down projection's scale that makes a draft layer add -2x: its input x (1, then +-1 in
    ``info`` dimensions) reaches the expert normalized, as u = x / rms(x); the gate gives
    silu(GATE * u[0]), the up projection u's signs, so -2x = -scale * silu(GATE * u0) * u."""
    import math

    u0 = 1 / math.sqrt((1 + info) / hidden)
    silu = GATE * u0 / (1 + math.exp(-GATE * u0))
    return 2 / (u0 * silu)


def info_dims(config: dict) -> int:
    """The sign dimensions: INFO, or fewer where the model's hidden or shared-expert width is
    smaller."""
    return min(
        INFO,
        config["hidden_size"] // 4,
        config["moe_intermediate_size"] * config["n_shared_experts"],
    )


def construct(config: dict, table: list[dict], stages: int, seed: int, device: str = "cpu") -> dict:
    """The float value of every tensor of ``table`` (weights before FP8; scales are made by
    ``quantize``)."""
    import torch

    hidden, vocab, noise = (
        config["hidden_size"],
        config["vocab_size"],
        config["dspark_noise_token_id"],
    )
    info = info_dims(config)
    scale = flip(hidden, info)
    gen = torch.Generator(device=device).manual_seed(seed)
    succ = permutation(config, seed).to(device)
    pred = torch.empty_like(succ)
    pred[succ] = torch.arange(vocab, device=device)

    def signs(rows: int, cols: int):
        return torch.randint(0, 2, (rows, cols), generator=gen, device=device).float() * 2 - 1

    embed = torch.zeros(vocab, hidden, device=device)
    embed[:, 0] = 1.0
    embed[:, 1 : 1 + info] = signs(vocab, info)
    embed[noise] = 0.0
    rank = config["dspark_markov_rank"]
    markov_in = signs(vocab, rank)
    markov_in[noise] = 0.0
    last = f"mtp.{stages - 1}."
    values = {}
    for entry in table:
        name, shape = entry["name"], entry["shape"]
        if name.endswith(".scale"):
            continue
        if name == "embed.weight":
            value = embed
        elif name == "head.weight":  # row s: the embedding of pred(s), so that t predicts succ(t)
            value = torch.zeros(vocab, hidden, device=device)
            value[:, 1 : 1 + info] = HEAD * embed[pred, 1 : 1 + info]
            value[noise] = 0.0
        elif name == last + "markov_head.markov_w1.weight":
            value = markov_in
        elif name == last + "markov_head.markov_w2.weight":
            value = MARKOV * markov_in[pred]
            value[noise] = 0.0
        elif name == last + "norm.weight":
            value = -torch.ones(shape, device=device)
        elif re.search(r"mtp\.\d+\.ffn\.shared_experts\.w[123]\.weight$", name):
            value = torch.zeros(shape, device=device)
            rows = torch.arange(info, device=device)
            if name.endswith("w1.weight"):
                value[rows, 0] = GATE
            elif name.endswith("w3.weight"):
                value[rows, 1 + rows] = 1.0
            else:
                value[1 + rows, rows] = -scale
        elif re.search(r"(attn\.wo_b|\.w2)\.weight$", name):
            value = torch.zeros(shape, device=device)
        elif re.search(r"norm\.weight$", name):
            value = torch.ones(shape, device=device)
        elif re.search(r"hc_\w+_scale$", name):
            value = torch.ones(shape, device=device)
        elif re.search(r"(hc_\w+_(fn|base)|attn_sink|gate\.bias|\.ape)$", name):
            value = torch.zeros(shape, device=device)
        else:
            value = torch.randn(shape, generator=gen, device=device) * SMALL
        values[name] = value
    return values


def quantize(weight):
    """Block FP8 (e4m3, 128x128) of a 2-D float weight: (the FP8 weight, its float32 scales)."""
    import torch

    rows, cols = weight.shape
    pad = weight.new_zeros(-(-rows // BLOCK) * BLOCK, -(-cols // BLOCK) * BLOCK)
    pad[:rows, :cols] = weight
    blocks = pad.view(pad.shape[0] // BLOCK, BLOCK, pad.shape[1] // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(
        amax > 0, amax / torch.finfo(torch.float8_e4m3fn).max, torch.ones_like(amax)
    )
    quant = (blocks / scale[:, None, :, None]).to(torch.float8_e4m3fn).view_as(pad)[:rows, :cols]
    return quant.contiguous(), scale.float()


def tensors(table: list[dict], values: dict) -> dict:
    """The checkpoint's tensors in their dtypes: FP8 weights with their ``.scale``, the rest
    cast."""
    import torch

    names = {e["name"] for e in table}
    out = {}
    for entry in table:
        name = entry["name"]
        if name.endswith(".scale"):
            continue
        dtype = getattr(torch, entry["dtype"])
        if dtype == torch.float8_e4m3fn:
            scale_name = name.removesuffix(".weight") + ".scale"
            if scale_name not in names:
                raise ValueError(f"{name}: FP8 without {scale_name}")
            out[name], out[scale_name] = quantize(values[name])
        else:
            out[name] = values[name].to(dtype).contiguous()
    missing = names - set(out)
    if missing:
        raise ValueError(f"scales without weights: {sorted(missing)[:5]}")
    return out


def save(model_dir: Path, named: dict) -> dict:
    """Safetensors shards of about SHARD_BYTES and their index."""
    from safetensors.torch import save_file

    shards: list[dict] = [{}]
    size = 0
    for name in sorted(named):
        tensor = named[name]
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.cpu()
        size += nbytes
    weight_map = {}
    for index, shard in enumerate(shards):
        file = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(model_dir / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in named.values())
    index_data = {"metadata": {"total_size": total}, "weight_map": weight_map}
    common.write_json(model_dir / "model.safetensors.index.json", index_data)
    return {"files": len(shards), "bytes": total, "tensors": len(named)}


def write(args: argparse.Namespace) -> int:
    import time

    import torch

    started = time.monotonic()
    model_dir = Path(args.model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    config = json.loads(Path(args.config).read_text())
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tables = vllm_tables(model_dir, args.spec_tokens)
    common.write_json(model_dir / "tables.json", tables)
    table = tables["target"] + tables["draft"]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    values = construct(config, table, tables["draft_stages"], args.seed, device)
    written = save(model_dir, tensors(table, values))
    record = {
        **tables,
        "written": written,
        "seed": args.seed,
        "wall_s": round(time.monotonic() - started, 1),
    }
    record["figures"] = {
        "INFO": info_dims(config),
        "GATE": GATE,
        "FLIP": flip(config["hidden_size"], info_dims(config)),
        "HEAD": HEAD,
        "MARKOV": MARKOV,
        "SMALL": SMALL,
    }
    common.write_json(model_dir / "checkpoint.json", record)
    print(
        f"checkpoint: {written['tensors']} tensors, {written['bytes'] / 2**30:.2f} GiB in"
        f" {written['files']} files; draft: {tables['draft_params']} parameters;"
        f" {record['wall_s']} s",
        flush=True,
    )
    return 0


def main() -> int:
    parser, steps = common.command_line("checkpoint", __doc__)
    step = steps.add_parser("write", help="on the GPU machine: the checkpoint into --model-dir")
    step.add_argument("--model-dir", required=True)
    step.add_argument("--config", default=str(common.REPO / "harness" / "e2e" / "config.json"))
    step.add_argument("--seed", type=int, default=0)
    step.add_argument("--spec-tokens", type=int, default=5)
    step.set_defaults(func=write)
    return common.run_step(parser)


if __name__ == "__main__":
    sys.exit(main())
