"""Greedy parity with transformers `generate` on the zoo's qwen2-llm, fp32: exact tokens and
per-token logprobs, alone, inside a batch of 4 ragged prompts, and when joining mid-decode."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import StageRequest
from ar_helpers import PROMPTS, assert_matches_reference, final, make_engine, reference_generate, run

MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, logprobs=0)


@pytest.fixture(scope="module")
def engine(llm_path):
    eng = make_engine(llm_path, max_num_seqs=4)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def reference(hf_model, tokenizer) -> list[tuple[list[int], list[float]]]:
    """`generate` for each prompt alone, with the checkpoint's generation config (eos ids included):
    (tokens, their logprobs)."""
    return [reference_generate(hf_model, tokenizer(p)["input_ids"], MAX_NEW) for p in PROMPTS]


def test_alone(engine, reference):
    for i, p in enumerate(PROMPTS):
        outputs = run(engine, [StageRequest(f"alone{i}", p, GREEDY)])
        assert_matches_reference(final(outputs, f"alone{i}"), reference[i], p)


def test_batch_of_four_submitted_together(engine, reference):
    outputs = run(engine, [StageRequest(f"b{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    for i in range(4):
        assert_matches_reference(final(outputs, f"b{i}"), reference[i], PROMPTS[i])


def test_one_joins_mid_decode(engine, reference):
    def join(step, eng):
        if step == 5:
            eng.add_request(StageRequest("late", PROMPTS[3], GREEDY))

    outputs = run(engine, [StageRequest(f"j{i}", p, GREEDY) for i, p in enumerate(PROMPTS[:3])], on_step=join)
    for i in range(3):
        assert_matches_reference(final(outputs, f"j{i}"), reference[i], PROMPTS[i])
    assert_matches_reference(final(outputs, "late"), reference[3], PROMPTS[3])
    # it really joined a running batch: its first token came while the others were mid-way
    assert len(outputs["late"]) < len(outputs["j0"]) + 2


def test_chat_messages_use_the_chat_template(engine, hf_model, tokenizer):
    messages = [{"role": "user", "content": "Please describe the image in one sentence."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    outputs = run(engine, [StageRequest("chat", {"messages": messages}, GREEDY)])
    payload = final(outputs, "chat")
    assert_matches_reference(payload, reference_generate(hf_model, ids[0].tolist(), MAX_NEW))
    assert payload.text == tokenizer.decode(payload.token_ids, skip_special_tokens=True)


def test_hidden_states_match_a_full_forward(engine, hf_model, tokenizer):
    """Last-layer hidden states and input embeddings of every fed position (prompt + all generated
    tokens but the last) equal a transformers forward over the same tokens, inside a ragged batch."""
    reqs = [StageRequest(f"h{i}", {"prompt": p, "return_hidden_states": True, "return_input_embeds": i == 1}, GREEDY)
            for i, p in enumerate(PROMPTS[:3])]
    outputs = run(engine, reqs)
    for i, p in enumerate(PROMPTS[:3]):
        payload = final(outputs, f"h{i}")
        prompt_ids = tokenizer(p)["input_ids"]
        fed = torch.tensor([prompt_ids + payload.token_ids[:-1]])
        with torch.inference_mode():
            ref = hf_model(fed, output_hidden_states=True).hidden_states
        assert payload.hidden_states.shape == (fed.shape[1], hf_model.config.hidden_size)
        torch.testing.assert_close(payload.hidden_states, ref[-1][0], atol=1e-5, rtol=1e-5)
        if i == 1:
            torch.testing.assert_close(payload.extras["input_embeds"], ref[0][0])
        else:
            assert "input_embeds" not in payload.extras
        # streamed deltas add up to the whole
        deltas = [o.payload.extras["delta_hidden_states"] for o in outputs[f"h{i}"]]
        assert deltas[0].shape[0] == len(prompt_ids) and all(d.shape[0] == 1 for d in deltas[1:])
        torch.testing.assert_close(torch.cat(deltas), payload.hidden_states)
    assert all(o.payload.hidden_states is None for o in outputs["h0"][:-1])  # all rows come once, at the end


def test_small_model_with_prepacked_linears(zoo):
    """On CPU the generic LLM's linears run through oneDNN with prepacked weights
    (core/cpu_linear.py), q/k/v and gate/up each as one fused matrix; the tiny model's are all
    below the packing threshold, so this is the small one (4 layers of 512)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.core.cpu_linear import FusedPrepackedLinear, PackedSlice, PrepackedLinear

    path = str(zoo("qwen2-llm", size="small"))
    engine = make_engine(path, max_num_seqs=4)
    try:
        modules = list(engine.model.model.modules())
        packed = [m for m in modules if isinstance(m, PrepackedLinear)]
        fused = [m for m in modules if isinstance(m, FusedPrepackedLinear)]
        assert len(packed) == 4 * 2 + 1  # per layer o and down; and the tied LM head
        assert len(fused) == 4 * 2 and sum(isinstance(m, PackedSlice) for m in modules) == 4 * 5  # qkv, gate-up
        assert {m.rows for m in packed + fused} == {8}  # max_num_seqs 4: packed for batches
        outputs = run(engine, [StageRequest(f"p{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    finally:
        engine.close()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for i, p in enumerate(PROMPTS):
        assert_matches_reference(final(outputs, f"p{i}"), reference_generate(model, tokenizer(p)["input_ids"], MAX_NEW), p)


class _CountPackedMatmuls(TorchDispatchMode):
    """Counts oneDNN's packed linear calls (the op `PrepackedLinear` and `FusedPrepackedLinear` run)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.mkldnn._linear_pointwise.default:
            self.num_calls += 1
        return func(*args, **(kwargs or {}))


def test_small_model_makes_four_packed_matmuls_per_layer(zoo):
    """Like vLLM's CPU backend, a layer makes 4 matmuls (fused q/k/v, o, fused gate/up, down),
    not transformers' 7: counted over a prefill step and a decode step (the LM head is one more)."""
    path = str(zoo("qwen2-llm", size="small"))
    engine = make_engine(path, max_num_seqs=4)
    try:
        num_layers = engine.model.num_layers
        engine.add_request(StageRequest("c", PROMPTS[0], SamplingParams(max_tokens=4, temperature=0.0)))
        for _ in range(2):  # the prompt, then one decode
            with _CountPackedMatmuls() as counter:
                engine.step()
            assert counter.num_calls == 4 * num_layers + 1
        run(engine)
    finally:
        engine.close()


def test_small_model_fused_layers_wake_from_sleep_level_2_and_take_a_partial_update(zoo):
    """The fused q/k/v and gate/up matrices are read back after sleep level 2, and an update of
    some of their parts by name (`q_proj.weight`, `k_proj.bias`, `up_proj.weight`) keeps the
    other parts: greedy tokens and logprobs equal `generate` with the same weights."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = str(zoo("qwen2-llm", size="small"))
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = tokenizer(PROMPTS[1])["input_ids"]
    before = reference_generate(model, ids, MAX_NEW)
    names = [n for n in model.state_dict() if n.endswith(("layers.1.self_attn.q_proj.weight",
                                                          "layers.1.self_attn.k_proj.bias", "layers.2.mlp.up_proj.weight"))]
    update = {name: torch.randn_like(model.state_dict()[name]) * 0.05 for name in names}
    model.load_state_dict(update, strict=False)
    after = reference_generate(model, ids, MAX_NEW)
    assert after[0] != before[0]
    engine = make_engine(path, max_num_seqs=4)
    try:
        assert engine.sleep(2) > 0
        engine.wake_up()
        assert_matches_reference(final(run(engine, [StageRequest("woke", PROMPTS[1], GREEDY)]), "woke"), before, "woke")
        assert engine.update_weights(tensors=update) == 3
        assert_matches_reference(final(run(engine, [StageRequest("new", PROMPTS[1], GREEDY)]), "new"), after, "new")
    finally:
        engine.close()


def test_prepack_linears_false_keeps_torch_linears(zoo):
    """The deploy field `prepack_linears: false` leaves the small LLM's linears as torch's."""
    engine = make_engine(str(zoo("qwen2-llm", size="small")), max_num_seqs=4, prepack_linears=False)
    try:
        assert sum(type(m) is torch.nn.Linear for m in engine.model.model.modules()) == 4 * 7 + 1
    finally:
        engine.close()
