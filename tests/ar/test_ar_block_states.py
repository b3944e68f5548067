"""Requests that return hidden states and input embeddings (what an omni thinker hands its
talker) on the prefix cache, zoo tiny qwen2-llm, fp32: a hit computes only the rest, yet
returns a row for every position, equal to transformers' full forward; blocks published
without those rows are not reused by such requests; preemption and aborts leak nothing."""

from __future__ import annotations

import random

import torch

from ar_helpers import final, make_engine, reference_generate, run
from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import StageRequest

MAX_NEW = 6
STATES = {"return_hidden_states": True, "return_input_embeds": True}


def prompts(n: int, length: int, seed: int, prefix: list[int] = ()) -> list[list[int]]:
    rng = random.Random(seed)
    return [list(prefix) + [rng.randrange(3, 1000) for _ in range(length)] for _ in range(n)]


def state_requests(ps, name, states=STATES):
    params = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)
    return [StageRequest(f"{name}{i}", {"prompt_token_ids": p, **states}, params) for i, p in enumerate(ps)]


def assert_rows_match_a_full_forward(hf_model, outs, prompt) -> None:
    """Tokens are generate's; the streamed rows (first output: the whole prompt) are the full forward's."""
    payload = outs[-1].payload
    assert payload.token_ids == reference_generate(hf_model, prompt, MAX_NEW)[0]
    deltas = [o.payload.extras["delta_hidden_states"] for o in outs]
    assert deltas[0].shape[0] == len(prompt) and all(d.shape[0] == 1 for d in deltas[1:])
    fed = torch.tensor([prompt + payload.token_ids[:-1]])
    with torch.inference_mode():
        ref = hf_model(fed, output_hidden_states=True).hidden_states
    torch.testing.assert_close(torch.cat(deltas), ref[-1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(payload.hidden_states, ref[-1][0], atol=1e-5, rtol=1e-5)
    embeds = torch.cat([o.payload.extras["delta_input_embeds"] for o in outs])
    torch.testing.assert_close(embeds, ref[0][0], atol=1e-6, rtol=1e-6)


def assert_no_leak(engine) -> None:
    bm = engine.block_manager
    assert bm.num_free_blocks == bm.num_blocks and all(b.ref_count == 0 for b in bm.blocks)
    assert not engine.runner.hidden and not engine.runner.embeds  # per-request rows released
    assert all(b.key is not None for b in bm.blocks if b.states)  # side rows only on cached blocks


def test_hits_return_every_row_and_need_blocks_that_hold_them(llm_path, hf_model):
    engine = make_engine(llm_path, max_num_seqs=2)
    shared = prompts(1, 40, seed=1)[0]  # two full blocks of 16 and a bit
    first, second = prompts(2, 7, seed=2, prefix=shared)
    # Blocks published by a request without states hold no rows: a state request does not reuse them.
    run(engine, state_requests([first], "plain", states={}))
    outs = run(engine, state_requests([first], "cold"))["cold0"]
    assert outs[-1].metrics["num_cached_tokens"] == 0
    assert_rows_match_a_full_forward(hf_model, outs, first)
    # It published its own blocks with the rows: a new question after the same prefix hits them,
    # and so does the same request again (three blocks, up to the last prompt token).
    for name, prompt, cached in (("other", second, 32), ("again", first, 32)):
        outs = run(engine, state_requests([prompt], name))[f"{name}0"]
        assert outs[-1].metrics["num_cached_tokens"] == cached
        assert_rows_match_a_full_forward(hf_model, outs, prompt)
    assert_no_leak(engine)
    engine.close()


def test_preempted_and_aborted_state_requests_keep_their_rows_and_leak_nothing(llm_path, hf_model):
    # Room for 8 blocks: 4 requests of 46 + 6 tokens (3 blocks, then 4) sharing two cached blocks
    # cannot all run; chunked 16 tokens a step, the newest is preempted and resumes on its hit.
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(llm_path)
    block_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 16 * 4
    engine = make_engine(llm_path, max_num_seqs=4, max_model_len=64, max_num_batched_tokens=16,
                         kv_cache_memory=8 * block_bytes)
    shared = prompts(1, 32, seed=3)[0]
    ps = prompts(4, 14, seed=4, prefix=shared)
    run(engine, state_requests(ps[:1], "warm"))
    outputs = run(engine, state_requests(ps, "p"))
    assert engine.scheduler.num_preemptions > 0
    for i, p in enumerate(ps):
        assert outputs[f"p{i}"][-1].metrics["num_cached_tokens"] >= 32
        assert_rows_match_a_full_forward(hf_model, outputs[f"p{i}"], p)
    assert_no_leak(engine)

    def abort_mid_flight(step, eng):
        if step == 2:
            eng.abort_request("a0")

    outputs = run(engine, state_requests(ps[:2], "a"), on_step=abort_mid_flight)
    assert final(outputs, "a0").finish_reason == "abort"
    assert_no_leak(engine)
    engine.close()
