"""The parity checks catch a broken KV cache: with a mutation patched into the runner, the
paged-KV, chunked-prefill, preemption and parity tests fail.

A tiny model whose greedy output repeats one token passes them even with a broken cache (the
zoo's qwen2-llm is drawn by testing/decoder_init.py so that it does not). Two mutations, applied
to the cache storage before every forward, so the packed and the padded layouts see them alike:
- `old_keys_zeroed`: every cached key more than 16 positions behind the row's current position
  is zero;
- `no_kv_cache`: every cached key and value from before the step is zero (the decoder attends to
  nothing but its fresh tokens' keys).
"""

from __future__ import annotations

import pytest
import torch

import test_ar_paged as paged
import test_ar_parity as parity
from ar_helpers import PROMPTS, make_engine, reference_generate
from omnistage.ar.model_runner import ModelRunner

OLD = 16


def _zero_cached(runner: ModelRunner, batch, keep_last: int | None) -> int:
    """Zero each scheduled sequence's cached keys (and, with keep_last None, values) at positions
    before `start - keep_last` (keep_last None: before `start`). Returns how many slots it hit."""
    size, hit = runner.block_size, 0
    for item in [*batch.decodes, *batch.prefills]:
        end = item.start - (keep_last or 0)
        if end <= 0:
            continue
        positions = torch.arange(end)
        table = torch.tensor(item.seq.block_table)
        slots = table[positions // size] * size + positions % size
        hit += len(slots)
        for layer in runner.cache.layers:
            if layer.is_initialized:
                with torch.inference_mode():  # the pools are inference tensors
                    if layer.transposed_keys:  # [blocks, heads, dim, block_size] (paged_attention.py)
                        layer.keys[slots // size, :, :, slots % size] = 0
                    else:
                        layer.keys[slots] = 0
                    if keep_last is None:
                        layer.values[slots] = 0
    return hit


MUTATIONS = {"old_keys_zeroed": OLD, "no_kv_cache": None}


@pytest.fixture(params=sorted(MUTATIONS))
def mutated(request, monkeypatch):
    """Patches the mutation in; after the test, asserts it zeroed slots and broke no forward (a
    check that failed on an exception would prove nothing about its assertions)."""
    keep_last, hits, errors = MUTATIONS[request.param], [], []
    execute = ModelRunner.execute

    def mutated_execute(self, batch, num_blocks):
        try:
            hits.append(_zero_cached(self, batch, keep_last))
        except Exception as e:  # noqa: BLE001 - surfaced after the check, not into the engine
            errors.append(e)
            raise
        return execute(self, batch, num_blocks)

    monkeypatch.setattr(ModelRunner, "execute", mutated_execute)
    yield request.param
    assert not errors, errors
    assert sum(hits) > 0


@pytest.fixture(scope="module")
def paged_reference(hf_model):
    cache: dict = {}

    def ref(ids, max_new=paged.MAX_NEW):
        key = (tuple(ids), max_new)
        if key not in cache:
            cache[key] = reference_generate(hf_model, ids, max_new)
        return cache[key]

    return ref


@pytest.fixture(scope="module")
def parity_reference(hf_model, tokenizer):
    return [reference_generate(hf_model, tokenizer(p)["input_ids"], parity.MAX_NEW) for p in PROMPTS]


PAGED_CHECKS = [
    paged.test_prefix_hits_compute_only_the_rest_and_keep_the_tokens,
    paged.test_chunked_prefill_keeps_the_tokens_and_the_running_stream_going,
    paged.test_preemption_recomputes_and_keeps_the_tokens,
]


@pytest.mark.parametrize("check", PAGED_CHECKS, ids=lambda f: f.__name__.removeprefix("test_"))
def test_paged_checks_fail_under_the_mutation(mutated, check, llm_path, paged_reference):
    with pytest.raises(AssertionError):
        check(llm_path, paged_reference)


@pytest.mark.parametrize("check", [parity.test_alone, parity.test_batch_of_four_submitted_together],
                         ids=lambda f: f.__name__.removeprefix("test_"))
def test_parity_checks_fail_under_the_mutation(mutated, check, llm_path, parity_reference):
    engine = make_engine(llm_path, max_num_seqs=4)
    try:
        with pytest.raises(AssertionError):
            check(engine, parity_reference)
    finally:
        engine.close()
