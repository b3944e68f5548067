"""The paged KV cache on the zoo's tiny qwen2-llm, fp32: greedy tokens equal transformers
`generate` with prefix-cache hits, chunked prefill and preemption, and no block leaks
after requests end, are aborted or fail."""

from __future__ import annotations

import random

import pytest
import torch

from ar_helpers import assert_matches_reference, final, make_engine, reference_generate, run
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import StageRequest

MAX_NEW = 12
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0, logprobs=0)


def token_prompts(n: int, length: int, seed: int, prefix: list[int] = ()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, 1000) for _ in range(length)] for _ in range(n)]


@pytest.fixture(scope="module")
def reference(hf_model):
    """`ref(ids, max_new)` -> `generate`'s (tokens, their logprobs), computed once per prompt."""
    cache: dict[tuple, tuple[list[int], list[float]]] = {}

    def ref(ids: list[int], max_new: int = MAX_NEW) -> tuple[list[int], list[float]]:
        key = (tuple(ids), max_new)
        if key not in cache:
            cache[key] = reference_generate(hf_model, ids, max_new)
        return cache[key]

    return ref


def assert_no_leak(engine) -> None:
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.scheduler.running and not engine.scheduler.waiting


def requests(prompts, prefix="r", params=GREEDY):
    return [StageRequest(f"{prefix}{i}", {"prompt_token_ids": p}, params) for i, p in enumerate(prompts)]


def test_prefix_hits_compute_only_the_rest_and_keep_the_tokens(llm_path, reference):
    engine = make_engine(llm_path, max_num_seqs=4)
    shared = token_prompts(1, 40, seed=1)[0]  # two full blocks of 16 and a bit
    first, *others = token_prompts(4, 9, seed=2, prefix=shared)
    out = run(engine, requests([first], "warm"))
    assert out["warm0"][-1].metrics["num_cached_tokens"] == 0
    outputs = run(engine, requests(others, "hit"))
    for i, p in enumerate(others):
        assert_matches_reference(final(outputs, f"hit{i}"), reference(p))
        assert outputs[f"hit{i}"][-1].metrics["num_cached_tokens"] == 32
    assert_no_leak(engine)
    engine.close()


def test_prefix_caching_off_computes_everything(llm_path, reference):
    engine = make_engine(llm_path, max_num_seqs=2, enable_prefix_caching=False)
    p = token_prompts(1, 40, seed=1)[0]
    run(engine, requests([p], "a"))
    out = run(engine, requests([p], "b"))
    assert out["b0"][-1].metrics["num_cached_tokens"] == 0
    assert_matches_reference(final(out, "b0"), reference(p))
    engine.close()


def test_chunked_prefill_keeps_the_tokens_and_the_running_stream_going(llm_path, reference):
    engine = make_engine(llm_path, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=False)
    short, long_a, long_b = token_prompts(1, 5, seed=3) + token_prompts(2, 30, seed=4)
    steps_with_a_token: list[int] = []

    def join(step, eng):
        if step == 2:
            eng.add_request(StageRequest("a", {"prompt_token_ids": long_a}, GREEDY))
            eng.add_request(StageRequest("b", {"prompt_token_ids": long_b}, GREEDY))

    outputs: dict = {}
    engine.add_request(StageRequest("s", {"prompt_token_ids": short}, SamplingParams(max_tokens=20, temperature=0, logprobs=0)))
    step = 0
    while engine.has_unfinished_requests():
        join(step, engine)
        for o in engine.step():
            outputs.setdefault(o.request_id, []).append(o)
            if o.request_id == "s":
                steps_with_a_token.append(step)
        step += 1
    assert_matches_reference(final(outputs, "a"), reference(long_a))
    assert_matches_reference(final(outputs, "b"), reference(long_b))
    assert_matches_reference(final(outputs, "s"), reference(short, 20))
    # 60 prompt tokens in chunks of <= 7 beside the stream: the stream emitted at every step
    assert steps_with_a_token == list(range(20))
    assert_no_leak(engine)
    engine.close()


def test_preemption_recomputes_and_keeps_the_tokens(llm_path, reference):
    # room for 6 blocks of 16 tokens: 4 sequences of 40 + 12 tokens (4 blocks each) cannot all run
    engine = make_engine(llm_path, max_num_seqs=4, max_model_len=64, enable_prefix_caching=False,
                         kv_cache_memory=6 * engine_block_bytes(llm_path))
    assert engine.block_manager.num_blocks == 6
    prompts = token_prompts(4, 40, seed=5)
    outputs = run(engine, requests(prompts))
    assert engine.scheduler.num_preemptions > 0
    assert sum(outputs[f"r{i}"][-1].metrics["num_preemptions"] for i in range(4)) == engine.scheduler.num_preemptions
    for i, p in enumerate(prompts):
        assert_matches_reference(final(outputs, f"r{i}"), reference(p))
        assert len(outputs[f"r{i}"]) == MAX_NEW  # one output per token, none repeated by the recompute
    assert_no_leak(engine)
    engine.close()


