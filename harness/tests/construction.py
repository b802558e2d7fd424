"""harness.checkpoint's construction on the CPU, in a venv of vLLM 0.25.0: run by path, prints JSON.

The residual stream is followed as vLLM 0.25.0's DeepSeek-V4 layers carry it, through vLLM's own
torch reference of the hyper-connections (``mhc_pre_torch``, ``mhc_post_torch``); attention and
routed experts add nothing (their output projections are zero); each draft layer's shared expert
is the SwiGLU of the checkpoint's dequantized FP8 weights, clamped at the config's swiglu_limit.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch
from vllm.model_executor.kernels.mhc.torch import mhc_post_torch, mhc_pre_torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from harness import checkpoint

EPS = 1e-6


def small_table(config: dict, stages: int) -> list[dict]:
    """The tensors the construction gives a value that matters, named as harness.checkpoint names
    them."""
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    inter, rank = config["moe_intermediate_size"], config["dspark_markov_rank"]
    table = [
        {"name": "embed.weight", "shape": [vocab, hidden], "dtype": "bfloat16"},
        {"name": "head.weight", "shape": [vocab, hidden], "dtype": "bfloat16"},
    ]
    for i in range(stages):
        for w, shape in (("w1", [inter, hidden]), ("w3", [inter, hidden]), ("w2", [hidden, inter])):
            stem = f"mtp.{i}.ffn.shared_experts.{w}"
            table.append({"name": f"{stem}.weight", "shape": shape, "dtype": "float8_e4m3fn"})
            blocks = [-(-n // checkpoint.BLOCK) for n in shape]
            table.append({"name": f"{stem}.scale", "shape": blocks, "dtype": "float32"})
    last = f"mtp.{stages - 1}."
    table += [
        {"name": last + "norm.weight", "shape": [hidden], "dtype": "bfloat16"},
        {
            "name": last + "markov_head.markov_w1.weight",
            "shape": [vocab, rank],
            "dtype": "bfloat16",
        },
        {
            "name": last + "markov_head.markov_w2.weight",
            "shape": [vocab, rank],
            "dtype": "bfloat16",
        },
    ]
    return table


def main() -> None:
    config = json.loads(sys.argv[1])
    if len(sys.argv) > 2:  # sequences an engine generated: how many of their steps go t -> succ(t)
        succ = checkpoint.permutation(config, 0)
        samples = json.loads(sys.argv[2])
        print(
            json.dumps([sum(int(succ[a]) == b for a, b in itertools.pairwise(s)) for s in samples])
        )
        return
    stages, hc = config["n_mtp_layers"], config["hc_mult"]
    table = small_table(config, stages)
    named = checkpoint.tensors(table, checkpoint.construct(config, table, stages, seed=0))
    succ = checkpoint.permutation(config, 0)
    noise = config["dspark_noise_token_id"]
    tokens = torch.tensor([t for t in range(config["vocab_size"]) if t != noise])

    def dequant(stem: str) -> torch.Tensor:
        weight, scale = named[stem + ".weight"].float(), named[stem + ".scale"]
        rows, cols = weight.shape
        full = scale.repeat_interleave(checkpoint.BLOCK, 0).repeat_interleave(checkpoint.BLOCK, 1)
        return weight * full[:rows, :cols]

    def rms(x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS)

    head = named["head.weight"].float()
    embed = named["embed.weight"][tokens]
    target = (rms(embed.float()) @ head.t()).argmax(-1)

    def draft_position0(present: list[bool]) -> float:
        """Share of anchors whose first draft token is succ(anchor), with the layers that
        ``present`` keeps."""
        hidden = config["hidden_size"]
        residual = embed.unsqueeze(1).repeat(1, hc, 1)
        fn, base = torch.zeros((2 + hc) * hc, hc * hidden), torch.zeros((2 + hc) * hc)
        for i, here in enumerate(present):
            for sublayer in ("attn", "ffn"):
                post, comb, x = mhc_pre_torch(
                    residual, fn, torch.ones(3), base, EPS, EPS, EPS, 2.0, 20
                )
                out = torch.zeros(x.shape)
                if sublayer == "ffn" and here:
                    u = rms(x.float())
                    gate = (u @ dequant(f"mtp.{i}.ffn.shared_experts.w1").t()).clamp(
                        max=config["swiglu_limit"]
                    )
                    up = (u @ dequant(f"mtp.{i}.ffn.shared_experts.w3").t()).clamp(
                        -config["swiglu_limit"], config["swiglu_limit"]
                    )
                    out = (torch.nn.functional.silu(gate) * up) @ dequant(
                        f"mtp.{i}.ffn.shared_experts.w2"
                    ).t()
                residual = mhc_post_torch(out.to(torch.bfloat16), residual, post, comb)
        last = f"mtp.{stages - 1}."
        pooled = (0.5 + EPS) * residual.float().sum(
            1
        )  # hc_head with zero fn and base: sigmoid(0) each
        base_logits = (rms(pooled) * named[last + "norm.weight"].float()) @ head.t()
        markov = (
            named[last + "markov_head.markov_w1.weight"].float()[tokens]
            @ named[last + "markov_head.markov_w2.weight"].float().t()
        )
        return ((base_logits + markov).argmax(-1) == succ[tokens]).float().mean().item()

    last = f"mtp.{stages - 1}."
    after = succ[
        tokens
    ]  # a later position: the noise token's base logits are zero; the Markov head decides
    chain = (
        named[last + "markov_head.markov_w1.weight"].float()[after]
        @ named[last + "markov_head.markov_w2.weight"].float().t()
    )
    print(
        json.dumps(
            {
                "target": (target == succ[tokens]).float().mean().item(),
                "noise_embedding_zero": bool((named["embed.weight"][noise] == 0).all()),
                "markov_chain": (chain.argmax(-1) == succ[after]).float().mean().item(),
                "all_layers": draft_position0([True] * stages),
                "no_layers": draft_position0([False] * stages),
                "one_missing": [
                    draft_position0([j != k for j in range(stages)]) for k in range(stages)
                ],
            }
        )
    )


if __name__ == "__main__":
    main()
