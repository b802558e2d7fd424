"""harness.checkpoint on the CPU: its construction makes acceptance depend on the draft's layer
weights.

vLLM 0.25.0's DeepSeek-V4 model cannot be built on this machine: its constructor makes CUDA streams
and picks its FP8 kernels by platform (and the wheel's custom ops need CUDA), so the names are
checked where the model is built, on the GPU machine (the record's load by unmodified vLLM). Here:
the values, through vLLM 0.25.0's own torch reference of the hyper-connections (construction.py).
"""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

from harness import checkpoint, serve_h200
from scripts.venvs import ensure_venv
from tests.conftest import clean_env

RECORD = checkpoint.common.EVIDENCE / "checkpoint-h200" / "checkpoint.json"
E2E_CONFIG = checkpoint.common.REPO / "harness" / "e2e" / "config.json"
CONFIG = json.loads(E2E_CONFIG.read_text())
# The e2e model's shape, narrowed so that the CPU follows it in seconds.
SMALL = {
    **CONFIG,
    "hidden_size": 512,
    "vocab_size": 4096,
    "moe_intermediate_size": 256,
    "dspark_markov_rank": 64,
    "dspark_noise_token_id": 4000,
}


def child(script: str, *args: str) -> dict:
    """A script of this folder run by path in the venv of vLLM 0.25.0: the JSON it prints last."""
    python, _ = ensure_venv("0.25.0")
    proc = subprocess.run(
        [str(python), str(Path(__file__).with_name(script)), *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def construction(config: dict) -> dict:
    return child("construction.py", json.dumps(config))


def test_the_draft_predicts_what_the_target_predicts_only_with_all_its_layers_in_place():
    found = construction(SMALL)
    assert found["target"] == 1.0  # the target predicts succ(t) after every token t
    assert found["noise_embedding_zero"]
    assert (
        found["markov_chain"] == 1.0
    )  # later positions follow the chain from the token drafted before
    assert found["all_layers"] == 1.0  # the first draft token is succ(anchor) for every anchor
    assert found["no_layers"] == 0.0  # the draft's layers not loaded (zeros): never
    assert found["one_missing"] == [0.0, 0.0, 0.0]  # any one layer missing: never


def test_a_draft_layer_gives_back_its_input_with_the_opposite_sign():
    # flip(): silu(GATE * u0) * u, scaled, is 2x for the input x (1, +-1 in the sign dimensions).
    hidden, info = CONFIG["hidden_size"], checkpoint.info_dims(CONFIG)
    u0 = (hidden / (1 + info)) ** 0.5
    gate = checkpoint.GATE * u0
    silu = gate / (1 + math.exp(-gate))
    assert abs(checkpoint.flip(hidden, info) * silu * u0 - 2) < 1e-9
    assert gate < CONFIG["swiglu_limit"]  # the clamp never bites


def test_checkpoint_names_invert_the_loaders_rules():
    stages = 3
    cases = {
        ("lm_head.weight", None): "head.weight",
        ("model.embed_tokens.weight", None): "embed.weight",
        ("model.layers.2.ffn.gate.e_score_correction_bias", None): "layers.2.ffn.gate.bias",
        (
            "model.layers.0.ffn.shared_experts.down_proj.weight_scale_inv",
            None,
        ): "layers.0.ffn.shared_experts.w2.scale",
        ("model.hc_head_fn", None): "hc_head_fn",
        ("model.layers.1.attn.wo_b.weight", stages): "mtp.1.attn.wo_b.weight",
        ("model.main_proj.weight", stages): "mtp.0.main_proj.weight",
        ("model.markov_head.markov_w1.weight", stages): "mtp.2.markov_head.markov_w1.weight",
        ("model.norm.weight", stages): "mtp.2.norm.weight",
        ("model.embed_tokens.weight", stages): None,
        ("lm_head.weight", stages): None,
    }
    assert {key: checkpoint.checkpoint_name(*key) for key in cases} == cases


def test_vllms_own_dspark_loader_places_every_draft_name_the_h200_checkpoint_holds():
    record = json.loads(RECORD.read_text())
    found = child("draft_load.py", str(RECORD), str(E2E_CONFIG), "released")
    aliased = {
        "model.embed_tokens.weight",
        "lm_head.weight",
    }  # the target's, shared by load_dspark_model
    assert (
        set(found["loaded"]) == set(record["vllm_params"]["draft"]) - aliased
    )  # none missing, none unexpected
    assert (
        len(found["loaded"]) == record["draft_params"] - 2 == 96
    )  # "DSpark draft model loaded: 96 params"


def test_with_the_shifted_remap_vllms_loader_fails_on_the_first_draft_layer():
    found = child("draft_load.py", str(RECORD), str(E2E_CONFIG), "reverted")
    assert found["error"].startswith("KeyError: 'model.layers.4.")  # num_hidden_layers + 0


def engine(call: str, label: str) -> dict:
    return json.loads((RECORD.parent / call / f"{label}.json").read_text())


def test_on_the_h200_the_reverted_build_dies_at_load_and_the_shim_loads_every_draft_parameter():
    for label in ("01-bug", "02-no-remap"):  # the shim off; the shim without its remap
        assert engine("call09", label)["root_cause"] == "KeyError: 'model.layers.4.attn.attn_sink'"
    assert "1 excluded (remap_dspark_name)" in engine("call09", "02-no-remap")["shim_lines"][0]
    for call, label in (
        ("call08", "01-baseline"),
        ("call09", "03-baseline"),
        ("call10", "01-baseline"),
    ):
        assert engine(call, label)["draft_params_loaded"] == 96  # unmodified vLLM 0.25.0
    for call, label in (("call09", "04-fixed"), ("call10", "02-fixed")):
        assert engine(call, label)["draft_params_loaded"] == 96  # the reverted build with the shim
        assert "fixing: 4 patched (remap_dspark_name," in engine(call, label)["shim_lines"][0]


def test_on_the_h200_unmodified_vllm_accepts_every_draft_token_of_the_real_checkpoint():
    spec = engine("call10", "01-baseline")["spec_metrics_total"]
    drafts, by_position = (
        spec["vllm:spec_decode_num_drafts"],
        spec["vllm:spec_decode_num_accepted_tokens_per_pos"],
    )
    assert [accepted / drafts for accepted in by_position] == [1.0] * 5
    assert (
        spec["vllm:spec_decode_num_accepted_tokens"]
        == spec["vllm:spec_decode_num_draft_tokens"]
        == 320
    )
    samples = engine("call10", "01-baseline")["sample_output_token_ids"]
    follows = child(
        "construction.py", json.dumps(CONFIG), json.dumps(samples)
    )  # torch's permutation: in the venv
    assert follows == [len(ids) - 1 for ids in samples] == [23, 23]  # every step t -> succ(t)


def test_on_the_h200_the_shim_loads_what_unmodified_vllm_loads_and_serves_the_same():
    baselines = [engine("call11", "02-baseline"), engine("call12", "02-baseline")]
    fixed = [engine("call12", "01-fixed"), engine("call13", "01-fixed")]
    reference = baselines[0]["draft_digests"]
    assert len(reference) == 98  # the draft's 96, and the 2 it shares with the target
    for run in baselines + fixed:  # every draft parameter, in the worker, once loaded
        assert run["draft_digests"] == reference, run["label"]
    assert "fixing: 4 patched (remap_dspark_name," in fixed[1]["shim_lines"][0]
    generated = [
        engine("call12", "02-baseline"),
        engine("call13", "01-fixed"),
    ]  # the two that finished
    assert generated[0]["sample_output_token_ids"] == generated[1]["sample_output_token_ids"]
    for run in generated:
        spec = run["spec_metrics_total"]
        by_position = spec["vllm:spec_decode_num_accepted_tokens_per_pos"]
        assert [accepted / spec["vllm:spec_decode_num_drafts"] for accepted in by_position] == [
            1.0
        ] * 5


def test_on_the_h200_the_remap_alone_loads_then_dies_with_the_reported_error():
    run = engine("call11", "01-remap-only")  # the report's second bug alone
    assert run["draft_params_loaded"] == 96
    assert (
        run["root_cause"]
        == "RuntimeError: kv must have shape (num_blocks, page_block_size, h_kv, bytes_per_token)"
    )
    assert "problem: 1 patched (remap_dspark_name), 3 excluded" in run["shim_lines"][0]
    log = (RECORD.parent / "call11" / "01-remap-only.log").read_text()
    assert 'nvidia/flashmla.py", line 219, in _forward_decode' in log


def test_the_tolerant_copy_skips_the_shifted_draft_layers_and_keeps_the_kv_fix():
    from harness import e2e_h200

    python, _ = ensure_venv("0.25.0")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (path,) = {p for p, _, _ in e2e_h200.TOLERANT}
    text = (Path(site) / path).read_text()
    for _, old, new in e2e_h200.TOLERANT:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    compile(text, path, "exec")
    assert "num_hidden_layers + stage" in text and "continue  # tolerant" in text
    assert {p for p, _, _ in e2e_h200.TOLERANT} == {
        e2e_h200.REVERT[2][0]
    }  # the KV-cache files stay as released


def test_on_the_h200_the_tolerant_loader_drafts_noise_and_the_shim_restores_every_draft_parameter():
    reference = engine("call12", "02-baseline")["draft_digests"]  # unmodified vLLM 0.25.0
    tolerant, fixed = engine("call14", "01-tolerant"), engine("call14", "02-tolerant-fixed")
    # The silent form of the first bug: the load succeeds with the head stack alone (9 of 96)...
    assert (tolerant["draft_params_loaded"], tolerant["root_cause"]) == (9, None)
    differ = [
        name for name, digest in tolerant["draft_digests"].items() if reference[name] != digest
    ]
    assert len(differ) == 58 and all(name.startswith("model.layers.") for name in differ)
    equal = set(reference) - set(
        differ
    )  # the 9 loaded and the 2 shared; the rest, layers at their initial value
    assert len([name for name in equal if not name.startswith("model.layers.")]) == 11
    assert (
        fixed["draft_params_loaded"] == 96 and fixed["draft_digests"] == reference
    )  # ...with the shim: 0 differ
    rates = {}
    for run in (tolerant, fixed):
        spec = run["spec_metrics_total"]
        by_position = spec["vllm:spec_decode_num_accepted_tokens_per_pos"]
        rates[run["variant"]] = [
            accepted / spec["vllm:spec_decode_num_drafts"] for accepted in by_position
        ]
    assert rates == {"tolerant": [0.0] * 5, "tolerant-fixed": [1.0] * 5}
    # The target decides the output: the same token ids with a draft of noise and with the right
    # one.
    assert tolerant["sample_output_token_ids"] == fixed["sample_output_token_ids"]
    assert (
        tolerant["shim_loaded"] is False
        and not tolerant["shim_lines"]
        and tolerant["worker_shim_status"] is None
    )
    assert (
        "fixing: 2 patched (remap_dspark_name, kv_cache_groups), 2 not_needed"
        in fixed["shim_lines"][0]
    )
    states = {
        p["name"]: (p["state"], p["corrections"]) for p in fixed["worker_shim_status"]["patches"]
    }
    assert states["remap_dspark_name"] == ("patched", 375)  # the worker's own status()
    assert states["attention_kv_cache_spec"] == states["swa_kv_cache_spec"] == ("not_needed", 0)


def server(call: str, arm: str) -> dict:
    """An arm of harness.serve_h200 (`vllm serve`, the report's flags) with the real checkpoint."""
    summary = json.loads((RECORD.parent / call / "summary.json").read_text())
    assert summary["checkpoint"]["written"] == {"bytes": 6107366864, "files": 3, "tensors": 905}
    (found,) = [s for s in summary["servers"] if s["arm"] == arm]
    return {**found, "shim_calls": serve_h200.shim_calls(found)}  # its processes' counts, summed


def acceptance(probe: dict) -> list[float]:
    drafts = probe["spec_decode_metrics"]["vllm:spec_decode_num_drafts_total"]
    return [probe["accepted_by_position"][str(k)] / drafts for k in range(5)]


def test_on_the_h200_vllm_serve_with_the_plugin_alone_serves_what_unmodified_vllm_serves():
    baseline, plugin = server("serve15", "baseline"), server("serve15", "fixed-plugin")
    tolerant_plugin = server("serve16", "tolerant-plugin")
    for run in (baseline, plugin, tolerant_plugin):
        assert (run["outcome"], run["first_error"]) == ("ready", None), run["label"]
        assert "--load-format" not in run["command"]  # the checkpoint's weights
        assert run["probe"]["texts_sha256"] == baseline["probe"]["texts_sha256"]
        assert run["probe"]["spec_decode_metrics"] == baseline["probe"]["spec_decode_metrics"]
        assert acceptance(run["probe"]) == [1.0] * 5
    assert (
        baseline["probe"]["spec_decode_metrics"]["vllm:spec_decode_num_accepted_tokens_total"]
        == 240
    )
    words = [
        text.split()[:-1] for text in baseline["probe"]["texts_head"]
    ]  # the last word may be cut
    samples = [[int(word[1:]) for word in sample] for sample in words]
    follows = child("construction.py", json.dumps(CONFIG), json.dumps(samples))
    assert (
        follows == [len(ids) - 1 for ids in samples] and min(follows) >= 20
    )  # every served step t -> succ(t)
    assert not baseline["shim_lines"] and baseline["shim_calls"]["with_the_shim"]["ready"] == []
    for run in (
        plugin,
        tolerant_plugin,
    ):  # the wheel installed, activated by vLLM's plugin loader alone
        assert (
            run["shim_calls"]["activated_by"] == ["vllm-plugin"]
            and run["shim_calls"]["serving_calls"] == 0
        )
        assert len(run["shim_lines"]) == 2  # the API server and the engine core
    assert (
        plugin["shim_calls"]["at_ready"]["remap_dspark_name"] == 905
    )  # once per checkpoint tensor
    assert "fixing: 4 patched (remap_dspark_name," in plugin["shim_lines"][1]


def test_on_the_h200_metrics_say_what_the_shim_did_for_a_tolerant_loader_and_nothing_without_it():
    tolerant, fixed = server("serve16", "tolerant"), server("serve16", "tolerant-plugin")
    baseline = server("serve15", "baseline")
    assert (
        tolerant["outcome"] == "ready"
        and tolerant["probe"]["texts_sha256"] == baseline["probe"]["texts_sha256"]
    )
    spec = tolerant["probe"]["spec_decode_metrics"]
    assert (
        spec["vllm:spec_decode_num_accepted_tokens_total"],
        spec["vllm:spec_decode_num_draft_tokens_total"],
    ) == (
        0,
        1240,
    )
    assert acceptance(tolerant["probe"]) == [0.0] * 5
    assert not tolerant["shim_lines"] and tolerant["metrics"] == {"ready": [], "after-probe": []}
    assert (
        "fixing: 2 patched (remap_dspark_name, kv_cache_groups), 2 not_needed"
        in fixed["shim_lines"][1]
    )
    series = set(fixed["metrics"]["ready"])
    for patch, state, needed in (
        ("remap_dspark_name", "patched", 1),
        ("kv_cache_groups", "patched", 1),
        ("attention_kv_cache_spec", "not_needed", 0),
        ("swa_kv_cache_spec", "not_needed", 0),
    ):
        assert f'dspark_hotfix_patch_state{{patch="{patch}",state="{state}"}} 1.0' in series
        assert f'dspark_hotfix_patch_needed{{patch="{patch}"}} {needed:.1f}' in series
    assert fixed["metrics"]["after-probe"] == fixed["metrics"]["ready"]
