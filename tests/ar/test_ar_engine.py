"""AREngine behaviour on the zoo's tiny qwen2-llm: streaming, sampling rules, abort, limits."""

from __future__ import annotations

import pytest
import torch

from ar_helpers import PROMPTS, final, make_engine, run
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import Engine, StageRequest, TextPayload

GREEDY = dict(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def engine(llm_path):
    eng = make_engine(llm_path, max_num_seqs=4)
    yield eng
    eng.close()


def generate(engine, prompt, **params) -> TextPayload:
    return final(run(engine, [StageRequest("one", prompt, SamplingParams(**params))]), "one")


@pytest.fixture(scope="module")
def greedy(engine) -> TextPayload:
    return generate(engine, PROMPTS[0], **GREEDY)


# --- streaming -----------------------------------------------------------------------------


def test_implements_the_engine_protocol(engine):
    assert isinstance(engine, Engine) and engine.is_healthy() and not engine.has_unfinished_requests()


def test_stream_of_deltas_adds_up(engine):
    outputs = run(engine, [StageRequest("s", PROMPTS[1], SamplingParams(**GREEDY))])["s"]
    assert len(outputs) == 16  # one output per generated token
    assert sum((o.payload.delta_token_ids for o in outputs), []) == outputs[-1].payload.token_ids
    assert "".join(o.payload.delta_text for o in outputs) == outputs[-1].payload.text
    assert [len(o.payload.token_ids) for o in outputs] == list(range(1, 17))
    last = outputs[-1]
    assert last.finished and last.payload.finish_reason == "length"
    assert last.metrics["num_generated_tokens"] == 16 and last.metrics["num_prompt_tokens"] > 0
    assert 0 <= last.metrics["queue_time"] <= last.metrics["time_to_first_token"]


# --- sampling ------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_alone_and_in_a_batch(engine):
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    alone = generate(engine, PROMPTS[2], max_tokens=12, temperature=1.0, seed=1234).token_ids
    assert generate(engine, PROMPTS[2], max_tokens=12, temperature=1.0, seed=1234).token_ids == alone
    others = [StageRequest(f"o{i}", p, SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9))
              for i, p in enumerate(PROMPTS[:2])]
    outputs = run(engine, [*others, StageRequest("seeded", PROMPTS[2], params)])
    assert final(outputs, "seeded").token_ids == alone
    assert generate(engine, PROMPTS[2], max_tokens=12, temperature=1.0, seed=4321).token_ids != alone


@pytest.mark.parametrize("params", [dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0)])
def test_truncation_to_the_top_token_equals_greedy(engine, greedy, params):
    out = generate(engine, PROMPTS[0], max_tokens=16, temperature=1.0, seed=0, **params)
    assert out.token_ids == greedy.token_ids


def test_sampled_tokens_are_in_vocab(engine, hf_model):
    # ignore_eos: at temperature 1.5 an unseeded sample may draw EOS early, which is not what this checks
    out = generate(engine, PROMPTS[3], max_tokens=16, temperature=1.5, top_k=50, top_p=0.95, min_p=0.01,
                   ignore_eos=True)
    assert len(out.token_ids) == 16 and all(0 <= t < hf_model.config.vocab_size for t in out.token_ids)


def test_repetition_penalty_matches_transformers(engine, greedy, hf_model, tokenizer):
    out = generate(engine, PROMPTS[0], repetition_penalty=1.5, **GREEDY)
    assert out.token_ids != greedy.token_ids
    ids = tokenizer(PROMPTS[0], return_tensors="pt").input_ids
    with torch.inference_mode():
        ref = hf_model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=16, do_sample=False,
                                repetition_penalty=1.5)
    assert out.token_ids == ref[0, ids.shape[1]:].tolist()


# --- stop rules ----------------------------------------------------------------------------


def test_max_tokens(engine):
    out = generate(engine, PROMPTS[0], max_tokens=5, temperature=0.0)
    assert len(out.token_ids) == 5 and out.finish_reason == "length"


def test_stop_token_ids(engine, greedy):
    stop = greedy.token_ids[2]
    out = generate(engine, PROMPTS[0], stop_token_ids=[stop], **GREEDY)
    k = greedy.token_ids.index(stop)
    assert out.token_ids == greedy.token_ids[:k + 1] and out.finish_reason == "stop"


def test_stop_strings_cut_the_text_and_are_never_streamed(engine, greedy):
    text = greedy.text
    assert len(text) > 6
    stop = text[3:6]
    outputs = run(engine, [StageRequest("st", PROMPTS[0], SamplingParams(stop=[stop, "never-seen"], **GREEDY))])["st"]
    out = outputs[-1].payload
    assert out.finish_reason == "stop" and out.text == text[:text.find(stop)]
    assert "".join(o.payload.delta_text for o in outputs) == out.text
    assert len(out.token_ids) < len(greedy.token_ids)


