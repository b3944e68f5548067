"""The AR engine on CUDA: greedy tokens equal transformers `generate` in fp32 on the same
device (alone, in a batch of four, and with a prompt chunk after fewer cached keys than its
own length), and bf16 gives finite hidden states and full-length outputs. The zoo's tiny
qwen2-llm."""

from __future__ import annotations

import pytest
import torch
from ar_helpers import PROMPTS, final, run

from omnistage.ar.sampling_params import SamplingParams
from omnistage.core.types import StageRequest

pytestmark = pytest.mark.gpu

MAX_NEW = 16
GREEDY = SamplingParams(max_tokens=MAX_NEW, temperature=0.0)


def cuda_engine(path: str, dtype: str):
    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig

    return AREngine(path, config=StageDeployConfig(devices=("cuda:0",), dtype=dtype, max_num_seqs=4))


@pytest.fixture(scope="module")
def llm_path(zoo) -> str:
    return str(zoo("qwen2-llm", size="tiny"))


@pytest.fixture(scope="module")
def reference(llm_path) -> list[list[int]]:
    """`generate` on CUDA in fp32, each prompt alone, with the checkpoint's generation config."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(llm_path)
    model = AutoModelForCausalLM.from_pretrained(llm_path, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to("cuda").eval()
    outs = []
    for p in PROMPTS:
        ids = tokenizer(p, return_tensors="pt").input_ids.to("cuda")
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, do_sample=False)
        outs.append(out[0, ids.shape[1]:].tolist())
    del model
    torch.cuda.empty_cache()
    return outs


@pytest.fixture(scope="module")
def fp32_engine(llm_path):
    engine = cuda_engine(llm_path, "float32")
    yield engine
    engine.close()


def test_fp32_greedy_alone_matches_generate(fp32_engine, reference):
    for i, p in enumerate(PROMPTS):
        outputs = run(fp32_engine, [StageRequest(f"alone{i}", p, GREEDY)])
        assert final(outputs, f"alone{i}").token_ids == reference[i], p


def test_fp32_greedy_batch_of_four_matches_generate(fp32_engine, reference):
    outputs = run(fp32_engine, [StageRequest(f"b{i}", p, GREEDY) for i, p in enumerate(PROMPTS)])
    assert [final(outputs, f"b{i}").token_ids for i in range(len(PROMPTS))] == reference


def test_bf16_hidden_states_are_finite(llm_path, report):
    engine = cuda_engine(llm_path, "bfloat16")
    try:
        requests = [StageRequest(f"h{i}", {"prompt": p, "return_hidden_states": True}, GREEDY)
                    for i, p in enumerate(PROMPTS)]
        outputs = run(engine, requests)
    finally:
        engine.close()
    config = getattr(getattr(engine.model, "model", None), "config", None)
    vocab = config.get_text_config().vocab_size if config is not None else None
    for i in range(len(PROMPTS)):
        payload = final(outputs, f"h{i}")
        assert len(payload.token_ids) == MAX_NEW
        if vocab is not None:
            assert all(0 <= t < vocab for t in payload.token_ids)
        hidden = payload.hidden_states
        assert hidden.is_cuda and hidden.dtype == torch.bfloat16
        assert torch.isfinite(hidden.float()).all()
    report("ar_bf16_hidden_absmax", value=max(float(final(outputs, f"h{i}").hidden_states.float().abs().max())
                                               for i in range(len(PROMPTS))))


def test_fp32_chunk_after_fewer_cached_keys_matches_generate(llm_path):
    """A packed step's prompt chunk after fewer cached keys than its own length runs as the last
    rows of a causal square (packed_attention._causal_rows); on CUDA it gives `generate`'s tokens."""
    import random

    from ar_helpers import join_two_long_prompts, record_packed_chunks
    from transformers import AutoModelForCausalLM

    from omnistage.ar.engine import AREngine
    from omnistage.config.deploy_fields import StageDeployConfig

    rng = random.Random(11)
    short, a, b = ([rng.randrange(3, 1000) for _ in range(n)] for n in (5, 20, 40))
    engine = AREngine(llm_path, config=StageDeployConfig(devices=("cuda:0",), dtype="float32", max_num_seqs=4,
                                                         max_num_batched_tokens=32, enable_prefix_caching=False))
    chunks = record_packed_chunks(engine)
    try:
        outputs = join_two_long_prompts(engine, short, [a, b], GREEDY)
    finally:
        engine.close()
    assert (11, 29) in chunks
    model = AutoModelForCausalLM.from_pretrained(llm_path, dtype=torch.float32, attn_implementation="sdpa")
    model = model.to("cuda").eval()
    for name, p, new in (("s", short, 24), ("a", a, MAX_NEW), ("b", b, MAX_NEW)):
        ids = torch.tensor([p], device="cuda")
        with torch.inference_mode():
            want = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
        assert final(outputs, name).token_ids == want[0, len(p):].tolist(), name
