"""Per-request LoRA on the native AR engine (ar/lora.py), on the zoo's tiny qwen2-llm with two peft
adapters written by peft's `save_pretrained` (random non-zero A and B): greedy tokens and logprobs
equal transformers + peft (`PeftModel.from_pretrained`) for each adapter alone, and a batch mixing
adapter A, adapter B (loaded by path on first use) and no adapter runs as ONE forward per step whose
rows each equal their reference; the prefix cache never hands one adapter's KV blocks to another;
an adapter that does not fit is refused naming `lora.path` and loads nothing (and weight updates and
sleep level 2, which load by the checkpoint's layer names, are refused); the LRU set of
`max_loras` unloads the cold adapter, and a request waits while every slot is in use."""

from __future__ import annotations

import pytest
import torch

from ar_helpers import PROMPTS, assert_matches_reference, final, make_engine, reference_generate, run
from omnistage.ar.lora import LoraLinear
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.errors import RequestError
from omnistage.core.types import StageRequest
from omnistage.testing.lora import build_peft_lora

NEW_TOKENS = 6
TARGETS = {"a": ("q_proj", "v_proj", "lm_head"), "b": ("k_proj", "o_proj", "gate_proj", "down_proj")}
"""A adapts attention and the (tied) LM head, whose input is one row per sequence; B the other
attention layers and the MLP."""


@pytest.fixture(scope="module")
def adapters(llm_path, tmp_path_factory) -> dict[str, str]:
    out = tmp_path_factory.mktemp("peft")
    return {name: str(build_peft_lora(llm_path, out / name, targets, seed=i + 1))
            for i, (name, targets) in enumerate(TARGETS.items())}


