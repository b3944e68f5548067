"""Greedy parity with transformers `generate` on the zoo's qwen2-llm, fp32: exact tokens and
per-token logprobs, alone, inside a batch of 4 ragged prompts, and when joining mid-decode."""

from __future__ import annotations

import pytest
import torch

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
    (core/cpu_linear.py); the tiny model's are all below the packing threshold, so this is
    the small one (4 layers of 512)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from omnistage.core.cpu_linear import PrepackedLinear

    path = str(zoo("qwen2-llm", size="small"))
    engine = make_engine(path, max_num_seqs=4)
    try:
        packed = [m for m in engine.model.model.modules() if isinstance(m, PrepackedLinear)]
        assert len(packed) == 4 * 7 + 1  # per layer q, k, v, o, gate, up, down; and the tied LM head
        assert {m.rows for m in packed} == {8}  # max_num_seqs 4: packed for batches
        outputs = run(engine, [StageRequest(f"p{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    finally:
        engine.close()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    for i, p in enumerate(PROMPTS):
        assert_matches_reference(final(outputs, f"p{i}"), reference_generate(model, tokenizer(p)["input_ids"], MAX_NEW), p)


def test_prepack_linears_false_keeps_torch_linears(zoo):
    """The deploy field `prepack_linears: false` leaves the small LLM's linears as torch's."""
    engine = make_engine(str(zoo("qwen2-llm", size="small")), max_num_seqs=4, prepack_linears=False)
    try:
        assert sum(type(m) is torch.nn.Linear for m in engine.model.model.modules()) == 4 * 7 + 1
    finally:
        engine.close()