def test_min_tokens_masks_stop_ids(engine, greedy):
    first = greedy.token_ids[0]
    out = generate(engine, PROMPTS[0], stop_token_ids=[first], min_tokens=3, **GREEDY)
    assert first not in out.token_ids[:2] and len(out.token_ids) >= 3
    assert generate(engine, PROMPTS[0], stop_token_ids=[first], **GREEDY).token_ids == [first]


def test_eos_ids_come_from_the_generation_config(engine, tokenizer):
    assert set(engine.model.eos_token_ids) == set(tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"]))


# --- abort ---------------------------------------------------------------------------------


def test_abort_running_and_waiting(engine):
    reqs = [StageRequest(f"a{i}", PROMPTS[i % 4], SamplingParams(**GREEDY)) for i in range(5)]

    def abort(step, eng):
        if step == 0:
            eng.abort_request("a4")  # still waiting: 4 slots
        if step == 3:
            eng.abort_request("a1")
            eng.abort_request("unknown")

    outputs = run(engine, reqs, on_step=abort)
    for rid, n in (("a1", None), ("a4", 0)):
        last = outputs[rid][-1]
        assert last.finished and last.payload.finish_reason == "abort"
        if n is not None:
            assert last.payload.token_ids == []
    assert len(final(outputs, "a1").token_ids) < 16
    assert all(len(final(outputs, f"a{i}").token_ids) == 16 for i in (0, 2, 3))
    assert not engine.has_unfinished_requests()


# --- limits and errors -----------------------------------------------------------------------


def test_max_model_len_errors_name_both_numbers(llm_path, tokenizer):
    eng = make_engine(llm_path, max_model_len=12)
    n = len(tokenizer(PROMPTS[3])["input_ids"])
    with pytest.raises(ValueError, match=rf"{n} tokens.*max_model_len=12"):
        eng.add_request(StageRequest("long", PROMPTS[3], SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match=r"max_tokens \(16\).*max_model_len=12"):
        eng.add_request(StageRequest("budget", PROMPTS[2], SamplingParams(max_tokens=16)))
    # max_tokens=None: generate until max_model_len
    out = final(run(eng, [StageRequest("fill", PROMPTS[2], SamplingParams(max_tokens=None, temperature=0))]), "fill")
    assert len(tokenizer(PROMPTS[2])["input_ids"]) + len(out.token_ids) == 12 and out.finish_reason == "length"
    with pytest.raises(ValueError, match=r"max_model_len=4096.*max_position_embeddings=2048"):
        make_engine(llm_path, max_model_len=4096)


def test_max_num_seqs_bounds_the_batch(llm_path, engine):
    eng = make_engine(llm_path, max_num_seqs=2)
    reqs = [StageRequest(f"m{i}", p, SamplingParams(max_tokens=6, temperature=0)) for i, p in enumerate(PROMPTS)]
    for r in reqs:
        eng.add_request(r)
    seen = {}
    while eng.has_unfinished_requests():
        outs = eng.step()
        assert len(outs) <= 2
        for o in outs:
            seen.setdefault(o.request_id, []).append(o)
    expected = {f"m{i}": generate(engine, p, max_tokens=6, temperature=0).token_ids for i, p in enumerate(PROMPTS)}
    assert {rid: outs[-1].payload.token_ids for rid, outs in seen.items()} == expected


def test_bad_requests_are_rejected_at_add(engine):
    with pytest.raises(ValueError, match="prompt_tokens"):
        engine.add_request(StageRequest("x", {"prompt_tokens": [1, 2]}))
    with pytest.raises(ValueError, match="exactly one"):
        engine.add_request(StageRequest("x", {"prompt": "a", "prompt_token_ids": [1]}))
    with pytest.raises(TypeError, match="SamplingParams"):
        engine.add_request(StageRequest("x", "a", params={"temperature": 0}))
    with pytest.raises(ValueError, match="empty"):
        engine.add_request(StageRequest("x", {"prompt_token_ids": []}))
    engine.add_request(StageRequest("dup", "a", SamplingParams(max_tokens=1)))
    with pytest.raises(ValueError, match="already running"):
        engine.add_request(StageRequest("dup", "a"))
    run(engine)


def test_default_sampling_params_come_from_the_deploy_config(llm_path):
    eng = make_engine(llm_path, default_sampling_params={"max_tokens": 3, "temperature": 0.0})
    out = final(run(eng, [StageRequest("d", PROMPTS[0])]), "d")
    assert len(out.token_ids) == 3
    with pytest.raises(ValueError, match="max_new_tokens"):
        make_engine(llm_path, default_sampling_params={"max_new_tokens": 3})
