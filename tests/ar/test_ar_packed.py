"""The packed forward (decodes and prompt chunks of one step end to end in one row) on the zoo's
tiny qwen2-llm, fp32: a mixed step is one forward, and tokens, hidden states and a sliding
window equal transformers'. These engines gather the KV blocks (`paged_attention: gather`, the
path without the in-place kernel, and the one a model with sliding windows takes);
test_paged_attention.py has the kernel's."""

from __future__ import annotations

import shutil

import pytest
import torch

from ar_helpers import (assert_matches_reference, final, join_two_long_prompts, make_engine, record_packed_chunks,
                        reference_generate, run)
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import StageRequest
from test_ar_paged import assert_no_leak, token_prompts

GREEDY = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0)
GATHER = {"paged_attention": "gather"}


def record_forwards(engine) -> list[tuple[bool, int, int]]:
    """(packed, decode rows, prompt rows) of every forward the engine runs from now on."""
    calls, forward = [], engine.model.forward

    def spy(batch, cache):
        prompts = sum(n > 1 or s < seq.num_prompt_tokens
                      for seq, s, n in zip(batch.seqs, batch.context_lens, batch.query_lens))
        calls.append((batch.packed, len(batch.seqs) - prompts, prompts))
        return forward(batch, cache)

    engine.model.forward = spy
    return calls


def generate(model, ids: list[int], max_new: int) -> list[int]:
    x = torch.tensor([ids])
    with torch.inference_mode():
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False)
    return out[0, len(ids):].tolist()


def test_a_mixed_step_is_one_packed_forward_with_the_same_tokens(llm_path, hf_model):
    engine = make_engine(llm_path, **GATHER, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False)
    calls = record_forwards(engine)
    short, *longs = token_prompts(1, 5, seed=3) + token_prompts(2, 40, seed=4)
    steps: list[int] = []
    outputs = join_two_long_prompts(engine, short, longs, GREEDY, steps=steps)
    assert len(calls) == len(steps)  # one forward per step
    mixed = [packed for packed, decodes, prompts in calls if decodes and prompts]
    assert len(mixed) >= 5 and all(mixed)  # 80 prompt tokens in chunks beside the stream
    assert not any(packed for packed, d, p in calls if not p or (p == 1 and not d))  # decodes / one prompt: padded
    assert_matches_reference(final(outputs, "s"), reference_generate(hf_model, short, 24))
    for name, p in zip("ab", longs):
        assert_matches_reference(final(outputs, name), reference_generate(hf_model, p, 10))
    assert_no_leak(engine)
    engine.close()


def test_packed_hidden_states_equal_the_models(llm_path, hf_model):
    # "s" decodes with hidden states while "a" (whole, with hidden states) and "b" (chunked) prefill
    engine = make_engine(llm_path, **GATHER, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False)
    calls = record_forwards(engine)
    short, mid, long = token_prompts(1, 5, seed=5) + token_prompts(1, 12, seed=6) + token_prompts(1, 33, seed=7)
    wants = {"return_hidden_states": True}

    def join(step, eng):
        if step == 2:
            eng.add_request(StageRequest("a", {"prompt_token_ids": mid, **wants}, GREEDY))
            eng.add_request(StageRequest("b", {"prompt_token_ids": long}, GREEDY))

    outputs = run(engine, [StageRequest("s", {"prompt_token_ids": short, **wants}, GREEDY)], on_step=join)
    assert calls[2] == (True, 1, 2)  # s's decode, a's whole prompt and b's first chunk: one forward
    for name, prompt in (("s", short), ("a", mid)):
        payload = final(outputs, name)
        fed = prompt + payload.token_ids[:-1]  # the last token is never fed back
        with torch.inference_mode():
            want = hf_model(torch.tensor([fed]), output_hidden_states=True).hidden_states[-1][0]
        got = torch.cat([o.payload.extras["delta_hidden_states"] for o in outputs[name]])
        assert torch.allclose(got, want, atol=1e-5) and torch.equal(payload.hidden_states, got)
        assert_matches_reference(payload, reference_generate(hf_model, prompt, 10))
    assert_matches_reference(final(outputs, "b"), reference_generate(hf_model, long, 10))
    engine.close()


