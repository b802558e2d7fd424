"""The DSpark draft of DeepSeek-V4, as in the reported build."""

from __future__ import annotations

import re
from types import SimpleNamespace

from vllm.models.deepseek_v4.attention import DeepseekV4Attention

_HEAD = ("norm.", "hc_head_fn", "hc_head_base", "hc_head_scale", "markov_head.", "main_proj.", "main_norm.")


class DSparkDeepseekV4ForCausalLM:
    def __init__(self, num_hidden_layers: int = 43, n_mtp_layers: int = 3, kv_cache_dtype: str = "fp8_ds_mla"):
        self.config = SimpleNamespace(num_hidden_layers=num_hidden_layers, n_mtp_layers=n_mtp_layers)
        # Draft layers are sliding-window only (compress ratio 1); the list
        # registers them as model.layers.0..K-1.
        layers = [
            SimpleNamespace(attn=DeepseekV4Attention(1, kv_cache_dtype), weights={})
            for _ in range(n_mtp_layers)
        ]
        self.model = SimpleNamespace(layers=layers, weights={})

    def named_parameters(self):
        for i in range(len(self.model.layers)):
            yield f"model.layers.{i}.attn.wkv.weight", None
            yield f"model.layers.{i}.ffn.gate.weight", None
        for name in ("model.norm.weight", "model.main_proj.weight", "model.markov_head.weight"):
            yield name, None
        # Shared with the target model, never loaded by the draft.
        yield "model.embed_tokens.weight", None
        yield "lm_head.weight", None

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        loaded = set()
        for name, value in weights:
            mapped = self._remap_dspark_name(name)
            # This build skips names it has no parameter for, so a wrong mapping
            # leaves the draft's layers randomly initialised without a word.
            if mapped is None or mapped not in params:
                continue
            params[mapped] = value
            loaded.add(mapped)
        return loaded

    def _remap_dspark_name(self, name):
        m = re.match(r"mtp\.(\d+)\.(.*)", name)
        if m is None:
            return None
        stage, rest = int(m.group(1)), m.group(2)
        if rest.startswith(_HEAD):
            return f"model.{rest}"
        # The defect (vllm-project/vllm#47648): shifted past the target's layers.
        return f"model.layers.{self.config.num_hidden_layers + stage}.{rest}"