@pytest.fixture(scope="module")
def references(llm_path, tokenizer, adapters) -> dict:
    """(greedy tokens, logprobs) of `generate` for each (adapter or None, prompt index)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    refs = {}
    for name in (None, *adapters):
        model = AutoModelForCausalLM.from_pretrained(llm_path, dtype=torch.float32).eval()
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters[name]).eval()
        for i, prompt in enumerate(PROMPTS[:3]):
            refs[name, i] = reference_generate(model, tokenizer(prompt).input_ids, NEW_TOKENS)
    return refs


@pytest.fixture(scope="module")
def engine(llm_path, adapters):
    engine = make_engine(llm_path, lora_adapters={"a": adapters["a"]}, max_loras=1, max_num_seqs=8)
    yield engine
    engine.close()


def request(tokenizer, rid: str, i: int, lora: dict | None = None) -> StageRequest:
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, logprobs=0, ignore_eos=True, lora=lora)
    return StageRequest(rid, {"prompt_token_ids": tokenizer(PROMPTS[i]).input_ids}, params)


def record_groups(engine) -> list[int]:
    """How many (adapter, scale) groups each forward from now on has (0: no adapter)."""
    counts, table = [], engine.runner.adapters
    begin = table.begin

    def recording(inp):
        begin(inp)
        counts.append(0 if table.batch is None else len(table.batch.adapters))

    table.begin = recording
    return counts


def test_each_adapter_alone_equals_peft(engine, tokenizer, adapters, references):
    for name in adapters:
        assert references[name, 1][0] != references[None, 1][0]  # the adapter changes the greedy tokens
    out = run(engine, [request(tokenizer, "a", 1, {"name": "a"})])
    assert_matches_reference(final(out, "a"), references["a", 1], "adapter a")
    out = run(engine, [request(tokenizer, "b", 1, {"name": "b", "path": adapters["b"]})])  # by path, first use
    assert_matches_reference(final(out, "b"), references["b", 1], "adapter b")
    assert engine.list_lora_adapters() == [
        {"name": "a", "path": adapters["a"], "loaded": True, "source": "deploy"},
        {"name": "b", "path": adapters["b"], "loaded": True, "source": "path"}]


@pytest.mark.parametrize("layout", ["in place", "gathered"])
def test_a_mixed_batch_shares_each_forward_and_equals_each_request_alone(engine, llm_path, tokenizer, adapters,
                                                                          references, layout):
    if layout == "gathered":  # decode steps padded [B, 1], not packed
        engine = make_engine(llm_path, lora_adapters={"a": adapters["a"]}, max_loras=1, max_num_seqs=8,
                             paged_attention="gather")
    groups = record_groups(engine)
    b = {"name": "b", "path": adapters["b"]}
    mixed = [request(tokenizer, "a0", 0, {"name": "a"}), request(tokenizer, "b1", 1, b), request(tokenizer, "n2", 2),
             request(tokenizer, "b0", 0, b), request(tokenizer, "z2", 2, {"name": "a", "scale": 0.0})]
    out = run(engine, mixed)
    for rid, name, i in (("a0", "a", 0), ("b1", "b", 1), ("n2", None, 2), ("b0", "b", 0), ("z2", None, 2)):
        assert_matches_reference(final(out, rid), references[name, i], f"{rid} ({layout})")
    # every forward ran all five rows: a, b, a at scale 0 (three groups) and the adapter-free row
    assert len(groups) == NEW_TOKENS and set(groups) == {3}, groups


def test_the_prefix_cache_keys_blocks_by_adapter(engine, tokenizer, references):
    engine.block_manager.reset_prefix_cache()
    prompt = 3  # four blocks of 16 tokens
    first = final(run(engine, [request(tokenizer, "p1", prompt, {"name": "a"})]), "p1")
    again = run(engine, [request(tokenizer, "p2", prompt, {"name": "a"})])["p2"][-1]
    other = run(engine, [request(tokenizer, "p3", prompt)])["p3"][-1]
    assert again.metrics["num_cached_tokens"] >= 16 and again.payload.token_ids == first.token_ids
    assert other.metrics["num_cached_tokens"] == 0  # same prompt, no adapter: none of a's blocks
    half = run(engine, [request(tokenizer, "p4", prompt, {"name": "a", "scale": 0.5})])["p4"][-1]
    assert half.metrics["num_cached_tokens"] == 0  # the same adapter at another scale: other keys and values


def test_an_adapter_that_does_not_fit_is_refused_naming_lora_path_and_loads_nothing(engine, tokenizer, tmp_path,
                                                                                     adapters):
    import json
    from safetensors.torch import save_file

    before = [(n, sorted(m.adapters)) for n, m in engine.model.model.named_modules() if isinstance(m, LoraLinear)]
    bad = tmp_path / "wide"
    bad.mkdir()
    (bad / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "lora_alpha": 2}))
    prefix = "base_model.model.model.layers.0.self_attn."
    save_file({prefix + "q_proj.lora_A.weight": torch.ones(2, 128), prefix + "q_proj.lora_B.weight": torch.ones(128, 2),
               prefix + "k_proj.lora_A.weight": torch.ones(2, 99), prefix + "k_proj.lora_B.weight": torch.ones(64, 2)},
              str(bad / "adapter_model.safetensors"))
    dora = tmp_path / "dora"
    dora.mkdir()
    (dora / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2, "use_dora": True}))
    torn = tmp_path / "torn"  # a weights file cut short
    torn.mkdir()
    (torn / "adapter_config.json").write_text(json.dumps({"peft_type": "LORA", "r": 2}))
    (torn / "adapter_model.safetensors").write_bytes((bad / "adapter_model.safetensors").read_bytes()[:50])
    cases = {str(torn): "cannot load adapter 'wide' from .*torn: SafetensorError",
             str(bad): r"k_proj: lora_A \[2, 99\] and lora_B \[64, 2\] do not fit its 128 inputs",
             str(dora): "uses DoRA, which this engine does not apply",
             str(tmp_path / "missing"): "no peft adapter folder", str(tmp_path): "has no adapter_config.json"}
    for path, message in cases.items():
        with pytest.raises(RequestError, match=message) as info:
            engine.add_request(request(tokenizer, "bad", 0, {"name": "wide", "path": path}))
        assert info.value.param == "lora.path"
    with pytest.raises(RequestError, match="unknown adapter 'nope'") as info:
        engine.add_request(request(tokenizer, "bad", 0, {"name": "nope"}))
    assert info.value.param == "lora.name"
    after = [(n, sorted(m.adapters)) for n, m in engine.model.model.named_modules() if isinstance(m, LoraLinear)]
    assert after == before and "wide" not in engine.runner.adapters.ids and not engine.has_unfinished_requests()
    # LoRA layers wrap the checkpoint's linear layers: their weights are no longer under its names
    with pytest.raises(RuntimeError, match="update_weights: not with lora_adapters"):
        engine.update_weights(tensors={})
    with pytest.raises(RuntimeError, match="sleep level 2: not with lora_adapters"):
        engine.sleep(2)


def test_max_loras_unloads_the_cold_adapter_and_a_request_waits_for_a_slot(engine, tokenizer, references, tmp_path,
                                                                           llm_path):
    engine.unload_lora_adapter("b")
    assert [a["name"] for a in engine.list_lora_adapters()] == ["a"]
    copy = {name: str(build_peft_lora(llm_path, tmp_path / name, TARGETS["b"], seed=2)) for name in "cd"}
    first = request(tokenizer, "c", 1, {"name": "c", "path": copy["c"]})
    second = request(tokenizer, "d", 1, {"name": "d", "path": copy["d"]})  # one slot, in use by c: d waits
    engine.add_request(first)
    engine.add_request(second)
    assert [n for n in engine.runner.adapters.ids] == ["a", "c"]
    out = run(engine)
    assert_matches_reference(final(out, "c"), references["b", 1], "c")  # the same matrices as b
    assert_matches_reference(final(out, "d"), references["b", 1], "d")
    assert {a["name"]: a["loaded"] for a in engine.list_lora_adapters()} == {"a": True, "c": False, "d": True}


def test_adapters_on_fused_packed_layers_equal_peft(zoo, tmp_path):
    """On the small qwen2 (above the packing threshold) q/k/v and gate/up are slices of one packed
    matmul each (core/cpu_linear.py): an adapter on some siblings adds its delta to their columns
    only, and a batch mixing both adapters and none still equals transformers + peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.core.cpu_linear import PackedSlice

    path = str(zoo("qwen2-llm", size="small"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    adapters = {name: str(build_peft_lora(path, tmp_path / name, targets, seed=i + 1))
                for i, (name, targets) in enumerate(TARGETS.items())}
    engine = make_engine(path, lora_adapters=adapters, max_loras=2, max_num_seqs=4)
    try:
        attn = engine.model.model.model.layers[0].self_attn
        assert isinstance(attn.q_proj, LoraLinear) and isinstance(attn.q_proj.base, PackedSlice)
        assert isinstance(attn.k_proj.base, PackedSlice) and attn.k_proj.base.fused is attn.q_proj.base.fused
        rows = [("a0", "a", 0), ("b1", "b", 1), ("n2", None, 2)]
        out = run(engine, [request(tokenizer, rid, i, name and {"name": name}) for rid, name, i in rows])
    finally:
        engine.close()
    for rid, name, i in rows:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        if name is not None:
            model = PeftModel.from_pretrained(model, adapters[name]).eval()
        want = reference_generate(model, tokenizer(PROMPTS[i]).input_ids, NEW_TOKENS)
        assert_matches_reference(final(out, rid), want, f"{rid} on the small model")