def test_a_chunk_after_fewer_cached_keys_than_its_own_equals_generate(llm_path, hf_model):
    # budget 32: s's decode, "a" (20 tokens) and b's first 11 in one step; then b's other 29 after its
    # 11 cached keys, which attention runs as the last rows of a causal square (packed_attention._causal_rows)
    engine = make_engine(llm_path, **GATHER, max_num_seqs=4, max_num_batched_tokens=32, enable_prefix_caching=False)
    chunks = record_packed_chunks(engine)
    short, a, b = token_prompts(1, 5, seed=9) + token_prompts(1, 20, seed=10) + token_prompts(1, 40, seed=11)
    outputs = join_two_long_prompts(engine, short, [a, b], LOGPROBS)
    assert (11, 29) in chunks
    assert_matches_reference(final(outputs, "s"), reference_generate(hf_model, short, 24))
    for name, p in (("a", a), ("b", b)):
        assert_transformers_logprobs(hf_model, p, final(outputs, name))
    assert_no_leak(engine)
    engine.close()


def test_a_lone_prompt_after_a_short_prefix_hit_is_packed_and_equals_generate(llm_path, hf_model):
    # 16 cached keys (one block of the shared prefix), then a 30-token rest alone in its step
    engine = make_engine(llm_path, **GATHER, max_num_seqs=4, enable_prefix_caching=True)
    calls = record_forwards(engine)
    prefix = token_prompts(1, 20, seed=12)[0]
    warm, hit = token_prompts(1, 4, seed=13, prefix=prefix) + token_prompts(1, 26, seed=14, prefix=prefix)
    run(engine, [StageRequest("warm", {"prompt_token_ids": warm}, GREEDY)])
    calls.clear()
    outputs = run(engine, [StageRequest("hit", {"prompt_token_ids": hit}, LOGPROBS)])
    assert outputs["hit"][-1].metrics["num_cached_tokens"] == 16
    assert calls[0] == (True, 0, 1)  # the lone prompt row, packed
    assert_transformers_logprobs(hf_model, hit, final(outputs, "hit"))
    assert_no_leak(engine)
    engine.close()


LOGPROBS = SamplingParams(max_tokens=10, temperature=0.0, logprobs=0)


def assert_transformers_logprobs(hf_model, prompt, payload) -> None:
    """`generate`'s greedy tokens, and each one's logprob within 1e-4 of transformers' (the tokens
    alone hardly move on the tiny model when attention goes wrong; their logprobs do)."""
    assert payload.token_ids == generate(hf_model, prompt, 10)
    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt + payload.token_ids[:-1]])).logits[0, len(prompt) - 1:]
    want = logits.log_softmax(-1).gather(1, torch.tensor(payload.token_ids)[:, None])[:, 0]
    assert [lp.logprob for lp in payload.logprobs] == pytest.approx(want.tolist(), abs=1e-4)


@pytest.fixture(scope="module")
def sliding_llm(llm_path, tmp_path_factory):
    """The tiny qwen2-llm with its first layer on an 8-token sliding window (random weights)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(llm_path)
    config.layer_types = ["sliding_attention"] + ["full_attention"] * (config.num_hidden_layers - 1)
    config.sliding_window, config.use_sliding_window, config.max_window_layers = 8, True, 1
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()
    path = tmp_path_factory.mktemp("sliding-llm")
    model.save_pretrained(path)
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        src = f"{llm_path}/{f}"
        if shutil.os.path.exists(src):
            shutil.copy(src, path / f)
    return str(path), model


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_sliding_window_layers_equal_generate(sliding_llm, packed):
    path, model = sliding_llm
    engine = make_engine(path, **GATHER, max_num_seqs=4, max_num_batched_tokens=16, enable_prefix_caching=False)
    if not packed:  # every step in the padded layouts, as a model without packing runs
        engine.scheduler.packed = engine.model.supports_packed_batch = False
    calls = record_forwards(engine)
    short, *longs = token_prompts(1, 5, seed=7) + token_prompts(2, 30, seed=8)
    outputs = join_two_long_prompts(engine, short, longs, GREEDY)
    assert any(c[0] for c in calls) == packed
    assert_matches_reference(final(outputs, "s"), reference_generate(model, short, 24))
    for name, p in zip("ab", longs):
        assert_matches_reference(final(outputs, name), reference_generate(model, p, 10))
    engine.close()