def engine_block_bytes(llm_path) -> int:
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(llm_path)
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 16 * 4  # K+V, fp32


def test_kv_cache_memory_too_small_for_one_sequence_is_refused(llm_path):
    with pytest.raises(ValueError, match="kv_cache_memory"):
        make_engine(llm_path, max_model_len=64, kv_cache_memory=3 * engine_block_bytes(llm_path))


def test_blocks_come_back_after_aborts_and_failed_forwards(llm_path):
    engine = make_engine(llm_path, max_num_seqs=4)
    prompts = token_prompts(4, 20, seed=6)

    def abort(step, eng):
        if step == 3:
            eng.abort_request("r1")
            eng.abort_request("r3")

    outputs = run(engine, requests(prompts), on_step=abort)
    assert final(outputs, "r1").finish_reason == "abort" and final(outputs, "r0").finish_reason == "length"
    assert_no_leak(engine)

    forward = engine.model.forward
    calls = {"n": 0}

    def failing(batch, cache):
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("boom")
        return forward(batch, cache)

    engine.model.forward = failing
    outputs = run(engine, requests(prompts, "f"))
    assert all(final(outputs, f"f{i}").finish_reason == "abort" for i in range(4))
    assert "boom" in outputs["f0"][-1].error
    assert_no_leak(engine)
    engine.model.forward = forward
    engine.close()


def test_hidden_state_requests_chunk_and_skip_blocks_without_rows(llm_path, hf_model):
    # A request that returns hidden states prefills its 30-token prompt in chunks of the 8-token
    # budget, and all its rows come with the first token. The same prompt's cached blocks hold no
    # rows (a request without hidden states published them), so it reuses none of them
    # (test_ar_block_states.py: the hits on blocks that do).
    engine = make_engine(llm_path, max_num_seqs=2, max_num_batched_tokens=8)
    p = token_prompts(1, 30, seed=7)[0]
    run(engine, requests([p], "warm"))  # the same prompt's blocks are in the prefix cache
    outputs = run(engine, [StageRequest("h", {"prompt_token_ids": p, "return_hidden_states": True},
                                        SamplingParams(max_tokens=4, temperature=0))])
    payload = final(outputs, "h")
    deltas = [o.payload.extras["delta_hidden_states"] for o in outputs["h"]]
    assert deltas[0].shape[0] == 30 and all(d.shape[0] == 1 for d in deltas[1:])
    fed = torch.tensor([p + payload.token_ids[:-1]])
    with torch.inference_mode():
        ref = hf_model(fed, output_hidden_states=True).hidden_states[-1][0]
    torch.testing.assert_close(payload.hidden_states, ref, atol=1e-5, rtol=1e-5)
    assert outputs["h"][-1].metrics["num_cached_tokens"] == 0
    engine.close()


def test_kv_deploy_fields_are_validated(llm_path):
    from omnistage.config.deploy_fields import StageDeployConfig

    with pytest.raises(ValueError, match="kv_cache_memory: must be > 0"):
        StageDeployConfig(kv_cache_memory=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens: must be >= 1"):
        StageDeployConfig(max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens=2 is less than max_num_seqs=4"):
        make_engine(llm_path, max_num_seqs=4, max_num_batched_tokens=2)
    assert StageDeployConfig(kv_cache_memory=1 << 20).kv_cache_memory == float(1 << 20)
    # a fraction of host memory on CPU: sized in blocks, far more than the default here
    engine = make_engine(llm_path, max_num_seqs=1, max_model_len=64, kv_cache_memory=0.001)
    assert engine.block_manager.num_blocks > 4
    engine.close()


def test_logprobs_come_once_per_token_with_chunked_prefill_and_preemption(llm_path):
    engine = make_engine(llm_path, max_num_seqs=4, max_model_len=64, max_num_batched_tokens=8,
                         enable_prefix_caching=False, kv_cache_memory=6 * engine_block_bytes(llm_path))
    prompts = token_prompts(4, 40, seed=8)
    outputs = run(engine, requests(prompts, params=SamplingParams(max_tokens=MAX_NEW, temperature=0, logprobs=2)))
    assert engine.scheduler.num_preemptions > 0
    for i in range(4):
        payload = final(outputs, f"r{i}")
        assert [lp.token_id for lp in payload.logprobs] == payload.token_ids
        assert all(len(lp.top) == 2 for lp in payload.logprobs)
    assert_no_leak(engine)
    engine.close()
