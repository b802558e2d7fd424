"""vLLM 0.25.0's own DSpark ``load_weights`` on the CPU, over the names harness.checkpoint wrote on
the H200.

Run by path in a venv of vLLM 0.25.0; argv: the checkpoint's record (checkpoint.json), and
``released`` or ``reverted`` (the shifted remap of the reported build). Prints JSON: the
parameters the loader filled, or the error it raised. The model itself cannot be built on a CPU
(see test_checkpoint.py), so ``self`` is a stand-in holding the parameter names that vLLM built on
the H200 (the record's ``vllm_params``); every parameter's loader only records that it was called.
"""

from __future__ import annotations

import json
import re
import sys
import types

import torch
from vllm.models.deepseek_v4.nvidia import dspark
from vllm.models.deepseek_v4.nvidia.dspark import DSparkDeepseekV4ForCausalLM


def main() -> None:
    record = json.loads(open(sys.argv[1]).read())
    config = types.SimpleNamespace(**json.loads(open(sys.argv[2]).read()))
    shapes = {e["name"]: e["shape"] for e in record["target"] + record["draft"]}
    params = {}
    for name in record["vllm_params"]["draft"]:
        sink = name.endswith("attn_sink")
        param = torch.nn.Parameter(
            torch.zeros(config.num_attention_heads if sink else 0), requires_grad=False
        )
        param.weight_loader = lambda *args, **kwargs: True
        params[name] = param
    dspark.get_tensor_model_parallel_world_size = lambda: 1  # no process group on this CPU
    dspark.get_tensor_model_parallel_rank = lambda: 0

    def remap(self, name: str) -> str | None:
        mapped = DSparkDeepseekV4ForCausalLM._remap_dspark_name(self, name)
        if sys.argv[3] == "reverted" and mapped and mapped.startswith("model.layers."):
            stage, rest = re.match(r"model\.layers\.(\d+)\.(.*)", mapped).groups()
            return f"model.layers.{config.num_hidden_layers + int(stage)}.{rest}"
        return mapped

    layer = types.SimpleNamespace(ffn=types.SimpleNamespace(use_mega_moe=False))
    model = types.SimpleNamespace(
        config=config,
        model=types.SimpleNamespace(layers=[layer]),
        named_parameters=lambda: iter(params.items()),
        _finalize_moe=lambda: None,
    )
    model._remap_dspark_name = types.MethodType(remap, model)

    def weights():
        for name, shape in sorted(shapes.items()):  # as the safetensors files list them
            small = name.endswith("attn_sink")
            yield name, torch.zeros(shape) if small else torch.empty(shape, device="meta")

    try:
        loaded = DSparkDeepseekV4ForCausalLM.load_weights(model, weights())
    except Exception as error:  # the reverted remap: which name it could not place
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}))
        return
    print(json.dumps({"loaded": sorted(loaded)}))


if __name__ == "__main__":
    main()
